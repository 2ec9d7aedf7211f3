// Tests of the exact (MILP) planner: known optima on hand-built traces, validity of its plans, and
// its relation to the greedy planner and the simulator on small generated instances.
#include <gtest/gtest.h>

#include <algorithm>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/exact.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/simulator.h"

namespace teraio {
namespace {

constexpr uint64_t kMB = 1000000;

// Kernels 0..3 of 10 ms each. A (persistent) is used by kernel 0 only, B (persistent) by 1..3,
// and C (an activation of `c_bytes`, alive at kernel 2 only) by kernel 2.
Trace three_tensor_trace(uint64_t a_bytes, uint64_t c_bytes) {
  Trace t;
  const TensorId a = t.add_tensor({a_bytes, TensorKind::parameter, true, "A"});
  const TensorId b = t.add_tensor({100 * kMB, TensorKind::parameter, true, "B"});
  const TensorId c = t.add_tensor({c_bytes, TensorKind::activation, false, "C"});
  t.add_kernel("k0", 10000, std::vector<TensorId>{a});
  t.add_kernel("k1", 10000, std::vector<TensorId>{b});
  t.add_kernel("k2", 10000, std::vector<TensorId>{b, c});
  t.add_kernel("k3", 10000, std::vector<TensorId>{b});
  return t;
}

ExactOptions options(uint64_t budget) {
  ExactOptions o;
  o.budget_bytes = budget;
  o.tiers = {TierSpec{"ssd", 1000 * kMB, 10.0, 10.0}};  // 10 GB/s = 10 MB per ms
  o.time_limit_s = 20;
  return o;
}

void expect_valid(const Trace& trace, const Plan& plan) {
  const Lifetimes lifetimes(trace);
  const PlanCheck check = check_plan(trace, lifetimes, plan);
  EXPECT_TRUE(check.valid) << (check.errors.empty() ? "" : check.errors.front());
}

TEST(Exact, AbsentEverywhereButItsOwnKernelStallsBothWays) {
  // A must be away at kernels 1..3, so its offload
  // can only run before kernel 1 starts and its prefetch only before kernel 0: 100 MB / 10 GB/s
  // = 10 ms each way.
  const Trace trace = three_tensor_trace(100 * kMB, 1);
  const ExactResult r = solve_exact(trace, options(100 * kMB + 1));
  ASSERT_TRUE(r.has_solution);
  EXPECT_TRUE(r.optimal);
  EXPECT_NEAR(r.model_stall_us, 20000, 1);
  EXPECT_NEAR(r.bound_stall_us, 20000, 1);
  expect_valid(trace, r.plan);
  // The simulator charges more here (45 ms, see docs/planner.md "How good is the plan"); it may
  // not charge less than the proved bound.
  EXPECT_GE(simulate(trace, r.plan).stall_us, 20000 - 1);
}

TEST(Exact, PressureAtOneKernelIsHiddenBehindItsNeighbours) {
  // Only kernel 2 is over budget; A (50 MB) goes out during kernel 1 and back during kernel 3.
  const Trace trace = three_tensor_trace(50 * kMB, 100 * kMB);
  const ExactResult r = solve_exact(trace, options(200 * kMB));
  ASSERT_TRUE(r.has_solution);
  EXPECT_TRUE(r.optimal);
  EXPECT_NEAR(r.model_stall_us, 0, 1e-3);
  expect_valid(trace, r.plan);
  ASSERT_EQ(r.plan.moves.size(), 2u);
  EXPECT_NEAR(simulate(trace, r.plan).stall_us, 0, 1e-6);
}

TEST(Exact, HalfTheTensorFitsInTheWindow) {
  // A = 150 MB, only kernel 2 over budget: kernel 1 carries 100 MB of the offload, the other
  // 50 MB stall (5 ms); the prefetch likewise over kernel 3 (5 ms). Optimum: 10 ms.
  const Trace trace = three_tensor_trace(150 * kMB, 150 * kMB);
  const ExactResult r = solve_exact(trace, options(250 * kMB));
  ASSERT_TRUE(r.has_solution);
  EXPECT_TRUE(r.optimal);
  EXPECT_NEAR(r.model_stall_us, 10000, 1);
  expect_valid(trace, r.plan);
  EXPECT_NEAR(simulate(trace, r.plan).stall_us, 10000, 1);
}

TEST(Exact, RefusesWhenAKernelAloneExceedsTheBudget) {
  const Trace trace = three_tensor_trace(100 * kMB, 100 * kMB);
  EXPECT_THROW(solve_exact(trace, options(150 * kMB)), Error);
}

// At half the way from the largest kernel to the unplanned peak: the exact plan is valid, never
// worse than the greedy one in the model, and its bound is below both simulated stalls. Adds the
// exact and greedy plans' offloads without a prefetch to *one_way.
void expect_exact_bounds_greedy(const Trace& trace, uint64_t seed, size_t* one_way = nullptr) {
  const Lifetimes lifetimes(trace);
  const std::vector<uint64_t> curve = memory_curve(trace, lifetimes);
  const std::vector<uint64_t> active = active_bytes(trace);
  const uint64_t lo = *std::max_element(active.begin(), active.end());
  const uint64_t hi = *std::max_element(curve.begin(), curve.end());
  ExactOptions o;
  o.budget_bytes = lo + (hi - lo) / 2;
  o.tiers = {TierSpec{"ssd", uint64_t{1} << 40, 6.5, 6.5}, TierSpec{"host", uint64_t{1} << 30, 25, 25}};
  o.time_limit_s = 10;
  const ExactResult r = solve_exact(trace, o);
  ASSERT_TRUE(r.has_solution) << "seed " << seed;
  expect_valid(trace, r.plan);
  PlannerOptions p;
  p.budget_bytes = o.budget_bytes;
  p.tiers = o.tiers;
  const Plan greedy = make_plan(trace, p);
  const double greedy_model = model_stall_us(trace, greedy);
  EXPECT_LE(r.model_stall_us, greedy_model + 1e-3) << "seed " << seed;
  EXPECT_LE(r.bound_stall_us, r.model_stall_us + 1e-6) << "seed " << seed;
  // The slot model relaxes the simulator's first-come-first-served links: no plan simulates
  // below the proved bound.
  const double tol = 1e-6 * trace.total_time_us();
  EXPECT_GE(simulate(trace, r.plan).stall_us, r.bound_stall_us - tol) << "seed " << seed;
  EXPECT_GE(simulate(trace, greedy).stall_us, r.bound_stall_us - tol) << "seed " << seed;
  if (one_way == nullptr) return;
  for (const Plan* plan : {&r.plan, &greedy}) {
    for (const MovePair& pr : check_plan(trace, lifetimes, *plan).pairs) *one_way += pr.one_way();
  }
}

TEST(Exact, NeverWorseThanGreedyInTheModelAndBoundsTheSimulator) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SmallInstanceOptions io;
    io.layers = 1;
    expect_exact_bounds_greedy(small_instance(seed, io), seed);
  }
}

