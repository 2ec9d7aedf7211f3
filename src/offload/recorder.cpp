// The recorder (recorder.h): tensor facts, kind guessing and the trace of a recorded iteration.
#include "recorder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "teraio/analysis.h"
#include "teraio/json_text.h"

namespace teraio::offload {

bool is_collective(const char* name) {
  return std::strncmp(name, "c10d::", 6) == 0 ||
         std::strncmp(name, "_c10d_functional::", 18) == 0 ||
         std::strncmp(name, "c10d_functional::", 17) == 0;
}

// Note [Rerunnable operators]: recompute reruns a tensor's producer through the dispatcher and
// needs the same bytes again, so only operators known to be pure functions of their inputs
// qualify. By name: only "aten::" operators (a custom or Python operator may keep state; c10d's
// collectives talk to other ranks); none that draws random numbers (dropout, rand*, bernoulli,
// multinomial, normal, uniform, ...: the generator has moved on since, and saving its state is the
// runtime's to do, not done yet); none that leaves memory uninitialised (empty*: its bytes are
// whatever the allocator had); none on the deny-list of kernels that are nondeterministic on CUDA
// (atomic accumulation: index_add, index_put, scatter_add/reduce, put, embedding_bag, histc,
// bincount, ...); no backward kernel ("_backward", or any operator run by the backward pass: many
// accumulate with atomics, and their outputs are gradients the step keeps or frees at once).
// Besides the name, ProductionFacts exclude aliasing outputs, operators that write into an input,
// outputs only a nested operator made, and operators with an input the recorder cannot watch.
bool rerunnable_operator(std::string_view name) {
  if (!name.starts_with("aten::")) return false;
  static constexpr std::string_view kDenied[] = {
      // random numbers
      "dropout", "rand", "bernoulli", "multinomial", "normal", "uniform", "exponential",
      "geometric", "cauchy", "poisson", "binomial", "rrelu", "_standard_gamma", "_sample_dirichlet",
      // uninitialised memory, storage games
      "empty", "resize", "set_", "_local_scalar_dense",
      // nondeterministic kernels (atomics) and backward kernels
      "index_add", "index_put", "index_reduce", "scatter_add", "scatter_reduce", "put",
      "embedding_bag", "histc", "bincount", "ctc_loss", "_backward", "_unique", "nonzero",
      "masked_select"};
  for (std::string_view d : kDenied)
    if (name.find(d, 6) != std::string_view::npos) return false;
  return true;
}

std::string TensorFacts::display_name() const {
  if (!name.empty()) return name;
  return fmt::format("op{}.{}{}", key >> 32, (key & 1) ? "out" : "in", (key >> 1) & 0x7fffffff);
}

// Note [Tensor kinds]: a kind given with name_tensor wins. Otherwise: a leaf that requires grad is
// a parameter; a tensor produced by the backward pass is a gradient when it outlives the iteration
// or the optimizer uses it, else a temporary; one alive at the end and bound before the recorded
// iteration is optimizer state; one produced by the forward pass (grad enabled) and used by the
// backward pass is an activation; other forward outputs, and any operator output, are temporaries;
// the rest (inputs seen first as inputs: a batch) is "other".
TensorKind TensorFacts::guess_kind(bool alive, uint64_t iteration) const {
  const bool long_lived = alive && first_iteration < iteration;
  if (named_kind) return *named_kind;
  if (is_param) return TensorKind::parameter;
  if (produced_in_backward)
    return (alive || used_after_backward) ? TensorKind::gradient : TensorKind::temporary;
  if (long_lived) return TensorKind::optimizer_state;
  if (produced_in_forward && used_in_backward) return TensorKind::activation;
  if (produced_in_forward || (key & 1)) return TensorKind::temporary;
  return TensorKind::other;
}

TensorKind TensorFacts::idle_kind() const {
  return named_kind ? *named_kind : is_param ? TensorKind::parameter : TensorKind::optimizer_state;
}

LogicalId Recorder::id_for_key(uint64_t key, const TensorSource& source) {
  auto it = key_ids_.find(key);
  if (it != key_ids_.end() && !source.alive(it->second)) return it->second;
  const auto id = static_cast<LogicalId>(facts_.size());
  facts_.emplace_back();
  facts_generation_++;
  key_ids_[key] = id;
  return id;
}

void Recorder::note_bound(LogicalId id, uint64_t key, uint64_t bytes, bool is_param) {
  TensorFacts& m = facts_.at(id);
  if (m.key != key || m.bytes == 0) {  // a new logical tensor; the same key keeps its labels
    m = TensorFacts{};
    m.key = key;
    facts_generation_++;
  }
  m.bytes = bytes;
  m.first_iteration = iteration_;
  m.production_mark = 0;  // a new storage: no production seen yet
  if (m.seen_version) m.rebound = true;  // its bytes changed: Note [Writes of a recording]
  m.is_param = is_param;
}

void Recorder::begin_iteration(uint64_t iteration) {
  iteration_ = iteration;
  signatures_.clear();
  ops_.clear();
  live_.clear();
}

void Recorder::note_input(LogicalId id, bool in_backward) {
  TensorFacts& m = facts_.at(id);
  if (in_backward)
    m.used_in_backward = true;
  else if (m.produced_in_backward)
    m.used_after_backward = true;
}

void Recorder::note_output(LogicalId id, bool in_backward, bool grad_enabled) {
  TensorFacts& m = facts_.at(id);
  if (in_backward)
    m.produced_in_backward = true;
  else if (grad_enabled)
    m.produced_in_forward = true;
}

// Note [Recomputable tensors]: the trace gives a tensor made in the recorded iteration the
// operator that produced its storage (its first use; every output of a multi-output operator gets
// the same one) and marks it recomputable when rerunning that operator just before any later use
// gives the same bytes: the operator is rerunnable (Note [Rerunnable operators], ProductionFacts),
// the tensor is not written in place after its production, and no input of the producer is written
// from the production up to the tensor's last use. Writes are seen through version counters,
// observed at the start and end of every recorded operator that touches the tensor (a window
// between two observations holds the write). A tensor persistent in the trace (alive when the
// iteration ends) gets no producer.
TensorFacts& Recorder::production(LogicalId id) {
  TensorFacts& m = facts_.at(id);
  if (m.production_mark != iteration_ + 1) {
    m.production_mark = iteration_ + 1;
    m.producer_op = -1;
    m.rerunnable = false;
    m.nested = false;
    m.nested_rerunnable = false;
    m.nested_inputs.clear();
  }
  return m;
}

// Note [Writes of a recording]: the trace records writes (Trace::writes_recorded) so that an
// offload of a tensor read back and unchanged since can write nothing (Note [Clean offloads] in
// src/sim/simulator.cpp). Every recorded operator observes the version counter of each tensor it
// touches, at its start (inputs) and its end (inputs and outputs), as observation index
// ops_.size(): the operator's own index. A change between two observations is a window (from, to]:
// the write came after the operator `from` observed and at or before the operator `to` did; the
// trace puts it at every kernel in from+1 .. to that lists the tensor (one that wrote it while
// both its observations saw the same version, `from` == `to`, at `to`), and at the first one at or
// after `to` should `to` not list it. Observations cover every use, so that is the writing
// operator, or the use right after a write no recorded operator made: conservative either way
// (later than the write, never after a use that followed it).
// The last version seen is kept across iterations while the storage stays bound, so a persistent
// tensor written between the previous iteration's last observation and this one's first (or given
// a new storage: `rebound`) is written at its first uses here (window from -1); for a transient
// tensor such a window is dropped (nothing reads it back before it exists in the iteration), and
// Note [Recomputable tensors] ignores it as it did before. An unversioned tensor is written at
// every use, and so is one listed but never observed in the iteration (spliced operators).
TensorFacts& Recorder::write_facts(LogicalId id) {
  TensorFacts& m = facts_.at(id);
  if (m.write_mark != iteration_ + 1) {
    m.write_mark = iteration_ + 1;
    m.seen_at = -1;
    m.writes.clear();
  }
  return m;
}

void Recorder::note_version(LogicalId id, uint64_t version) {
  TensorFacts& m = write_facts(id);
  const auto k = static_cast<int64_t>(ops_.size());
  if (m.seen_version && (*m.seen_version != version || m.rebound))
    m.writes.emplace_back(m.seen_at, k);
  m.seen_version = version;
  m.seen_at = k;
  m.rebound = false;
}

void Recorder::note_written(LogicalId id) {
  const auto k = static_cast<int64_t>(ops_.size());
  write_facts(id).writes.emplace_back(k, k);
}

void Recorder::note_unversioned(LogicalId id) {
  write_facts(id).writes.emplace_back(0, std::numeric_limits<int64_t>::max());
}

// Note [Nested producers]: a tensor made inside an operator and kept by it (autocast's bf16 copy of
// a weight, made by aten::to inside aten::linear and saved for the backward) cannot be made again
// by rerunning that operator, which would hand back only its outputs. The Session names the
// operator nested in it that made the tensor: the outermost nested operator that returned the
// tensor's storage without taking it as an input (aten::to, not the aten::empty_strided and
// aten::copy_ inside it), unless an operator nested later wrote into it (its schema says so:
// then none). When that operator is rerunnable (Note [Rerunnable operators]) and reads only
// tracked tensors that exist before the top-level operator and that operator lists, the trace
// marks the tensor recomputable by that operator alone: `recompute_inputs` those tensors, and
// `recompute_us` its share of the top-level operator's time by the bytes it reads and writes, but
// no more than those bytes take at the memory rate the profile shows (the nested operator is not
// timed alone; a cast is memory-bound, while the matmul around it may not be: on the 8B's profile
// the share alone put a weight's cast at 0.67 ms, its bytes at the profile's rate at 0.08 ms);
// a nested operator that reads every input the top-level one had is charged the whole time.
// The writes rule of Note [Recomputable tensors] then covers those inputs only.
void Recorder::note_nested(LogicalId id, std::string_view op_name, std::vector<LogicalId> inputs) {
  TensorFacts& m = production(id);
  if (m.producer_op >= 0) return;
  m.nested_rerunnable = rerunnable_operator(op_name);
  m.nested_inputs = std::move(inputs);
}

void Recorder::note_produced(LogicalId id, std::string_view op_name, const ProductionFacts& f) {
  if (f.aliases_input) return;
  TensorFacts& m = production(id);
  if (m.producer_op >= 0) return;  // produced earlier in the iteration (returned again)
  m.producer_op = static_cast<int64_t>(ops_.size());
  m.nested = f.nested_only && m.nested_rerunnable;
  if (!m.nested) m.nested_inputs.clear();
  m.rerunnable = (f.nested_only ? m.nested_rerunnable : rerunnable_operator(op_name)) &&
                 !f.mutates_input && !f.untracked_input && !f.in_backward && !f.draws_random;
}

void Recorder::add_operator(std::string name, double time_us, std::span<const LogicalId> inputs,
                            std::span<const LogicalId> outputs, const TensorSource& source,
                            double host_us, bool reads_back) {
  OperatorRecord r;
  r.name = std::move(name);
  r.time_us = time_us;
  r.host_us = host_us;
  r.reads_back = reads_back;
  r.ids.assign(inputs.begin(), inputs.end());
  for (LogicalId id : outputs)
    if (std::find(r.ids.begin(), r.ids.end(), id) == r.ids.end()) r.ids.push_back(id);
  for (LogicalId id : r.ids) {
    TensorFacts& m = facts_.at(id);
    if (m.live_mark != iteration_ + 1) {
      m.live_mark = iteration_ + 1;
      live_.push_back(id);
    }
  }
  ops_.push_back(std::move(r));
  // Marks the recorded tensors still alive after this operator; forgets the dead ones.
  const auto k = static_cast<int64_t>(ops_.size()) - 1;
  for (size_t i = 0; i < live_.size();) {
    const LogicalId id = live_[i];
    if (source.alive(id)) {
      facts_[id].last_alive_op = k;
      ++i;
    } else {
      live_[i] = live_.back();
      live_.pop_back();
    }
  }
}

void Recorder::splice(std::span<const OperatorRecord> ops, std::span<const uint64_t> signatures) {
  ops_.assign(ops.begin(), ops.end());
  signatures_.assign(signatures.begin(), signatures.end());
}

void Recorder::set_times(const Trace& trace) {
  for (size_t k = 0; k < ops_.size(); ++k)
    ops_[k].time_us = trace.kernel_time_us(static_cast<KernelIndex>(k));
}

std::vector<OperatorRecord> Recorder::take_operators() {
  std::vector<OperatorRecord> out = std::move(ops_);
  ops_.clear();
  return out;
}

// Note [Trace of a recording]: one trace kernel per recorded operator, listing the tensors it
// touches. A transient tensor alive past its last use (Python holds it; a gradient until zero_grad)
// gets the last operator it was alive at as its `alive_until`: its memory is taken until then, but
// it is not used there, so it may leave after its last use. One alive at the end is persistent.
// Tensors pinned by a collective are listed at every operator where they are pinned, so that the
// planner sees no inactive period there (no move) and counts their bytes: a persistent one (DDP's
// gradient buckets) at every operator, since it is pinned when the next iterations start; a
// transient one from its first collective until it dies. Tensors alive and tracked but not used in
// the iteration (an expert that got no token, the states of parameters without a gradient this
// time) are persistent tensors no kernel uses, so the planner may keep them out for the whole
// iteration (pinned ones are listed at every operator instead).
Recording Recorder::build_trace(const runtime::Engine& engine, const TensorSource& source) const {
  Recording rec;
  std::unordered_map<LogicalId, TensorId> to_trace;
  Trace& trace = rec.trace;
  trace.set_meta("source", "\"teraio.Session\"");
  trace.set_meta("device", fmt::format("\"{}\"", source.device_name()));
  trace.set_meta("iteration", std::to_string(iteration_));
  auto add = [&](LogicalId id) {
    const TensorFacts& m = facts_.at(id);
    rec.tensors.push_back({id, m.first_iteration >= iteration_, m.last_alive_op});
  };
  std::unordered_map<LogicalId, size_t> last_use;
  for (size_t k = 0; k < ops_.size(); ++k)
    for (LogicalId id : ops_[k].ids) last_use[id] = k;
  std::vector<std::vector<LogicalId>> pinned_at(ops_.size());
  if (!ops_.empty()) {
    std::unordered_map<LogicalId, size_t> first_collective;
    for (size_t k = 0; k < ops_.size(); ++k)
      if (is_collective(ops_[k].name.c_str()))
        for (LogicalId id : ops_[k].ids) first_collective.emplace(id, k);
    std::vector<std::pair<LogicalId, size_t>> sorted(last_use.begin(), last_use.end());
    std::sort(sorted.begin(), sorted.end());  // a deterministic trace
    for (const auto& [id, last] : sorted) {
      const bool alive = source.alive(id);
      auto it = first_collective.find(id);
      size_t from = 0, to = ops_.size() - 1;
      if (alive && engine.pinned_permanently(id)) {
        // pinned from the first operator to the last
      } else if (it != first_collective.end()) {
        from = it->second;
        if (!alive)
          to = static_cast<size_t>(std::clamp<int64_t>(facts_[id].last_alive_op,
                                                       static_cast<int64_t>(last), int64_t(to)));
      } else {
        continue;
      }
      for (size_t k = from; k <= to; ++k) pinned_at[k].push_back(id);
    }
  }
  std::vector<LogicalId> idle;  // tracked, alive and not used in this iteration
  for (LogicalId id : source.live_tensors())
    if (!last_use.count(id) && engine.bound(id) && engine.location(id) != runtime::Location::kLost)
      idle.push_back(id);
  std::sort(idle.begin(), idle.end());  // a deterministic trace
  for (LogicalId id : idle)
    if (engine.pinned_permanently(id))
      for (auto& at : pinned_at) at.push_back(id);  // never moves: counted at every operator
  std::vector<TensorId> ids;
  std::vector<LogicalId> op_ids;
  for (size_t k = 0; k < ops_.size(); ++k) {
    ids.clear();
    op_ids = ops_[k].ids;
    op_ids.insert(op_ids.end(), pinned_at[k].begin(), pinned_at[k].end());
    for (LogicalId id : op_ids) {
      auto [it, inserted] = to_trace.emplace(id, static_cast<TensorId>(rec.tensors.size()));
      if (inserted) {
        add(id);
        const TensorFacts& m = facts_[id];
        const bool alive = source.alive(id);
        TensorInfo info;
        info.bytes = m.bytes;
        // Alive when the iteration ends: its memory stays taken into the next iteration (a
        // gradient until zero_grad, a batch the loop still holds), so the planner must count it
        // there. Modelled as persistent (its gap wraps around); when the next iteration frees it
        // before its first use, the runtime drops a prefetch of the dead tensor (no read).
        info.persistent = alive;
        info.kind = m.guess_kind(alive, iteration_);
        info.name = m.display_name();
        trace.add_tensor(std::move(info));
      }
      ids.push_back(it->second);
    }
    trace.add_kernel(ops_[k].name, std::max(0.0, source.operator_time_us(k, ops_[k].time_us)), ids);
  }
  if (source.host_times())  // Note [The host lane] in simulator.cpp
    for (size_t k = 0; k < ops_.size(); ++k) {
      trace.set_kernel_host_us(static_cast<KernelIndex>(k), std::max(0.0, ops_[k].host_us));
      if (ops_[k].reads_back) trace.set_kernel_reads_back(static_cast<KernelIndex>(k), true);
    }
  // alive_until, for transient tensors whose memory outlived their last listed use.
  std::vector<int64_t> first_listed(trace.num_tensors(), -1), last_listed(trace.num_tensors(), -1);
  for (size_t k = 0; k < trace.num_kernels(); ++k)
    for (TensorId t : trace.kernel_tensors(static_cast<KernelIndex>(k))) {
      if (first_listed[t] < 0) first_listed[t] = static_cast<int64_t>(k);
      last_listed[t] = static_cast<int64_t>(k);
    }
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    const int64_t until = rec.tensors[t].last_alive_op;
    if (!trace.tensors[t].persistent && until > last_listed[t] &&
        until < static_cast<int64_t>(ops_.size()))
      trace.tensors[t].alive_until = static_cast<KernelIndex>(until);
  }
  // The device's memory rate as the profile shows it, for nested producers' times: the 90th
  // percentile of bytes touched per microsecond over operators touching 1 MiB or more (the
  // memory-bound ones run near the device's bandwidth: 4.2 TB/s on the H200's profiles; matmuls
  // touch far fewer bytes per microsecond). 0 with fewer than 16 such operators.
  double memory_rate = 0;
  {
    std::vector<double> rates;
    for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
      double bytes = 0;
      for (TensorId i : trace.kernel_tensors(k)) bytes += static_cast<double>(trace.tensors[i].bytes);
      if (bytes >= double(1 << 20) && trace.kernel_time_us(k) > 0) rates.push_back(bytes / trace.kernel_time_us(k));
    }
    if (rates.size() >= 16) {
      const auto at = rates.begin() + static_cast<std::ptrdiff_t>((rates.size() - 1) * 9 / 10);
      std::nth_element(rates.begin(), at, rates.end());
      memory_rate = *at;
    }
  }
  // Producers (Note [Recomputable tensors]).
  auto written = [&](LogicalId id, int64_t from, int64_t to) {
    const TensorFacts& m = facts_[id];
    if (m.write_mark != iteration_ + 1) return false;
    // a < 0: before the iteration, ignored here (Note [Writes of a recording]).
    for (const auto& [a, b] : m.writes)
      if (a >= 0 && a <= to && b >= from) return true;
    return false;
  };
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    const LogicalId id = rec.tensors[t].id;
    const TensorFacts& m = facts_[id];
    if (trace.tensors[t].persistent || m.production_mark != iteration_ + 1 || m.producer_op < 0 ||
        last_listed[t] < 0)
      continue;
    const auto p = static_cast<size_t>(m.producer_op);
    if (first_listed[t] != m.producer_op) continue;  // not its first listing: leave it unknown
    trace.tensors[t].producer = static_cast<KernelIndex>(p);
    bool ok = m.rerunnable && !written(id, m.producer_op, std::numeric_limits<int64_t>::max());
    auto made_here = [&](LogicalId in) {
      const TensorFacts& f = facts_[in];
      return f.production_mark == iteration_ + 1 && f.producer_op == m.producer_op;
    };
    std::vector<TensorId> nested_inputs;  // Note [Nested producers]
    if (ok && m.nested) {
      for (LogicalId in : m.nested_inputs) {
        auto it = to_trace.find(in);
        // ... and that exist before it: listed by an earlier operator, or persistent. One first
        // listed by this operator without being made by it (a tensor the loop made outside the
        // recorded operators, as the first step's small inputs are) cannot be told from an output
        // in the trace, whose reader then rejects it (Trace::validate_nested_recompute).
        ok = it != to_trace.end() && !made_here(in) &&
             std::find(ops_[p].ids.begin(), ops_[p].ids.end(), in) != ops_[p].ids.end() &&
             (trace.tensors[it->second].persistent || first_listed[it->second] < m.producer_op);
        if (!ok) break;
        // Views of one storage (q, k and v split from one projection) are one tensor, listed once.
        if (std::find(nested_inputs.begin(), nested_inputs.end(), it->second) == nested_inputs.end())
          nested_inputs.push_back(it->second);
      }
    }
    for (LogicalId in : m.nested ? m.nested_inputs : ops_[p].ids) {
      if (!ok) break;
      if (!made_here(in)) ok = !written(in, m.producer_op, last_listed[t]);
    }
    trace.tensors[t].recomputable = ok;
    if (ok && m.nested) {
      double mine = static_cast<double>(trace.tensors[t].bytes), all = 0;
      for (TensorId i : nested_inputs) mine += static_cast<double>(trace.tensors[i].bytes);
      for (TensorId i : trace.kernel_tensors(static_cast<KernelIndex>(p)))
        all += static_cast<double>(trace.tensors[i].bytes);
      const double us = trace.kernel_time_us(static_cast<KernelIndex>(p));
      double share = all > 0 ? us * std::min(1.0, mine / all) : us;
      if (memory_rate > 0) share = std::min(share, mine / memory_rate);
      // It reads every input the operator had: the operator's whole work, as far as the profile
      // can tell (fp32 math attention's probabilities, made inside aten::scaled_dot_product_attention
      // by _scaled_dot_product_attention_math from q, k and v: 2.4 ms, where the share above gave
      // 0.14 ms).
      bool reads_all = true;
      for (LogicalId in : ops_[p].ids) {
        const auto it = to_trace.find(in);
        if (made_here(in) || it == to_trace.end()) continue;
        if (std::find(nested_inputs.begin(), nested_inputs.end(), it->second) == nested_inputs.end()) {
          reads_all = false;
          break;
        }
      }
      if (reads_all) share = us;
      trace.tensors[t].recompute_us = share;
      trace.tensors[t].recompute_inputs = std::move(nested_inputs);
    }
  }
  for (LogicalId id : idle) {
    if (to_trace.count(id)) continue;
    const TensorFacts& m = facts_[id];
    TensorInfo info;
    info.bytes = m.bytes;
    info.persistent = true;
    info.kind = m.idle_kind();
    info.name = m.display_name();
    to_trace.emplace(id, static_cast<TensorId>(rec.tensors.size()));
    add(id);
    trace.add_tensor(std::move(info));
  }
  mark_writes(rec, engine);
  trace.set_meta("kernel_timing", json_quote(source.kernel_timing()));
  trace.validate();
  return rec;
}

