// Tests of the bandwidth probe (probe_bandwidth, run_pass): numbers from a host and a file tier,
// only the requested range of the tier written, a failing tier is an error and not a number, the
// time limit holds, the page cache is named.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <string>

#include "teraio/error.h"
#include "teraio/storage.h"
#include "test_util.h"

namespace teraio::storage {
namespace {

using test::pattern;
using test::TempDir;

constexpr uint64_t kTier = 8 << 20;  // the tier
constexpr uint64_t kFrom = 2 << 20;  // the probe's range: [kFrom, kFrom + kSize)
constexpr uint64_t kSize = 4 << 20;

void expect_numbers(const BandwidthProbe& p) {
  for (const Spread& s : {p.write_gbps, p.read_gbps}) {
    EXPECT_TRUE(std::isfinite(s.median) && s.median > 0) << s.median;
    EXPECT_LE(s.min, s.median);
    EXPECT_LE(s.median, s.max);
  }
  EXPECT_GE(p.write_passes, 1);
  EXPECT_GE(p.read_passes, 1);
  EXPECT_GE(p.both_passes, 1);  // every test's scratch holds at least two requests
  EXPECT_TRUE(std::isfinite(p.both_gbps.median) && p.both_gbps.median > 0) << p.both_gbps.median;
  EXPECT_LE(p.both_gbps.min, p.both_gbps.median);
  EXPECT_LE(p.both_gbps.median, p.both_gbps.max);
  EXPECT_GT(p.elapsed_s, 0);
}

// Fills the whole tier with a pattern, probes [kFrom, kFrom + kSize) and checks that the bytes
// outside that range are still the pattern.
void probe_keeps_the_rest(Tier& tier, const BandwidthProbeOptions& o, BandwidthProbe* out) {
  auto data = pattern(kTier, 3);
  tier.write(BufferView::host(data.data(), data.size()), 0);
  std::vector<unsigned char> scratch(1 << 20);
  *out = probe_bandwidth(tier, BufferView::host(scratch.data(), scratch.size()), kFrom, kSize, o);
  std::vector<unsigned char> back(kTier);
  tier.read(BufferView::host(back.data(), back.size()), 0);
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + kFrom, data.begin()));
  EXPECT_TRUE(std::equal(back.begin() + kFrom + kSize, back.end(), data.begin() + kFrom + kSize));
}

TEST(BandwidthProbe, HostTierGivesNumbersAndTouchesOnlyItsRange) {
  auto tier = make_host_tier({.capacity_bytes = kTier});
  BandwidthProbeOptions o;
  o.request_bytes = 256 << 10;
  BandwidthProbe p;
  probe_keeps_the_rest(*tier, o, &p);
  expect_numbers(p);
  EXPECT_EQ(p.tier, "host");
  EXPECT_EQ(p.engine, "memcpy");
  EXPECT_EQ(p.memory, "host");
  EXPECT_EQ(p.write_passes, o.repetitions);
  EXPECT_EQ(p.read_passes, o.repetitions);
  EXPECT_EQ(p.both_passes, o.repetitions);
  EXPECT_EQ(p.pass_bytes, kSize);
  EXPECT_EQ(p.request_bytes, 256u << 10);
  EXPECT_EQ(p.queue_depth, 4);  // 1 MiB of scratch holds 4 requests of 256 KiB
  EXPECT_FALSE(p.cut);
  EXPECT_FALSE(p.page_cache);
  EXPECT_TRUE(p.notes.empty());
}

TEST(BandwidthProbe, FileTierGivesNumbersAndTouchesOnlyItsRange) {
  TempDir dir;
  FileTierOptions fo;
  fo.paths = {dir.path()};
  fo.capacity_bytes = kTier;
  fo.stripe_bytes = 64 << 10;
  auto tier = make_file_tier(fo);
  BandwidthProbe p;
  probe_keeps_the_rest(*tier, {}, &p);  // 16 MiB requests shrink to what the scratch holds
  expect_numbers(p);
  EXPECT_EQ(p.tier, "file");
  EXPECT_EQ(p.request_bytes, 256u << 10);
  EXPECT_EQ(p.page_cache, tier->info().buffered_io);
}

TEST(BandwidthProbe, BufferedFileTierSaysItMeasuredThePageCache) {
  TempDir dir;
  FileTierOptions fo;
  fo.paths = {dir.path()};
  fo.capacity_bytes = kTier;
  fo.direct_io = false;
  auto tier = make_file_tier(fo);
  EXPECT_TRUE(tier->info().buffered_io);
  std::vector<unsigned char> scratch(1 << 20);
  BandwidthProbe p =
      probe_bandwidth(*tier, BufferView::host(scratch.data(), scratch.size()), 0, kSize);
  expect_numbers(p);
  EXPECT_TRUE(p.page_cache);
  ASSERT_FALSE(p.notes.empty());
  EXPECT_NE(p.notes[0].find("page-cache"), std::string::npos) << p.notes[0];
}

