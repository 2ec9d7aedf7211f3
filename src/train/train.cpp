// teraio-train (docs/train.md): trains the Llama-architecture decoder of model.h with AdamW in
// libtorch, each step wrapped by a teraio::Session when --budget is given. Data are real text
// (byte-level tokens) or synthetic tokens; one progress line per step; a JSON run report
// (teraio.run v1 plus config, throughput, memory, traffic, stalls, drift, predicted vs measured).
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "model.h"
#include "teraio/error.h"
#include "teraio/output_file.h"
#include "teraio/plan.h"
#include "teraio/simulator.h"
#include "teraio/tier_args.h"
#include "teraio/trace.h"
#include "teraio/units.h"
#ifdef TERAIO_TRAIN_HAVE_SESSION
#include "teraio/session.h"
#endif

namespace teraio::train {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr int64_t kBos = 256;
constexpr int64_t kEos = 257;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Args {
  std::string model = "tiny";
  int64_t steps = 200;
  int64_t batch = 0;          // the preset's unless given
  int64_t seq = 0;            // the preset's unless given
  double lr = 0;              // the preset's unless given
  int64_t warmup_steps = 0;   // the preset's unless given
  bool batch_given = false, seq_given = false, lr_given = false, warmup_given = false;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  bool step_in_backward = false;
  std::string dtype = "fp32";
  std::string device = "cpu";
  uint64_t seed = 1;
  int threads = 0;
  std::string budget;
  std::vector<std::string> tiers;
  int profile_steps = 2;
  std::string min_tensor = "4KiB";
  bool synthetic = false;
  std::string data;
  std::string report;
  std::string save_trace;
  std::string save_plan;
  bool deterministic = false;
  bool no_verify = false;
  bool no_recompute = false;
  bool no_clean_offloads = false;
  bool no_discard_dead = false;
  std::vector<std::string> inject_faults;
};

struct PresetRun {
  int64_t batch, seq;
  double lr;
  int64_t warmup_steps;
};

// The llama-* shapes need a warmup: at a constant 3e-4 from step 1, llama-1b's loss jumped from
// 9.3 to 18.1 at step 3 and llama-8b's from 12.7 to 25.3 (H200, no warmup).
PresetRun preset_run(const LlamaConfig& model) {
  if (model.shape == "train-tiny") return {16, 128, 3e-3, 0};
  return {1, 2048, 3e-4, 20};
}

// ---- data ---------------------------------------------------------------------------------------

// Random windows of seq + 1 tokens. Text: byte-level tokens of one file, BOS + bytes + EOS.
// Synthetic: per sequence, an arithmetic progression t_i = (a + i * d) mod vocab with random a and
// d in [1, 16] — cheap, learnable (the loss falls below ln(vocab)), and independent of any file.
class TokenSource {
 public:
  TokenSource(const Args& args, int64_t vocab) : rng_(args.seed), vocab_(vocab) {
    if (args.synthetic) return;
    std::ifstream in(args.data, std::ios::binary);
    TERAIO_CHECK(in.good(), "--data \"{}\": cannot open the file", args.data);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    tokens_.reserve(bytes.size() + 2);
    tokens_.push_back(kBos);
    for (char c : bytes) tokens_.push_back(static_cast<unsigned char>(c));
    tokens_.push_back(kEos);
    bytes_ = bytes.size();
  }

  bool synthetic() const { return tokens_.empty(); }
  uint64_t bytes() const { return bytes_; }

  // Fills inputs and targets [batch, seq] (int64, on the CPU).
  void next(int64_t batch, int64_t seq, torch::Tensor& inputs, torch::Tensor& targets) {
    torch::Tensor window = torch::empty({batch, seq + 1}, torch::kInt64);
    int64_t* w = window.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      int64_t* row = w + b * (seq + 1);
      if (synthetic()) {
        const int64_t a = int64_t(rng_() % uint64_t(vocab_));
        const int64_t d = 1 + int64_t(rng_() % 16);
        for (int64_t i = 0; i <= seq; ++i) row[i] = (a + i * d) % vocab_;
      } else {
        const uint64_t start = rng_() % (tokens_.size() - uint64_t(seq));
        std::copy_n(tokens_.begin() + int64_t(start), seq + 1, row);
      }
    }
    inputs = window.narrow(1, 0, seq).contiguous();
    targets = window.narrow(1, 1, seq).contiguous();
  }

  void check_length(const std::string& path, int64_t seq) const {
    TERAIO_CHECK(synthetic() || tokens_.size() > uint64_t(seq) + 1,
                 "--data \"{}\": {} bytes is shorter than one sequence of --seq {} tokens", path,
                 bytes_, seq);
  }

 private:
  std::mt19937_64 rng_;
  int64_t vocab_;
  std::vector<int64_t> tokens_;
  uint64_t bytes_ = 0;
};

// ---- the Session adapter
// -------------------------------------------------------------------------

