// The controller (controller.h): modes, drift, the plan cache, the budget checks of each operator
// and the step's errors.
#include "controller.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <system_error>

#include "schedule.h"
#include "teraio/error.h"
#include "teraio/simulator.h"
#include "teraio/sweep.h"
#include "teraio/transform.h"
#include "teraio/units.h"

namespace teraio::offload {

// Note [Controller modes]: a Session starts in profiling mode. A profiled step runs reactively (the
// engine evicts least recently used tensors when the budget is exceeded) and is recorded; after
// profiling_iterations such steps the last one is traced, planned, compiled into a schedule and
// cached under its iteration signature (the hash of every operator's name and input shapes), and
// the mode becomes planned. A planned step runs the schedule at operator starts and ends, checking
// each operator's signature against the profile's:
//   - a mismatch at operator k is a drift: the rest of the iteration runs reactively and is
//     recorded, the operators before k being the plan's own (spliced in from its profile), unless
//     the plan's operator covers it (same operator and ranks, no dimension larger: Note [Smaller
//     shapes on a larger shape's plan]);
//   - an iteration that ends early or late is a drift too (at its end).
// At the end of a drifted step: a plan cached for the new iteration signature is installed (a
// cache hit: nothing is planned); else, when the whole iteration was recorded (the drift was seen
// at an operator), that iteration is the new shape's profile and is planned at once; else the
// next step is profiled and then planned. A plan that cannot be made (a budget that leaves nothing
// for tensors, an operator larger than the budget, a planner error) leaves that shape unplanned:
// Note [A shape that cannot be planned].
// With planning off the mode stays profiling (reported as reactive): traces are still written.
// A planned step whose plan has no moves is fast: operators only advance the index and check the
// signature, lock-free, with lean hooks (inputs only), until a drift.

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kProfiling:
      return "profiling";
    case Mode::kPlanned:
      return "planned";
    case Mode::kReactive:
      return "reactive";
  }
  return "?";
}

std::string group_hint(std::string_view op) {
  if (op.find("_foreach_norm") != std::string_view::npos)
    return ". The gradient norm (torch.nn.utils.clip_grad_norm_) takes every gradient in one "
           "operator: call teraio.clip_grad_norm_ instead, which computes the same norm in parts "
           "that fit the budget (docs/pytorch.md, \"Optimizers\")";
  if (op.find("_foreach_zero_") != std::string_view::npos)
    return ". optimizer.zero_grad(set_to_none=False) zeroes every gradient in one operator: use "
           "zero_grad() (set_to_none=True, the default)";
  // _foreach_mul_ alone: clip_grad_norm_'s scaling, after its _foreach_norm over the same gradients
  // (an optimizer's own _foreach_mul_ comes with larger foreach operators, which give the advice).
  if (op.find("_foreach_mul_") != std::string_view::npos ||
      (op.find("_foreach_") == std::string_view::npos && op.find("_fused_") == std::string_view::npos))
    return "";
  return ". A foreach or fused optimizer step touches every parameter of a group at once (foreach "
         "is PyTorch's default on CUDA): call session.watch(optimizer=optimizer) so that teraio "
         "runs each step in parts that fit the budget, or create the optimizer with foreach=False "
         "(and fused=False) (docs/pytorch.md, \"Optimizers\")";
}

void raise_step_errors(const StepErrors& e) {
  if (!e.fault.empty()) throw IoError(e.fault, e.results_intact);
  if (!e.error.empty()) throw Error(e.error);
}

Controller::Controller(runtime::Engine& engine, ControllerOptions options)
    : engine_(engine), options_(std::move(options)) {
  budget_.budget_bytes = options_.budget_bytes;
}

const char* Controller::reported_mode() const {
  return mode_name(!options_.planning && mode_ == Mode::kProfiling ? Mode::kReactive : mode_);
}

void Controller::note_error(const std::string& what) {
  last_error_ = what;
  if (pending_error_.empty()) pending_error_ = what;
}

void Controller::collect_faults(bool of_the_step) {
  for (runtime::Fault& f : engine_.take_faults()) {
    last_error_ = f.message;
    if (!of_the_step) continue;
    if (f.lost || f.read) step_read_faults_++;
    if (pending_fault_.empty()) pending_fault_ = std::move(f.message);
    step_faults_++;
  }
}

// The budget could not be met at operator k (engine.budget_shortfall() says why): an error of the
// step, once per operator.
void Controller::note_shortfall(uint32_t k, const char* op, bool* noted) {
  if (*noted) return;
  *noted = true;
  budget_violations_++;
  note_error(fmt::format("budget {} could not be met at operator {} ({}): {}",
                         format_bytes(double(budget_.budget_bytes)), k, op,
                         engine_.budget_shortfall()));
}

// Note [The runner's host time]: a recorded trace holds the operators' host time without the
// Session's own callbacks (Note [Host times of a recording] in src/torch/session.cpp), and in a
// planned step those callbacks cost host time of their own (the plan's moves, the engine's
// lookups and sweeps): where the host bounds the step (small kernels, bf16 autocast), the plan's
// replay came out that much short (docs/benchmarks.md, "Recompute chains, writebacks and the peers
// with checkpointing on the H200": 22-31% where stats()["hook_us"] was 69-202 ms a step). Like a
// tier's bandwidth, that cost is measured on the machine rather than guessed: each planned step
// without drift gives the binding's callback time (runner_host_us) less the engine's stalls (which
// the simulator models as transfers) and its recomputes (priced apart: Note [The recomputes' host
// time] in src/sim/simulator.cpp), per operator; the median of the last five is the runner's
// host time per kernel, and predicted_iteration_us replays the active plan with it
// (SimOptions::runner_host_us_per_kernel) once it differs by more than 5% from the one used, so
// the prediction describes the steps as this Session runs them. Plans are still chosen without
// it (plan_predicted_us is the plan-time replay). Replanning for a new shape uses the measured
// value. On CUDA, where the device bounds the step, callbacks also wait for room in the GPU's
// launch queue, and that counts too: the host lane then comes near the measured step, so the
// prediction can hide a replay of the kernels and transfers that was short; plan_predicted_us is
// the number to judge the replay by there.
namespace {
constexpr size_t kHostSamples = 5;
constexpr size_t kMinHostSamples = 3;  // Note [Plans for the host that runs them]
constexpr double kProbeHostScale = 0.7;  // the same Note
constexpr int kMaxHostReplans = 3;       // the same Note
constexpr size_t kMaxCachedPlans = 64;   // Note [How many plans are kept]
constexpr double kHostReplanMoved = 0.1;  // the same Note
constexpr int kMaxLinkReplans = 2;         // Note [Plans for the link in use]
constexpr double kLinkOff = 1.25;          // the same Note
constexpr size_t kMaxStepSamples = 16;   // a schedule's steps kept for its trial (the first stays)

double median_of_last(std::vector<double>& samples) {
  if (samples.size() > kHostSamples) samples.erase(samples.begin());
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];
}

// How plan_variant names a plan made again for the host (Note [Plans for the host that runs them]).
std::string planned_again(double scale) {
  // Two decimals, or three digits below 0.1 (where two would not tell a probe from its try).
  return scale >= 0.1 ? fmt::format("planned again for host times x{:.2f} of the recording's", scale)
                      : fmt::format("planned again for host times x{:.3g} of the recording's", scale);
}

// The fastest of a schedule's planned steps: on the host clock its first (which aligns to the
// plan) left out; the device's periods leave it out already (Note [Steps timed on the device]).
double best_step_us(const std::vector<double>& step_us, bool on_device) {
  const auto first = step_us.begin() + (on_device ? 0 : 1);
  return first < step_us.end() ? *std::min_element(first, step_us.end())
                               : std::numeric_limits<double>::infinity();
}

