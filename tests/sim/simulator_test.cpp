// Tests of teraio::simulate: golden timelines worked out by hand (docs/simulator.md has the model),
// properties over random valid plans, rejection of invalid plans, and the 250k-kernel speed target.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <tuple>

#include "sim_test_util.h"
#include "teraio/error.h"
#include "teraio/simulator.h"

namespace teraio {
namespace {

using test::make_trace;
using test::offload;
using test::prefetch;
using test::tier;

// 1 GB/s moves 1000 bytes per microsecond, which keeps the hand arithmetic simple.
constexpr double kGbps = 1.0;

// One simulated iteration, its kernels' starts and transfers kept (the golden timelines' options).
SimOptions one_iteration_with_timeline() {
  SimOptions o;
  o.iterations = 1;
  o.record_timeline = true;
  return o;
}

const SimTransfer* find_transfer(const SimResult& r, bool is_offload, uint64_t bytes) {
  for (const SimTransfer& t : r.transfers) {
    if (t.offload == is_offload && t.bytes == bytes) return &t;
  }
  return nullptr;
}

TEST(SimGolden, OffloadAndPrefetchStallExactly) {
  // Kernels of 10 us; tensor 0 (20 us of transfer) used at kernels 0 and 4.
  const Trace tr = make_trace({10, 10, 10, 10, 10}, {{20000, false}}, {{0}, {}, {}, {}, {0}});
  Plan plan;
  plan.tiers = {tier("ssd", kGbps, kGbps)};
  plan.moves = {offload(0, 0, 1), prefetch(0, 3, 4)};
  test::fit_budget(tr, plan);
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(tr, plan, o);
  // Offload 10..30 holds kernel 2 (wants 20) until 30; prefetch 40..60 holds kernel 4 (wants 50).
  EXPECT_DOUBLE_EQ(r.ideal_us, 50);
  EXPECT_DOUBLE_EQ(r.stall_us, 20);
  EXPECT_DOUBLE_EQ(r.iteration_us, 70);
  EXPECT_DOUBLE_EQ(r.last_iteration_us, 70);
  EXPECT_DOUBLE_EQ(r.overlap_us, 20);  // 10 us of each transfer ran under kernels 1 and 3
  EXPECT_EQ(r.urgent_fetches, 2u);
  EXPECT_EQ(r.peak_bytes, 20000u);
  ASSERT_EQ(r.tiers.size(), 1u);
  EXPECT_EQ(r.tiers[0].offload_bytes, 20000u);
  EXPECT_EQ(r.tiers[0].prefetch_bytes, 20000u);
  EXPECT_DOUBLE_EQ(r.tiers[0].write_busy_us, 20);
  EXPECT_DOUBLE_EQ(r.tiers[0].read_busy_us, 20);
  ASSERT_EQ(r.kernel_start_us.size(), 5u);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[2], 30);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[4], 60);
  const SimTransfer* pf = find_transfer(r, false, 20000);
  ASSERT_NE(pf, nullptr);
  EXPECT_DOUBLE_EQ(pf->begin_us, 40);
  EXPECT_DOUBLE_EQ(pf->end_us, 60);
  EXPECT_TRUE(pf->urgent);
}

TEST(SimGolden, MoreBandwidthRemovesTheStall) {
  const Trace tr = make_trace({10, 10, 10, 10, 10}, {{20000, false}}, {{0}, {}, {}, {}, {0}});
  Plan plan;
  plan.tiers = {tier("ssd", kGbps, kGbps)};
  plan.moves = {offload(0, 0, 1), prefetch(0, 3, 4)};
  test::fit_budget(tr, plan);
  SimOptions o;
  o.actual_tiers = {tier("ssd", 2.0, 2.0)};  // 10 us per transfer: exactly hidden
  const SimResult r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.stall_us, 0);
  EXPECT_DOUBLE_EQ(r.iteration_us, r.ideal_us);
  EXPECT_DOUBLE_EQ(r.overlap_us, 20);
  EXPECT_EQ(r.urgent_fetches, 0u);
}

// The floor: max(compute, each direction's bytes at its full bandwidth). Here the compute (50 us)
// sets it; with the link at a fifth of kGbps each transfer takes 100 us and the write sets it.
TEST(SimGolden, FloorIsTheLargestOfComputeAndEachDirectionAndBytesByKind) {
  const Trace tr = make_trace({10, 10, 10, 10, 10}, {{20000, false}}, {{0}, {}, {}, {}, {0}});
  Plan plan;
  plan.tiers = {tier("ssd", kGbps, kGbps)};
  plan.moves = {offload(0, 0, 1), prefetch(0, 3, 4)};
  test::fit_budget(tr, plan);
  const SimResult r = simulate(tr, plan);
  EXPECT_DOUBLE_EQ(r.floor_us, 50);
  EXPECT_EQ(r.floor_bound, "compute");
  EXPECT_GE(r.iteration_us, r.floor_us);
  SimOptions o;
  o.actual_tiers = {tier("ssd", kGbps, kGbps / 5)};  // writes 5x slower than reads
  const SimResult slow = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(slow.floor_us, 100);
  EXPECT_EQ(slow.floor_bound, "ssd write");
  EXPECT_GE(slow.iteration_us, slow.floor_us);
  const SimResult empty = simulate(tr, Plan{.budget_bytes = plan.budget_bytes, .tiers = plan.tiers});
  EXPECT_DOUBLE_EQ(empty.floor_us, empty.ideal_us);
  // Which bytes crossed: the one activation, each way; nothing in the empty plan.
  const auto act = static_cast<size_t>(TensorKind::activation);
  EXPECT_EQ(r.offload_bytes_by_kind[act], 20000u);
  EXPECT_EQ(r.prefetch_bytes_by_kind[act], 20000u);
  EXPECT_EQ(bytes_by_kind_text(r), "activation 19.5 KiB out / 19.5 KiB in");
  EXPECT_EQ(bytes_by_kind_json(r), R"({"activation": {"offload_bytes": 20000, "prefetch_bytes": 20000}})");
  EXPECT_EQ(bytes_by_kind_text(empty), "nothing");
  EXPECT_EQ(bytes_by_kind_json(empty), "{}");
}

// 20 kernels of 10 us. Tensors A (50 us), B (30 us), C (10 us), all used at kernel 0; A and B
// again at 19, C at 12. Prefetches of A and B start at kernel 10 (t=100), C's at kernel 11; C is
// needed at kernel 12 (t=120). Write link: A 10..60, B 60..90, C 90..100, each done before its
// deadline kernel ends. Replayed with the timeline on links of `order`.
std::pair<Trace, Plan> three_prefetches_case() {
  std::vector<double> times(20, 10.0);
  std::vector<std::vector<TensorId>> uses(20);
  uses[0] = {0, 1, 2};
  uses[12] = {2};
  uses[19] = {0, 1};
  const Trace tr = make_trace(times, {{50000, false}, {30000, false}, {10000, false}}, uses);
  Plan plan;
  plan.tiers = {tier("ssd", kGbps, kGbps)};
  plan.moves = {offload(0, 0, 8),    offload(1, 0, 8),    offload(2, 0, 9),
                prefetch(0, 10, 19), prefetch(1, 10, 19), prefetch(2, 11, 12)};
  test::fit_budget(tr, plan);
  return {tr, plan};
}
SimResult three_prefetches(SimOptions::LinkOrder order) {
  const auto [tr, plan] = three_prefetches_case();
  SimOptions o;
  o.record_timeline = true;
  o.link_order = order;
  return simulate(tr, plan, o);
}

// The prefetch of `bytes` in the timeline of `r` ran from `begin` to `end` (us).
void expect_prefetch_span(const SimResult& r, uint64_t bytes, double begin, double end) {
  const SimTransfer* x = find_transfer(r, false, bytes);
  ASSERT_TRUE(x != nullptr) << bytes;
  EXPECT_DOUBLE_EQ(x->begin_us, begin) << bytes;
  EXPECT_DOUBLE_EQ(x->end_us, end) << bytes;
}

TEST(SimGolden, UrgentPrefetchOvertakesQueuedOne) {
  // Preemptive links: A runs 100..150, B queues. C, needed at kernel 12 (t=120), preempts A (30 us
  // left) and runs 120..130; A resumes 130..160, then B 160..190, before kernel 19 (t=200).
  const SimResult r = three_prefetches(SimOptions::LinkOrder::kPreemptive);
  EXPECT_DOUBLE_EQ(r.stall_us, 10);
  EXPECT_DOUBLE_EQ(r.iteration_us, 210);
  EXPECT_EQ(r.urgent_fetches, 1u);
  const SimTransfer* a = find_transfer(r, false, 50000);
  const SimTransfer* b = find_transfer(r, false, 30000);
  const SimTransfer* c = find_transfer(r, false, 10000);
  ASSERT_TRUE(a && b && c);
  EXPECT_TRUE(c->urgent);
  EXPECT_FALSE(b->urgent);
  EXPECT_DOUBLE_EQ(c->begin_us, 120);
  EXPECT_DOUBLE_EQ(c->end_us, 130);
  EXPECT_DOUBLE_EQ(a->begin_us, 100);
  EXPECT_DOUBLE_EQ(a->end_us, 160);
  EXPECT_DOUBLE_EQ(b->begin_us, 160);
  EXPECT_DOUBLE_EQ(b->end_us, 190);
  EXPECT_LT(c->end_us, b->begin_us);  // C overtook B although B was issued first
  EXPECT_DOUBLE_EQ(r.kernel_start_us[12], 130);
}

