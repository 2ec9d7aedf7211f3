// Lifetime analysis on small hand-checked traces: uses, inactive periods (with wrap-around for
// persistent tensors), the memory curve and active bytes.
#include <gtest/gtest.h>

#include "teraio/analysis.h"

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

}  // namespace
}  // namespace teraio
