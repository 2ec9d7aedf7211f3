// Trace statistics for `teraio analyze` and reports (docs/analyze.md): one pass over the memory
// curve, the active bytes and the inactive periods, all from analysis.h.
#include "teraio/trace_stats.h"
#include "teraio/json_text.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "teraio/analysis.h"
#include "teraio/error.h"

namespace teraio {
namespace {

constexpr uint64_t kMB = 1000ull * 1000;
constexpr uint64_t kSizeEdges[kNumSizeBuckets - 1] = {kMB, 10 * kMB, 100 * kMB, 1000 * kMB};
constexpr double kLengthEdgesUs[kNumLengthBuckets - 1] = {1e3, 1e4, 1e5};
constexpr const char* kSizeLabels[kNumSizeBuckets] = {"<1MB", "1-10MB", "10-100MB", "100MB-1GB",
                                                      ">=1GB"};
constexpr const char* kLengthLabels[kNumLengthBuckets] = {"<1ms", "1-10ms", "10-100ms", ">=100ms"};

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// JSON number (never inf or NaN: the trace's bounds keep every sum finite).
std::string num(double v) { return json_number(v); }


template <size_t N>
std::string bucket_object(const std::array<uint64_t, N>& values, const char* const* labels) {
  std::string out = "{";
  for (size_t i = 0; i < N; ++i) {
    out += fmt::format("{}\"{}\": {}", i ? ", " : "", labels[i], values[i]);
  }
  return out + "}";
}

}  // namespace

const char* size_bucket_label(int bucket) { return kSizeLabels[bucket]; }
const char* length_bucket_label(int bucket) { return kLengthLabels[bucket]; }

int size_bucket(uint64_t bytes) {
  int b = 0;
  while (b < kNumSizeBuckets - 1 && bytes >= kSizeEdges[b]) ++b;
  return b;
}

int length_bucket(double length_us) {
  int b = 0;
  while (b < kNumLengthBuckets - 1 && length_us >= kLengthEdgesUs[b]) ++b;
  return b;
}

TraceStats compute_trace_stats(const Trace& trace, const TraceStatsOptions& options) {
  TERAIO_CHECK(options.ssd_gbps > 0 && std::isfinite(options.ssd_gbps),
               "--ssd-gbps must be a positive number, got {}", options.ssd_gbps);
  trace.validate();
  TraceStats s;
  s.meta = trace.meta;
  s.num_kernels = trace.num_kernels();
  s.num_tensors = trace.num_tensors();
  s.total_time_us = trace.total_time_us();
  s.ssd_gbps = options.ssd_gbps;

  const Lifetimes lifetimes(trace);
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    const TensorInfo& info = trace.tensors[t];
    if (!lifetimes.used(t)) {
      ++s.unused_tensors;
      continue;
    }
    const auto kind = static_cast<size_t>(info.kind);
    ++s.kind_tensors[kind];
    s.kind_bytes[kind] += info.bytes;
    ++s.tensors_by_size[size_bucket(info.bytes)];
    if (info.persistent) s.persistent_bytes += info.bytes;
  }

  const std::vector<uint64_t> memory = memory_curve(trace, lifetimes);
  double memory_sum = 0;
  for (size_t k = 0; k < memory.size(); ++k) {
    memory_sum += static_cast<double>(memory[k]);
    if (memory[k] > s.peak_bytes) {
      s.peak_bytes = memory[k];
      s.peak_kernel = k;
    }
  }
  s.mean_memory_bytes = ratio(memory_sum, static_cast<double>(memory.size()));

  const std::vector<uint64_t> active = active_bytes(trace);
  double active_sum = 0;
  for (size_t k = 0; k < active.size(); ++k) {
    active_sum += static_cast<double>(active[k]);
    if (active[k] > s.active_max_bytes) {
      s.active_max_bytes = active[k];
      s.active_max_kernel = k;
    }
  }
  s.active_mean_bytes = ratio(active_sum, static_cast<double>(active.size()));
  s.active_mean_fraction_of_peak = ratio(s.active_mean_bytes, static_cast<double>(s.peak_bytes));
  s.active_max_fraction_of_peak =
      ratio(static_cast<double>(s.active_max_bytes), static_cast<double>(s.peak_bytes));

  const double ssd_bytes_per_us = options.ssd_gbps * 1e3;
  for (const InactivePeriod& p : inactive_periods(trace, lifetimes)) {
    if (!lifetimes.used(p.tensor)) continue;  // an idle persistent tensor: unused, ignored here
    ++s.periods;
    if (p.wraps) ++s.wrapping_periods;
    const int sb = size_bucket(p.bytes), lb = length_bucket(p.length_us);
    ++s.periods_by_size[sb];
    s.period_bytes_by_size[sb] += p.bytes;
    ++s.periods_by_length[lb];
    ++s.periods_by_size_and_length[sb][lb];
    if (p.length_us > static_cast<double>(p.bytes) / ssd_bytes_per_us) ++s.periods_longer_than_ssd_transfer;
    if (p.length_us > 1e4) ++s.periods_longer_than_10ms;
  }
  s.fraction_longer_than_ssd_transfer =
      ratio(static_cast<double>(s.periods_longer_than_ssd_transfer), static_cast<double>(s.periods));
  s.fraction_longer_than_10ms =
      ratio(static_cast<double>(s.periods_longer_than_10ms), static_cast<double>(s.periods));

