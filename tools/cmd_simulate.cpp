// `teraio simulate` (docs/simulator.md): replays a plan over its trace with the discrete-event
// simulator and prints iteration, stall, overlap and per-tier traffic; with --sweep-bandwidth,
// replans at a range of bandwidths (the paper's Figure 3 roofline) through teraio::sweep_bandwidth.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.h"
#include "option_checks.h"
#include "teraio/json_text.h"
#include "teraio/error.h"
#include "teraio/output_file.h"
#include "teraio/simulator.h"
#include "teraio/sweep.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

struct SimulateArgs {
  std::string trace_path;
  std::string plan_path;
  bool json = false;
  std::vector<std::string> tier_bandwidths;
  int iterations = 2;
  bool sweep = false;
  double sweep_min = SweepOptions{}.min_scale;
  double sweep_max = SweepOptions{}.max_scale;
  int sweep_steps = SweepOptions{}.steps;
  std::string min_tensor = "1MiB";
  std::string link_order = "issue";
  double runner_host_us = 0;
  double recompute_host_us = 0;
  bool reorder = false;
  std::string timeline_path;
};

// --timeline: the last simulated iteration as a teraio.timeline JSON file (docs/formats.md,
// "Timeline files"): each kernel's start and time, each transfer's link, span, bytes and tensor.
std::string timeline_json(const Trace& trace, const Plan& plan, const std::vector<TierSpec>& tiers,
                          const SimResult& r) {
  std::string out;
  out.reserve(64 * (trace.num_kernels() + r.transfers.size()) + 256);
  out += fmt::format(
      "{{\"format\": \"teraio.timeline\", \"version\": 1, \"iteration_us\": {}, "
      "\"last_iteration_us\": {}, \"ideal_us\": {}, \"stall_us\": {}, \"recompute_us\": {}, "
      "\"host_wait_us\": {},\n"
      "\"kernels\": [",
      json_number(r.iteration_us), json_number(r.last_iteration_us), json_number(r.ideal_us),
      json_number(r.stall_us), json_number(r.recompute_us), json_number(r.host_wait_us));
  for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
    out += fmt::format("{}\n{{\"name\": {}, \"start_us\": {}, \"time_us\": {}}}", k ? "," : "",
                       json_quote(trace.kernel_name(k)), json_number(r.kernel_start_us[k]),
                       json_number(trace.kernel_time_us(k)));
  }
  out += "],\n\"transfers\": [";
  for (size_t i = 0; i < r.transfers.size(); ++i) {
    const SimTransfer& x = r.transfers[i];
    const Move& m = plan.moves[x.move];
    const TensorInfo& t = trace.tensors[m.tensor];
    out += fmt::format(
        "{}\n{{\"tier\": {}, \"direction\": \"{}\", \"op\": \"{}\", \"urgent\": {}, "
        "\"begin_us\": {}, \"end_us\": {}, \"bytes\": {}, \"move\": {}, \"tensor\": {}, "
        "\"kind\": \"{}\", \"name\": {}}}",
        i ? "," : "", json_quote(tiers[x.tier].name), x.offload ? "write" : "read", to_string(m.op),
        x.urgent ? "true" : "false", json_number(x.begin_us), json_number(x.end_us), x.bytes, x.move,
        m.tensor, to_string(t.kind), json_quote(t.name));
  }
  out += "]}\n";
  return out;
}


// Applies NAME:READ_GBPS:WRITE_GBPS[:BOTH_GBPS] overrides to a copy of the plan's tiers. Without
// BOTH_GBPS the tier keeps the plan's both-ways bandwidth; 0 makes its directions independent.
std::vector<TierSpec> apply_bandwidths(std::vector<TierSpec> tiers,
                                       const std::vector<std::string>& specs) {
  for (const std::string& spec : specs) {
    const std::vector<std::string_view> f = split_fields(spec, ':');
    TERAIO_CHECK(f.size() == 3 || f.size() == 4,
                 "--tier-bandwidth \"{}\": expected NAME:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]", spec);
    bool found = false;
    for (TierSpec& t : tiers) {
      if (t.name != f[0]) continue;
      t.read_gbps = parse_positive_double(f[1], "--tier-bandwidth read");
      t.write_gbps = parse_positive_double(f[2], "--tier-bandwidth write");
      if (f.size() == 4)
        t.duplex_gbps = f[3] == "0" ? 0 : parse_positive_double(f[3], "--tier-bandwidth both-ways");
      found = true;
    }
    TERAIO_CHECK(found, "--tier-bandwidth \"{}\": the plan has no tier named \"{}\"", spec, f[0]);
  }
  return tiers;
}

double pct(double part, double whole) {
  return whole > 0 ? 100.0 * part / whole : 0.0;
}

