// The controller: the policy of a Session, without PyTorch. It decides, step by step, whether the
// iteration is profiled, run by a plan or run reactively (Note [Controller modes]); detects drift
// from the plan's operator signatures; keeps a plan per iteration shape (the plan cache); turns a
// recorded iteration into a trace, a plan and a schedule for the engine; derives every budget
// number from one BudgetPolicy (Note [Budget policy] in src/runtime/budget.h); and gathers the
// step's errors and failed transfers. The binding layer (src/torch) calls it at step and operator
// boundaries with logical ids.
//
// Thread-safety: not thread-safe; the caller serialises every call (the Session's lock), except
// in_step(), fast(), try_fast() and next_operator(), which are lock-free for the operator hooks.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "budget.h"
#include "engine.h"
#include "recorder.h"
#include "teraio/units.h"
#include "teraio/planner.h"
#include "teraio/session.h"

namespace teraio::offload {

enum class Mode { kProfiling, kPlanned, kReactive };
const char* mode_name(Mode mode);

// For an operator that touches a whole parameter group at once (foreach or fused optimizers): what
// to do instead, as the end of a budget message ("" for other operators).
std::string group_hint(std::string_view op_name);

struct ControllerOptions {
  uint64_t budget_bytes = 0;     // the Session's budget (> 0)
  int profiling_iterations = 2;  // profiled steps before planning; the last is traced
  bool planning = true;          // false: never plan (reported as reactive)
  bool plan_search = true;       // plan_best instead of make_plan
  uint64_t min_tensor_bytes = 4096;
  std::string trace_path;       // when set, each profiled trace is written there
  std::string plan_path;        // when set, each plan made is written there
  std::vector<TierSpec> tiers;  // the planner's tiers, engine tier order
  // The planner may recompute recomputable tensors instead of moving them (PlannerOptions); the
  // binding then gives the engine a Recipe for each output captures() names.
  bool recompute = true;
  // Plans may take dead tensors away for free; the engine then discards them (Note [Dead tensors]).
  bool discard_dead = true;
  // Plans may copy a tensor to its tier after its last write (PlannerOptions::writebacks; off by
  // default here). The PyTorch Session turns it on unless TERAIO_WRITEBACKS=0 (docs/pytorch.md).
  bool writebacks = false;
  // Plans may recompute chains of any depth (PlannerOptions::deep_recompute; off by default). The
  // PyTorch Session turns it on unless TERAIO_DEEP_RECOMPUTE=0 (docs/pytorch.md).
  bool deep_recompute = false;
  // PlannerOptions::recompute_across_peak (on; the Session clears it with
  // TERAIO_RECOMPUTE_ACROSS_PEAK=0).
  bool recompute_across_peak = true;
  // Plans made again (for the host, for the link in use) are searched on a thread of their own
  // while the steps go on, and put on trial at the end of the first step after the search ends
  // (Note [Searches in the background]); off, inside the step that asks for them, as the tests
  // want them (deterministic). The PyTorch Session turns it on unless TERAIO_BACKGROUND_SEARCH=0.
  bool background_search = false;
  // Bytes a direction of a tier must have moved in timed copies before its figure is compared
  // with their rate (Note [Plans for the link in use]); tests give less.
  uint64_t link_min_bytes = 256ull << 20;
  // The host clock a step's wall time is read from, in microseconds (steady_us() when empty):
  // tests give a fake one (Note [Plans for the host that runs them]).
  std::function<double()> clock_us;
};

// What the controller asks of the binding layer besides the tensors' state.
class StepBinding : public TensorSource {
 public:
  // Operators need only their inputs observed (a planned step with an empty plan and no drift:
  // only signatures are checked) or everything (lean = false). Called on every change.
  virtual void use_lean_hooks(bool lean) { (void)lean; }
  // Host time spent so far in the binding's operator callbacks (stalls included), cumulative: the
  // runner's own cost per operator in planned steps (Note [The runner's host time] in
  // controller.cpp). 0: not measured.
  virtual double runner_host_us() const { return 0; }
  // Note [Steps timed on the device] (controller.cpp): marks where this step's work ends on the
  // device (an event on the stream its operators ran on), labelled `label` (0: a step not to be
  // timed), and appends to *periods, oldest first and each once, {label, microseconds} for every
  // pair of consecutive marks with one nonzero label whose later mark the device has passed: the
  // device's time from the end of one step to the end of the next. Never blocks. False when the
  // binding cannot time the device (CPU): the host clock's periods stand.
  virtual bool mark_step_end(uint64_t label, std::vector<std::pair<uint64_t, double>>* periods) {
    (void)label;
    (void)periods;
    return false;
  }
};

// An operator's shape as the binding sees it at its start (Note [Smaller shapes on a larger
// shape's plan] in controller.cpp): `form` hashes its name and each input tensor's rank and dtype,
// `dims` lists the input tensors' sizes in order.
struct OperatorShape {
  uint64_t form = 0;
  std::span<const int64_t> dims;
};

// The shapes of an iteration's operators, in order.
class OperatorShapes {
 public:
  size_t size() const { return forms_.size(); }
  void clear() {
    forms_.clear();
    at_.assign(1, 0);
    dims_.clear();
  }
  void add(const OperatorShape& s) {
    forms_.push_back(s.form);
    dims_.insert(dims_.end(), s.dims.begin(), s.dims.end());
    at_.push_back(static_cast<uint32_t>(dims_.size()));
  }
  // The first n of `other`'s (a plan's own, before a drift).
  void assign_first(const OperatorShapes& other, size_t n) {
    n = std::min(n, other.size());
    forms_.assign(other.forms_.begin(), other.forms_.begin() + n);
    at_.assign(other.at_.begin(), other.at_.begin() + n + 1);
    dims_.assign(other.dims_.begin(), other.dims_.begin() + at_.back());
  }
  // Operator k of these has the same form as `s` and no dimension smaller than s's.
  bool covers(size_t k, const OperatorShape& s) const {
    if (k >= forms_.size() || forms_[k] != s.form || at_[k + 1] - at_[k] != s.dims.size()) return false;
    for (size_t i = 0; i < s.dims.size(); ++i)
      if (s.dims[i] > dims_[at_[k] + i]) return false;
    return true;
  }
  // The sum of operator k's dims (how large it is: the smallest plan that covers is chosen).
  int64_t extent(size_t k) const {
    int64_t sum = 0;
    for (uint32_t i = at_[k]; i < at_[k + 1]; ++i) sum += dims_[i];
    return sum;
  }

