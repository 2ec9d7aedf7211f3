// `teraio report`: renders one self-contained HTML page (inline CSS, hand-written SVG, no scripts,
// no external URLs) from a trace, an optional plan and an optional measured run. Each chart first
// aggregates its data into at most ReportOptions::max_points bins (maximum per bin for memory, mean
// rate per bin for bandwidth), so the page stays small and responsive for 250k-kernel traces.
#include "teraio/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "svg.h"
#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan_check.h"
#include "teraio/simulator.h"
#include "teraio/sweep.h"
#include "teraio/trace_stats.h"
#include "teraio/units.h"

namespace teraio {
namespace {

using report::coord;
using report::escape;
using report::Plot;
using report::tick_label;

// Colours: readable on white and distinguishable with the common colour-vision deficiencies.
constexpr const char* kRequiredColour = "#6b7280";
constexpr const char* kBudgetColour = "#dc2626";
constexpr const char* kResidentColour = "#2563eb";
constexpr const char* kActiveColour = "#f59e0b";
constexpr std::array<const char*, 3> kPhaseFill = {"#e0ecfa", "#fde9d4", "#dcf2e1"};
constexpr std::array<const char*, 3> kPhaseText = {"#1e4f8a", "#9a4a0b", "#1f6b35"};
constexpr std::array<const char*, 4> kLengthColours = {"#c6dbef", "#6baed6", "#2171b5", "#08306b"};
constexpr std::array<const char*, 6> kTierColours = {"#c2410c", "#2563eb", "#15803d",
                                                     "#7c3aed", "#be185d", "#0f766e"};
constexpr const char* kComputeColour = "#9ecae1";
constexpr const char* kOverlapColour = "#3182bd";
constexpr const char* kStallColour = "#e6550d";

constexpr const char* kCss = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;margin:0;
  background:#f3f4f6;color:#111827;line-height:1.45}
main{max-width:1120px;margin:0 auto;padding:24px}
h1{font-size:26px;margin:0 0 4px}
h2{font-size:19px;margin:0 0 6px}
p.sub{color:#4b5563;margin:0 0 16px}
section{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:16px 20px;margin:0 0 18px}
p.caption{color:#374151;font-size:14px;margin:4px 0 0}
p.note{color:#6b7280;font-style:italic}
svg.chart{width:100%;height:auto;display:block}
svg .grid{stroke:#e5e7eb;stroke-width:1}
svg .tickmark{stroke:#6b7280}
svg .frame{fill:none;stroke:#9ca3af}
svg text{font-family:inherit}
svg .tick{font-size:13px;fill:#374151}
svg .label{font-size:14px;fill:#111827;font-weight:600}
svg .legend-text{font-size:13px;fill:#111827}
svg .phase-label{font-size:12px;font-weight:600}
svg .value{font-size:13px;fill:#111827}
svg .halo{paint-order:stroke;stroke:#fff;stroke-width:4px;stroke-linejoin:round;font-weight:600}
svg .hover{fill:transparent}
svg .hover:hover{fill:rgba(17,24,39,.07)}
table{border-collapse:collapse;font-size:14px;width:100%}
th,td{text-align:left;padding:4px 10px;border-bottom:1px solid #e5e7eb;vertical-align:top}
th{background:#f9fafb}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:18px}
)";

std::string bytes_text(double b) {
  return format_bytes(b);
}
std::string pct_text(double v) {
  return fmt::format("{:.1f}%", v);
}

// A trace meta value shown as text: JSON strings lose their quotes.
std::string meta_text(const std::string& raw) {
  if (raw.size() >= 2 && raw.front() == '"' && raw.back() == '"') {
    std::string s;
    for (size_t i = 1; i + 1 < raw.size(); ++i) {
      if (raw[i] == '\\' && i + 2 < raw.size()) ++i;
      s += raw[i];
    }
    return s;
  }
  return raw;
}

// Bin b of `bins` over n items covers [lo(b), lo(b + 1)).
struct Bins {
  size_t n = 0;
  size_t count = 0;
  Bins(size_t items, size_t max_bins)
      : n(items), count(std::max<size_t>(1, std::min(items, max_bins))) {}
  size_t lo(size_t b) const { return b * n / count; }
};

std::vector<double> bin_max(const std::vector<uint64_t>& v, const Bins& bins) {
  std::vector<double> out(bins.count, 0);
  for (size_t b = 0; b < bins.count; ++b) {
    uint64_t m = 0;
    for (size_t i = bins.lo(b); i < bins.lo(b + 1); ++i) m = std::max(m, v[i]);
    out[b] = static_cast<double>(m);
  }
  return out;
}

std::string points_attr(const std::vector<std::pair<double, double>>& pts) {
  std::string s;
  s.reserve(pts.size() * 12);
  for (const auto& [x, y] : pts) {
    if (!s.empty()) s += ' ';
    s += coord(x);
    s += ',';
    s += coord(y);
  }
  return s;
}

void polyline(std::string& out, std::string_view series,
              const std::vector<std::pair<double, double>>& pts, std::string_view colour,
              double width, bool dashed = false) {
  out += fmt::format(
      "<polyline class=\"series\" data-series=\"{}\" data-n=\"{}\" fill=\"none\" stroke=\"{}\" "
      "stroke-width=\"{}\" stroke-linejoin=\"round\"{} points=\"{}\"/>\n",
      escape(series), pts.size(), colour, width, dashed ? " stroke-dasharray=\"7 5\"" : "",
      points_attr(pts));
}

// Phase bands behind a chart; `x_of(kernel)` maps a kernel boundary to data x.
template <typename XOf>
void phase_bands(std::string& out, const Plot& plot, const std::vector<PhaseSpan>& phases,
                 XOf x_of) {
  out += "<g class=\"phases\">\n";
  for (const PhaseSpan& s : phases) {
    const double x0 = plot.px(x_of(s.begin)), x1 = plot.px(x_of(s.end));
    const int p = static_cast<int>(s.phase);
    out += fmt::format(
        "<rect class=\"phase\" data-phase=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
        "fill=\"{}\">"
        "<title>{}: kernels {}\u2013{}</title></rect>\n",
        to_string(s.phase), coord(x0), coord(plot.y_top()), coord(std::max(0.0, x1 - x0)),
        coord(plot.y_bottom() - plot.y_top()), kPhaseFill[p], to_string(s.phase), s.begin,
        s.end - 1);
    std::string label;
    if (x1 - x0 > 80) {
      label = std::string(to_string(s.phase));
    } else if (x1 - x0 > 14) {
      label = std::string(1, static_cast<char>(std::toupper(to_string(s.phase)[0])));
    }
    if (!label.empty()) {
      out += fmt::format(
          "<text class=\"phase-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" "
          "fill=\"{}\">{}</text>\n",
          coord((x0 + x1) / 2), coord(plot.y_top() + 15), kPhaseText[p], label);
    }
  }
  out += "</g>\n";
}

std::vector<Plot::LegendItem> phase_legend() {
  return {{kPhaseFill[0], "forward", false, true},
          {kPhaseFill[1], "backward", false, true},
          {kPhaseFill[2], "optimizer", false, true}};
}

struct Context {
  const Trace& trace;
  const Plan* plan;
  const RunMeasurement* run;
  const ReportOptions& opt;
  std::vector<PhaseSpan> phases;
  TraceStats stats;
  std::vector<uint64_t> required;
  std::vector<uint64_t> active;
  PlanCheck check;
  SimResult sim;
  std::vector<SweepPoint> sweep;
};

// ---- memory over the kernel index --------------------------------------------------------------
void memory_chart(std::string& out, const Context& c) {
  const size_t n = c.trace.num_kernels();
  const Bins bins(n, c.opt.max_points);
  const std::vector<double> req = bin_max(c.required, bins);
  const std::vector<double> act = bin_max(c.active, bins);
  std::vector<double> res;
  if (c.plan) res = bin_max(c.check.resident_bytes, bins);
  double y_max = static_cast<double>(c.stats.peak_bytes);
  if (c.plan)
    y_max = std::max({y_max, static_cast<double>(c.plan->budget_bytes),
                      static_cast<double>(c.check.peak_bytes)});
  y_max = std::max(y_max, 1.0) * 1.08;
  const report::Unit unit = report::bytes_unit(y_max);

  Plot plot(0, static_cast<double>(n), 0, y_max);
  plot.top = 58;  // two legend rows
  const size_t series = 2 + (c.plan ? 1 : 0);
  plot.open(out, "chart-memory", "Memory over the kernel index", bins.count * series);
  phase_bands(out, plot, c.phases, [](KernelIndex k) { return static_cast<double>(k); });
  std::vector<double> yt = report::nice_ticks(0, y_max / unit.divisor, 8);
  for (double& v : yt) v *= unit.divisor;
  plot.axes(
      out, report::nice_ticks(0, static_cast<double>(n), 10), yt,
      "kernel index (operators of one iteration, in order)",
      fmt::format("bytes on the GPU ({})", unit.name),
      [n](double v) {
        return n >= 10000 && v >= 1000 ? tick_label(v / 1000) + "k" : tick_label(v);
      },
      [&](double v) { return tick_label(v / unit.divisor); });

  auto xy = [&](const std::vector<double>& v) {
    std::vector<std::pair<double, double>> pts(v.size());
    for (size_t b = 0; b < v.size(); ++b) {
      const double x = 0.5 * static_cast<double>(bins.lo(b) + bins.lo(b + 1));
      pts[b] = {plot.px(x), plot.py(v[b])};
    }
    return pts;
  };
  // Active bytes: a filled area.
  {
    auto pts = xy(act);
    std::string d = fmt::format("M{},{}", coord(plot.px(0)), coord(plot.y_bottom()));
    for (const auto& [x, y] : pts) d += fmt::format(" L{},{}", coord(x), coord(y));
    d += fmt::format(" L{},{} Z", coord(plot.px(static_cast<double>(n))), coord(plot.y_bottom()));
    out += fmt::format(
        "<path class=\"series\" data-series=\"active\" data-n=\"{}\" d=\"{}\" fill=\"{}\" "
        "fill-opacity=\"0.55\" "
        "stroke=\"{}\" stroke-width=\"1\"/>\n",
        pts.size(), d, kActiveColour, kActiveColour);
  }
  polyline(out, "required", xy(req), kRequiredColour, 2.2);
  if (c.plan) {
    polyline(out, "resident", xy(res), kResidentColour, 2.2);
    const std::string y = coord(plot.py(static_cast<double>(c.plan->budget_bytes)));
    out += fmt::format(
        "<line class=\"series\" data-series=\"budget\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" "
        "stroke=\"{}\" "
        "stroke-width=\"2\" stroke-dasharray=\"8 5\"><title>budget {}</title></line>\n",
        coord(plot.x_left()), coord(plot.x_right()), y, y, kBudgetColour,
        bytes_text(static_cast<double>(c.plan->budget_bytes)));
  }
  // Tooltips: a column per group of bins.
  const Bins cols(bins.count, 120);
  out += "<g class=\"hovers\">\n";
  for (size_t h = 0; h < cols.count; ++h) {
    const size_t b0 = cols.lo(h), b1 = cols.lo(h + 1);
    const size_t k0 = bins.lo(b0), k1 = bins.lo(b1);
    double r = 0, a = 0, s = 0;
    for (size_t b = b0; b < b1; ++b) {
      r = std::max(r, req[b]);
      a = std::max(a, act[b]);
      if (c.plan) s = std::max(s, res[b]);
    }
    std::string tip =
        fmt::format("kernels {}\u2013{}\nrequired without offloading (max): {}\nactive (max): {}",
                    k0, k1 - 1, bytes_text(r), bytes_text(a));
    if (c.plan) tip += fmt::format("\nresident under the plan (max): {}", bytes_text(s));
    plot.hover_band(out, static_cast<double>(k0), static_cast<double>(k1), tip);
  }
  out += "</g>\n";
  std::vector<Plot::LegendItem> legend = {{kRequiredColour, "required without offloading"}};
  if (c.plan) {
    legend.push_back({kResidentColour, "resident under the plan"});
    legend.push_back({kBudgetColour, "budget", true});
  }
  legend.push_back({kActiveColour, "active (touched by the kernel)", false, true});
  for (auto& p : phase_legend()) legend.push_back(p);
  plot.legend(out, legend);
  out += "</svg>\n";
}

// ---- inactive periods (Figure 2)
// -----------------------------------------------------------------
void periods_chart(std::string& out, const Context& c) {
  const TraceStats& s = c.stats;
  Plot plot(0, kNumSizeBuckets, 0, 100);
  plot.top = 76;  // legend, then two lines of counts above the bars
  size_t rects = 0;
  for (int b = 0; b < kNumSizeBuckets; ++b) {
    for (int l = 0; l < kNumLengthBuckets; ++l) rects += s.periods_by_size_and_length[b][l] > 0;
  }
  plot.open(out, "chart-periods", "Inactive periods by tensor size and length", rects);
  std::vector<double> xt;
  for (int b = 0; b < kNumSizeBuckets; ++b) xt.push_back(b + 0.5);
  plot.axes(
      out, xt, report::nice_ticks(0, 100, 5), "tensor size (decimal units)",
      "share of the bucket's periods (%)",
      [](double v) { return std::string(size_bucket_label(static_cast<int>(v))); },
      [](double v) { return tick_label(v); });
  for (int b = 0; b < kNumSizeBuckets; ++b) {
    const uint64_t total = s.periods_by_size[b];
    const double x0 = plot.px(b + 0.18), x1 = plot.px(b + 0.82);
    if (total == 0) {
      out += fmt::format(
          "<text class=\"value\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">no periods</text>\n",
          coord((x0 + x1) / 2), coord(plot.y_bottom() - 8));
      continue;
    }
    double acc = 0;
    for (int l = 0; l < kNumLengthBuckets; ++l) {
      const uint64_t count = s.periods_by_size_and_length[b][l];
      if (count == 0) continue;
      const double share = 100.0 * static_cast<double>(count) / static_cast<double>(total);
      const double y0 = plot.py(acc), y1 = plot.py(acc + share);
      out += fmt::format(
          "<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}, "
          "inactive {}: {} "
          "periods ({})</title></rect>\n",
          coord(x0), coord(y1), coord(x1 - x0), coord(std::max(0.5, y0 - y1)), kLengthColours[l],
          size_bucket_label(b), length_bucket_label(l), count, pct_text(share));
      acc += share;
    }
    out += fmt::format(
        "<text class=\"value\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{} periods</text>"
        "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{} of all</text>\n",
        coord((x0 + x1) / 2), coord(plot.y_top() - 22), total, coord((x0 + x1) / 2),
        coord(plot.y_top() - 7),
        pct_text(s.periods ? 100.0 * static_cast<double>(total) / static_cast<double>(s.periods)
                           : 0));
  }
  std::vector<Plot::LegendItem> legend;
  for (int l = 0; l < kNumLengthBuckets; ++l) {
    legend.push_back(
        {kLengthColours[l], fmt::format("inactive {}", length_bucket_label(l)), false, true});
  }
  plot.legend(out, legend);
  out += "</svg>\n";
}

// ---- bandwidth over time (Figure 10)
// -------------------------------------------------------------
void bandwidth_chart(std::string& out, const Context& c) {
  const Plan& plan = *c.plan;
  const double t_us = std::max(c.sim.iteration_us, 1e-9);
  // Half as many bins as the memory chart: rates are means, and finer bins only add noise.
  const size_t nb = std::max<size_t>(16, c.opt.max_points / 2);
  const double w = t_us / static_cast<double>(nb);
  const size_t ns = 2 * plan.tiers.size();
  // Bytes moved per bin, per series (2 * tier + (prefetch ? 1 : 0)): exact integration of each
  // transfer's constant rate, partial bins directly and full bins through a difference array.
  std::vector<std::vector<double>> bytes(ns, std::vector<double>(nb, 0.0));
  std::vector<std::vector<double>> diff(ns, std::vector<double>(nb + 1, 0.0));
  auto add = [&](size_t s, double a, double b, double rate) {  // [a, b) within [0, t_us)
    const size_t ba = std::min(nb - 1, static_cast<size_t>(a / w));
    const size_t bb = std::min(nb - 1, static_cast<size_t>(b / w));
    if (ba == bb) {
      bytes[s][ba] += rate * (b - a);
      return;
    }
    bytes[s][ba] += rate * ((static_cast<double>(ba) + 1) * w - a);
    bytes[s][bb] += rate * (b - static_cast<double>(bb) * w);
    diff[s][ba + 1] += rate * w;
    diff[s][bb] -= rate * w;
  };
  for (const SimTransfer& x : c.sim.transfers) {
    const size_t s = 2 * x.tier + (x.offload ? 0 : 1);
    const double dur = x.end_us - x.begin_us;
    // Steady state: every iteration repeats, so time is taken modulo the iteration.
    double a = std::fmod(x.begin_us, t_us);
    if (a < 0) a += t_us;
    if (dur <= 0) {
      bytes[s][std::min(nb - 1, static_cast<size_t>(a / w))] += static_cast<double>(x.bytes);
      continue;
    }
    const double rate = static_cast<double>(x.bytes) / dur;
    double left = dur;
    while (left > 0) {
      const double b = std::min(t_us, a + left);
      if (!(b > a)) break;  // what is left is below the precision of the clock
      add(s, a, b, rate);
      left -= b - a;
      a = 0;
    }
  }
  std::vector<std::vector<double>> gbps(ns, std::vector<double>(nb, 0.0));
  double y_max = 0;
  std::vector<bool> drawn(ns, false);
  for (size_t s = 0; s < ns; ++s) {
    double run = 0;
    for (size_t b = 0; b < nb; ++b) {
      run += diff[s][b];
      gbps[s][b] = (bytes[s][b] + run) / w * 1e-3;  // bytes per µs -> GB/s
      y_max = std::max(y_max, gbps[s][b]);
      drawn[s] = drawn[s] || gbps[s][b] > 0;
    }
  }
  for (const TierSpec& t : plan.tiers) y_max = std::max({y_max, t.read_gbps, t.write_gbps});
  y_max = std::max(y_max, 1e-3) * 1.12;
  const report::Unit unit = report::time_unit(t_us);
  size_t series = 0;
  for (size_t s = 0; s < ns; ++s) series += drawn[s];

  Plot plot(0, t_us, 0, y_max);
  plot.top = 58;  // two legend rows
  plot.open(out, "chart-bandwidth", "Bandwidth of each tier and direction over one iteration",
            series * nb);
  const std::vector<double>& start = c.sim.kernel_start_us;
  const size_t n = c.trace.num_kernels();
  phase_bands(out, plot, c.phases,
              [&](KernelIndex k) { return k < n && k < start.size() ? start[k] : t_us; });
  std::vector<double> xt = report::nice_ticks(0, t_us / unit.divisor, 10);
  for (double& v : xt) v *= unit.divisor;
  plot.axes(
      out, xt, report::nice_ticks(0, y_max, 8),
      fmt::format("time within the iteration ({})", unit.name), "bandwidth (GB/s)",
      [&](double v) { return tick_label(v / unit.divisor); },
      [](double v) { return tick_label(v); });
  // Link limits.
  for (size_t t = 0; t < plan.tiers.size(); ++t) {
    const TierSpec& tier = plan.tiers[t];
    const char* colour = kTierColours[t % kTierColours.size()];
    std::vector<std::pair<double, std::string>> limits;
    if (tier.read_gbps == tier.write_gbps) {
      limits.push_back(
          {tier.read_gbps, fmt::format("{} link {:g} GB/s", tier.name, tier.read_gbps)});
    } else {
      limits.push_back(
          {tier.read_gbps, fmt::format("{} read {:g} GB/s", tier.name, tier.read_gbps)});
      limits.push_back(
          {tier.write_gbps, fmt::format("{} write {:g} GB/s", tier.name, tier.write_gbps)});
    }
    for (const auto& [v, label] : limits) {
      const std::string y = coord(plot.py(v));
      out += fmt::format(
          "<line class=\"limit\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\" "
          "stroke-width=\"1\" "
          "stroke-dasharray=\"2 4\"/><text class=\"tick halo\" x=\"{}\" y=\"{}\" "
          "text-anchor=\"end\" style=\"fill:{}\">{}</text>\n",
          coord(plot.x_left()), coord(plot.x_right()), y, y, colour, coord(plot.x_right() - 6),
          coord(plot.py(v) - 5), colour, escape(label));
    }
  }
  std::vector<Plot::LegendItem> legend;
  for (size_t s = 0; s < ns; ++s) {
    if (!drawn[s]) continue;
    const size_t t = s / 2;
    const bool offload = s % 2 == 0;
    std::vector<std::pair<double, double>> pts(nb);
    for (size_t b = 0; b < nb; ++b)
      pts[b] = {plot.px((static_cast<double>(b) + 0.5) * w), plot.py(gbps[s][b])};
    const std::string name =
        fmt::format("{} {}", plan.tiers[t].name, offload ? "offload (write)" : "prefetch (read)");
    polyline(out, name, pts, kTierColours[t % kTierColours.size()], offload ? 1.6 : 2.0, offload);
    legend.push_back({kTierColours[t % kTierColours.size()], name, offload});
  }
  const Bins cols(nb, 120);
  out += "<g class=\"hovers\">\n";
  for (size_t h = 0; h < cols.count; ++h) {
    const size_t b0 = cols.lo(h), b1 = cols.lo(h + 1);
    std::string tip = fmt::format("{} \u2013 {}", format_us(static_cast<double>(b0) * w),
                                  format_us(static_cast<double>(b1) * w));
    for (size_t s = 0; s < ns; ++s) {
      if (!drawn[s]) continue;
      double sum = 0;
      for (size_t b = b0; b < b1; ++b) sum += gbps[s][b];
      tip += fmt::format("\n{} {}: {:.2f} GB/s (mean)", plan.tiers[s / 2].name,
                         s % 2 == 0 ? "offload" : "prefetch", sum / static_cast<double>(b1 - b0));
    }
    plot.hover_band(out, static_cast<double>(b0) * w, static_cast<double>(b1) * w, tip);
  }
  out += "</g>\n";
  for (auto& p : phase_legend()) legend.push_back(p);
  plot.legend(out, legend);
  out += "</svg>\n";
}

// ---- stall / overlap / compute (Figure 8) -------------------------------------------------------
void breakdown_chart(std::string& out, const Context& c) {
  struct Segment {
    const char* colour;
    const char* what;
    double us;
  };
  struct Row {
    std::string label;
    std::vector<Segment> segments;
  };
  const double ideal = c.stats.total_time_us;
  std::vector<Row> rows;
  rows.push_back({"Ideal (no offloading)", {{kComputeColour, "compute", ideal}}});
  if (c.plan) {
    const double overlap = std::min(c.sim.overlap_us, ideal);
    rows.push_back({"simulated (plan)",
                    {{kComputeColour, "compute", ideal - overlap},
                     {kOverlapColour, "compute overlapping transfers", overlap},
                     {kStallColour, "stall", c.sim.stall_us}}});
  }
  if (c.run) {
    rows.push_back({"measured (run)",
                    {{kComputeColour, "compute", c.run->iteration_us - c.run->stall_us},
                     {kStallColour, "stall", c.run->stall_us}}});
  }
  double x_max = 0;
  size_t segments = 0;
  for (const Row& r : rows) {
    double t = 0;
    for (const Segment& s : r.segments) {
      t += s.us;
      segments += s.us > 0;
    }
    x_max = std::max(x_max, t);
  }
  x_max = std::max(x_max, 1e-9) * 1.32;
  const report::Unit unit = report::time_unit(x_max);
  Plot plot(0, x_max, 0, 1);
  plot.left = 190;
  plot.top = 44;
  plot.open(out, "chart-breakdown", "Iteration time: compute, overlapped transfers and stall",
            segments);
  std::vector<double> xt = report::nice_ticks(0, x_max / unit.divisor, 8);
  for (double& v : xt) v *= unit.divisor;
  plot.axes(
      out, xt, {}, fmt::format("time per iteration ({})", unit.name), "",
      [&](double v) { return tick_label(v / unit.divisor); }, [](double) { return std::string(); });
  const double band =
      (plot.y_bottom() - plot.y_top()) / static_cast<double>(std::max<size_t>(rows.size(), 2));
  for (size_t i = 0; i < rows.size(); ++i) {
    const double y = plot.y_top() + band * (static_cast<double>(i) + 0.2), h = band * 0.6;
    out += fmt::format(
        "<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"end\" dy=\"0.32em\">{}</text>\n",
        coord(plot.x_left() - 10), coord(y + h / 2), escape(rows[i].label));
    double acc = 0;
    double row_total = 0;
    for (const Segment& z : rows[i].segments) row_total += z.us;
    for (const Segment& s : rows[i].segments) {
      if (s.us <= 0) continue;
      out += fmt::format(
          "<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: "
          "{} "
          "({} of the iteration)</title></rect>\n",
          coord(plot.px(acc)), coord(y), coord(std::max(0.5, plot.px(acc + s.us) - plot.px(acc))),
          coord(h), s.colour, s.what, format_us(s.us),
          pct_text(100.0 * s.us / std::max(1e-12, row_total)));
      acc += s.us;
    }
    out += fmt::format(
        "<text class=\"value\" x=\"{}\" y=\"{}\" dy=\"0.32em\">{} \u00b7 {} of Ideal</text>\n",
        coord(plot.px(acc) + 8), coord(y + h / 2), format_us(acc),
        pct_text(acc > 0 ? 100.0 * ideal / acc : 0));
  }
  std::vector<Plot::LegendItem> legend = {{kComputeColour, "compute", false, true}};
  if (c.plan) legend.push_back({kOverlapColour, "compute overlapping transfers", false, true});
  if (c.plan || c.run)
    legend.push_back({kStallColour, "stall (waiting for transfers)", false, true});
  plot.legend(out, legend);
  out += "</svg>\n";
}

// ---- roofline (Figure 3) -----------------------------------------------------------------------
void roofline_chart(std::string& out, const Context& c) {
  const auto& pts = c.sweep;
  double x_lo = pts.front().total_read_gbps, x_hi = pts.back().total_read_gbps;
  if (!(x_hi > x_lo)) {
    x_lo *= 0.5;
    x_hi *= 2;
  }
  x_lo /= 1.15;
  x_hi *= 1.15;
  Plot plot(x_lo, x_hi, 0, 105, true);
  plot.open(out, "chart-roofline", "Throughput against migration bandwidth", 2 * pts.size());
  plot.axes(
      out, report::log_ticks(x_lo, x_hi), report::nice_ticks(0, 100, 5),
      "total prefetch bandwidth over all tiers (GB/s, log scale)", "throughput (% of Ideal)",
      [](double v) { return tick_label(v); }, [](double v) { return tick_label(v); });
  const std::string y100 = coord(plot.py(100));
  out += fmt::format(
      "<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#111827\" stroke-dasharray=\"3 4\"/>"
      "<text class=\"tick\" x=\"{}\" y=\"{}\">Ideal</text>\n",
      coord(plot.x_left()), coord(plot.x_right()), y100, y100, coord(plot.x_left() + 6),
      coord(plot.py(100) + 16));
  double plan_gbps = 0;
  for (const TierSpec& t : c.plan->tiers) plan_gbps += t.read_gbps;
  const std::string xp = coord(plot.px(plan_gbps));
  out += fmt::format(
      "<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"1.5\" "
      "stroke-dasharray=\"6 4\"/>"
      "<text class=\"tick halo\" x=\"{}\" y=\"{}\" style=\"fill:{}\">this plan's tiers: {:g} "
      "GB/s</text>\n",
      xp, xp, coord(plot.y_top()), coord(plot.y_bottom()), kBudgetColour,
      coord(plot.px(plan_gbps) + 6), coord(plot.y_bottom() - 10), kBudgetColour, plan_gbps);
  std::vector<std::pair<double, double>> best, own;
  for (const SweepPoint& p : pts) {
    best.push_back({plot.px(p.total_read_gbps), plot.py(p.percent_of_ideal)});
    const double own_pct =
        p.own_plan_iteration_us > 0 ? 100.0 * p.ideal_us / p.own_plan_iteration_us : 0;
    own.push_back({plot.px(p.total_read_gbps), plot.py(own_pct)});
  }
  polyline(out, "plan made at this bandwidth", own, "#9ca3af", 1.6, true);
  polyline(out, "best plan", best, kResidentColour, 2.4);
  for (size_t i = 0; i < pts.size(); ++i) {
    const SweepPoint& p = pts[i];
    out += fmt::format(
        "<circle class=\"point\" cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"{}\"><title>{:.2f}\u00d7 "
        "bandwidth: {:.1f} GB/s read, "
        "{:.1f} GB/s write\niteration {} ({} of Ideal), stall {}\nplan made at point {}, {} "
        "moves</title></circle>\n",
        coord(best[i].first), coord(best[i].second), kResidentColour, p.scale, p.total_read_gbps,
        p.total_write_gbps, format_us(p.iteration_us), pct_text(p.percent_of_ideal),
        format_us(p.stall_us), p.plan_point, p.plan_moves);
  }
  plot.legend(out, {{kResidentColour, "best plan made at this or a lower bandwidth"},
                    {"#9ca3af", "plan made at this bandwidth", true},
                    {kBudgetColour, "bandwidth of the plan's tiers", true}});
  out += "</svg>\n";
}

// ---- summary ----------------------------------------------------------------------------------
void row(std::string& out, std::string_view what, const std::string& predicted,
         const std::string& measured) {
  out += fmt::format("<tr><th>{}</th><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\n",
                     escape(what), escape(predicted), escape(measured));
}

void summary(std::string& out, const Context& c) {
  const TraceStats& s = c.stats;
  out +=
      "<div class=\"grid2\"><div><table id=\"summary-trace\"><tr><th "
      "colspan=\"2\">trace</th></tr>\n";
  auto kv = [&](std::string_view k, const std::string& v) {
    out += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", escape(k), escape(v));
  };
  if (!c.opt.trace_label.empty()) kv("file", c.opt.trace_label);
  for (const auto& [key, value] : s.meta) kv(key, meta_text(value));
  kv("kernels", fmt::format("{}", s.num_kernels));
  kv("tensors", fmt::format("{} ({} unused)", s.num_tensors, s.unused_tensors));
  kv("Ideal iteration (sum of kernel times)", format_us(s.total_time_us));
  kv("peak required without offloading", bytes_text(static_cast<double>(s.peak_bytes)));
  kv("persistent tensors", bytes_text(static_cast<double>(s.persistent_bytes)));
  kv("active per kernel",
     fmt::format("mean {} ({:.2f}% of peak), max {} ({:.2f}%)", bytes_text(s.active_mean_bytes),
                 100 * s.active_mean_fraction_of_peak,
                 bytes_text(static_cast<double>(s.active_max_bytes)),
                 100 * s.active_max_fraction_of_peak));
  kv("inactive periods",
     fmt::format("{} ({:.1f}% longer than 10 ms, {:.1f}% longer than a {:g} GB/s transfer)",
                 s.periods, 100 * s.fraction_longer_than_10ms,
                 100 * s.fraction_longer_than_ssd_transfer, s.ssd_gbps));
  std::string phases;
  std::array<size_t, 3> spans{}, kernels{};
  for (const PhaseSpan& p : c.phases) {
    spans[static_cast<int>(p.phase)]++;
    kernels[static_cast<int>(p.phase)] += p.end - p.begin;
  }
  for (int p = 0; p < 3; ++p) {
    phases += fmt::format("{}{}: {} span(s), {} kernels", p ? "; " : "",
                          to_string(static_cast<Phase>(p)), spans[p], kernels[p]);
  }
  kv("phases (inferred)", phases);
  out +=
      "</table></div>\n<div><table id=\"summary-plan\"><tr><th></th><th>predicted "
      "(simulated)</th><th>measured</th></tr>\n";
  const std::string none = "\u2014";
  const RunMeasurement* run = c.run;
  if (!c.opt.plan_label.empty() || !c.opt.run_label.empty()) {
    row(out, "file", c.opt.plan_label.empty() ? none : c.opt.plan_label,
        c.opt.run_label.empty() ? none : c.opt.run_label);
  }
  if (c.plan) {
    row(out, "GPU budget", bytes_text(static_cast<double>(c.plan->budget_bytes)), none);
    for (size_t t = 0; t < c.plan->tiers.size(); ++t) {
      const TierSpec& tier = c.plan->tiers[t];
      row(out, fmt::format("tier {}", tier.name),
          fmt::format("{} capacity, {:g} GB/s read, {:g} GB/s write",
                      bytes_text(static_cast<double>(tier.capacity_bytes)), tier.read_gbps,
                      tier.write_gbps),
          none);
    }
    row(out, "moves",
        fmt::format("{} ({} urgent fetches)", c.plan->moves.size(), c.sim.urgent_fetches), none);
  }
  const double ideal = s.total_time_us;
  auto pct_of_ideal = [&](double it) { return pct_text(it > 0 ? 100.0 * ideal / it : 0); };
  row(out, "iteration time", c.plan ? format_us(c.sim.iteration_us) : format_us(ideal),
      run ? format_us(run->iteration_us) : none);
  row(out, "% of Ideal", c.plan ? pct_of_ideal(c.sim.iteration_us) : "100.0%",
      run ? pct_of_ideal(run->iteration_us) : none);
  row(out, "stall", c.plan ? format_us(c.sim.stall_us) : format_us(0),
      run ? format_us(run->stall_us) : none);
  if (c.plan) row(out, "overlap (transfers hidden by kernels)", format_us(c.sim.overlap_us), none);
  if (c.plan) {
    // What the plan frees without moving bytes over a link (docs/planner.md): recomputes, clean
    // offloads (the tier's copy kept) and discards (dead tensors).
    row(out, "recomputes per iteration",
        fmt::format("{} ({} of kernels rerun)", c.sim.recomputes, format_us(c.sim.recompute_us)),
        none);
    row(out, "clean offloads per iteration",
        fmt::format("{} ({} not written)", c.sim.clean_offloads,
                    bytes_text(static_cast<double>(c.sim.clean_offload_bytes))),
        none);
    row(out, "discards per iteration",
        fmt::format("{} ({} not written)", c.sim.discards,
                    bytes_text(static_cast<double>(c.sim.discarded_bytes))),
        none);
  }
  row(out, "peak resident",
      bytes_text(static_cast<double>(c.plan ? c.check.peak_bytes : s.peak_bytes)),
      run ? bytes_text(static_cast<double>(run->peak_bytes)) : none);
  // Per-tier traffic: the plan's tiers, then tiers only the run names.
  std::vector<std::string> names;
  if (c.plan) {
    for (const TierSpec& t : c.plan->tiers) names.push_back(t.name);
  }
  if (run) {
    for (const RunTierBytes& t : run->tiers) {
      if (std::find(names.begin(), names.end(), t.name) == names.end()) names.push_back(t.name);
    }
  }
  for (size_t i = 0; i < names.size(); ++i) {
    std::string predicted = none, measured = none;
    if (c.plan && i < c.plan->tiers.size()) {
      const TierTraffic& tt = c.sim.tiers[i];
      predicted = fmt::format("{} out, {} in", bytes_text(static_cast<double>(tt.offload_bytes)),
                              bytes_text(static_cast<double>(tt.prefetch_bytes)));
    }
    if (run) {
      for (const RunTierBytes& t : run->tiers) {
        if (t.name == names[i]) {
          measured = fmt::format("{} out, {} in", bytes_text(static_cast<double>(t.offload_bytes)),
                                 bytes_text(static_cast<double>(t.prefetch_bytes)));
        }
      }
    }
    row(out, fmt::format("{} traffic per iteration", names[i]), predicted, measured);
  }
  out += "</table></div></div>\n";
}

}  // namespace

std::string render_report(const Trace& trace, const Plan* plan, const RunMeasurement* run,
                          const ReportOptions& options) {
  TERAIO_CHECK(options.max_points >= 16, "report: max_points must be at least 16, got {}",
               options.max_points);
  TERAIO_CHECK(options.sweep_steps >= 0, "report: sweep steps must be >= 0, got {}",
               options.sweep_steps);
  TERAIO_CHECK(options.sweep_min_scale > 0 && options.sweep_min_scale <= options.sweep_max_scale &&
                   std::isfinite(options.sweep_max_scale),
               "report: bad sweep scales {}..{}", options.sweep_min_scale, options.sweep_max_scale);
  TERAIO_CHECK(trace.num_kernels() > 0, "report: the trace has no kernels");
  trace.validate();

  Context c{trace, plan, run, options, infer_phases(trace), compute_trace_stats(trace), {},
            {},    {},   {},  {}};
  const Lifetimes lifetimes(trace);
  c.required = memory_curve(trace, lifetimes);
  c.active = active_bytes(trace);
  if (plan) {
    c.check = check_plan(trace, lifetimes, *plan);
    TERAIO_CHECK(c.check.valid,
                 "report: the plan does not fit the trace ({} problem(s)); first: {}",
                 c.check.error_count, c.check.errors.empty() ? "" : c.check.errors.front());
    SimOptions sim_opts;
    sim_opts.record_timeline = true;
    c.sim = simulate(trace, *plan, sim_opts);
    if (options.sweep_steps > 0) {
      PlannerOptions base;
      base.budget_bytes = plan->budget_bytes;
      base.tiers = plan->tiers;
      base.discard_dead = plan->discard_dead;
      SweepOptions sweep;
      sweep.steps = options.sweep_steps;
      sweep.min_scale = options.sweep_min_scale;
      sweep.max_scale = options.sweep_max_scale;
      c.sweep = sweep_bandwidth(trace, base, sweep);
    }
  }

  std::string model = meta_text(trace.meta_value("model"));
  const std::string title = options.title.empty() ? fmt::format("teraio report \u2014 {}",
                                                                model.empty() ? "trace" : model)
                                                  : options.title;
  std::string out;
  out.reserve(1 << 19);
  out += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += fmt::format("<title>{}</title>\n<style>{}</style>\n</head><body><main>\n", escape(title),
                     kCss);
  out += fmt::format(
      "<h1>{}</h1>\n<p class=\"sub\">{} kernels, {} tensors{}{}. Hover over a chart for "
      "values.</p>\n",
      escape(title), trace.num_kernels(), trace.num_tensors(),
      plan ? fmt::format(", plan with {} moves", plan->moves.size()) : std::string(),
      run ? ", measured run" : "");

  out += "<section id=\"summary\"><h2>Summary</h2>\n";
  summary(out, c);
  out += "</section>\n";

  out += "<section id=\"memory\"><h2>Memory over the iteration</h2>\n";
  memory_chart(out, c);
  out += fmt::format(
      "<p class=\"caption\">Bytes on the GPU at each kernel (maximum over bins of {} kernels): "
      "required without "
      "offloading (M[k]), {}and the bytes each kernel itself touches. Bands mark the inferred "
      "forward, backward and "
      "optimizer phases.</p>\n",
      std::max<size_t>(1, trace.num_kernels() / std::min(trace.num_kernels(), options.max_points)),
      plan ? "resident under the plan, the budget, " : "");
  out += "</section>\n";

  out += "<section id=\"periods\"><h2>Inactive periods by tensor size and length</h2>\n";
  periods_chart(out, c);
  out += fmt::format(
      "<p class=\"caption\">Each bar splits one tensor-size bucket's inactive periods (gaps "
      "between consecutive uses, "
      "wrapping around the iteration for persistent tensors) by length, as in the paper's Figure "
      "2. {} periods in "
      "all; {:.1f}% last longer than 10 ms.</p>\n",
      c.stats.periods, 100 * c.stats.fraction_longer_than_10ms);
  out += "</section>\n";

  out += "<section id=\"bandwidth\"><h2>Bandwidth over the iteration</h2>\n";
  if (plan) {
    bandwidth_chart(out, c);
    out +=
        "<p class=\"caption\">Simulated bandwidth of each tier and direction in the steady-state "
        "iteration "
        "(mean over bins; transfers that cross the iteration boundary wrap around), with the "
        "links' limits "
        "dotted, as in the paper's Figure 10.</p>\n";
  } else {
    out += "<p class=\"note\">Needs a plan (--plan).</p>\n";
  }
  out += "</section>\n";

  out += "<section id=\"breakdown\"><h2>Where the iteration time goes</h2>\n";
  breakdown_chart(out, c);
  out +=
      "<p class=\"caption\">Compute, compute overlapped with transfers, and stall (the compute "
      "stream waiting "
      "for a transfer), as in the paper's Figure 8. Percentages are throughput relative to Ideal "
      "(unlimited "
      "GPU memory).</p>\n";
  out += "</section>\n";

  out += "<section id=\"roofline\"><h2>Bandwidth roofline</h2>\n";
  if (plan && !c.sweep.empty()) {
    roofline_chart(out, c);
    out += fmt::format(
        "<p class=\"caption\">Replanned and simulated with every tier's bandwidth scaled from "
        "{:g}\u00d7 to {:g}\u00d7 "
        "({} points), same budget and capacities, as in the paper's Figure 3.</p>\n",
        options.sweep_min_scale, options.sweep_max_scale, c.sweep.size());
  } else {
    out +=
        fmt::format("<p class=\"note\">{}</p>\n",
                    plan ? "Left out (--sweep-steps 0)."
                         : "Needs a plan (--plan): the sweep replans with its budget and tiers.");
  }
  out += "</section>\n";
  out +=
      "<p class=\"sub\">Generated by teraio report. Self-contained: no scripts, fonts or other "
      "files are "
      "loaded.</p>\n</main></body></html>\n";
  return out;
}

}  // namespace teraio
