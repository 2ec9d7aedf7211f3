// Planner benchmark (docs/planner.md, docs/benchmarks.md "Planner"): times trace parsing plus
// make_plan over repeated runs (median, min, max), and compares the planner's tuning variants by
// the simulator's predicted stall on the same trace.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "planner_tuning.h"
#include "summary.h"
#include "teraio/error.h"
#include "teraio/simulator.h"
#include "teraio/synth.h"
#include "teraio/units.h"

namespace {

using namespace teraio;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using teraio::bench::Summary;
using teraio::bench::summarize;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"planner_bench: time teraio's planner and compare its tuning variants"};
  std::string trace_path, model, budget = "87GiB", min_tensor = "1MiB";
  std::vector<std::string> tier_specs;
  int runs = 5;
  bool compare = false;
  double slack = -1;
  bool skip_clip = false;
  app.add_option("--trace", trace_path, "trace file (timed with parsing)");
  app.add_option("--model", model, "or synthesize this model (teraio synth --model) into TRACE first");
  app.add_option("--budget", budget)->capture_default_str();
  app.add_option("--tier", tier_specs, "NAME:CAPACITY:READ:WRITE (default ssd:8TiB:16:16 host:128GiB:50:50)");
  app.add_option("--min-tensor", min_tensor)->capture_default_str();
  app.add_option("--runs", runs)->capture_default_str();
  app.add_flag("--compare", compare, "plan with each tuning variant and simulate it");
  app.add_flag("--skip-clip", skip_clip, "leave the (slow, O(window)) clipped-benefit variant out of --compare");
  app.add_option("--slack", slack, "override PlannerTuning::lazy_slack");
  CLI11_PARSE(app, argc, argv);
  planner_detail::PlannerTuning base;
  if (slack >= 0) base.lazy_slack = slack;
  try {
    if (!model.empty()) {
      SynthOptions so;
      so.model = model;
      write_trace(synthesize(so), trace_path);
    }
    PlannerOptions opts;
    opts.budget_bytes = parse_size(budget, "--budget");
    opts.min_tensor_bytes = parse_size(min_tensor, "--min-tensor");
    if (tier_specs.empty()) tier_specs = {"ssd:8TiB:16:16", "host:128GiB:50:50"};
    for (const auto& s : tier_specs) opts.tiers.push_back(parse_tier_spec(s));

    std::vector<double> total_s, plan_s, read_s, cpu_s;
    planner_detail::PlannerDiagnostics diag;
    PlannerStats stats;
    Trace trace;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = Clock::now();
      const std::clock_t c0 = std::clock();
      trace = read_trace(trace_path);
      read_s.push_back(seconds_since(t0));
      planner_detail::make_plan_tuned(trace, opts, base, &stats, &diag);
      total_s.push_back(seconds_since(t0));
      cpu_s.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
      plan_s.push_back(stats.plan_seconds);
    }
    const Summary t = summarize(total_s), p = summarize(plan_s), rd = summarize(read_s), cpu = summarize(cpu_s);
    fmt::print("trace {}: {} kernels, {} tensors; budget {}; {} runs\n", trace_path, trace.num_kernels(),
               trace.num_tensors(), format_bytes(static_cast<double>(opts.budget_bytes)), runs);
    fmt::print("read+plan  median {:.3f} s  min {:.3f}  max {:.3f}\n", t.median, t.min, t.max);
    fmt::print("read+plan  CPU median {:.3f} s  min {:.3f}  max {:.3f}\n", cpu.median, cpu.min, cpu.max);
    fmt::print("plan       median {:.3f} s  min {:.3f}  max {:.3f}\n", p.median, p.min, p.max);
    fmt::print("read       median {:.3f} s  min {:.3f}  max {:.3f}\n", rd.median, rd.min, rd.max);
    fmt::print("phases (last run): setup {:.3f} greedy {:.3f} force {:.3f} finish {:.3f} s; rescores {}\n",
               diag.setup_seconds, diag.greedy_seconds, diag.force_seconds, diag.finish_seconds, diag.rescores);
    fmt::print("candidates {}, ", stats.candidates);
    fmt::print("pairs: {} chosen, {} forced; {} moved; pruned {}, hoisted {}, offloads due later {}\n",
               stats.chosen, stats.forced, format_bytes(static_cast<double>(diag.bytes_offloaded)), diag.pruned,
               diag.hoisted, diag.offloads_due_later);

    if (compare) {
      struct Variant {
        const char* name;
        planner_detail::PlannerTuning tuning;
      };
      std::vector<Variant> variants;
      variants.push_back({"default (unclipped, per byte, prune, hoist)", {}});
      planner_detail::PlannerTuning v;
      v.clip_benefit = true;
      if (!skip_clip) variants.push_back({"clipped benefit", v});
      v = {};
      v.cost_per_time = true;
      variants.push_back({"cost = transfer time", v});
      v = {};
      v.hoist_prefetch = false;
      variants.push_back({"no hoisting", v});
      for (double s : {0.0, 0.03, 0.25}) {
        v = {};
        v.lazy_slack = s;
        variants.push_back({s == 0 ? "lazy slack 0 (exact greedy order)" : (s < 0.1 ? "lazy slack 0.03" : "lazy slack 0.25"), v});
      }
      v = {};
      v.prune = false;
      v.hoist_prefetch = false;
      variants.push_back({"no prune, no hoisting", v});
      fmt::print("\n{:<44} {:>8} {:>8} {:>12} {:>12} {:>12} {:>9}\n", "variant", "pairs", "forced", "moved",
                 "plan est.", "sim stall", "plan s");
      for (const Variant& var : variants) {
        PlannerStats st;
        planner_detail::PlannerDiagnostics d;
        const Plan plan = planner_detail::make_plan_tuned(trace, opts, var.tuning, &st, &d);
        const SimResult sim = simulate(trace, plan);
        fmt::print("{:<44} {:>8} {:>8} {:>12} {:>12} {:>12} {:>9.3f}\n", var.name, st.chosen + st.forced, st.forced,
                   format_bytes(static_cast<double>(d.bytes_offloaded)), format_us(d.estimated_stall_us),
                   format_us(sim.stall_us), st.plan_seconds);
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "planner_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