 private:
  std::vector<uint64_t> forms_;
  std::vector<uint32_t> at_{0};
  std::vector<int64_t> dims_;
};

// The problems of a step, raised by raise_step_errors once the Session's lock is released.
struct StepErrors {
  std::string fault;           // the first failed transfer, with the count of the others (IoError)
  bool results_intact = true;  // only writes failed
  std::string error;           // otherwise: the first other error (Error)
};
// Throws teraio::IoError for a fault, else teraio::Error for an error; nothing when neither.
void raise_step_errors(const StepErrors& errors);

class Controller {
 public:
  Controller(runtime::Engine& engine, ControllerOptions options);
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  Recorder& recorder() { return recorder_; }
  const Recorder& recorder() const { return recorder_; }
  const runtime::BudgetPolicy& budget() const { return budget_; }
  // The planner's view of tier i (its bandwidth, measured after construction by the binding).
  TierSpec& tier(size_t i) { return options_.tiers.at(i); }
  const TierSpec& tier(size_t i) const { return options_.tiers.at(i); }
  // Which of tier i's figures were measured by the binding's probe (not given), and so may be
  // corrected from the rates its copies run at in planned steps (Note [Plans for the link in use]).
  void set_link_measured(size_t i, bool read, bool write, bool duplex);
  // Whether tier i's read / write figure is the rate in use now (corrected), not the probe's.
  bool read_from_use(size_t i) const { return i < link_.size() && link_[i].read_fixed; }
  bool write_from_use(size_t i) const { return i < link_.size() && link_[i].write_fixed; }
  // Plans made again for a link found faster or slower than planned.
  uint64_t link_replans() const { return link_replans_; }
  // The tensors live on a device whose memory is measured (CUDA): the planner keeps a margin.
  void set_device_margin(bool on) { budget_.device_margin = on; }

