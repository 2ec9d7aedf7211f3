// `teraio study gap|sensitivity`: the planner-quality studies of docs/planner.md ("How good is the
// plan"), reproducible by one command. `gap` generates small instances, plans each with the greedy
// planner and the exact solver and simulates both; `sensitivity` plans synthetic traces with wrong
// bandwidths or noisy kernel times and simulates the plans against the truth.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.h"
#include "option_checks.h"
#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/exact.h"
#include "teraio/json_text.h"
#include "teraio/output_file.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/simulator.h"
#include "teraio/synth.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

// Budget between the largest kernel's own bytes (fraction 0) and the unplanned peak (fraction 1).
uint64_t budget_between(const Trace& trace, double fraction) {
  const Lifetimes lifetimes(trace);
  const std::vector<uint64_t> curve = memory_curve(trace, lifetimes);
  const std::vector<uint64_t> active = active_bytes(trace);
  const double lo = static_cast<double>(*std::max_element(active.begin(), active.end()));
  const double hi = static_cast<double>(*std::max_element(curve.begin(), curve.end()));
  return static_cast<uint64_t>(lo + fraction * (hi - lo));
}

void write_json(const std::string& path, const std::string& text) {
  if (!path.empty()) write_file_atomically(path, text);
}

// The --tier specs as a JSON array of strings.
std::string tier_specs_json(const std::vector<std::string>& specs) {
  std::string out;
  for (const std::string& t : specs) out += (out.empty() ? "" : ", ") + json_quote(t);
  return out;
}