TEST(BandwidthProbe, FailingTierIsAnErrorNamingTheTierNotANumber) {
  FaultOptions f;
  f.rules = {{FaultKind::kEio, 5}};
  auto tier = make_fault_tier(make_host_tier({.capacity_bytes = kTier}), f);
  std::vector<unsigned char> scratch(1 << 20);
  BandwidthProbeOptions o;
  o.request_bytes = 256 << 10;
  try {
    probe_bandwidth(*tier, BufferView::host(scratch.data(), scratch.size()), 0, kSize, o);
    FAIL() << "no error";
  } catch (const teraio::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bandwidth probe of the fault(host) tier"), std::string::npos) << m;
    EXPECT_NE(m.find("Input/output error"), std::string::npos) << m;
    EXPECT_NE(m.find("at offset 1310720"), std::string::npos) << m;  // request 5 of 256 KiB
  }
  // A short read is a failure too.
  f.rules = {{FaultKind::kShortRead, 70}};  // 16 requests per pass: 4 write passes, then reads
  tier = make_fault_tier(make_host_tier({.capacity_bytes = kTier}), f);
  EXPECT_THROW(
      probe_bandwidth(*tier, BufferView::host(scratch.data(), scratch.size()), 0, kSize, o),
      teraio::Error);
}

TEST(BandwidthProbe, TimeLimitHolds) {
  FaultOptions f;
  f.rules = {{FaultKind::kSlow, 0, 1u << 30, 20000}};  // every request completes 20 ms late
  auto tier = make_fault_tier(make_host_tier({.capacity_bytes = kTier}), f);
  std::vector<unsigned char> scratch(1 << 20);
  BandwidthProbeOptions o;
  o.request_bytes = 256 << 10;  // 16 requests per pass: a pass takes >= 320 ms
  o.time_limit_s = 0.2;
  const auto t0 = std::chrono::steady_clock::now();
  BandwidthProbe p =
      probe_bandwidth(*tier, BufferView::host(scratch.data(), scratch.size()), 0, kSize, o);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect_numbers(p);
  EXPECT_TRUE(p.cut);
  EXPECT_EQ(p.write_passes, 1);
  EXPECT_EQ(p.read_passes, 1);
  EXPECT_LT(p.pass_bytes, kSize);
  // The limit plus what is in flight when it is reached (4 requests of 20 ms, in each direction),
  // with room for a loaded machine; without the limit the 3 + 3 passes would take >= 1.9 s.
  EXPECT_LT(wall_s, 0.2 + 2 * 4 * 0.02 + 1.0) << wall_s;
  ASSERT_FALSE(p.notes.empty());
  EXPECT_NE(p.notes.back().find("time limit"), std::string::npos) << p.notes.back();
}

TEST(BandwidthProbe, BothWaysIsOptionalAndNeedsTwoRequestsInFlight) {
  auto tier = make_host_tier({.capacity_bytes = kTier});
  std::vector<unsigned char> scratch(1 << 20);
  BandwidthProbeOptions o;
  o.request_bytes = 256 << 10;
  o.both_ways = false;
  BandwidthProbe p =
      probe_bandwidth(*tier, BufferView::host(scratch.data(), scratch.size()), 0, kSize, o);
  EXPECT_EQ(p.both_passes, 0);
  EXPECT_EQ(p.both_gbps.median, 0);
  EXPECT_EQ(p.read_passes, o.repetitions);
  // One request in flight: reads and writes cannot be in flight together.
  o.both_ways = true;
  o.queue_depth = 1;
  p = probe_bandwidth(*tier, BufferView::host(scratch.data(), scratch.size()), 0, kSize, o);
  EXPECT_EQ(p.queue_depth, 1);
  EXPECT_EQ(p.both_passes, 0);
  EXPECT_GE(p.read_passes, 1);
}

TEST(Spread, UpperQuartileInterpolatesBetweenThePasses) {
  EXPECT_EQ(spread({}).upper, 0);
  EXPECT_EQ(spread({7}).upper, 7);
  EXPECT_DOUBLE_EQ(spread({5, 1, 3, 2, 4}).upper, 4);
  // The H100 probe of Note [A probe caught in a slow moment]: halfway between 26.4 and 47.0.
  const Spread s = spread({47.0, 24.2, 26.4});
  EXPECT_DOUBLE_EQ(s.median, 26.4);
  EXPECT_DOUBLE_EQ(s.upper, 36.7);
}