  Mode mode() const { return mode_; }
  // The mode stats() reports ("reactive" when planning is off).
  const char* reported_mode() const;
  uint64_t iteration() const { return iteration_; }  // completed steps
  bool in_step() const { return in_step_.load(std::memory_order_relaxed); }
  bool fast() const { return fast_.load(std::memory_order_relaxed); }
  uint32_t operators_started() const { return op_counter_.load(std::memory_order_relaxed); }
  // Operators are recorded while profiling and, after a drift, for the rest of the iteration.
  bool recording() const { return in_step() && (mode_ == Mode::kProfiling || iteration_reactive_); }
  // The step runs the installed plan (no drift so far).
  bool planned_now() const { return in_step() && mode_ == Mode::kPlanned && !iteration_reactive_; }
  size_t plans_cached() const { return cache_.size(); }
  // Plans made again for the planned steps' host times (Note [Plans for the host that runs them]).
  uint64_t host_replans() const { return host_replans_; }
  uint64_t host_replans_reverted() const { return host_replans_reverted_; }
  uint64_t host_replan_searches() const { return host_replan_searches_; }
  // Note [Searches in the background]: waits for a search in flight to end (its plan is put on
  // trial at the next step's end, if it still applies); tests use it to be deterministic.
  void wait_for_search();

  // --- steps --------------------------------------------------------------------------------
  // Begins a step: resets its errors, puts tensors within the budget and where the plan starts.
  // Throws teraio::Error (changing nothing) when a step is running.
  void begin_step(StepBinding& binding);
  // Ends it: checks drift, plans after profiling or for a new shape, installs a cached plan.
  // Returns the step's problems (raise them with raise_step_errors after unlocking). Throws
  // teraio::Error when no step is running.
  StepErrors end_step(StepBinding& binding);
  // The Session closes: no step runs from now on (a running one is dropped, its errors too).
  void abandon_step() {
    in_step_ = false;
    fast_.store(false, std::memory_order_relaxed);
  }

  // --- operators of a step ------------------------------------------------------------------
  // Lock-free, for fast() steps: the operator at the next index has the planned signature (it is
  // counted, true) or not (false; *k is its index: call drift_at under the lock).
  bool try_fast(uint64_t signature, uint32_t* k);
  // The fast path's operator k did not have the planned signature. `shape`: its form and input
  // dims (OperatorShape). Returns true when it runs within the plan all the same (Note [Smaller
  // shapes on a larger shape's plan]: counted, the fast path goes on), false when it drifted or
  // switched plans (the full path handles it).
  bool drift_at(uint32_t k, uint64_t signature, const OperatorShape& shape, StepBinding& binding);
  // The index of a new operator of the step.
  uint32_t next_operator() { return op_counter_.fetch_add(1, std::memory_order_relaxed); }
  // Operator k (name, signature) is about to run on `ids` (own_bytes: their bytes): checks the
  // plan's signature (drift), runs the schedule's start of k, makes the tensors usable, checks the
  // budget (a violation marks *violation, once per operator) and makes room for what k creates.
  // `collective`: its tensors are pinned for good.
  void begin_operator(uint32_t k, uint64_t signature, const OperatorShape& shape, const char* name,
                      std::span<const LogicalId> ids, uint64_t own_bytes, bool collective,
                      bool* violation, StepBinding& binding);
  // The outputs of operator k the installed schedule recomputes later, while a planned step runs
  // (the binding captures a Recipe for each when k ends: Note [Recompute in the engine]); null
  // when there are none.
  const std::vector<LogicalId>* captures(uint32_t k) const {
    if (!planned_now() || !active_ || k >= active_->schedule->operators.size()) return nullptr;
    const std::vector<LogicalId>& c = active_->schedule->operators[k].capture;
    return c.empty() ? nullptr : &c;
  }
  // The device's allocator peak during a recorded operator (CUDA): raises the untracked bytes to
  // what the peak shows beyond the tracked resident bytes.
  void note_device_peak(uint64_t peak_bytes);
  // Operator k has run: releases its tensors, marks its outputs used, runs the schedule's end of k,
  // and puts resident bytes back within the budget (the safety net in every mode).
  void end_operator(uint32_t k, const char* name, std::span<const LogicalId> ids,
                    std::span<const LogicalId> outputs, bool collective, bool* violation);

