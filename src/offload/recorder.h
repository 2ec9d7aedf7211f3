// The recorder: what the Session learns of one training iteration, turned into a Trace (format
// teraio.trace v2: with each tensor's producer and whether rerunning it recreates the tensor). The
// binding layer (src/torch) reports tensors by logical id and operators as they run; the recorder
// keeps each tensor's facts (bytes, where it first appeared, how the passes produced and used it,
// the last operator it was alive for), guesses its kind, and builds the trace that the planner
// plans. It knows nothing of PyTorch. Not thread-safe: the caller serialises every call (the
// Session's lock).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine.h"
#include "teraio/trace.h"

namespace teraio::offload {

using runtime::LogicalId;

// Where a logical tensor first appears in an iteration: operator ordinal, slot, input or output.
// Logical ids repeat every iteration because the same key names the same tensor.
inline uint64_t make_key(uint32_t k, uint32_t slot, bool out) {
  return (uint64_t(k) << 32) | (uint64_t(slot) << 1) | (out ? 1 : 0);
}

// Collective communication operators (torch.distributed through the dispatcher: c10d::allreduce_,
// c10d::broadcast_, c10d::_allgather_base_, ..., and the functional collectives). They are
// asynchronous: the operator returns while gloo's worker thread or NCCL's stream still reads and
// writes the tensors, until the Work completes (DDP waits for it at the end of backward), so the
// tensors they are given are pinned for the rest of the Session (the binding pins them;
// build_trace lists them where they are pinned).
bool is_collective(const char* op_name);

// Whether an operator, by its name alone, may be rerun to recreate its outputs bitwise: a
// dispatcher operator ("aten::...") that draws no random numbers, leaves no byte uninitialised and
// is not on the deny-list of nondeterministic kernels (Note [Rerunnable operators] in
// recorder.cpp).
bool rerunnable_operator(std::string_view op_name);

// How a recorded operator made one of its outputs (given with Recorder::note_produced).
struct ProductionFacts {
  // The output's storage existed before the operator: a view, an in-place operator's result, an
  // input returned as is. The tensor is not produced here (it has its producer already, or none).
  bool aliases_input = false;
  // Made by an operator nested in the top-level one and not among the latter's outputs (an
  // internal saved for backward): rerunning the top-level operator would not hand it back; only
  // rerunning the nested one can (note_nested).
  bool nested_only = false;
  // The operator wrote in place into one of its inputs (a version counter moved across it, e.g.
  // batch norm's running statistics): rerunning it would write them again.
  bool mutates_input = false;
  // An input the recorder cannot watch for later writes (a device tensor under min_tensor_bytes).
  bool untracked_input = false;
  bool in_backward = false;  // run by the backward pass (Note [Rerunnable operators])
  // A default generator moved while it ran (Note [Operators that draw random numbers] in
  // src/torch/session.cpp): rerun, it would draw other numbers.
  bool draws_random = false;
};

// What the recorder knows of one logical tensor.
struct TensorFacts {
  uint64_t bytes = 0;
  uint64_t key = 0;              // make_key of its first appearance
  uint64_t first_iteration = 0;  // the iteration in which its current storage was bound
  std::string name;              // given with Session::name_tensor
  std::optional<TensorKind> named_kind;
  bool is_param = false;  // a leaf that requires grad
  bool produced_in_forward = false;
  bool produced_in_backward = false;
  bool used_in_backward = false;
  bool used_after_backward = false;  // produced in backward, used outside it (optimizer)
  // While recording: the last operator at which the tensor was still alive. Python keeps
  // temporaries past their last use (a variable until it is reassigned), so memory is taken
  // longer than the uses say; the trace extends the lifetime to here (alive_until).
  int64_t last_alive_op = -1;
  uint64_t live_mark = 0;  // 1 + the iteration in which it joined the recording's live list
  // Production in the recorded iteration (valid while production_mark == 1 + the iteration):
  // Note [Recomputable tensors] in recorder.cpp.
  uint64_t production_mark = 0;
  int64_t producer_op = -1;  // the recorded operator that produced it; -1: none recorded
  bool rerunnable = false;   // that operator may be rerun (rerunnable_operator, ProductionFacts)
  // Made inside its producer and rerun alone (Note [Nested producers] in recorder.cpp): the
  // operator nested in the producer that made it reads these inputs (note_nested).
  bool nested = false;
  bool nested_rerunnable = false;  // note_nested's operator may be rerun
  std::vector<LogicalId> nested_inputs;
  // Writes in place in the recorded iteration (valid while write_mark == 1 + the iteration):
  // Note [Writes of a recording] in recorder.cpp.
  uint64_t write_mark = 0;
  // The version counter at its last observation, kept from one iteration to the next while the
  // storage stays bound, and the operator of that observation (-1: before this iteration).
  std::optional<uint64_t> seen_version;
  int64_t seen_at = -1;
  bool rebound = false;  // a new storage since that observation: its bytes changed
  // Windows (from, to] of observations within which it was written in place: after the
  // observation at operator `from` (-1: before the iteration), at or before the one at `to`
  // (operators observe at their start and end). (0, INT64_MAX): unversioned, written anywhere.
  std::vector<std::pair<int64_t, int64_t>> writes;