// What the loop needs from offloading: wrap a step, name tensors, read counters. Without --budget,
// or in a build without teraio_torch, it is inactive and reports nothing it did not measure.
struct OffloadCounters {
  std::string mode = "off";
  uint64_t resident_bytes = 0;
  uint64_t peak_resident_bytes = 0;
  uint64_t bytes_offloaded = 0;
  uint64_t bytes_prefetched = 0;
  double stall_us = 0;
  uint64_t drift_events = 0;
  // Per tier: the bandwidth the planner uses and where it comes from (SessionStats::tiers).
  Json tiers = Json::array();
  Json all;  // every SessionStats field (for_each_stats_field), `tiers` as above
};

// The simulator's replay of the Session's plan: what the plan predicts for one iteration.
struct Prediction {
  double iteration_us, ideal_us, stall_us;
  size_t moves;
};

#ifdef TERAIO_TRAIN_HAVE_SESSION
constexpr bool kSessionBuilt = true;

// --tier: the tier specs of include/teraio/tier_args.h (host:SIZE[:R:W], file:DIR[,DIR]:SIZE[:R:W],
// or a comma-separated list of them); bandwidths given are used as given, else measured.
std::vector<SessionTier> parse_tiers(const std::vector<std::string>& texts) {
  std::vector<SessionTier> tiers;
  for (const std::string& text : texts) {
    for (const TierArg& a : parse_tier_arg_list(text, "--tier")) {
      check_session_tier(a, "--tier");
      SessionTier t;
      t.kind = a.kind == TierArg::Kind::kHost ? SessionTier::Kind::kHost : SessionTier::Kind::kFile;
      t.capacity_bytes = a.capacity_bytes;
      t.paths = a.paths;
      t.read_gbps = a.read_gbps;
      t.write_gbps = a.write_gbps;
      t.duplex_gbps = a.duplex_gbps;
      tiers.push_back(std::move(t));
    }
  }
  return tiers;
}

// --inject-fault STEP:ERROR:DIRECTION[:COUNT]: from step STEP on, COUNT transfers (default 1) of
// the first tier in DIRECTION (read, write or any) fail with ERROR (an errno name: EIO, ENOSPC,
// EPERM, EBADMSG, ENODATA) — for rehearsing what a disk fault does to a run (docs/train.md).
struct StepFault {
  int64_t step = 0;
  storage::FaultRule rule;
};

