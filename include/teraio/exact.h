// An exact planner for small traces: a mixed-integer program (solved with GLPK) over the same
// per-kernel bandwidth-slot model the greedy planner uses, with stall time as the objective, and the
// small transformer-like instances the greedy plan is measured against (docs/planner.md, "How good
// is the plan"). Pure computation: no I/O, no threads; each call builds and frees its own problem.
#pragma once

#include <cstdint>
#include <vector>

#include "teraio/plan.h"
#include "teraio/trace.h"

namespace teraio {

struct ExactOptions {
  uint64_t budget_bytes = 0;
  std::vector<TierSpec> tiers;
  // Wall-clock limit of the branch and bound; the best plan found so far and the proved bound are
  // returned when it runs out. Default 60 s.
  double time_limit_s = 60;
  // Stop when (incumbent - bound) / incumbent falls below this. Default 1e-6 (proved optimal).
  double relative_gap = 1e-6;
  // Seed the search with the greedy plan (make_plan) as the first incumbent. Default on: it never
  // changes the optimum, only how fast it is proved.
  bool warm_start_greedy = true;
  // After solving, start each prefetch as early as the budget allows (as the greedy does). It keeps
  // the model stall unchanged and only matters to the first-come-first-served simulator. Default on.
  bool hoist_prefetch = true;
};

struct ExactResult {
  Plan plan;                   // valid (check_plan) whenever has_solution
  bool has_solution = false;   // false only when the time ran out before any plan was found
  bool optimal = false;        // the model stall of `plan` is proved minimal (within relative_gap)
  double model_stall_us = 0;   // stall of `plan` in the slot model (the objective)
  double bound_stall_us = 0;   // no valid plan has less model stall than this
  double greedy_model_stall_us = -1;  // the greedy plan's model stall (warm start only, else -1)
  size_t columns = 0;          // variables of the program
  size_t binaries = 0;
  size_t rows = 0;
  double solve_seconds = 0;
};

// Minimises the stall of the slot model (docs/planner.md, "How good is the plan"): each inactive
// period is offloaded to at most one tier, absent for one contiguous run of kernels, or (a gap of a
// recomputable tensor) recomputed over its whole length, its producer's time counting as stall; its offload
// bytes fill write-link slots before that run and its prefetch bytes read-link slots after it;
// a slot is a kernel (bandwidth x kernel time) or the stall before a kernel (bandwidth x stall).
// Resident bytes stay within the budget at every kernel and tiers within capacity. Throws
// teraio::Error on bad options, when a kernel's own tensors exceed the budget, or when no plan fits
// (tier capacity).
ExactResult solve_exact(const Trace& trace, const ExactOptions& opts);

// The stall (with recompute time) of a valid plan in the same slot model: its periods, tiers,
// absence windows and recomputes fixed, the best placement of its transfer bytes in the slots (a
// linear program). Throws teraio::Error when the plan is not valid for the trace, or uses what the
// model does not cover (a recompute of part of a gap, two absences in one gap around a read).
double model_stall_us(const Trace& trace, const Plan& plan);

// A small transformer-like training iteration, deterministic per seed: `layers` blocks, each with a
// persistent weight, gradient and optimizer state, and an activation saved from its forward kernel
// to its backward kernels; then an optimizer step per layer. Kernel times and tensor sizes vary
// randomly. layers in [1, 10]: 7 x layers + 1 kernels, 4 x layers + 1 tensors (see `recompute`).
struct SmallInstanceOptions {
  uint32_t layers = 4;
  // Recomputable activations (trace v2): each layer's matmul makes z (not recomputable) and a cheap
  // GELU makes the next layer's input from it (recomputable, memory-bound time: 1 us per MB read
  // and written); backward reads z and the activation. 6 x layers + 1 kernels, 5 x layers + 1
  // tensors. Default off (the instances of the tables in docs/planner.md).
  bool recompute = false;
  double min_bytes = 8e6;        // default 8 MB
  double max_bytes = 256e6;      // default 256 MB
  double min_time_us = 200;      // default 0.2 ms
  double max_time_us = 20000;    // default 20 ms
};
Trace small_instance(uint64_t seed, const SmallInstanceOptions& opts);

}  // namespace teraio