  // The name given with name_tensor, else where the tensor first appeared ("op12.out0").
  std::string display_name() const;
  // The kind the trace gives it (Note [Tensor kinds] in recorder.cpp). `alive`: its memory exists
  // when the iteration ends; `iteration`: the recorded one.
  TensorKind guess_kind(bool alive, uint64_t iteration) const;
  // The kind of a tensor alive but not used in the recorded iteration.
  TensorKind idle_kind() const;
};

// One recorded operator: its name, time and every tensor it touches (inputs, then new outputs).
struct OperatorRecord {
  std::string name;
  double time_us = 0;
  std::vector<LogicalId> ids;
  double host_us = 0;  // the host's time to reach and launch it (TensorSource::host_times)
  bool reads_back = false;  // it copies a device value to the host, which waits (Trace::kernel_reads_back)
};

// What the recorder asks of the binding layer (src/torch; fakes in tests).
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The tensor's memory still exists (its storage is alive and still the one bound to `id`).
  virtual bool alive(LogicalId id) const = 0;
  // Every tracked tensor whose memory still exists, in any order.
  virtual std::vector<LogicalId> live_tensors() const = 0;
  // The device time of recorded operator k, given the host time measured around it (CUDA: from
  // events on the operator's stream; may wait for them).
  // Whether the recorded operators' host times (add_operator's host_us) go into the trace
  // (kernels[k].host_us): only where operator_time_us is the device's time, not the host's.
  virtual bool host_times() const { return false; }
  virtual double operator_time_us(size_t k, double host_us) const {
    (void)k;
    return host_us;
  }
  // The trace's "device" metadata ("cuda:0", "cpu").
  virtual std::string device_name() const { return "cpu"; }
  // The trace's "kernel_timing" metadata: how operator_time_us measured ("host clock", "CUPTI",
  // "CUDA events (why not CUPTI)"). Asked after every operator_time_us of the trace.
  virtual std::string kernel_timing() const { return "host clock"; }
};

// Per trace tensor, what the schedule needs besides the trace.
struct RecordedTensor {
  LogicalId id = 0;                  // the logical tensor the trace tensor stands for
  bool made_this_iteration = false;  // bound in the recorded iteration (a gradient made anew)
  int64_t last_alive_op = -1;        // TensorFacts::last_alive_op
};
// The trace of a recording, its tensors' logical ids and the iteration's operator signatures.
struct Recording {
  Trace trace;
  std::vector<RecordedTensor> tensors;  // per trace tensor id
};

class Recorder {
 public:
  // --- tensors (in every mode) ------------------------------------------------------------------
  // The logical id for a storage first seen at `key`: the key's id again when the tensor it names
  // is gone (the same tensor of another iteration), else a new one (and the key names it now).
  LogicalId id_for_key(uint64_t key, const TensorSource& source);
  size_t num_tensors() const { return facts_.size(); }
  // Changes whenever a tensor's facts are created or started anew (a new logical tensor: its name
  // and kind are gone), so a caller that names tensors knows when there is anything to name.
  uint64_t facts_generation() const { return facts_generation_; }
  TensorFacts& tensor(LogicalId id) { return facts_.at(id); }
  const TensorFacts& tensor(LogicalId id) const { return facts_.at(id); }
  // A storage of `bytes` is now bound to `id`, first seen at `key` in the current iteration. A new
  // key makes it a new logical tensor; the same key keeps its labels (name, kind, passes).
  void note_bound(LogicalId id, uint64_t key, uint64_t bytes, bool is_param);

