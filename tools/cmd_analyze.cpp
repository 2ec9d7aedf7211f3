// `teraio analyze`: the characterization of one trace (docs/analyze.md) — memory curve peak, active
// bytes per kernel, inactive periods by size and length — as an aligned table or as JSON.
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "option_checks.h"
#include "teraio/trace_stats.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

struct AnalyzeArgs {
  std::string trace_path;
  bool json = false;
  TraceStatsOptions options;
};

std::string pct(double fraction) { return fmt::format("{:.2f}%", 100.0 * fraction); }
std::string share(uint64_t part, uint64_t whole) {
  return whole ? pct(static_cast<double>(part) / static_cast<double>(whole)) : "-";
}

void print_table(const Trace& trace, const TraceStats& s, const std::string& path) {
  fmt::print("trace                {}\n", path);
  for (const auto& [key, value] : s.meta) {
    // Strings without escapes print bare; anything else as its raw JSON.
    const bool plain = value.size() >= 2 && value.front() == '"' && value.back() == '"' &&
                       value.find('\\') == std::string::npos;
    fmt::print("  {:<20} {}\n", key, plain ? value.substr(1, value.size() - 2) : value);
  }
  fmt::print("kernels              {}   total time {}\n", s.num_kernels, format_us(s.total_time_us));
  fmt::print("tensors              {}   unused {}\n", s.num_tensors, s.unused_tensors);
  std::string peak_at =
      s.num_kernels ? fmt::format(" at kernel {} ({})", s.peak_kernel,
                                  trace.kernel_name(static_cast<KernelIndex>(s.peak_kernel)))
                    : "";
  fmt::print("peak memory M[k]     {}{}\n", format_bytes(static_cast<double>(s.peak_bytes)), peak_at);
  fmt::print("mean memory M[k]     {}\n", format_bytes(s.mean_memory_bytes));
  fmt::print("persistent           {}\n", format_bytes(static_cast<double>(s.persistent_bytes)));
  std::string active_at =
      s.num_kernels ? fmt::format(" at kernel {} ({})", s.active_max_kernel,
                                  trace.kernel_name(static_cast<KernelIndex>(s.active_max_kernel)))
                    : "";
  fmt::print("active per kernel    max {} = {} of peak{}\n",
             format_bytes(static_cast<double>(s.active_max_bytes)), pct(s.active_max_fraction_of_peak),
             active_at);
  fmt::print("                     mean {} = {} of peak\n", format_bytes(s.active_mean_bytes),
             pct(s.active_mean_fraction_of_peak));

  fmt::print("\n{:<20} {:>10} {:>12}\n", "tensors by kind", "tensors", "bytes");
  for (int k = 0; k < kNumTensorKinds; ++k) {
    fmt::print("  {:<18} {:>10} {:>12}\n", to_string(static_cast<TensorKind>(k)), s.kind_tensors[k],
               format_bytes(static_cast<double>(s.kind_bytes[k])));
  }

  fmt::print("\ninactive periods     {}   wrapping around the iteration {}\n", s.periods,
             s.wrapping_periods);
  fmt::print("  longer than 10 ms                        {:>10} ({})\n", s.periods_longer_than_10ms,
             pct(s.fraction_longer_than_10ms));
  fmt::print("  longer than moving the tensor at {:g} GB/s {:>8} ({})\n", s.ssd_gbps,
             s.periods_longer_than_ssd_transfer, pct(s.fraction_longer_than_ssd_transfer));

  fmt::print("\n{:<12} {:>8} {:>8} {:>8} {:>10}", "size", "tensors", "periods", "share", "bytes");
  for (int l = 0; l < kNumLengthBuckets; ++l) fmt::print(" {:>9}", length_bucket_label(l));
  fmt::print("\n");
  for (int b = 0; b < kNumSizeBuckets; ++b) {
    fmt::print("{:<12} {:>8} {:>8} {:>8} {:>10}", size_bucket_label(b), s.tensors_by_size[b],
               s.periods_by_size[b], share(s.periods_by_size[b], s.periods),
               format_bytes(static_cast<double>(s.period_bytes_by_size[b])));
    for (int l = 0; l < kNumLengthBuckets; ++l) fmt::print(" {:>9}", s.periods_by_size_and_length[b][l]);
    fmt::print("\n");
  }
  fmt::print("{:<12} {:>8} {:>8} {:>8} {:>10}", "all", s.num_tensors - s.unused_tensors, s.periods,
             share(s.periods, s.periods), "");
  for (int l = 0; l < kNumLengthBuckets; ++l) fmt::print(" {:>9}", s.periods_by_length[l]);
  fmt::print("\n");

  fmt::print("\n{:<58} {:>8} {:>12} {:>8}\n", "top kernels by time", "count", "time", "share");
  for (const auto& g : s.top_kernels) {
    fmt::print("  {:<56} {:>8} {:>12} {:>8}\n", g.name, g.count, format_us(g.time_us),
               s.total_time_us > 0 ? pct(g.time_us / s.total_time_us) : "-");
  }
}

int run_analyze(const AnalyzeArgs& args) {
  Trace trace = read_trace(args.trace_path);
  TraceStats stats = compute_trace_stats(trace, args.options);
  if (args.json) {
    fmt::print("{}", trace_stats_to_json(stats));
  } else {
    print_table(trace, stats, args.trace_path);
  }
  return 0;
}

const Registration kAnalyze{{
    "analyze",
    "Characterize a trace: memory peak, active bytes, inactive periods by size and length",
    10,
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<AnalyzeArgs>();
      sub.add_option("trace", args->trace_path, "trace file (teraio.trace JSON)")->required();
      sub.add_flag("--json", args->json, "print one JSON object instead of the table");
      sub.add_option("--ssd-gbps", args->options.ssd_gbps,
                     "bandwidth (GB/s) for 'periods longer than moving the tensor to an SSD'")
          ->capture_default_str()
          ->check(positive<double>());
      return [args] { return run_analyze(*args); };
    },
}};

}  // namespace
}  // namespace teraio::cli