  // --- errors -------------------------------------------------------------------------------
  // An error caught during the step (raised by end_step as teraio::Error), or between steps.
  void note_error(const std::string& what);
  // Takes the engine's failed transfers: the step's faults in a step, else only last_error.
  void collect_faults() { collect_faults(in_step()); }
  void collect_faults(bool of_the_step);
  const std::string& last_error() const { return last_error_; }
  void set_last_error(std::string what) { last_error_ = std::move(what); }

  // Whether each plan also predicts the step of the same loop with the optimizer's updates in the
  // backward (SessionStats::predicted_step_in_backward_us; Note [Predicting steps in backward]).
  void set_predict_step_in_backward(bool on) { predict_in_backward_ = on; }

  // The controller's and the engine's fields of SessionStats (the binding adds tracked_tensors
  // and tiers).
  void fill_stats(const runtime::EngineStats& engine, SessionStats* stats) const;

 private:
  struct CachedPlan {
    std::shared_ptr<const runtime::Schedule> schedule;  // moves name logical ids
    std::vector<OperatorRecord> ops;  // the profiled operators (times final), spliced on drift
    // What the prediction replays (Note [The runner's host time]), and its replay without the
    // runner's host time.
    std::shared_ptr<const Trace> trace;
    std::shared_ptr<const Plan> plan;
    double predicted_us = 0;
    double recorded_host_us = 0;  // the trace's host times, summed (Note [Host times of planned steps])
    // Note [Plans for the host that runs them]: what planning again needs besides the trace and the
    // schedule's signatures (the recording's tensors, the planner's options), how often it was
    // tried, and the host scale and runner's host time per operator of the last try.
    std::vector<RecordedTensor> tensors;
    PlannerOptions planner_options;
    int host_replans_tried = 0;
    double tried_scale = 0, tried_runner_us = 0;
    // Note [A faster host after a lost trial]: the scale the last try planned for, whether its plan
    // lost its trial, and whether the probe that follows such a loss was made.
    double tried_at_scale = 0;
    bool lost_trial = false, probed_after_loss = false;
    // While a plan made again for the host is on trial: the plan it replaced, and that plan's
    // best measured step (Note [Plans for the host that runs them]).
    struct Replaced {
      std::shared_ptr<const runtime::Schedule> schedule;
      std::shared_ptr<const Plan> plan;
      double predicted_us = 0;
      std::string variant;
      double best_step_us = 0;  // its fastest planned step, the first left out
      std::string why;          // what the new plan was made for ("planned again for ...")
    };
    std::optional<Replaced> on_trial;
    uint64_t iteration_signature = 0;
    std::string variant;  // which of the planner's variants (SessionStats::plan_variant)
    OperatorShapes shapes;  // the profiled operators' (Note [Smaller shapes on a larger shape's plan])
    mutable uint64_t last_used = 0;  // the last step that ran it (Note [How many plans are kept])
  };
  void note_drift(uint32_t k, StepBinding& binding);
  bool switch_plan_at_start(uint32_t k, uint64_t signature, const OperatorShape& shape,
                            StepBinding& binding);
  // Whether the active plan's operator k covers this one (Note [Smaller shapes on a larger shape's
  // plan]); if so, the step is marked as run within a larger shape's plan.
  bool within_active(uint32_t k, const OperatorShape& shape);
  // Counts operator k of a fast() step as run within the plan (lock-free).
  void count_fast(uint32_t k, uint64_t signature);
  void note_shortfall(uint32_t k, const char* op, bool* noted);
  void make_and_install_plan(uint64_t iteration_signature, bool force, StepBinding& binding);
  Plan plan_for(const Trace& trace, const PlannerOptions& po, std::string* variant,
                double runner_us = 0) const;
  double steady_iteration_us(const Trace& trace, const Plan& plan, double runner_us = 0,
                             bool as_planned = true, double recompute_host_us = 0) const;
  bool note_runner_host_us();
  void note_link_in_use();
  // Note [Searches in the background]: a plan made again, as the search found it.
  struct Search {
    bool ok = false;  // false: the planner failed (the active plan stays)
    Plan plan;
    std::string variant;
    double active_us = 0, new_us = 0;  // the replays that decide (the scaled trace's)
    double predicted_us = 0;
  };
  Search search_again(const Trace& trace, const PlannerOptions& po, const Plan& active, double scale,
                      double runner_us) const;
  bool try_plan(CachedPlan& slot, Search found, const std::string& why);
  bool plan_again(CachedPlan& slot, double scale, const std::string& why, bool for_host);
  void finish_search();
  void predict_active();
  void install(const CachedPlan* p);
  void uninstall(Mode mode);

