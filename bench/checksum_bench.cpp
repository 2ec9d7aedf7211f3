// Checksum benchmark (docs/benchmarks.md, "Integrity"): how fast one core computes the tiers'
// integrity check (storage::checksum, XXH3-64) over the piece sizes a file tier checksums, next to
// a plain memcpy of the same bytes on the same core (the cost the bounce buffer already pays).
// Medians and spread over repeated runs, one line per size, or JSON.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "summary.h"
#include "teraio/storage.h"
#include "teraio/units.h"

namespace {

using Clock = std::chrono::steady_clock;

using teraio::bench::Summary;
using teraio::bench::summarize;

// GB/s of `fn` over `bytes`, once per repeat, each repeat long enough to time (>= 20 ms).
template <class F>
Summary rate(uint64_t bytes, int repeats, F&& fn) {
  std::vector<double> gbps;
  for (int r = 0; r < repeats; ++r) {
    uint64_t done = 0;
    const auto t0 = Clock::now();
    double s = 0;
    do {
      fn();
      done += bytes;
      s = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (s < 0.02);
    gbps.push_back(double(done) / s / 1e9);
  }
  return summarize(gbps);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"checksum_bench: one core's checksum (XXH3-64) and memcpy speed per piece size"};
  std::vector<std::string> sizes = {"64KiB", "1MiB", "16MiB"};
  int repeats = 7;
  bool json = false;
  app.add_option("--size", sizes, "piece sizes (the file tier checksums each stripe piece)")
      ->capture_default_str();
  app.add_option("--repeats", repeats, "timed repeats per size (median and spread)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_flag("--json", json, "one JSON object instead of a table");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> rows;
  for (const std::string& text : sizes) {
    const uint64_t n = teraio::parse_size(text, "--size");
    std::vector<unsigned char> a(n), b(n);
    for (uint64_t i = 0; i < n; ++i) a[i] = static_cast<unsigned char>(i * 131 + (i >> 9));
    volatile uint64_t sink = 0;
    const Summary sum = rate(n, repeats, [&] { sink = sink + teraio::storage::checksum(a.data(), n); });
    const Summary copy = rate(n, repeats, [&] {
      std::memcpy(b.data(), a.data(), n);
      sink = sink + b[n / 2];
    });
    if (json) {
      rows.push_back(fmt::format(
          "{{\"bytes\":{},\"checksum_gbps\":{{\"median\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}},"
          "\"memcpy_gbps\":{{\"median\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}}}}",
          n, sum.median, sum.min, sum.max, copy.median, copy.min, copy.max));
    } else {
      fmt::print("{:>8}  checksum {:6.2f} GB/s [{:.2f}, {:.2f}]   memcpy {:6.2f} GB/s [{:.2f}, {:.2f}]\n",
                 text, sum.median, sum.min, sum.max, copy.median, copy.min, copy.max);
    }
  }
  if (json) fmt::print("{{\"repeats\":{},\"sizes\":[{}]}}\n", repeats, fmt::format("{}", fmt::join(rows, ",")));
  return 0;
}