StepFault parse_fault(const std::string& spec) {
  std::vector<std::string> f;  // owned: strtoll reads them as C strings
  for (std::string_view field : split_fields(spec, ':')) f.emplace_back(field);
  TERAIO_CHECK(f.size() == 3 || f.size() == 4,
               "--inject-fault \"{}\": expected STEP:ERROR:DIRECTION[:COUNT], e.g. 3:EIO:write:2",
               spec);
  StepFault out;
  char* end = nullptr;
  out.step = std::strtoll(f[0].c_str(), &end, 10);
  TERAIO_CHECK(!f[0].empty() && *end == '\0' && out.step >= 1,
               "--inject-fault \"{}\": the step must be a whole number >= 1", spec);
  static const std::pair<const char*, int> kErrors[] = {
      {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EPERM", EPERM}, {"EROFS", EROFS},
      {"EBADMSG", EBADMSG}, {"ENODATA", ENODATA}};
  out.rule.kind = storage::FaultKind::kError;
  for (const auto& [name, code] : kErrors)
    if (f[1] == name) out.rule.error_code = code;
  TERAIO_CHECK(out.rule.error_code != 0,
               "--inject-fault \"{}\": unknown error \"{}\" (EIO, ENOSPC, EPERM, EROFS, EBADMSG or "
               "ENODATA)",
               spec, f[1]);
  if (f[2] == "read") {
    out.rule.direction = storage::Direction::kRead;
  } else if (f[2] == "write") {
    out.rule.direction = storage::Direction::kWrite;
  } else {
    TERAIO_CHECK(f[2] == "any", "--inject-fault \"{}\": the direction must be read, write or any",
                 spec);
  }
  if (f.size() == 4) {
    out.rule.count = std::strtoull(f[3].c_str(), &end, 10);
    TERAIO_CHECK(!f[3].empty() && *end == '\0' && out.rule.count >= 1,
                 "--inject-fault \"{}\": the count must be a whole number >= 1", spec);
  }
  return out;
}

class Offload {
 public:
  explicit Offload(const Args& args) {
    if (args.budget.empty()) return;
    SessionOptions o;
    o.budget_bytes = parse_size(args.budget, "--budget");
    o.tiers = parse_tiers(args.tiers);
    o.profiling_iterations = args.profile_steps;
    o.min_tensor_bytes = parse_size(args.min_tensor, "--min-tensor");
    o.verify = !args.no_verify;
    o.recompute = !args.no_recompute;
    o.clean_offloads = !args.no_clean_offloads;
    o.discard_dead = !args.no_discard_dead;
    for (const std::string& spec : args.inject_faults) faults_.push_back(parse_fault(spec));
    o.fault_injection = !faults_.empty();
    // The trace and plan are always written (to scratch files unless asked for) so that the
    // report can replay the plan in the simulator: the predicted iteration time.
    keep_trace_ = !args.save_trace.empty();
    keep_plan_ = !args.save_plan.empty();
    o.trace_path = keep_trace_ ? args.save_trace : scratch_path("trace");
    o.plan_path = keep_plan_ ? args.save_plan : scratch_path("plan");
    trace_path_ = o.trace_path;
    plan_path_ = o.plan_path;
    if (!o.tiers.empty())
      tier_name_ = o.tiers.size() == 1
                       ? (o.tiers[0].kind == SessionTier::Kind::kHost ? "host" : "file")
                       : "all";
    session_ = std::make_unique<Session>(std::move(o));
  }
  ~Offload() {
    std::error_code ec;
    if (!keep_plan_ && !plan_path_.empty()) std::filesystem::remove(plan_path_, ec);
    if (!keep_trace_ && !trace_path_.empty()) std::filesystem::remove(trace_path_, ec);
  }

  bool active() const { return session_ != nullptr; }
  void begin_step(int64_t step) {
    if (!session_) return;
    for (const StepFault& f : faults_)
      if (f.step == step) session_->inject_fault(0, f.rule);
    session_->begin_step();
  }
  void end_step() {
    if (session_) session_->end_step();
  }
  void name(const torch::Tensor& t, const std::string& name, const std::string& kind) {
    if (session_ && t.defined()) session_->name_tensor(t, name, kind);
  }
  OffloadCounters counters() const {
    OffloadCounters c;
    if (!session_) return c;
    const SessionStats s = session_->stats();
    c.mode = s.mode;
    c.resident_bytes = s.resident_bytes;
    c.peak_resident_bytes = s.peak_resident_bytes;
    c.bytes_offloaded = s.bytes_offloaded;
    c.bytes_prefetched = s.bytes_prefetched;
    c.stall_us = s.stall_us;
    c.drift_events = s.drift_events;
    // Every field, through the one list of each (Note [Options and stats fields]).
    for (const SessionTierStats& t : s.tiers) {
      Json tier;
      for_each_tier_stats_field([&](const char* name, auto member) { tier[name] = t.*member; });
      c.tiers.push_back(std::move(tier));
    }
    c.all = Json::object();
    for_each_stats_field([&](const char* name, auto member, StatKind) {
      if constexpr (std::is_same_v<std::decay_t<decltype(s.*member)>,
                                   std::vector<SessionTierStats>>)
        c.all[name] = c.tiers;
      else
        c.all[name] = s.*member;
    });
    return c;
  }
  uint64_t budget_bytes() const { return session_ ? session_->options().budget_bytes : 0; }
  const std::string& tier_name() const { return tier_name_; }
  // The last plan the Session made, replayed over the trace it was made from.
  std::optional<Prediction> prediction() const {
    if (!std::filesystem::exists(plan_path_) || !std::filesystem::exists(trace_path_)) {
      return std::nullopt;
    }
    const Plan plan = read_plan(plan_path_);
    const SimResult sim = simulate(read_trace(trace_path_), plan);
    return Prediction{sim.iteration_us, sim.ideal_us, sim.stall_us, plan.moves.size()};
  }

 private:
  static std::string scratch_path(const char* what) {
    return (std::filesystem::temp_directory_path() /
            fmt::format("teraio-train-{}.{}.json", ::getpid(), what))
        .string();
  }
  std::vector<StepFault> faults_;
  std::unique_ptr<Session> session_;
  std::string trace_path_, plan_path_;
  std::string tier_name_;
  bool keep_trace_ = false, keep_plan_ = false;
};
#else
constexpr bool kSessionBuilt = false;

class Offload {
 public:
  explicit Offload(const Args& args) {
    TERAIO_CHECK(args.budget.empty() && args.tiers.empty(),
                 "--budget/--tier: offloading unavailable in this build (teraio-train was built "
                 "without teraio_torch; configure with -DTERAIO_WITH_TORCH=ON)");
  }
  bool active() const { return false; }
  void begin_step() {}
  void end_step() {}
  void name(const torch::Tensor&, const std::string&, const std::string&) {}
  OffloadCounters counters() const { return {}; }
  uint64_t budget_bytes() const { return 0; }
  const std::string& tier_name() const { return tier_name_; }
  std::optional<Prediction> prediction() const { return std::nullopt; }

 private:
  std::string tier_name_;
};
#endif

// bf16 autocast over the forward pass and the loss, as torch.autocast does it in Python: the
// dispatcher runs matrix products in bf16 and keeps reductions and normalisations in fp32; the
// backward pass follows the forward's dtypes. The cache of bf16 copies of the fp32 weights lives
// for one forward pass.
class Autocast {
 public:
  Autocast(bool on, c10::DeviceType device) : on_(on), device_(device) {
    if (!on_) return;
    previous_ = at::autocast::is_autocast_enabled(device_);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_);
    at::autocast::set_autocast_dtype(device_, at::kBFloat16);
    at::autocast::set_autocast_enabled(device_, true);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, previous_);
    at::autocast::set_autocast_dtype(device_, previous_dtype_);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_;
  c10::DeviceType device_;
  bool previous_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

// ---- the run
// -------------------------------------------------------------------------------------

uint64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? uint64_t(t.numel()) * t.element_size() : 0;
}