void print_result(const SimulateArgs& args, const Trace& trace, const Plan& plan,
                  const std::vector<TierSpec>& tiers, const SimResult& r) {
  // Note [The host lane] in src/sim/simulator.cpp
  const bool host_reported = trace.has_host_times() || args.runner_host_us > 0;
  if (args.json) {
    std::string tiers_json;
    for (size_t i = 0; i < tiers.size(); ++i) {
      const TierTraffic& t = r.tiers[i];
      tiers_json += fmt::format(
          "{}{{\"name\": {}, \"offload_bytes\": {}, \"prefetch_bytes\": {}, \"write_busy_us\": {}, "
          "\"read_busy_us\": {}{}}}",
          i ? ", " : "", json_quote(tiers[i].name), t.offload_bytes, t.prefetch_bytes,
          json_number(t.write_busy_us), json_number(t.read_busy_us),
          trace.writes_recorded
              ? fmt::format(", \"clean_offloads\": {}, \"clean_offload_bytes\": {}, \"writebacks\": {}, "
                            "\"writeback_bytes\": {}",
                            t.clean_offloads, t.clean_offload_bytes, t.writebacks, t.writeback_bytes)
              : std::string());
    }
    fmt::print(
        "{{\"iteration_us\": {}, \"ideal_us\": {}, \"stall_us\": {}, \"overlap_us\": {}, "
        "\"peak_bytes\": {}, "
        "\"tiers\": [{}], \"urgent_fetches\": {}, \"floor_us\": {}, \"floor_bound\": {}, "
        "\"bytes_by_kind\": {}{}{}{}{}}}\n",
        json_number(r.iteration_us), json_number(r.ideal_us), json_number(r.stall_us),
        json_number(r.overlap_us), r.peak_bytes, tiers_json, r.urgent_fetches,
        json_number(r.floor_us), json_quote(r.floor_bound), bytes_by_kind_json(r),
        r.recomputes ? fmt::format(", \"recomputes\": {}, \"recompute_us\": {}", r.recomputes,
                                   json_number(r.recompute_us))
                     : std::string(),
        trace.writes_recorded
            ? fmt::format(", \"clean_offloads\": {}, \"clean_offload_bytes\": {}, "
                          "\"writebacks\": {}, \"writeback_bytes\": {}",
                          r.clean_offloads, r.clean_offload_bytes, r.writebacks, r.writeback_bytes)
            : std::string(),
        plan.discard_dead ? fmt::format(", \"discards\": {}, \"discarded_bytes\": {}", r.discards,
                                        r.discarded_bytes)
                          : std::string(),
        host_reported ? fmt::format(", \"host_us\": {}, \"host_wait_us\": {}, \"recompute_host_us\": {}",
                                    json_number(r.host_us), json_number(r.host_wait_us),
                                    json_number(r.recompute_host_us))
                      : std::string());
    return;
  }
  fmt::print("trace                {} ({} kernels, {} tensors)\n", args.trace_path,
             trace.num_kernels(), trace.num_tensors());
  fmt::print("plan                 {} ({} moves)\n", args.plan_path, plan.moves.size());
  fmt::print("iteration            {}  (mean of {} simulated; last alone {})\n",
             format_us(r.iteration_us), args.iterations, format_us(r.last_iteration_us));
  fmt::print("ideal                {}\n", format_us(r.ideal_us));
  fmt::print("stall                {}  ({:.2f}% of ideal)\n", format_us(r.stall_us),
             pct(r.stall_us, r.ideal_us));
  if (host_reported) {
    fmt::print("host                 {} per iteration ({} of it the recomputes'); the stream "
               "waited {} for launches\n",
               format_us(r.host_us), format_us(r.recompute_host_us), format_us(r.host_wait_us));
  }
  if (r.recomputes) {
    fmt::print("recompute            {}  ({} recomputes per iteration, {:.2f}% of ideal)\n",
               format_us(r.recompute_us), r.recomputes, pct(r.recompute_us, r.ideal_us));
  }
  fmt::print("overlap              {}  (transfer time hidden behind kernels, all links)\n",
             format_us(r.overlap_us));
  fmt::print("speed                {:.2f}% of ideal\n", pct(r.ideal_us, r.iteration_us));
  fmt::print("floor                {} ({}); the iteration is {:.2f}x of it\n", format_us(r.floor_us),
             r.floor_bound, r.floor_us > 0 ? r.iteration_us / r.floor_us : 0.0);
  fmt::print("peak                 {} of budget {} ({:.1f}%)\n",
             format_bytes(static_cast<double>(r.peak_bytes)),
             format_bytes(static_cast<double>(plan.budget_bytes)),
             pct(static_cast<double>(r.peak_bytes), static_cast<double>(plan.budget_bytes)));
  fmt::print("urgent transfers     {} in the last iteration\n", r.urgent_fetches);
  fmt::print("moved per iteration  {}\n", bytes_by_kind_text(r));
  if (trace.writes_recorded) {  // Note [Clean offloads] in src/trace/plan_check.cpp
    fmt::print("clean offloads       {} per iteration, {} not written\n", r.clean_offloads,
               format_bytes(static_cast<double>(r.clean_offload_bytes)));
    if (r.writebacks) {  // Note [Writebacks] in src/sim/simulator.cpp
      fmt::print("writebacks           {} per iteration, {} written early\n", r.writebacks,
                 format_bytes(static_cast<double>(r.writeback_bytes)));
    }
  }
  if (plan.discard_dead) {  // Note [Dead tensors] in src/sim/simulator.cpp
    fmt::print("discards             {} per iteration, {} not written\n", r.discards,
               format_bytes(static_cast<double>(r.discarded_bytes)));
  }
  fmt::print("\n{:<12} {:<6} {:>9} {:>12} {:>12} {:>10}\n", "tier", "link", "GB/s", "bytes/iter",
             "busy/iter", "busy %");
  for (size_t i = 0; i < tiers.size(); ++i) {
    const TierTraffic& t = r.tiers[i];
    fmt::print("{:<12} {:<6} {:>9.2f} {:>12} {:>12} {:>9.1f}%\n", tiers[i].name, "write",
               tiers[i].write_gbps, format_bytes(static_cast<double>(t.offload_bytes)),
               format_us(t.write_busy_us), pct(t.write_busy_us, r.iteration_us));
    fmt::print("{:<12} {:<6} {:>9.2f} {:>12} {:>12} {:>9.1f}%\n", "", "read", tiers[i].read_gbps,
               format_bytes(static_cast<double>(t.prefetch_bytes)), format_us(t.read_busy_us),
               pct(t.read_busy_us, r.iteration_us));
  }
  for (const TierSpec& t : tiers) {
    if (t.duplex_gbps > 0)
      fmt::print("{}: {:.2f} GB/s per direction while reads and writes overlap (both ways)\n",
                 t.name, t.duplex_gbps);
  }
}

