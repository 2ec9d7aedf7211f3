// `teraio plan`: trace + GPU budget + tiers -> migration plan (docs/planner.md). Plans with
// teraio::make_plan, validates the plan with check_plan (an invalid plan is an internal error),
// predicts its iteration time with the simulator, writes the plan and prints a short summary.
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.h"
#include "planning_args.h"
#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/json_text.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/simulator.h"
#include "teraio/sweep.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

struct PlanArgs : PlanningArgs {
  std::string min_tensor = "1MiB";
  bool search = false;
  bool no_recompute = false;
  bool no_discard_dead = false;
  bool writebacks = false;
  bool deep_recompute = false;
  double runner_host_us = 0;
};

int run_plan(const PlanArgs& args) {
  const auto t0 = std::chrono::steady_clock::now();
  PlannerOptions opts;
  opts.budget_bytes = args.budget_bytes();
  opts.min_tensor_bytes = parse_size(args.min_tensor, "--min-tensor");
  opts.tiers = args.tier_specs();
  opts.recompute = !args.no_recompute;
  opts.discard_dead = !args.no_discard_dead;
  opts.writebacks = args.writebacks;
  opts.deep_recompute = args.deep_recompute;
  const Trace trace = read_trace(args.trace_path);
  const double read_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  PlannerStats stats;
  Plan plan = make_plan(trace, opts, &stats);
  std::string search_line;
  if (args.search) {  // keep the fastest variant in the simulator (make_plan's stats stay)
    BestPlan best = plan_best(trace, opts, 2, args.runner_host_us);
    search_line = fmt::format(
        "search               {} variants simulated, kept \"{}\": {} (make_plan's own plan: {}){}\n",
        best.variants, best.variant, format_us(best.iteration_us),
        format_us(best.default_iteration_us),
        args.runner_host_us > 0
            ? fmt::format(", replayed with the runner's {} us of host time a kernel", args.runner_host_us)
            : std::string());
    plan = std::move(best.plan);
  } else {
    SimOptions so;  // as the Session runs it (docs/simulator.md, "Issue order")
    so.runner_host_us_per_kernel = args.runner_host_us;
    plan = issue_in_deadline_order(trace, plan, so);
  }

  const Lifetimes lifetimes(trace);
  const PlanCheck check = check_plan(trace, lifetimes, plan);
  TERAIO_INTERNAL_ASSERT(
      check.valid, "the planner made an invalid plan for {}: {} problem(s), first: {}",
      args.trace_path, check.error_count, check.errors.empty() ? "" : check.errors.front());

  const SimResult sim = simulate(trace, plan);
  plan.predicted.iteration_us = sim.iteration_us;
  plan.predicted.ideal_us = sim.ideal_us;
  plan.predicted.stall_us = sim.stall_us;
  plan.predicted.peak_bytes = static_cast<double>(check.peak_bytes);

  // Bytes written per iteration: an idle persistent tensor's offload moves nothing in steady state,
  // nor does a clean one (Note [Clean offloads] in src/trace/plan_check.cpp) or a discard (Note [Dead
  // tensors] there).
  std::vector<uint64_t> tier_bytes(plan.tiers.size(), 0);
  size_t offload_only = 0;
  for (const MovePair& p : check.pairs) {
    if (!p.idle && !is_discard(trace, plan, p)) tier_bytes[p.tier] += p.bytes;
    offload_only += p.one_way();
  }
  for (size_t i = 0; i < plan.tiers.size(); ++i) {  // a writeback writes what its offload does not
    tier_bytes[i] += sim.tiers[i].writeback_bytes;
    tier_bytes[i] -= sim.tiers[i].clean_offload_bytes;
  }
  std::string tiers_json;
  for (size_t i = 0; i < plan.tiers.size(); ++i) {
    tiers_json += fmt::format("{}{}: {}", i ? ", " : "", json_quote(plan.tiers[i].name), tier_bytes[i]);
  }
  const std::string stats_json = fmt::format(
      "{{\"candidates\": {}, \"chosen\": {}, \"forced\": {}, \"peak_before_bytes\": {}, "
      "\"peak_after_bytes\": {}, "
      "\"plan_seconds\": {:.6f}, \"offload_bytes_per_tier\": {{{}}}{}{}{}}}",
      stats.candidates, stats.chosen, stats.forced, stats.peak_before_bytes, stats.peak_after_bytes,
      stats.plan_seconds, tiers_json,
      stats.offload_only ? fmt::format(", \"offload_only\": {}", stats.offload_only)
                         : std::string(),
      check.recomputes.empty()
          ? std::string()
          : fmt::format(", \"recomputes\": {}, \"recompute_us\": {}", check.recomputes.size(),
                        json_number(sim.recompute_us)),
      sim.discards ? fmt::format(", \"discards\": {}, \"discarded_bytes\": {}", sim.discards, sim.discarded_bytes)
                   : std::string());
  plan.extra.emplace_back("planner", stats_json);
  write_plan(plan, args.out_path);
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (args.json) {
    fmt::print(
        "{{\"plan\": {}, \"moves\": {}, \"budget_bytes\": {}, \"planned_peak_bytes\": {}, "
        "\"iteration_us\": {}, "
        "\"ideal_us\": {}, \"stall_us\": {}, \"floor_us\": {}, \"floor_bound\": {}, "
        "\"bytes_by_kind\": {}, "
        "\"read_seconds\": {:.6f}, \"total_seconds\": {:.6f}, \"planner\": {}}}\n",
        json_quote(args.out_path), plan.moves.size(), plan.budget_bytes, check.peak_bytes,
        json_number(sim.iteration_us), json_number(sim.ideal_us), json_number(sim.stall_us),
        json_number(sim.floor_us), json_quote(sim.floor_bound), bytes_by_kind_json(sim), read_s,
        total_s, stats_json);
    return 0;
  }
  fmt::print("plan                 {} ({} kernels, {} tensors)\n", args.out_path,
             trace.num_kernels(), trace.num_tensors());
  fmt::print("moves                {} pairs{}: {} hidden by bandwidth, {} forced (stall)\n",
             check.pairs.size() - offload_only,
             offload_only ? fmt::format(" and {} offloads without a prefetch", offload_only)
                          : std::string(),
             stats.chosen, stats.forced);
  if (!check.recomputes.empty()) {
    fmt::print("recompute            {} tensors per iteration, {} of producer time ({} freed)\n",
               check.recomputes.size(), format_us(sim.recompute_us),
               format_bytes(static_cast<double>(std::accumulate(
                   check.recomputes.begin(), check.recomputes.end(), uint64_t{0},
                   [](uint64_t a, const RecomputeMove& r) { return a + r.bytes; }))));
  }
  if (sim.discards) {
    fmt::print("discards             {} dead tensors per iteration freed without a write ({})\n",
               sim.discards, format_bytes(static_cast<double>(sim.discarded_bytes)));
  }
  for (size_t i = 0; i < plan.tiers.size(); ++i) {
    fmt::print(
        "  to {:<16} {} offloaded per iteration (peak held {}){}\n", plan.tiers[i].name,
        format_bytes(static_cast<double>(tier_bytes[i])),
        format_bytes(static_cast<double>(check.tier_peak_bytes[i])),
        sim.tiers[i].clean_offloads
            ? fmt::format("; {} clean offloads, {} not written", sim.tiers[i].clean_offloads,
                          format_bytes(static_cast<double>(sim.tiers[i].clean_offload_bytes)))
            : std::string());
  }
  fmt::print("peak                 {} planned, budget {}, {} without a plan\n",
             format_bytes(static_cast<double>(check.peak_bytes)),
             format_bytes(static_cast<double>(plan.budget_bytes)),
             format_bytes(static_cast<double>(stats.peak_before_bytes)));
  fmt::print("predicted            iteration {}, ideal {}, stall {} ({:.2f}%){}{}\n",
             format_us(sim.iteration_us), format_us(sim.ideal_us), format_us(sim.stall_us),
             sim.ideal_us > 0 ? 100.0 * sim.stall_us / sim.ideal_us : 0.0,
             sim.recomputes ? fmt::format(", recompute {}", format_us(sim.recompute_us)) : std::string(),
             trace.has_host_times() ? fmt::format(", waiting for the host {}", format_us(sim.host_wait_us))
                                    : std::string());
  fmt::print("moved per iteration  {}\n", bytes_by_kind_text(sim));
  fmt::print("floor                {} ({}); the prediction is {:.2f}x of it\n", format_us(sim.floor_us),
             sim.floor_bound, sim.floor_us > 0 ? sim.iteration_us / sim.floor_us : 0.0);
  fmt::print("{}", search_line);
  fmt::print("time                 planner {}, total {} (read {})\n",
             format_us(stats.plan_seconds * 1e6), format_us(total_s * 1e6),
             format_us(read_s * 1e6));
  return 0;
}