  // --- recording one iteration ------------------------------------------------------------------
  // Starts iteration `iteration`: no operators recorded, nothing alive yet.
  void begin_iteration(uint64_t iteration);
  uint64_t iteration() const { return iteration_; }
  // An input of a recorded operator (`in_backward`: run by the backward pass).
  void note_input(LogicalId id, bool in_backward);
  // A new output: produced by the backward pass, or by the forward pass with grad enabled.
  void note_output(LogicalId id, bool in_backward, bool grad_enabled);
  // The tensor's version counter (bumped by every in-place write, through any view) seen now, at
  // the start or the end of the operator being recorded (the next add_operator). A change since
  // its last observation records a write in between.
  void note_version(LogicalId id, uint64_t version);
  // Its writes cannot be watched (no version counter): treated as written everywhere.
  void note_unversioned(LogicalId id);
  // The operator being recorded writes it, whatever its version counter says (its schema marks
  // the argument written: Note [Writes the Session sees] in src/torch/session.cpp).
  void note_written(LogicalId id);
  // `id` is an output of the operator being recorded (the next add_operator), named `op_name`.
  void note_produced(LogicalId id, std::string_view op_name, const ProductionFacts& facts);
  // Before note_produced of a tensor made inside the operator being recorded (nested_only): the
  // operator nested in it that made the tensor, named `op_name`, reads only `inputs` (tracked
  // tensors that exist before the operator) and nothing else the recorder cannot watch, so that
  // rerunning it alone makes the tensor again (Note [Nested producers] in recorder.cpp).
  void note_nested(LogicalId id, std::string_view op_name, std::vector<LogicalId> inputs);
  // The signature of the next recorded operator (at its start; the record comes at its end).
  void add_signature(uint64_t signature) { signatures_.push_back(signature); }
  const std::vector<uint64_t>& signatures() const { return signatures_; }
  // Appends an operator touching `inputs` and then `outputs` (duplicates dropped), and marks every
  // recorded tensor still alive after it (source.alive) as alive there. host_us: the host's time
  // to reach and launch it (Note [Host times of a recording] in src/torch/session.cpp);
  // reads_back: it copies a value from the device to the host, which waits for it (kept in the
  // trace with the host times: kernels[k].reads_back).
  void add_operator(std::string name, double time_us, std::span<const LogicalId> inputs,
                    std::span<const LogicalId> outputs, const TensorSource& source,
                    double host_us = 0, bool reads_back = false);
  // Replaces the recorded operators and signatures with these (a plan's own profile of the
  // operators before a drift: the iteration can still become the profile of its shape).
  void splice(std::span<const OperatorRecord> ops, std::span<const uint64_t> signatures);
  const std::vector<OperatorRecord>& operators() const { return ops_; }
  // Gives each recorded operator the time the trace has for it.
  void set_times(const Trace& trace);
  std::vector<OperatorRecord> take_operators();
  void clear_operators() { ops_.clear(); }

  // The trace of the recorded operators (Note [Trace of a recording] in recorder.cpp), with the
  // writes in place seen (writes_recorded, Note [Writes of a recording]). `engine` says which
  // tensors are bound, lost and pinned for good. Validated.
  Recording build_trace(const runtime::Engine& engine, const TensorSource& source) const;

 private:
  std::vector<TensorFacts> facts_;  // by logical id
  std::unordered_map<uint64_t, LogicalId> key_ids_;
  std::vector<OperatorRecord> ops_;
  std::vector<uint64_t> signatures_;
  std::vector<LogicalId> live_;           // recorded tensors still alive (see last_alive_op)
  TensorFacts& production(LogicalId id);  // its production facts, reset in a new iteration
  TensorFacts& write_facts(LogicalId id);  // its writes, reset in a new iteration
  void mark_writes(Recording& rec, const runtime::Engine& engine) const;
  uint64_t iteration_ = 0;
  uint64_t facts_generation_ = 0;
};

}  // namespace teraio::offload
