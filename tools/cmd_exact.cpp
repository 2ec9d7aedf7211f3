// `teraio exact`: the exact (MILP) planner for small traces (docs/planner.md, "How good is the plan").
// Same inputs and output as `teraio plan`; also prints the proved bound and the greedy plan's
// simulated iteration for comparison. Meant for traces of up to a few hundred kernels.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.h"
#include "option_checks.h"
#include "planning_args.h"
#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/exact.h"
#include "teraio/json_text.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/simulator.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

struct ExactArgs : PlanningArgs {
  double time_limit_s = 60;
  bool no_warm_start = false;
};

int run_exact(const ExactArgs& args) {
  ExactOptions opts;
  opts.budget_bytes = args.budget_bytes();
  opts.tiers = args.tier_specs();
  opts.time_limit_s = args.time_limit_s;
  opts.warm_start_greedy = !args.no_warm_start;
  const Trace trace = read_trace(args.trace_path);

  ExactResult r = solve_exact(trace, opts);
  TERAIO_CHECK(r.has_solution, "exact: no plan found within the time limit of {} s (try a larger --time-limit)",
               args.time_limit_s);
  const Lifetimes lifetimes(trace);
  const PlanCheck check = check_plan(trace, lifetimes, r.plan);
  TERAIO_INTERNAL_ASSERT(check.valid, "the exact planner made an invalid plan for {}: {}", args.trace_path,
                         check.errors.empty() ? "" : check.errors.front());
  const SimResult sim = simulate(trace, r.plan);
  r.plan.predicted = {sim.iteration_us, sim.ideal_us, sim.stall_us, static_cast<double>(check.peak_bytes)};

  PlannerOptions popts;
  popts.budget_bytes = opts.budget_bytes;
  popts.tiers = opts.tiers;
  double greedy_us = -1;
  try {
    greedy_us = simulate(trace, make_plan(trace, popts)).iteration_us;
  } catch (const Error&) {
    // the greedy planner refused; the exact plan stands alone
  }
  const std::string stats = fmt::format(
      "{{\"optimal\": {}, \"model_stall_us\": {}, \"bound_stall_us\": {}, \"greedy_model_stall_us\": {}, "
      "\"greedy_iteration_us\": {}, \"columns\": {}, \"binaries\": {}, \"rows\": {}, \"solve_seconds\": {:.3f}}}",
      r.optimal, json_number(r.model_stall_us), json_number(r.bound_stall_us),
      json_number(r.greedy_model_stall_us), json_number(greedy_us), r.columns, r.binaries, r.rows, r.solve_seconds);
  r.plan.extra.emplace_back("exact", stats);
  write_plan(r.plan, args.out_path);
  if (args.json) {
    fmt::print("{{\"plan\": {}, \"moves\": {}, \"iteration_us\": {}, \"ideal_us\": {}, \"stall_us\": {}, "
               "\"exact\": {}}}\n",
               json_quote(args.out_path), r.plan.moves.size(), json_number(sim.iteration_us),
               json_number(sim.ideal_us), json_number(sim.stall_us), stats);
    return 0;
  }
  fmt::print("plan                 {} ({} kernels, {} tensors, {} moves)\n", args.out_path, trace.num_kernels(),
             trace.num_tensors(), r.plan.moves.size());
  fmt::print("program              {} columns ({} binary), {} rows, solved in {:.2f} s: {}\n", r.columns,
             r.binaries, r.rows, r.solve_seconds, r.optimal ? "optimal" : "time limit reached");
  fmt::print("slot-model stall     {} (proved lower bound {}{})\n", format_us(r.model_stall_us),
             format_us(r.bound_stall_us),
             r.greedy_model_stall_us >= 0 ? fmt::format(", greedy plan {}", format_us(r.greedy_model_stall_us))
                                          : std::string());
  fmt::print("simulated            iteration {}, ideal {}, stall {}\n", format_us(sim.iteration_us),
             format_us(sim.ideal_us), format_us(sim.stall_us));
  if (greedy_us >= 0) {
    fmt::print("greedy (teraio plan) iteration {} ({:+.2f}% vs exact)\n", format_us(greedy_us),
               100.0 * (greedy_us - sim.iteration_us) / sim.iteration_us);
  }
  return 0;
}

const Registration kExact{{
    "exact",
    "Plan a small trace exactly (MILP with GLPK) and compare with the greedy planner",
    25,
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<ExactArgs>();
      add_planning_options(sub, *args);
      sub.add_option("--time-limit", args->time_limit_s, "seconds for the solver; the best plan so far is kept")
          ->capture_default_str()
          ->check(positive_at_most(1e6));
      sub.add_flag("--no-warm-start", args->no_warm_start, "do not seed the solver with the greedy plan");
      return [args] { return run_exact(*args); };
    },
}};

}  // namespace
}  // namespace teraio::cli