// Each trace tensor's written_at, from the windows of its observations (Note [Writes of a
// recording]).
void Recorder::mark_writes(Recording& rec, const runtime::Engine& engine) const {
  Trace& trace = rec.trace;
  trace.writes_recorded = true;
  const Lifetimes lifetimes(trace);
  constexpr int64_t kAnywhere = std::numeric_limits<int64_t>::max();
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    const std::span<const KernelIndex> uses = lifetimes.uses(t);
    if (uses.empty()) continue;
    const LogicalId id = rec.tensors[t].id;
    const TensorFacts& m = facts_[id];
    TensorInfo& info = trace.tensors[t];
    std::vector<KernelIndex>& w = info.written_at;
    auto all_uses = [&] { w.assign(uses.begin(), uses.end()); };
    if (m.write_mark != iteration_ + 1) {  // listed, never observed: writes unknown
      // Pinned for good: never moves, so never offloaded (and listed at every operator).
      if (!engine.pinned_permanently(id)) all_uses();
      continue;
    }
    for (const auto& [from, to] : m.writes) {
      if (to == kAnywhere) {  // unversioned
        all_uses();
        break;
      }
      if (from < 0 && !info.persistent) continue;
      auto first_use_from = [&](int64_t v) {  // the first use at or after observation v
        return std::lower_bound(uses.begin(), uses.end(), v, [](KernelIndex k, int64_t x) {
          return static_cast<int64_t>(k) < x;
        });
      };
      auto it = first_use_from(from < 0 ? 0 : std::min(from + 1, to));
      for (; it != uses.end() && static_cast<int64_t>(*it) <= to; ++it) w.push_back(*it);
      // The first use at or after `to` (wrapping for a persistent tensor), should `to` not list it.
      it = first_use_from(to);
      w.push_back(it != uses.end() ? *it : info.persistent ? uses.front() : uses.back());
    }
    std::sort(w.begin(), w.end());
    w.erase(std::unique(w.begin(), w.end()), w.end());
  }
}

}  // namespace teraio::offload
