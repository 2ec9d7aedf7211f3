// Size and duration parsing/printing shared by every command.
#include "teraio/units.h"

#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "teraio/error.h"

namespace teraio {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

double steady_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t parse_size(std::string_view text, std::string_view what) {
  const std::string shown(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  std::string_view number = text.substr(0, i);
  std::string_view suffix = text.substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  TERAIO_CHECK(!number.empty(),
               "{}: '{}' is not a size (expected e.g. 40GiB, 512MiB, 1.5GB or a byte count)", what,
               shown);
  double value = 0;
  auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  TERAIO_CHECK(ec == std::errc() && ptr == number.data() + number.size(),
               "{}: '{}' is not a size (bad number)", what, shown);
  struct Unit {
    std::string_view name;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},     {"B", 1},       {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30},
      {"TiB", 0x1p40}, {"K", 0x1p10}, {"M", 0x1p20}, {"G", 0x1p30}, {"T", 0x1p40},
      {"KB", 1e3}, {"MB", 1e6},    {"GB", 1e9},      {"TB", 1e12},
  };
  for (const Unit& u : kUnits) {
    if (iequals(suffix, u.name)) {
      const double bytes = value * u.scale;
      TERAIO_CHECK(std::isfinite(bytes) && bytes < 0x1p63, "{}: '{}' is too large", what, shown);
      TERAIO_CHECK(bytes == std::floor(bytes), "{}: '{}' is not a whole number of bytes", what,
                   shown);
      return static_cast<uint64_t>(bytes);
    }
  }
  throw Error(fmt::format("{}: '{}' has an unknown unit '{}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                          what, shown, std::string(suffix)));
}

std::string format_bytes(double bytes) {
  const double a = std::fabs(bytes);
  if (a >= 0x1p40) return fmt::format("{:.2f} TiB", bytes / 0x1p40);
  if (a >= 0x1p30) return fmt::format("{:.2f} GiB", bytes / 0x1p30);
  if (a >= 0x1p20) return fmt::format("{:.1f} MiB", bytes / 0x1p20);
  if (a >= 0x1p10) return fmt::format("{:.1f} KiB", bytes / 0x1p10);
  return fmt::format("{:.0f} B", bytes);
}

std::string format_us(double us) {
  const double a = std::fabs(us);
  if (a >= 1e6) return fmt::format("{:.3f} s", us / 1e6);
  if (a >= 1e3) return fmt::format("{:.2f} ms", us / 1e3);
  return fmt::format("{:.1f} us", us);
}

double parse_positive_double(std::string_view text, std::string_view what) {
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TERAIO_CHECK(ec == std::errc() && ptr == text.data() + text.size() && std::isfinite(value) &&
                   value > 0,
               "{}: '{}' is not a positive number", what, std::string(text));
  return value;
}

std::vector<std::string_view> split_fields(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(sep, begin);
    out.push_back(text.substr(begin, end == std::string_view::npos ? end : end - begin));
    if (end == std::string_view::npos) return out;
    begin = end + 1;
  }
}

}  // namespace teraio
