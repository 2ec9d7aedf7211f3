// Range checks of the commands' numeric options, as CLI11 validators: a value outside its range is
// a one-line error naming the option ("--iterations: must be in [1, 1000], got 0") and exit status
// 1 (main.cpp), before any input is read. NaN and infinities are outside every range. A value that
// is not a number of the option's type ("x", 2^32 for a 32-bit count) is left to CLI11's
// conversion: a command line that does not parse, status 2.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>

#include <fmt/format.h>

namespace teraio::cli {

// A validator of values of type T for which `ok` holds; `range` says which, e.g. "in [1, 10]".
template <class T>
CLI::Validator must_be(std::function<bool(T)> ok, std::string range) {
  return CLI::Validator(
      [ok = std::move(ok), range](std::string& text) -> std::string {
        T value{};
        // Not a number of the option's type: CLI11's conversion says so (a usage error, status 2).
        if (!CLI::detail::lexical_cast(text, value)) return std::string();
        if constexpr (std::is_floating_point_v<T>) {
          if (!std::isfinite(value)) return fmt::format("must be {}, got {}", range, text);
        }
        return ok(value) ? std::string() : fmt::format("must be {}, got {}", range, text);
      },
      /*validator_desc=*/"");
}

template <class T>
CLI::Validator in_range(T lo, T hi) {
  return must_be<T>([lo, hi](T v) { return v >= lo && v <= hi; },
                    fmt::format("in [{}, {}]", lo, hi));
}

template <class T>
CLI::Validator at_least(T lo) {
  return must_be<T>([lo](T v) { return v >= lo; }, fmt::format(">= {}", lo));
}

template <class T>
CLI::Validator positive() {
  return must_be<T>([](T v) { return v > 0; }, "> 0");
}

// (0, hi]: durations and factors that must be positive and bounded.
inline CLI::Validator positive_at_most(double hi) {
  return must_be<double>([hi](double v) { return v > 0 && v <= hi; },
                         fmt::format("in (0, {}]", hi));
}

}  // namespace teraio::cli
