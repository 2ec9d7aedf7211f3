// Recompute as the planner's third place (docs/planner.md, "Recompute") and in the simulator: a
// cheap producer is rerun where the link is the bottleneck, an expensive one is not, the option
// turns it off, the simulator charges the producer's time on the compute stream, and on a
// synthetic Llama trace at a tight budget the plan with recompute runs faster than the one without.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "planner_tuning.h"
#include "teraio/analysis.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/simulator.h"
#include "teraio/sweep.h"
#include "teraio/synth.h"

namespace teraio {
namespace {

constexpr uint64_t kGB = 1'000'000'000;

// A (1 GB) = mm(W) at kernel 0, expensive; B (1 GB) = relu(A) at kernel 1, taking `b_us`,
// recomputable; kernels 2..9 each use C (1 GB, made at 2); backward uses B at 10 and A at 11.
// Budget 2 GB + W: one of A and B must be away during the middle. The link moves 1 GB/s.
// `b_reads_w`: B = mul(A, W) instead, and its backward use does not read W (a parameter), so
// recomputing B there reads W. `mid_us`: each middle kernel's time; `c_first`, `c_end`: the middle
// kernels that use C (the others read W).
Trace producer_trace(double b_us, bool b_reads_w = false, double mid_us = 100'000, int c_first = 2, int c_end = 10) {
  Trace t;
  const TensorId w = t.add_tensor({1 << 20, TensorKind::parameter, true, "W"});
  TensorInfo a{kGB, TensorKind::activation, false, "A"};
  a.producer = 0;
  const TensorId ai = t.add_tensor(a);
  TensorInfo b{kGB, TensorKind::activation, false, "B"};
  b.producer = 1;
  b.recomputable = true;
  const TensorId bi = t.add_tensor(b);
  const TensorId c = t.add_tensor({kGB, TensorKind::temporary, false, "C"});
  t.add_kernel("aten::mm", 50'000, std::vector<TensorId>{w, ai});
  if (b_reads_w)
    t.add_kernel("aten::mul", b_us, std::vector<TensorId>{ai, w, bi});
  else
    t.add_kernel("aten::relu", b_us, std::vector<TensorId>{ai, bi});
  for (int k = 2; k < 10; ++k)
    t.add_kernel("mid", mid_us, k >= c_first && k < c_end ? std::vector<TensorId>{c} : std::vector<TensorId>{w});
  t.add_kernel("bwd_b", 50'000, b_reads_w ? std::vector<TensorId>{bi} : std::vector<TensorId>{bi, w});
  t.add_kernel("bwd_a", 50'000, std::vector<TensorId>{ai, w});
  return t;
}

PlannerOptions options() {
  PlannerOptions o;
  o.budget_bytes = 2 * kGB + (1 << 20);
  o.tiers = {{"host", 100 * kGB, 1, 1}};
  o.min_tensor_bytes = 0;
  return o;
}

size_t count(const Plan& p, MoveOp op, TensorId t) {
  size_t n = 0;
  for (const Move& m : p.moves) n += m.op == op && m.tensor == t;
  return n;
}

// The kernels before which the plan makes t again, in order.
std::vector<KernelIndex> recompute_points(const Plan& p, TensorId t) {
  std::vector<KernelIndex> v;
  for (const Move& m : p.moves) {
    if (m.op == MoveOp::recompute && m.tensor == t) v.push_back(m.deadline);
  }
  std::sort(v.begin(), v.end());
  return v;
}

void expect_valid(const Trace& t, const Plan& p) {
  const PlanCheck c = check_plan(t, Lifetimes(t), p);
  EXPECT_TRUE(c.valid) << (c.errors.empty() ? "" : c.errors.front());
}

TEST(RecomputePlanner, ACheapProducerIsRerunWhenTheLinkIsTheBottleneck) {
  const Trace t = producer_trace(500);  // 0.5 ms against 1 s on the link each way
  PlannerStats st;
  const Plan p = make_plan(t, options(), &st);
  expect_valid(t, p);
  EXPECT_EQ(count(p, MoveOp::recompute, 2), 1u);
  EXPECT_EQ(count(p, MoveOp::offload, 1) + count(p, MoveOp::offload, 2), 0u);
  EXPECT_EQ(st.recomputes, 1u);
  EXPECT_DOUBLE_EQ(st.recompute_us, 500);
  const SimResult r = simulate(t, p);
  EXPECT_DOUBLE_EQ(r.recompute_us, 500);
  EXPECT_EQ(r.recomputes, 1u);
  EXPECT_NEAR(r.iteration_us, r.ideal_us + 500, 1e-6);  // nothing crosses the link
}

TEST(RecomputePlanner, AnExpensiveProducerIsMovedInstead) {
  const Trace t = producer_trace(5e6);  // 5 s: more than moving the gigabyte (1 s)
  const Plan p = make_plan(t, options());
  expect_valid(t, p);
  EXPECT_EQ(count(p, MoveOp::recompute, 2), 0u);
  EXPECT_GE(count(p, MoveOp::offload, 1) + count(p, MoveOp::offload, 2), 1u);
}

// Note [Recompute's host time]: with host times, a producer whose kernel is cheap but whose host
// time is not (2 s to launch, against 1 s to move the gigabyte) is moved instead; host times below
// its kernel's time change nothing.
TEST(RecomputePlanner, AProducerTheHostTakesLongToRerunIsMovedInstead) {
  Trace t = producer_trace(500);
  const TensorId bi = 2;
  t.set_kernel_host_us(1, 2e6);
  const Plan slow_host = make_plan(t, options());
  expect_valid(t, slow_host);
  EXPECT_EQ(count(slow_host, MoveOp::recompute, bi), 0u);
  EXPECT_GE(count(slow_host, MoveOp::offload, 1) + count(slow_host, MoveOp::offload, bi), 1u);
  t.set_kernel_host_us(1, 100);
  const Plan fast_host = make_plan(t, options());
  expect_valid(t, fast_host);
  EXPECT_EQ(count(fast_host, MoveOp::recompute, bi), 1u);
}

TEST(RecomputePlanner, TheOptionTurnsRecomputeOff) {
  const Trace t = producer_trace(500);
  PlannerOptions o = options();
  o.recompute = false;
  const Plan p = make_plan(t, o);
  expect_valid(t, p);
  EXPECT_EQ(count(p, MoveOp::recompute, 2), 0u);
  // And it is slower here: 1 GB each way over 1 GB/s, partly hidden by the 0.8 s middle.
  EXPECT_GT(simulate(t, p).iteration_us, simulate(t, make_plan(t, options())).iteration_us);
}

// Note [Recomputes that read parameters]: B = mul(A, W) is cheap and recomputable, but its backward
// use does not read W (a parameter): recomputing B there reads W (producer_trace, b_reads_w). The
// tuning that leaves such gaps to the moves moves B instead; the default recomputes it; plan_best
// has the variant.
TEST(RecomputePlanner, RecomputesThatReadAParameterAreAVariant) {
  const Trace t = producer_trace(500, /*b_reads_w=*/true);
  const TensorId bi = 2;
  const PlannerOptions o = options();
  const Plan plain = make_plan(t, o);
  expect_valid(t, plain);
  EXPECT_EQ(count(plain, MoveOp::recompute, bi), 1u);
  planner_detail::PlannerTuning tuning;
  tuning.recompute_without_persistent_reads = true;
  const Plan without = planner_detail::make_plan_tuned(t, o, tuning, nullptr, nullptr);
  expect_valid(t, without);
  EXPECT_EQ(count(without, MoveOp::recompute, bi), 0u);
  bool listed = false;
  for (const PlanVariant& v : make_plan_variants(t, o))
    listed |= v.name.starts_with("recompute without persistent reads");
  EXPECT_TRUE(listed);
}

// Note [Inputs kept for a recompute]: S (`s_bytes`) = mm(W) at kernel 0, not recomputable, read
// once more by kernel 1 and dead after it; B (1 GB) = exp(S) at kernel 1, recomputable, 0.5 ms;
// kernels 2..9 each use C (1 GB); the backward uses B at 10. Under a budget of 1.6 GB B must be
// away in the middle, and S is dead there in the trace.
Trace kept_input_trace(uint64_t s_bytes) {
  Trace t;
  const TensorId w = t.add_tensor({1 << 20, TensorKind::parameter, true, "W"});
  TensorInfo s{s_bytes, TensorKind::temporary, false, "S"};
  s.producer = 0;
  const TensorId si = t.add_tensor(s);
  TensorInfo b{kGB, TensorKind::activation, false, "B"};
  b.producer = 1;
  b.recomputable = true;
  const TensorId bi = t.add_tensor(b);
  const TensorId c = t.add_tensor({kGB, TensorKind::temporary, false, "C"});
  t.add_kernel("aten::mm", 50'000, std::vector<TensorId>{w, si});
  t.add_kernel("aten::exp", 500, std::vector<TensorId>{si, bi});
  for (int k = 2; k < 10; ++k) t.add_kernel("mid", 100'000, std::vector<TensorId>{c});
  t.add_kernel("bwd_b", 50'000, std::vector<TensorId>{bi, w});
  return t;
}

TEST(RecomputePlanner, ARecomputeKeepsASmallDeadInput) {
  const TensorId si = 1, bi = 2;
  const Trace t = kept_input_trace(kGB / 10);
  PlannerOptions o = options();
  o.budget_bytes = 16 * kGB / 10;
  for (const bool deep : {false, true}) {
    SCOPED_TRACE(deep ? "deep chains" : "one level");
    planner_detail::PlannerTuning tuning;
    tuning.revive_dead_inputs = deep;
    const Plan kept = planner_detail::make_plan_tuned(t, o, tuning, nullptr, nullptr);
    expect_valid(t, kept);
    EXPECT_EQ(count(kept, MoveOp::recompute, bi), 1u);  // S lives on to kernel 10 instead
    EXPECT_EQ(count(kept, MoveOp::offload, bi), 0u);
    tuning.keep_dead_inputs = false;
    const Plan moved = planner_detail::make_plan_tuned(t, o, tuning, nullptr, nullptr);
    expect_valid(t, moved);
    EXPECT_EQ(count(moved, MoveOp::recompute, bi), 0u);  // S is dead at kernel 10: B moves
    EXPECT_EQ(count(moved, MoveOp::offload, bi), 1u);
    EXPECT_LT(simulate(t, kept).iteration_us, simulate(t, moved).iteration_us);
    // 0.1 GB of S cross the link (if at all) where 1 GB of B would have.
    EXPECT_EQ(count(kept, MoveOp::recompute, si), 0u);
  }
}

TEST(RecomputePlanner, AnInputTooLargeToKeepLeavesTheTensorToTheMoves) {
  // S half of B's bytes: keeping it would carry more than a quarter of what recomputing B saves
  // (PlannerTuning::kept_bytes_fraction), so B is moved.
  const TensorId bi = 2;
  const Trace t = kept_input_trace(kGB / 2);
  PlannerOptions o = options();
  o.budget_bytes = 16 * kGB / 10;
  const Plan p = make_plan(t, o);
  expect_valid(t, p);
  EXPECT_EQ(count(p, MoveOp::recompute, bi), 0u);
}

// Note [Refining the fastest variant's recomputes]: a producer taking a quarter of its bytes' link
// time passes the rule, though moving them would hide behind the middle's seconds; the search's
// refinement of a setting plans it again with the rule's factor scaled, and the one at x0.1 moves B.
TEST(RecomputePlanner, TheSearchRefinesHowMuchAVariantRecomputes) {
  // 1 s middle kernels, C used only by the middle four: B has two seconds on each side to leave
  // and come back; B's producer takes a quarter of its link time.
  const Trace t = producer_trace(250'000, false, 1e6, 4, 8);
  const TensorId bi = 2;
  const PlannerOptions o = options();
  const Plan own = make_plan(t, o);
  EXPECT_EQ(count(own, MoveOp::recompute, bi), 1u);
  const std::vector<PlanVariant> refined = refine_plan_variant(t, o, own, "default");
  std::vector<std::string> names;
  for (const PlanVariant& v : refined) {
    names.push_back(v.name);
    expect_valid(t, v.plan);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"default, recompute factor x0.1", "default, recompute factor x0.25",
                                             "default, recompute factor x4", "default, no kept inputs"}));
  ASSERT_FALSE(refined.empty());
  EXPECT_EQ(count(refined[0].plan, MoveOp::recompute, bi), 0u);
  EXPECT_LT(simulate(t, refined[0].plan).iteration_us, simulate(t, own).iteration_us);
  // Settings that recompute nothing, or a trace with nothing to recompute: nothing to refine.
  EXPECT_TRUE(refine_plan_variant(t, o, own, "no recompute").empty());
  EXPECT_TRUE(refine_plan_variant(t, o, own, "no such variant").empty());
  PlannerOptions off = o;
  off.recompute = false;
  EXPECT_TRUE(refine_plan_variant(t, off, own, "default").empty());
  // plan_best keeps the refined plan where it is the fastest.
  const BestPlan best = plan_best(t, o);
  EXPECT_EQ(count(best.plan, MoveOp::recompute, bi), 0u);
}

TEST(RecomputeSimulator, ARecomputeIsComputeStreamTimeBeforeItsKernel) {
  const Trace t = producer_trace(700);
  Plan p;
  p.budget_bytes = 4 * kGB;
  p.tiers = {{"host", 100 * kGB, 1, 1}};
  p.moves = {{2, MoveOp::recompute, 0, 1, 10}};
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(t, p, o);
  EXPECT_EQ(r.recomputes, 1u);
  EXPECT_DOUBLE_EQ(r.recompute_us, 700);
  EXPECT_DOUBLE_EQ(r.stall_us, 0);
  EXPECT_NEAR(r.iteration_us, t.total_time_us() + 700, 1e-6);
  // Kernel 10 starts 700 us after kernel 9 ends; kernel 9 itself is not delayed.
  EXPECT_NEAR(r.kernel_start_us[10] - r.kernel_start_us[9], t.kernel_time_us(9) + 700, 1e-6);
  EXPECT_NEAR(r.kernel_start_us[9] - r.kernel_start_us[8], t.kernel_time_us(8), 1e-6);
  EXPECT_EQ(r.peak_bytes, 2 * kGB + (1 << 20));  // B absent over kernels 2..9
}

// The issue's case: the link cannot carry the activations out as fast as they are made. On a
// synthetic Llama-1B iteration (6.4 s of kernels, 37.9 GiB peak) at 9 GiB with one 55 GB/s host
// tier, recomputing the cheap activations beats moving them (docs/planner.md, "Recompute").
TEST(RecomputePlanner, SyntheticLlamaAtATightBudgetRunsFasterWithRecompute) {
  SynthOptions so;
  so.model = "llama-1b";
  const Trace t = synthesize(so);
  PlannerOptions o;
  o.budget_bytes = uint64_t{9} << 30;
  o.tiers = {{"host", uint64_t{64} << 30, 55, 55}};
  const Plan with = make_plan(t, o);
  o.recompute = false;
  const Plan without = make_plan(t, o);
  expect_valid(t, with);
  const SimResult a = simulate(t, with), b = simulate(t, without);
  EXPECT_GT(a.recomputes, 0u);
  EXPECT_EQ(b.recomputes, 0u);
  // about 10% faster (the default links, LinkOrder::kIssue; 4.5% with kDeadline)
  EXPECT_LT(a.iteration_us, 0.95 * b.iteration_us) << a.iteration_us << " vs " << b.iteration_us;
  EXPECT_LE(a.peak_bytes, o.budget_bytes);
}

// Every plan is valid whatever the budget and tiers: recomputes, chains, the reads moves rely on
// (during development, a chained recompute's stale read made an invalid plan on Llama3-70B).
// X = f(W) at 0, Z = g(X) at 1, X used at 2 and 4, Z at 3, C (made at 2) at 2 and 4; 1 GB each but W,
// cheap producers, a 1 GB/s link, a budget of 2 GB + W. X is recomputed over (2, 4). Recomputing Z
// before kernel 3 would read X there, inside X's window: a chain that makes X at 3, right after it
// was freed at 2, frees nothing, and with the read at 3 X has no gap left to recompute. The
// planner must not take that chain (it once stopped on an internal error, seen on a
// teraio-train profile).
TEST(RecomputePlanner, AChainThatWouldFreeNothingIsNotTaken) {
  Trace t;
  const TensorId w = t.add_tensor({1 << 20, TensorKind::parameter, true, "W"});
  auto made = [&](const char* name, KernelIndex producer) {
    TensorInfo x{kGB, TensorKind::activation, false, name};
    x.producer = producer;
    x.recomputable = true;
    return t.add_tensor(x);
  };
  const TensorId x = made("X", 0), z = made("Z", 1);
  const TensorId c = t.add_tensor({kGB, TensorKind::temporary, false, "C"});
  t.add_kernel("aten::f", 10, std::vector<TensorId>{w, x});
  t.add_kernel("aten::g", 10, std::vector<TensorId>{x, z});
  t.add_kernel("use_x", 100'000, std::vector<TensorId>{x, c});
  t.add_kernel("use_z", 100'000, std::vector<TensorId>{z});
  t.add_kernel("use_x_again", 100'000, std::vector<TensorId>{x, c});
  for (bool search : {false, true}) {
    std::vector<Plan> plans;
    if (search) {
      for (PlanVariant& v : make_plan_variants(t, options())) plans.push_back(std::move(v.plan));
    } else {
      plans.push_back(make_plan(t, options()));
    }
    for (const Plan& p : plans) {
      expect_valid(t, p);
      for (const Move& m : p.moves) {
        if (m.op == MoveOp::recompute) {
          EXPECT_LT(m.start + 1, m.deadline) << "frees a kernel or more";
        }
      }
    }
    EXPECT_EQ(count(plans.front(), MoveOp::recompute, x), 1u);
  }
}

// A short gap early in the forward pass must not chain an input recomputed up to the backward
// (Note [Chains that cost more than they free]; seen on the H200's Llama-3-8B autocast profile).
// N = norm(R) at 0 (activation, used again by the backward at 10), O = mul(N, W) at 1 (a
// temporary read at 2 and 4), C (0.5 GB, made at 2) at 2..3, D (1.5 GB) at 5..9; 1 GB each but W
// and R, cheap producers, a 1 GB/s link, a budget of 2 GB + W + R: kernels 2..3 and 5..9 are over it
// without a plan. Recomputing O over (2, 4) would read N at 4 (which has room for it), a chain
// making N there and keeping it resident over 5..9 (2.5 GB: something would cross the link);
// freeing O over kernel 3 alone is not worth that. The plan recomputes N over (1, 10) and leaves O.
TEST(RecomputePlanner, AShortGapDoesNotChainALongRecompute) {
  Trace t;
  const TensorId w = t.add_tensor({1 << 20, TensorKind::parameter, true, "W"});
  const TensorId r = t.add_tensor({1 << 20, TensorKind::parameter, true, "R"});
  auto made = [&](const char* name, TensorKind kind, KernelIndex producer) {
    TensorInfo x{kGB, kind, false, name};
    x.producer = producer;
    x.recomputable = true;
    return t.add_tensor(x);
  };
  const TensorId n = made("N", TensorKind::activation, 0), o = made("O", TensorKind::temporary, 1);
  const TensorId c = t.add_tensor({kGB / 2, TensorKind::temporary, false, "C"});
  const TensorId d = t.add_tensor({3 * kGB / 2, TensorKind::activation, false, "D"});
  t.add_kernel("aten::norm", 10, std::vector<TensorId>{r, n});
  t.add_kernel("aten::mul", 10, std::vector<TensorId>{n, w, o});
  t.add_kernel("lin_q", 100'000, std::vector<TensorId>{o, c});
  t.add_kernel("lin_k", 100'000, std::vector<TensorId>{c});
  t.add_kernel("lin_v", 100'000, std::vector<TensorId>{o});
  for (int k = 5; k < 10; ++k) t.add_kernel("mid", 100'000, std::vector<TensorId>{d});
  t.add_kernel("bwd", 100'000, std::vector<TensorId>{n});
  PlannerOptions opts = options();
  opts.budget_bytes = 2 * kGB + (2 << 20);
  // Chains one level deep (the default): the chain would move N's point to 4.
  const Plan p = make_plan(t, opts);
  expect_valid(t, p);
  EXPECT_EQ(count(p, MoveOp::recompute, o), 0u);
  ASSERT_EQ(count(p, MoveOp::recompute, n), 1u);
  for (const Move& m : p.moves) {
    if (m.op == MoveOp::recompute && m.tensor == n) {
      EXPECT_EQ(m.deadline, 10u) << "N made for the backward";
    }
  }
  SimResult sim = simulate(t, p);
  EXPECT_LE(sim.peak_bytes, opts.budget_bytes);
  EXPECT_NEAR(sim.iteration_us, sim.ideal_us + 10, 1e-6) << "nothing crosses the link";
  // Deep chains (PlannerOptions::deep_recompute, Note [Deep recompute chains]): N is made at 4 for
  // O's recompute and freed again, then made at 10 for the backward; never resident over 5..9.
  PlannerOptions deep_opts = opts;
  deep_opts.deep_recompute = true;
  const Plan deep = make_plan(t, deep_opts);
  expect_valid(t, deep);
  EXPECT_EQ(count(deep, MoveOp::recompute, o), 1u);
  EXPECT_EQ(count(deep, MoveOp::recompute, n), 2u);
  EXPECT_EQ(recompute_points(deep, n), (std::vector<KernelIndex>{4, 10}));
  sim = simulate(t, deep);
  EXPECT_LE(sim.peak_bytes, opts.budget_bytes);
  EXPECT_NEAR(sim.iteration_us, sim.ideal_us + 30, 1e-6) << "N twice and O rerun: nothing crosses the link";
}

// Note [Recompute across the peak]: R (a parameter) is normalised by six cheap elementwise kernels,
// each a temporary of 0.26 GB read only by the next (`expensive`: the third takes 2 s), into X (1
// GB, activation) at kernel 6; kernels 7..12 use C (2 GB): the peak; the backward uses X at 13. A 1
// GB/s link, a budget of 2.6 GB: X must be away over the middle. Remaking X at 13 needs the
// temporaries made there again (the trace has them dead), a chain up to seven producers deep.
Trace norm_chain_trace(bool expensive) {
  Trace t;
  const TensorId r = t.add_tensor({1 << 20, TensorKind::parameter, true, "R"});
  TensorId in = r;
  for (int k = 0; k < 7; ++k) {
    TensorInfo x{k < 6 ? 26 * kGB / 100 : kGB, k < 6 ? TensorKind::temporary : TensorKind::activation, false,
                 k < 6 ? "T" + std::to_string(k + 1) : "X"};
    x.producer = static_cast<KernelIndex>(k);
    x.recomputable = true;
    const TensorId out = t.add_tensor(x);
    t.add_kernel("aten::elementwise", expensive && k == 2 ? 2e6 : 10, std::vector<TensorId>{in, out});
    in = out;
  }
  const TensorId c = t.add_tensor({2 * kGB, TensorKind::temporary, false, "C"});
  for (int k = 7; k < 13; ++k) t.add_kernel("mid", 100'000, std::vector<TensorId>{c});
  t.add_kernel("bwd_x", 100'000, std::vector<TensorId>{in});
  return t;
}

// The options of the tests below (a 1 GB/s link, a budget of 2.6 GB), and make_plan with deep
// chains, across the peak or not (and with points pulled within `pull_window` kernels).
PlannerOptions peak_options() {
  PlannerOptions o = options();
  o.budget_bytes = 26 * kGB / 10;
  return o;
}

Plan deep_plan(const Trace& t, bool across_peak, uint32_t pull_window = 0) {
  planner_detail::PlannerTuning tuning;
  tuning.revive_dead_inputs = true;
  tuning.recompute_across_peak = across_peak;
  tuning.pull_window = pull_window;
  return planner_detail::make_plan_tuned(t, peak_options(), tuning, nullptr, nullptr);
}

TEST(RecomputePlanner, AChainSevenDeepIsRecomputedAcrossThePeak) {
  const TensorId x = 7;
  const Trace t = norm_chain_trace(false);
  PlannerOptions o = peak_options();
  // Deep chains stop four producers down: X is moved over the link instead.
  const Plan deep = deep_plan(t, false);
  expect_valid(t, deep);
  EXPECT_EQ(count(deep, MoveOp::recompute, x), 0u);
  EXPECT_EQ(count(deep, MoveOp::offload, x), 1u);
  // Across the peak: X is made again at 13 from R, every temporary of the chain with it.
  const Plan peak = deep_plan(t, true);
  expect_valid(t, peak);
  EXPECT_EQ(count(peak, MoveOp::recompute, x), 1u);
  EXPECT_EQ(count(peak, MoveOp::offload, x), 0u);
  // T2..T6 made again there too (T1, a kernel after R, may stay resident where it fits).
  for (TensorId ti = 2; ti <= 6; ++ti) EXPECT_EQ(count(peak, MoveOp::recompute, ti), 1u) << "T" << ti;
  const SimResult moved = simulate(t, deep), remade = simulate(t, peak);
  EXPECT_LE(remade.peak_bytes, o.budget_bytes);
  EXPECT_GE(remade.recomputes, 6u);
  EXPECT_NEAR(remade.iteration_us, remade.ideal_us + remade.recompute_us, 1e-6) << "nothing waits for the link";
  EXPECT_LT(remade.iteration_us, moved.iteration_us);
  // The search lists the setting and keeps it where it is fastest.
  bool listed = false;
  for (const PlanVariant& v : make_plan_variants(t, o)) {
    listed |= v.name.starts_with("deep recompute across the peak");
    expect_valid(t, v.plan);
  }
  EXPECT_FALSE(listed) << "a search without deep chains has no such variant";
  o.deep_recompute = true;
  for (const PlanVariant& v : make_plan_variants(t, o)) listed |= v.name.starts_with("deep recompute across the peak");
  EXPECT_TRUE(listed);
  EXPECT_EQ(count(plan_best(t, o).plan, MoveOp::recompute, x), 1u);
  // PlannerOptions::recompute_across_peak (a Session's TERAIO_RECOMPUTE_ACROSS_PEAK=0) leaves it out.
  o.recompute_across_peak = false;
  for (const PlanVariant& v : make_plan_variants(t, o)) {
    EXPECT_EQ(v.name.find("across the peak"), std::string::npos) << v.name;
  }
  EXPECT_EQ(count(plan_best(t, o).plan, MoveOp::recompute, x), 0u);
}

TEST(RecomputePlanner, AcrossThePeakAChainIsPricedAtEveryProducerItReruns) {
  // The third temporary takes 2 s to make, twice X's second on the link: the chain is not taken,
  // though X's own producer is cheap.
  const TensorId x = 7;
  const Trace t = norm_chain_trace(true);
  const Plan p = deep_plan(t, true);
  expect_valid(t, p);
  EXPECT_EQ(count(p, MoveOp::recompute, x), 0u);
  EXPECT_EQ(count(p, MoveOp::recompute, 3), 0u) << "T3 is never made again";
}

// Across the peak only the gaps that span it are recomputed: Y (1 GB, a cheap producer at 0) is
// used at 0, 2 and 9; kernel 1 uses C (1.5 GB), kernels 3..8 use D (2 GB, the peak). Its gap (0, 2)
// is over the budget of 2.6 GB without a plan, as is (2, 9); only the second spans the peak.
TEST(RecomputePlanner, AcrossThePeakAForwardGapIsLeftToTheMoves) {
  Trace t;
  const TensorId w = t.add_tensor({1 << 20, TensorKind::parameter, true, "W"});
  TensorInfo yi{kGB, TensorKind::activation, false, "Y"};
  yi.producer = 0;
  yi.recomputable = true;
  const TensorId y = t.add_tensor(yi);
  const TensorId c = t.add_tensor({3 * kGB / 2 + kGB / 10, TensorKind::temporary, false, "C"});
  const TensorId d = t.add_tensor({2 * kGB, TensorKind::temporary, false, "D"});
  t.add_kernel("aten::f", 10, std::vector<TensorId>{w, y});
  t.add_kernel("use_c", 100'000, std::vector<TensorId>{c});
  t.add_kernel("use_y", 100'000, std::vector<TensorId>{y});
  for (int k = 3; k < 9; ++k) t.add_kernel("mid", 100'000, std::vector<TensorId>{d});
  t.add_kernel("bwd_y", 100'000, std::vector<TensorId>{y});
  const Plan deep = deep_plan(t, false);
  expect_valid(t, deep);
  EXPECT_EQ(count(deep, MoveOp::recompute, y), 2u);
  const Plan peak = deep_plan(t, true);
  expect_valid(t, peak);
  ASSERT_EQ(count(peak, MoveOp::recompute, y), 1u);
  for (const Move& m : peak.moves) {
    if (m.op == MoveOp::recompute) {
      EXPECT_EQ(m.start, 2u);
      EXPECT_EQ(m.deadline, 9u);
    }
  }
}

// Note [Points pulled to their readers']: A (0.5 GB) is made from R at 0 by a slow kernel (0.3 s,
// under its own 0.5 s on the 1 GB/s link), B (0.25 GB) from A at 1 by a fast one; kernels 2..7 use
// C (2.4 GB, the peak); the backward reads B at 8 and A at 10. Both must be away over the peak (a
// budget of 2.6 GB). B's recompute at 8 needs A there: without the pull A would be made at 8 for
// it and again at 10 for itself, a chain priced at 0.3 s for B's 0.25 s of link: not taken, B is
// moved. Pulled to 8, A is made once, and B's recompute costs its own kernel.
TEST(RecomputePlanner, AcrossThePeakAnInputIsMadeOnceAtItsReadersPoint) {
  Trace t;
  const TensorId r = t.add_tensor({1 << 20, TensorKind::parameter, true, "R"});
  auto made = [&](const char* name, uint64_t bytes, KernelIndex producer) {
    TensorInfo x{bytes, TensorKind::activation, false, name};
    x.producer = producer;
    x.recomputable = true;
    return t.add_tensor(x);
  };
  const TensorId a = made("A", kGB / 2, 0), b = made("B", kGB / 4, 1);
  const TensorId c = t.add_tensor({24 * kGB / 10, TensorKind::temporary, false, "C"});
  t.add_kernel("aten::f", 300'000, std::vector<TensorId>{r, a});
  t.add_kernel("aten::g", 10, std::vector<TensorId>{a, b});
  for (int k = 2; k < 8; ++k) t.add_kernel("mid", 100'000, std::vector<TensorId>{c});
  t.add_kernel("bwd_b", 100'000, std::vector<TensorId>{b});
  t.add_kernel("other", 100'000, std::vector<TensorId>{r});
  t.add_kernel("bwd_a", 100'000, std::vector<TensorId>{a});
  const auto plan = [&](uint32_t window) {
    Plan p = deep_plan(t, true, window);
    expect_valid(t, p);
    EXPECT_LE(simulate(t, p).peak_bytes, peak_options().budget_bytes);
    return p;
  };
  const Plan split = plan(0);
  EXPECT_EQ(recompute_points(split, a), (std::vector<KernelIndex>{10}));
  EXPECT_TRUE(recompute_points(split, b).empty());
  EXPECT_EQ(count(split, MoveOp::offload, b), 1u) << "B moved over the link";
  const Plan pulled = plan(2);
  EXPECT_EQ(recompute_points(pulled, a), (std::vector<KernelIndex>{8})) << "A made once, where B needs it";
  EXPECT_EQ(recompute_points(pulled, b), (std::vector<KernelIndex>{8}));
  EXPECT_EQ(count(pulled, MoveOp::offload, b), 0u);
  EXPECT_EQ(simulate(t, pulled).recomputes, 2u);
  // A window shorter than A's wait (8 to 10) leaves it as it was.
  EXPECT_TRUE(recompute_points(plan(1), b).empty());
  // The search offers it.
  PlannerOptions o = peak_options();
  o.deep_recompute = true;
  bool listed = false;
  for (const PlanVariant& v : make_plan_variants(t, o)) {
    listed |= v.name.find("points pulled to their readers") != std::string::npos;
    expect_valid(t, v.plan);
  }
  EXPECT_TRUE(listed);
}

// The budgets a plan can have: from the largest kernel's own tensors to the unplanned peak.
std::pair<uint64_t, uint64_t> budget_range(const Trace& t, const Lifetimes& life) {
  const std::vector<uint64_t> curve = memory_curve(t, life);
  const std::vector<uint64_t> act = active_bytes(t);
  return {*std::max_element(act.begin(), act.end()), *std::max_element(curve.begin(), curve.end())};
}

// Every variant with deep chains (PlannerOptions::deep_recompute) is a valid plan at every budget,
// fp32 and autocast (as PlansOfSyntheticTracesAreValidAtEveryBudget below checks the others): splits
// and revives leave every span between two uses or reads (during development, spans over a read
// added later stopped the planner on an internal error on the H200 profiles).
TEST(RecomputePlanner, DeepChainPlansAreValidAtEveryBudget) {
  for (const SynthDtype dtype : {SynthDtype::fp32, SynthDtype::amp}) {
    SynthOptions so;
    so.model = "llama-1b";
    so.dtype = dtype;
    so.step_in_backward = dtype == SynthDtype::amp;
    so.micro_batches = 1;
    const Trace t = synthesize(so);
    const Lifetimes life(t);
    const auto [lo, hi] = budget_range(t, life);
    size_t revived = 0;
    for (double f : {0.05, 0.25, 0.5}) {
      PlannerOptions o;
      o.budget_bytes = lo + static_cast<uint64_t>(f * static_cast<double>(hi - lo));
      o.tiers = {{"host", uint64_t{1} << 42, 55, 55}};
      o.min_tensor_bytes = uint64_t{1} << 20;
      o.deep_recompute = true;
      for (const PlanVariant& v : make_plan_variants(t, o)) {
        const PlanCheck c = check_plan(t, life, v.plan);
        EXPECT_TRUE(c.valid) << static_cast<int>(dtype) << " at " << f << ", " << v.name << ": "
                             << (c.errors.empty() ? "" : c.errors.front());
        for (const RecomputeMove& r : c.recomputes) revived += r.start >= life.last_use(r.tensor);
      }
    }
    if (dtype == SynthDtype::amp) {  // the projections' bf16 input copies read the dead norm output
      EXPECT_GT(revived, 0u) << "some plan revives a tensor dead by its point";
    }
  }
}

TEST(RecomputePlanner, PlansOfSyntheticTracesAreValidAtEveryBudget) {
  for (const char* model : {"tiny", "llama-1b"}) {
    SynthOptions so;
    so.model = model;
    const Trace t = synthesize(so);
    const Lifetimes life(t);
    const auto [lo, hi] = budget_range(t, life);
    size_t recomputed = 0;
    for (double f : {0.05, 0.2, 0.5, 0.8}) {
      PlannerOptions o;
      o.budget_bytes = lo + static_cast<uint64_t>(f * static_cast<double>(hi - lo));
      o.tiers = {{"ssd", uint64_t{1} << 42, 6.5, 6.5}, {"host", hi / 8, 55, 55}};
      o.min_tensor_bytes = std::string(model) == "tiny" ? 0 : uint64_t{1} << 20;
      for (const PlanVariant& v : make_plan_variants(t, o)) {
        const PlanCheck c = check_plan(t, life, v.plan);
        EXPECT_TRUE(c.valid) << model << " at " << f << ", " << v.name << ": "
                             << (c.errors.empty() ? "" : c.errors.front());
        recomputed += c.recomputes.size();
      }
    }
    // tiny's tensors are kilobytes: moving one costs less than a kernel launch, so none is recomputed.
    if (std::string(model) != "tiny") {
      EXPECT_GT(recomputed, 0u) << model;
    }
  }
}

}  // namespace
}  // namespace teraio
