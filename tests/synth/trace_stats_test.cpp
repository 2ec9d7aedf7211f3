// `teraio analyze` statistics on a hand-made trace whose every number is computed by hand below,
// checked through the JSON that --json prints.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "teraio/error.h"
#include "teraio/trace_stats.h"

namespace teraio {
namespace {

TensorId add(Trace& t, uint64_t bytes, TensorKind kind, bool persistent, const char* name) {
  TensorInfo info;
  info.bytes = bytes;
  info.kind = kind;
  info.persistent = persistent;
  info.name = name;
  return t.add_tensor(info);
}

// Tensors: W 2 MB parameter (persistent), A 0.5 MB activation, T 50 MB temporary, U unused,
// S 1.5 GB optimizer state (persistent, used once).
// Kernels (time):   k0 fwd 1000 {W,A}  k1 mid 20000 {T}  k2 mid2 5000 {T}  k3 bwd 3000 {W,A}
//                   k4 opt 500 {S}
Trace hand_trace() {
  Trace t;
  t.set_meta("model", "\"hand\"");
  const TensorId w = add(t, 2'000'000, TensorKind::parameter, true, "W");
  const TensorId a = add(t, 500'000, TensorKind::activation, false, "A");
  const TensorId tmp = add(t, 50'000'000, TensorKind::temporary, false, "T");
  add(t, 7, TensorKind::other, false, "U");
  const TensorId s = add(t, 1'500'000'000, TensorKind::optimizer_state, true, "S");
  const TensorId k0[] = {w, a}, k1[] = {tmp}, k4[] = {s};
  t.add_kernel("fwd", 1000, k0);
  t.add_kernel("mid", 20000, k1);
  t.add_kernel("mid2", 5000, k1);
  t.add_kernel("bwd", 3000, k0);
  t.add_kernel("opt", 500, k4);
  return t;
}

TEST(TraceStats, HandComputedTrace) {
  const auto j = nlohmann::json::parse(trace_stats_to_json(compute_trace_stats(hand_trace())));
  EXPECT_EQ(j["meta"]["model"], "hand");
  EXPECT_EQ(j["num_kernels"], 5);
  EXPECT_EQ(j["num_tensors"], 5);
  EXPECT_EQ(j["unused_tensors"], 1);
  EXPECT_DOUBLE_EQ(j["total_time_us"].get<double>(), 29500.0);

  // M = persistent 1.502e9 + A on k0..k3 + T on k1..k2.
  EXPECT_EQ(j["persistent_bytes"], 1'502'000'000u);
  EXPECT_EQ(j["peak_bytes"], 1'552'500'000u);
  EXPECT_EQ(j["peak_kernel"], 1);
  EXPECT_DOUBLE_EQ(j["mean_memory_bytes"].get<double>(),
                   (1'502'500'000.0 * 2 + 1'552'500'000.0 * 2 + 1'502'000'000.0) / 5);

  // Active: 2.5e6, 50e6, 50e6, 2.5e6, 1.5e9.
  EXPECT_EQ(j["active_max_bytes"], 1'500'000'000u);
  EXPECT_EQ(j["active_max_kernel"], 4);
  EXPECT_DOUBLE_EQ(j["active_mean_bytes"].get<double>(), 321'000'000.0);
  EXPECT_DOUBLE_EQ(j["active_mean_fraction_of_peak"].get<double>(), 321e6 / 1552.5e6);
  EXPECT_DOUBLE_EQ(j["active_max_fraction_of_peak"].get<double>(), 1500e6 / 1552.5e6);

  // Kinds count used tensors only.
  EXPECT_EQ(j["kinds"]["parameter"]["tensors"], 1);
  EXPECT_EQ(j["kinds"]["parameter"]["bytes"], 2'000'000);
  EXPECT_EQ(j["kinds"]["optimizer_state"]["bytes"], 1'500'000'000u);
  EXPECT_EQ(j["kinds"]["temporary"]["bytes"], 50'000'000);
  EXPECT_EQ(j["kinds"]["other"]["tensors"], 0);
  EXPECT_EQ(j["tensors_by_size"]["<1MB"], 1);
  EXPECT_EQ(j["tensors_by_size"]["1-10MB"], 1);
  EXPECT_EQ(j["tensors_by_size"]["10-100MB"], 1);
  EXPECT_EQ(j["tensors_by_size"][">=1GB"], 1);

  // Periods: W k0->k3 (25 ms), W wraps k3->k0 over k4 (0.5 ms), A k0->k3 (25 ms),
  // S wraps k4->k4 over k0..k3 (29 ms). T's uses are adjacent: no period.
  EXPECT_EQ(j["periods"], 4);
  EXPECT_EQ(j["wrapping_periods"], 2);
  EXPECT_EQ(j["periods_longer_than_10ms"], 3);
  EXPECT_DOUBLE_EQ(j["fraction_longer_than_10ms"].get<double>(), 0.75);
  // At 6.5 GB/s: W needs 308 us, A 77 us, S 231 ms. Only S's period is too short.
  EXPECT_DOUBLE_EQ(j["ssd_gbps"].get<double>(), 6.5);
  EXPECT_EQ(j["periods_longer_than_ssd_transfer"], 3);
  EXPECT_DOUBLE_EQ(j["fraction_longer_than_ssd_transfer"].get<double>(), 0.75);
  EXPECT_EQ(j["periods_by_size"]["<1MB"], 1);
  EXPECT_EQ(j["periods_by_size"]["1-10MB"], 2);
  EXPECT_EQ(j["periods_by_size"]["10-100MB"], 0);
  EXPECT_EQ(j["periods_by_size"][">=1GB"], 1);
  EXPECT_EQ(j["period_bytes_by_size"]["1-10MB"], 4'000'000);
  EXPECT_EQ(j["periods_by_length"]["<1ms"], 1);
  EXPECT_EQ(j["periods_by_length"]["1-10ms"], 0);
  EXPECT_EQ(j["periods_by_length"]["10-100ms"], 3);
  EXPECT_EQ(j["periods_by_length"][">=100ms"], 0);
  EXPECT_EQ(j["periods_by_size_and_length"]["1-10MB"]["<1ms"], 1);
  EXPECT_EQ(j["periods_by_size_and_length"]["1-10MB"]["10-100ms"], 1);
  EXPECT_EQ(j["periods_by_size_and_length"][">=1GB"]["10-100ms"], 1);

  ASSERT_EQ(j["top_kernels"].size(), 5u);
  EXPECT_EQ(j["top_kernels"][0]["name"], "mid");
  EXPECT_EQ(j["top_kernels"][0]["count"], 1);
  EXPECT_EQ(j["top_kernels"][4]["name"], "opt");
}

// The hand trace with T alive through kernel 4 (a tail over k3..k4, 3.5 ms) and U made persistent
// (no kernel uses it: still an unused tensor, its whole-iteration period not counted).
TEST(TraceStats, TailsCountIdleTensorsDoNot) {
  Trace t = hand_trace();
  t.tensors[2].alive_until = 4;
  t.tensors[3].persistent = true;
  const auto j = nlohmann::json::parse(trace_stats_to_json(compute_trace_stats(t)));
  EXPECT_EQ(j["unused_tensors"], 1);
  EXPECT_EQ(j["periods"], 5);
  EXPECT_EQ(j["wrapping_periods"], 2);
  EXPECT_EQ(j["periods_by_size_and_length"]["10-100MB"]["1-10ms"], 1);
  // M: + T over k3..k4 and U (7 bytes) everywhere.
  EXPECT_EQ(j["peak_bytes"], 1'552'500'007u);
  EXPECT_DOUBLE_EQ(j["mean_memory_bytes"].get<double>(),
                   (1'502'500'007.0 + 1'552'500'007.0 * 3 + 1'552'000'007.0) / 5);
}

TEST(TraceStats, SsdBandwidthOption) {
  TraceStatsOptions o;
  o.ssd_gbps = 0.01;  // 10 B/us: W needs 200 ms, A 50 ms, S 150 s: none fits
  TraceStats s = compute_trace_stats(hand_trace(), o);
  EXPECT_EQ(s.periods_longer_than_ssd_transfer, 0u);
  EXPECT_EQ(s.fraction_longer_than_ssd_transfer, 0.0);
  o.ssd_gbps = 0;
  EXPECT_THROW(compute_trace_stats(hand_trace(), o), Error);
}

TEST(TraceStats, EmptyTraceHasZeroesNotNaN) {
  Trace t;
  add(t, 100, TensorKind::other, false, "never used");
  TraceStats s = compute_trace_stats(t);
  EXPECT_EQ(s.unused_tensors, 1u);
  EXPECT_EQ(s.peak_bytes, 0u);
  EXPECT_EQ(s.periods, 0u);
  EXPECT_EQ(s.active_mean_fraction_of_peak, 0.0);
  const auto j = nlohmann::json::parse(trace_stats_to_json(s));
  EXPECT_EQ(j["num_kernels"], 0);
  EXPECT_EQ(j["top_kernels"].size(), 0u);
}

TEST(TraceStats, Buckets) {
  EXPECT_EQ(size_bucket(999'999), 0);
  EXPECT_EQ(size_bucket(1'000'000), 1);
  EXPECT_EQ(size_bucket(100'000'000), 3);
  EXPECT_EQ(size_bucket(1'000'000'000), 4);
  EXPECT_EQ(length_bucket(999.9), 0);
  EXPECT_EQ(length_bucket(1000), 1);
  EXPECT_EQ(length_bucket(1e5), 3);
}

}  // namespace
}  // namespace teraio
