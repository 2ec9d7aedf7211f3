// `teraio report`: one self-contained HTML page of SVG charts for a trace, optionally a plan and a
// measured run (docs/report.md). Reads the inputs, renders with teraio::render_report, writes the
// file (replaced atomically: write_file_atomically).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "command.h"
#include "option_checks.h"
#include "teraio/error.h"
#include "teraio/output_file.h"
#include "teraio/report.h"

namespace teraio::cli {
namespace {

struct ReportArgs {
  std::string trace_path;
  std::string plan_path;
  std::string run_path;
  std::string out_path;
  ReportOptions options;
};

int run_report(ReportArgs args) {
  const Trace trace = read_trace(args.trace_path);
  std::optional<Plan> plan;
  std::optional<RunMeasurement> run;
  if (!args.plan_path.empty()) plan = read_plan(args.plan_path);
  if (!args.run_path.empty()) run = read_run(args.run_path);
  namespace fs = std::filesystem;
  args.options.trace_label = fs::path(args.trace_path).filename().string();
  if (plan) args.options.plan_label = fs::path(args.plan_path).filename().string();
  if (run) args.options.run_label = fs::path(args.run_path).filename().string();
  const std::string html =
      render_report(trace, plan ? &*plan : nullptr, run ? &*run : nullptr, args.options);
  write_file_atomically(args.out_path, html);
  fmt::print("report               {} ({:.1f} KiB)\n", args.out_path,
             static_cast<double>(html.size()) / 1024);
  return 0;
}

const Registration kReport{{
    "report",
    "Write a self-contained HTML page of charts for a trace, a plan and a measured run",
    60,
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<ReportArgs>();
      sub.add_option("trace", args->trace_path, "trace file (teraio.trace JSON)")->required();
      sub.add_option("--plan", args->plan_path,
                     "plan file (teraio.plan JSON) made for this trace");
      sub.add_option("--run", args->run_path, "measured run (teraio.run v1 JSON, docs/report.md)");
      sub.add_option("-o,--output", args->out_path, "HTML file to write")->required();
      sub.add_option("--title", args->options.title,
                     "page title (default: from the trace's model)");
      sub.add_option("--max-points", args->options.max_points,
                     "samples per series along the x axis (>= 16)")
          ->capture_default_str()
          ->check(in_range<size_t>(16, 10'000'000));
      sub.add_option(
             "--sweep-steps", args->options.sweep_steps,
             "points of the bandwidth roofline, each a replan and a simulation (0: leave it out)")
          ->capture_default_str()
          ->check(in_range(0, 1000));
      return [args] { return run_report(*args); };
    },
}};

}  // namespace
}  // namespace teraio::cli
