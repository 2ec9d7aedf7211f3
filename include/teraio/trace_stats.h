// Statistics of a trace that show why offloading works (the paper's §2 characterization): the
// memory curve and its peak, active bytes per kernel, inactive periods bucketed by tensor size and
// by length, and how many periods are long enough to hide a round trip to an SSD. Shared by
// `teraio analyze` and the HTML report. Pure functions of the trace; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "teraio/trace.h"

namespace teraio {

struct TraceStatsOptions {
  // Bandwidth used to decide whether a period is long enough to move its tensor to an SSD
  // (one Samsung 990 PRO writes at 6.5 GB/s, the paper's figure). Decimal GB/s.
  double ssd_gbps = 6.5;
};

// Size buckets (decimal bytes, as the paper): <1MB, 1–10MB, 10–100MB, 100MB–1GB, >=1GB.
constexpr int kNumSizeBuckets = 5;
// Length buckets (µs): <1ms, 1–10ms, 10–100ms, >=100ms.
constexpr int kNumLengthBuckets = 4;
const char* size_bucket_label(int bucket);
const char* length_bucket_label(int bucket);
int size_bucket(uint64_t bytes);
int length_bucket(double length_us);

struct TraceStats {
  // The trace's meta, as (key, raw JSON value).
  std::vector<std::pair<std::string, std::string>> meta;
  // Kernels and tensors.
  uint64_t num_kernels = 0;
  uint64_t num_tensors = 0;
  uint64_t unused_tensors = 0;  // touched by no kernel (ignored by everything below)
  double total_time_us = 0;

  // Memory curve M[k] without offloading (analysis.h memory_curve).
  uint64_t peak_bytes = 0;
  uint64_t peak_kernel = 0;  // first kernel where M reaches its peak
  uint64_t persistent_bytes = 0;
  double mean_memory_bytes = 0;

  // Bytes of the distinct tensors each kernel touches.
  uint64_t active_max_bytes = 0;
  uint64_t active_max_kernel = 0;
  double active_mean_bytes = 0;
  double active_mean_fraction_of_peak = 0;  // the paper's "1.7%"
  double active_max_fraction_of_peak = 0;   // the paper's "<14%"

  // Bytes and counts by tensor kind (index: TensorKind).
  std::array<uint64_t, kNumTensorKinds> kind_tensors{};
  std::array<uint64_t, kNumTensorKinds> kind_bytes{};

  // Used tensors by size bucket (the shares in the legend of the paper's Figure 2).
  std::array<uint64_t, kNumSizeBuckets> tensors_by_size{};

  // Inactive periods (analysis.h inactive_periods, wrap-around and tails after the last use
  // included; the period of a persistent tensor no kernel uses is not: such tensors are unused).
  uint64_t periods = 0;
  uint64_t wrapping_periods = 0;
  double ssd_gbps = 0;
  // Periods longer than moving their tensor once at ssd_gbps (bytes / bandwidth).
  uint64_t periods_longer_than_ssd_transfer = 0;
  double fraction_longer_than_ssd_transfer = 0;
  uint64_t periods_longer_than_10ms = 0;
  double fraction_longer_than_10ms = 0;
  std::array<uint64_t, kNumSizeBuckets> periods_by_size{};
  std::array<uint64_t, kNumSizeBuckets> period_bytes_by_size{};
  std::array<uint64_t, kNumLengthBuckets> periods_by_length{};
  // [size bucket][length bucket]: the data of the paper's Figure 2 (inactive time per size).
  std::array<std::array<uint64_t, kNumLengthBuckets>, kNumSizeBuckets> periods_by_size_and_length{};

  // Kernel names with the largest total time, longest first (at most 10).
  struct KernelGroup {
    std::string name;
    uint64_t count = 0;
    double time_us = 0;
  };
  std::vector<KernelGroup> top_kernels;
};

// Throws teraio::Error if options are invalid (non-positive bandwidth) or the trace is invalid.
TraceStats compute_trace_stats(const Trace& trace, const TraceStatsOptions& options = {});

// The JSON object `teraio analyze --json` prints (docs/analyze.md documents every key).
std::string trace_stats_to_json(const TraceStats& stats);

}  // namespace teraio