// The same with the activations held to the end of the iteration and an idle persistent tensor.
TEST(Exact, BoundsTheGreedyWithOffloadsWithoutPrefetch) {
  size_t one_way = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SmallInstanceOptions io;
    io.layers = 1;
    Trace trace = small_instance(seed, io);
    const auto last = static_cast<KernelIndex>(trace.num_kernels() - 1);
    for (TensorInfo& t : trace.tensors) {
      if (t.kind == TensorKind::activation) t.alive_until = last;
    }
    trace.add_tensor({64 * kMB, TensorKind::parameter, true, "idle expert"});
    expect_exact_bounds_greedy(trace, seed, &one_way);
  }
  EXPECT_GT(one_way, 6u);  // the idle tensor in all 6 plans, and some tails
}

// Six kernels of 10 ms. A (persistent) is used by every kernel, I (persistent) by none, the
// gradient G by kernel 1 and held through kernel 5, X by kernels 2..4; 100 MB each. Without moves:
// 200 MB at kernel 0, 300 at 1, 400 at 2..4, 300 at 5.
Trace idle_and_tail_trace() {
  Trace t;
  const TensorId a = t.add_tensor({100 * kMB, TensorKind::parameter, true, "A"});
  t.add_tensor({100 * kMB, TensorKind::parameter, true, "I"});
  TensorInfo g{100 * kMB, TensorKind::gradient, false, "G"};
  g.alive_until = 5;
  const TensorId gi = t.add_tensor(g);
  const TensorId x = t.add_tensor({100 * kMB, TensorKind::activation, false, "X"});
  for (KernelIndex k = 0; k < 6; ++k) {
    std::vector<TensorId> ids{a};
    if (k == 1) ids.push_back(gi);
    if (k >= 2 && k <= 4) ids.push_back(x);
    t.add_kernel("k", 10000, ids);
  }
  return t;
}

TEST(Exact, OffloadsWithoutPrefetch) {
  const Trace trace = idle_and_tail_trace();
  // 300 MB: I alone makes room, out for good, moving nothing in steady state: no stall.
  ExactResult r = solve_exact(trace, options(300 * kMB));
  ASSERT_TRUE(r.has_solution);
  EXPECT_TRUE(r.optimal);
  EXPECT_NEAR(r.model_stall_us, 0, 1e-6);
  expect_valid(trace, r.plan);
  ASSERT_EQ(r.plan.moves.size(), 1u);
  EXPECT_EQ(r.plan.moves[0].tensor, 1u);
  EXPECT_EQ(simulate(trace, r.plan).stall_us, 0);
  // 200 MB: G must be gone by kernel 2 too; its offload (100 MB at 10 GB/s) can only run before
  // kernel 2 starts: 10 ms of stall, and it never comes back.
  r = solve_exact(trace, options(200 * kMB));
  ASSERT_TRUE(r.has_solution);
  EXPECT_TRUE(r.optimal);
  EXPECT_NEAR(r.model_stall_us, 10000, 1);
  EXPECT_NEAR(r.bound_stall_us, 10000, 1);
  EXPECT_GE(r.greedy_model_stall_us, r.model_stall_us - 1e-6);
  expect_valid(trace, r.plan);
  ASSERT_EQ(r.plan.moves.size(), 2u);
  for (const Move& m : r.plan.moves) EXPECT_EQ(m.op, MoveOp::offload);
  const SimResult sim = simulate(trace, r.plan);
  EXPECT_NEAR(sim.stall_us, 10000, 1);
  EXPECT_NEAR(model_stall_us(trace, r.plan), 10000, 1);
  // The greedy plan makes the same choice.
  PlannerOptions popts;
  popts.budget_bytes = 200 * kMB;
  popts.tiers = options(0).tiers;
  EXPECT_NEAR(model_stall_us(trace, make_plan(trace, popts)), 10000, 1);
}

TEST(Exact, SmallInstancesAreDeterministicAndSized) {
  SmallInstanceOptions io;
  io.layers = 3;
  const Trace a = small_instance(7, io);
  const Trace b = small_instance(7, io);
  EXPECT_EQ(a.num_kernels(), 22u);
  EXPECT_EQ(a.num_tensors(), 13u);
  EXPECT_EQ(trace_to_json(a), trace_to_json(b));
  EXPECT_NE(trace_to_json(a), trace_to_json(small_instance(8, io)));
  io.layers = 0;
  EXPECT_THROW(small_instance(1, io), Error);
}

}  // namespace
}  // namespace teraio