  runtime::Engine& engine_;
  ControllerOptions options_;
  runtime::BudgetPolicy budget_;
  // Note [Untracked bytes in the first step]: the untracked bytes the last operator measured, and
  // whether no iteration has been recorded yet. In the Session's first step the tensors that exist
  // already (the parameters) are tracked only from their first operator on, so until then the
  // measurement counts them as untracked too, and the running maximum (budget_.untracked_bytes)
  // keeps that for the rest of the step: an optimizer step or gradient norm over every parameter
  // would then seem to need the parameters twice. In that step the budget check and the engine's
  // target use the last measurement instead, which counts only what is untracked now. The maximum
  // is measured afresh in every later profiled step, and only those plan.
  uint64_t live_untracked_ = 0;
  bool first_recording_ = true;
  // The policy the checks of this moment use (see the Note above).
  runtime::BudgetPolicy check_policy() const {
    runtime::BudgetPolicy p = budget_;
    if (first_recording_) p.untracked_bytes = live_untracked_;
    return p;
  }
  Recorder recorder_;

  Mode mode_ = Mode::kProfiling;
  bool iteration_reactive_ = false;  // drift switched this iteration to reactive
  int profiled_ = 0;                 // profiled iterations since the last (re)start
  uint64_t iteration_ = 0;
  std::atomic<bool> in_step_{false};
  // Planned with an empty plan and no drift yet: operators only advance the index and check the
  // signature, without taking the lock (the hooks must cost < 1% of a step).
  std::atomic<bool> fast_{false};
  std::atomic<uint32_t> op_counter_{0};
  std::atomic<uint64_t> iter_sig_{0};  // running hash of this iteration's operator signatures
  std::unordered_map<uint64_t, CachedPlan> cache_;  // by iteration signature
  const CachedPlan* active_ = nullptr;
  // Iteration signatures whose plan could not be made: their steps run reactively, without planning
  // again (Note [A shape that cannot be planned]).
  std::unordered_set<uint64_t> unplannable_;

