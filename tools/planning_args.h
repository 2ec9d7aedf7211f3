// The arguments `teraio plan` and `teraio exact` share — the trace, the budget, the tiers, the plan
// to write and --json — defined once so the two commands cannot drift apart.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "budget.h"
#include "teraio/plan.h"
#include "teraio/units.h"

namespace teraio::cli {

// The --tier help of every planning command: the tier specs of teraio/tier_args.h, bandwidths
// required (the planner cannot measure a tier).
inline constexpr const char* kPlanningTierHelp =
    "[NAME=]host:CAPACITY:READ_GBPS:WRITE_GBPS[:BOTH_GBPS], "
    "[NAME=]file:DIR[,DIR...]:CAPACITY:READ_GBPS:WRITE_GBPS[:BOTH_GBPS] "
    "or NAME:CAPACITY:READ_GBPS:WRITE_GBPS[:BOTH_GBPS], e.g. ssd:2TiB:6.5:6.5 (BOTH_GBPS: per "
    "direction while reads and writes move at once); repeat or separate with commas, "
    "most preferred first";

struct PlanningArgs {
  std::string trace_path;
  std::string budget;
  std::vector<std::string> tiers;
  std::string out_path;
  bool json = false;
  bool session_budget = false;

  // --session-budget: the planner's budget of a CUDA Session given --budget, from the Session's
  // own policy (Note [Budget policy] in src/runtime/budget.h), without the untracked bytes, which
  // are only measured on the GPU.
  uint64_t budget_bytes() const {
    const uint64_t b = parse_size(budget, "--budget");
    if (!session_budget) return b;
    runtime::BudgetPolicy policy;
    policy.budget_bytes = b;
    policy.device_margin = true;
    return policy.planner_budget_bytes();
  }
  std::vector<TierSpec> tier_specs() const { return parse_tier_specs(tiers); }
};

inline void add_planning_options(CLI::App& sub, PlanningArgs& a) {
  sub.add_option("trace", a.trace_path, "trace file (teraio.trace JSON)")->required();
  sub.add_option("--budget", a.budget, "GPU memory for tensors, e.g. 40GiB")->required();
  sub.add_option("--tier", a.tiers,
                 kPlanningTierHelp)
      ->required();
  sub.add_option("-o,--output", a.out_path, "plan file to write (teraio.plan JSON)")->required();
  sub.add_flag("--json", a.json, "print the summary as one JSON object");
  sub.add_flag("--session-budget", a.session_budget,
               "--budget is what a CUDA Session is given: plan for what that Session plans for, "
               "the budget less its margin of 1/32 (the untracked bytes it measures are not known "
               "here)");
}

}  // namespace teraio::cli
