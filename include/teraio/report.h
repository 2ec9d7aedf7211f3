// The HTML report (`teraio report`, docs/report.md): one self-contained page of hand-written SVG
// charts for a trace, optionally a plan and a measured run — memory over the kernel index, inactive
// periods (the paper's Figure 2), bandwidth over time (Figure 10), the stall/overlap/compute
// breakdown (Figure 8), the bandwidth roofline (Figure 3) and a summary table. Every series is
// aggregated to a bounded number of points first, so a 250k-kernel trace gives a small page.
// Pure functions of their arguments; thread-safe on distinct arguments; never print.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/plan.h"
#include "teraio/trace.h"

namespace teraio {

// A measured run (format teraio.run v1, docs/report.md), written by `teraio train` or a Python
// session: what one steady-state iteration took. Extra keys are ignored.
struct RunTierBytes {
  std::string name;
  uint64_t offload_bytes = 0;   // GPU -> tier per iteration
  uint64_t prefetch_bytes = 0;  // tier -> GPU per iteration
};

struct RunMeasurement {
  double iteration_us = 0;  // > 0
  double stall_us = 0;      // time the compute stream waited for migrations, >= 0, <= iteration_us
  uint64_t peak_bytes = 0;  // most device bytes held by tensors
  std::vector<RunTierBytes> tiers;
};

// Throws teraio::Error naming `source` and the key on malformed input, a wrong format or version.
RunMeasurement parse_run(std::string_view json, std::string_view source = "<run>");
RunMeasurement read_run(const std::string& path);

enum class Phase : uint8_t { forward, backward, optimizer };
std::string_view to_string(Phase phase);

// Kernels [begin, end) belong to `phase`.
struct PhaseSpan {
  Phase phase = Phase::forward;
  KernelIndex begin = 0;
  KernelIndex end = 0;
};

// Forward / backward / optimizer spans covering every kernel, in order, inferred from kernel names
// and tensor kinds (the heuristic is in docs/report.md, "Phases"). Spans shorter than 0.1% of the
// kernels are merged into their predecessor so noise cannot produce thousands of bands.
std::vector<PhaseSpan> infer_phases(const Trace& trace);

struct ReportOptions {
  std::string title;        // default: "teraio report — <model from the trace meta>"
  std::string trace_label;  // file names shown in the summary; default: empty (not shown)
  std::string plan_label;
  std::string run_label;
  // Samples per series along the x axis of the memory chart (each the maximum over its bin of
  // kernels); the bandwidth chart uses half as many (each the mean rate over its bin of time).
  // Default 1000; at least 16.
  size_t max_points = 1000;
  // Points of the bandwidth roofline (sweep.h); 0 leaves the roofline out. Default 9: a quarter of
  // the plan's bandwidth to four times it. Each point plans and simulates once.
  int sweep_steps = 9;
  double sweep_min_scale = 0.25;
  double sweep_max_scale = 4.0;
};

// Renders the page. `plan` and `run` may be null: without a plan the bandwidth, roofline and plan
// parts are replaced by a note. Throws teraio::Error if the trace is invalid, the plan does not
// fit the trace (check_plan), or the options are out of range.
std::string render_report(const Trace& trace, const Plan* plan, const RunMeasurement* run,
                          const ReportOptions& options = {});

}  // namespace teraio
