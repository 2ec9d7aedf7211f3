// Bandwidth sweep (the paper's Figure 3 roofline): at each bandwidth, replan with make_plan and
// report the best of the plans made at this or any lower bandwidth, simulated at this bandwidth, so
// that more bandwidth never reports a slower iteration. Used by `teraio simulate --sweep-bandwidth`
// and by reports. Pure computation; safe to call from several threads on distinct arguments.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "teraio/plan.h"
#include "teraio/planner.h"
#include "teraio/trace.h"

namespace teraio {

struct SweepOptions {
  // Every tier's read and write bandwidth is multiplied by a scale factor; the factors run
  // geometrically from min_scale to max_scale in `steps` points (one point when steps == 1).
  double min_scale = 0.25;  // default: a quarter of the plan's bandwidth
  double max_scale = 4.0;   // default: four times it
  int steps = 9;            // default: 0.25, 0.35, 0.5, ..., 4 (factors of sqrt(2))
  int iterations = 2;       // simulated iterations per point (SimOptions::iterations)
};

struct SweepPoint {
  double scale = 0;             // bandwidth factor of this point
  std::vector<TierSpec> tiers;  // the tiers at this bandwidth
  double total_read_gbps = 0;   // sum over tiers (the x-axis of Figure 3, prefetch direction)
  double total_write_gbps = 0;
  double iteration_us = 0;  // best simulated iteration at this bandwidth
  double ideal_us = 0;
  double stall_us = 0;
  double percent_of_ideal = 0;  // 100 * ideal / iteration (throughput relative to ideal)
  size_t plan_point = 0;        // index of the point whose plan won (this one when replanning won)
  size_t plan_moves = 0;        // moves in the winning plan
  double own_plan_iteration_us = 0;  // the plan made at this bandwidth, simulated here
};

// `base` gives the budget, the tiers (their bandwidths are the scale-1 point) and the planner
// options. Throws teraio::Error on bad options or when the planner refuses (a kernel's own tensors
// exceed the budget).
std::vector<SweepPoint> sweep_bandwidth(const Trace& trace, const PlannerOptions& base,
                                        const SweepOptions& opts = {});

// The fastest of make_plan_variants(trace, opts), each simulated (`iterations` iterations, on
// parallel threads) at the tiers' bandwidths; ties go to the earlier variant. With several tiers,
// the fastest plan that moves tensors to the first (most preferred) tier only is kept unless one
// using the others is more than 2% faster (Note [A second tier must pay for itself], sweep.cpp); so the result is never slower
// than make_plan's own plan in the simulator with one tier, and at most 2% slower than the fastest
// variant with several. Its `predicted` field is filled from that simulation.
// `runner_host_us_per_kernel` (SimOptions::runner_host_us_per_kernel: what the runner of the plan
// costs the host per kernel, a Session's measured stats()['runner_host_us_per_operator']) ranks the
// variants as that runner would run them (where the host bounds the step, a plan that recomputes
// more costs host time the runner's own time leaves no room for); `predicted` stays the replay
// without it, as `teraio simulate` gives by default.
struct BestPlan {
  Plan plan;
  std::string variant;            // the winner's name
  size_t variants = 0;            // how many were simulated
  double iteration_us = 0;        // the winner, simulated (as ranked: with the runner's host time)
  double default_iteration_us = 0;  // make_plan's plan, simulated (the same way)
};
BestPlan plan_best(const Trace& trace, const PlannerOptions& opts, int iterations = 2,
                   double runner_host_us_per_kernel = 0);

}  // namespace teraio