  std::unordered_map<std::string_view, size_t> index;
  std::vector<TraceStats::KernelGroup> groups;
  for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
    auto [it, inserted] = index.try_emplace(trace.kernel_name(k), groups.size());
    if (inserted) groups.push_back({std::string(trace.kernel_name(k)), 0, 0});
    ++groups[it->second].count;
    groups[it->second].time_us += trace.kernel_time_us(k);
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const auto& a, const auto& b) { return a.time_us > b.time_us; });
  if (groups.size() > 10) groups.resize(10);
  s.top_kernels = std::move(groups);
  return s;
}

std::string trace_stats_to_json(const TraceStats& s) {
  std::string kinds = "{";
  for (int k = 0; k < kNumTensorKinds; ++k) {
    kinds += fmt::format("{}\"{}\": {{\"tensors\": {}, \"bytes\": {}}}", k ? ", " : "",
                         to_string(static_cast<TensorKind>(k)), s.kind_tensors[k], s.kind_bytes[k]);
  }
  kinds += "}";
  std::string matrix = "{";
  for (int b = 0; b < kNumSizeBuckets; ++b) {
    matrix += fmt::format("{}\"{}\": {}", b ? ", " : "", kSizeLabels[b],
                          bucket_object(s.periods_by_size_and_length[b], kLengthLabels));
  }
  matrix += "}";
  std::string top = "[";
  for (size_t i = 0; i < s.top_kernels.size(); ++i) {
    const auto& g = s.top_kernels[i];
    top += fmt::format("{}{{\"name\": {}, \"count\": {}, \"time_us\": {}}}", i ? ", " : "",
                       json_quote(g.name), g.count, num(g.time_us));
  }
  top += "]";

  std::string out = "{\n";
  auto field = [&out](std::string_view key, const std::string& value, bool last = false) {
    out += fmt::format("  \"{}\": {}{}\n", key, value, last ? "" : ",");
  };
  std::string meta = "{";
  for (size_t i = 0; i < s.meta.size(); ++i) {
    meta += fmt::format("{}{}: {}", i ? ", " : "", json_quote(s.meta[i].first), s.meta[i].second);
  }
  field("meta", meta + "}");
  field("num_kernels", fmt::format("{}", s.num_kernels));
  field("num_tensors", fmt::format("{}", s.num_tensors));
  field("unused_tensors", fmt::format("{}", s.unused_tensors));
  field("total_time_us", num(s.total_time_us));
  field("peak_bytes", fmt::format("{}", s.peak_bytes));
  field("peak_kernel", fmt::format("{}", s.peak_kernel));
  field("persistent_bytes", fmt::format("{}", s.persistent_bytes));
  field("mean_memory_bytes", num(s.mean_memory_bytes));
  field("active_max_bytes", fmt::format("{}", s.active_max_bytes));
  field("active_max_kernel", fmt::format("{}", s.active_max_kernel));
  field("active_mean_bytes", num(s.active_mean_bytes));
  field("active_mean_fraction_of_peak", num(s.active_mean_fraction_of_peak));
  field("active_max_fraction_of_peak", num(s.active_max_fraction_of_peak));
  field("kinds", kinds);
  field("tensors_by_size", bucket_object(s.tensors_by_size, kSizeLabels));
  field("periods", fmt::format("{}", s.periods));
  field("wrapping_periods", fmt::format("{}", s.wrapping_periods));
  field("ssd_gbps", num(s.ssd_gbps));
  field("periods_longer_than_ssd_transfer", fmt::format("{}", s.periods_longer_than_ssd_transfer));
  field("fraction_longer_than_ssd_transfer", num(s.fraction_longer_than_ssd_transfer));
  field("periods_longer_than_10ms", fmt::format("{}", s.periods_longer_than_10ms));
  field("fraction_longer_than_10ms", num(s.fraction_longer_than_10ms));
  field("periods_by_size", bucket_object(s.periods_by_size, kSizeLabels));
  field("period_bytes_by_size", bucket_object(s.period_bytes_by_size, kSizeLabels));
  field("periods_by_length", bucket_object(s.periods_by_length, kLengthLabels));
  field("periods_by_size_and_length", matrix);
  field("top_kernels", top, true);
  return out + "}\n";
}

}  // namespace teraio
