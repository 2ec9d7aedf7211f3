// The schedule compiler (src/offload/schedule.h, Note [Compiling a schedule]) on a hand-made
// recording: moves by operator with logical ids, the dropped prefetch of a tensor made anew, where
// persistent tensors start an iteration, deaths, created bytes and signatures.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <span>

#include "schedule.h"
#include "teraio/error.h"

namespace teraio::offload {
namespace {

bool has(const std::vector<LogicalId>& v, LogicalId id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}
bool has_move(const std::vector<Move>& v, LogicalId id, MoveOp op) {
  return std::any_of(v.begin(), v.end(),
                     [&](const Move& m) { return m.tensor == id && m.op == op; });
}

// Five operators. Trace tensors (logical id in brackets):
//   0 P [10] persistent parameter, used at 0 and 3
//   1 G [11] persistent gradient made anew this iteration, first used at 2
//   2 A [12] transient (500 bytes) used at 1 and 3, alive through 3
//   3 U [13] persistent, used by no operator
//   4 T [14] transient (300 bytes) used at 2, alive through 2
//   5 Q [15] persistent, used at 4 only
Recording make_recording() {
  Recording r;
  Trace& t = r.trace;
  auto add = [&](uint64_t bytes, bool persistent, LogicalId id, bool made, int64_t alive) {
    TensorInfo info;
    info.bytes = bytes;
    info.persistent = persistent;
    t.add_tensor(info);
    r.tensors.push_back({id, made, alive});
  };
  add(1000, true, 10, false, 4);
  add(1000, true, 11, true, 4);
  add(500, false, 12, true, 3);
  add(1000, true, 13, false, 4);
  add(300, false, 14, true, 2);
  add(1000, true, 15, false, 4);
  const TensorId k0[] = {0}, k1[] = {2}, k2[] = {1, 4}, k3[] = {0, 2}, k4[] = {5};
  t.add_kernel("a", 10, k0);
  t.add_kernel("b", 10, k1);
  t.add_kernel("c", 10, k2);
  t.add_kernel("d", 10, k3);
  t.add_kernel("e", 10, k4);
  return r;
}

Plan make_plan_for_recording() {
  Plan p;
  p.tiers = {{"host", 1 << 20, 10, 10}};
  p.moves = {
      {0, MoveOp::offload, 0, 0, 1},   // P out after its use at 0
      {0, MoveOp::prefetch, 0, 1, 2},  // P back for its use at 3
      {1, MoveOp::prefetch, 0, 0, 2},  // G back for its first use: dropped (made anew)
      {3, MoveOp::offload, 0, 0, 0},   // U out: it starts the iteration out
      {2, MoveOp::offload, 0, 1, 2},   // A out between its uses
      {2, MoveOp::prefetch, 0, 2, 3},
      {5, MoveOp::prefetch, 0, 2, 3},  // Q's first move is a prefetch: it starts out
      {5, MoveOp::offload, 0, 4, 4},
  };
  return p;
}

TEST(CompileSchedule, MovesByOperatorWithLogicalIds) {
  const Recording r = make_recording();
  const uint64_t sigs[] = {1, 2, 3, 4, 5};
  const runtime::Schedule s = compile_schedule(r, make_plan_for_recording(), sigs);
  ASSERT_EQ(s.operators.size(), 5u);
  EXPECT_EQ(s.moves, 7u) << "the prefetch of the gradient made anew is dropped";
  EXPECT_TRUE(has_move(s.operators[0].offload_at, 10, MoveOp::offload));
  EXPECT_TRUE(has(s.operators[1].offload_due, 10));
  EXPECT_TRUE(has_move(s.operators[1].prefetch_at, 10, MoveOp::prefetch));
  EXPECT_TRUE(has_move(s.operators[1].offload_at, 12, MoveOp::offload));
  EXPECT_TRUE(has(s.operators[2].offload_due, 12));
  EXPECT_TRUE(has_move(s.operators[2].prefetch_at, 12, MoveOp::prefetch));
  for (const auto& op : s.operators) EXPECT_FALSE(has_move(op.prefetch_at, 11, MoveOp::prefetch));
  for (size_t k = 0; k < 5; ++k) EXPECT_EQ(s.operators[k].signature, sigs[k]);
}

TEST(CompileSchedule, StepStartPlacement) {
  const Recording r = make_recording();
  const uint64_t sigs[] = {1, 2, 3, 4, 5};
  const runtime::Schedule s = compile_schedule(r, make_plan_for_recording(), sigs);
  // P's first move is an offload and it is used: resident at the start. U: moved out, never used:
  // out. Q: first move a prefetch: out. G: made anew, neither.
  EXPECT_EQ(s.start_in, std::vector<LogicalId>{10});
  ASSERT_EQ(s.start_out.size(), 2u);
  EXPECT_EQ(s.start_out[0].tensor, 13u);
  EXPECT_EQ(s.start_out[1].tensor, 15u);
  EXPECT_EQ(s.start_out[1].tier, 0u);
}

// Plans list one kernel's moves in the order they begin, so a writeback (it runs after its
// operator) may come before the read that brings the tensor for that operator. The read still
// decides: the tensor starts the iteration out, whatever the order of the list. (Taken as starting
// in, every step began by reading the tensor back, over the plan's budget.)
TEST(CompileSchedule, AReadAtTheKernelOfAWritebackStartsTheTensorOut) {
  const Recording r = make_recording();
  const uint64_t sigs[] = {1, 2, 3, 4, 5};
  for (const bool writeback_first : {true, false}) {
    Plan p = make_plan_for_recording();
    std::erase_if(p.moves, [](const Move& m) { return m.tensor == 5; });
    const Move read{5, MoveOp::prefetch, 0, 4, 4}, copy{5, MoveOp::writeback, 0, 4, 4},
        out{5, MoveOp::offload, 0, 4, 4};
    if (writeback_first) {
      p.moves.insert(p.moves.end(), {copy, read, out});
    } else {
      p.moves.insert(p.moves.end(), {read, copy, out});
    }
    const runtime::Schedule s = compile_schedule(r, p, sigs);
    EXPECT_FALSE(has(s.start_in, 15)) << "writeback listed first: " << writeback_first;
    EXPECT_TRUE(std::any_of(s.start_out.begin(), s.start_out.end(),
                            [](const Move& m) { return m.tensor == 15; }))
        << "writeback listed first: " << writeback_first;
  }
}

TEST(CompileSchedule, DeathsAndCreatedBytes) {
  const Recording r = make_recording();
  const uint64_t sigs[] = {1, 2, 3, 4, 5};
  const runtime::Schedule s = compile_schedule(r, make_plan_for_recording(), sigs);
  EXPECT_EQ(s.operators[1].created_bytes, 500u);
  EXPECT_EQ(s.operators[2].created_bytes, 300u + 1000u) << "T, and G made anew at its first use";
  EXPECT_EQ(s.operators[0].created_bytes, 0u) << "P is not created: it persists";
  EXPECT_EQ(s.operators[4].created_bytes, 0u) << "Q is not created: it persists";
  EXPECT_EQ(s.operators[3].deaths, std::vector<LogicalId>{14}) << "T alive through 2";
  EXPECT_EQ(s.operators[4].deaths, std::vector<LogicalId>{12}) << "A alive through 3";
  EXPECT_TRUE(s.operators[0].deaths.empty());
}

// Note [Dead tensors]: with plan.discard_dead, an offload of a transient tensor at or after its last
// use becomes a discard; one between two uses, and every offload of a persistent tensor, stay moves.
TEST(CompileSchedule, TailsOfTransientTensorsAreDiscardedWhenThePlanSaysSo) {
  Recording r = make_recording();
  r.trace.tensors[4].alive_until = 3;  // T: last used at 2, alive through 3
  r.tensors[4].last_alive_op = 3;
  Plan p = make_plan_for_recording();
  p.moves.push_back({4, MoveOp::offload, 0, 2, 3});
  const uint64_t sigs[] = {1, 2, 3, 4, 5};
  const runtime::Schedule written = compile_schedule(r, p, sigs);
  EXPECT_TRUE(has_move(written.operators[2].offload_at, 14, MoveOp::offload));
  for (const auto& op : written.operators) EXPECT_TRUE(op.discard_after.empty());
  p.discard_dead = true;
  const runtime::Schedule s = compile_schedule(r, p, sigs);
  EXPECT_EQ(s.operators[2].discard_after, std::vector<LogicalId>{14});
  EXPECT_FALSE(has_move(s.operators[2].offload_at, 14, MoveOp::offload));
  EXPECT_FALSE(has(s.operators[3].offload_due, 14));
  EXPECT_TRUE(has_move(s.operators[1].offload_at, 12, MoveOp::offload)) << "A is used again at 3";
  EXPECT_TRUE(has_move(s.operators[0].offload_at, 10, MoveOp::offload)) << "P is persistent";
  EXPECT_TRUE(has_move(s.operators[4].offload_at, 15, MoveOp::offload)) << "Q is persistent";
  EXPECT_EQ(s.moves, written.moves);
}

// A recompute reads its producer's inputs at its deadline, which may be past an input's last use
// (a kept or revived input: planner.cpp, Note [Inputs kept for a recompute]): an offload of that
// input before the read is a move, not a discard, or the recompute finds its bytes gone.
TEST(CompileSchedule, AnOffloadBeforeARecomputesReadIsNoTail) {
  Recording r;
  Trace& t = r.trace;
  auto add = [&](uint64_t bytes, LogicalId id, int64_t alive, std::optional<KernelIndex> producer) {
    TensorInfo info;
    info.bytes = bytes;
    info.producer = producer;
    info.recomputable = producer.has_value();
    t.add_tensor(info);
    r.tensors.push_back({id, true, alive});
  };
  add(100, 20, 1, std::nullopt);  // S: made at 0, last used at 1 (R's producer)
  add(1000, 21, 3, 1);            // R = f(S) at 1, used again at 3
  const TensorId k0[] = {0}, k1[] = {0, 1}, k3[] = {1};
  t.add_kernel("s", 10, k0);
  t.add_kernel("f", 10, k1);
  t.add_kernel("mid", 10, std::span<const TensorId>{});
  t.add_kernel("use", 10, k3);
  Plan p;
  p.discard_dead = true;
  p.tiers = {{"host", 1 << 20, 10, 10}};
  p.moves = {
      {1, MoveOp::recompute, 0, 1, 3},  // R freed after 1, made again before 3 from S
      {0, MoveOp::offload, 0, 1, 2},    // S out after its last use...
      {0, MoveOp::prefetch, 0, 2, 3},   // ...and back for the recompute's read
  };
  const uint64_t sigs[] = {1, 2, 3, 4};
  const runtime::Schedule s = compile_schedule(r, p, sigs);
  for (const auto& op : s.operators) EXPECT_FALSE(has(op.discard_after, 20));
  EXPECT_TRUE(has_move(s.operators[1].offload_at, 20, MoveOp::offload));
}

TEST(CompileSchedule, EmptyPlanStillHasDeathsAndSignatures) {
  const Recording r = make_recording();
  const uint64_t sigs[] = {1, 2, 3, 4, 5};
  const runtime::Schedule s = compile_schedule(r, Plan{}, sigs);
  EXPECT_EQ(s.moves, 0u);
  EXPECT_EQ(s.operators[4].deaths, std::vector<LogicalId>{12});
  EXPECT_EQ(s.start_in.size(), 3u) << "P, U and Q stay resident without moves";
}

TEST(CompileSchedule, MovePastTheIterationThrows) {
  const Recording r = make_recording();
  const uint64_t sigs[] = {1, 2, 3};  // the iteration ran three operators
  EXPECT_THROW(compile_schedule(r, make_plan_for_recording(), sigs), Error);
  Plan p;
  p.moves = {{0, MoveOp::offload, 0, 0, 1}};
  const runtime::Schedule s = compile_schedule(r, p, sigs);
  EXPECT_EQ(s.operators.size(), 3u);
  for (const auto& op : s.operators) EXPECT_FALSE(has(op.deaths, 12)) << "death at 4 is past it";
}

TEST(CompileSchedule, EngineRunsTheSchedulesMovesAndStartPlacement) {
  runtime::Schedule s = runtime::Schedule::from_plan(make_plan_for_recording(), 5);
  EXPECT_EQ(s.moves, 8u) << "from_plan keeps every move";
  storage::HostTierOptions h;
  h.capacity_bytes = 1 << 20;
  h.pin = false;
  auto host = storage::make_host_tier(h);
  runtime::Engine e(runtime::EngineOptions{0}, {{"host", host.get(), 1 << 20}});
  EXPECT_FALSE(e.has_plan());
  e.set_schedule(std::make_shared<const runtime::Schedule>(std::move(s)));
  EXPECT_TRUE(e.has_plan());
  EXPECT_EQ(e.align(), 0u) << "nothing bound: nothing moves";
  runtime::Schedule bad;
  bad.operators.resize(1);
  bad.add_move({0, MoveOp::offload, 3, 0, 0});
  EXPECT_THROW(e.set_schedule(std::make_shared<const runtime::Schedule>(std::move(bad))), Error)
      << "tier 3 does not exist";
  EXPECT_TRUE(e.has_plan()) << "the installed schedule is kept";
  e.set_schedule(nullptr);
  EXPECT_FALSE(e.has_plan());
}

// A tensor whose memory can die (host bytes, never moved in this test).
class DyingMemory : public runtime::Memory {
 public:
  DyingMemory(uint64_t n, const bool* alive) : data_(n), alive_(alive) {}
  uint64_t bytes() const override { return data_.size(); }
  storage::BufferView detach() override { return storage::BufferView::host(data_.data(), 0); }
  void attach() override {}
  void drop() override {}
  storage::BufferView allocate() override { return storage::BufferView::host(data_.data(), 0); }
  bool alive() const override { return *alive_; }

