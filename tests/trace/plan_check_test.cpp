// Plan validity (docs/formats.md): pairing, ordering, no use while away, lifetimes of
// non-persistent tensors, offloads without a prefetch, the budget at every kernel, tier capacity.
#include <gtest/gtest.h>

#include "check_util.h"

#include "teraio/plan_check.h"

namespace teraio {
namespace {

// 8 kernels. W persistent 100 B used at 1 and 5. A activation 50 B used at 0 and 6. K 10 B used by all.
Trace make_trace() {
  Trace t;
  t.add_tensor({100, TensorKind::parameter, true, "W"});
  t.add_tensor({50, TensorKind::activation, false, "A"});
  t.add_tensor({10, TensorKind::other, true, "K"});
  for (KernelIndex k = 0; k < 8; ++k) {
    std::vector<TensorId> ids{2};
    if (k == 1 || k == 5) ids.push_back(0);
    if (k == 0 || k == 6) ids.push_back(1);
    t.add_kernel("k", 1, ids);
  }
  return t;
}

Plan make_plan(uint64_t budget, std::vector<Move> moves) {
  Plan p;
  p.budget_bytes = budget;
  p.tiers = {{"host", 1000, 10, 10}, {"ssd", 1000, 1, 1}};
  p.moves = std::move(moves);
  return p;
}

using test::all_errors;
using test::check;

TEST(PlanCheck, ATraceWithoutKernelsHasAPeakOfZeroOnEveryTier) {
  Trace t;
  t.add_tensor({100, TensorKind::parameter, true, "w"});
  Plan p;
  p.tiers = {{"ssd", 1 << 20, 1, 1}, {"host", 1 << 20, 1, 1}};
  const PlanCheck c = check_plan(t, Lifetimes(t), p);
  EXPECT_TRUE(c.valid);
  EXPECT_EQ(c.tier_peak_bytes, (std::vector<uint64_t>{0, 0}));  // it was empty: `plan` crashed
}

TEST(PlanCheck, EmptyPlanIsTheMemoryCurve) {
  const Trace t = make_trace();
  const PlanCheck c = check(t, make_plan(160, {}));
  EXPECT_TRUE(c.valid) << all_errors(c);
  EXPECT_EQ(c.resident_bytes, (std::vector<uint64_t>{160, 160, 160, 160, 160, 160, 160, 110}));
  EXPECT_EQ(c.peak_bytes, 160u);
  EXPECT_FALSE(check(t, make_plan(159, {})).valid);
}

TEST(PlanCheck, OffloadFreesMemoryBetweenItsDeadlineAndThePrefetchStart) {
  const Trace t = make_trace();
  // A away: offload after k0, done by end of k1; prefetch starts at k4, done before k6.
  const PlanCheck c = check(t, make_plan(1000, {{1, MoveOp::offload, 0, 0, 1}, {1, MoveOp::prefetch, 0, 4, 6}}));
  ASSERT_TRUE(c.valid) << all_errors(c);
  ASSERT_EQ(c.pairs.size(), 1u);
  EXPECT_EQ(c.pairs[0].offload_done, 1u);
  EXPECT_EQ(c.pairs[0].prefetch_begin, 4u);
  EXPECT_EQ(c.pairs[0].prefetch_deadline, 6u);
  EXPECT_EQ(c.resident_bytes, (std::vector<uint64_t>{160, 160, 110, 110, 160, 160, 160, 110}));
  EXPECT_EQ(c.tier_peak_bytes[0], 50u);
}

TEST(PlanCheck, WrappingPairOfAPersistentTensor) {
  const Trace t = make_trace();
  // W away from after k5 until before k1 of the next iteration: absent at k7 and k0 (prefetch at k0? no: starts k0).
  const PlanCheck c = check(t, make_plan(1000, {{0, MoveOp::offload, 1, 5, 6}, {0, MoveOp::prefetch, 1, 0, 1}}));
  ASSERT_TRUE(c.valid) << all_errors(c);
  EXPECT_EQ(c.resident_bytes, (std::vector<uint64_t>{160, 160, 160, 160, 160, 160, 160, 10}));
}

TEST(PlanCheck, ZeroWindowPairMakesTheTensorAbsentForTheWholeGap) {
  const Trace t = make_trace();
  const PlanCheck c = check(t, make_plan(1000, {{0, MoveOp::offload, 0, 1, 1}, {0, MoveOp::prefetch, 0, 5, 5}}));
  ASSERT_TRUE(c.valid) << all_errors(c);
  EXPECT_EQ(c.resident_bytes, (std::vector<uint64_t>{160, 160, 60, 60, 60, 160, 160, 110}));
}

TEST(PlanCheck, RejectsUseWhileAway) {
  const Trace t = make_trace();
  // W is used at k5, inside [1, 7).
  const PlanCheck c = check(t, make_plan(1000, {{0, MoveOp::offload, 0, 1, 2}, {0, MoveOp::prefetch, 0, 6, 1}}));
  EXPECT_FALSE(c.valid);
  EXPECT_NE(all_errors(c).find("used by kernel 5 while it is away"), std::string::npos) << all_errors(c);
}

TEST(PlanCheck, RejectsBadPairing) {
  const Trace t = make_trace();
  EXPECT_NE(all_errors(check(t, make_plan(1000, {{1, MoveOp::offload, 0, 0, 1}}))).find("no prefetch"),
            std::string::npos);
  EXPECT_NE(all_errors(check(t, make_plan(1000, {{1, MoveOp::prefetch, 0, 2, 6}}))).find("no offload"),
            std::string::npos);
  EXPECT_NE(all_errors(check(t, make_plan(1000, {{1, MoveOp::offload, 0, 0, 1}, {1, MoveOp::prefetch, 1, 4, 6}})))
                .find("reads tier"),
            std::string::npos);
  // Prefetch begins before the offload is done.
  EXPECT_NE(all_errors(check(t, make_plan(1000, {{1, MoveOp::offload, 0, 0, 3}, {1, MoveOp::prefetch, 0, 2, 6}})))
                .find("out of order"),
            std::string::npos);
  // Two offloads in one gap.
  EXPECT_NE(all_errors(check(t, make_plan(1000, {{1, MoveOp::offload, 0, 0, 1},
                                                  {1, MoveOp::offload, 0, 2, 3},
                                                  {1, MoveOp::prefetch, 0, 4, 6}})))
                .find("shares its prefetch"),
            std::string::npos);
  // Prefetch deadline not a use.
  EXPECT_NE(all_errors(check(t, make_plan(1000, {{1, MoveOp::offload, 0, 0, 1}, {1, MoveOp::prefetch, 0, 3, 4}})))
                .find("must be a kernel that uses"),
            std::string::npos);
}

TEST(PlanCheck, NonPersistentTensorsDoNotWrap) {
  const Trace t = make_trace();
  const PlanCheck c = check(t, make_plan(1000, {{1, MoveOp::offload, 0, 6, 7}, {1, MoveOp::prefetch, 0, 0, 0}}));
  EXPECT_FALSE(c.valid);
  EXPECT_NE(all_errors(c).find("not persistent"), std::string::npos) << all_errors(c);
}

TEST(PlanCheck, RangeErrorsAndTierCapacity) {
  const Trace t = make_trace();
  EXPECT_FALSE(check(t, make_plan(1000, {{9, MoveOp::offload, 0, 0, 1}})).valid);
  EXPECT_FALSE(check(t, make_plan(1000, {{1, MoveOp::offload, 0, 0, 8}})).valid);
  EXPECT_FALSE(check(t, make_plan(1000, {{1, MoveOp::offload, 5, 0, 1}})).valid);
  Plan p = make_plan(1000, {{1, MoveOp::offload, 0, 0, 1}, {1, MoveOp::prefetch, 0, 4, 6}});
  p.tiers[0].capacity_bytes = 49;
  const PlanCheck c = check(t, p);
  EXPECT_FALSE(c.valid);
  EXPECT_NE(all_errors(c).find("capacity"), std::string::npos);
}

// The make_trace shape plus B (a gradient, 20 B) used at 2 and 3 and alive through kernel 6, and
// I (persistent, 30 B) that no kernel uses. Without moves: 190 at kernels 0..1, 210 at 2..6, 140
// at 7.
Trace make_tail_trace() {
  Trace t;
  t.add_tensor({100, TensorKind::parameter, true, "W"});
  t.add_tensor({50, TensorKind::activation, false, "A"});
  t.add_tensor({10, TensorKind::other, true, "K"});
  TensorInfo b{20, TensorKind::gradient, false, "B"};
  b.alive_until = 6;
  t.add_tensor(b);
  t.add_tensor({30, TensorKind::parameter, true, "I"});
  for (KernelIndex k = 0; k < 8; ++k) {
    std::vector<TensorId> ids{2};
    if (k == 1 || k == 5) ids.push_back(0);
    if (k == 0 || k == 6) ids.push_back(1);
    if (k == 2 || k == 3) ids.push_back(3);
    t.add_kernel("k", 1, ids);
  }
  return t;
}

TEST(PlanCheck, OffloadsWithoutPrefetchAfterTheLastUse) {
  const Trace t = make_tail_trace();
  EXPECT_EQ(check(t, make_plan(1000, {})).resident_bytes,
            (std::vector<uint64_t>{190, 190, 210, 210, 210, 210, 210, 140}));
  // B: written after kernel 3, done by the end of kernel 4, absent at 5 and 6 (then it dies).
  // I: out for good, absent at every kernel.
  const PlanCheck c = check(t, make_plan(180, {{3, MoveOp::offload, 1, 3, 4}, {4, MoveOp::offload, 0, 0, 0}}));
  ASSERT_TRUE(c.valid) << all_errors(c);
  EXPECT_EQ(c.resident_bytes, (std::vector<uint64_t>{160, 160, 180, 180, 180, 160, 160, 110}));
  ASSERT_EQ(c.pairs.size(), 2u);
  for (const MovePair& p : c.pairs) {
    EXPECT_TRUE(p.one_way());
    EXPECT_EQ(p.idle, p.tensor == 4) << p.tensor;
  }
  EXPECT_EQ(c.tier_peak_bytes[0], 30u);  // I, held by host at every kernel
  EXPECT_EQ(c.tier_peak_bytes[1], 20u);  // B, from kernel 4 through 6
  // A pair in B's gap and its tail offload, together; the offload may start any time after the
  // last use and end as late as the tensor's last kernel (6).
  EXPECT_TRUE(check(t, make_plan(1000, {{3, MoveOp::offload, 0, 5, 6}})).valid);
  EXPECT_TRUE(check(t, make_plan(1000, {{3, MoveOp::offload, 0, 3, 3}})).valid);
  EXPECT_TRUE(check(t, make_plan(1000, {{1, MoveOp::offload, 0, 0, 1}, {1, MoveOp::prefetch, 0, 4, 6}})).valid);
}

TEST(PlanCheck, RejectsOffloadsWithoutPrefetchOfTensorsUsedLater) {
  const Trace t = make_tail_trace();
  auto errors = [&](std::vector<Move> moves) {
    const PlanCheck c = check(t, make_plan(1000, std::move(moves)));
    EXPECT_FALSE(c.valid);
    return all_errors(c);
  };
  // B is used again at kernel 3; W (persistent) at kernel 5, and at kernel 1 of the next iteration.
  EXPECT_NE(errors({{3, MoveOp::offload, 0, 2, 2}}).find("no prefetch brings tensor 3 back before kernel 3 uses it"),
            std::string::npos);
  EXPECT_NE(errors({{0, MoveOp::offload, 0, 5, 6}}).find("no prefetch brings tensor 0 back before kernel 1 uses it"),
            std::string::npos);
  // Not complete before B dies (after kernel 6), or started after it died.
  EXPECT_NE(errors({{3, MoveOp::offload, 0, 3, 7}}).find("within the tensor's life after its last use, kernels [3, 6]"),
            std::string::npos);
  EXPECT_NE(errors({{3, MoveOp::offload, 0, 7, 7}}).find("within the tensor's life"), std::string::npos);
  // Twice, and a prefetch of a tensor no kernel needs.
  EXPECT_NE(errors({{4, MoveOp::offload, 0, 0, 0}, {4, MoveOp::offload, 0, 3, 3}}).find("already offloaded without a prefetch"),
            std::string::npos);
  EXPECT_NE(errors({{4, MoveOp::offload, 0, 0, 0}, {4, MoveOp::prefetch, 0, 3, 3}}).find("it can be offloaded, not prefetched"),
            std::string::npos);
  // A prefetch bringing B back before its first use: the lifetime rule, named.
  EXPECT_NE(errors({{3, MoveOp::offload, 0, 3, 4}, {3, MoveOp::prefetch, 0, 1, 2}}).find("no offload precedes this prefetch of tensor 3: tensor 3 is not persistent"),
            std::string::npos);
}

}  // namespace
}  // namespace teraio