// The same plan with links that serve the transfer due first (LinkOrder::kDeadline): nothing is
// preempted; when A ends (t=150) the link takes C (due at kernel 12) before B (due at 19, issued first): C 150..160,
// B 160..190. Kernel 12 waits from 120 to 160.
TEST(SimGolden, DueFirstIsServedFirstWithoutPreemption) {
  const SimResult r = three_prefetches(SimOptions::LinkOrder::kDeadline);
  expect_prefetch_span(r, 50000, 100, 150);
  expect_prefetch_span(r, 10000, 150, 160);
  expect_prefetch_span(r, 30000, 160, 190);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[12], 160);
  EXPECT_DOUBLE_EQ(r.stall_us, 40);
  EXPECT_DOUBLE_EQ(r.iteration_us, 240);
}

// The same plan with the host tier's lanes (LinkOrder::kIssue, the default): A 100..150, then B
// (issued first) 150..180, then C 180..190. Kernel 12 waits from 120 to 190.
TEST(SimGolden, FifoLinkServesInIssueOrder) {
  const SimResult r = three_prefetches(SimOptions::LinkOrder::kIssue);
  expect_prefetch_span(r, 50000, 100, 150);
  expect_prefetch_span(r, 30000, 150, 180);
  expect_prefetch_span(r, 10000, 180, 190);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[12], 190);
  EXPECT_DOUBLE_EQ(r.stall_us, 70);
}

const Move& prefetch_of(const Plan& p, TensorId t) {
  for (const Move& m : p.moves)
    if (m.op == MoveOp::prefetch && m.tensor == t) return m;
  throw Error("no prefetch");
}

// Note [Issue in deadline order]: issued where the due-first link begins them
// (DueFirstIsServedFirstWithoutPreemption: C 150..160, kernel 12 waits 40 us), links that serve in
// issue order would run the plan as the due-first link does, 40 us of stall against 70 as planned.
// Note [Leaving the link idle for a transfer due sooner] does better: the link waits 10 us at t=100 for C
// (issued at 110, due when kernel 11 ends at 120) instead of starting A, which would hold it to
// 150: C 110..120, then B and A, in the order the schedule begins them (B 120..150, A 150..200).
// Issued so (C, then B and A, all at kernel 11, in that order), kernel 12 does not wait and kernel
// 19 (t=190) waits 10 us for A: a stall of 10 us, against 40 issued in due-first order and 70 as
// planned. The moves one kernel issues are listed in the order they begin.
TEST(SimGolden, IssuedInDeadlineOrderLeavesTheLinkIdleForATransferDueSooner) {
  const auto [tr, plan] = three_prefetches_case();
  const Plan moved = issue_in_deadline_order(tr, plan);
  ASSERT_EQ(moved.moves.size(), plan.moves.size());
  EXPECT_EQ(prefetch_of(moved, 2).start, 11u);  // C: where planned
  EXPECT_EQ(prefetch_of(moved, 1).start, 11u);  // B: planned at 10, begins at 120
  EXPECT_EQ(prefetch_of(moved, 0).start, 11u);  // A: planned at 10, begins at 150
  std::vector<TensorId> order;
  for (const Move& m : moved.moves)
    if (m.op == MoveOp::prefetch) order.push_back(m.tensor);
  EXPECT_EQ(order, (std::vector<TensorId>{2, 1, 0}));
  const Lifetimes lt(tr);
  EXPECT_TRUE(check_plan(tr, lt, moved).valid);
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(tr, moved, o);
  EXPECT_DOUBLE_EQ(r.stall_us, 10);
  expect_prefetch_span(r, 10000, 110, 120);
  expect_prefetch_span(r, 30000, 120, 150);
  expect_prefetch_span(r, 50000, 150, 200);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[12], 120);
}

// One kernel's transfers go on the link in the plan's order of their moves, as the runtime issues
// them (not in the order of the tensors).
TEST(SimGolden, OneKernelsTransfersGoInThePlansOrder) {
  auto [tr, plan] = three_prefetches_case();
  // A's and B's prefetches, both at kernel 10: B listed first goes first (B 100..130, A 130..180).
  std::swap(plan.moves[3], plan.moves[4]);
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(tr, plan, o);
  expect_prefetch_span(r, 30000, 100, 130);
  expect_prefetch_span(r, 50000, 130, 180);
  expect_prefetch_span(r, 10000, 180, 190);
}

TEST(SimGolden, KernelWaitsForOffloadToFreeMemory) {
  // Tensors 0 (20 us) and 1 (10 us) are offloaded right after kernel 0 with deadline 0: their
  // memory is needed by kernel 1, which waits until both offloads are done at 40. Tensor 1's
  // prefetch starts at kernel 1, so it is issued only at 40 (memory first), not at 20 when kernel 0
  // ended.
  const Trace tr =
      make_trace({10, 10, 10, 10}, {{20000, false}, {10000, false}}, {{0, 1}, {}, {1}, {0}});
  Plan plan;
  plan.tiers = {tier("ssd", kGbps, kGbps)};
  plan.moves = {offload(0, 0, 0), prefetch(0, 2, 3), offload(1, 0, 0), prefetch(1, 1, 2)};
  test::fit_budget(tr, plan);
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(tr, plan, o);
  // Write link: tensor 0 10..30, tensor 1 30..40 (both needed by kernel 1 -> starts at 40).
  // Read link: tensor 1 issued at 40, 40..50 -> kernel 2 starts at 50 (wants 50: no wait).
  // Tensor 0 prefetch issued at kernel 2 (50), 50..70 -> kernel 3 waits 60..70.
  EXPECT_DOUBLE_EQ(r.kernel_start_us[1], 40);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[2], 50);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[3], 70);
  EXPECT_DOUBLE_EQ(r.stall_us, 40);
  const SimTransfer* pf1 = find_transfer(r, false, 10000);
  ASSERT_NE(pf1, nullptr);
  EXPECT_DOUBLE_EQ(pf1->begin_us, 40);  // issued after kernel 1's memory wait
}

TEST(SimGolden, WrapAroundPairReachesSteadyState) {
  // Persistent weight used only by kernel 1 of 4 (10 us each), 30 us per transfer. Offloaded after
  // kernel 1 (must be gone before kernel 3), prefetched from kernel 3 for kernel 1 of the next
  // iteration. Iteration 0 starts with the weight resident (its prefetch was issued before time 0):
  //   k1 10..20, offload 20..50, k3 waits 30..50, prefetch 50..80, k4(=k0') 60..70.
  // Iteration 1: k1' waits 70..80, offload 90..120, k3' waits 100..120, k0'' at 130.
  const Trace tr = make_trace({10, 10, 10, 10}, {{30000, true}}, {{}, {0}, {}, {}});
  Plan plan;
  plan.tiers = {tier("host", kGbps, kGbps)};
  plan.moves = {offload(0, 1, 2), prefetch(0, 3, 1)};
  test::fit_budget(tr, plan);
  EXPECT_EQ(plan.budget_bytes, 30000u);
  SimOptions o;
  o.iterations = 1;
  const SimResult r1 = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r1.iteration_us, 60);  // 0..60, only the 20 us offload wait
  EXPECT_DOUBLE_EQ(r1.last_iteration_us, 60);
  o.iterations = 2;
  const SimResult r2 = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r2.last_iteration_us, 70);  // 60..130: the steady state
  EXPECT_DOUBLE_EQ(r2.iteration_us, 65);       // mean of 60 and 70
  EXPECT_DOUBLE_EQ(r2.stall_us, 25);
  EXPECT_EQ(r2.urgent_fetches, 2u);  // both waits of iteration 1
  o.iterations = 3;
  const SimResult r3 = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r3.last_iteration_us, 70);  // steady
  EXPECT_DOUBLE_EQ(r3.iteration_us, 200.0 / 3);
  EXPECT_EQ(r2.tiers[0].prefetch_bytes, 30000u);
  EXPECT_EQ(r2.tiers[0].offload_bytes, 30000u);
}

