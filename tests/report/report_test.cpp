// Tests of the HTML report (include/teraio/report.h): phase inference on synthetic traces, the
// teraio.run reader, every chart present with data, nothing fetched from the network, and the
// aggregation that keeps a 250k-kernel trace's page small.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "teraio/error.h"
#include "teraio/planner.h"
#include "teraio/report.h"
#include "teraio/simulator.h"
#include "teraio/synth.h"
#include "teraio/trace_stats.h"
#include "teraio/units.h"

namespace teraio {
namespace {

Trace tiny_trace(uint32_t micro_batches = 2, bool foreach = false) {
  SynthOptions o;
  o.model = "tiny";
  o.batch = micro_batches;
  o.micro_batches = micro_batches;
  o.foreach = foreach;
  return synthesize(o);
}

Plan tiny_plan(const Trace& trace) {
  const TraceStats s = compute_trace_stats(trace);
  PlannerOptions o;
  o.budget_bytes = std::max<uint64_t>(s.active_max_bytes * 2, s.peak_bytes * 6 / 10);
  o.tiers = {parse_tier_spec("ssd:1TiB:0.5:0.5"), parse_tier_spec("host:1GiB:2:2")};
  o.min_tensor_bytes = 0;
  return make_plan(trace, o);
}

// The <svg> element with this id, or "" if absent.
std::string chart(const std::string& html, const std::string& id) {
  const size_t at = html.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t begin = html.rfind("<svg", at);
  const size_t end = html.find("</svg>", at);
  return html.substr(begin, end - begin);
}

// The value of the first attribute `name` after `from`, or "" (plain string search: std::regex
// recurses per character and can overflow the stack on long SVG attributes in debug builds).
std::string attribute(const std::string& text, const std::string& name, size_t from = 0) {
  const size_t at = text.find(" " + name + "=\"", from);
  if (at == std::string::npos) return "";
  const size_t begin = at + name.size() + 3;
  return text.substr(begin, text.find('"', begin) - begin);
}

size_t data_points(const std::string& svg) {
  const std::string v = attribute(svg, "data-points");
  return v.empty() ? 0 : std::stoul(v);
}

// Numbers of coordinate pairs in each polyline.
std::vector<size_t> polyline_sizes(const std::string& svg) {
  std::vector<size_t> sizes;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    const std::string pts = attribute(svg, "points", at);
    sizes.push_back(pts.empty() ? 0
                                : static_cast<size_t>(std::count(pts.begin(), pts.end(), ' ')) + 1);
  }
  return sizes;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ReportPhases, MicroBatchesAlternateThenOptimizer) {
  const Trace trace = tiny_trace(2);
  const auto spans = infer_phases(trace);
  ASSERT_EQ(spans.size(), 5u);
  const Phase expected[] = {Phase::forward, Phase::backward, Phase::forward, Phase::backward,
                            Phase::optimizer};
  KernelIndex next = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].phase, expected[i]) << "span " << i;
    EXPECT_EQ(spans[i].begin, next);
    EXPECT_LT(spans[i].begin, spans[i].end);
    next = spans[i].end;
  }
  EXPECT_EQ(next, trace.num_kernels());
  // Backward begins at the loss backward; the optimizer at its weight decay of the first parameter.
  EXPECT_NE(trace.kernel_name(spans[1].begin - 1).find("div"), std::string::npos);
  EXPECT_EQ(trace.kernel_name(spans[4].begin), "aten::mul_");
  EXPECT_EQ(trace.kernel_name(spans[4].begin + 1), "aten::lerp_");
}

TEST(ReportPhases, ForeachOptimizerIsKeptEvenWhenShort) {
  const Trace trace = tiny_trace(1, true);
  const auto spans = infer_phases(trace);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[2].phase, Phase::optimizer);
  EXPECT_EQ(spans[2].end - spans[2].begin, 8u);  // the eight _foreach_ kernels of AdamW
}

TEST(ReportPhases, NamesAloneMarkBackward) {
  Trace t;
  const TensorId a = t.add_tensor({1024, TensorKind::activation, false, "a"});
  const TensorId b = t.add_tensor({1024, TensorKind::temporary, false, "b"});
  const TensorId ids_a[] = {a}, ids_b[] = {b};
  for (int i = 0; i < 10; ++i) t.add_kernel("fwd", 1, ids_a);
  for (int i = 0; i < 10; ++i) t.add_kernel(i == 0 ? "MyOpBackward0" : "mm", 1, ids_b);
  const auto spans = infer_phases(t);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[1].phase, Phase::backward);
  EXPECT_EQ(spans[1].begin, 10u);
}

