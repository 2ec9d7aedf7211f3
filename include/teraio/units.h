// Parsing and printing of sizes, bandwidths and durations, so every command accepts and shows them
// the same way: "40GiB", "512MiB", "1.5GB", "4096" (bytes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace teraio {

constexpr uint64_t kKiB = 1024ull;
constexpr uint64_t kMiB = 1024ull * kKiB;
constexpr uint64_t kGiB = 1024ull * kMiB;
constexpr uint64_t kTiB = 1024ull * kGiB;

// Parses a byte count: a non-negative number with an optional suffix B, KiB, MiB, GiB, TiB (binary)
// or KB, MB, GB, TB (decimal), case-insensitive for the prefix letter. Throws teraio::Error naming
// `what` (e.g. "--budget") on anything else, on a fraction of a byte, or on overflow.
uint64_t parse_size(std::string_view text, std::string_view what = "size");

// "1.50 GiB", "512.0 MiB", "4096 B".
std::string format_bytes(double bytes);

// "812.5 us", "12.30 ms", "1.234 s".
std::string format_us(double us);

// The steady clock in microseconds since an arbitrary epoch: for measuring durations.
double steady_us();

// Adds to `sum` (a double, or a std::atomic<double> several threads add to) the microseconds from
// its making to the end of its scope, however the scope ends.
template <class Sum>
class AddElapsedUs {
 public:
  explicit AddElapsedUs(Sum& sum) : sum_(sum), t0_(steady_us()) {}
  ~AddElapsedUs() { sum_ += steady_us() - t0_; }
  AddElapsedUs(const AddElapsedUs&) = delete;
  AddElapsedUs& operator=(const AddElapsedUs&) = delete;
  double t0() const { return t0_; }

 private:
  Sum& sum_;
  double t0_;
};

// Parses a strictly positive finite decimal number; throws naming `what` otherwise.
double parse_positive_double(std::string_view text, std::string_view what);

// The fields of `text` between the separators `sep`, empty ones included ("a::b" -> a, "", b;
// "" -> one empty field): the pieces of a colon- or comma-separated command-line value.
std::vector<std::string_view> split_fields(std::string_view text, char sep);

}  // namespace teraio
