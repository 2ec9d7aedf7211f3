// The schedule compiler (schedule.h; Note [Compiling a schedule]).
#include "schedule.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "teraio/analysis.h"
#include "teraio/error.h"

namespace teraio::offload {

runtime::Schedule compile_schedule(const Recording& recording, const Plan& plan,
                                   std::span<const uint64_t> signatures) {
  const Trace& trace = recording.trace;
  const Lifetimes lifetimes(trace);
  auto recreated = [&](TensorId t) {
    return trace.tensors[t].persistent && recording.tensors.at(t).made_this_iteration;
  };
  std::vector<Move> moves = plan.moves;
  std::erase_if(moves, [&](const Move& m) {
    switch (m.op) {
      case MoveOp::prefetch:
        return recreated(m.tensor) && lifetimes.used(m.tensor) &&
               m.deadline == lifetimes.first_use(m.tensor);
      case MoveOp::offload:
      case MoveOp::recompute:
        // Writebacks run after their operator (Schedule::add_move; the Session's binding lends the
        // bytes: Note [Lent bytes] in src/torch/session.cpp).
      case MoveOp::writeback:
        return false;
    }
    return false;
  });
  runtime::Schedule s;
  s.operators.resize(signatures.size());
  for (size_t k = 0; k < signatures.size(); ++k) s.operators[k].signature = signatures[k];

  // At one kernel a read goes first: an offload or writeback listed with it (plans list one
  // kernel's moves in the order they begin, and a writeback runs after its operator) copies the
  // bytes that read brought, so the tensor starts the iteration out.
  auto earlier = [](const Move& a, const Move& b) {
    return a.start != b.start ? a.start < b.start
                              : a.op == MoveOp::prefetch && b.op != MoveOp::prefetch;
  };
  std::vector<const Move*> first(trace.num_tensors(), nullptr);
  for (const Move& m : moves)
    if (!first[m.tensor] || earlier(m, *first[m.tensor])) first[m.tensor] = &m;
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    if (!trace.tensors[t].persistent || recreated(t)) continue;
    const LogicalId id = recording.tensors.at(t).id;
    bool starts_out = false;
    if (first[t]) {
      switch (first[t]->op) {
        case MoveOp::prefetch:
          starts_out = true;
          break;
        case MoveOp::offload:
          starts_out = !lifetimes.used(t);
          break;
        case MoveOp::recompute:  // a persistent tensor has no producer in the iteration
        case MoveOp::writeback:  // copies a resident tensor: it starts in
          break;
      }
    }
    if (starts_out) {
      Move out = *first[t];
      out.tensor = id;
      s.start_out.push_back(out);
    } else {
      s.start_in.push_back(id);
    }
  }
  std::unordered_map<LogicalId, KernelIndex> producer;  // of the recomputed tensors
  // A recompute reads its inputs before its deadline, which may be past an input's last use in the
  // trace (planner.cpp, Notes [Deep recompute chains] and [Inputs kept for a recompute]): an
  // offload before such a read is no tail, its bytes are needed again.
  std::unordered_map<TensorId, KernelIndex> last_read;
  for (const Move& m : moves) {
    if (m.op != MoveOp::recompute) continue;
    for (TensorId i : recompute_reads(trace, lifetimes, m.tensor)) {
      KernelIndex& r = last_read[i];
      r = std::max(r, m.deadline);
    }
  }
  for (Move m : moves) {
    const TensorId t = m.tensor;
    m.tensor = recording.tensors.at(t).id;
    // A tail of a transient tensor: nothing uses or reads it again before it dies (Note [Dead
    // tensors]).
    const auto read = last_read.find(t);
    if (plan.discard_dead && m.op == MoveOp::offload && !trace.tensors[t].persistent &&
        lifetimes.used(t) && m.start >= lifetimes.last_use(t) &&
        (read == last_read.end() || m.start >= read->second)) {
      s.add_discard(m.tensor, m.start);
      continue;
    }
    s.add_move(m);
    if (m.op != MoveOp::recompute) continue;
    // The producer's run in a planned step captures the recipe (Note [Recompute in the engine]).
    TERAIO_CHECK(trace.tensors[t].recomputable && trace.tensors[t].producer,
                 "plan recomputes tensor {}, which the trace does not mark recomputable", t);
    const KernelIndex p = *trace.tensors[t].producer;
    TERAIO_CHECK(p < s.operators.size() && p <= m.start,
                 "plan recomputes tensor {} from kernel {}, past its move", t, p);
    std::vector<LogicalId>& cap = s.operators[p].capture;
    if (std::find(cap.begin(), cap.end(), m.tensor) == cap.end()) cap.push_back(m.tensor);
    producer[m.tensor] = p;
  }
  // Recomputes due before one operator run in the order of their producers (docs/formats.md).
  for (runtime::Schedule::Operator& op : s.operators)
    std::stable_sort(op.recompute_before.begin(), op.recompute_before.end(),
                     [&](const runtime::Schedule::Remake& a, const runtime::Schedule::Remake& b) {
                       return producer[a.id] < producer[b.id];
                     });
  s.mark_last_recomputes();
  const size_t n = std::min<size_t>(trace.num_kernels(), s.operators.size());
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    // A persistent tensor made anew each iteration (a gradient after zero_grad(set_to_none=True))
    // is created by its first user like a transient one: without room for it there, a step whose
    // resident bytes ran above the plan's before that operator went past the budget by its bytes.
    if (lifetimes.used(t) && lifetimes.first_use(t) < n &&
        (!trace.tensors[t].persistent || recreated(t)))
      s.operators[lifetimes.first_use(t)].created_bytes += trace.tensors[t].bytes;
    if (trace.tensors[t].persistent) continue;
    const int64_t died_before = recording.tensors.at(t).last_alive_op + 1;
    if (died_before > 0 && died_before < static_cast<int64_t>(n))
      s.operators[died_before].deaths.push_back(recording.tensors.at(t).id);
  }
  return s;
}

}  // namespace teraio::offload