std::string num(double v) { return json_number(v); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct GapArgs {
  int instances = 24;
  uint64_t seed = 1;
  double time_limit_s = 30;
  std::vector<std::string> tiers = {"ssd:1TiB:6.5:6.5", "host:1GiB:25:25"};
  std::vector<double> fractions = {0.5, 0.25};
  int max_layers = 4;
  int first_index = 0;
  bool recompute = false;
  std::string json_path;
};

int run_gap(const GapArgs& args) {
  TERAIO_CHECK(!args.fractions.empty(), "study gap: --budget-fractions needs at least one value");
  const std::vector<TierSpec> tiers = parse_tier_specs(args.tiers);
  fmt::print("| # | seed | kernels | tensors | budget | ideal | greedy | exact | bound | gap vs exact | gap vs bound "
             "| solver |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string rows;
  std::vector<double> gaps, bound_gaps;
  int greedy_optimal = 0, proved = 0, exact_worse = 0;
  for (int i = args.first_index; i < args.first_index + args.instances; ++i) {
    const uint64_t seed = args.seed + static_cast<uint64_t>(i);
    SmallInstanceOptions iopts;
    iopts.layers = 1 + static_cast<uint32_t>(i % args.max_layers);
    iopts.recompute = args.recompute;
    const Trace trace = small_instance(seed, iopts);
    const double fraction = args.fractions[static_cast<size_t>(i / args.max_layers) % args.fractions.size()];
    const uint64_t budget = budget_between(trace, fraction);

    PlannerOptions popts;
    popts.budget_bytes = budget;
    popts.tiers = tiers;
    const Plan greedy = make_plan(trace, popts);
    const SimResult gs = simulate(trace, greedy);
    ExactOptions eopts;
    eopts.budget_bytes = budget;
    eopts.tiers = tiers;
    eopts.time_limit_s = args.time_limit_s;
    const ExactResult ex = solve_exact(trace, eopts);
    TERAIO_CHECK(ex.has_solution, "study gap: instance {} (seed {}): no exact plan within {} s", i, seed,
                 args.time_limit_s);
    const Lifetimes lifetimes(trace);
    TERAIO_INTERNAL_ASSERT(check_plan(trace, lifetimes, ex.plan).valid, "exact plan invalid (seed {})", seed);
    const SimResult es = simulate(trace, ex.plan);
    const double bound_us = gs.ideal_us + ex.bound_stall_us;
    const double gap = 100.0 * (gs.iteration_us - es.iteration_us) / es.iteration_us;
    const double bound_gap = 100.0 * (gs.iteration_us - bound_us) / bound_us;
    gaps.push_back(gap);
    bound_gaps.push_back(bound_gap);
    if (gs.iteration_us <= es.iteration_us * (1 + 1e-6)) ++greedy_optimal;
    if (es.iteration_us > gs.iteration_us * (1 + 1e-6)) ++exact_worse;
    if (ex.optimal) ++proved;
    fmt::print("| {} | {} | {} | {} | {:.0f}% | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:+.2f}% | {:+.2f}% | {} |\n", i,
               seed, trace.num_kernels(), trace.num_tensors(), 100 * fraction, gs.ideal_us / 1e3,
               gs.iteration_us / 1e3, es.iteration_us / 1e3, bound_us / 1e3, gap, bound_gap,
               (ex.optimal ? fmt::format("optimal {:.1f} s", ex.solve_seconds)
                           : fmt::format("limit, model gap {:.1f}%",
                                        ex.model_stall_us > 0
                                            ? 100 * (ex.model_stall_us - ex.bound_stall_us) / ex.model_stall_us
                                            : 0.0)) +
                   (args.recompute ? fmt::format("; recomputes {} / {}", gs.recomputes, es.recomputes) : std::string()));
    flush_stdout();
    rows += fmt::format(
        "{}{{\"seed\": {}, \"layers\": {}, \"kernels\": {}, \"tensors\": {}, \"budget_fraction\": {}, "
        "\"budget_bytes\": {}, \"ideal_us\": {}, \"greedy_iteration_us\": {}, \"exact_iteration_us\": {}, "
        "\"bound_iteration_us\": {}, \"greedy_model_stall_us\": {}, \"exact_model_stall_us\": {}, "
        "\"bound_stall_us\": {}, \"optimal\": {}, \"solve_seconds\": {:.3f}, \"gap_percent\": {}, "
        "\"bound_gap_percent\": {}, \"greedy_moves\": {}, \"exact_moves\": {}, \"greedy_recomputes\": {}, "
        "\"exact_recomputes\": {}}}",
        rows.empty() ? "" : ",\n  ", seed, iopts.layers, trace.num_kernels(), trace.num_tensors(), num(fraction),
        budget, num(gs.ideal_us), num(gs.iteration_us), num(es.iteration_us), num(bound_us),
        num(ex.greedy_model_stall_us), num(ex.model_stall_us), num(ex.bound_stall_us), ex.optimal, ex.solve_seconds,
        num(gap), num(bound_gap), greedy.moves.size(), ex.plan.moves.size(), gs.recomputes, es.recomputes);
  }
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / static_cast<double>(gaps.size());
  const double bmean =
      std::accumulate(bound_gaps.begin(), bound_gaps.end(), 0.0) / static_cast<double>(bound_gaps.size());
  const std::string summary = fmt::format(
      "{{\"instances\": {}, \"mean_gap_percent\": {}, \"median_gap_percent\": {}, \"max_gap_percent\": {}, "
      "\"mean_bound_gap_percent\": {}, \"median_bound_gap_percent\": {}, \"max_bound_gap_percent\": {}, "
      "\"greedy_optimal\": {}, \"exact_slower\": {}, \"proved_optimal\": {}}}",
      gaps.size(), num(mean), num(median(gaps)), num(*std::max_element(gaps.begin(), gaps.end())), num(bmean),
      num(median(bound_gaps)), num(*std::max_element(bound_gaps.begin(), bound_gaps.end())), greedy_optimal,
      exact_worse, proved);
  fmt::print("\ngap vs exact (simulated): mean {:+.2f}%, median {:+.2f}%, max {:+.2f}%; greedy as fast as exact on "
             "{}/{}; exact plan slower in simulation on {}\n",
             mean, median(gaps), *std::max_element(gaps.begin(), gaps.end()), greedy_optimal, gaps.size(),
             exact_worse);
  fmt::print("gap vs bound: mean {:+.2f}%, median {:+.2f}%, max {:+.2f}%; solver proved optimality on {}/{}\n", bmean,
             median(bound_gaps), *std::max_element(bound_gaps.begin(), bound_gaps.end()), proved, gaps.size());
  write_json(args.json_path,
             fmt::format("{{\"study\": \"gap\", \"seed\": {}, \"time_limit_s\": {}, \"tiers\": [{}],\n \"summary\": "
                         "{},\n \"instances\": [\n  {}\n]}}\n",
                         args.seed, num(args.time_limit_s), tier_specs_json(args.tiers), summary, rows));
  return 0;
}

struct SensArgs {
  std::string model = "tiny";
  std::vector<std::string> tiers = {"ssd:1TiB:1.7:1.7", "host:8GiB:12:12"};
  std::vector<double> fractions = {0.5, 0.25};
  std::vector<double> scales = {0.7, 0.85, 1.0, 1.15, 1.3};
  double noise = 0.1;
  int noise_seeds = 5;
  std::string json_path;
};

int run_sensitivity(const SensArgs& args) {
  TERAIO_CHECK(!args.scales.empty() && !args.fractions.empty(), "study sensitivity: empty --scales or --budget-fractions");
  SynthOptions sopts;
  sopts.model = args.model;
  const Trace trace = synthesize(sopts);
  const std::vector<TierSpec> truth = parse_tier_specs(args.tiers);
  const Lifetimes lifetimes(trace);
  const std::vector<uint64_t> curve = memory_curve(trace, lifetimes);
  const uint64_t peak = *std::max_element(curve.begin(), curve.end());
  fmt::print("trace: synth {} ({} kernels, {} tensors, ideal {}, peak {})\n\n", args.model, trace.num_kernels(),
             trace.num_tensors(), format_us(trace.total_time_us()), format_bytes(static_cast<double>(peak)));
  std::string rows;
  for (double fraction : args.fractions) {
    const std::vector<uint64_t> active = active_bytes(trace);
    const uint64_t floor = *std::max_element(active.begin(), active.end());
    const uint64_t budget = std::max(floor, static_cast<uint64_t>(fraction * static_cast<double>(peak)));
    PlannerOptions popts;
    popts.budget_bytes = budget;
    SimOptions at_truth;
    at_truth.actual_tiers = truth;
    popts.tiers = truth;
    const double true_us = simulate(trace, make_plan(trace, popts), at_truth).iteration_us;
    fmt::print("budget {} ({:.0f}% of peak); plan made at the true bandwidth: {} ({:.1f}% of ideal)\n\n",
               format_bytes(static_cast<double>(budget)), 100 * fraction, format_us(true_us),
               100 * trace.total_time_us() / true_us);
    fmt::print("| bandwidth assumed | iteration at true bandwidth | vs plan at truth | % of ideal |\n|---|---|---|---|\n");
    for (double s : args.scales) {
      popts.tiers = truth;
      for (TierSpec& t : popts.tiers) {
        t.read_gbps *= s;
        t.write_gbps *= s;
        t.duplex_gbps *= s;
      }
      const double us = simulate(trace, make_plan(trace, popts), at_truth).iteration_us;
      fmt::print("| x{:.2f} | {} | {:+.2f}% | {:.1f}% |\n", s, format_us(us), 100 * (us - true_us) / true_us,
                 100 * trace.total_time_us() / us);
      rows += fmt::format("{}{{\"budget_fraction\": {}, \"budget_bytes\": {}, \"kind\": \"bandwidth\", \"scale\": {}, "
                          "\"iteration_us\": {}, \"truth_plan_iteration_us\": {}, \"ideal_us\": {}}}",
                          rows.empty() ? "" : ",\n  ", num(fraction), budget, num(s), num(us), num(true_us),
                          num(trace.total_time_us()));
    }
    if (args.noise_seeds > 0 && args.noise > 0) {
      std::vector<double> deltas;
      popts.tiers = truth;
      for (int seed = 1; seed <= args.noise_seeds; ++seed) {
        // Each kernel time off by a uniform factor in [1 - noise, 1 + noise]: a stand-in for a
        // short profile whose per-kernel times have not averaged out.
        Trace noisy = trace;
        std::mt19937_64 rng(static_cast<uint64_t>(seed));
        for (KernelIndex k = 0; k < noisy.num_kernels(); ++k) {
          const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
          noisy.set_kernel_time_us(k, trace.kernel_time_us(k) * (1 + args.noise * (2 * u - 1)));
        }
        const double us = simulate(trace, make_plan(noisy, popts), at_truth).iteration_us;
        deltas.push_back(100 * (us - true_us) / true_us);
        rows += fmt::format("{}{{\"budget_fraction\": {}, \"budget_bytes\": {}, \"kind\": \"time_noise\", \"noise\": {}, "
                            "\"seed\": {}, \"iteration_us\": {}, \"truth_plan_iteration_us\": {}, \"ideal_us\": {}}}",
                            rows.empty() ? "" : ",\n  ", num(fraction), budget, num(args.noise), seed, num(us),
                            num(true_us), num(trace.total_time_us()));
      }
      fmt::print("\nkernel times off by up to ±{:.0f}% ({} seeds): iteration vs plan at truth mean {:+.2f}%, "
                 "min {:+.2f}%, max {:+.2f}%\n\n",
                 100 * args.noise, deltas.size(),
                 std::accumulate(deltas.begin(), deltas.end(), 0.0) / static_cast<double>(deltas.size()),
                 *std::min_element(deltas.begin(), deltas.end()), *std::max_element(deltas.begin(), deltas.end()));
    }
  }
  write_json(args.json_path, fmt::format("{{\"study\": \"sensitivity\", \"model\": {}, \"tiers\": [{}],\n "
                                         "\"rows\": [\n  {}\n]}}\n",
                                         json_quote(args.model), tier_specs_json(args.tiers), rows));
  return 0;
}

const Registration kStudy{{
    "study",
    "Measure the planner: gap to the exact solver, sensitivity to bandwidth and kernel-time errors",
    90,
    [](CLI::App& sub) -> std::function<int()> {
      sub.require_subcommand(1);
      auto gap = std::make_shared<GapArgs>();
      CLI::App* g = sub.add_subcommand("gap", "greedy vs exact (MILP) on small generated instances, simulated");
      g->add_option("--instances", gap->instances, "number of instances (seeds seed..seed+N-1)")
          ->capture_default_str()
          ->check(in_range(1, 10000));
      g->add_option("--seed", gap->seed, "first seed")->capture_default_str();
      g->add_option("--time-limit", gap->time_limit_s, "solver seconds per instance")
          ->capture_default_str()
          ->check(positive_at_most(1e6));
      g->add_option("--tier", gap->tiers, "a tier spec with bandwidths, as teraio plan's --tier; repeat")->capture_default_str();
      g->add_option("--budget-fractions", gap->fractions,
                    "budgets between the largest kernel (0) and the unplanned peak (1), next one every --max-layers instances")
          ->capture_default_str()
          ->delimiter(',')
          ->check(in_range(0.0, 1.0));
      g->add_option("--first-index", gap->first_index,
                    "index of the first instance (runs instances first..first+N-1; for running slices in parallel)")
          ->capture_default_str()
          ->check(in_range(0, 1'000'000'000));
      g->add_option("--max-layers", gap->max_layers, "instance i has 1 + i % max-layers layers (7L+1 kernels)")
          ->capture_default_str()
          ->check(in_range(1, 10));
      g->add_flag("--recompute", gap->recompute,
                  "instances with recomputable activations (6L+1 kernels): greedy and exact may recompute");
      g->add_option("--json", gap->json_path, "also write every number to this JSON file");
      auto sens = std::make_shared<SensArgs>();
      CLI::App* s = sub.add_subcommand("sensitivity", "plan with wrong bandwidths / noisy kernel times, simulate at truth");
      s->add_option("--model", sens->model, "synthetic model (teraio synth)")->capture_default_str();
      s->add_option("--tier", sens->tiers, "the true tiers: tier specs with bandwidths, as teraio plan's --tier; repeat")
          ->capture_default_str();
      s->add_option("--budget-fractions", sens->fractions, "budgets as fractions of the unplanned peak")
          ->capture_default_str()
          ->delimiter(',')
          ->check(positive_at_most(1.0));
      s->add_option("--scales", sens->scales, "bandwidth factors the planner assumes")
          ->capture_default_str()
          ->delimiter(',')
          ->check(positive_at_most(1e6));
      s->add_option("--noise", sens->noise, "kernel-time error: each time x uniform(1-noise, 1+noise)")
          ->capture_default_str()
          ->check(must_be<double>([](double v) { return v >= 0 && v < 1; }, "in [0, 1)"));
      s->add_option("--noise-seeds", sens->noise_seeds, "noisy profiles per budget (0 = skip)")
          ->capture_default_str()
          ->check(in_range(0, 1000));
      s->add_option("--json", sens->json_path, "also write every number to this JSON file");
      return [g, s, gap, sens] {
        if (g->parsed()) return run_gap(*gap);
        if (s->parsed()) return run_sensitivity(*sens);
        return 2;
      };
    },
}};

}  // namespace
}  // namespace teraio::cli