TEST(SimGolden, OffloadWithoutPrefetchWritesAndFrees) {
  // Tensor 0 (20 us of transfer) is used at kernel 0 only and alive through kernel 4; tensor 1
  // (persistent) is used by no kernel. Tensor 0 leaves after kernel 0 and must be gone before
  // kernel 2: written 10..30, kernel 2 waits 20..30; nothing comes back. Tensor 1 is out for good:
  // in steady state its offload moves nothing.
  Trace tr = make_trace({10, 10, 10, 10, 10}, {{20000, false}, {10000, true}}, {{0}});
  tr.tensors[0].alive_until = 4;
  Plan plan;
  plan.tiers = {tier("ssd", kGbps, kGbps)};
  plan.moves = {offload(0, 0, 1), offload(1, 2, 2)};
  test::fit_budget(tr, plan);
  EXPECT_EQ(plan.budget_bytes, 20000u);  // 30000 without the moves
  SimOptions timeline;
  timeline.record_timeline = true;
  const SimResult r = simulate(tr, plan, timeline);
  // (ideal, stall, last iteration, start of kernel 2) in us, exactly.
  EXPECT_EQ(std::make_tuple(r.ideal_us, r.stall_us, r.last_iteration_us, r.kernel_start_us[2]),
            std::make_tuple(50.0, 10.0, 60.0, 30.0));
  EXPECT_EQ(r.urgent_fetches, 1u);
  EXPECT_EQ(r.peak_bytes, 20000u);
  // Written once per iteration, never read back.
  const TierTraffic& ssd = r.tiers[0];
  EXPECT_EQ(std::make_tuple(ssd.offload_bytes, ssd.prefetch_bytes, ssd.write_busy_us, ssd.read_busy_us),
            std::make_tuple(uint64_t{20000}, uint64_t{0}, 20.0, 0.0));
  ASSERT_EQ(r.transfers.size(), 1u);
  EXPECT_TRUE(r.transfers[0].offload);
  // With the offload's deadline at kernel 4 (the tensor's last kernel) nothing waits.
  plan.moves = {offload(0, 0, 4), offload(1, 2, 2)};
  EXPECT_DOUBLE_EQ(simulate(tr, plan).stall_us, 0);
}

// Note [Duplex link]: while both directions of a tier move bytes, each runs at duplex_gbps.
TierSpec duplex_tier(double one_way_gbps, double duplex_gbps) {
  TierSpec t = tier("host", one_way_gbps, one_way_gbps);
  t.duplex_gbps = duplex_gbps;
  return t;
}

// One iteration of `moves` over `tier` (the budget fitted to the plan), with its timeline.
SimResult replay_once(const Trace& tr, const TierSpec& tier, std::vector<Move> moves) {
  Plan plan;
  plan.tiers = {tier};
  plan.moves = std::move(moves);
  test::fit_budget(tr, plan);
  SimOptions o = one_iteration_with_timeline();
  return simulate(tr, plan, o);
}

TEST(SimDuplex, OneDirectionAloneRunsAtItsOwnBandwidth) {
  // The first golden case at a duplex rate of 0.25 GB/s: the offload and the prefetch never
  // overlap, so nothing changes (20 us each).
  const Trace tr = make_trace({10, 10, 10, 10, 10}, {{20000, false}}, {{0}, {}, {}, {}, {0}});
  Plan plan;
  plan.tiers = {duplex_tier(kGbps, 0.25)};
  plan.moves = {offload(0, 0, 1), prefetch(0, 3, 4)};
  test::fit_budget(tr, plan);
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 70);
  EXPECT_DOUBLE_EQ(r.tiers[0].write_busy_us, 20);
  EXPECT_DOUBLE_EQ(r.tiers[0].read_busy_us, 20);
  EXPECT_DOUBLE_EQ(find_transfer(r, false, 20000)->end_us, 60);
}

TEST(SimDuplex, FullOverlapRunsBothAtTheDuplexRate) {
  // A (20 kB) goes out after kernel 0 while B (20 kB, persistent, used at kernel 2 only) comes in
  // from kernel 1, both issued at 10 us; kernel 2 waits for both. One way 1 GB/s, both ways 0.5:
  // 20 kB at 500 B/us is 40 us, so both end at 50 (at 30 with independent directions). Then B goes
  // out after kernel 2 (60) while A comes back from kernel 3 (60): both end at 100, kernel 4 runs
  // 100-110.
  const Trace tr = make_trace({10, 10, 10, 10, 10}, {{20000, false}, {20000, true}},
                              {{0}, {}, {1}, {}, {0}});
  Plan plan;
  plan.tiers = {duplex_tier(kGbps, 0.5)};
  plan.moves = {offload(0, 0, 1), prefetch(0, 3, 4), prefetch(1, 1, 2), offload(1, 2, 3)};
  test::fit_budget(tr, plan);
  SimOptions o = one_iteration_with_timeline();
  const SimResult r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 110);
  EXPECT_DOUBLE_EQ(r.stall_us, 60);
  ASSERT_EQ(r.kernel_start_us.size(), 5u);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[2], 50);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[4], 100);
  EXPECT_DOUBLE_EQ(r.tiers[0].write_busy_us, 80);  // time in service, not bytes / one-way rate
  EXPECT_DOUBLE_EQ(r.tiers[0].read_busy_us, 80);
  ASSERT_EQ(r.transfers.size(), 4u);
  for (const SimTransfer& x : r.transfers) EXPECT_DOUBLE_EQ(x.end_us - x.begin_us, 40);
  // Urgency reorders its own direction only: at 20 us kernel 2 waits for A's offload, which becomes
  // urgent, but B's prefetch keeps moving and the two share the link, so A's offload still ends at
  // 50 (not at 30), and B's prefetch, done by then, was not urgent.
  EXPECT_EQ(r.urgent_fetches, 2u);  // A out at kernel 2, B out at kernel 4
  const SimTransfer* a_out = find_transfer(r, true, 20000);
  const SimTransfer* b_in = find_transfer(r, false, 20000);
  ASSERT_NE(a_out, nullptr);
  ASSERT_NE(b_in, nullptr);
  // Both transfers of 20 kB are in the timeline twice (A and B go each way); the first found of
  // each kind is the one issued first.
  EXPECT_TRUE(a_out->urgent);
  EXPECT_DOUBLE_EQ(a_out->end_us, 50);
  EXPECT_FALSE(b_in->urgent);
  EXPECT_DOUBLE_EQ(b_in->end_us, 50);

  // Independent directions (duplex 0, or a duplex rate at or above the one-way one): 70 us.
  for (double d : {0.0, 1.0, 3.0}) {
    SimOptions ind = o;
    ind.actual_tiers = {duplex_tier(kGbps, d)};
    EXPECT_DOUBLE_EQ(simulate(tr, plan, ind).iteration_us, 70) << "duplex " << d;
  }
}

TEST(SimDuplex, PartialOverlapIsRetimed) {
  // A (20 kB) goes out from 10 us, alone at 1000 B/us until B (5 kB) starts coming in at 20: A has
  // 10 kB left and both run at 500 B/us, so B ends at 30; A's last 5 kB run alone again and end at
  // 35. (A duration fixed when A started would say 30 or 50.)
  const Trace tr = make_trace({10, 10, 10, 10, 10, 10}, {{20000, false}, {5000, true}},
                              {{0}, {}, {}, {1}, {}, {0}});
  const SimResult r = replay_once(
      tr, duplex_tier(kGbps, 0.5),
      {offload(0, 0, 3), prefetch(0, 5, 5), prefetch(1, 2, 3), offload(1, 3, 4)});
  const SimTransfer* a_out = find_transfer(r, true, 20000);
  const SimTransfer* b_in = find_transfer(r, false, 5000);
  ASSERT_NE(a_out, nullptr);
  ASSERT_NE(b_in, nullptr);
  EXPECT_DOUBLE_EQ(a_out->begin_us, 10);
  EXPECT_DOUBLE_EQ(a_out->end_us, 35);
  EXPECT_DOUBLE_EQ(b_in->begin_us, 20);
  EXPECT_DOUBLE_EQ(b_in->end_us, 30);
  // B goes out 40-45 (alone), A comes back 50-70 (alone): kernel 5 starts at 70.
  EXPECT_DOUBLE_EQ(r.iteration_us, 80);
  EXPECT_DOUBLE_EQ(r.tiers[0].write_busy_us, 30);
  EXPECT_DOUBLE_EQ(r.tiers[0].read_busy_us, 30);
}

TEST(SimDuplex, AsymmetricTierCapsEachDirection) {
  // Read 2 GB/s, write 1 GB/s, both ways 1.5: the write keeps 1 GB/s (its own is lower), the read
  // drops to 1.5. A 20 kB offload and a 30 kB prefetch issued at 10: the prefetch ends at 30 (20 us
  // at 1500 B/us), the offload at 30 too (20 us at 1000 B/us).
  const Trace tr = make_trace({10, 10, 10, 10, 10}, {{20000, false}, {30000, true}},
                              {{0}, {}, {1}, {}, {0}});
  TierSpec t = tier("host", 2.0, 1.0);
  t.duplex_gbps = 1.5;
  const SimResult r =
      replay_once(tr, t, {offload(0, 0, 1), prefetch(0, 3, 4), prefetch(1, 1, 2), offload(1, 2, 3)});
  EXPECT_DOUBLE_EQ(find_transfer(r, true, 20000)->end_us, 30);
  EXPECT_DOUBLE_EQ(find_transfer(r, false, 30000)->end_us, 30);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[2], 30);
}

TEST(SimGolden, EmptyPlanIsIdeal) {
  const Trace tr =
      make_trace({1.5, 2.25, 0, 7.125}, {{100, true}, {200, false}}, {{0, 1}, {1}, {}, {0}});
  Plan plan;
  plan.tiers = {tier("ssd", kGbps, kGbps)};
  test::fit_budget(tr, plan);
  const SimResult r = simulate(tr, plan);
  EXPECT_EQ(r.iteration_us, r.ideal_us);
  EXPECT_DOUBLE_EQ(r.ideal_us, 10.875);
  EXPECT_EQ(r.stall_us, 0);
  EXPECT_EQ(r.overlap_us, 0);
  EXPECT_EQ(r.urgent_fetches, 0u);
  EXPECT_EQ(r.peak_bytes, 300u);
}

