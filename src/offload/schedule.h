// The schedule compiler: a profiled trace and the plan made for it become the per-operator form
// the engine runs (runtime::Schedule), once per plan: the moves by operator with logical ids, the
// deaths and created bytes of the profile, where persistent tensors are when an iteration starts,
// and the operators' signatures (the drift check). Pure: no engine, no I/O.
#pragma once

#include <cstdint>
#include <span>

#include "engine.h"
#include "recorder.h"
#include "teraio/plan.h"

namespace teraio::offload {

// Note [Compiling a schedule]: `plan` was made for `recording.trace`; its moves name trace tensor
// ids and are renamed to logical ids (recording.tensors). Besides the moves:
//   - A tensor made anew each iteration and alive at its end (a gradient until zero_grad) is
//     persistent in the trace, so its memory is counted into the next iteration; the prefetch that
//     would bring it back for its first use there is dropped: that use creates a new tensor.
//   - Step-start placement: each other persistent tensor is offloaded when an iteration starts if
//     its first move in the iteration is a prefetch (it went out at the end of the previous one),
//     or if no operator uses it and the plan moves it out (it stays out: docs/planner.md, "Tensors
//     no kernel uses again"); else it is resident. At one operator a prefetch starts before it runs
//     and an offload after it: the prefetch is first.
//   - Deaths: a transient tensor is forgotten just before the operator after the last one it was
//     alive at in the profile.
//   - Created bytes: per operator, the bytes of the transient tensors it uses first.
//   - Discards (Note [Dead tensors]): with plan.discard_dead, an offload of a transient tensor
//     that starts at or after its last use frees it there without a write (discard_after).
//   - Recomputes (Note [Recompute in the engine]): dropped after `start`, made again before
//     `deadline` in the order of their producers; the producer (the trace's) captures the recipe
//     (Schedule::Operator::capture). Throws teraio::Error when the trace does not mark the tensor
//     recomputable.
// `signatures` has one entry per operator of the iteration (the schedule's length); deaths and
// created bytes past it are dropped. Throws teraio::Error for a move past the iteration.
runtime::Schedule compile_schedule(const Recording& recording, const Plan& plan,
                                   std::span<const uint64_t> signatures);

}  // namespace teraio::offload