// Note [A probe caught in a slow moment]: more than half of a host tier's read passes run slow
// (every read request of the first eight passes completes 2 ms late, about 8 ms a pass against a
// fraction of that), and the Session's figure is still the fast passes' rate, not the median.
TEST(BandwidthProbe, QuickProbeOfAHostTierPlansWithTheFastPassesAfterASlowMoment) {
  constexpr uint64_t kRange = 1 << 20, kRequest = 256 << 10;  // 4 requests a pass, all in flight
  FaultOptions f;
  f.rules = {{.kind = FaultKind::kSlow, .nth_request = 0, .count = 8 * kRange / kRequest,
              .delay_us = 2000, .direction = Direction::kRead}};
  auto tier = make_fault_tier(make_host_tier({.capacity_bytes = kTier}), f);
  std::vector<unsigned char> scratch(kRange);
  BandwidthProbeOptions o = quick_probe_options(tier->info());
  EXPECT_EQ(o.repetitions, kQuickProbeHostPasses);
  o.request_bytes = kRequest;
  const BandwidthProbe p =
      probe_bandwidth(*tier, BufferView::host(scratch.data(), scratch.size()), 0, kRange, o);
  expect_numbers(p);
  ASSERT_EQ(p.read_passes, kQuickProbeHostPasses) << "the time limit cut the read passes";
  const double planned = planned_gbps(p.read_gbps, tier->info());
  EXPECT_EQ(planned_statistic(tier->info()), "upper quartile");
  // Four requests 2 ms late take >= 8 ms for 1 MiB (<= 0.13 GB/s); the median is such a pass.
  EXPECT_LE(p.read_gbps.median, 0.14);
  EXPECT_GT(planned, 2 * p.read_gbps.median) << planned;
  EXPECT_EQ(planned, p.read_gbps.upper);
  // A file tier keeps the median of three passes.
  TierInfo file = tier->info();
  file.engine = "io_uring";
  EXPECT_EQ(planned_gbps(p.read_gbps, file), p.read_gbps.median);
  EXPECT_EQ(quick_probe_options(file).repetitions, BandwidthProbeOptions{}.repetitions);
}

// Note [The link's rate in use]: a host tier sums what its copies of at least 1 MiB took, per
// direction, and a fault tier reports its inner tier's.
TEST(TransferTimes, AHostTierTimesItsCopiesOfAMebibyteOrMore) {
  auto tier = make_fault_tier(make_host_tier({.capacity_bytes = kTier}), {});
  EXPECT_EQ(tier->transfer_times().read_bytes, 0u);
  EXPECT_EQ(tier->transfer_times().read_gbps(), 0);
  auto data = pattern(4 << 20, 5);
  tier->write(BufferView::host(data.data(), data.size()), 0);
  tier->write(BufferView::host(data.data(), 4096), 4 << 20);  // too small to say anything
  std::vector<unsigned char> back(2 << 20);
  tier->read(BufferView::host(back.data(), back.size()), 1 << 20);
  const TransferTimes t = tier->transfer_times();
  EXPECT_EQ(t.write_bytes, 4u << 20);
  EXPECT_EQ(t.read_bytes, 2u << 20);
  EXPECT_GT(t.write_us, 0);
  EXPECT_GT(t.read_us, 0);
  EXPECT_NEAR(t.read_gbps(), static_cast<double>(t.read_bytes) / t.read_us / 1e3, 1e-9);
  // A failed request is not a time of the link.
  tier->inject({.kind = FaultKind::kError, .count = 1, .error_code = EIO});
  EXPECT_THROW(tier->read(BufferView::host(back.data(), back.size()), 0), teraio::Error);
  EXPECT_EQ(tier->transfer_times().read_bytes, 2u << 20);
}

TEST(BandwidthProbe, BadArgumentsAreClearErrors) {
  auto tier = make_host_tier({.capacity_bytes = kTier});
  std::vector<unsigned char> scratch(1 << 20);
  BufferView s = BufferView::host(scratch.data(), scratch.size());
  EXPECT_THROW(probe_bandwidth(*tier, s, kTier - 4096, 8192), teraio::Error);
  EXPECT_THROW(probe_bandwidth(*tier, s, 0, 0), teraio::Error);
  EXPECT_THROW(probe_bandwidth(*tier, s.subview(0, 100), 0, kSize), teraio::Error);
}

TEST(RunPass, CutsAtTheDeadlineAfterTheFirstRequest) {
  auto tier = make_host_tier({.capacity_bytes = kTier});
  std::vector<unsigned char> scratch(1 << 20);
  PassOptions o;
  o.size_bytes = kSize;
  o.request_bytes = 256 << 10;
  o.window = 4;
  o.deadline = std::chrono::steady_clock::now();  // already passed
  PassResult r =
      run_pass(*tier, Direction::kWrite, BufferView::host(scratch.data(), scratch.size()), o);
  EXPECT_TRUE(r.cut);
  EXPECT_EQ(r.bytes, 256u << 10);
  o.deadline.reset();
  r = run_pass(*tier, Direction::kRead, BufferView::host(scratch.data(), scratch.size()), o);
  EXPECT_FALSE(r.cut);
  EXPECT_EQ(r.bytes, kSize);
  EXPECT_GT(r.gbps(), 0);
}

}  // namespace
}  // namespace teraio::storage