void print_sweep(const SimulateArgs& args, const std::vector<SweepPoint>& points) {
  if (args.json) {
    fmt::print("[");
    for (size_t i = 0; i < points.size(); ++i) {
      const SweepPoint& p = points[i];
      fmt::print(
          "{}\n  {{\"scale\": {}, \"read_gbps\": {}, \"write_gbps\": {}, \"iteration_us\": {}, "
          "\"ideal_us\": {}, "
          "\"stall_us\": {}, \"percent_of_ideal\": {}, \"plan_point\": {}, \"plan_moves\": {}, "
          "\"own_plan_iteration_us\": {}}}",
          i ? "," : "", json_number(p.scale), json_number(p.total_read_gbps),
          json_number(p.total_write_gbps), json_number(p.iteration_us), json_number(p.ideal_us),
          json_number(p.stall_us), json_number(p.percent_of_ideal), p.plan_point, p.plan_moves,
          json_number(p.own_plan_iteration_us));
    }
    fmt::print("\n]\n");
    return;
  }
  fmt::print("{:>3} {:>8} {:>10} {:>10} {:>12} {:>9} {:>6} {:>8} {:>14}\n", "#", "scale",
             "read GB/s", "write GB/s", "iteration", "% ideal", "plan", "moves", "own plan");
  for (size_t i = 0; i < points.size(); ++i) {
    const SweepPoint& p = points[i];
    fmt::print("{:>3} {:>8.3f} {:>10.2f} {:>10.2f} {:>12} {:>8.2f}% {:>6} {:>8} {:>14}\n", i,
               p.scale, p.total_read_gbps, p.total_write_gbps, format_us(p.iteration_us),
               p.percent_of_ideal, fmt::format("#{}", p.plan_point), p.plan_moves,
               format_us(p.own_plan_iteration_us));
  }
  fmt::print(
      "plan: the sweep point whose plan won (a plan made at lower bandwidth stays valid at more);\n"
      "own plan: the plan made at this bandwidth, simulated here.\n");
}

