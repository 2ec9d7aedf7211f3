// Planner tests: hand-checked golden plans on tiny traces, the refusal when one kernel's tensors
// exceed the budget, and properties over random traces (every plan valid, fits the budget, more
// budget does not move more bytes overall).
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
#include "teraio/units.h"

namespace teraio {
namespace {

TensorId tensor(Trace& trace, const char* name, uint64_t bytes, bool persistent) {
  TensorInfo info;
  info.bytes = bytes;
  info.persistent = persistent;
  info.kind = persistent ? TensorKind::parameter : TensorKind::activation;
  info.name = name;
  return trace.add_tensor(info);
}

// Adds `n` kernels of `time_us`; kernel k touches every tensor t with k in uses[t].
void kernels(Trace& trace, uint32_t n, double time_us, const std::vector<std::vector<KernelIndex>>& uses) {
  for (KernelIndex k = 0; k < n; ++k) {
    std::vector<TensorId> ids;
    for (TensorId t = 0; t < uses.size(); ++t) {
      if (std::find(uses[t].begin(), uses[t].end(), k) != uses[t].end()) ids.push_back(t);
    }
    trace.add_kernel("k" + std::to_string(k), time_us, ids);
  }
}

PlannerOptions options(uint64_t budget, double gbps, uint64_t capacity = 1 * kTiB) {
  PlannerOptions o;
  o.budget_bytes = budget;
  o.tiers.push_back(TierSpec{"ssd", capacity, gbps, gbps});
  return o;
}

PlanCheck check(const Trace& trace, const Plan& plan) {
  const Lifetimes lifetimes(trace);
  return check_plan(trace, lifetimes, plan);
}

std::string describe(const PlanCheck& c) {
  std::string s;
  for (const auto& e : c.errors) s += e + "\n";
  return s;
}

bool has_move(const Plan& plan, TensorId t, MoveOp op, KernelIndex start, KernelIndex deadline) {
  return std::any_of(plan.moves.begin(), plan.moves.end(), [&](const Move& m) {
    return m.tensor == t && m.op == op && m.start == start && m.deadline == deadline;
  });
}

// W (persistent, 100 MiB) is used at kernels 0 and 10; A (100 MiB) lives over kernels 3..7.
// Budget 150 MiB: W must be away over 3..7. With fast links the offload takes kernel 1 and is due
// at kernel 2, the last before A needs the room (Note [Offloads due when memory needs them]); the
// prefetch is hoisted to kernel 8 (the first kernel where W fits again).
TEST(PlannerGolden, OneBigTensorOffloadedInItsGap) {
  Trace trace;
  tensor(trace, "W", 100 * kMiB, true);
  tensor(trace, "A", 100 * kMiB, false);
  kernels(trace, 20, 1000, {{0, 10}, {3, 4, 5, 6, 7}});
  PlannerStats stats;
  const Plan plan = make_plan(trace, options(150 * kMiB, 1000), &stats);
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_TRUE(has_move(plan, 0, MoveOp::offload, 0, 2));
  EXPECT_TRUE(has_move(plan, 0, MoveOp::prefetch, 8, 10));
  EXPECT_EQ(stats.chosen, 1u);
  EXPECT_EQ(stats.forced, 0u);
  EXPECT_EQ(stats.peak_before_bytes, 200 * kMiB);
  EXPECT_EQ(stats.peak_after_bytes, 100 * kMiB);
  const PlanCheck c = check(trace, plan);
  EXPECT_TRUE(c.valid) << describe(c);
  EXPECT_EQ(c.peak_bytes, 100 * kMiB);
}

// B1 (100 MiB) and B2 (300 MiB) fit the 400 MiB budget; A (100 MiB) over kernels 3..7 pushes M to
// 500 MiB there. B1 can be away over all five kernels; B2 over four of them only (3..6): B2 saves
// more byte-time in total, but B1 saves more per byte and alone resolves the pressure, so only B1
// moves (due at kernel 2, before A; its prefetch hoisted to kernel 8, where it fits again).
TEST(PlannerGolden, BetterBenefitPerByteWins) {
  Trace trace;
  tensor(trace, "B1", 100 * kMiB, true);
  tensor(trace, "B2", 300 * kMiB, true);
  tensor(trace, "A", 100 * kMiB, false);
  kernels(trace, 20, 1000, {{0, 10}, {1, 8}, {3, 4, 5, 6, 7}});
  PlannerStats stats;
  const Plan plan = make_plan(trace, options(400 * kMiB, 1e6), &stats);
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_TRUE(has_move(plan, 0, MoveOp::offload, 0, 2));
  EXPECT_TRUE(has_move(plan, 0, MoveOp::prefetch, 8, 10));
  EXPECT_TRUE(check(trace, plan).valid);
}

// Note [Offloads due when memory needs them]: W (100 MiB) is used at kernels 0 and 30 and A (100
// MiB) lives over 20..25, budget 150 MiB. The slot model has W's write done by kernel 1 (100 MiB
// at 1 TB/s takes 0.1 ms of kernel 1's 1 ms), but nothing needs the room before kernel 20: the
// offload is due at 19. On a write link a hundred times slower than planned (10.5 ms for the
// write) the step then waits for nothing, where an offload due at kernel 1 holds kernel 2 for 9 ms.
TEST(PlannerGolden, AnOffloadIsDueWhereMemoryNeedsItsRoom) {
  Trace trace;
  tensor(trace, "W", 100 * kMiB, true);
  tensor(trace, "A", 100 * kMiB, false);
  kernels(trace, 40, 1000, {{0, 30}, {20, 21, 22, 23, 24, 25}});
  planner_detail::PlannerTuning early;
  early.offloads_due_when_needed = false;
  const PlannerOptions o = options(150 * kMiB, 1000);
  const Plan due_late = planner_detail::make_plan_tuned(trace, o, {}, nullptr, nullptr);
  const Plan due_early = planner_detail::make_plan_tuned(trace, o, early, nullptr, nullptr);
  EXPECT_TRUE(has_move(due_late, 0, MoveOp::offload, 0, 19));
  EXPECT_TRUE(has_move(due_early, 0, MoveOp::offload, 0, 1));
  for (const Plan* p : {&due_late, &due_early}) {
    const PlanCheck c = check(trace, *p);
    EXPECT_TRUE(c.valid) << describe(c);
    EXPECT_LE(c.peak_bytes, 150 * kMiB);
  }
  auto on_slow_link = [&](Plan p) {
    for (TierSpec& t : p.tiers) t.write_gbps = 10;  // 100 MiB in 10.5 ms
    return simulate(trace, p);
  };
  EXPECT_LT(on_slow_link(due_late).stall_us, 1.0);
  EXPECT_GT(on_slow_link(due_early).stall_us, 8000.0);
}

// Same as the first case, but the link moves 1 KB per kernel: nothing can be hidden, and the plan
// still fits with a forced (stalling) pair that keeps W away over 3..7.
TEST(PlannerGolden, InsufficientBandwidthGivesForcedMoves) {
  Trace trace;
  tensor(trace, "W", 100 * kMiB, true);
  tensor(trace, "A", 100 * kMiB, false);
  kernels(trace, 20, 1000, {{0, 10}, {3, 4, 5, 6, 7}});
  PlannerStats stats;
  planner_detail::PlannerDiagnostics diag;
  const Plan plan = planner_detail::make_plan_tuned(trace, options(150 * kMiB, 1e-6), {}, &stats, &diag);
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_TRUE(has_move(plan, 0, MoveOp::offload, 0, 2));
  EXPECT_TRUE(has_move(plan, 0, MoveOp::prefetch, 8, 10));
  EXPECT_EQ(stats.chosen, 0u);
  EXPECT_EQ(stats.forced, 1u);
  EXPECT_GT(diag.estimated_stall_us, 0.0);
  const PlanCheck c = check(trace, plan);
  EXPECT_TRUE(c.valid) << describe(c);
  EXPECT_LE(c.peak_bytes, 150 * kMiB);
}

// Note [Forced eviction by next use]: with no bandwidth, the forced pass must evict at kernel 3,
// where W (used again at 10), N (used again at 5) and the live A do not fit. By default it evicts
// the smallest tensor that covers the overshoot (N, 60 MiB against W's 100 MiB); by next use it
// evicts W, whose next use is farthest, which also covers kernel 6 (where N is back): one eviction
// instead of two.
TEST(PlannerGolden, ForcedEvictionByFarthestNextUse) {
  Trace trace;
  tensor(trace, "W", 100 * kMiB, true);
  tensor(trace, "N", 60 * kMiB, false);
  tensor(trace, "A", 100 * kMiB, false);
  kernels(trace, 12, 1000, {{0, 10}, {1, 5}, {3, 4, 6, 7}});
  const PlannerOptions o = options(210 * kMiB, 1e-6);
  PlannerStats by_size, by_use;
  const Plan smallest = planner_detail::make_plan_tuned(trace, o, {}, &by_size, nullptr);
  planner_detail::PlannerTuning t;
  t.evict_farthest_use = true;
  const Plan farthest = planner_detail::make_plan_tuned(trace, o, t, &by_use, nullptr);
  for (const Plan* p : {&smallest, &farthest}) {
    const PlanCheck c = check(trace, *p);
    EXPECT_TRUE(c.valid) << describe(c);
    EXPECT_LE(c.peak_bytes, 210 * kMiB);
  }
  EXPECT_TRUE(std::any_of(smallest.moves.begin(), smallest.moves.end(), [](const Move& m) { return m.tensor == 1; }));
  ASSERT_EQ(farthest.moves.size(), 2u);
  EXPECT_EQ(farthest.moves[0].tensor, 0u);
  EXPECT_EQ(farthest.moves[1].tensor, 0u);
  EXPECT_EQ(by_use.forced, 1u);
}

// Note [Planning for a stretched iteration]: a plan whose bytes take several times its kernels on
// the link gets variants planned with the slots scaled by that stretch; one whose bytes hide
// behind its kernels does not.
TEST(PlannerVariants, StretchedVariantsOnlyWhenLinkBound) {
  auto stretched = [](const std::vector<PlanVariant>& vs) {
    return std::count_if(vs.begin(), vs.end(), [](const PlanVariant& v) { return v.name.rfind("stretch", 0) == 0; });
  };
  Trace trace;
  tensor(trace, "W", 100 * kMiB, true);
  tensor(trace, "A", 100 * kMiB, false);
  kernels(trace, 20, 1000, {{0, 10}, {3, 4, 5, 6, 7}});
  // 100 MiB each way over 20 ms of kernels: hidden at 1000 GB/s, 5x the kernels at 1 GB/s.
  EXPECT_EQ(stretched(make_plan_variants(trace, options(150 * kMiB, 1000))), 0);
  const std::vector<PlanVariant> slow = make_plan_variants(trace, options(150 * kMiB, 1));
  EXPECT_GT(stretched(slow), 0);
  for (const PlanVariant& v : slow) {
    EXPECT_EQ(v.plan.tiers[0].read_gbps, 1.0) << v.name;  // the true bandwidth, whatever it planned with
    EXPECT_TRUE(check(trace, v.plan).valid) << v.name;
  }
}

// Tiny tensors are skipped by the greedy loop but moved when nothing else helps.
TEST(PlannerGolden, SmallTensorsMovedWhenNothingElseHelps) {
  Trace trace;
  tensor(trace, "S", 64 * kKiB, true);
  tensor(trace, "A", 1 * kMiB, false);
  kernels(trace, 10, 100, {{0, 8}, {2, 3, 4}});
  PlannerOptions o = options(1 * kMiB, 100);
  o.min_tensor_bytes = 1 * kMiB;
  PlannerStats stats;
  const Plan plan = make_plan(trace, o, &stats);
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_EQ(plan.moves[0].tensor, 0u);
  EXPECT_EQ(stats.chosen + stats.forced, 1u);
  EXPECT_TRUE(check(trace, plan).valid);
}

TEST(PlannerGolden, NoPressureNoMoves) {
  Trace trace;
  tensor(trace, "W", 100 * kMiB, true);
  kernels(trace, 5, 10, {{0, 3}});
  PlannerStats stats;
  const Plan plan = make_plan(trace, options(100 * kMiB, 10), &stats);
  EXPECT_TRUE(plan.moves.empty());
  EXPECT_EQ(stats.peak_after_bytes, 100 * kMiB);
}

TEST(PlannerRefusal, KernelWhoseTensorsExceedTheBudget) {
  Trace trace;
  tensor(trace, "X", 60 * kMiB, false);
  tensor(trace, "Y", 60 * kMiB, false);
  trace.add_kernel("aten::zeros", 10, std::vector<TensorId>{0});
  trace.add_kernel("aten::bmm", 10, std::vector<TensorId>{0, 1});
  try {
    make_plan(trace, options(100 * kMiB, 10));
    FAIL() << "expected teraio::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("kernel 1 "), std::string::npos) << msg;
    EXPECT_NE(msg.find("aten::bmm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("125829120"), std::string::npos) << msg;  // its bytes
    EXPECT_NE(msg.find("104857600"), std::string::npos) << msg;  // the budget
  }
}

TEST(PlannerRefusal, BadOptions) {
  Trace trace;
  tensor(trace, "X", 1 * kMiB, false);
  trace.add_kernel("k", 10, std::vector<TensorId>{0});
  PlannerOptions o;
  o.budget_bytes = kGiB;
  EXPECT_THROW(make_plan(trace, o), Error);
  o.tiers.push_back(TierSpec{"ssd", kTiB, 0, 5});
  EXPECT_THROW(make_plan(trace, o), Error);
}

// Six layers: weight W_i (persistent, 50 MiB) used by forward kernel i, backward kernel 6 + i and
// optimizer kernel 12 + i; gradient G_i (100 MiB) made by backward kernel 6 + i and read by the
// optimizer kernel 12 + i, then held until zero_grad (kernel 18, which touches no tensor). Without
// alive_until a trace could only fake the held gradients as uses of kernel 18.
Trace gradients_trace(bool fake_uses_at_zero_grad) {
  constexpr uint32_t kLayers = 6;
  Trace trace;
  std::vector<std::vector<KernelIndex>> uses;
  for (uint32_t i = 0; i < kLayers; ++i) {
    tensor(trace, ("W" + std::to_string(i)).c_str(), 50 * kMiB, true);
    uses.push_back({i, kLayers + i, 2 * kLayers + i});
  }
  for (uint32_t i = 0; i < kLayers; ++i) {
    TensorInfo g;
    g.bytes = 100 * kMiB;
    g.kind = TensorKind::gradient;
    g.name = "G" + std::to_string(i);
    if (!fake_uses_at_zero_grad) g.alive_until = 3 * kLayers;
    trace.add_tensor(g);
    uses.push_back({kLayers + i, 2 * kLayers + i});
    if (fake_uses_at_zero_grad) uses.back().push_back(3 * kLayers);
  }
  kernels(trace, 3 * kLayers + 1, 1000, uses);
  return trace;
}

// Case (a) of the brief of issues 13/17: at zero_grad all 600 MiB of gradients are alive, above the
// 500 MiB budget. Faked as uses, kernel 18 "touches" them all and no plan can exist; with
// alive_until the gradients leave after their optimizer kernel (an offload without a prefetch).
TEST(PlannerGolden, GradientsAliveUntilTheLastKernel) {
  const PlannerOptions o = options(500 * kMiB, 100);
  try {
    make_plan(gradients_trace(true), o);
    FAIL() << "the faked trace must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel 18 (k18) alone touches"), std::string::npos) << e.what();
  }
  const Trace trace = gradients_trace(false);
  PlannerStats stats;
  const Plan plan = make_plan(trace, o, &stats);
  const PlanCheck c = check(trace, plan);
  ASSERT_TRUE(c.valid) << describe(c);
  EXPECT_LE(c.peak_bytes, 500 * kMiB);
  EXPECT_EQ(stats.peak_before_bytes, 900 * kMiB);
  EXPECT_GT(stats.offload_only, 0u);
  EXPECT_EQ(plan.moves.size(), 2 * (stats.chosen + stats.forced) - stats.offload_only);
  for (const Move& m : plan.moves) {
    // A gradient is never brought back after its optimizer kernel: it only leaves.
    if (m.tensor >= 6 && m.op == MoveOp::prefetch) {
      EXPECT_LE(m.deadline, 12 + (m.tensor - 6)) << m.tensor;
    }
  }
  const SimResult sim = simulate(trace, plan);
  EXPECT_EQ(sim.peak_bytes, c.peak_bytes);
  EXPECT_EQ(sim.tiers[0].prefetch_bytes + stats.offload_only * 100 * kMiB, sim.tiers[0].offload_bytes);
}

// Note [Dead tensors in the planner]: the same gradients, for a runner that discards dead tensors:
// their tails cost no write, so they leave for free, and over a slow link the plan is faster.
TEST(PlannerGolden, DeadGradientsAreDiscardedNotWritten) {
  const Trace trace = gradients_trace(false);
  for (double gbps : {100.0, 0.5}) {
    PlannerOptions o = options(500 * kMiB, gbps);
    PlannerStats written_stats, stats;
    const Plan written = make_plan(trace, o, &written_stats);
    o.discard_dead = true;
    const Plan plan = make_plan(trace, o, &stats);
    EXPECT_TRUE(plan.discard_dead);
    EXPECT_FALSE(written.discard_dead);
    const PlanCheck c = check(trace, plan);
    ASSERT_TRUE(c.valid) << describe(c);
    EXPECT_LE(c.peak_bytes, 500 * kMiB);
    EXPECT_GT(stats.discards, 0u) << gbps;
    // A discard is written nowhere: no tier holds it.
    EXPECT_LE(c.tier_peak_bytes[0], check(trace, written).tier_peak_bytes[0]) << gbps;
    if (gbps > 1) {  // over the fast link the written plan's tier peak is its gradients' tails
      EXPECT_LT(c.tier_peak_bytes[0], check(trace, written).tier_peak_bytes[0]);
    }
    EXPECT_LE(stats.discards, stats.offload_only);
    const SimResult sim = simulate(trace, plan), sim_written = simulate(trace, written);
    EXPECT_EQ(sim.discards, stats.discards);
    EXPECT_EQ(sim.discarded_bytes, sim.discards * 100 * kMiB);  // gradients only: weights persist
    // Every byte written is read back: nothing is written for a tail.
    EXPECT_EQ(sim.tiers[0].offload_bytes, sim.tiers[0].prefetch_bytes);
    EXPECT_EQ(sim_written.discards, 0u);
    EXPECT_GT(sim_written.tiers[0].offload_bytes, sim_written.tiers[0].prefetch_bytes);
    EXPECT_LE(sim.iteration_us, sim_written.iteration_us + 1e-6) << gbps;
    if (gbps < 1) {
      EXPECT_LT(sim.iteration_us, 0.9 * sim_written.iteration_us);
    }
    // The same plan run by something that writes its tails: those tails cost their writes again.
    Plan as_written = plan;
    as_written.discard_dead = false;
    EXPECT_EQ(simulate(trace, as_written).discards, 0u);
  }
}

// Case (b): an MoE layer whose expert E3 got no token in the profiled iteration. Every kernel uses
// experts E0..E2 (a grouped expert GEMM) and activation X lives over kernels 1..4, so at 1..4 only
// E3 can make room. Before offloads without a prefetch the planner refused this trace.
TEST(PlannerGolden, IdleExpertOffloadedToFit) {
  Trace trace;
  for (int e = 0; e < 4; ++e) tensor(trace, ("E" + std::to_string(e)).c_str(), 200 * kMiB, true);
  tensor(trace, "X", 100 * kMiB, false);
  kernels(trace, 6, 1000, {{0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}, {}, {1, 2, 3, 4}});
  PlannerStats stats;
  const Plan plan = make_plan(trace, options(700 * kMiB, 1), &stats);
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.moves[0].tensor, 3u);
  EXPECT_EQ(plan.moves[0].op, MoveOp::offload);
  EXPECT_EQ(plan.moves[0].start, 0u);  // offloaded after the iteration's first kernel
  EXPECT_EQ(stats.offload_only, 1u);
  EXPECT_EQ(stats.forced, 0u);  // it moves no bytes in steady state: nothing to hide
  const PlanCheck c = check(trace, plan);
  ASSERT_TRUE(c.valid) << describe(c);
  EXPECT_EQ(c.resident_bytes, (std::vector<uint64_t>{600 * kMiB, 700 * kMiB, 700 * kMiB, 700 * kMiB, 700 * kMiB,
                                                     600 * kMiB}));
  const SimResult sim = simulate(trace, plan);
  EXPECT_EQ(sim.stall_us, 0.0);
  EXPECT_EQ(sim.tiers[0].offload_bytes, 0u);  // in steady state E3 is already out
  // Preferred over a round trip that would relieve the same kernels (E0 over 1..18): it relieves
  // the whole iteration and costs no bandwidth.
  Trace loose;
  for (int e = 0; e < 4; ++e) tensor(loose, ("E" + std::to_string(e)).c_str(), 200 * kMiB, true);
  tensor(loose, "X", 100 * kMiB, false);
  kernels(loose, 20, 1000, {{0, 19}, {1, 19}, {2, 19}, {}, {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}});
  const Plan p2 = make_plan(loose, options(800 * kMiB, 1000));
  ASSERT_EQ(p2.moves.size(), 1u);
  EXPECT_EQ(p2.moves[0].tensor, 3u);
}

struct RandomCase {
  Trace trace;
  PlannerOptions opts;
  uint64_t max_active = 0;
  uint64_t peak = 0;
};

RandomCase random_case(uint64_t seed) {
  RandomCase rc;
  testing::RandomTraceShape shape;
  shape.kernels = 50 + static_cast<uint32_t>(seed * 7 % 250);
  shape.tensors = 10 + static_cast<uint32_t>(seed * 13 % 60);
  rc.trace = testing::random_trace(seed, shape);
  const std::vector<uint64_t> active = active_bytes(rc.trace);
  rc.max_active = *std::max_element(active.begin(), active.end());
  const Lifetimes lifetimes(rc.trace);
  const std::vector<uint64_t> m = memory_curve(rc.trace, lifetimes);
  rc.peak = *std::max_element(m.begin(), m.end());
  rc.opts.min_tensor_bytes = (seed % 3 == 0) ? 0 : kMiB;
  rc.opts.tiers.push_back(TierSpec{"ssd", 64 * kTiB, 1.0 + static_cast<double>(seed % 10), 2.0 + static_cast<double>(seed % 7)});
  if (seed % 2 == 0) rc.opts.tiers.push_back(TierSpec{"host", 64 * kTiB, 50, 50});
  return rc;
}

uint64_t budget_between(const RandomCase& rc, double f) {
  if (rc.peak <= rc.max_active) return rc.peak;
  return rc.max_active + static_cast<uint64_t>(f * static_cast<double>(rc.peak - rc.max_active));
}

// make_plan's plan: valid, within the budget, its peak and move count as its stats say.
Plan expect_plan_fits(const Trace& trace, const PlannerOptions& opts, PlannerStats* stats, const std::string& where) {
  const Plan plan = make_plan(trace, opts, stats);
  const PlanCheck c = check(trace, plan);
  EXPECT_TRUE(c.valid) << where << "\n" << describe(c);
  EXPECT_LE(c.peak_bytes, opts.budget_bytes) << where;
  EXPECT_EQ(c.peak_bytes, stats->peak_after_bytes) << where;
  EXPECT_EQ(plan.moves.size(), 2 * (stats->chosen + stats->forced) - stats->offload_only) << where;
  return plan;
}

// Every tuning variant measured in docs/planner.md (clipped benefit, cost per time, neither prune
// nor hoisting, forced eviction by next use) makes valid plans.
void expect_tunings_valid(const Trace& trace, const PlannerOptions& opts, const std::string& where) {
  for (int v = 0; v < 8; ++v) {
    planner_detail::PlannerTuning t;
    t.clip_benefit = v & 1;
    t.cost_per_time = v & 2;
    t.prune = (v & 3) != 3;
    t.hoist_prefetch = (v & 3) != 3;
    t.evict_farthest_use = v & 4;
    const PlanCheck c = check(trace, planner_detail::make_plan_tuned(trace, opts, t, nullptr, nullptr));
    EXPECT_TRUE(c.valid) << where << " variant " << v << "\n" << describe(c);
  }
}

TEST(PlannerProperties, EveryPlanIsValidAndFits) {
  for (uint64_t seed = 1; seed <= 250; ++seed) {
    RandomCase rc = random_case(seed);
    for (double f : {0.0, 0.3, 0.7}) {
      rc.opts.budget_bytes = budget_between(rc, f);
      PlannerStats stats;
      expect_plan_fits(rc.trace, rc.opts, &stats, fmt::format("seed {} f {}", seed, f));
      ASSERT_EQ(stats.offload_only, 0u);  // no alive_until, every tensor used
      if (HasFailure()) return;
    }
  }
}

TEST(PlannerProperties, TuningVariantsAreValid) {
  for (uint64_t seed = 300; seed < 400; ++seed) {
    RandomCase rc = random_case(seed);
    rc.opts.budget_bytes = budget_between(rc, 0.2);
    expect_tunings_valid(rc.trace, rc.opts, fmt::format("seed {}", seed));
    if (HasFailure()) return;
  }
}

// A small host tier: the plan respects its capacity, or the planner refuses; never an invalid plan.
TEST(PlannerProperties, TierCapacityRespected) {
  for (uint64_t seed = 500; seed < 600; ++seed) {
    RandomCase rc = random_case(seed);
    rc.opts.tiers.clear();
    rc.opts.tiers.push_back(TierSpec{"host", rc.peak / 3, 50, 50});
    rc.opts.tiers.push_back(TierSpec{"ssd", 64 * kTiB, 3, 3});
    rc.opts.budget_bytes = budget_between(rc, 0.4);
    const Plan plan = make_plan(rc.trace, rc.opts);
    const PlanCheck c = check(rc.trace, plan);
    ASSERT_TRUE(c.valid) << "seed " << seed << "\n" << describe(c);
    EXPECT_LE(c.tier_peak_bytes[0], rc.peak / 3);
  }
}

// More budget does not move more bytes in total over many traces (single traces may, slightly:
// the greedy is not monotone).
TEST(PlannerProperties, MoreBudgetMovesFewerBytesOverall) {
  uint64_t tight = 0, loose = 0;
  for (uint64_t seed = 700; seed < 900; ++seed) {
    RandomCase rc = random_case(seed);
    auto moved = [&](double f) {
      rc.opts.budget_bytes = budget_between(rc, f);
      planner_detail::PlannerDiagnostics d;
      planner_detail::make_plan_tuned(rc.trace, rc.opts, {}, nullptr, &d);
      return d.bytes_offloaded;
    };
    tight += moved(0.2);
    loose += moved(0.6);
  }
  EXPECT_LT(loose, tight);
}

// Random traces where transient tensors stay alive past their last use and some persistent tensors
// are never used: every plan is valid and within the budget, also as the simulator replays it.
TEST(PlannerProperties, AliveUntilAndIdleTensorsPlansAreValidAndFit) {
  size_t one_way = 0;
  for (uint64_t seed = 1000; seed < 1150; ++seed) {
    RandomCase rc = random_case(seed);
    std::mt19937_64 rng(seed);
    const Lifetimes before(rc.trace);
    const auto n = static_cast<KernelIndex>(rc.trace.num_kernels());
    for (TensorId t = 0; t < rc.trace.num_tensors(); ++t) {
      TensorInfo& info = rc.trace.tensors[t];
      if (!info.persistent && rng() % 2 == 0) {
        const KernelIndex last = before.last_use(t);
        info.alive_until = last + static_cast<KernelIndex>(rng() % (n - last));
      }
    }
    // A few idle persistent tensors (no kernel uses them).
    for (int i = 0; i < static_cast<int>(rng() % 4); ++i) {
      tensor(rc.trace, "idle", kMiB / 2 + rng() % (64 * kMiB), true);
    }
    const std::vector<uint64_t> active = active_bytes(rc.trace);
    const uint64_t max_active = *std::max_element(active.begin(), active.end());
    const Lifetimes lifetimes(rc.trace);
    const std::vector<uint64_t> m = memory_curve(rc.trace, lifetimes);
    const uint64_t peak = *std::max_element(m.begin(), m.end());
    for (double f : {0.0, 0.3, 0.7}) {
      rc.opts.budget_bytes = max_active + static_cast<uint64_t>(f * static_cast<double>(peak - max_active));
      PlannerStats stats;
      const Plan plan = expect_plan_fits(rc.trace, rc.opts, &stats, fmt::format("seed {} f {}", seed, f));
      const SimResult sim = simulate(rc.trace, plan);
      EXPECT_LE(sim.peak_bytes, rc.opts.budget_bytes) << "seed " << seed;
      EXPECT_GE(sim.stall_us, 0.0);
      PlannerOptions discarding = rc.opts;  // Note [Dead tensors in the planner]
      discarding.discard_dead = true;
      PlannerStats dstats;
      const Plan dplan = expect_plan_fits(rc.trace, discarding, &dstats, fmt::format("discard, seed {} f {}", seed, f));
      const SimResult dsim = simulate(rc.trace, dplan);
      EXPECT_EQ(dsim.discards, dstats.discards) << "seed " << seed;
      EXPECT_LE(dsim.peak_bytes, rc.opts.budget_bytes) << "seed " << seed;
      if (HasFailure()) return;
      one_way += stats.offload_only;
    }
    if (seed % 5 != 0) continue;  // every tuning variant, and the --search variants, on some
    rc.opts.budget_bytes = max_active + (peak - max_active) / 5;
    expect_tunings_valid(rc.trace, rc.opts, fmt::format("seed {}", seed));
    for (const PlanVariant& v : make_plan_variants(rc.trace, rc.opts)) {
      const PlanCheck c = check(rc.trace, v.plan);
      ASSERT_TRUE(c.valid) << "seed " << seed << " " << v.name << "\n" << describe(c);
      ASSERT_LE(c.peak_bytes, rc.opts.budget_bytes) << "seed " << seed << " " << v.name;
    }
  }
  EXPECT_GT(one_way, 100u);  // the cases exercise offloads without a prefetch
}

}  // namespace
}  // namespace teraio
