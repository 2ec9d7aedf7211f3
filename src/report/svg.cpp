// SVG helpers of the report (svg.h): ticks, units, and the frame every chart shares, so all charts
// have the same geometry, fonts and grid.
#include "svg.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace teraio::report {

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string coord(double v) {
  if (!std::isfinite(v)) v = 0;
  std::string s = fmt::format("{:.1f}", v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  if (s == "-0") s = "0";
  return s;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> ticks;
  for (double p = std::pow(10.0, std::floor(std::log10(lo))); p <= hi * 1.0001; p *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double t = m * p;
      if (t >= lo * 0.9999 && t <= hi * 1.0001) ticks.push_back(t);
    }
  }
  return ticks;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e4 && a < 1e9) {  // 15k, 2.5M: kernel indices of large traces
    const bool mega = a >= 1e6;
    std::string s = tick_label(v / (mega ? 1e6 : 1e3));
    return s + (mega ? "M" : "k");
  }
  if (a >= 1e9 || a < 1e-3) return fmt::format("{:.3g}", v);
  std::string s = fmt::format("{:.3f}", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

Unit bytes_unit(double max_bytes) {
  if (max_bytes >= 1024.0 * 1024 * 1024) return {1024.0 * 1024 * 1024, "GiB"};
  if (max_bytes >= 1024.0 * 1024) return {1024.0 * 1024, "MiB"};
  if (max_bytes >= 1024.0) return {1024.0, "KiB"};
  return {1, "B"};
}

Unit time_unit(double max_us) {
  if (max_us >= 2e6) return {1e6, "s"};
  if (max_us >= 2e3) return {1e3, "ms"};
  return {1, "\u00b5s"};
}

Plot::Plot(double x_lo, double x_hi, double y_lo, double y_hi, bool log_x)
    : x_lo_(x_lo),
      x_hi_(x_hi > x_lo ? x_hi : x_lo + 1),
      y_lo_(y_lo),
      y_hi_(y_hi > y_lo ? y_hi : y_lo + 1),
      log_x_(log_x) {}

double Plot::px(double x) const {
  double f = log_x_ ? (std::log(x) - std::log(x_lo_)) / (std::log(x_hi_) - std::log(x_lo_))
                    : (x - x_lo_) / (x_hi_ - x_lo_);
  return x_left() + std::clamp(f, 0.0, 1.0) * (x_right() - x_left());
}

double Plot::py(double y) const {
  const double f = (y - y_lo_) / (y_hi_ - y_lo_);
  return y_bottom() - std::clamp(f, 0.0, 1.0) * (y_bottom() - y_top());
}

void Plot::open(std::string& out, std::string_view id, std::string_view title,
                size_t data_points) const {
  out += fmt::format(
      "<svg class=\"chart\" id=\"{}\" data-points=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" "
      "aria-label=\"{}\">\n",
      escape(id), data_points, kWidth, kHeight, escape(title));
}

void Plot::axes(std::string& out, const std::vector<double>& x_ticks,
                const std::vector<double>& y_ticks, std::string_view x_label,
                std::string_view y_label, const std::function<std::string(double)>& x_fmt,
                const std::function<std::string(double)>& y_fmt) const {
  out += "<g class=\"axes\">\n";
  for (double t : y_ticks) {
    const std::string y = coord(py(t));
    out += fmt::format("<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>",
                       coord(x_left()), coord(x_right()), y, y);
    out += fmt::format(
        "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\" dy=\"0.32em\">{}</text>\n",
        coord(x_left() - 8), y, escape(y_fmt(t)));
  }
  for (double t : x_ticks) {
    const std::string x = coord(px(t));
    out += fmt::format("<line class=\"tickmark\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>", x, x,
                       coord(y_bottom()), coord(y_bottom() + 5));
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       x, coord(y_bottom() + 20), escape(x_fmt(t)));
  }
  out += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n",
                     coord(x_left()), coord(y_top()), coord(x_right() - x_left()),
                     coord(y_bottom() - y_top()));
  out += fmt::format("<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     coord((x_left() + x_right()) / 2), coord(kHeight - 14), escape(x_label));
  const double cy = (y_top() + y_bottom()) / 2;
  out += fmt::format(
      "<text class=\"label\" x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
      "{})\">{}</text>\n",
      coord(cy), coord(cy), escape(y_label));
  out += "</g>\n";
}

void Plot::hover_band(std::string& out, double x0, double x1, std::string_view tip) const {
  const double p0 = px(x0), p1 = px(x1);
  out += fmt::format(
      "<rect class=\"hover\" x=\"{}\" y=\"{}\" width=\"{}\" "
      "height=\"{}\"><title>{}</title></rect>\n",
      coord(p0), coord(y_top()), coord(p1 - p0), coord(y_bottom() - y_top()), escape(tip));
}

void Plot::legend(std::string& out, const std::vector<LegendItem>& items) const {
  out += "<g class=\"legend\">";
  double x = x_left();
  double y = 16;
  for (const LegendItem& it : items) {
    const double width = (it.box ? 14 : 22) + 18 + 7.2 * static_cast<double>(it.label.size());
    if (x > x_left() && x + width - 12 > x_right()) {  // wrap to a second row
      x = x_left();
      y += 20;
    }
    if (it.box) {
      out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"12\" fill=\"{}\"/>",
                         coord(x), coord(y - 6), it.colour);
    } else {
      out += fmt::format(
          "<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"3\"{}/>",
          coord(x), coord(x + 22), coord(y), coord(y), it.colour,
          it.dashed ? " stroke-dasharray=\"6 4\"" : "");
    }
    const double w = it.box ? 14 : 22;
    out += fmt::format("<text class=\"legend-text\" x=\"{}\" y=\"{}\" dy=\"0.32em\">{}</text>",
                       coord(x + w + 6), coord(y), escape(it.label));
    x += width;
  }
  out += "</g>\n";
}

}  // namespace teraio::report