  uint64_t drift_events_ = 0;
  uint64_t plan_switches_ = 0;  // Note [A step that starts as another cached plan]
  // Note [Smaller shapes on a larger shape's plan]: the recording's operator shapes (parallel to
  // the recorder's signatures), whether this step ran an operator within a larger one's plan, and
  // how many steps did.
  OperatorShapes step_shapes_;
  bool step_within_ = false;
  uint64_t steps_on_larger_plans_ = 0;
  uint64_t budget_violations_ = 0;
  uint64_t plan_budget_bytes_ = 0;     // the budget the last plan was made for
  std::string plan_variant_;           // which of the planner's variants the active plan is
  double profiled_kernel_us_ = 0;  // the last trace's operator times, summed
  double predicted_iteration_us_ = 0;  // the last plan's steady-state step in the simulator
  double plan_predicted_us_ = 0;       // the same without the runner's host time
  // Note [The runner's host time]: the binding's callback time and the engine's stalls at the
  // step's start, the last planned steps' runner time per operator, and the one the prediction
  // used (0: none yet).
  double step_hook_us0_ = 0, step_stall_us0_ = 0;
  std::vector<double> runner_samples_;
  double runner_us_used_ = 0;
  // Note [The recomputes' host time] (simulator.cpp): the engine's recompute time at the step's
  // start, the last planned steps' recompute time (left out of the runner's), and the one the
  // prediction used (0: the trace's producers' host times).
  double step_recompute_us0_ = 0;
  std::vector<double> recompute_samples_;
  double recompute_us_used_ = 0;
  std::weak_ptr<const Plan> recompute_plan_;  // the plan whose recomputes those are
  // Note [Host times of planned steps]: the step's start on the host clock, the last planned
  // steps' host time outside the callbacks over the active trace's recorded host time, and the
  // scale of the recorded host times the prediction used (1: as recorded).
  double step_wall_us0_ = 0;
  std::vector<double> host_samples_;
  double host_scale_used_ = 1;
  bool note_host_scale();
  // Note [Plans for the host that runs them]: the wall times of the planned steps since the
  // active plan was installed, each from the end of the step before (Note [Steps timed end to
  // end]), the plan made again and its trial.
  std::vector<double> step_us_;
  double last_step_end_us_ = 0;
  // Note [Steps timed on the device]: installs so far (a schedule's steps are labelled with it),
  // and whether step_us_ holds the device's periods (else the host clock's).
  uint64_t schedule_epoch_ = 0;
  bool steps_on_device_ = false;
  // stats()["measured_step_us"]: the median of the active schedule's last periods (recent_steps_).
  std::vector<double> recent_steps_;
  double measured_step_us_ = 0;
  size_t periods_since_install_ = 0;
  void add_step_sample(double us);
  bool collecting_steps() const;
  CachedPlan* active_slot();
  void replan_for_host();
  void judge_host_replan();
  double now_us() const { return options_.clock_us ? options_.clock_us() : steady_us(); }
  uint64_t host_replans_ = 0;           // plans made again for the host and put on trial
  // Note [Plans for the link in use]: per tier, which figures the probe measured, whether they were
  // corrected, and the tier's copy times at the first planned step counted (or the last correction).
  struct LinkState {
    bool read_measured = false, write_measured = false, duplex_measured = false;
    bool read_fixed = false, write_fixed = false;
    bool base_set = false;
    int steps = 0;  // planned steps counted since `base`
    storage::TransferTimes base;
  };
  std::vector<LinkState> link_;
  uint64_t link_replans_ = 0;
  uint64_t host_replans_reverted_ = 0;  // of those, measured slower than the plan they replaced
  uint64_t host_replan_searches_ = 0;   // searches made for the host (found a plan or not)
  // Note [Predicting steps in backward] in controller.cpp: whether to predict, and the prediction.
  bool predict_in_backward_ = false;
  double predicted_in_backward_us_ = 0;
  static constexpr int kFirstIterations = 2;   // Note [Steady-state prediction]
  static constexpr int kSteadyIterations = 8;
  uint64_t last_operators_ = 0;

  std::string last_error_;
  std::string pending_error_;      // the first error of this step (raised by end_step as Error)
  std::string pending_fault_;      // the first failed transfer of this step (raised as IoError)
  uint64_t step_faults_ = 0;       // failed transfers this step
  uint64_t step_read_faults_ = 0;  // of which reads (or lost bytes): results may be partial
  // The largest operator of this step whose own tensors exceed the budget, and what to say of it.
  uint64_t step_need_bytes_ = 0;
  std::string step_need_error_, step_need_hint_;

  // Note [Searches in the background]: the search in flight, for the plan `plan` of the shape
  // `signature`. Last of the members: destroyed first, its future waits for the search, which
  // reads this controller's options, to end.
  struct PendingSearch {
    uint64_t signature = 0;
    std::shared_ptr<const Plan> plan;
    std::string why;
    bool for_host = false;  // counted in host_replans_ when put on trial
    std::future<Search> result;
  };
  std::optional<PendingSearch> pending_search_;
};

// Mixes v into the running hash h (operator and iteration signatures).
inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

}  // namespace teraio::offload
