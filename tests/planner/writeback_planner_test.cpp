// The planner's writeback pass (Note [Planning writebacks], src/planner/writeback.cpp): a dirty
// offload's write moves to free write slots after the tensor's last write, the plan stays valid,
// and the simulator finds it faster where the offload's own window had no room.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "planner_tuning.h"
#include "random_trace.h"
#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/simulator.h"

namespace teraio {
namespace {

using planner_detail::add_writebacks;

// Six kernels of 10 us; P (10000 B, persistent) read at 0, updated at 1, read at 4; offloaded
// after kernel 4 with no room (deadline 4) and read back over kernel 5. At 1 GB/s a slot carries
// 10000 B: the write fits over kernel 2, after the update.
struct Case {
  Trace trace;
  Plan plan;
};
Case make_case(bool recorded = true) {
  Case c;
  c.trace.add_tensor({10000, TensorKind::parameter, true, "P"});
  const std::vector<std::vector<TensorId>> uses = {{0}, {0}, {}, {}, {0}, {}};
  for (const auto& u : uses) c.trace.add_kernel("k", 10, u);
  c.trace.writes_recorded = recorded;
  if (recorded) c.trace.tensors[0].written_at = {1};
  c.plan.budget_bytes = 10000;
  c.plan.tiers = {TierSpec{"host", 1 << 20, 1.0, 1.0}};
  c.plan.moves = {{0, MoveOp::offload, 0, 4, 4}, {0, MoveOp::prefetch, 0, 5, 0}};
  return c;
}

TEST(PlannerWriteback, ADirtyOffloadGetsAWritebackAfterTheLastWrite) {
  const Case c = make_case();
  const Plan p = add_writebacks(c.trace, c.plan, 1.0);
  ASSERT_EQ(p.moves.size(), 3u);
  const Move& w = p.moves[2];
  EXPECT_EQ(w.op, MoveOp::writeback);
  EXPECT_EQ(w.tensor, 0u);
  EXPECT_EQ(w.start, 1u) << "after the update, where the slots have room";
  EXPECT_EQ(w.deadline, 4u) << "due with the offload";
  const Lifetimes life(c.trace);
  EXPECT_TRUE(check_plan(c.trace, life, p).valid);
  EXPECT_DOUBLE_EQ(simulate(c.trace, c.plan).iteration_us, 70);
  EXPECT_DOUBLE_EQ(simulate(c.trace, p).iteration_us, 60);
}

TEST(PlannerWriteback, NothingWithoutRecordedWritesOrRoomOrFraction) {
  const Case unknown = make_case(false);
  EXPECT_EQ(add_writebacks(unknown.trace, unknown.plan, 1.0).moves.size(), 2u);
  const Case c = make_case();
  EXPECT_EQ(add_writebacks(c.trace, c.plan, 0).moves.size(), 2u);
  // Slots of half the tensor over kernels 2..3 (at 0.25): it does not fit before the deadline.
  EXPECT_EQ(add_writebacks(c.trace, c.plan, 0.25).moves.size(), 2u);
  // Written at kernel 4 too: the last write is the offload's own kernel, nothing earlier.
  Case late = make_case();
  late.trace.tensors[0].written_at = {1, 4};
  EXPECT_EQ(add_writebacks(late.trace, late.plan, 1.0).moves.size(), 2u);
  // A tier too small to hold it from the writeback on... it holds it from the offload on anyway,
  // so a capacity of exactly its bytes still fits.
  Case small = make_case();
  small.plan.tiers[0].capacity_bytes = 10000;
  EXPECT_EQ(add_writebacks(small.trace, small.plan, 1.0).moves.size(), 3u);
}

// On random traces with recorded writes, the pass keeps every move and adds only valid writebacks.
TEST(PlannerWriteback, RandomPlansStayValid) {
  std::mt19937_64 rng(7);
  size_t added = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    Trace trace = teraio::testing::random_trace(seed);
    trace.writes_recorded = true;
    for (TensorId t = 0; t < trace.num_tensors(); ++t) {
      std::vector<KernelIndex> w;
      for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
        const auto ts = trace.kernel_tensors(k);
        if (std::find(ts.begin(), ts.end(), t) != ts.end() && rng() % 3 == 0) w.push_back(k);
      }
      trace.tensors[t].written_at = w;
    }
    const Lifetimes life(trace);
    const auto m = memory_curve(trace, life);
    PlannerOptions o;
    o.budget_bytes = *std::max_element(m.begin(), m.end()) * 6 / 10;
    o.tiers = {TierSpec{"host", uint64_t{1} << 40, 5, 5}};
    Plan plan;
    try {
      plan = make_plan(trace, o);
    } catch (const Error&) {
      continue;
    }
    for (double f : {0.5, 1.0, 4.0}) {
      const Plan p = add_writebacks(trace, plan, f);
      ASSERT_GE(p.moves.size(), plan.moves.size());
      for (size_t i = 0; i < plan.moves.size(); ++i) {
        EXPECT_EQ(p.moves[i].start, plan.moves[i].start);
        EXPECT_EQ(p.moves[i].op, plan.moves[i].op);
      }
      const PlanCheck c = check_plan(trace, life, p);
      ASSERT_TRUE(c.valid) << "seed " << seed;
      EXPECT_EQ(c.writebacks.size(), p.moves.size() - plan.moves.size());
      added += c.writebacks.size();
      simulate(trace, p);  // runs
    }
  }
  EXPECT_GT(added, 0u);
}

// Writeback variants only when the runner executes them (PlannerOptions::writebacks).
TEST(PlannerWriteback, VariantsOnlyWhenAsked) {
  size_t with = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Trace trace = teraio::testing::random_trace(seed);
    trace.writes_recorded = true;
    for (TensorId t = 0; t < trace.num_tensors(); ++t) {
      if (!trace.tensors[t].persistent) continue;
      const Lifetimes life(trace);
      if (life.used(t)) trace.tensors[t].written_at = {life.first_use(t)};
    }
    const Lifetimes life(trace);
    const auto m = memory_curve(trace, life);
    PlannerOptions o;
    o.budget_bytes = *std::max_element(m.begin(), m.end()) * 6 / 10;
    o.tiers = {TierSpec{"host", uint64_t{1} << 40, 5, 5}};
    std::vector<PlanVariant> plain;
    try {
      plain = make_plan_variants(trace, o);
    } catch (const Error&) {
      continue;
    }
    for (const PlanVariant& v : plain)
      for (const Move& mv : v.plan.moves) ASSERT_NE(mv.op, MoveOp::writeback) << v.name;
    o.writebacks = true;
    const std::vector<PlanVariant> all = make_plan_variants(trace, o);
    ASSERT_GE(all.size(), plain.size());
    for (size_t i = plain.size(); i < all.size(); ++i) {
      EXPECT_NE(all[i].name.find("writebacks x"), std::string::npos);
      EXPECT_TRUE(check_plan(trace, life, all[i].plan).valid) << all[i].name;
    }
    with += all.size() - plain.size();
  }
  EXPECT_GT(with, 0u);
}

}  // namespace
}  // namespace teraio