// The trace with every operator's host time times `scale` (Note [Host times of planned steps]).
Trace with_host_times_scaled(const Trace& trace, double scale) {
  Trace scaled = trace;
  for (KernelIndex k = 0; k < scaled.num_kernels(); ++k)
    scaled.set_kernel_host_us(k, trace.kernel_host_us(k) * scale);
  return scaled;
}

}  // namespace

// True when the runner's host time used changed (the prediction is then made again).
bool Controller::note_runner_host_us() {
  if (runner_samples_.empty()) return false;
  auto changed = [](double median, double& used) {
    if (used > 0 && std::abs(median - used) <= 0.05 * used) return false;
    if (used == 0 && median == 0) return false;
    used = median;
    return true;
  };
  const bool runner = changed(median_of_last(runner_samples_), runner_us_used_);
  const bool recompute =
      !recompute_samples_.empty() && changed(median_of_last(recompute_samples_), recompute_us_used_);
  return runner || recompute;
}

// Note [Host times of planned steps]: a CUDA recording's host times (Note [Host times of a
// recording] in src/torch/session.cpp) are those of the profiled steps, whose operators run with
// CUPTI, their outputs boxed for the recorder and the recording's work around them: on an H100 the
// autocast llama-1b's summed to 165 ms where a planned step with nothing to move took 118 ms, and
// the replay came out 40% long (docs/benchmarks.md, "Kept inputs at FSDP2's memory, and where
// autocast steps wait"). Each planned step without drift measures the host time it took outside
// the Session's callbacks (its wall time on the host less their time, which the runner's host time
// and the stalls account for) against the active trace's summed host times; when the median of
// the last five is below 1, the prediction replays the trace with every host time scaled by it.
// Never above 1: a step the device bounds also waits for the device inside its operators (a full
// launch queue, a scalar read back), which is not host work. Plans are still made with the
// recorded times.
bool Controller::note_host_scale() {
  if (host_samples_.empty()) return false;
  const double scale = std::min(1.0, median_of_last(host_samples_));
  if (std::abs(scale - host_scale_used_) <= 0.05 * host_scale_used_) return false;
  host_scale_used_ = scale;
  return true;
}

// Note [Plans for the host that runs them]: the planner prices a recompute at its producer's host
// time and replays every operator's host time (docs/simulator.md, "The host"), so where the host
// bounds the step (bf16 autocast, small kernels) the plan it keeps depends on those times. Made
// with the recording's, which overstate the planned steps' (Note [Host times of planned steps]), it
// is the plan for a slower host: on an H100 two profiles of the same autocast llama-1b at 1/2,
// recorded with 231 and 308 ms of host time, were planned to 234 and 310 ms, and the second ran at
// 310 ms; planned with its host times scaled to the first's, the second profile predicts 234 ms too
// (docs/benchmarks.md, "Autocast predictions with the counted waits, and plans for the host that
// runs them"). So once kMinHostSamples planned steps have run, the trace is planned again (the same
// planner options) with its host times scaled: by the measured scale when it is below 0.9, else by
// kProbeHostScale, and searched ranking the plans with the runner's measured host time per operator
// (plan_best's runner_host_us_per_kernel). The measured scale cannot be trusted where the plan
// keeps the device waiting for the link: the host then blocks inside operators on a full launch
// queue, which counts as host time, so a plan made for a slow host measures a slow host and is
// never planned again (on an H100, one autocast run in three kept a plan that ran at 0.240 s where
// the runs planned again ran at 0.206-0.239 s; its trace, planned for host times x0.7, predicts 198
// against 233 ms). A new plan whose replay (with the runner's host time, on the scaled trace) is
// more than 2% faster than the active plan's replaces it from the next step, on trial: after
// kMinHostSamples steps of it, its best measured step (the first, which aligns to the plan, left
// out) is compared with the replaced plan's, and the new plan is kept only when it ran more than 1%
// faster; otherwise the replaced plan comes back. So a guess costs at most a few steps, and a plan
// is kept by what the steps measured, not by the model that chose it. Tried again only when the
// scale or the runner's host time per operator has moved by more than kHostReplanMoved since the
// last try, and at most kMaxHostReplans times per cached plan: the first planned steps run slower
// than the later ones (on an H100, llama-1b in autocast at 1/2 measured the runner at 10.2, 8.5,
// 7.9, then 5.8 us an operator and the host at x1.0, x0.93, then x0.68 of the recording's; the one
// try, at 7.9 us and the probe's x0.7, found no plan 2% faster, where at 5.8 us and x0.68 the
// search replays one at 178.7 ms against the active plan's 198.4), but noise within 10% must not
// cost a search every few steps. A planner error keeps the active plan. stats()["plan_variant"]
// says what happened ("planned again for host times xS of the recording's", then whether it was
// kept); plan_path gets the plan in use.
void Controller::replan_for_host() {
  if (!active_ || !active_->trace || !active_->plan || active_->on_trial || pending_search_ ||
      host_samples_.size() < kMinHostSamples || step_us_.size() < kMinHostSamples ||
      active_->host_replans_tried >= kMaxHostReplans)
    return;
  const double measured = host_scale_used_ <= 0.9 ? host_scale_used_ : kProbeHostScale;
  double scale = measured;
  auto moved = [](double now, double then) {
    return then > 0 ? std::abs(now - then) > kHostReplanMoved * then : now > 0;
  };
  bool probe = false;
  if (active_->host_replans_tried > 0 && !moved(measured, active_->tried_scale) &&
      !moved(runner_us_used_, active_->tried_runner_us)) {
    // Note [A faster host after a lost trial]
    if (!active_->lost_trial || active_->probed_after_loss) return;
    scale = active_->tried_at_scale * kProbeHostScale;
    probe = true;
  }
  CachedPlan* active = active_slot();
  if (!active) return;
  CachedPlan& slot = *active;
  slot.host_replans_tried++;
  host_replan_searches_++;
  slot.tried_scale = measured;  // what the next try's host is compared with
  slot.tried_at_scale = scale;
  slot.tried_runner_us = runner_us_used_;
  slot.probed_after_loss = slot.probed_after_loss || probe;
  plan_again(slot, scale, planned_again(scale), /*for_host=*/true);
}

// Note [A faster host after a lost trial]: the host time a planned step measures is the host's own
// only where the GPU keeps up; where the step waits for the GPU or the link, the host blocks inside
// operators (a full launch queue) and measures slow (Note [Plans for the host that runs them]), so
// a plan made again for that scale is made for a slower host than the machine's, and may run no
// faster than the plan it replaces. On an H100 (session 49, llama-3b in autocast at 1/2, one
// machine) the run that kept its first plan measured the host at x0.50-0.57 of its recording and
// its plan made for x0.51 ran no faster (0.393-0.399 s against 0.386-0.387), while the run beside
// it, whose plans were made for x0.65 and then x0.46, ran at 0.308 s with the host measured at
// x0.40. So once a plan made again has lost its trial and the host measures the same after, the
// trace is planned once more for a faster host, kProbeHostScale times the scale of the plan that
// lost, on trial like the others (within kMaxHostReplans per plan): where the host really is that
// slow the new plan's replay is rarely 2% faster and nothing runs, and where its steps run slower
// the trial sends it back after kMinHostSamples steps. Trials time steps on the GPU (Note [Steps
// timed on the device]), so the exploration is judged by what the steps did.

