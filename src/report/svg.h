// Small helpers for the hand-written SVG of the report: escaping, compact numbers, "nice" axis
// ticks, display units, and a Plot that maps data to pixels and draws its frame, grid and axes.
// Internal to src/report.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace teraio::report {

// Escapes & < > " ' for HTML text and attribute values.
std::string escape(std::string_view text);
// A coordinate with one decimal, trailing zeros dropped ("12.5", "40").
std::string coord(double v);
// About `target` round ticks (1, 2, 5 x 10^k) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target);
// Ticks at 1, 2, 5 x 10^k within [lo, hi] (lo > 0), for a log axis.
std::vector<double> log_ticks(double lo, double hi);
// "1.5", "20", "0.25": a tick label.
std::string tick_label(double v);

struct Unit {
  double divisor = 1;  // value / divisor is shown
  std::string name;
};
Unit bytes_unit(double max_bytes);  // GiB, MiB, KiB or B
Unit time_unit(double max_us);      // s, ms or µs

// A chart: a fixed 1000 x 400 viewBox with a plotting area inside margins.
class Plot {
 public:
  static constexpr double kWidth = 1000;
  static constexpr double kHeight = 400;
  double left = 84, right = 28, top = 40, bottom = 64;

  Plot(double x_lo, double x_hi, double y_lo, double y_hi, bool log_x = false);
  double px(double x) const;
  double py(double y) const;
  double x_left() const { return left; }
  double x_right() const { return kWidth - right; }
  double y_top() const { return top; }
  double y_bottom() const { return kHeight - bottom; }

  // <svg ...> with the id, a data-points attribute (for tests) and an accessible title.
  void open(std::string& out, std::string_view id, std::string_view title,
            size_t data_points) const;
  // Grid lines, ticks and axis labels (`*_ticks` in data units, labelled after dividing by unit).
  void axes(std::string& out, const std::vector<double>& x_ticks,
            const std::vector<double>& y_ticks, std::string_view x_label, std::string_view y_label,
            const std::function<std::string(double)>& x_fmt,
            const std::function<std::string(double)>& y_fmt) const;
  // A legend row above the plotting area: (colour, label, dashed).
  struct LegendItem {
    std::string colour;
    std::string label;
    bool dashed = false;
    bool box = false;  // a filled square instead of a line
  };
  void legend(std::string& out, const std::vector<LegendItem>& items) const;
  // A transparent full-height band over data x from x0 to x1 whose tooltip is `tip`.
  void hover_band(std::string& out, double x0, double x1, std::string_view tip) const;

 private:
  double x_lo_, x_hi_, y_lo_, y_hi_;
  bool log_x_;
};

}  // namespace teraio::report
