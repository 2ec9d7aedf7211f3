// Rewrites of a trace into the trace the same training loop would record with one change, so that
// the planner and simulator can answer "how fast would it be" from a profile already taken
// (docs/transform.md).
#pragma once

#include <cstddef>

#include "teraio/trace.h"

namespace teraio {

struct StepInBackwardInfo {
  size_t parameters = 0;     // parameters whose update moved into the backward
  size_t kept_after = 0;     // parameters whose update stayed after it (no gradient before)
  size_t moved_kernels = 0;  // kernels of the trace that moved (split ones counted once)
  size_t split_kernels = 0;  // kernels over several parameters, split into one per parameter
  size_t recompute_cleared = 0;  // tensors no longer recomputable (an input now written earlier)
};

// The trace of the same iteration with each parameter's optimizer update run in the backward right
// after the last kernel that touches its gradient, as Session.watch(..., step_in_backward=True)
// runs it (docs/pytorch.md, "Optimizer steps in backward"). The optimizer part is found as
// docs/report.md's phases find it (from the first kernel touching an optimizer state, with the
// parameter-only kernels before it); its kernels are given to parameters by the tensors they touch
// (a gradient or state belongs to the parameter whose name it extends by one component: "w.grad",
// "w.exp_avg"; an unnamed gradient to the parameter whose update reads it; a temporary to the
// parameter whose kernel made it, or by name, or, made by a foreach kernel over several parameters,
// the j-th to the j-th parameter when the sizes agree). A kernel over several parameters (a
// foreach or fused step) is split into one per parameter, its time shared by bytes.
// Kernels of no parameter stay at the end. Tensors stay the same; producers, alive_until and writes
// in place follow their kernels, and a tensor whose producer's input is now written before its
// last use is no longer recomputable. Throws teraio::Error naming the cause when the trace has no
// named optimizer states, a multi-parameter kernel makes tensors it cannot give to parameters, a
// parameter is used after its gradient is complete, or the trace already updates in backward.
Trace move_optimizer_into_backward(const Trace& trace, StepInBackwardInfo* info = nullptr);

}  // namespace teraio