// Plans the slot's trace again with its host times scaled by `scale` and the slot's planner
// options, ranking with the runner's host time; when the new plan's replay is more than 2% faster
// than the active one's, puts it on trial (judge_host_replan keeps it or brings the old one back)
// and returns true (counted in host_replans_ when `for_host`). `why` ends the variant ("planned
// again for ..."). A planner error keeps the active plan. With background_search the search runs
// on a thread of its own and this returns false (Note [Searches in the background]).
bool Controller::plan_again(CachedPlan& slot, double scale, const std::string& why, bool for_host) {
  // No measured step to judge a trial by, or a search in flight already.
  if (step_us_.size() < kMinHostSamples || pending_search_) return false;
  const auto here = [&] {
    const bool tried =
        try_plan(slot, search_again(*slot.trace, slot.planner_options, *slot.plan, scale, runner_us_used_), why);
    if (tried && for_host) host_replans_++;
    return tried;
  };
  if (!options_.background_search) return here();
  PendingSearch p;
  p.signature = slot.iteration_signature;
  p.plan = slot.plan;
  p.why = why;
  p.for_host = for_host;
  try {  // copies (the trace and plan are shared and immutable): the steps go on meanwhile
    p.result = std::async(std::launch::async, [this, trace = slot.trace, plan = slot.plan,
                                               po = slot.planner_options, scale, runner = runner_us_used_] {
      return search_again(*trace, po, *plan, scale, runner);
    });
  } catch (const std::system_error&) {
    return here();  // no thread to be had: searched here, as without background_search
  }
  pending_search_ = std::move(p);
  return false;
}

// The search of plan_again: the scaled trace planned, and both plans replayed on it.
Controller::Search Controller::search_again(const Trace& trace, const PlannerOptions& po, const Plan& active,
                                            double scale, double runner_us) const {
  Search found;
  try {
    const Trace scaled = with_host_times_scaled(trace, scale);
    found.plan = plan_for(scaled, po, &found.variant, runner_us);
    found.active_us = steady_iteration_us(scaled, active, runner_us, false);
    found.new_us = steady_iteration_us(scaled, found.plan, runner_us, false);
    found.predicted_us = steady_iteration_us(scaled, found.plan);
    found.ok = true;
  } catch (const std::exception&) {
    found.ok = false;  // the active plan stays
  }
  return found;
}

// Puts the plan a search found on trial in place of the slot's when its replay is more than 2%
// faster; returns whether it did.
bool Controller::try_plan(CachedPlan& slot, Search found, const std::string& why) {
  const double active_best_us = best_step_us(step_us_, steps_on_device_);
  if (!found.ok || !(found.new_us < 0.98 * found.active_us) || !std::isfinite(active_best_us)) return false;
  try {
    Recording rec;
    rec.trace = *slot.trace;
    rec.tensors = slot.tensors;
    std::vector<uint64_t> signatures;  // the recorded iteration's, as the active schedule has them
    for (const runtime::Schedule::Operator& op : slot.schedule->operators) signatures.push_back(op.signature);
    auto schedule = std::make_shared<const runtime::Schedule>(compile_schedule(rec, found.plan, signatures));
    CachedPlan::Replaced replaced{slot.schedule, slot.plan, slot.predicted_us, slot.variant,
                                  active_best_us, why};
    slot.predicted_us = found.predicted_us;
    if (!options_.plan_path.empty()) write_plan(found.plan, options_.plan_path);
    slot.schedule = std::move(schedule);
    slot.plan = std::make_shared<const Plan>(std::move(found.plan));
    slot.variant = fmt::format("{}; {}", found.variant, why);
    slot.on_trial = std::move(replaced);
    install(&slot);  // the same slot: the host samples stay
    return true;
  } catch (const std::exception&) {
    return false;  // the active plan stays
  }
}