const Registration kPlan{{
    "plan",
    "Plan tensor migrations for a trace under a GPU memory budget",
    20,
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<PlanArgs>();
      add_planning_options(sub, *args);
      sub.add_option("--min-tensor", args->min_tensor,
                     "tensors smaller than this move only when nothing else fits the budget")
          ->capture_default_str();
      sub.add_flag("--search", args->search,
                   "plan with several settings of the heuristics (60 to 450 variants), simulate each, "
                   "keep the fastest; with recomputable tensors, the six fastest settings that "
                   "recompute are planned again with more and less recompute; variants are planned "
                   "and simulated on parallel threads");
      sub.add_flag("--no-recompute", args->no_recompute,
                   "plan moves only: recompute no tensor, even where the trace marks it recomputable");
      sub.add_flag("--no-discard-dead", args->no_discard_dead,
                   "plan for a runner that writes dead tensors out (a Session with discard_dead=False): "
                   "a tensor's tail after its last use then costs a write");
      sub.add_flag("--writebacks", args->writebacks,
                   "with --search, also try plans that write dirty tensors early, while they stay "
                   "resident (writeback moves; a Session's search tries them unless TERAIO_WRITEBACKS=0)");
      sub.add_flag("--deep-recompute", args->deep_recompute,
                   "recompute chains of any depth: inputs freed or dead at a recompute's point are made "
                   "there too (with --search, variants that do; a Session's search unless TERAIO_DEEP_RECOMPUTE=0)");
      sub.add_option("--runner-host-us", args->runner_host_us,
                     "host time in us the runner spends per kernel besides the trace's (a Session's "
                     "stats()['runner_host_us_per_operator']): the search ranks the plans, and the "
                     "issue order is chosen, as that runner runs them; `predicted` stays the replay "
                     "without it")
          ->check(CLI::Range(0.0, 1e9))
          ->capture_default_str();
      return [args] { return run_plan(*args); };
    },
}};

}  // namespace
}  // namespace teraio::cli