TEST(SimReject, InvalidPlansAndOptions) {
  const Trace tr = make_trace({10, 10, 10, 10, 10}, {{20000, false}}, {{0}, {}, {}, {}, {0}});
  Plan plan;
  plan.tiers = {tier("ssd", kGbps, kGbps)};
  plan.budget_bytes = 1 << 20;
  plan.moves = {prefetch(0, 3, 4)};  // no offload before it
  try {
    simulate(tr, plan);
    FAIL() << "expected teraio::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("moves[0]"), std::string::npos) << e.what();
  }
  plan.moves = {offload(0, 0, 1), prefetch(0, 3, 4)};
  plan.budget_bytes = 10;  // tensor 0 alone exceeds it
  EXPECT_THROW(simulate(tr, plan), Error);
  test::fit_budget(tr, plan);
  EXPECT_NO_THROW(simulate(tr, plan));
  SimOptions o;
  o.actual_tiers = {tier("ssd", 1, 1), tier("host", 1, 1)};
  EXPECT_THROW(simulate(tr, plan, o), Error);  // tier count mismatch
  o.actual_tiers = {tier("ssd", 0, 1)};
  EXPECT_THROW(simulate(tr, plan, o), Error);  // zero read bandwidth with a prefetch on it
  o.actual_tiers = {};
  o.iterations = 0;
  EXPECT_THROW(simulate(tr, plan, o), Error);
}

std::vector<TierSpec> scaled(const std::vector<TierSpec>& tiers, std::mt19937_64& rng, bool up) {
  std::vector<TierSpec> out = tiers;
  std::uniform_real_distribution<double> f(1.0, 4.0);
  for (TierSpec& t : out) {
    // Scale each direction independently, sometimes not at all.
    if (rng() % 3) t.read_gbps = up ? t.read_gbps * f(rng) : t.read_gbps;
    if (rng() % 3) t.write_gbps = up ? t.write_gbps * f(rng) : t.write_gbps;
  }
  return out;
}

// The properties every valid plan has in the simulator (docs/simulator.md, "Guarantees"); returns
// whether the plan stalled.
bool check_random_plan(const Trace& tr, const Plan& plan, const SimOptions& o, std::mt19937_64& rng, int trial) {
  const SimResult r = simulate(tr, plan, o);
  EXPECT_GE(r.iteration_us, r.ideal_us) << "trial " << trial;
  EXPECT_GE(r.stall_us, 0);
  EXPECT_NEAR(r.iteration_us, r.ideal_us + r.stall_us, 1e-9 * r.iteration_us);
  // The plan's resident accounting.
  const Lifetimes lt(tr);
  EXPECT_EQ(r.peak_bytes, check_plan(tr, lt, plan).peak_bytes);
  // Per-iteration traffic equals the plan's moves (an idle tensor's offload moves nothing), busy
  // time bytes / bandwidth.
  for (size_t i = 0; i < plan.tiers.size(); ++i) {
    uint64_t off = 0, pre = 0;
    for (const Move& m : plan.moves) {
      if (m.tier == i && lt.used(m.tensor)) (m.op == MoveOp::offload ? off : pre) += tr.tensors[m.tensor].bytes;
    }
    EXPECT_EQ(r.tiers[i].offload_bytes, off) << "trial " << trial;
    EXPECT_EQ(r.tiers[i].prefetch_bytes, pre) << "trial " << trial;
    EXPECT_NEAR(r.tiers[i].write_busy_us, off / (plan.tiers[i].write_gbps * 1e3), 1e-6);
  }
  EXPECT_LE(r.overlap_us, r.ideal_us * 2 * static_cast<double>(plan.tiers.size()) + 1e-6);
  EXPECT_GE(r.overlap_us, 0);

  // With (practically) unlimited bandwidth every move hides: iteration == ideal.
  SimOptions inf = o;
  inf.actual_tiers = plan.tiers;
  for (TierSpec& t : inf.actual_tiers) t.read_gbps = t.write_gbps = 1e12;
  EXPECT_NEAR(simulate(tr, plan, inf).stall_us, 0, 1e-3);

  // More bandwidth (any tier, any direction) never makes the same plan slower, with preemption
  // (without it a link that is free sooner can start a transfer that then delays a more urgent one).
  if (o.link_order == SimOptions::LinkOrder::kPreemptive) {
    SimOptions up = o;
    up.actual_tiers = scaled(plan.tiers, rng, true);
    const SimResult faster = simulate(tr, plan, up);
    EXPECT_LE(faster.iteration_us, r.iteration_us * (1 + 1e-12) + 1e-9)
        << "trial " << trial << ": " << faster.iteration_us << " > " << r.iteration_us;
  }
  return r.stall_us > 0;
}

TEST(SimProperty, RandomPlans) {
  std::mt19937_64 rng(12345);
  int with_stall = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const Trace tr = test::random_trace(rng, trial % 2 == 1);
    const Plan plan = test::random_plan(tr, rng);
    SimOptions o;
    o.iterations = 1 + trial % 3;
    o.link_order = static_cast<SimOptions::LinkOrder>(trial / 3 % 3);  // every link model
    with_stall += check_random_plan(tr, plan, o, rng, trial);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(with_stall, 1000);  // the generator exercises stalls and urgent transfers
}

// The same with tensors alive after their last use and persistent tensors no kernel uses, whose
// periods get offloads without a prefetch.
TEST(SimProperty, RandomPlansWithOffloadsWithoutPrefetch) {
  std::mt19937_64 rng(4242);
  int with_stall = 0, one_way = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    Trace tr = test::random_trace(rng, trial % 2 == 1);
    test::add_alive_until_and_idle(tr, rng);
    const Plan plan = test::random_plan(tr, rng);
    const Lifetimes lt(tr);
    for (const MovePair& p : check_plan(tr, lt, plan).pairs) one_way += p.one_way();
    SimOptions o;
    o.iterations = 1 + trial % 3;
    o.link_order = static_cast<SimOptions::LinkOrder>(trial / 3 % 3);  // every link model
    with_stall += check_random_plan(tr, plan, o, rng, trial);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(with_stall, 500);
  EXPECT_GT(one_way, 1000);
}

// Replays `plan` with its tiers' bandwidths scaled from 0.05x to 20x by `step` each time, on the
// preemptive link (see check_random_plan): the iteration never grows with bandwidth.
void expect_monotone_in_bandwidth(const Trace& tr, const Plan& plan, double step, int trial) {
  double prev = std::numeric_limits<double>::infinity();
  for (double s = 0.05; s < 20; s *= step) {
    SimOptions o;
    o.link_order = SimOptions::LinkOrder::kPreemptive;
    o.actual_tiers = plan.tiers;
    for (TierSpec& t : o.actual_tiers) {
      t.read_gbps *= s;
      t.write_gbps *= s;
    }
    const double it = simulate(tr, plan, o).iteration_us;
    ASSERT_LE(it, prev * (1 + 1e-12) + 1e-9) << "trial " << trial << " scale " << s;
    prev = it;
  }
}

TEST(SimProperty, BandwidthCurveOfOnePlanIsMonotone) {
  std::mt19937_64 rng(777);
  for (int trial = 0; trial < 400; ++trial) {
    const Trace tr = test::random_trace(rng, trial % 2 == 1);
    const Plan plan = test::random_plan(tr, rng);
    expect_monotone_in_bandwidth(tr, plan, 1.3, trial);
  }
}

// With a both-ways rate, a plan runs no faster than with independent directions at the one-way
// rates and no slower than with independent directions at the both-ways rate; more bandwidth (all
// three rates scaled up) is never slower; traffic is unchanged and each link's busy time is at
// least bytes / one-way rate.
TEST(SimProperty, DuplexLiesBetweenIndependentBounds) {
  std::mt19937_64 rng(9090);
  std::uniform_real_distribution<double> frac(0.3, 1.2);
  int slowed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const Trace tr = test::random_trace(rng, trial % 2 == 1);
    Plan plan = test::random_plan(tr, rng);
    SimOptions fast, slow, dup;
    fast.link_order = slow.link_order = dup.link_order = SimOptions::LinkOrder::kPreemptive;
    fast.iterations = slow.iterations = dup.iterations = 1 + trial % 3;
    fast.actual_tiers = slow.actual_tiers = dup.actual_tiers = plan.tiers;
    for (size_t i = 0; i < plan.tiers.size(); ++i) {
      TierSpec& t = dup.actual_tiers[i];
      t.duplex_gbps = frac(rng) * std::min(t.read_gbps, t.write_gbps);
      slow.actual_tiers[i].read_gbps = std::min(t.read_gbps, t.duplex_gbps);
      slow.actual_tiers[i].write_gbps = std::min(t.write_gbps, t.duplex_gbps);
    }
    const SimResult a = simulate(tr, plan, fast);
    const SimResult b = simulate(tr, plan, dup);
    const SimResult c = simulate(tr, plan, slow);
    EXPECT_LE(a.iteration_us, b.iteration_us * (1 + 1e-12) + 1e-9) << "trial " << trial;
    EXPECT_LE(b.iteration_us, c.iteration_us * (1 + 1e-12) + 1e-9) << "trial " << trial;
    EXPECT_GE(b.iteration_us, b.ideal_us);
    EXPECT_EQ(b.peak_bytes, a.peak_bytes);
    for (size_t i = 0; i < plan.tiers.size(); ++i) {
      EXPECT_EQ(b.tiers[i].offload_bytes, a.tiers[i].offload_bytes);
      EXPECT_EQ(b.tiers[i].prefetch_bytes, a.tiers[i].prefetch_bytes);
      EXPECT_GE(b.tiers[i].write_busy_us, a.tiers[i].write_busy_us * (1 - 1e-9) - 1e-9);
      EXPECT_GE(b.tiers[i].read_busy_us, a.tiers[i].read_busy_us * (1 - 1e-9) - 1e-9);
    }
    slowed += b.iteration_us > a.iteration_us * (1 + 1e-9);
    SimOptions up = dup;
    const double f = 1 + frac(rng);
    for (TierSpec& t : up.actual_tiers) {
      t.read_gbps *= f;
      t.write_gbps *= f;
      t.duplex_gbps *= f;
    }
    EXPECT_LE(simulate(tr, plan, up).iteration_us, b.iteration_us * (1 + 1e-12) + 1e-9)
        << "trial " << trial;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(slowed, 300);  // the generator makes the directions overlap often
}