 private:
  std::vector<std::byte> data_;
  const bool* alive_;
};

TEST(CompileSchedule, EngineForgetsTheProfilesDeathsBeforeTheirOperator) {
  const Recording r = make_recording();
  const uint64_t sigs[] = {1, 2, 3, 4, 5};
  auto s = std::make_shared<const runtime::Schedule>(compile_schedule(r, Plan{}, sigs));
  storage::HostTierOptions h;
  h.capacity_bytes = 1 << 20;
  h.pin = false;
  auto host = storage::make_host_tier(h);
  runtime::Engine e(runtime::EngineOptions{0}, {{"host", host.get(), 1 << 20}});
  bool a_alive = true, t_alive = true;
  e.bind(12, std::make_unique<DyingMemory>(500, &a_alive));
  e.bind(14, std::make_unique<DyingMemory>(300, &t_alive));
  e.set_schedule(s);
  EXPECT_EQ(e.stats().resident_bytes, 800u);
  t_alive = false;
  a_alive = false;  // both died; only T is due (before operator 3), A before 4
  e.before_operator(3);
  EXPECT_EQ(e.location(14), runtime::Location::kUnbound);
  EXPECT_EQ(e.location(12), runtime::Location::kResident) << "not its operator yet";
  EXPECT_EQ(e.stats().resident_bytes, 500u);
  e.before_operator(4);
  EXPECT_EQ(e.location(12), runtime::Location::kUnbound);
  EXPECT_EQ(e.stats().resident_bytes, 0u);
}

}  // namespace
}  // namespace teraio::offload
