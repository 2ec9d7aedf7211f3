// teraio::Session: transparent tensor offloading inside stock PyTorch (docs/pytorch.md). It sees
// every operator of a training step through an at::RecordFunction global callback, profiles the
// first iterations into a trace (format teraio.trace v1), plans moves with make_plan and executes
// them at operator indices; between, and on drift, it runs reactively (only what the running
// operator needs is kept when the budget is exceeded). One Session may be active per process.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "teraio/storage.h"

namespace at {
class Tensor;
}

namespace teraio {

struct SessionTier {
  enum class Kind { kHost, kFile };
  Kind kind = Kind::kHost;
  uint64_t capacity_bytes = 0;     // required
  std::vector<std::string> paths;  // kFile: one directory per SSD, each must be writable
  // GB/s (1e9 bytes/s) the planner assumes for reads (tier -> device, prefetch) and writes
  // (device -> tier, offload). 0: measured by the Session with a short probe of the tier, once, at
  // the first operator of the first step (docs/pytorch.md, "Tier bandwidth"); > 0: given, not
  // measured (an override).
  double read_gbps = 0;
  double write_gbps = 0;
  // GB/s per direction while reads and writes move at once (TierSpec::duplex_gbps). 0: measured by
  // the probe when it runs, else kDefaultDuplexFraction (include/teraio/plan.h) of the slower of
  // read_gbps and write_gbps; > 0: given.
  double duplex_gbps = 0;
};

struct SessionOptions {
  uint64_t budget_bytes = 0;       // resident bytes of tracked tensors allowed; required
  std::vector<SessionTier> tiers;  // at least one, in order of preference for evictions
  int profiling_iterations = 2;    // profiled (reactive) steps before planning; the last is traced
  uint64_t min_tensor_bytes = 4096;  // smaller storages are not tracked
  bool planning = true;              // false: stay in reactive mode
  std::string trace_path;            // when set, each profiled trace is written there
  std::string plan_path;             // when set, each plan made is written there
  // Plan with several settings of the planner's heuristics, simulate each and keep the fastest
  // (plan_best, include/teraio/sweep.h); false: make_plan's plan alone.
  bool plan_search = true;
  // CUDA: an offload due before the next operator is waited for on the GPU (the compute stream waits
  // for the device-to-host copy, the memory is freed in stream order) instead of on the CPU, so the
  // CPU keeps running ahead of the GPU. Host tier only (file-tier writes are still waited for on
  // the CPU). On by default since it measured faster on the H200 and stayed bitwise
  // (docs/pytorch.md "Stream-ordered offloads"); false restores the CPU wait.
  bool stream_ordered_offloads = true;
  // File tiers checksum every piece they write (XXH3) and verify it when it is read back: damaged or
  // truncated bytes raise teraio::IoError instead of reaching the model. Costs a few percent of a
  // core at SSD speed (docs/benchmarks.md, "Integrity"); false turns it off.
  bool verify = true;
  // Wraps every tier in a fault injector (storage::FaultTier) so that inject_fault() can make
  // transfers fail: for tests and for rehearsing recovery. Off: no wrapper.
  bool fault_injection = false;
  // The planner may free an activation after its last forward use and make it again before its
  // next use by rerunning the operator that produced it (same kernel, same inputs: the same bytes),
  // where that costs less time than moving it (docs/pytorch.md, "Recompute"). false: plans move
  // bytes only.
  bool recompute = true;
  // A tensor read back from a tier and not written in place since is offloaded again to that tier
  // without writing it: its copy there is kept (docs/pytorch.md, "Clean offloads"). Writes are seen
  // through the version counters of every operator's inputs; false writes every offload (for
  // tensors written behind the dispatcher, e.g. through a NumPy view of a CPU tensor).
  bool clean_offloads = true;
  // A transient tensor that the profiled steps never use again before they free it (a gradient
  // between the optimizer's read and zero_grad), and that the plan takes away, is freed without
  // writing it (docs/pytorch.md, "Dead tensors"): no bytes cross the link for it. If a later step
  // uses it after all (gradients read after optimizer.step() every N steps), that use raises
  // teraio's error naming the tensor. false: such tensors are written out like any other.
  bool discard_dead = true;
};

// The bandwidth the planner uses for one tier and where it comes from.
struct SessionTierStats {
  std::string name;    // "host" or "file", as in the plan's tiers
  std::string engine;  // the tier's I/O engine: "memcpy", "io_uring", "threads", "threads+cufile"
  double read_gbps = 0;   // tier -> device (prefetch), GB/s, as given to the planner
  double write_gbps = 0;  // device -> tier (offload)
  // "given" (SessionTier::read_gbps/write_gbps > 0), "measured" (the probe's median), or "default"
  // (not measured yet: before the first operator of the first step, or the probe failed; the
  // value is then 20 for a host tier and 1.5 for a file tier).
  std::string read_source = "default";
  std::string write_source = "default";
  // Per direction while both move (TierSpec::duplex_gbps): "given", "measured" (the probe's
  // both-ways median) or "default" (kDefaultDuplexFraction of the slower one-way figure).
  double duplex_gbps = 0;
  std::string duplex_source = "default";
  // The probe, when one ran: min and max over its passes, its wall time and the scratch memory
  // it moved bytes from and to ("device", "host").
  double read_gbps_min = 0, read_gbps_max = 0;
  double write_gbps_min = 0, write_gbps_max = 0;
  double probe_s = 0;
  std::string probe_memory;
  // The tier's fallback notes (TierInfo::notes: unpinned arena, O_DIRECT refused, io_uring
  // unavailable, ...) and the probe's (page-cache numbers, time limit reached, failure).
  std::vector<std::string> notes;
  // Since the Session began (counters, like SessionStats' own): host time waited for this tier's
  // reads and for its writes (room waits included), and the bytes its completed transfers moved.
  // Over the tiers they add up to stall_us, bytes_prefetched and bytes_offloaded.
  double stall_read_us = 0;
  double stall_write_us = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_clean = 0;  // offloaded without writing: the tier's copy was still valid
  // The rates the tier's copies of at least 1 MiB ran at since the Session began, GB/s (0: none
  // timed; file tiers do not time theirs): what the link did, beside what the plan assumed
  // (read_gbps, write_gbps). Note [The link's rate in use] in src/storage/host_tier.cpp.
  double read_gbps_in_use = 0;
  double write_gbps_in_use = 0;
};

struct SessionStats {
  std::string mode;        // "profiling", "planned" or "reactive"
  uint64_t iteration = 0;  // completed steps
  uint64_t budget_bytes = 0;
  uint64_t peak_resident_bytes = 0;  // tracked bytes resident, the most since the Session began
  uint64_t step_peak_resident_bytes = 0;  // the same during the last step
  uint64_t resident_bytes = 0;
  uint64_t pinned_bytes = 0;  // tracked bytes never offloaded: given to a collective (DDP buckets)
  uint64_t untracked_bytes = 0;    // CUDA: device memory used besides tracked tensors (measured)
  uint64_t plan_budget_bytes = 0;  // budget given to the planner: budget - untracked - margin
  std::string plan_variant;        // the planner variant the search kept ("default", ...)
  // The simulator's replay of the last plan: a step of a long run (the mean of simulated
  // iterations 2 to 7; the plan file's `predicted` is the 2-iteration mean of `teraio simulate`).
  // 0 before a plan.
  double predicted_iteration_us = 0;
  // The plan in use, measured: the median of its last five planned steps, each from the end of the
  // step before to its own end; on CUDA the GPU's time between marks at the steps' ends, read a
  // step or two late (Note [Steps timed on the device] in src/offload/controller.cpp), elsewhere
  // the host clock's, the plan's first step left out. 0 before, and after a plan change until
  // measured again. Compare with predicted_iteration_us.
  double measured_step_us = 0;
  // Note [The runner's host time] (src/offload/controller.cpp): the Session's own callback host
  // time per operator in planned steps (the median of the last five, stalls excluded), which
  // predicted_iteration_us includes once measured (0 before), and the plan's replay without it.
  double runner_host_us_per_operator = 0;
  double plan_predicted_us = 0;
  // Note [The recomputes' host time] (src/sim/simulator.cpp): the host time the active plan's
  // recomputes took per planned step (the median of its last five; 0 before one, or without
  // recomputes), left out of runner_host_us_per_operator; predicted_iteration_us uses it in place
  // of the recorded producers' host times.
  double recompute_host_us_per_step = 0;
  // Note [Host times of planned steps] (src/offload/controller.cpp): the planned steps' host time
  // outside the callbacks over the recording's (the median of the last five; 1 until measured,
  // and never above 1), and Note [Plans for the host that runs them]: plans made again for the
  // host and tried, and of those, the ones whose steps measured slower (the plan before came back);
  // the searches made for it (host_replans counts those that found a plan 2% faster).
  double host_time_scale = 1;
  uint64_t host_replans = 0;
  uint64_t host_replans_reverted = 0;
  uint64_t host_replan_searches = 0;
  // Corrections of tier figures the probe measured (or defaulted) to the rates the tiers' copies ran
  // at, each followed by the trace planned again on trial (docs/pytorch.md, "Tier bandwidth").
  uint64_t link_replans = 0;
  // The same for the same loop with each optimizer update run in the backward
  // (Session::set_predict_step_in_backward; docs/pytorch.md, "Optimizer steps in backward"): the
  // profile rewritten as that loop records it, planned and replayed alike. 0 when not asked for,
  // before a plan, or when the profile cannot be rewritten.
  double predicted_step_in_backward_us = 0;
  // How the last profile's operators were timed: "CUPTI" (the GPU time of each operator's kernels,
  // copies and memsets), "CUDA events (why not CUPTI)", or "host clock" (CPU). Their sum is
  // profiled_kernel_us; profiled_event_us is the same operators timed with CUDA events, which also
  // count the launch gaps when the CPU falls behind (Note [Kernel times from CUPTI]).
  std::string kernel_timing;
  double profiled_kernel_us = 0;
  double profiled_event_us = 0;
  // The last profile's operators in which the caching allocator waited for the device (a retried
  // cudaMalloc, a cudaFree): their host time is the time before them, as for a scalar read back.
  uint64_t profiled_allocator_waits = 0;
  uint64_t bytes_offloaded = 0;
  uint64_t bytes_prefetched = 0;
  double stall_us = 0;             // host time the engine waited for transfers, in three parts:
  double stall_read_us = 0;        // reads (prefetches not yet arrived or not yet enqueued)
  double stall_write_us = 0;       // writes at their planned deadline
  double stall_room_us = 0;        // writes completed or evictions made to stay within the budget
  // parts of stall_write_us (the rest: tensors forgotten or used again while their write ran)
  double stall_write_due_us = 0;       // offloads waited for at their deadline
  double stall_write_readback_us = 0;  // writes a read back followed, waited for before their bytes were relied on
  double stall_writeback_us = 0;       // writeback copies waited for
  // part of stall_read_us (the rest: a read's tier space wanted back, a tensor forgotten while its
  // read ran)
  double stall_read_use_us = 0;  // reads an operator about to use the tensor waited for
  double hook_us = 0;  // host time inside teraio's operator callbacks in steps (stalls included)
  // Parts of hook_us: the time inside the controller's per-operator calls (the plan's moves issued,
  // waits, recomputes, budget checks; the rest of hook_us is the binding's own: tensors looked up,
  // writes watched, recipes captured), and within that, inside the tiers' submit calls (on CUDA
  // the calls that queue each copy and its events).
  double controller_us = 0;
  double submit_us = 0;
  uint64_t plan_moves = 0;
  uint64_t skipped_moves = 0;
  uint64_t full_sweeps = 0;  // scans of every tracked tensor for dead ones (host time each)
  // tracked storages whose bytes were away from the device (offloaded, or freed for a recompute)
  // when their owner resized them behind the dispatcher (FSDP2's resize_(0)): Note [Storages
  // their owner resizes]
  uint64_t owner_resizes = 0;
  uint64_t aligned_moves = 0;  // moves made at step start to put tensors where the plan begins
  uint64_t stream_ordered_offloads = 0;  // offloads completed on the GPU's side (option of that name)
  uint64_t reads_after_writes = 0;  // reads back ordered after their write still running, by the tier
  uint64_t clean_offloads = 0;  // offloads that wrote nothing: the tier's copy was still valid
  uint64_t clean_bytes = 0;     // their bytes (not in bytes_offloaded)
  uint64_t discards = 0;        // dead tensors freed without a write (option discard_dead)
  uint64_t discarded_bytes = 0; // their bytes (not in bytes_offloaded)
  uint64_t writebacks = 0;       // writeback copies started (TERAIO_WRITEBACKS; docs/pytorch.md)
  uint64_t writeback_bytes = 0;  // their bytes
  uint64_t stale_writebacks = 0; // copies discarded: written during the copy, or the copy failed
  uint64_t writebacks_taken_over = 0;  // offloads that took over their writeback's running copy
  uint64_t drift_events = 0;
  uint64_t plan_switches = 0;  // steps whose first operator started another cached plan
  uint64_t steps_on_larger_plans = 0;  // steps of a shape without a plan run on a larger shape's
  uint64_t urgent_fetches = 0;
  uint64_t evictions = 0;
  uint64_t operators = 0;        // operators of the last step
  uint64_t tracked_tensors = 0;  // logical tensors known
  uint64_t plans_cached = 0;
  uint64_t budget_violations = 0;  // operators at which the budget could not be met (own tensors
                                   // larger than it, or no tier room left for the others)
  uint64_t failed_transfers = 0;   // offloads and reads that failed (each raised from its step)
  uint64_t retried_reads = 0;      // reads tried again after a passing failure (they then succeeded
                                   // or count in failed_transfers)
  uint64_t lost_tensors = 0;       // tensors whose bytes could not be brought back (docs: "Faults")
  uint64_t recomputes = 0;         // tensors freed and made again by rerunning their producer
  uint64_t urgent_recomputes = 0;  // of which at a use the plan did not expect (drift)
  double recompute_us = 0;         // host time spent rerunning producers (CUDA: launching them)
  std::string last_error;          // the last error caught inside a callback ("" if none)
  std::vector<SessionTierStats> tiers;  // per tier, in SessionOptions::tiers order
};

// Note [Options and stats fields]: SessionOptions, SessionStats and SessionTierStats are declared
// once, here, and every reader goes through these lists in declaration order: the Python binding
// (keyword arguments, stats() and the names exported as teraio.SESSION_OPTIONS / STATS_FIELDS /
// STATS_COUNTERS / TIER_STATS_FIELDS), `teraio train`'s report and the bench scripts (which record
// teraio.STATS_FIELDS and the deltas of teraio.STATS_COUNTERS). tests/offload/fields_test.cpp fails
// when a struct gains a field the list lacks, tests/python/test_api.py when the Python side
// disagrees. f is called as f(name, member pointer) (options, tier stats) or f(name, member
// pointer, kind) (stats); `tiers` (a list of structs) is visited like the others.
template <class F>
constexpr void for_each_option_field(F&& f) {
  f("budget_bytes", &SessionOptions::budget_bytes);
  f("tiers", &SessionOptions::tiers);
  f("profiling_iterations", &SessionOptions::profiling_iterations);
  f("min_tensor_bytes", &SessionOptions::min_tensor_bytes);
  f("planning", &SessionOptions::planning);
  f("trace_path", &SessionOptions::trace_path);
  f("plan_path", &SessionOptions::plan_path);
  f("plan_search", &SessionOptions::plan_search);
  f("stream_ordered_offloads", &SessionOptions::stream_ordered_offloads);
  f("verify", &SessionOptions::verify);
  f("fault_injection", &SessionOptions::fault_injection);
  f("recompute", &SessionOptions::recompute);
  f("clean_offloads", &SessionOptions::clean_offloads);
  f("discard_dead", &SessionOptions::discard_dead);
}

// kCounter: cumulative since the Session began (a delta over steps is what those steps did);
// kGauge: a value now or the most so far; kText: a name or message.
enum class StatKind { kText, kGauge, kCounter };

template <class F>
constexpr void for_each_stats_field(F&& f) {
  using S = SessionStats;
  using K = StatKind;
  f("mode", &S::mode, K::kText);
  f("iteration", &S::iteration, K::kGauge);
  f("budget_bytes", &S::budget_bytes, K::kGauge);
  f("peak_resident_bytes", &S::peak_resident_bytes, K::kGauge);
  f("step_peak_resident_bytes", &S::step_peak_resident_bytes, K::kGauge);
  f("resident_bytes", &S::resident_bytes, K::kGauge);
  f("pinned_bytes", &S::pinned_bytes, K::kGauge);
  f("untracked_bytes", &S::untracked_bytes, K::kGauge);
  f("plan_budget_bytes", &S::plan_budget_bytes, K::kGauge);
  f("plan_variant", &S::plan_variant, K::kText);
  f("predicted_iteration_us", &S::predicted_iteration_us, K::kGauge);
  f("measured_step_us", &S::measured_step_us, K::kGauge);
  f("plan_predicted_us", &S::plan_predicted_us, K::kGauge);
  f("runner_host_us_per_operator", &S::runner_host_us_per_operator, K::kGauge);
  f("recompute_host_us_per_step", &S::recompute_host_us_per_step, K::kGauge);
  f("host_time_scale", &S::host_time_scale, K::kGauge);
  f("host_replans", &S::host_replans, K::kCounter);
  f("host_replans_reverted", &S::host_replans_reverted, K::kCounter);
  f("host_replan_searches", &S::host_replan_searches, K::kCounter);
  f("link_replans", &S::link_replans, K::kCounter);
  f("predicted_step_in_backward_us", &S::predicted_step_in_backward_us, K::kGauge);
  f("kernel_timing", &S::kernel_timing, K::kText);
  f("profiled_kernel_us", &S::profiled_kernel_us, K::kGauge);
  f("profiled_event_us", &S::profiled_event_us, K::kGauge);
  f("profiled_allocator_waits", &S::profiled_allocator_waits, K::kGauge);
  f("bytes_offloaded", &S::bytes_offloaded, K::kCounter);
  f("bytes_prefetched", &S::bytes_prefetched, K::kCounter);
  f("stall_us", &S::stall_us, K::kCounter);
  f("stall_read_us", &S::stall_read_us, K::kCounter);
  f("stall_write_us", &S::stall_write_us, K::kCounter);
  f("stall_room_us", &S::stall_room_us, K::kCounter);
  f("stall_read_use_us", &S::stall_read_use_us, K::kCounter);
  f("stall_write_due_us", &S::stall_write_due_us, K::kCounter);
  f("stall_write_readback_us", &S::stall_write_readback_us, K::kCounter);
  f("stall_writeback_us", &S::stall_writeback_us, K::kCounter);
  f("hook_us", &S::hook_us, K::kCounter);
  f("controller_us", &S::controller_us, K::kCounter);
  f("submit_us", &S::submit_us, K::kCounter);
  f("plan_moves", &S::plan_moves, K::kCounter);
  f("skipped_moves", &S::skipped_moves, K::kCounter);
  f("full_sweeps", &S::full_sweeps, K::kCounter);
  f("owner_resizes", &S::owner_resizes, K::kCounter);
  f("aligned_moves", &S::aligned_moves, K::kCounter);
  f("stream_ordered_offloads", &S::stream_ordered_offloads, K::kCounter);
  f("reads_after_writes", &S::reads_after_writes, K::kCounter);
  f("clean_offloads", &S::clean_offloads, K::kCounter);
  f("clean_bytes", &S::clean_bytes, K::kCounter);
  f("discards", &S::discards, K::kCounter);
  f("discarded_bytes", &S::discarded_bytes, K::kCounter);
  f("writebacks", &S::writebacks, K::kCounter);
  f("writeback_bytes", &S::writeback_bytes, K::kCounter);
  f("stale_writebacks", &S::stale_writebacks, K::kCounter);
  f("writebacks_taken_over", &S::writebacks_taken_over, K::kCounter);
  f("drift_events", &S::drift_events, K::kCounter);
  f("plan_switches", &S::plan_switches, K::kCounter);
  f("steps_on_larger_plans", &S::steps_on_larger_plans, K::kCounter);
  f("urgent_fetches", &S::urgent_fetches, K::kCounter);
  f("evictions", &S::evictions, K::kCounter);
  f("operators", &S::operators, K::kGauge);
  f("tracked_tensors", &S::tracked_tensors, K::kGauge);
  f("plans_cached", &S::plans_cached, K::kGauge);
  f("budget_violations", &S::budget_violations, K::kCounter);
  f("failed_transfers", &S::failed_transfers, K::kCounter);
  f("retried_reads", &S::retried_reads, K::kCounter);
  f("lost_tensors", &S::lost_tensors, K::kCounter);
  f("recomputes", &S::recomputes, K::kCounter);
  f("urgent_recomputes", &S::urgent_recomputes, K::kCounter);
  f("recompute_us", &S::recompute_us, K::kCounter);
  f("last_error", &S::last_error, K::kText);
  f("tiers", &S::tiers, K::kText);
}

template <class F>
constexpr void for_each_tier_stats_field(F&& f) {
  using T = SessionTierStats;
  f("name", &T::name);
  f("engine", &T::engine);
  f("read_gbps", &T::read_gbps);
  f("write_gbps", &T::write_gbps);
  f("read_source", &T::read_source);
  f("write_source", &T::write_source);
  f("duplex_gbps", &T::duplex_gbps);
  f("duplex_source", &T::duplex_source);
  f("read_gbps_min", &T::read_gbps_min);
  f("read_gbps_max", &T::read_gbps_max);
  f("write_gbps_min", &T::write_gbps_min);
  f("write_gbps_max", &T::write_gbps_max);
  f("probe_s", &T::probe_s);
  f("probe_memory", &T::probe_memory);
  f("notes", &T::notes);
  f("stall_read_us", &T::stall_read_us);
  f("stall_write_us", &T::stall_write_us);
  f("bytes_read", &T::bytes_read);
  f("bytes_written", &T::bytes_written);
  f("bytes_clean", &T::bytes_clean);
  f("read_gbps_in_use", &T::read_gbps_in_use);
  f("write_gbps_in_use", &T::write_gbps_in_use);
}

class Session {
 public:
  // Validates the options (tiers, paths writable, budget) and creates the tiers; throws
  // teraio::Error naming the bad argument before anything is moved.
  explicit Session(SessionOptions options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // A training step: construct before the forward pass, destroy after optimizer.step(). When the
  // step's body throws, the destructor ends the step without throwing (the body's exception goes
  // on); otherwise it throws what end_step() throws.
  class StepGuard {
   public:
    explicit StepGuard(Session& s) : s_(&s), exceptions_(std::uncaught_exceptions()) {
      s_->begin_step();
    }
    StepGuard(StepGuard&& o) noexcept : s_(o.s_), exceptions_(o.exceptions_) { o.s_ = nullptr; }
    ~StepGuard() noexcept(false) {
      if (!s_) return;
      if (std::uncaught_exceptions() > exceptions_) {
        try {
          s_->end_step();
        } catch (...) {
        }
        return;
      }
      s_->end_step();
    }

   private:
    Session* s_;
    int exceptions_;
  };
  StepGuard step() { return StepGuard(*this); }
  // Begins a step. Throws teraio::Error (and begins nothing) when a step is already running or the
  // Session is closed.
  void begin_step();
  // Ends the step: builds the trace and plan after profiling, checks drift, restores transient
  // tensors that are still alive. Throws teraio::IoError for a transfer that failed during the step
  // (docs/pytorch.md, "Faults"), else teraio::Error for other errors caught during the step (a
  // budget that could not be met). The Session stays usable either way: the next step runs.
  void end_step();

  // Brings every offloaded tensor back (before saving a checkpoint or reading raw data). Throws
  // teraio::IoError naming the tensors that could not come back; the others did.
  void fetch_all();
  // Brings everything back, removes the hooks and the tier files. Always completes; then throws
  // teraio::IoError if some tensor could not be brought back (it is lost: every access to it fails
  // with that message). Idempotent; the destructor calls it (and swallows the error).
  void close();
  // With SessionOptions::fault_injection: makes transfers of tier `tier` (index in options.tiers)
  // fail as `rule` says, from now on; clear_faults() removes every rule.
  void inject_fault(size_t tier, const storage::FaultRule& rule);
  void clear_faults();
  // Whether the next plans also predict the step with each optimizer update in the backward
  // (SessionStats::predicted_step_in_backward_us). The Python Session asks for it when it watches
  // a per-parameter torch.optim optimizer whose steps do not already run in backward.
  void set_predict_step_in_backward(bool on);
  // Names a tensor (parameter name, "<param>.<state key>") and its kind for the trace.
  void name_tensor(const at::Tensor& t, const std::string& name, const std::string& kind);
  // Changes whenever the Session starts tracking a tensor it has no name for (a new one, or one
  // whose storage became another tensor's): naming the watched tensors again only matters then.
  uint64_t names_generation() const;
  // Tracks tensors that exist before the step's operators use them (a watched model's parameters,
  // in the first step) from now on, so that a budget smaller than they are can move them out
  // before their first use; call inside a step. Tensors on another device, smaller than
  // min_tensor_bytes or tracked already are left as they are (Note [Adopted tensors]).
  void adopt(const std::vector<at::Tensor>& tensors);
  // Called before the owner of a storage resizes it behind the dispatcher
  // (untyped_storage().resize_(n), as FSDP2 frees and re-allocates its unsharded parameters): a
  // tracked storage is handed over to its owner now. Resized to 0, teraio's copy is dropped (not
  // brought back); to another size, absent bytes are brought back first so that the resize keeps
  // them; a writeback copy still reading the bytes is waited for (Note [Storages their owner
  // resizes]). `storage` is the c10::StorageImpl's address; one teraio does not track is left
  // alone.
  void storage_resizing(uintptr_t storage, uint64_t new_bytes);

  SessionStats stats() const;
  const SessionOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace teraio