// Note [Clean offloads]: six kernels of 10 us; a persistent parameter of 10 us at 1 GB/s, used at
// kernels 0 (forward) and 3 (backward), offloaded after each use with deadline == start (the next
// kernel waits for the whole write) and read back just in time (prefetch 2 -> 3, 5 -> 0 of the
// next iteration: exactly hidden). Written, every offload stalls 10 us: 80 us an iteration.
struct CleanCase {
  Trace trace;
  Plan plan;
};
CleanCase clean_case(bool recorded, std::vector<KernelIndex> written, uint32_t second_tier = 0) {
  CleanCase c;
  c.trace = make_trace({10, 10, 10, 10, 10, 10}, {{10000, true}}, {{0}, {}, {}, {0}, {}, {}});
  c.trace.tensors[0].kind = TensorKind::parameter;
  c.trace.writes_recorded = recorded;
  c.trace.tensors[0].written_at = std::move(written);
  c.plan.tiers = {tier("host", kGbps, kGbps), tier("ssd", kGbps, kGbps)};
  c.plan.moves = {offload(0, 0, 0), prefetch(0, 2, 3), offload(0, 3, 3, second_tier),
                  prefetch(0, 5, 0, second_tier)};
  test::fit_budget(c.trace, c.plan);
  return c;
}

TEST(SimClean, ReadOnlyParameterOffloadsWriteNothing) {
  CleanCase c = clean_case(/*recorded=*/true, {});
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(c.trace, c.plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 60) << "no offload takes link time";
  EXPECT_DOUBLE_EQ(r.stall_us, 0);
  EXPECT_EQ(r.urgent_fetches, 0u);
  EXPECT_EQ(r.tiers[0].offload_bytes, 0u);
  EXPECT_DOUBLE_EQ(r.tiers[0].write_busy_us, 0);
  EXPECT_EQ(r.tiers[0].prefetch_bytes, 20000u) << "both read-backs still read";
  EXPECT_EQ(r.tiers[0].clean_offloads, 2u);
  EXPECT_EQ(r.tiers[0].clean_offload_bytes, 20000u);
  EXPECT_EQ(r.clean_offloads, 2u);
  EXPECT_EQ(r.clean_offload_bytes, 20000u);
  EXPECT_EQ(r.offload_bytes_by_kind[static_cast<size_t>(TensorKind::parameter)], 0u);
  EXPECT_EQ(find_transfer(r, true, 10000), nullptr) << "a clean offload is no transfer";
  EXPECT_NE(find_transfer(r, false, 10000), nullptr);
  EXPECT_DOUBLE_EQ(r.floor_us, 60);
  // At a write bandwidth where written offloads would set the floor, clean ones do not.
  SimOptions slow_write;
  slow_write.actual_tiers = {tier("host", kGbps, kGbps / 100), tier("ssd", kGbps, kGbps)};
  const SimResult s = simulate(c.trace, c.plan, slow_write);
  EXPECT_DOUBLE_EQ(s.iteration_us, 60);
  EXPECT_EQ(s.floor_bound, "compute");
  c.trace.writes_recorded = false;
  c.trace.tensors[0].written_at.clear();
  const SimResult dirty = simulate(c.trace, c.plan, slow_write);
  EXPECT_EQ(dirty.floor_bound, "host write");
  EXPECT_DOUBLE_EQ(dirty.floor_us, 2000);  // 20000 bytes at 0.01 GB/s
}

TEST(SimClean, AWriteSinceTheReadBackWritesTheOffload) {
  // The backward (kernel 3) writes it: the offload after it writes; the one after the forward,
  // read back at kernel 0 and only read there, is still clean.
  const CleanCase c = clean_case(true, {3});
  const SimResult r = simulate(c.trace, c.plan);
  EXPECT_DOUBLE_EQ(r.iteration_us, 70);
  EXPECT_EQ(r.tiers[0].offload_bytes, 10000u);
  EXPECT_DOUBLE_EQ(r.tiers[0].write_busy_us, 10);
  EXPECT_EQ(r.clean_offloads, 1u);
  EXPECT_EQ(r.clean_offload_bytes, 10000u);
  // Written at kernel 0, the read-back's own deadline: the forward's offload writes instead.
  const SimResult r0 = simulate(clean_case(true, {0}).trace, c.plan);
  EXPECT_DOUBLE_EQ(r0.iteration_us, 70);
  EXPECT_EQ(r0.clean_offloads, 1u);
  const SimResult both = simulate(clean_case(true, {0, 3}).trace, c.plan);
  EXPECT_DOUBLE_EQ(both.iteration_us, 80);
  EXPECT_EQ(both.clean_offloads, 0u);
  EXPECT_EQ(both.tiers[0].offload_bytes, 20000u);
}

TEST(SimClean, ReadBackFromAnotherTierOrWritesNotRecordedWrite) {
  // The second pair on the ssd: each offload follows a read-back from the other tier.
  const CleanCase other = clean_case(true, {}, /*second_tier=*/1);
  const SimResult r = simulate(other.trace, other.plan);
  EXPECT_DOUBLE_EQ(r.iteration_us, 80);
  EXPECT_EQ(r.clean_offloads, 0u);
  EXPECT_EQ(r.tiers[0].offload_bytes, 10000u);
  EXPECT_EQ(r.tiers[1].offload_bytes, 10000u);
  // Writes unknown: every use may write.
  const CleanCase unknown = clean_case(false, {});
  const SimResult u = simulate(unknown.trace, unknown.plan);
  EXPECT_DOUBLE_EQ(u.iteration_us, 80);
  EXPECT_EQ(u.clean_offloads, 0u);
  EXPECT_EQ(u.clean_offload_bytes, 0u);
  EXPECT_EQ(u.tiers[0].offload_bytes, 20000u);
}

TEST(SimClean, PersistentTensorsWrapAroundTheIteration) {
  // Used at 0, 2 and 4. The first offload (after 2) follows the read-back of the last pair, one
  // iteration earlier, at kernel 0 (prefetch 5 -> 0): the window 0..2; the second follows the
  // read-back at 4.
  auto run = [](std::vector<KernelIndex> written) {
    Trace tr = make_trace({10, 10, 10, 10, 10, 10}, {{10000, true}}, {{0}, {}, {0}, {}, {0}, {}});
    tr.writes_recorded = true;
    tr.tensors[0].written_at = std::move(written);
    Plan plan;
    plan.tiers = {tier("host", kGbps, kGbps)};
    plan.moves = {offload(0, 2, 2), prefetch(0, 3, 4), offload(0, 4, 4), prefetch(0, 5, 0)};
    test::fit_budget(tr, plan);
    return simulate(tr, plan);
  };
  EXPECT_EQ(run({}).clean_offloads, 2u);
  EXPECT_DOUBLE_EQ(run({}).iteration_us, 60);
  EXPECT_EQ(run({0}).clean_offloads, 1u) << "written at 0, after the wrapped read-back";
  EXPECT_EQ(run({2}).clean_offloads, 1u);
  EXPECT_EQ(run({4}).clean_offloads, 1u);
  EXPECT_EQ(run({0, 4}).clean_offloads, 0u);
  // One pair: its own read-back, one iteration earlier, is the previous move. Used at 0, 1 and 4,
  // away over 2..3: the window 4, 5, 0, 1 wraps, and a write at 0 is in it.
  auto single = [](std::vector<KernelIndex> written) {
    Trace tr = make_trace({10, 10, 10, 10, 10, 10}, {{10000, true}}, {{0}, {0}, {}, {}, {0}, {}});
    tr.writes_recorded = true;
    tr.tensors[0].written_at = std::move(written);
    Plan plan;
    plan.tiers = {tier("host", kGbps, kGbps)};
    plan.moves = {offload(0, 1, 1), prefetch(0, 3, 4)};
    test::fit_budget(tr, plan);
    return simulate(tr, plan);
  };
  EXPECT_EQ(single({}).clean_offloads, 1u);
  EXPECT_DOUBLE_EQ(single({}).stall_us, 0);
  EXPECT_EQ(single({0}).clean_offloads, 0u);
  EXPECT_DOUBLE_EQ(single({0}).stall_us, 10);
  EXPECT_EQ(single({4}).clean_offloads, 0u);
}

