// Lifetime analysis on small hand-checked traces: uses, inactive periods (with wrap-around for
// persistent tensors, tails after the last use, idle persistent tensors), the memory curve with
// alive_until, and active bytes.
#include <gtest/gtest.h>

#include <tuple>

#include "teraio/analysis.h"
#include "teraio/error.h"

namespace teraio {
namespace {

// 6 kernels of 10 us; W persistent (100 B) used at 1 and 4; A activation (10 B) used at 0 and 3;
// T temporary (1 B) used at 2 only; U persistent (5 B) used at 5 only; X never used.
Trace make_trace() {
  Trace t;
  const TensorId w = t.add_tensor({100, TensorKind::parameter, true, "W"});
  const TensorId a = t.add_tensor({10, TensorKind::activation, false, "A"});
  const TensorId tmp = t.add_tensor({1, TensorKind::temporary, false, "T"});
  const TensorId u = t.add_tensor({5, TensorKind::optimizer_state, true, "U"});
  t.add_tensor({1000, TensorKind::other, false, "X"});
  t.add_kernel("k0", 10, std::vector<TensorId>{a});
  t.add_kernel("k1", 10, std::vector<TensorId>{w});
  t.add_kernel("k2", 10, std::vector<TensorId>{tmp});
  t.add_kernel("k3", 10, std::vector<TensorId>{a});
  t.add_kernel("k4", 10, std::vector<TensorId>{w});
  t.add_kernel("k5", 10, std::vector<TensorId>{u});
  return t;
}

TEST(Analysis, UsesAndNextUse) {
  const Trace t = make_trace();
  const Lifetimes l(t);
  EXPECT_EQ(std::vector<KernelIndex>(l.uses(0).begin(), l.uses(0).end()), (std::vector<KernelIndex>{1, 4}));
  EXPECT_FALSE(l.used(4));
  EXPECT_TRUE(l.is_used_at(1, 3));
  EXPECT_FALSE(l.is_used_at(1, 2));
  KernelIndex use = 0;
  bool wrapped = false;
  ASSERT_TRUE(l.next_use(0, 5, &use, &wrapped));
  EXPECT_EQ(use, 1u);
  EXPECT_TRUE(wrapped);
  ASSERT_TRUE(l.next_use(0, 2, &use, &wrapped));
  EXPECT_EQ(use, 4u);
  EXPECT_FALSE(wrapped);
  EXPECT_FALSE(l.next_use(4, 0, &use, &wrapped));
}

TEST(Analysis, InactivePeriodsWrapForPersistentTensorsOnly) {
  const Trace t = make_trace();
  const auto periods = inactive_periods(t, Lifetimes(t));
  // W: 1->4 (2 kernels), wrap 4->1 (k5, k0: 2 kernels); A: 0->3; U: wrap 5->5 (5 kernels).
  ASSERT_EQ(periods.size(), 4u);
  EXPECT_EQ(periods[0].tensor, 0u);
  EXPECT_EQ(periods[0].start, 1u);
  EXPECT_EQ(periods[0].end, 4u);
  EXPECT_FALSE(periods[0].wraps);
  EXPECT_EQ(periods[0].kernels, 2u);
  EXPECT_DOUBLE_EQ(periods[0].length_us, 20);
  EXPECT_TRUE(periods[1].wraps);
  EXPECT_EQ(periods[1].start, 4u);
  EXPECT_EQ(periods[1].end, 1u);
  EXPECT_EQ(periods[1].kernels, 2u);
  EXPECT_DOUBLE_EQ(periods[1].length_us, 20);
  EXPECT_EQ(periods[2].tensor, 1u);
  EXPECT_EQ(periods[2].bytes, 10u);
  EXPECT_EQ(periods[3].tensor, 3u);
  EXPECT_TRUE(periods[3].wraps);
  EXPECT_EQ(periods[3].kernels, 5u);
  EXPECT_DOUBLE_EQ(periods[3].length_us, 50);
}

TEST(Analysis, MemoryCurveAndActiveBytes) {
  const Trace t = make_trace();
  const auto m = memory_curve(t, Lifetimes(t));
  // persistent 105 always; A (10) over [0,3]; T (1) at 2; X never.
  EXPECT_EQ(m, (std::vector<uint64_t>{115, 115, 116, 115, 105, 105}));
  EXPECT_EQ(active_bytes(t), (std::vector<uint64_t>{10, 100, 1, 10, 100, 5}));
  const auto prefix = time_prefix_us(t);
  EXPECT_DOUBLE_EQ(prefix.back(), 60);
  EXPECT_DOUBLE_EQ(prefix[3], 30);
}

// A kernel that alone touches more than the budget: no plan can fit, and the error names the
// kernel that touches the most and the budget that would fit it, whichever kernel comes first.
TEST(Analysis, KernelsOverTheBudgetNameTheLargestAndTheBudgetNeeded) {
  const Trace t = make_trace();  // active bytes 10, 100, 1, 10, 100, 5
  EXPECT_NO_THROW(check_kernels_fit(t, 100));
  try {
    check_kernels_fit(t, 9);
    FAIL() << "kernels 0, 1, 3 and 4 touch more than 9 bytes";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("kernel 1 (" + std::string(t.kernel_name(1)) + ") alone touches 100 B (100 bytes), more "
                        "than the budget of 9 B (9 bytes): no plan can fit. The budget must be at least 100 B"),
              std::string::npos) << what;
    EXPECT_NE(what.find("4 of the trace's 6 kernels"), std::string::npos) << what;
  }
}

// The make_trace shape, with A alive through kernel 5 (its last use is 3) and X made persistent:
// A gets a tail period, X (no use) one period over the whole iteration.
TEST(Analysis, AliveUntilAndIdlePersistentTensors) {
  Trace t = make_trace();
  t.tensors[1].alive_until = 5;
  t.tensors[4].persistent = true;
  const Lifetimes l(t);
  EXPECT_EQ(l.last_use(1), 3u);
  EXPECT_EQ(l.alive_until(1), 5u);
  EXPECT_EQ(l.alive_until(0), 4u);  // persistent: its last use
  EXPECT_EQ(l.alive_until(2), 2u);
  // persistent 105 + X 1000 always; A (10) over [0, 5]; T (1) at 2.
  EXPECT_EQ(memory_curve(t, l), (std::vector<uint64_t>{1115, 1115, 1116, 1115, 1115, 1115}));
  // Alive is not used: kernels 4 and 5 do not touch A.
  EXPECT_EQ(active_bytes(t), (std::vector<uint64_t>{10, 100, 1, 10, 100, 5}));
  const auto periods = inactive_periods(t, l);
  // W: 2 periods; A: 0->3 and the tail 3..5; U: wrap; X: the whole iteration.
  ASSERT_EQ(periods.size(), 6u);
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(periods[i].no_next_use) << i;
  EXPECT_FALSE(periods[4].no_next_use);  // U
  // (tensor, start, end, wraps, kernels, length): A's tail over kernels 4 and 5; X everywhere.
  auto fields = [](const InactivePeriod& p) {
    return std::make_tuple(p.tensor, p.start, p.end, p.wraps, p.kernels, p.length_us, p.no_next_use);
  };
  EXPECT_EQ(fields(periods[3]), std::make_tuple(1u, 3u, 5u, false, 2u, 20.0, true));
  EXPECT_EQ(fields(periods[5]), std::make_tuple(4u, 5u, 5u, true, 6u, 60.0, true));
  EXPECT_EQ(periods[5].bytes, 1000u);
}

// written_between: inclusive at both ends, wrapping when first > last, true when writes are not
// recorded (Note [Clean offloads] in src/trace/plan_check.cpp).
TEST(Analysis, WrittenBetweenWrapsAndIsTrueWithoutRecordedWrites) {
  Trace t = make_trace();
  EXPECT_TRUE(written_between(t, 0, 1, 1)) << "writes unknown: every use may write";
  EXPECT_TRUE(written_between(t, 2, 0, 5));
  t.writes_recorded = true;
  t.tensors[0].written_at = {4};  // W, used at 1 and 4, written at 4
  t.validate();
  EXPECT_FALSE(written_between(t, 0, 1, 3));
  EXPECT_TRUE(written_between(t, 0, 1, 4));
  EXPECT_TRUE(written_between(t, 0, 4, 4));
  EXPECT_FALSE(written_between(t, 0, 5, 3)) << "5, 0 .. 3";
  EXPECT_TRUE(written_between(t, 0, 5, 4)) << "5, 0 .. 4";
  EXPECT_TRUE(written_between(t, 0, 3, 1)) << "3 .. 5, 0, 1";
  EXPECT_FALSE(written_between(t, 0, 0, 0));
  EXPECT_FALSE(written_between(t, 1, 0, 5)) << "no written_at: never written in place";
  t.tensors[0].written_at = {1};
  EXPECT_TRUE(written_between(t, 0, 4, 1)) << "wraps onto kernel 1";
  EXPECT_FALSE(written_between(t, 0, 2, 0));
}

}  // namespace
}  // namespace teraio
