// The exact planner with recompute (Note [Recompute in the slot model], src/exact/exact.cpp): it
// recomputes a cheap producer where moving stalls, its plans are valid, and its bound stays below
// the greedy plan's model stall and the simulated overhead of both plans on instances with
// recomputable activations (so `teraio study gap --recompute` still bounds the greedy planner).
#include <gtest/gtest.h>

#include <algorithm>

#include "teraio/analysis.h"
#include "teraio/exact.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/simulator.h"

namespace teraio {
namespace {

constexpr uint64_t kMB = 1000000;

void expect_valid(const Trace& trace, const Plan& plan) {
  const PlanCheck check = check_plan(trace, Lifetimes(trace), plan);
  EXPECT_TRUE(check.valid) << (check.errors.empty() ? "" : check.errors.front());
}

size_t recomputes(const Plan& p) {
  size_t n = 0;
  for (const Move& m : p.moves) n += m.op == MoveOp::recompute;
  return n;
}

// A (100 MB) = mm at kernel 0; B (100 MB) = relu(A) at kernel 1, taking `relu_us`, recomputable;
// kernels 2..4 use C (100 MB, made at 2); B is used again at 5, A at 6. One of A and B must be away
// over 2..4; the link (1 GB/s) needs 100 ms each way, the three middle kernels last 30 ms.
Trace tiny(double relu_us) {
  Trace t;
  TensorInfo a{100 * kMB, TensorKind::activation, false, "A"};
  a.producer = 0;
  const TensorId ai = t.add_tensor(a);
  TensorInfo b{100 * kMB, TensorKind::activation, false, "B"};
  b.producer = 1;
  b.recomputable = true;
  const TensorId bi = t.add_tensor(b);
  const TensorId c = t.add_tensor({100 * kMB, TensorKind::temporary, false, "C"});
  t.add_kernel("aten::mm", 10000, std::vector<TensorId>{ai});
  t.add_kernel("aten::relu", relu_us, std::vector<TensorId>{ai, bi});
  for (int k = 2; k < 5; ++k) t.add_kernel("mid", 10000, std::vector<TensorId>{c});
  t.add_kernel("bwd_b", 10000, std::vector<TensorId>{bi});
  t.add_kernel("bwd_a", 10000, std::vector<TensorId>{ai});
  return t;
}

ExactOptions options(uint64_t budget) {
  ExactOptions o;
  o.budget_bytes = budget;
  o.tiers = {TierSpec{"host", 1000 * kMB, 1.0, 1.0}};
  o.time_limit_s = 20;
  return o;
}

TEST(ExactRecompute, RecomputesACheapProducerAndMatchesTheGreedy) {
  const Trace t = tiny(200);
  const ExactResult r = solve_exact(t, options(200 * kMB));
  ASSERT_TRUE(r.has_solution);
  EXPECT_TRUE(r.optimal);
  expect_valid(t, r.plan);
  EXPECT_EQ(recomputes(r.plan), 1u);
  EXPECT_NEAR(r.model_stall_us, 200, 1e-3);  // the producer's time, nothing stalls
  EXPECT_NEAR(r.bound_stall_us, 200, 1e-3);
  PlannerOptions po;
  po.budget_bytes = 200 * kMB;
  po.tiers = options(0).tiers;
  const Plan g = make_plan(t, po);
  EXPECT_EQ(recomputes(g), 1u);
  EXPECT_NEAR(model_stall_us(t, g), r.model_stall_us, 1e-3);
  EXPECT_NEAR(simulate(t, g).iteration_us, simulate(t, r.plan).iteration_us, 1e-6);
  EXPECT_NEAR(simulate(t, r.plan).iteration_us, t.total_time_us() + 200, 1e-6);
}

TEST(ExactRecompute, MovesWhenTheProducerCostsMoreThanTheStall) {
  // 1 s to recompute; moving A or B stalls at most about 2 x 100 ms: move.
  const Trace t = tiny(1e6);
  const ExactResult r = solve_exact(t, options(200 * kMB));
  ASSERT_TRUE(r.has_solution);
  EXPECT_TRUE(r.optimal);
  expect_valid(t, r.plan);
  EXPECT_EQ(recomputes(r.plan), 0u);
  EXPECT_LT(r.model_stall_us, 1e6);
}

// On the generated instances with recomputable activations: every plan valid, the bound below the
// greedy plan in the model and both plans in the simulator (overhead = stall + recompute time).
TEST(ExactRecompute, TheBoundHoldsOnInstancesWithRecomputableActivations) {
  size_t greedy_recomputes = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    SmallInstanceOptions io;
    io.layers = 2 + static_cast<uint32_t>(seed % 2);
    io.recompute = true;
    const Trace t = small_instance(seed, io);
    ASSERT_TRUE(has_recomputable(t));
    const Lifetimes life(t);
    const std::vector<uint64_t> curve = memory_curve(t, life);
    const std::vector<uint64_t> act = active_bytes(t);
    const uint64_t lo = *std::max_element(act.begin(), act.end());
    const uint64_t hi = *std::max_element(curve.begin(), curve.end());
    ExactOptions o;
    o.budget_bytes = lo + (hi - lo) / (seed % 3 == 0 ? 4 : 2);
    o.tiers = {{"ssd", uint64_t{1} << 40, 6.5, 6.5}, {"host", uint64_t{1} << 30, 25, 25}};
    o.time_limit_s = 1.5;
    const ExactResult r = solve_exact(t, o);
    ASSERT_TRUE(r.has_solution) << seed;
    expect_valid(t, r.plan);
    PlannerOptions po;
    po.budget_bytes = o.budget_bytes;
    po.tiers = o.tiers;
    const Plan g = make_plan(t, po);
    greedy_recomputes += recomputes(g);
    const double greedy_model = model_stall_us(t, g);
    EXPECT_LE(r.bound_stall_us, greedy_model + 1e-3) << seed;
    EXPECT_LE(r.bound_stall_us, r.model_stall_us + 1e-3) << seed;
    const SimResult gs = simulate(t, g), es = simulate(t, r.plan);
    EXPECT_GE(gs.iteration_us - gs.ideal_us, r.bound_stall_us - 1e-3) << seed;
    EXPECT_GE(es.iteration_us - es.ideal_us, r.bound_stall_us - 1e-3) << seed;
  }
  EXPECT_GT(greedy_recomputes, 0u);  // the instances exercise recompute
}

}  // namespace
}  // namespace teraio
