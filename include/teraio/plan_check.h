// Validity of a plan against its trace (docs/formats.md, "When a plan is valid"), and the pairing
// of each offload with the prefetch that brings the tensor back. Shared by the planner's tests, the
// simulator and the `plan`/`simulate` commands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "teraio/analysis.h"
#include "teraio/plan.h"
#include "teraio/trace.h"

namespace teraio {

constexpr size_t kNoPrefetch = SIZE_MAX;

// One offload and the prefetch that follows it (same tensor, same tier). All distances are cyclic
// kernel distances from offload.start: 0 <= offload_done < prefetch_begin <= prefetch_deadline <= N.
//
// An offload without a prefetch (docs/formats.md: nothing uses the tensor after it) is a pair with
// prefetch_index == kNoPrefetch whose prefetch_begin == prefetch_deadline is the distance to the
// kernel after the tensor's death: alive_until + 1 - start for a tail (absent from offload_done + 1
// through alive_until), N for an idle persistent tensor, which is `idle`: absent at every kernel
// and held by the tier at every kernel (steady state: it left in an earlier iteration).
struct MovePair {
  size_t offload_index = 0;   // into Plan::moves
  size_t prefetch_index = 0;  // into Plan::moves, or kNoPrefetch
  TensorId tensor = 0;
  uint32_t tier = 0;
  uint64_t bytes = 0;
  KernelIndex start = 0;          // offload.start
  uint32_t offload_done = 0;      // distance to offload.deadline
  uint32_t prefetch_begin = 0;    // distance to prefetch.start (in 1..N)
  uint32_t prefetch_deadline = 0; // distance to prefetch.deadline (in 1..N)
  bool idle = false;              // offload of a persistent tensor no kernel uses

  bool one_way() const { return prefetch_index == kNoPrefetch; }
};

// A valid recompute move: the tensor is absent at kernels start+1 .. deadline-1 and its producer
// runs again, for `time_us`, just before kernel `deadline`.
struct RecomputeMove {
  size_t move_index = 0;  // into Plan::moves
  TensorId tensor = 0;
  uint64_t bytes = 0;
  KernelIndex start = 0;
  KernelIndex deadline = 0;
  KernelIndex producer = 0;
  double time_us = 0;  // recompute_time_us(): the producer's kernel time, or the nested part's
};

// A valid writeback move (docs/formats.md, "Writebacks"): the tensor is copied to `tier` after kernel
// `start`, complete by the end of kernel `deadline`, while it stays resident; the offload of
// pairs[pair_index] (the next move of the tensor, to the same tier, no write in between) is then
// clean. The tier holds the tensor from kernel start + 1 on.
struct WritebackMove {
  size_t move_index = 0;  // into Plan::moves
  size_t pair_index = 0;  // into PlanCheck::pairs: the offload it makes clean
  TensorId tensor = 0;
  uint32_t tier = 0;
  uint64_t bytes = 0;
  KernelIndex start = 0;
  uint32_t done = 0;      // distance from start to deadline
  uint32_t to_offload = 0;  // distance from start to the offload's start
};

struct PlanCheck {
  bool valid = true;
  std::vector<std::string> errors;     // the first `max_errors` problems, each naming the move
  size_t error_count = 0;
  // Valid pairs and offloads without a prefetch (invalid moves are left out).
  std::vector<MovePair> pairs;
  // Valid recompute moves, ordered by deadline, then producer: the order they run in.
  std::vector<RecomputeMove> recomputes;
  // Valid writeback moves, in the order of their moves.
  std::vector<WritebackMove> writebacks;
  std::vector<uint64_t> resident_bytes;  // per kernel, under the plan
  uint64_t peak_bytes = 0;
  KernelIndex peak_kernel = 0;
  std::vector<uint64_t> tier_peak_bytes;  // per tier: most bytes held at once
};

// True when the pair's offload is a discard (docs/formats.md, "discard_dead"): the plan's runner
// discards dead tensors (Plan::discard_dead) and this is the tail of a transient tensor, an offload
// no prefetch follows before the tensor dies. It writes nothing and no tier holds it (check_plan,
// the simulator's Note [Dead tensors], teraio plan's bytes written).
inline bool is_discard(const Trace& trace, const Plan& plan, const MovePair& pair) {
  return plan.discard_dead && pair.one_way() && !pair.idle && !trace.tensors[pair.tensor].persistent;
}

// Per pair of check.pairs: 1 when its offload is clean, writing nothing (Note [Clean offloads] in
// plan_check.cpp, beside check_plan so that the simulator and the planner share it): the tensor was
// read back from the same tier and not written since, or a writeback made it so (Note [Writebacks]
// in simulator.cpp).
std::vector<uint8_t> clean_offloads(const Trace& trace, const PlanCheck& check);

// Checks every rule of docs/formats.md: indices and tiers in range, offload/prefetch pairing,
// no use of a tensor while it is away, non-persistent tensors not moved outside their lifetime,
// offloads without a prefetch only where nothing uses the tensor again, recomputes only of
// recomputable tensors whose producer's inputs are resident at the recompute point, resident bytes
// within budget at every kernel, tier capacities respected.
PlanCheck check_plan(const Trace& trace, const Lifetimes& lifetimes, const Plan& plan,
                     size_t max_errors = 20);

}  // namespace teraio
