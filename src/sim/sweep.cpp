// Bandwidth sweep (docs/simulator.md, "Bandwidth sweep"): replans at each bandwidth and reports
// the best of the plans made at this or a lower bandwidth, simulated here. A plan's validity does
// not depend on bandwidth, and the simulator never makes a fixed plan slower when bandwidth grows,
// so the best at one point is at least as fast at the next: the curve never goes down.
#include "teraio/sweep.h"

#include <cmath>

#include "teraio/error.h"
#include "teraio/simulator.h"

namespace teraio {

std::vector<SweepPoint> sweep_bandwidth(const Trace& trace, const PlannerOptions& base,
                                        const SweepOptions& opts) {
  TERAIO_CHECK(opts.steps >= 1 && opts.steps <= 1000, "sweep: steps must be in [1, 1000], got {}",
               opts.steps);
  TERAIO_CHECK(std::isfinite(opts.min_scale) && opts.min_scale > 0,
               "sweep: min scale must be > 0, got {}", opts.min_scale);
  TERAIO_CHECK(std::isfinite(opts.max_scale) && opts.max_scale >= opts.min_scale,
               "sweep: max scale ({}) must be >= min scale ({})", opts.max_scale, opts.min_scale);
  TERAIO_CHECK(!base.tiers.empty(), "sweep: no tiers to scale");

  std::vector<SweepPoint> points;
  std::vector<Plan> plans;  // plans[i] was made at point i
  for (int i = 0; i < opts.steps; ++i) {
    const double frac = opts.steps == 1 ? 0.0 : static_cast<double>(i) / (opts.steps - 1);
    const double scale = opts.min_scale * std::pow(opts.max_scale / opts.min_scale, frac);
    SweepPoint pt;
    pt.scale = scale;
    pt.tiers = base.tiers;
    for (TierSpec& t : pt.tiers) {
      t.read_gbps *= scale;
      t.write_gbps *= scale;
      t.duplex_gbps *= scale;
      pt.total_read_gbps += t.read_gbps;
      pt.total_write_gbps += t.write_gbps;
    }
    PlannerOptions popts = base;
    popts.tiers = pt.tiers;
    plans.push_back(make_plan(trace, popts));
    SimOptions sopts;
    sopts.actual_tiers = pt.tiers;
    sopts.iterations = opts.iterations;
    // Every plan made so far, simulated at this bandwidth; ties go to the most recent plan.
    SimResult winner;
    for (size_t j = plans.size(); j-- > 0;) {
      SimResult r = simulate(trace, plans[j], sopts);
      if (j + 1 == plans.size()) pt.own_plan_iteration_us = r.iteration_us;
      if (j + 1 == plans.size() || r.iteration_us < winner.iteration_us) {
        winner = std::move(r);
        pt.plan_point = j;
      }
    }
    pt.plan_moves = plans[pt.plan_point].moves.size();
    pt.iteration_us = winner.iteration_us;
    pt.ideal_us = winner.ideal_us;
    pt.stall_us = winner.stall_us;
    pt.percent_of_ideal =
        winner.iteration_us > 0 ? 100.0 * winner.ideal_us / winner.iteration_us : 100.0;
    points.push_back(std::move(pt));
  }
  return points;
}

BestPlan plan_best(const Trace& trace, const PlannerOptions& opts, int iterations) {
  std::vector<PlanVariant> variants = make_plan_variants(trace, opts);
  SimOptions so;
  so.iterations = iterations;
  BestPlan best;
  best.variants = variants.size();
  for (size_t i = 0; i < variants.size(); ++i) {
    // As the Session runs it (Note [Issue in deadline order]).
    variants[i].plan = issue_in_deadline_order(trace, variants[i].plan, so);
    const SimResult r = simulate(trace, variants[i].plan, so);
    if (i == 0) best.default_iteration_us = r.iteration_us;
    if (i == 0 || r.iteration_us < best.iteration_us) {
      best.iteration_us = r.iteration_us;
      best.variant = variants[i].name;
      best.plan = std::move(variants[i].plan);
      best.plan.predicted.iteration_us = r.iteration_us;
      best.plan.predicted.ideal_us = r.ideal_us;
      best.plan.predicted.stall_us = r.stall_us;
      best.plan.predicted.peak_bytes = static_cast<double>(r.peak_bytes);
    }
  }
  return best;
}

}  // namespace teraio