TEST(SimClean, TransientTensorsFirstOffloadWritesAndARecomputeInBetweenToo) {
  // An activation made at 0 and used at 3, 6 and 9, next to a persistent input of its producer.
  Trace tr = make_trace({10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, {{10000, false}, {100, true}},
                        {{0, 1}, {}, {}, {0}, {}, {}, {0}, {}, {}, {0}});
  tr.tensors[0].producer = 0;
  tr.tensors[0].recomputable = true;
  tr.writes_recorded = true;
  Plan plan;
  plan.tiers = {tier("host", kGbps, kGbps)};
  plan.moves = {offload(0, 0, 1),  prefetch(0, 2, 3), offload(0, 3, 4),
                prefetch(0, 5, 6), offload(0, 6, 7),  prefetch(0, 8, 9)};
  test::fit_budget(tr, plan);
  SimResult r = simulate(tr, plan);
  EXPECT_EQ(r.clean_offloads, 2u) << "the first offload of the iteration writes";
  EXPECT_EQ(r.tiers[0].offload_bytes, 10000u);
  // The middle gap recomputed instead: the tensor is made anew, and the offload after it writes.
  plan.moves = {offload(0, 0, 1), prefetch(0, 2, 3), Move{0, MoveOp::recompute, 0, 3, 6},
                offload(0, 6, 7), prefetch(0, 8, 9)};
  test::fit_budget(tr, plan);
  r = simulate(tr, plan);
  EXPECT_EQ(r.recomputes, 1u);
  EXPECT_EQ(r.clean_offloads, 0u);
  EXPECT_EQ(r.tiers[0].offload_bytes, 20000u);
}

// The host lane's cases: kernel k's host time is us[k], or `us` for every kernel.
void set_host_us(Trace& tr, const std::vector<double>& us) {
  for (KernelIndex k = 0; k < tr.num_kernels(); ++k) tr.set_kernel_host_us(k, us[k]);
}
void set_host_us(Trace& tr, double us) {
  set_host_us(tr, std::vector<double>(tr.num_kernels(), us));
}
// Four kernels of 10 us and a small parameter read by the first and the last, within the budget.
struct FourKernels {
  Trace tr = make_trace({10, 10, 10, 10}, {{100, true}}, {{0}, {}, {}, {0}});
  Plan plan;
  FourKernels() {
    plan.tiers = {tier("host", kGbps, kGbps)};
    test::fit_budget(tr, plan);
  }
};
// Four kernels of 10 us; an activation made at kernel 0 and used at 3, recomputed before 3 (10 us
// on the stream), and the small parameter of FourKernels.
struct RecomputedActivation {
  Trace tr = make_trace({10, 10, 10, 10}, {{10000, false}, {100, true}}, {{0, 1}, {}, {}, {0}});
  Plan plan;
  RecomputedActivation() {
    tr.tensors[0].producer = 0;
    tr.tensors[0].recomputable = true;
    plan.tiers = {tier("host", kGbps, kGbps)};
    plan.moves = {Move{0, MoveOp::recompute, 0, 0, 3}};
    test::fit_budget(tr, plan);
  }
};

// Note [The host lane]: a host slower than the kernels sets the pace; one that keeps ahead changes
// nothing; a recompute costs its producer's host time too.
TEST(SimHost, AHostBehindTheKernelsSetsThePace) {
  auto [tr, plan] = FourKernels();
  SimOptions o = one_iteration_with_timeline();
  EXPECT_DOUBLE_EQ(simulate(tr, plan, o).iteration_us, 40);
  // Host times 10, 30, 10, 10: kernel 0 is launched at 10, kernel 1 at 40 (the stream, free at
  // 20, waits 20 us), kernels 2 and 3 at 50 and 60, as the stream frees (starts relative to
  // kernel 0's).
  set_host_us(tr, {10, 30, 10, 10});
  SimResult r = simulate(tr, plan, o);
  ASSERT_EQ(r.kernel_start_us.size(), 4u);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[1], 30);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[2], 40);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[3], 50);
  EXPECT_DOUBLE_EQ(r.host_us, 60);
  EXPECT_DOUBLE_EQ(r.host_wait_us, 30);  // 10 before kernel 0, 20 before kernel 1
  EXPECT_DOUBLE_EQ(r.stall_us, 0);
  EXPECT_DOUBLE_EQ(r.iteration_us, 70);
  // A host that keeps ahead (1 us a kernel) costs only the first launch.
  set_host_us(tr, 1);
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 41);
  EXPECT_DOUBLE_EQ(r.host_wait_us, 1);
  // The host waits for the device at each step's end, so every iteration pays its first launch:
  // kernel 0 of the second iteration starts 1 us after the first iteration's kernels end.
  o.iterations = 2;
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 41);
  EXPECT_DOUBLE_EQ(r.host_wait_us, 1);
}

// Note [The runner's host time]: the runner's own host time per kernel lengthens the host lane
// (a host that keeps ahead absorbs it; one behind pays it per kernel) and, on a trace without host
// times (the CPU runs the kernels itself), adds to every kernel in series.
TEST(SimHost, TheRunnersHostTimeIsPaidWhereTheHostBounds) {
  auto [tr, plan] = FourKernels();
  SimOptions o;
  o.iterations = 1;
  // No host times: 4 kernels of 10 us, each after 2.5 us of the runner's.
  o.runner_host_us_per_kernel = 2.5;
  SimResult r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 50);
  EXPECT_DOUBLE_EQ(r.host_wait_us, 10);
  EXPECT_DOUBLE_EQ(r.host_us, 10);
  EXPECT_DOUBLE_EQ(r.ideal_us, 40);
  // Host times of 1 us: the host keeps ahead with 2.5 more per kernel (3.5 < 10): only the first
  // launch is paid, now 3.5 us.
  set_host_us(tr, 1);
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 43.5);
  EXPECT_DOUBLE_EQ(r.host_us, 14);
  // Host times of 8 us: 10.5 us a kernel with the runner's, more than the kernels' 10: the host
  // sets the pace (launches at 10.5, 21, 31.5, 42; the last kernel ends at 52).
  set_host_us(tr, 8);
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 52);
  o.runner_host_us_per_kernel = 0;
  EXPECT_DOUBLE_EQ(simulate(tr, plan, o).iteration_us, 48);  // 8 + 4 x 10
  o.runner_host_us_per_kernel = -1;
  EXPECT_THROW(simulate(tr, plan, o), Error);
}

TEST(SimHost, ARecomputeCostsItsProducersHostTime) {
  auto [tr, plan] = RecomputedActivation();
  SimOptions o = one_iteration_with_timeline();
  SimResult r = simulate(tr, plan, o);
  EXPECT_EQ(r.recomputes, 1u);
  EXPECT_DOUBLE_EQ(r.iteration_us, 50);
  // Host times 20, 1, 1, 1: kernels start at 20, 30, 40; the host reaches kernel 3's operator at
  // 22, reruns the producer (20 us) and launches kernel 3 at 43, while the stream runs the
  // recompute's kernel 50-60: kernel 3 starts at 60, 40 after kernel 0.
  set_host_us(tr, {20, 1, 1, 1});
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[3], 40);
  EXPECT_DOUBLE_EQ(r.host_us, 43);
  EXPECT_DOUBLE_EQ(r.host_wait_us, 20);
  // Host time 40 for the producer: kernels at 40, 50, 60; the host reaches kernel 3 at 42 and
  // launches it at 83, after the rerun; the stream, free at 80, waits 3 us.
  tr.set_kernel_host_us(0, 40);
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[3], 43);
  EXPECT_DOUBLE_EQ(r.host_wait_us, 43);
  EXPECT_DOUBLE_EQ(r.iteration_us, 40 + 10 + 43);
}

// Note [The recomputes' host time]: a runner's measured host time for the recomputes replaces
// their producers' recorded host times on the host lane; without host times it changes nothing.
TEST(SimHost, MeasuredRecomputeHostTimeReplacesTheProducersOnTheHostLane) {
  auto [tr, plan] = RecomputedActivation();
  SimOptions o = one_iteration_with_timeline();
  o.recompute_host_us_per_iteration = 100;
  SimResult r = simulate(tr, plan, o);  // no host times: the CPU's recompute is stream time alone
  EXPECT_DOUBLE_EQ(r.iteration_us, 50);
  EXPECT_DOUBLE_EQ(r.recompute_host_us, 0);
  set_host_us(tr, {40, 1, 1, 1});
  o.recompute_host_us_per_iteration = 0;  // as recorded: the producer's 40 us
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.recompute_host_us, 40);
  EXPECT_DOUBLE_EQ(r.host_us, 83);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[3], 43);
  // Measured 10 us: the host reaches kernel 3 at 42 and launches it at 53; the stream, busy until
  // 80 with kernels 0-2 and the rerun, does not wait.
  o.recompute_host_us_per_iteration = 10;
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.recompute_host_us, 10);
  EXPECT_DOUBLE_EQ(r.host_us, 53);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[3], 40);
  // Measured 100 us: launched at 143, 103 after kernel 0.
  o.recompute_host_us_per_iteration = 100;
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.host_us, 143);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[3], 103);
  o.recompute_host_us_per_iteration = -1;
  EXPECT_THROW(simulate(tr, plan, o), Error);
}