int run_simulate(const SimulateArgs& args) {
  const Trace trace = read_trace(args.trace_path);
  const Plan plan = read_plan(args.plan_path);
  const std::vector<TierSpec> tiers = apply_bandwidths(plan.tiers, args.tier_bandwidths);
  if (args.sweep) {
    TERAIO_CHECK(args.timeline_path.empty(),
                 "--timeline records one simulation; --sweep-bandwidth runs many: use one of them");
    PlannerOptions popts;
    popts.budget_bytes = plan.budget_bytes;
    popts.tiers = tiers;
    popts.min_tensor_bytes = parse_size(args.min_tensor, "--min-tensor");
    popts.discard_dead = plan.discard_dead;
    SweepOptions sopts;
    sopts.min_scale = args.sweep_min;
    sopts.max_scale = args.sweep_max;
    sopts.steps = args.sweep_steps;
    sopts.iterations = args.iterations;
    print_sweep(args, sweep_bandwidth(trace, popts, sopts));
    return 0;
  }
  SimOptions opts;
  opts.actual_tiers = tiers;
  opts.iterations = args.iterations;
  opts.link_order = args.link_order == "deadline"     ? SimOptions::LinkOrder::kDeadline
                    : args.link_order == "preemptive" ? SimOptions::LinkOrder::kPreemptive
                                                      : SimOptions::LinkOrder::kIssue;
  opts.runner_host_us_per_kernel = args.runner_host_us;
  opts.recompute_host_us_per_iteration = args.recompute_host_us;
  opts.record_timeline = !args.timeline_path.empty();
  const Plan simulated = args.reorder ? issue_in_deadline_order(trace, plan, opts) : plan;
  const SimResult r = simulate(trace, simulated, opts);
  if (opts.record_timeline)
    write_file_atomically(args.timeline_path, timeline_json(trace, simulated, tiers, r));
  print_result(args, trace, simulated, tiers, r);
  return 0;
}

const Registration kSimulate{{
    "simulate",
    "Replay a plan over its trace: iteration time, stalls, overlap, traffic per tier",
    30,
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<SimulateArgs>();
      sub.add_option("trace", args->trace_path, "trace file (teraio.trace JSON)")->required();
      sub.add_option("plan", args->plan_path, "plan file (teraio.plan JSON) made for this trace")
          ->required();
      sub.add_flag("--json", args->json,
                   "print one JSON object (a JSON array with --sweep-bandwidth)");
      sub.add_option(
          "--tier-bandwidth", args->tier_bandwidths,
          "NAME:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]: simulate the plan's tier NAME at these "
          "bandwidths (BOTH_GBPS: per direction while both move; 0: independent); repeat");
      sub.add_option("--iterations", args->iterations,
                     "iterations to simulate; times are their mean")
          ->capture_default_str()
          ->check(in_range(1, 1000));
      sub.add_option("--link-order", args->link_order,
                     "how each link direction orders its transfers: issue (one at a time in issue "
                     "order, as the host tier's copy lanes), deadline (the one due first), "
                     "preemptive (issue order, a transfer a kernel waits for preempting)")
          ->capture_default_str()
          ->check(CLI::IsMember({"issue", "deadline", "preemptive"}));
      sub.add_option("--runner-host-us", args->runner_host_us,
                     "host time in us the runner spends per kernel besides the trace's (a "
                     "Session's stats()['runner_host_us_per_operator']); a trace without host "
                     "times pays it before every kernel")
          ->capture_default_str()
          ->check(CLI::Range(0.0, 1e9));
      sub.add_option("--recompute-host-us", args->recompute_host_us,
                     "host time in us the plan's recomputes take per iteration in all (a "
                     "Session's stats()['recompute_host_us_per_step']), shared among them by their "
                     "producers' host times; 0: each at its producer's host time")
          ->capture_default_str()
          ->check(CLI::Range(0.0, 1e12));
      sub.add_flag("--deadline-order", args->reorder,
                   "first move each transfer to where it would begin on links that take the one "
                   "due first (what the Session runs: docs/simulator.md, \"Issue order\")");
      sub.add_option("--timeline", args->timeline_path,
                     "also write the last simulated iteration's kernels and transfers to this "
                     "file (teraio.timeline JSON)");
      sub.add_flag(
          "--sweep-bandwidth", args->sweep,
          "replan and simulate at every tier's bandwidth times a range of factors (Figure 3)");
      sub.add_option("--sweep-min", args->sweep_min, "smallest bandwidth factor")
          ->capture_default_str()
          ->check(positive_at_most(1e6));
      sub.add_option("--sweep-max", args->sweep_max, "largest bandwidth factor")
          ->capture_default_str()
          ->check(positive_at_most(1e6));
      sub.add_option("--sweep-steps", args->sweep_steps, "number of factors, spaced geometrically")
          ->capture_default_str()
          ->check(in_range(1, 1000));
      sub.add_option("--min-tensor", args->min_tensor, "planner option for the sweep's replanning")
          ->capture_default_str();
      return [args] { return run_simulate(*args); };
    },
}};

}  // namespace
}  // namespace teraio::cli