TEST(ReportRun, ReadsTheSchemaAndIgnoresExtraKeys) {
  const RunMeasurement r =
      parse_run(R"({"format": "teraio.run", "version": 1, "iteration_us": 2.5e6,
      "stall_us": 1.0e5, "peak_bytes": 42949672960, "extra": {"x": [1, 2]},
      "tiers": [{"name": "ssd", "offload_bytes": 1e9, "prefetch_bytes": 2e9, "gbps": 6.5}]})");
  EXPECT_DOUBLE_EQ(r.iteration_us, 2.5e6);
  EXPECT_DOUBLE_EQ(r.stall_us, 1.0e5);
  EXPECT_EQ(r.peak_bytes, 42949672960ull);
  ASSERT_EQ(r.tiers.size(), 1u);
  EXPECT_EQ(r.tiers[0].name, "ssd");
  EXPECT_EQ(r.tiers[0].offload_bytes, 1000000000ull);
  EXPECT_EQ(r.tiers[0].prefetch_bytes, 2000000000ull);
}

TEST(ReportRun, RejectsBadDocumentsNamingTheProblem) {
  auto message = [](const std::string& json) {
    try {
      parse_run(json, "run.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ok_tail = R"("stall_us": 0, "peak_bytes": 1, "tiers": [])";
  EXPECT_NE(message(R"({"format": "teraio.run", "version": 2, "iteration_us": 1, )" + ok_tail + "}")
                .find("version 2"),
            std::string::npos);
  EXPECT_NE(
      message(R"({"format": "teraio.trace", "version": 1, "iteration_us": 1, )" + ok_tail + "}")
          .find("format"),
      std::string::npos);
  EXPECT_NE(
      message(R"({"format": "teraio.run", "version": 1, )" + ok_tail + "}").find("iteration_us"),
      std::string::npos);
  EXPECT_NE(message(R"({"format": "teraio.run", "version": 1, "iteration_us": 1, "stall_us": 2,
                        "peak_bytes": 1, "tiers": []})")
                .find("exceeds"),
            std::string::npos);
  EXPECT_NE(message(R"({"format": "teraio.run", "version": 1, "iteration_us": 1, "stall_us": 0,
                        "peak_bytes": 1, "tiers": [{"name": "ssd", "offload_bytes": -1, "prefetch_bytes": 0}]})")
                .find("tiers[0].offload_bytes"),
            std::string::npos);
  EXPECT_NE(message("{not json").find("run.json"), std::string::npos);
}

TEST(Report, EveryChartHasDataAndNothingIsFetched) {
  const Trace trace = tiny_trace(2);
  const Plan plan = tiny_plan(trace);
  ASSERT_FALSE(plan.moves.empty());
  RunMeasurement run;
  run.iteration_us = trace.total_time_us() * 1.5;
  run.stall_us = trace.total_time_us() * 0.5;
  run.peak_bytes = 123456789;
  run.tiers = {{"ssd", 1000, 2000}, {"nvme-extra", 5, 6}};
  ReportOptions opt;
  opt.sweep_steps = 3;
  const std::string html = render_report(trace, &plan, &run, opt);

  for (const char* id :
       {"chart-memory", "chart-periods", "chart-bandwidth", "chart-breakdown", "chart-roofline"}) {
    const std::string svg = chart(html, id);
    ASSERT_FALSE(svg.empty()) << id;
    EXPECT_GT(data_points(svg), 0u) << id;
    EXPECT_GT(count(svg, "class=\"bar\"") + count(svg, "class=\"series\""), 0u) << id;
    for (size_t n : polyline_sizes(svg)) EXPECT_GE(n, 2u) << id;
  }
  EXPECT_EQ(count(chart(html, "chart-roofline"), "class=\"point\""), 3u);
  const SimResult sim = simulate(trace, plan);
  const size_t simulated_bars =
      (sim.overlap_us < trace.total_time_us()) + (sim.overlap_us > 0) + (sim.stall_us > 0);
  EXPECT_EQ(count(chart(html, "chart-breakdown"), "class=\"bar\""),
            1 + simulated_bars + 2);  // Ideal, plan, run
  EXPECT_NE(chart(html, "chart-memory").find("data-series=\"budget\""), std::string::npos);
  EXPECT_NE(chart(html, "chart-memory").find("data-phase=\"optimizer\""), std::string::npos);
  // Self-contained: no URLs, scripts or external resources.
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  // Summary: measured numbers and the run-only tier are shown.
  EXPECT_NE(html.find(format_us(run.iteration_us)), std::string::npos);
  EXPECT_NE(html.find("nvme-extra traffic per iteration"), std::string::npos);
  EXPECT_NE(html.find("66.7%"), std::string::npos);  // measured % of Ideal = 1 / 1.5
}

// The summary says what the plan frees without moving bytes: recomputes, clean offloads, discards
// (gradients set to none after the optimizer are dead tensors).
TEST(Report, SummaryCountsRecomputesCleanOffloadsAndDiscards) {
  SynthOptions o;
  o.model = "tiny";
  o.persistent_gradients = false;
  const Trace trace = synthesize(o);
  const TraceStats s = compute_trace_stats(trace);
  PlannerOptions po;
  po.budget_bytes = s.peak_bytes / 2;
  po.tiers = {parse_tier_spec("host:1GiB:2:2")};
  po.min_tensor_bytes = 0;
  po.discard_dead = true;
  const Plan plan = make_plan(trace, po);
  const SimResult sim = simulate(trace, plan);
  ASSERT_GT(sim.discards, 0u);
  ReportOptions opt;
  opt.sweep_steps = 0;
  const std::string html = render_report(trace, &plan, nullptr, opt);
  EXPECT_NE(html.find(fmt::format("<th>discards per iteration</th><td class=\"num\">{} (",
                                  sim.discards)),
            std::string::npos);
  EXPECT_NE(html.find("<th>recomputes per iteration</th>"), std::string::npos);
  EXPECT_NE(html.find("<th>clean offloads per iteration</th>"), std::string::npos);
}

TEST(Report, WithoutPlanLeavesOutThePlanCharts) {
  const Trace trace = tiny_trace(1);
  const std::string html = render_report(trace, nullptr, nullptr);
  EXPECT_GT(data_points(chart(html, "chart-memory")), 0u);
  EXPECT_GT(data_points(chart(html, "chart-periods")), 0u);
  EXPECT_EQ(data_points(chart(html, "chart-breakdown")), 1u);  // Ideal only
  EXPECT_TRUE(chart(html, "chart-bandwidth").empty());
  EXPECT_TRUE(chart(html, "chart-roofline").empty());
  EXPECT_NE(html.find("Needs a plan"), std::string::npos);
}

TEST(Report, RejectsAPlanForAnotherTrace) {
  const Trace small = tiny_trace(1);
  Plan plan = tiny_plan(tiny_trace(2));
  EXPECT_THROW(render_report(small, &plan, nullptr), Error);
}

TEST(Report, EscapesText) {
  Trace trace = tiny_trace(1);
  trace.set_meta("model", "\"<b>&evil</b>\"");
  const std::string html = render_report(trace, nullptr, nullptr);
  EXPECT_EQ(html.find("<b>&evil"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;&amp;evil"), std::string::npos);
}

TEST(Report, LargeTraceIsAggregatedAndKeepsThePeak) {
  // 250k kernels, each touching a persistent weight and a short-lived temporary.
  Trace t;
  constexpr uint32_t kWeights = 500, kKernels = 250000;
  for (uint32_t i = 0; i < kWeights; ++i)
    t.add_tensor({64ull << 20, TensorKind::parameter, true, ""});
  t.reserve_kernels(kKernels, 2 * kKernels);
  uint64_t peak_extra = 0;
  for (uint32_t k = 0; k < kKernels; ++k) {
    // One big temporary at kernel 123457: the page must still show the peak it causes.
    const uint64_t bytes = k == 123457 ? (8ull << 30) : (1ull << 20);
    peak_extra = std::max(peak_extra, bytes);
    const TensorId tmp = t.add_tensor({bytes, TensorKind::temporary, false, ""});
    const TensorId ids[] = {k % kWeights, tmp};
    t.add_kernel("aten::mm", 10, ids);
  }
  ReportOptions opt;  // default max_points
  const std::string html = render_report(t, nullptr, nullptr, opt);
  const std::string memory = chart(html, "chart-memory");
  EXPECT_LE(data_points(memory), 2 * opt.max_points);
  for (size_t n : polyline_sizes(memory)) EXPECT_LE(n, opt.max_points);
  size_t total = 0;
  for (const char* id : {"chart-memory", "chart-periods", "chart-breakdown"})
    total += data_points(chart(html, id));
  EXPECT_LE(total, 3000u);
  EXPECT_LT(html.size(), 400u * 1024);
  const uint64_t peak = kWeights * (64ull << 20) + peak_extra;
  EXPECT_NE(
      html.find("required without offloading (max): " + format_bytes(static_cast<double>(peak))),
      std::string::npos);
}

}  // namespace
}  // namespace teraio