// With host times, more bandwidth is still never slower, and the host never makes a step faster
// than without them (Note [The host lane]).
TEST(SimHost, RandomPlansStayMonotoneAndNoFasterThanWithoutHostTimes) {
  std::mt19937_64 rng(4242);
  std::uniform_real_distribution<double> host(0.0, 30.0);
  for (int trial = 0; trial < 200; ++trial) {
    Trace tr = test::random_trace(rng, trial % 2 == 1);
    const Plan plan = test::random_plan(tr, rng);
    SimOptions o;
    o.link_order = SimOptions::LinkOrder::kPreemptive;  // see check_random_plan
    const double without = simulate(tr, plan, o).iteration_us;
    for (KernelIndex k = 0; k < tr.num_kernels(); ++k) tr.set_kernel_host_us(k, host(rng));
    const SimResult with = simulate(tr, plan, o);
    ASSERT_GE(with.iteration_us, without * (1 - 1e-12) - 1e-9) << "trial " << trial;
    ASSERT_GE(with.iteration_us, with.host_us * (1 - 1e-12) - 1e-9) << "trial " << trial;
    expect_monotone_in_bandwidth(tr, plan, 1.5, trial);
  }
}

TEST(SimHost, HostTimesRoundTripThroughJson) {
  Trace tr = make_trace({10, 10}, {{100, true}}, {{0}, {0}});
  EXPECT_FALSE(tr.has_host_times());
  EXPECT_EQ(trace_to_json(tr).find("host_us"), std::string::npos);
  tr.set_kernel_host_us(1, 12.5);
  const Trace back = parse_trace(trace_to_json(tr), "t.json");
  ASSERT_TRUE(back.has_host_times());
  EXPECT_DOUBLE_EQ(back.kernel_host_us(0), 0);
  EXPECT_DOUBLE_EQ(back.kernel_host_us(1), 12.5);
  tr.set_kernel_host_us(0, -1);
  EXPECT_THROW(tr.validate(), Error);
}

TEST(SimHost, ReadsBackRoundTripThroughJson) {
  Trace tr = make_trace({10, 10}, {{100, true}}, {{0}, {0}});
  EXPECT_FALSE(tr.has_reads_back());
  EXPECT_EQ(trace_to_json(tr).find("reads_back"), std::string::npos);
  EXPECT_NE(trace_to_json(tr).find("\"version\": 1"), std::string::npos);
  tr.set_kernel_reads_back(1, true);
  const std::string text = trace_to_json(tr);
  EXPECT_NE(text.find("\"version\": 2"), std::string::npos) << "reads_back is a v2 field";
  const Trace back = parse_trace(text, "t.json");
  EXPECT_FALSE(back.kernel_reads_back(0));
  EXPECT_TRUE(back.kernel_reads_back(1));
  // A v1 file's reads_back is not read (v2 only, as host_us).
  std::string v1 = text;
  v1.replace(v1.find("\"version\": 2"), std::string("\"version\": 2").size(), "\"version\": 1");
  EXPECT_FALSE(parse_trace(v1, "t.json").has_reads_back());
}

// On random plans over traces that record random writes: every offload's bytes are either written
// or clean, exactly the bytes of the same plan over the trace without writes recorded.
TEST(SimProperty, CleanOffloadsSplitTheOffloadedBytes) {
  std::mt19937_64 rng(2718);
  size_t clean = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    Trace tr = test::random_trace(rng, trial % 2 == 1);
    const Plan plan = test::random_plan(tr, rng);
    const SimResult unknown = simulate(tr, plan);
    const Lifetimes lt(tr);
    tr.writes_recorded = true;
    for (TensorId t = 0; t < tr.num_tensors(); ++t)
      for (KernelIndex k : lt.uses(t))
        if (rng() % 4 == 0) tr.tensors[t].written_at.push_back(k);
    const SimResult r = simulate(tr, plan);
    EXPECT_EQ(unknown.clean_offloads, 0u);
    for (size_t i = 0; i < plan.tiers.size(); ++i) {
      EXPECT_EQ(r.tiers[i].offload_bytes + r.tiers[i].clean_offload_bytes,
                unknown.tiers[i].offload_bytes)
          << "trial " << trial;
      EXPECT_EQ(r.tiers[i].prefetch_bytes, unknown.tiers[i].prefetch_bytes);
    }
    EXPECT_GE(r.iteration_us, r.ideal_us);
    clean += r.clean_offloads;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(clean, 300u);  // the generator makes clean offloads often
}

// 250k kernels and 100k moves (50k pairs) must simulate in well under a second.
TEST(SimSpeed, QuarterMillionKernels) {
  constexpr uint32_t kKernels = 250000;
  constexpr uint32_t kTensors = 50000;
  std::vector<double> times(kKernels, 20.0);
  std::vector<test::TensorSpec> tensors(kTensors, {64ull << 20, false});
  std::vector<std::vector<TensorId>> uses(kKernels);
  for (uint32_t t = 0; t < kTensors; ++t) {
    tensors[t].persistent = t % 2 == 0;
    uses[(t * 5) % kKernels].push_back(t);
    uses[(t * 5 + 1000 + t % 3000) % kKernels].push_back(t);
  }
  const Trace tr = make_trace(times, tensors, uses);
  const Lifetimes lt(tr);
  Plan plan;
  plan.tiers = {tier("ssd", 16, 16), tier("host", 50, 50)};
  for (const InactivePeriod& p : inactive_periods(tr, lt)) {
    if (p.tensor % 2 == 0 && p.wraps) continue;  // one period per tensor
    const uint32_t len = p.wraps ? p.end + kKernels - p.start : p.end - p.start;
    plan.moves.push_back(offload(p.tensor, p.start, (p.start + 1) % kKernels, p.tensor % 2));
    plan.moves.push_back(prefetch(p.tensor, (p.start + len - 50) % kKernels, p.end, p.tensor % 2));
  }
  ASSERT_EQ(plan.moves.size(), 2u * kTensors);
  test::fit_budget(tr, plan);
  const auto t0 = std::chrono::steady_clock::now();
  const SimResult r = simulate(tr, plan);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "simulate: %u kernels, %zu moves, 2 iterations: %.3f s (iteration %.0f us, ideal %.0f us)\n",
      kKernels, plan.moves.size(), s, r.iteration_us, r.ideal_us);
  EXPECT_GT(r.tiers[0].offload_bytes, 0u);
  // Only a guard against a complexity regression (quadratic behaviour takes minutes here): the
  // speed itself is a benchmark (docs/benchmarks.md). Sanitizer builds run it 10-20x slower.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  EXPECT_LT(s, 60.0);
#else
  EXPECT_LT(s, 10.0);  // 0.2 s on a free core here
#endif
}

// Note [Writebacks]: six kernels of 10 us; a persistent parameter of 10 us at 1 GB/s read at kernel
// 0, updated at kernel 1 and read at kernel 4, offloaded after kernel 4 with deadline 4 (kernel 5
// waits for the whole write) and read back over kernel 5, in time for kernel 0. Dirty, the offload
// stalls 10 us: 70 us an iteration. A writeback after the update, over kernel 2, makes it clean.
struct WritebackCase {
  Trace trace;
  Plan plan;
};
WritebackCase writeback_case(bool with_writeback) {
  WritebackCase c;
  c.trace = make_trace({10, 10, 10, 10, 10, 10}, {{10000, true}}, {{0}, {0}, {}, {}, {0}, {}});
  c.trace.tensors[0].kind = TensorKind::parameter;
  c.trace.writes_recorded = true;
  c.trace.tensors[0].written_at = {1};
  c.plan.tiers = {tier("host", kGbps, kGbps)};
  c.plan.moves = {offload(0, 4, 4), prefetch(0, 5, 0)};
  if (with_writeback) c.plan.moves.push_back(Move{0, MoveOp::writeback, 0, 1, 4});
  test::fit_budget(c.trace, c.plan);
  return c;
}