// Note [Searches in the background]
// A plan made again for the host or the link in use (Notes [Plans for the host that runs them],
// [Plans for the link in use]) comes from a full search of the trace, about a second on an H100's
// host for llama-3b (438 variants), and the first planned steps ask for two or three of them: run
// inside end_step, each made one step last a second more (session 48's H100 runs: warm-up steps of
// 1.35 s among steps of 0.34 s, and a measured one of 1.315 s). With
// ControllerOptions::background_search the search runs on a thread of its own (std::async, with
// copies of what it reads: the shared trace and plan, the planner options, the scale and the
// runner's host time) while the steps go on under the active plan; each step's end polls it, and
// when it has ended, its plan goes on trial as before, provided it still applies: the same shape
// is active, with the same plan, not on trial. Otherwise it is dropped (the try counted). One
// search at a time: no other is started, and the link's figures are not corrected (which would
// plan again), while one is in flight. The search's own threads share the host with the training
// loop meanwhile; the trial measures only steps run under the new plan (install clears them).
void Controller::finish_search() {
  if (!pending_search_ || pending_search_->result.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return;
  // Taken once the active plan has steps to judge the new one against (a drift's reinstall of the
  // same plan clears them; the device's periods come a step or two late).
  if (step_us_.size() < kMinHostSamples && collecting_steps()) return;
  PendingSearch p = std::move(*pending_search_);
  pending_search_.reset();
  Search found = p.result.get();  // search_again catches the planner's errors
  if (!active_ || active_->on_trial || active_->iteration_signature != p.signature) return;
  CachedPlan* slot = active_slot();
  if (!slot || slot->plan != p.plan) return;
  if (try_plan(*slot, std::move(found), p.why) && p.for_host) host_replans_++;
}

void Controller::wait_for_search() {
  if (pending_search_) pending_search_->result.wait();
}

void Controller::set_link_measured(size_t i, bool read, bool write, bool duplex) {
  if (link_.size() < options_.tiers.size()) link_.resize(options_.tiers.size());
  LinkState& l = link_.at(i);
  l.read_measured = read;
  l.write_measured = write;
  l.duplex_measured = duplex;
}

// Note [Plans for the link in use]: the Session plans for the bandwidth its probe measured, and a
// probe can be wrong: on an H100 one read the host link at 26.4 GB/s where it runs at 50-54, and
// the plan made for it predicted 0.681 s a step that ran 0.396 s (docs/benchmarks.md, "Issue 15's
// peers at their memory, and plans made again for the host, on an H100"). The tiers time their
// own copies (Note [The link's rate in use] in src/storage/host_tier.cpp), so after kMinHostSamples
// planned steps counted from the first (the probe's passes left out), each figure the probe
// measured is compared with the rate the copies ran at, once 256 MiB (link_min_bytes) moved that way: when
// they differ by more than a factor kLinkOff, the figure becomes the rate in use (with the
// both-ways figure kDefaultDuplexFraction of the slower direction when it was measured too), every
// cached plan's replay and planner options take the corrected tier, and the active trace is
// planned again, on trial as a plan made again for the host (judge_host_replan keeps it only when
// its steps ran faster). Within kLinkOff the figures stay, and a figure is lowered only when its
// copies ran more than kLinkOff below the both-ways figure too: two directions busy at once run
// each at that rate (about 90% of the one-way one on the H200, 67% on one H100 host: docs/
// simulator.md, "Duplex links"), which the plan models already.
// Given figures are the user's and stay. At most kMaxLinkReplans corrections per Session.
void Controller::note_link_in_use() {
  if (!active_ || active_->on_trial || link_replans_ >= kMaxLinkReplans || link_.empty() || pending_search_)
    return;
  const runtime::EngineStats e = engine_.stats();
  std::string what;
  for (size_t i = 0; i < link_.size() && i < e.tiers.size(); ++i) {
    LinkState& l = link_[i];
    const storage::TransferTimes& now = e.tiers[i].transfer;
    if (!l.base_set) {
      l.base = now;
      l.base_set = true;
      l.steps = 0;
      continue;
    }
    if (++l.steps < static_cast<int>(kMinHostSamples)) continue;
    TierSpec& spec = options_.tiers[i];
    // A copy that ran while the other direction moved too ran at most at the both-ways figure:
    // only a rate below that is slower than planned.
    auto correct = [&](bool measured, uint64_t bytes, double rate, double* gbps, bool* fixed,
                       const char* dir) {
      if (!measured || bytes < options_.link_min_bytes || rate <= 0 || *gbps <= 0) return;
      const double slowest = spec.duplex_gbps > 0 ? std::min(*gbps, spec.duplex_gbps) : *gbps;
      if (rate <= kLinkOff * *gbps && rate * kLinkOff >= slowest) return;
      what += fmt::format("{}{} {} {:.1f} GB/s (planned {:.1f})", what.empty() ? "" : ", ",
                          spec.name, dir, rate, *gbps);
      *gbps = rate;
      *fixed = true;
    };
    const std::string before = what;
    const storage::TransferTimes timed = now.since(l.base);
    correct(l.read_measured, timed.read_bytes, timed.read_gbps(), &spec.read_gbps, &l.read_fixed, "reads");
    correct(l.write_measured, timed.write_bytes, timed.write_gbps(), &spec.write_gbps, &l.write_fixed,
            "writes");
    if (what != before && l.duplex_measured && spec.duplex_gbps > 0)
      spec.duplex_gbps = default_duplex_gbps(spec.read_gbps, spec.write_gbps);
  }
  if (what.empty()) return;
  link_replans_++;
  for (LinkState& l : link_) l.base_set = false;  // measured afresh for the corrected plans
  // Every cached plan replays, and plans again, with the corrected tiers.
  for (auto& [sig, slot] : cache_) {
    slot.planner_options.tiers = options_.tiers;
    if (!slot.plan || !slot.trace) continue;
    Plan fixed = *slot.plan;
    fixed.tiers = options_.tiers;
    try {  // its own prediction too (steady_iteration_us starts from it)
      SimOptions so;
      so.iterations = kFirstIterations;
      fixed.predicted = prediction_of(simulate(*slot.trace, fixed, so));
    } catch (const std::exception&) {
      continue;  // the plan stays as it was
    }
    slot.plan = std::make_shared<const Plan>(std::move(fixed));
    slot.predicted_us = steady_iteration_us(*slot.trace, *slot.plan);
  }
  predict_active();
  CachedPlan* active = active_slot();
  if (!active) return;
  const double scale = host_scale_used_ <= 0.9 ? host_scale_used_ : 1.0;
  plan_again(*active, scale, fmt::format("planned again for the link in use: {}", what), /*for_host=*/false);
}

// Note [Plans for the host that runs them]: the trial of a plan made again, once it has run
// kMinHostSamples planned steps.
//
// Note [Steps timed end to end]: a trial compares the plans' steps as a long run sees them: from
// the end of the step before (after teraio's own work there, such as a search) to the end of this
// one. The time inside `with session.step()` alone is the host's: on a GPU the device may still be
// running the step's kernels and copies when it ends, and the loop then waits for them outside it
// (the next step's first operators, a loss.item(), a synchronize). On an H100 a plan made again
// ran 0.175 s steps against the first plan's 0.194 s, but 137 against 126 ms inside the steps, so
// it was not kept (docs/benchmarks.md, "Issue 15's autocast peer three times, the probe fixed, and
// deferred updates tried, on an H100"). A loop's own time between steps counts for both plans alike.
//
// Note [Steps timed on the device]: on the host clock, a step's period from the end of the step
// before carries that step's device tail in place of its own, and the first step of a schedule
// (which aligns to it) ends with a short one: on an H100 (session 49, llama-3b in autocast at 1/2)
// the second planned step of each plan timed 50-60 ms under the steps llm_bench timed between
// synchronizes (332 against 386 ms, 345 against 393-399), so a trial's figures were the host's, not
// the steps'. Where the binding can time the device (CUDA), it marks each step's end with an event
// on the stream the step ran on, and the trial takes the device's time between consecutive marks:
// the end of one step's work to the end of the next's, idle time waiting for the host included,
// read once the later mark has passed (a step or two late; nothing waits for it). Marks carry the
// schedule's install count, so a period whose earlier step ran another schedule (the step that
// aligns), or that spans a step not measured (a drift, a smaller shape), is never taken. Without
// device timing (CPU, tests) the host clock's periods stand, whose steps have no tail.
void Controller::judge_host_replan() {
  if (!active_ || !active_->on_trial || step_us_.size() < kMinHostSamples) return;
  CachedPlan* active = active_slot();
  if (!active) return;
  CachedPlan& slot = *active;
  CachedPlan::Replaced old = std::move(*slot.on_trial);
  slot.on_trial.reset();
  const double best_us = best_step_us(step_us_, steps_on_device_);
  if (best_us < 0.99 * old.best_step_us) {
    slot.lost_trial = false;
    slot.variant += fmt::format(", kept: {} a step against {}", format_us(best_us), format_us(old.best_step_us));
    plan_variant_ = slot.variant;
    return;
  }
  host_replans_reverted_++;
  slot.lost_trial = true;  // Note [A faster host after a lost trial]
  slot.schedule = std::move(old.schedule);
  slot.plan = std::move(old.plan);
  slot.predicted_us = old.predicted_us;
  slot.variant = fmt::format("{}; {}, it ran {} a step against {}: not kept", old.variant,
                             old.why, format_us(best_us), format_us(old.best_step_us));
  try {
    if (!options_.plan_path.empty()) write_plan(*slot.plan, options_.plan_path);
  } catch (const std::exception& e) {
    note_error(e.what());
  }
  install(&slot);
}

// The cache's entry of the active plan, to change in place (null when the active plan is not the
// cache's entry for its signature).
Controller::CachedPlan* Controller::active_slot() {
  auto it = cache_.find(active_->iteration_signature);
  return it != cache_.end() && &it->second == active_ ? &it->second : nullptr;
}

// The active plan's prediction: its plan-time replay, with the runner's measured host time and the
// planned steps' host times once measured.
void Controller::predict_active() {
  const CachedPlan* p = active_;
  if (!p || !p->trace || !p->plan) return;
  plan_predicted_us_ = p->predicted_us;
  const bool as_recorded = host_scale_used_ >= 1;
  if (runner_us_used_ <= 0 && recompute_us_used_ <= 0 && as_recorded) {
    predicted_iteration_us_ = p->predicted_us;
    return;
  }
  const Trace scaled = as_recorded ? Trace() : with_host_times_scaled(*p->trace, host_scale_used_);
  predicted_iteration_us_ = steady_iteration_us(as_recorded ? *p->trace : scaled, *p->plan,
                                                runner_us_used_, as_recorded, recompute_us_used_);
}

void Controller::install(const CachedPlan* p) {
  if (p != active_) {  // another trace: its recorded host times are measured against afresh
    host_samples_.clear();
    host_scale_used_ = 1;
  }
  if (recompute_plan_.lock() != p->plan) {  // its recomputes are measured afresh
    recompute_plan_ = p->plan;
    recompute_samples_.clear();
    recompute_us_used_ = 0;
  }
  active_ = p;
  p->last_used = iteration_;
  step_us_.clear();  // the steps of this schedule, from its first (which aligns to it)
  schedule_epoch_++;  // Note [Steps timed on the device]: its steps' label
  periods_since_install_ = 0;
  recent_steps_.clear();
  measured_step_us_ = 0;
  plan_variant_ = p->variant;  // a cache hit's too
  predict_active();
  engine_.set_schedule(p->schedule);
  mode_ = Mode::kPlanned;
  if (p->schedule->moves == 0) {
    engine_.fetch_all();  // nothing may stay out: the fast path fetches nothing
    fast_.store(true, std::memory_order_relaxed);
  } else {
    fast_.store(false, std::memory_order_relaxed);
  }
}

void Controller::uninstall(Mode mode) {
  engine_.set_schedule(nullptr);
  active_ = nullptr;
  mode_ = mode;
}

void Controller::begin_step(StepBinding& binding) {
  TERAIO_CHECK(!in_step(), "Session.step(): a step is already running (end it first)");
  pending_error_.clear();
  pending_fault_.clear();
  step_faults_ = 0;
  step_read_faults_ = 0;
  step_need_bytes_ = 0;
  step_need_error_.clear();
  step_need_hint_.clear();
  collect_faults(false);  // faults met between steps were reported where they happened
  in_step_ = true;
  op_counter_ = 0;
  iter_sig_ = 0;
  recorder_.begin_iteration(iteration_);
  step_shapes_.clear();
  step_within_ = false;
  if (active_) active_->last_used = iteration_;
  iteration_reactive_ = false;
  step_hook_us0_ = binding.runner_host_us();
  step_stall_us0_ = engine_.stats().stall_us;
  step_recompute_us0_ = engine_.stats().recompute_us;
  step_wall_us0_ = now_us();
  // Measured afresh in each profiled iteration: in the first, tensors not yet seen (parameters
  // before their first operator) are allocated but not tracked, which would count them twice.
  if (mode_ == Mode::kProfiling) {
    budget_.untracked_bytes = 0;
    engine_.set_reserve(budget_.untracked_bytes);
  }
  fast_.store(mode_ == Mode::kPlanned && active_ && active_->schedule->moves == 0,
              std::memory_order_relaxed);
  binding.use_lean_hooks(fast());
  // The fast path watches no writes (Note [Clean offloads]); until here, between steps, the full
  // hooks did, also after install() read everything back.
  if (fast()) engine_.discard_clean_copies();
  if (!fast()) {
    try {
      engine_.poll();
      // Within the budget before the step begins (a failed transfer of the last step can have
      // left tensors resident), then the plan's starting point.
      engine_.enforce_budget();
      engine_.reset_step_peak();
      if (mode_ == Mode::kPlanned && active_) engine_.align();
    } catch (const std::exception& e) {
      note_error(e.what());  // reported by end_step; the step runs (reactively where need be)
    }
    collect_faults();
  } else {
    engine_.reset_step_peak();
  }
}

// A period of the active schedule's steps (Notes [Steps timed end to end], [Steps timed on the
// device]), kept only while a plan made again for the host may still be tried or is on trial (a
// long run's steps must not pile up).
bool Controller::collecting_steps() const {
  return active_ && (active_->on_trial || active_->host_replans_tried < kMaxHostReplans ||
                     link_replans_ < kMaxLinkReplans);
}

void Controller::add_step_sample(double us) {
  // stats()["measured_step_us"]: the active schedule's last steps, its first on the host clock
  // (which aligns to it) left out.
  if (steps_on_device_ || periods_since_install_ > 0) {
    recent_steps_.push_back(us);
    measured_step_us_ = median_of_last(recent_steps_);
  }
  periods_since_install_++;
  // Trials only where the trace has host times (CUDA: Note [Plans for the host that runs them]).
  if (active_->recorded_host_us <= 0 || !collecting_steps()) return;
  step_us_.push_back(us);
  if (step_us_.size() > kMaxStepSamples) step_us_.erase(step_us_.begin() + (steps_on_device_ ? 0 : 1));
}

// Note [A shape that cannot be planned]: a plan is made per iteration signature (the operators'
// names and input shapes), and one shape can fail where the others plan: a batch of longer
// sequences whose attention kernel alone is larger than the budget, or whose workspaces leave
// nothing for tensors. Such a failure used to make the whole Session reactive for good, so one
// long batch in a run of variable-length ones (a DataLoader without padding to a fixed length)
// slowed every later step. Now the failure is the shape's alone: its signature is remembered
// (unplannable_) and never planned again, the error is raised once at the end of that step (the
// step's results stand), and
//   - after a drift, the plan installed before stays: the next step of its shape runs it (or starts
//     another cached plan: Note [A step that starts as another cached plan]), a step of the failed
//     shape drifts and runs reactively;
//   - otherwise (the first shape of the Session) the mode is reactive; at the end of a reactive step
//     a cached plan of its shape is installed, and a shape neither planned nor failed has its next
//     step profiled and then planned. A profiled step of a failed shape stays in profiling mode, so
//     that the next step of another shape plans.
// Steps of a failed shape that are larger than the budget still raise their own error each time
// (an operator larger than the budget: Note [Budget policy]).
StepErrors Controller::end_step(StepBinding& binding) {
  TERAIO_CHECK(in_step(), "Session.step(): no step is running");
  collect_faults(true);
  const bool recorded = recording();
  in_step_ = false;
  const uint32_t ops_run = op_counter_;
  last_operators_ = ops_run;
  fast_.store(false, std::memory_order_relaxed);
  const uint64_t sig = iter_sig_.load();
  bool planning = false;  // a plan is being made for this step's shape
  const CachedPlan* const drifted_from = active_;
  try {
    if (mode_ == Mode::kPlanned && !iteration_reactive_ &&
        ops_run != active_->schedule->operators.size()) {
      iteration_reactive_ = true;  // the iteration ended early or late: drift
      drift_events_++;
    }
    // Note [Steps timed on the device]: every step is marked, the planned ones that are measured
    // with their schedule's label, so that no period spans a step of another kind.
    const bool timed = mode_ == Mode::kPlanned && !iteration_reactive_ && !step_within_ && active_;
    std::vector<std::pair<uint64_t, double>> device_periods;
    steps_on_device_ = binding.mark_step_end(timed ? schedule_epoch_ : 0, &device_periods);
    if (steps_on_device_ && active_)
      for (const auto& [label, us] : device_periods)
        if (label == schedule_epoch_) add_step_sample(us);
    if (mode_ == Mode::kPlanned && !iteration_reactive_ && step_within_) {
      steps_on_larger_plans_++;  // Note [Smaller shapes on a larger shape's plan]: not measured
    } else if (timed) {
      const double hook_us = binding.runner_host_us() - step_hook_us0_;
      const double stall_us = engine_.stats().stall_us - step_stall_us0_;
      // the recomputes run inside the callbacks: priced apart (Note [The recomputes' host time])
      const double recompute_us = engine_.stats().recompute_us - step_recompute_us0_;
      if (hook_us > 0 && ops_run > 0) {
        runner_samples_.push_back(std::max(0.0, hook_us - stall_us - recompute_us) / ops_run);
        recompute_samples_.push_back(recompute_us);
      }
      const double end_us = now_us();
      const double step_us = end_us - step_wall_us0_;
      // Note [Host times of planned steps]
      if (active_->recorded_host_us > 0)
        host_samples_.push_back(std::max(0.0, step_us - std::max(0.0, hook_us)) / active_->recorded_host_us);
      // Note [Steps timed end to end]
      if (!steps_on_device_) add_step_sample(last_step_end_us_ > 0 ? end_us - last_step_end_us_ : step_us);
      const bool runner_changed = note_runner_host_us();
      if (note_host_scale() || runner_changed) predict_active();
      judge_host_replan();
      note_link_in_use();
      finish_search();  // Note [Searches in the background]
      replan_for_host();
    }
    const auto cached = options_.planning ? cache_.find(sig) : cache_.end();
    const bool unplannable = unplannable_.contains(sig);
    if (mode_ == Mode::kProfiling) {
      profiled_++;
      if (cached != cache_.end()) {
        install(&cached->second);  // a shape planned before (after a drift recorded in part)
      } else if (!unplannable) {
        planning = true;
        make_and_install_plan(sig, /*force=*/false, binding);
      }
    } else if (mode_ == Mode::kPlanned && iteration_reactive_) {
      if (cached != cache_.end()) {
        install(&cached->second);
      } else if (unplannable) {
        // the plan installed stays, for the next step of its shape
      } else if (recorder_.operators().size() == ops_run && !step_within_) {
        planning = true;
        make_and_install_plan(sig, /*force=*/true, binding);  // the new shape's profile
      } else {
        uninstall(Mode::kProfiling);  // profile the next iteration, then plan it
        profiled_ = std::max(0, options_.profiling_iterations - 1);
      }
    } else if (mode_ == Mode::kReactive) {
      if (cached != cache_.end()) {
        install(&cached->second);
      } else if (!unplannable) {
        uninstall(Mode::kProfiling);  // a shape not tried yet: profile its next step, then plan it
        profiled_ = std::max(0, options_.profiling_iterations - 1);
      }
    }
  } catch (const std::exception& e) {
    // After the step's operators: its results stand (docs/pytorch.md, "Modes": reactive).
    if (planning && !cache_.contains(sig)) unplannable_.insert(sig);
    // A drift's new shape that cannot be planned: the plan installed before stays, for its own
    // shape (unless the failure came while another was being installed).
    if (planning && mode_ == Mode::kPlanned && active_ == drifted_from && active_) {
      plan_variant_ = active_->variant;
      predict_active();
    } else {
      uninstall(Mode::kReactive);
    }
    std::string what = fmt::format(
        "{}. The step ran and its results stand; {} (each tensor brought back when an operator needs "
        "it, without a plan: slower){}",
        e.what(),
        planning ? "the next steps of this shape run reactively" : "the next steps run reactively",
        !planning         ? ""
        : cache_.empty() ? "; a step of another shape is profiled and planned"
                          : fmt::format("; steps of other shapes run their plans ({} cached)", cache_.size()));
    // An operator larger than the budget is the step's error; the plan's failure is said after it.
    if (!step_need_error_.empty()) step_need_hint_ += ". No plan was made for this step's shape: " + what;
    note_error(what);
  }
  try {
    engine_.poll();
    engine_.release_recipes();  // they hold their producers' inputs
  } catch (const std::exception& e) {
    note_error(e.what());
  }
  collect_faults(true);
  if (recorded) first_recording_ = false;
  recorder_.clear_operators();
  iteration_++;
  StepErrors r;
  r.error = step_need_error_.empty() ? std::move(pending_error_)
                                     : std::move(step_need_error_) + step_need_hint_;
  r.fault = std::move(pending_fault_);
  if (!r.fault.empty()) {
    if (step_faults_ > 1)
      r.fault += fmt::format(" (and {} more failed transfers in this step)", step_faults_ - 1);
    if (step_read_faults_ == 0)
      r.fault +=
          ". Only writes failed: no data was lost and the step's results are intact (the "
          "tensors stayed on the device)";
  }
  r.results_intact = step_read_faults_ == 0;
  last_step_end_us_ = now_us();  // after this step's searches: Note [Steps timed end to end]
  pending_error_.clear();
  pending_fault_.clear();
  step_need_error_.clear();
  step_faults_ = step_read_faults_ = 0;
  return r;
}

void Controller::note_drift(uint32_t k, StepBinding& binding) {
  iteration_reactive_ = true;
  fast_.store(false, std::memory_order_relaxed);
  binding.use_lean_hooks(false);
  drift_events_++;
  const std::vector<runtime::Schedule::Operator>& planned = active_->schedule->operators;
  const size_t n = std::min({static_cast<size_t>(k), active_->ops.size(), planned.size()});
  std::vector<uint64_t> sigs(n);
  for (size_t i = 0; i < n; ++i) sigs[i] = planned[i].signature;
  recorder_.splice(std::span(active_->ops).first(n), sigs);
  step_shapes_.assign_first(active_->shapes, n);
}

bool Controller::try_fast(uint64_t signature, uint32_t* k) {
  *k = op_counter_.load(std::memory_order_relaxed);
  const std::vector<runtime::Schedule::Operator>& planned = active_->schedule->operators;
  if (*k < planned.size() && planned[*k].signature == signature) {
    count_fast(*k, signature);
    return true;
  }
  return false;
}

void Controller::count_fast(uint32_t k, uint64_t signature) {
  op_counter_.store(k + 1, std::memory_order_relaxed);
  iter_sig_.store(mix(iter_sig_.load(std::memory_order_relaxed), signature), std::memory_order_relaxed);
}

bool Controller::drift_at(uint32_t k, uint64_t signature, const OperatorShape& shape,
                          StepBinding& binding) {
  if (!fast()) return false;
  if (within_active(k, shape)) {  // the lock-free path goes on
    count_fast(k, signature);
    return true;
  }
  if (!switch_plan_at_start(k, signature, shape, binding)) note_drift(k, binding);
  return false;
}

// Note [Smaller shapes on a larger shape's plan]: a loop whose batches vary in length (dynamic
// padding, the Hugging Face collators' default: each batch padded to its longest sequence) makes
// a new iteration signature at almost every step, and each new one drifted, ran reactively (slower,
// and past the budget by up to an operator's outputs), was recorded and had a plan made for it:
// bench/varying_lengths.py (a tiny HF Llama, 40 lengths in 60 steps, on the CPU) drifted 39 times
// and made 40 plans, in 2.2-3.4x the time it takes since (docs/benchmarks.md, "Batches of varying
// length"). A plan made for a shape is also valid for any step with the same operators on inputs
// no larger, dimension by dimension: the same tensors live and die at the same operators, each no
// larger than the plan counted it, so the plan's moves keep the step within the budget (they move
// the bytes the tensors have, fewer), and room made for an operator's outputs is the profile's, at
// least what they take. Each operator's shape (OperatorShape: a form hashing its
// name and its input tensors' ranks and dtypes, and their dims) is kept with the plan; an operator
// whose signature differs from the plan's but whose form is the same and whose dims are no larger
// than the plan's (OperatorShapes::covers) runs as planned. At a step's first operator, the
// smallest cached plan that covers it is chosen when no plan has its exact signature (Note [A step
// that starts as another cached plan]); a later operator that the plan does not cover is a drift
// as before, and since the operators spliced in from the plan then have the plan's shapes, not the
// step's, the step's recording is not planned: the next step is profiled instead. A step of a new
// shape that is covered is not planned at all (its plan would move fewer bytes, but planning and a
// reactive step cost more than it saves when shapes rarely repeat); its time does not count in
// the measurements of the plan's own steps (host scale, runner time, trials), which it would skew.
// Counted in steps_on_larger_plans.
bool Controller::within_active(uint32_t k, const OperatorShape& shape) {
  if (!active_ || !active_->shapes.covers(k, shape)) return false;
  step_within_ = true;
  return true;
}

// Note [A step that starts as another cached plan]: the plan installed for a step is the one
// cached for the previous step's signature, so a loop whose shape changes now and then (an
// epoch's last, shorter batch: a DataLoader's drop_last=False, the HF Trainer's default) drifted
// at the first operator of the step after each change and ran it reactively, past the budget by up
// to an operator's outputs (bench/stress_cpu.py: a 16-batch step after an 8-batch one, 20% over),
// although a plan for its shape was cached. When the first operator's signature is not the
// installed plan's but is another cached plan's first (one that moves something: a plan without
// moves runs on the lock-free path, entered only at a step's start), that plan is installed
// there and the persistent tensors are put where it starts; the step runs it as planned. Counted
// in plan_switches, not as a drift. Several plans may share a first operator: the one cached under
// the smallest signature is taken, and a later mismatch is a drift as before.
bool Controller::switch_plan_at_start(uint32_t k, uint64_t signature, const OperatorShape& shape,
                                      StepBinding& binding) {
  if (k != 0 || mode_ != Mode::kPlanned || iteration_reactive_) return false;
  const CachedPlan* found = nullptr;
  uint64_t found_sig = 0;
  for (const auto& [sig, slot] : cache_) {
    if (&slot == active_ || !slot.schedule || slot.schedule->moves == 0 ||
        slot.schedule->operators.empty() || slot.schedule->operators.front().signature != signature)
      continue;
    if (!found || sig < found_sig) {
      found = &slot;
      found_sig = sig;
    }
  }
  if (!found) {
    // Note [Smaller shapes on a larger shape's plan]: the smallest plan that covers the operator,
    // the installed one included (it stays when it is that plan).
    int64_t best = 0;
    for (const auto& [sig, slot] : cache_) {
      const bool usable = &slot == active_ || (slot.schedule && slot.schedule->moves > 0);
      if (!usable || !slot.shapes.covers(0, shape)) continue;
      const int64_t extent = slot.shapes.extent(0);
      if (!found || extent < best || (extent == best && sig < found_sig)) {
        found = &slot;
        found_sig = sig;
        best = extent;
      }
    }
    if (!found) return false;
    step_within_ = true;
    if (found == active_) return true;
  }
  install(found);
  binding.use_lean_hooks(false);
  plan_switches_++;
  try {
    engine_.align();
  } catch (const std::exception& e) {
    note_error(e.what());  // reported by end_step; the step runs (reactively where need be)
  }
  return true;
}

void Controller::begin_operator(uint32_t k, uint64_t signature, const OperatorShape& shape,
                                const char* name,
                                std::span<const LogicalId> ids, uint64_t own_bytes, bool collective,
                                bool* violation, StepBinding& binding) {
  iter_sig_.store(mix(iter_sig_.load(std::memory_order_relaxed), signature),
                  std::memory_order_relaxed);
  if (mode_ == Mode::kPlanned && !iteration_reactive_) {
    const std::vector<runtime::Schedule::Operator>& planned = active_->schedule->operators;
    if (k < planned.size() && planned[k].signature == signature)
      engine_.before_operator(k, ids);
    else if (k > 0 && within_active(k, shape))
      engine_.before_operator(k, ids);  // Note [Smaller shapes on a larger shape's plan]
    else if (switch_plan_at_start(k, signature, shape, binding))
      engine_.before_operator(k, ids);  // the plan installed now, or the active one covers it
    else
      note_drift(k, binding);
  }
  if (recording()) {
    recorder_.add_signature(signature);
    step_shapes_.add(shape);
  }
  engine_.begin_use(ids);
  collect_faults();
  if (collective)
    for (LogicalId id : ids) engine_.pin_permanently(id);
  const runtime::BudgetPolicy check = check_policy();
  if (check.violated_by(own_bytes)) {
    *violation = true;
    budget_violations_++;
    // The step reports its largest such operator: the budget that would work for all of them.
    const uint64_t need = check.operator_need_bytes(own_bytes);
    if (need > step_need_bytes_) {
      step_need_bytes_ = need;
      const uint64_t untracked = check.untracked_bytes;
      step_need_error_ = fmt::format(
          "budget {} is smaller than the tensors of operator {} ({}): {}{}; the step needs a "
          "budget "
          "of at least {} for that operator alone",
          format_bytes(double(budget_.budget_bytes)), k, name, format_bytes(double(own_bytes)),
          untracked ? fmt::format(" plus {} of device memory used outside tracked tensors",
                                  format_bytes(double(untracked)))
                    : "",
          format_bytes(double(need)));
      last_error_ = step_need_error_;
    }
    // Each kind of whole-group operator that broke the budget adds its advice once (an
    // unwatched foreach optimizer and torch's gradient norm may both have).
    if (std::string hint = group_hint(name);
        !hint.empty() && step_need_hint_.find(hint) == std::string::npos)
      step_need_hint_ += hint;
  }
  // Room for what the operator creates (known from the plan's profile), so that its outputs too
  // stay within the budget in planned steps.
  const std::vector<runtime::Schedule::Operator>* planned =
      planned_now() ? &active_->schedule->operators : nullptr;
  const uint64_t created = planned && k < planned->size() ? (*planned)[k].created_bytes : 0;
  if (!engine_.enforce_budget(created)) note_shortfall(k, name, violation);
}

void Controller::note_device_peak(uint64_t peak_bytes) {
  engine_.forget_dead();  // what died is no longer allocated: it must not count as tracked
  const uint64_t tracked = engine_.stats().resident_bytes;
  live_untracked_ = peak_bytes > tracked ? peak_bytes - tracked : 0;
  budget_.untracked_bytes = std::max(budget_.untracked_bytes, live_untracked_);
  engine_.set_reserve(check_policy().untracked_bytes);
}

void Controller::end_operator(uint32_t k, const char* name, std::span<const LogicalId> ids,
                              std::span<const LogicalId> outputs, bool collective,
                              bool* violation) {
  engine_.end_use(ids);
  engine_.touch(outputs);
  if (collective)  // a functional collective's result
    for (LogicalId id : outputs) engine_.pin_permanently(id);
  if (planned_now()) engine_.after_operator(k);
  // The safety net in every mode (a plan keeps below it: the planner's budget is lower).
  if (!engine_.enforce_budget()) note_shortfall(k, name, violation);
  collect_faults();
}

Plan Controller::plan_for(const Trace& trace, const PlannerOptions& po, std::string* variant,
                          double runner_us) const {
  if (options_.plan_search) {
    BestPlan best = plan_best(trace, po, kFirstIterations, runner_us);
    *variant = best.variant;
    return std::move(best.plan);
  }
  *variant = "default";
  return issue_in_deadline_order(trace, make_plan(trace, po));
}

// Note [Steady-state prediction]: the plan's own `predicted` is `teraio simulate`'s default (the
// mean of 2 iterations, the first starting with nothing in flight), which the plan file keeps.
// What a user compares with the steps they measure is a step of a long run, which carries the
// transfers the step before left running: the Session reports the mean of simulated iterations
// 2 to kSteadyIterations - 1, from the totals through kFirstIterations (2: plan_best's replay)
// and through kSteadyIterations (a mean, not the last iteration alone, which is not monotonic in
// bandwidth: docs/simulator.md, "Which iteration is reported"). On the H200's llama-1b plans that
// is 3-5% above the 2-iteration mean.
double Controller::steady_iteration_us(const Trace& trace, const Plan& plan, double runner_us,
                                       bool as_planned, double recompute_host_us) const {
  try {
    SimOptions so;
    so.runner_host_us_per_kernel = runner_us;
    so.recompute_host_us_per_iteration = recompute_host_us;
    // plan_best's replay already is this one (without runner_us, of the trace it planned)
    so.iterations = kFirstIterations;
    const double first = kFirstIterations * (options_.plan_search && runner_us == 0 &&
                                             recompute_host_us == 0 && as_planned
                                                 ? plan.predicted.iteration_us
                                                 : simulate(trace, plan, so).iteration_us);
    so.iterations = kSteadyIterations;
    const double all = kSteadyIterations * simulate(trace, plan, so).iteration_us;
    return (all - first) / (kSteadyIterations - kFirstIterations);
  } catch (const std::exception&) {
    return plan.predicted.iteration_us;
  }
}

void Controller::make_and_install_plan(uint64_t iteration_signature, bool force,
                                       StepBinding& binding) {
  Recording rec = recorder_.build_trace(engine_, binding);
  profiled_kernel_us_ = rec.trace.total_time_us();
  if (!options_.trace_path.empty()) write_trace(rec.trace, options_.trace_path);
  if (!options_.planning || (!force && profiled_ < options_.profiling_iterations)) return;
  recorder_.set_times(rec.trace);
  if (!budget_.can_plan())
    throw Error(fmt::format(
        "budget {} leaves nothing for tensors: {} of device memory is used outside the "
        "tracked tensors (operator workspaces and temporaries, tensors under {}){}",
        format_bytes(double(budget_.budget_bytes)), format_bytes(double(budget_.untracked_bytes)),
        format_bytes(double(options_.min_tensor_bytes)),
        budget_.device_margin ? ", plus a margin of 1/32" : ""));
  PlannerOptions po;
  po.budget_bytes = budget_.planner_budget_bytes();
  plan_budget_bytes_ = po.budget_bytes;
  po.tiers = options_.tiers;
  po.min_tensor_bytes = options_.min_tensor_bytes;
  po.recompute = options_.recompute;
  po.discard_dead = options_.discard_dead;
  po.writebacks = options_.writebacks;
  po.deep_recompute = options_.deep_recompute;
  po.recompute_across_peak = options_.recompute_across_peak;
  Plan plan;
  try {
    plan = plan_for(rec.trace, po, &plan_variant_);
  } catch (const Error& e) {
    if (budget_.planner_reserve_bytes() == 0) throw;
    throw Error(fmt::format(
        "{} (the planner's budget is the Session's {} less {} of device memory used outside "
        "tracked tensors and a margin of 1/32)",
        e.what(), format_bytes(double(budget_.budget_bytes)),
        format_bytes(double(budget_.untracked_bytes))));
  }
  plan_predicted_us_ = steady_iteration_us(rec.trace, plan);  // install() adds the runner's time
  // Note [Predicting steps in backward]: the same profile rewritten as the loop would record it
  // with each optimizer update in the backward (teraio transform --step-in-backward), planned and
  // replayed the same way, so that the Python Session can say when that loop would be faster
  // (docs/pytorch.md, "Optimizer steps in backward"). 0 when not possible (no watched optimizer
  // states, a parameter read after its gradient is complete, a planner error). When not asked for
  // (the Python Session stops asking once it has decided), the last prediction stays.
  if (predict_in_backward_) {
    predicted_in_backward_us_ = 0;
    try {
      const Trace moved = move_optimizer_into_backward(rec.trace);
      std::string variant;
      predicted_in_backward_us_ = steady_iteration_us(moved, plan_for(moved, po, &variant));
    } catch (const std::exception&) {
      // not possible for this profile: stays 0
    }
  }
  if (!options_.plan_path.empty()) write_plan(plan, options_.plan_path);
  CachedPlan cp;
  cp.schedule = std::make_shared<const runtime::Schedule>(
      compile_schedule(rec, plan, recorder_.signatures()));
  cp.tensors = std::move(rec.tensors);
  cp.planner_options = po;
  cp.iteration_signature = iteration_signature;
  cp.variant = plan_variant_;
  cp.ops = recorder_.take_operators();
  cp.predicted_us = plan_predicted_us_;
  if (step_shapes_.size() == cp.ops.size()) cp.shapes = std::move(step_shapes_);  // else none cover
  step_shapes_.clear();
  cp.plan = std::make_shared<const Plan>(std::move(plan));
  cp.trace = std::make_shared<const Trace>(std::move(rec.trace));
  for (KernelIndex k = 0; k < cp.trace->num_kernels(); ++k) cp.recorded_host_us += cp.trace->kernel_host_us(k);
  // Note [How many plans are kept]: a loop whose batches vary in two dimensions (token-budget
  // batching: many short sequences or few long ones) can make a plan for every shape, none
  // covering another (Note [Smaller shapes on a larger shape's plan]), and each cached plan holds
  // its profile, trace and schedule (megabytes for a large model). At most kMaxCachedPlans are
  // kept: a new one replaces the plan least recently run (never the installed one); a shape whose
  // plan was dropped drifts and is planned again when it comes back.
  if (cache_.size() >= kMaxCachedPlans && !cache_.contains(iteration_signature)) {
    auto oldest = cache_.end();
    for (auto it = cache_.begin(); it != cache_.end(); ++it)
      if (&it->second != active_ && (oldest == cache_.end() || it->second.last_used < oldest->second.last_used))
        oldest = it;
    if (oldest != cache_.end()) cache_.erase(oldest);
  }
  CachedPlan& slot = cache_[iteration_signature];
  slot = std::move(cp);
  install(&slot);
}

void Controller::fill_stats(const runtime::EngineStats& e, SessionStats* r) const {
  r->mode = reported_mode();
  r->iteration = iteration_;
  r->budget_bytes = budget_.budget_bytes;
  r->peak_resident_bytes = e.peak_resident_bytes;
  r->step_peak_resident_bytes = e.step_peak_resident_bytes;
  r->untracked_bytes = budget_.untracked_bytes;
  r->plan_budget_bytes = plan_budget_bytes_;
  r->plan_variant = plan_variant_;
  r->predicted_iteration_us = predicted_iteration_us_;
  r->measured_step_us = measured_step_us_;
  r->plan_predicted_us = plan_predicted_us_;
  r->runner_host_us_per_operator = runner_us_used_;
  r->recompute_host_us_per_step = recompute_us_used_;
  r->host_time_scale = host_scale_used_;
  r->host_replans = host_replans_;
  r->host_replans_reverted = host_replans_reverted_;
  r->host_replan_searches = host_replan_searches_;
  r->link_replans = link_replans_;
  r->predicted_step_in_backward_us = predicted_in_backward_us_;
  r->profiled_kernel_us = profiled_kernel_us_;
  r->resident_bytes = e.resident_bytes;
  r->pinned_bytes = e.pinned_bytes;
  r->bytes_offloaded = e.bytes_offloaded;
  r->bytes_prefetched = e.bytes_prefetched;
  r->stall_us = e.stall_us;
  r->submit_us = e.submit_us;
  r->stall_read_us = e.stall_read_us;
  r->stall_write_us = e.stall_write_us;
  r->stall_room_us = e.stall_room_us;
  r->stall_read_use_us = e.stall_read_use_us;
  r->stall_write_due_us = e.stall_write_due_us;
  r->stall_write_readback_us = e.stall_write_readback_us;
  r->stall_writeback_us = e.stall_writeback_us;
  r->plan_moves = e.plan_moves;
  r->skipped_moves = e.skipped_moves;
  r->full_sweeps = e.full_sweeps;
  r->aligned_moves = e.aligned;
  r->stream_ordered_offloads = e.stream_ordered;
  r->reads_after_writes = e.reads_after_writes;
  r->clean_offloads = e.clean_offloads;
  r->clean_bytes = e.clean_bytes;
  r->discards = e.discards;
  r->discarded_bytes = e.discarded_bytes;
  r->writebacks = e.writebacks;
  r->writeback_bytes = e.writeback_bytes;
  r->stale_writebacks = e.stale_writebacks;
  r->writebacks_taken_over = e.writebacks_taken_over;
  r->drift_events = drift_events_;
  r->plan_switches = plan_switches_;
  r->steps_on_larger_plans = steps_on_larger_plans_;
  r->urgent_fetches = e.urgent_fetches;
  r->evictions = e.evictions;
  r->operators = last_operators_;
  r->plans_cached = cache_.size();
  r->budget_violations = budget_violations_;
  r->failed_transfers = e.failed_transfers;
  r->retried_reads = e.retried_reads;
  r->lost_tensors = e.lost_tensors;
  r->recomputes = e.recomputes;
  r->urgent_recomputes = e.urgent_recomputes;
  r->recompute_us = e.recompute_us;
  r->last_error = last_error_;
}

}  // namespace teraio::offload