// The run's AdamW: one optimizer over every parameter, or with --step-in-backward one per
// parameter, each stepped from its parameter's post-accumulate-grad hook as soon as backward has
// accumulated the gradient (docs/train.md; the Python side's Note [Steps in backward]). libtorch's
// AdamW updates each parameter from its own gradient and state (its step count included), so one
// optimizer per parameter gives bitwise the same parameters.
class Optimizers {
 public:
  Optimizers(Llama& model, const torch::optim::AdamWOptions& options, bool in_backward) {
    if (!in_backward) {
      all_.push_back(std::make_unique<torch::optim::AdamW>(model->parameters(), options));
      return;
    }
    for (const torch::Tensor& p : model->parameters()) {
      all_.push_back(std::make_unique<torch::optim::AdamW>(std::vector<torch::Tensor>{p}, options));
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<StepHook>(all_.back().get()));
      index_.emplace(p.unsafeGetTensorImpl(), hooked_.size());
      hooked_.push_back(p);
    }
    in_backward_ = true;
  }
  ~Optimizers() {  // the hooks point at the optimizers
    for (const torch::Tensor& p : hooked_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
  Optimizers(const Optimizers&) = delete;
  Optimizers& operator=(const Optimizers&) = delete;
  void set_lr(double lr) {
    for (auto& opt : all_)
      for (auto& group : opt->param_groups())
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  void zero_grad() {
    for (auto& opt : all_) opt->zero_grad();
  }
  // The update, where backward has not made it already.
  void step() {
    if (!in_backward_) all_.front()->step();
  }
  // The AdamW state of parameter p, or nullptr before its first step.
  const torch::optim::AdamWParamState* state(const torch::Tensor& p) const {
    size_t i = 0;  // its optimizer
    if (in_backward_) {
      auto at = index_.find(p.unsafeGetTensorImpl());
      if (at == index_.end()) return nullptr;
      i = at->second;
    }
    auto it = all_[i]->state().find(p.unsafeGetTensorImpl());
    return it == all_[i]->state().end()
               ? nullptr
               : &static_cast<const torch::optim::AdamWParamState&>(*it->second);
  }

 private:
  struct StepHook : torch::autograd::PostAccumulateGradHook {
    explicit StepHook(torch::optim::AdamW* opt) : opt_(opt) {}
    void operator()(const torch::autograd::Variable&) override { opt_->step(); }
    torch::optim::AdamW* opt_;
  };
  std::vector<std::unique_ptr<torch::optim::AdamW>> all_;
  std::vector<torch::Tensor> hooked_;  // with in_backward: parameter i is all_[i]'s
  std::unordered_map<const c10::TensorImpl*, size_t> index_;  // parameter -> its index in hooked_
  bool in_backward_ = false;
};

// Parameters, gradients and AdamW states, counted from shapes (valid while tensors are offloaded).
uint64_t model_state_bytes(Llama& model, const Optimizers& opt) {
  uint64_t bytes = 0;
  for (const auto& p : model->parameters()) {
    bytes += tensor_bytes(p) + tensor_bytes(p.grad());
    if (const torch::optim::AdamWParamState* s = opt.state(p))
      bytes += tensor_bytes(s->exp_avg()) + tensor_bytes(s->exp_avg_sq()) +
               tensor_bytes(s->max_exp_avg_sq());
  }
  return bytes;
}

// Flushes the progress lines now; a failure is reported like fmt::print's own (std::system_error).
void flush_stdout() {
  if (std::fflush(stdout) != 0) {
    throw std::system_error(errno, std::generic_category(), "cannot write to file");
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct StepRecord {
  int64_t step;
  double loss;
  double time_us;
  double stall_us;
  uint64_t offloaded_bytes;
  uint64_t prefetched_bytes;
  uint64_t resident_bytes;
  std::string mode;
};

// --list-models: one JSON object per model name, with the shape it means and its parameters.
int list_models() {
  for (const std::string& name : llama_preset_names()) {
    const LlamaConfig c = llama_preset(name);
    const Json line = {{"name", c.name},         {"shape", c.shape},
                       {"layers", c.layers},     {"dim", c.dim},
                       {"heads", c.heads},       {"kv_heads", c.kv_heads},
                       {"ffn_dim", c.ffn_dim},   {"vocab", c.vocab},
                       {"tied", c.tie_embeddings}, {"rope_theta", c.rope_theta},
                       {"max_seq", c.max_seq},   {"parameters", c.parameter_count()}};
    fmt::print("{}\n", line.dump());
  }
  return 0;
}

int run(Args args) {
  const LlamaConfig config = llama_preset(args.model);
  const PresetRun preset = preset_run(config);
  // A given value is checked, never replaced: --batch 0 is an error, not the preset's batch.
  if (!args.batch_given) args.batch = preset.batch;
  if (!args.seq_given) args.seq = preset.seq;
  if (!args.lr_given) args.lr = preset.lr;
  if (!args.warmup_given) args.warmup_steps = preset.warmup_steps;
  TERAIO_CHECK(args.steps > 0 && args.steps <= 1'000'000'000, "--steps {}: must be in [1, 1e9]",
               args.steps);
  TERAIO_CHECK(args.batch > 0 && args.batch <= 1'000'000, "--batch {}: must be in [1, 1000000]",
               args.batch);
  TERAIO_CHECK(args.seq > 0 && args.seq <= config.max_seq, "--seq {}: must be in [1, {}]", args.seq,
               config.max_seq);
  TERAIO_CHECK(std::isfinite(args.lr) && args.lr > 0, "--lr {}: must be a positive number", args.lr);
  TERAIO_CHECK(args.warmup_steps >= 0, "--warmup-steps {}: must be >= 0", args.warmup_steps);
  TERAIO_CHECK(std::isfinite(args.weight_decay) && args.weight_decay >= 0,
               "--weight-decay {}: must be a number >= 0", args.weight_decay);
  TERAIO_CHECK(std::isfinite(args.grad_clip) && args.grad_clip >= 0,
               "--grad-clip {}: must be a number >= 0 (0: off)", args.grad_clip);
  TERAIO_CHECK(!args.step_in_backward || args.grad_clip == 0,
               "--step-in-backward updates each parameter during backward, before a gradient "
               "norm over all of them exists, so it cannot clip: add --grad-clip 0");
  TERAIO_CHECK(args.threads >= 0 && args.threads <= 4096,
               "--threads {}: must be in [0, 4096] (0: PyTorch's default)", args.threads);
  TERAIO_CHECK(args.dtype == "fp32" || args.dtype == "bf16" || args.dtype == "bf16-pure",
               "--dtype \"{}\": expected fp32, bf16 (mixed precision) or bf16-pure", args.dtype);
  TERAIO_CHECK(args.device == "cpu" || args.device == "cuda",
               "--device \"{}\": expected cpu or cuda", args.device);
  TERAIO_CHECK(args.profile_steps >= 1 && args.profile_steps <= 1000,
               "--profile-steps {}: must be in [1, 1000]", args.profile_steps);
  TERAIO_CHECK(args.tiers.empty() || !args.budget.empty(),
               "--tier needs --budget (the resident bytes allowed)");
  TERAIO_CHECK(args.budget.empty() || !args.tiers.empty() || !kSessionBuilt,
               "--budget needs at least one --tier (host:SIZE or file:DIR[,DIR]:SIZE)");
  TERAIO_CHECK(!(args.synthetic && !args.data.empty()),
               "--synthetic and --data exclude each other");
  if (!args.synthetic && args.data.empty()) args.data = TERAIO_DEFAULT_DATA;

  if (args.device == "cuda") {
    TERAIO_CHECK(torch::cuda::is_available(),
                 "--device cuda: no CUDA device is visible to PyTorch (torch {})", TORCH_VERSION);
  }
  if (args.deterministic) {
    // cuBLAS needs a fixed workspace for reproducible results; set before CUDA is first used.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  if (args.threads > 0) torch::set_num_threads(args.threads);
  torch::manual_seed(args.seed);

  const torch::Device device(args.device == "cuda" ? torch::kCUDA : torch::kCPU);
  // bf16 is mixed precision: fp32 parameters, gradients and AdamW states, bf16 compute (autocast
  // around the forward pass and the loss). bf16-pure keeps everything in bf16.
  const torch::Dtype dtype = args.dtype == "bf16-pure" ? torch::kBFloat16 : torch::kFloat32;
  const bool autocast = args.dtype == "bf16";
  TokenSource source(args, config.vocab);
  source.check_length(args.data, args.seq);

  Llama model(config);
  model->to(device, dtype);
  Optimizers opt(model,
                 torch::optim::AdamWOptions(args.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(
                     args.weight_decay),
                 args.step_in_backward);
  Offload offload(args);
  for (const auto& p : model->named_parameters()) offload.name(p.value(), p.key(), "parameter");

  const uint64_t tokens_per_step = uint64_t(args.batch * args.seq);
  fmt::print(
      "teraio-train: model {} ({:.2f}M parameters: {} layers, dim {}, {} heads, {} kv heads, "
      "ffn {}, vocab {}), {} {}, batch {} x seq {}, {} steps, lr {}, data {}\n",
      config.name, double(config.parameter_count()) / 1e6, config.layers, config.dim, config.heads,
      config.kv_heads, config.ffn_dim, config.vocab, args.device, args.dtype, args.batch, args.seq,
      args.steps, args.lr,
      source.synthetic() ? std::string("synthetic tokens")
                         : fmt::format("{} ({} bytes)", args.data, source.bytes()));
  if (offload.active()) {
    fmt::print("teraio-train: offloading: budget {}, tiers {}, {} profiling step(s)\n",
               format_bytes(double(offload.budget_bytes())), fmt::join(args.tiers, " "),
               args.profile_steps);
  } else {
    fmt::print("teraio-train: offloading: {}\n",
               kSessionBuilt ? "off (no --budget)" : "unavailable in this build");
  }
  flush_stdout();

  std::vector<StepRecord> records;
  OffloadCounters before = offload.counters();
  const auto run_start = Clock::now();
  for (int64_t step = 1; step <= args.steps; ++step) {
    const auto t0 = Clock::now();
    torch::Tensor inputs, targets;
    source.next(args.batch, args.seq, inputs, targets);
    // Linear warmup to --lr over --warmup-steps, then constant.
    const double lr = args.warmup_steps > 0
                          ? args.lr * std::min(1.0, double(step) / double(args.warmup_steps))
                          : args.lr;
    opt.set_lr(lr);
    offload.begin_step(step);
    double loss_value = 0;
    try {
      inputs = inputs.to(device);
      targets = targets.to(device);
      opt.zero_grad();
      torch::Tensor loss;
      {
        Autocast scope(autocast, device.type());
        loss = model->loss(inputs, targets);
      }
      loss.backward();
      if (args.grad_clip > 0)
        torch::nn::utils::clip_grad_norm_(model->parameters(), args.grad_clip);
      opt.step();
      loss_value = loss.item<double>();  // synchronises the device
    } catch (...) {
      try {
        offload.end_step();
      } catch (...) {
      }
      throw;
    }
    try {
      offload.end_step();
    } catch (const IoError& e) {
      // Only writes failed: the step's numbers are what they would have been; say so and go on.
      // Anything else (a read that failed, lost bytes) ends the run with the error.
      if (!e.results_intact()) throw;
      std::fprintf(stderr, "teraio-train: step %lld: %s; continuing\n", static_cast<long long>(step),
                   e.what());
    }
    const double time_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (step == 1) {
      for (const auto& p : model->named_parameters()) {
        const torch::optim::AdamWParamState* s = opt.state(p.value());
        if (s == nullptr) continue;
        offload.name(s->exp_avg(), p.key() + ".exp_avg", "optimizer_state");
        offload.name(s->exp_avg_sq(), p.key() + ".exp_avg_sq", "optimizer_state");
      }
    }
    const OffloadCounters after = offload.counters();
    if (step == 1) {  // the Session measured its tiers at the step's first operator
      for (const Json& t : after.tiers) {
        fmt::print("teraio-train: tier {} ({}): read {:.2f} GB/s ({}), write {:.2f} GB/s ({}){}\n",
                   t["name"].get<std::string>(), t["engine"].get<std::string>(),
                   t["read_gbps"].get<double>(), t["read_source"].get<std::string>(),
                   t["write_gbps"].get<double>(), t["write_source"].get<std::string>(),
                   t["probe_s"].get<double>() > 0
                       ? fmt::format(", probe {:.2f} s", t["probe_s"].get<double>())
                       : std::string());
        for (const Json& n : t["notes"]) fmt::print("teraio-train:   note: {}\n", n.get<std::string>());
      }
    }
    StepRecord r{step,
                 loss_value,
                 time_us,
                 after.stall_us - before.stall_us,
                 after.bytes_offloaded - before.bytes_offloaded,
                 after.bytes_prefetched - before.bytes_prefetched,
                 offload.active() ? after.resident_bytes : model_state_bytes(model, opt),
                 before.mode};  // the mode the step ran in
    before = after;
    records.push_back(r);

    const double secs = time_us / 1e6;
    const std::string io =
        offload.active() ? fmt::format("io {:.2f} GB/s",
                                       double(r.offloaded_bytes + r.prefetched_bytes) / secs / 1e9)
                         : "io -";
    const std::string stall =
        offload.active() ? fmt::format("stall {:.1f}%", 100.0 * r.stall_us / time_us) : "stall -";
    const std::string budget = offload.active()
                                   ? fmt::format("{:.3f}", double(offload.budget_bytes()) / kGiB)
                                   : std::string("-");
    fmt::print(
        "step {:>{}}/{}  loss {:.4f}  tokens/s {:.0f}  resident {:.3f}/{} GiB  {}  {}  [{}]\n",
        step, fmt::formatted_size("{}", args.steps), args.steps, loss_value,
        double(tokens_per_step) / secs, double(r.resident_bytes) / kGiB, budget, io, stall, r.mode);
    flush_stdout();
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - run_start).count();

  // Steady state: the steps after profiling (with a Session) or after the first (without); all
  // steps when there are no such steps.
  const size_t skip = offload.active() ? size_t(args.profile_steps) : 1;
  std::vector<const StepRecord*> steady;
  for (const StepRecord& r : records) {
    if (size_t(r.step) > skip) steady.push_back(&r);
  }
  if (steady.empty()) {
    for (const StepRecord& r : records) steady.push_back(&r);
  }
  std::vector<double> times;
  double stall_sum = 0, off_sum = 0, pre_sum = 0;
  for (const StepRecord* r : steady) {
    times.push_back(r->time_us);
    stall_sum += r->stall_us;
    off_sum += double(r->offloaded_bytes);
    pre_sum += double(r->prefetched_bytes);
  }
  const double n = double(steady.size());
  const double iteration_us = median(times);
  const double stall_us = std::min(stall_sum / n, iteration_us);
  const OffloadCounters final_counters = offload.counters();
  const uint64_t state_bytes = model_state_bytes(model, opt);

  const int64_t k = std::clamp<int64_t>(int64_t(records.size()) / 2, 1, 5);
  double first_loss = 0, last_loss = 0;
  for (int64_t i = 0; i < k; ++i) {
    first_loss += records[size_t(i)].loss / double(k);
    last_loss += records[records.size() - 1 - size_t(i)].loss / double(k);
  }
  fmt::print(
      "teraio-train: {} steps in {:.1f} s; loss {:.4f} -> {:.4f} (mean of the first and last "
      "{} steps); median step {}, {:.0f} tokens/s\n",
      args.steps, wall_s, first_loss, last_loss, k, format_us(iteration_us),
      double(tokens_per_step) / (iteration_us / 1e6));

  if (args.report.empty()) return 0;
  Json tiers = Json::array();
  if (offload.active()) {
    tiers.push_back({{"name", offload.tier_name()},
                     {"offload_bytes", uint64_t(off_sum / n)},
                     {"prefetch_bytes", uint64_t(pre_sum / n)}});
  }
  const uint64_t peak_bytes = offload.active() ? final_counters.peak_resident_bytes : state_bytes;
  Json loss_history = Json::array();
  for (const StepRecord& r : records) loss_history.push_back(r.loss);
  Json steps = Json::array();
  for (const StepRecord& r : records) {
    steps.push_back({{"step", r.step},
                     {"loss", r.loss},
                     {"time_us", r.time_us},
                     {"stall_us", r.stall_us},
                     {"offload_bytes", r.offloaded_bytes},
                     {"prefetch_bytes", r.prefetched_bytes},
                     {"resident_bytes", r.resident_bytes},
                     {"mode", r.mode}});
  }
  Json predicted = nullptr;
  if (const std::optional<Prediction> p = offload.prediction()) {
    predicted = {
        {"iteration_us", p->iteration_us},
        {"ideal_us", p->ideal_us},
        {"stall_us", p->stall_us},
        {"plan_moves", p->moves},
        {"measured_over_predicted", p->iteration_us > 0 ? iteration_us / p->iteration_us : 0.0}};
  }
  Json report = {
      {"format", "teraio.run"},
      {"version", 1},
      {"iteration_us", iteration_us},
      {"stall_us", stall_us},
      {"peak_bytes", peak_bytes},
      {"tiers", tiers},
      {"config",
       {{"model", config.name},
        {"shape", config.shape},
        {"parameters", config.parameter_count()},
        {"layers", config.layers},
        {"dim", config.dim},
        {"heads", config.heads},
        {"kv_heads", config.kv_heads},
        {"ffn_dim", config.ffn_dim},
        {"vocab", config.vocab},
        {"tie_embeddings", config.tie_embeddings},
        {"steps", args.steps},
        {"batch", args.batch},
        {"seq", args.seq},
        {"lr", args.lr},
        {"warmup_steps", args.warmup_steps},
        {"weight_decay", args.weight_decay},
        {"grad_clip", args.grad_clip},
        {"step_in_backward", args.step_in_backward},
        {"dtype", args.dtype},
        {"device", args.device},
        {"threads", torch::get_num_threads()},
        {"seed", args.seed},
        {"deterministic", args.deterministic},
        {"data", source.synthetic() ? std::string("synthetic") : args.data},
        {"data_bytes", source.bytes()},
        {"budget_bytes", offload.budget_bytes()},
        {"tiers", args.tiers},
        {"profile_steps", args.profile_steps},
        {"torch", TORCH_VERSION}}},
      {"offloading",
       offload.active() ? "on" : (kSessionBuilt ? "off" : "unavailable in this build")},
      {"throughput",
       {{"tokens_per_step", tokens_per_step},
        {"tokens_per_s", double(tokens_per_step) / (iteration_us / 1e6)},
        {"iteration_us_median", iteration_us},
        {"iteration_us_min", *std::min_element(times.begin(), times.end())},
        {"iteration_us_max", *std::max_element(times.begin(), times.end())},
        {"measured_steps", steady.size()},
        {"wall_s", wall_s}}},
      {"memory",
       {{"budget_bytes", offload.budget_bytes()},
        {"peak_resident_bytes",
         offload.active() ? Json(final_counters.peak_resident_bytes) : Json()},
        {"model_state_bytes", state_bytes},
        {"parameter_bytes",
         config.parameter_count() * int64_t(dtype == torch::kBFloat16 ? 2 : 4)}}},
      {"traffic",
       {{"bytes_offloaded", final_counters.bytes_offloaded},
        {"bytes_prefetched", final_counters.bytes_prefetched},
        {"per_iteration", tiers}}},
      {"stalls",
       {{"stall_us_total", final_counters.stall_us},
        {"stall_us_per_iteration", stall_us},
        {"stall_pct", iteration_us > 0 ? 100.0 * stall_us / iteration_us : 0.0}}},
      {"drift_events", final_counters.drift_events},
      {"predicted", predicted},
      {"session", offload.active() ? final_counters.all : Json()},
      {"loss",
       {{"first", first_loss}, {"last", last_loss}, {"window", k}, {"history", loss_history}}},
      {"steps", steps},
  };
  write_file_atomically(args.report, report.dump(2) + "\n");
  fmt::print("teraio-train: run report written to {}\n", args.report);
  return 0;
}

}  // namespace
}  // namespace teraio::train

int main(int argc, char** argv) {
  using teraio::train::Args;
  Args a;
  CLI::App app{
      "teraio-train: train a Llama-architecture decoder (libtorch, AdamW) under a teraio "
      "Session (docs/train.md)",
      "teraio-train"};
  app.get_formatter()->column_width(34);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("teraio-train: error: {} (see --help)\n", e.what());
  });
  app.add_option("--model", a.model,
                 "tiny (CPU), llama-1b, llama-3b or llama-8b, or the model table's name of one "
                 "(--list-models)")
      ->capture_default_str();
  bool list_models = false;
  app.add_flag("--list-models", list_models,
               "print the models (data/models.json's shapes) as JSON lines, then exit");
  app.add_option("--steps", a.steps, "training steps")->capture_default_str();
  app.add_option("--batch", a.batch, "sequences per step (default: tiny 16, llama-* 1)");
  app.add_option("--seq", a.seq, "tokens per sequence (default: tiny 128, llama-* 2048)");
  app.add_option("--lr", a.lr, "AdamW learning rate (default: tiny 3e-3, llama-* 3e-4)");
  app.add_option("--warmup-steps", a.warmup_steps,
                 "linear learning-rate warmup (default: tiny 0, llama-* 20)");
  app.add_option("--weight-decay", a.weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str();
  app.add_option("--grad-clip", a.grad_clip, "clip the global gradient norm (0: off)")
      ->capture_default_str();
  app.add_flag("--step-in-backward", a.step_in_backward,
               "update each parameter during backward as soon as its gradient is complete (needs "
               "--grad-clip 0)");
  app.add_option("--dtype", a.dtype,
                 "fp32, bf16 (mixed: fp32 parameters, gradients and AdamW states, bf16 compute) or "
                 "bf16-pure (everything in bf16)")
      ->capture_default_str();
  app.add_option("--device", a.device, "cpu or cuda")->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the initialisation and of the data order")
      ->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads of PyTorch (0: PyTorch's default)")
      ->capture_default_str();
  app.add_option("--budget", a.budget,
                 "resident bytes of tracked tensors allowed (e.g. 8MiB, 40GiB); turns on "
                 "offloading through a teraio Session");
  app.add_option("--tier", a.tiers,
                 "where offloaded bytes go, most preferred first: host:SIZE[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]] "
                 "or file:DIR[,DIR...]:SIZE[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]] (bandwidths measured unless "
                 "given); repeat or separate with commas");
  app.add_option("--profile-steps", a.profile_steps,
                 "steps profiled (reactive) before the plan is made")
      ->capture_default_str();
  app.add_option("--min-tensor", a.min_tensor, "smaller tensors are not tracked")
      ->capture_default_str();
  app.add_flag("--synthetic", a.synthetic,
               "synthetic tokens (arithmetic progressions) instead of text");
  app.add_option("--data", a.data,
                 "text file, byte-level tokens (default: data/kjv-genesis-exodus.txt)");
  app.add_option("--report", a.report, "write the JSON run report (teraio.run v1 and more) here");
  app.add_option("--save-trace", a.save_trace, "write the profiled trace (teraio.trace v2) here");
  app.add_option("--save-plan", a.save_plan, "write the plan (teraio.plan v1, v2 with recomputes) here");
  app.add_flag("--deterministic", a.deterministic,
               "deterministic algorithms only (bitwise repeatable runs)");
  app.add_flag("--no-verify", a.no_verify,
               "do not checksum what file tiers write (damaged files then go unnoticed)");
  app.add_flag("--no-recompute", a.no_recompute,
               "plans move bytes only: never free an activation to recompute it");
  app.add_flag("--no-clean-offloads", a.no_clean_offloads,
               "write every offload, also of tensors whose copy in the tier is still valid");
  app.add_flag("--no-discard-dead", a.no_discard_dead,
               "write dead tensors out too (tensors the profile never uses again before freeing them)");
  app.add_option("--inject-fault", a.inject_faults,
                 "testing: STEP:ERROR:DIRECTION[:COUNT] makes transfers of the first tier fail "
                 "from that step on (repeatable; docs/train.md)");
  // Standard output that did not arrive (a full disk, a closed pipe) is an error.
  const auto stdout_failed = [](int error) {
    std::fprintf(stderr, "teraio-train: cannot write to standard output: %s\n",
                 std::strerror(error != 0 ? error : EIO));
    return 1;
  };
  const auto finish_stdout = [&](int status, int earlier_error) {
    errno = 0;
    const bool flushed = std::fflush(stdout) == 0;
    const int error = errno != 0 ? errno : earlier_error;
    if (status == 0 && (!flushed || std::ferror(stdout))) return stdout_failed(error);
    return status;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    errno = 0;
    const int status = app.exit(e) == 0 ? 0 : 2;
    return finish_stdout(status, errno);
  }
  if (list_models) return finish_stdout(teraio::train::list_models(), 0);
  a.batch_given = app.count("--batch") > 0;
  a.seq_given = app.count("--seq") > 0;
  a.lr_given = app.count("--lr") > 0;
  a.warmup_given = app.count("--warmup-steps") > 0;
  try {
    return finish_stdout(teraio::train::run(a), 0);
  } catch (const std::system_error& e) {  // fmt::print's failed write to stdout
    if (std::string_view(e.what()).starts_with("cannot write to file")) {
      return stdout_failed(e.code().value());
    }
    std::fprintf(stderr, "teraio-train: error: %s\n", e.what());
    return 1;
  } catch (const teraio::Error& e) {
    std::fprintf(stderr, "teraio-train: error: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "teraio-train: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "teraio-train: error: %s\n", e.what());
    return 1;
  }
}