TEST(SimWriteback, AWritebackAfterTheLastWriteMakesTheOffloadClean) {
  const WritebackCase dirty = writeback_case(false);
  const SimResult d = simulate(dirty.trace, dirty.plan);
  EXPECT_DOUBLE_EQ(d.iteration_us, 70);
  EXPECT_EQ(d.tiers[0].offload_bytes, 10000u);
  EXPECT_EQ(d.writebacks, 0u);

  const WritebackCase c = writeback_case(true);
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(c.trace, c.plan, o);
  EXPECT_DOUBLE_EQ(r.iteration_us, 60) << "the write happened over kernel 2";
  EXPECT_DOUBLE_EQ(r.stall_us, 0);
  EXPECT_EQ(r.writebacks, 1u);
  EXPECT_EQ(r.writeback_bytes, 10000u);
  EXPECT_EQ(r.tiers[0].writebacks, 1u);
  EXPECT_EQ(r.tiers[0].writeback_bytes, 10000u);
  EXPECT_EQ(r.tiers[0].offload_bytes, 0u) << "a writeback is not an offload";
  EXPECT_EQ(r.clean_offloads, 1u);
  EXPECT_EQ(r.clean_offload_bytes, 10000u);
  EXPECT_DOUBLE_EQ(r.tiers[0].write_busy_us, 10) << "it takes the write link";
  EXPECT_EQ(r.tiers[0].prefetch_bytes, 10000u);
  EXPECT_EQ(r.peak_bytes, d.peak_bytes) << "the tensor stays resident";
  const SimTransfer* w = find_transfer(r, true, 10000);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->move, 2u);
  EXPECT_DOUBLE_EQ(w->begin_us, 20);
  EXPECT_DOUBLE_EQ(w->end_us, 30);
  // The floor counts its bytes: at 0.01 GB/s the write link bounds it.
  SimOptions slow;
  slow.actual_tiers = {tier("host", kGbps, kGbps / 100)};
  const SimResult s = simulate(c.trace, c.plan, slow);
  EXPECT_EQ(s.floor_bound, "host write");
  EXPECT_DOUBLE_EQ(s.floor_us, 1000);
  // There kernel 5 (after the offload's deadline, also the writeback's) waits for the copy:
  // issued at 20 us, done at 1020 us, kernel 5 starts then instead of at 50.
  EXPECT_DOUBLE_EQ(s.stall_us, 970);
}

TEST(SimWriteback, AWritebackWaitsBehindOffloadsIssuedByThen) {
  // Background work (Note [Writebacks]): tensor 1 (20000 B, read at kernel 0 only) leaves after
  // kernel 0 and holds the write link over 10..30 us; the writeback is issued at 20 us, tensor 2's
  // tail offload (5000 B, after kernel 2) at 30 us. The link then takes the offload first.
  WritebackCase c;
  c.trace = make_trace({10, 10, 10, 10, 10, 10}, {{10000, true}, {20000, false}, {5000, false}},
                       {{0, 1}, {0}, {2}, {}, {0}, {}});
  c.trace.tensors[0].kind = TensorKind::parameter;
  c.trace.tensors[1].alive_until = 5;
  c.trace.tensors[2].alive_until = 5;
  c.trace.writes_recorded = true;
  c.trace.tensors[0].written_at = {1};
  c.plan.tiers = {tier("host", kGbps, kGbps)};
  c.plan.moves = {offload(0, 4, 4), prefetch(0, 5, 0), offload(1, 0, 5), offload(2, 2, 5),
                  Move{0, MoveOp::writeback, 0, 1, 4}};
  test::fit_budget(c.trace, c.plan);
  SimOptions o;
  o.record_timeline = true;
  const SimResult r = simulate(c.trace, c.plan, o);
  const SimTransfer* off = find_transfer(r, true, 5000);
  const SimTransfer* w = find_transfer(r, true, 10000);
  ASSERT_NE(off, nullptr);
  ASSERT_NE(w, nullptr);
  EXPECT_DOUBLE_EQ(off->begin_us, 30);
  EXPECT_DOUBLE_EQ(w->begin_us, 35);
  EXPECT_DOUBLE_EQ(r.iteration_us, 60);
}

// Note [Reads back behind the writes]: seven kernels of 10 us; a parameter of 20 us of transfer read
// at kernels 0 and 6; kernel 1 reads a value back to the host.
struct ReadBackAfterAWrite {
  Trace tr = make_trace({10, 10, 10, 10, 10, 10, 10}, {{20000, true}}, {{0}, {}, {}, {}, {}, {}, {0}});
  Plan plan;
  ReadBackAfterAWrite() {
    tr.set_kernel_reads_back(1, true);
    plan.tiers = {tier("host", kGbps, kGbps)};
    plan.moves = {offload(0, 0, 4), prefetch(0, 5, 6)};
    test::fit_budget(tr, plan);
  }
};

// The write issued at the end of kernel 0 (10..30) holds kernel 1 until 30; the read back (issued
// as kernel 5 begins, at 70) then holds kernel 6 until 90: 100 us, against 80 when kernel 1 does
// not read back. A write issued after it (end of kernel 1, 20..40, done as kernel 4 begins) is not
// in its way.
TEST(SimGolden, AReadBackWaitsForTheWritesIssuedBeforeIt) {
  auto [tr, plan] = ReadBackAfterAWrite();
  SimOptions o = one_iteration_with_timeline();
  SimResult r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[1], 30);
  EXPECT_DOUBLE_EQ(r.stall_us, 30);
  EXPECT_DOUBLE_EQ(r.iteration_us, 100);
  tr.set_kernel_reads_back(1, false);
  EXPECT_DOUBLE_EQ(simulate(tr, plan, o).iteration_us, 80);
  tr.set_kernel_reads_back(1, true);
  plan.moves = {offload(0, 1, 4), prefetch(0, 5, 6)};
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[1], 10);
  EXPECT_DOUBLE_EQ(r.iteration_us, 80);
}

// The host waits for the value: with host times of 1 us, kernel 2 is launched 1 us after kernel 1
// (the read back) ends, not while it runs.
TEST(SimHost, TheHostWaitsForAReadBack) {
  auto [tr, plan] = ReadBackAfterAWrite();
  set_host_us(tr, 1);
  SimOptions o = one_iteration_with_timeline();
  SimResult r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[2] - r.kernel_start_us[1], 11);
  tr.set_kernel_reads_back(1, false);
  r = simulate(tr, plan, o);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[2] - r.kernel_start_us[1], 10);
}

// Note [Writes after reads back]: the Session's issue order moves the offload past the read back
// (issued at the end of kernel 1, still done before kernel 4), and the step no longer waits there.
TEST(SimGolden, IssueOrderMovesAWritePastAReadBack) {
  const auto [tr, plan] = ReadBackAfterAWrite();
  const Plan moved = issue_in_deadline_order(tr, plan);
  ASSERT_EQ(moved.moves.size(), 2u);
  const Move& off = moved.moves[0].op == MoveOp::offload ? moved.moves[0] : moved.moves[1];
  EXPECT_EQ(off.start, 1u);
  EXPECT_EQ(off.deadline, 4u);
  const Lifetimes lt(tr);
  EXPECT_TRUE(check_plan(tr, lt, moved).valid);
  EXPECT_LT(simulate(tr, moved).iteration_us, simulate(tr, plan).iteration_us);
}

// The same for a writeback: a parameter updated by kernel 0 is written back at its end (10..30),
// which holds the read back at kernel 1 until 30. Moved past it (issued at the end of kernel 1,
// 20..40), it still comes before its clean offload after kernel 3, and the step no longer waits.
// It never moves past that offload: with the offload right after kernel 1 it stays where it was.
TEST(SimGolden, IssueOrderMovesAWritebackPastAReadBack) {
  Trace tr = make_trace({10, 10, 10, 10, 10, 10, 10}, {{20000, true}}, {{0}, {}, {}, {}, {}, {}, {0}});
  tr.tensors[0].kind = TensorKind::parameter;
  tr.writes_recorded = true;
  tr.tensors[0].written_at = {0};
  tr.set_kernel_reads_back(1, true);
  Plan plan;
  plan.tiers = {tier("host", kGbps, kGbps)};
  plan.moves = {Move{0, MoveOp::writeback, 0, 0, 3}, offload(0, 3, 4), prefetch(0, 5, 6)};
  test::fit_budget(tr, plan);
  const Lifetimes lt(tr);
  ASSERT_TRUE(check_plan(tr, lt, plan).valid) << ::testing::PrintToString(check_plan(tr, lt, plan).errors);
  SimOptions o = one_iteration_with_timeline();
  EXPECT_DOUBLE_EQ(simulate(tr, plan, o).kernel_start_us[1], 30) << "the writeback holds the read back";
  const Plan moved = issue_in_deadline_order(tr, plan);
  const auto wb = std::find_if(moved.moves.begin(), moved.moves.end(),
                               [](const Move& m) { return m.op == MoveOp::writeback; });
  ASSERT_NE(wb, moved.moves.end());
  EXPECT_EQ(wb->start, 1u);
  EXPECT_TRUE(check_plan(tr, lt, moved).valid);
  const SimResult r = simulate(tr, moved, o);
  EXPECT_DOUBLE_EQ(r.kernel_start_us[1], 10);
  EXPECT_EQ(r.clean_offloads, 1u) << "the offload still relies on it";
  EXPECT_LT(r.iteration_us, simulate(tr, plan, o).iteration_us);

  plan.moves = {Move{0, MoveOp::writeback, 0, 0, 1}, offload(0, 1, 4), prefetch(0, 5, 6)};
  test::fit_budget(tr, plan);
  ASSERT_TRUE(check_plan(tr, lt, plan).valid);
  for (const Move& m : issue_in_deadline_order(tr, plan).moves) {
    if (m.op == MoveOp::writeback) {
      EXPECT_EQ(m.start, 0u) << "not past its deadline or its offload";
    }
  }
}

}  // namespace
}  // namespace teraio
