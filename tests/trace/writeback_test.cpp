// Writeback moves (docs/formats.md, "Writebacks"): the plan format (v2 only, round trip, malformed
// moves rejected by the reader) and check_plan's rules (writes recorded, resident, no write before
// the offload it makes clean, same tier, deadline, one per offload, tier capacity from its start).
#include <gtest/gtest.h>

#include "check_util.h"

#include <string>
#include <vector>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan.h"
#include "teraio/plan_check.h"
#include "teraio/trace.h"

namespace teraio {
namespace {

// Six kernels. P (persistent, 100 B) is read at 0, written at 1 (an update), read at 4. Q
// (persistent, 100 B) is used at 1 and 4. A (activation, 50 B) made at 2, read at 3.
Trace make_trace(bool recorded = true) {
  Trace t;
  t.add_tensor({100, TensorKind::parameter, true, "P"});
  t.add_tensor({100, TensorKind::parameter, true, "Q"});
  t.add_tensor({50, TensorKind::activation, false, "A"});
  t.add_kernel("k0", 1, std::vector<TensorId>{0});
  t.add_kernel("k1", 1, std::vector<TensorId>{0, 1});
  t.add_kernel("k2", 1, std::vector<TensorId>{2});
  t.add_kernel("k3", 1, std::vector<TensorId>{2});
  t.add_kernel("k4", 1, std::vector<TensorId>{0, 1});
  t.add_kernel("k5", 1, std::vector<TensorId>{});
  t.writes_recorded = recorded;
  if (recorded) t.tensors[0].written_at = {1};
  return t;
}

Move mv(TensorId t, MoveOp op, KernelIndex s, KernelIndex d, uint32_t tier = 0) { return Move{t, op, tier, s, d}; }

// P offloaded after kernel 4, back before kernel 0; a writeback after its update at kernel 1.
Plan make_plan(std::vector<Move> extra = {}, uint64_t host_capacity = 1000) {
  Plan p;
  p.budget_bytes = 1000;
  p.tiers = {{"host", host_capacity, 10, 10}, {"ssd", 1000, 1, 1}};
  p.moves = {mv(0, MoveOp::offload, 4, 4), mv(0, MoveOp::prefetch, 5, 0)};
  p.moves.insert(p.moves.end(), extra.begin(), extra.end());
  return p;
}

using test::all_errors;
using test::check;

// The first error of a plan that must be invalid, or "valid".
std::string first_error(const Trace& t, const Plan& p) {
  const PlanCheck c = check(t, p);
  return c.valid ? "valid" : c.errors.at(0);
}

TEST(WritebackFormat, RoundTripNeedsVersion2) {
  const Plan p = make_plan({mv(0, MoveOp::writeback, 1, 4)});
  const std::string json = plan_to_json(p);
  EXPECT_NE(json.find("\"version\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("{\"tensor\": 0, \"op\": \"writeback\", \"tier\": \"host\", \"start\": 1, \"deadline\": 4}"),
            std::string::npos)
      << json;
  const Plan back = parse_plan(json, "p.json");
  ASSERT_EQ(back.moves.size(), 3u);
  EXPECT_EQ(back.moves[2].op, MoveOp::writeback);
  EXPECT_EQ(back.moves[2].tier, 0u);
  EXPECT_EQ(back.moves[2].start, 1u);
  EXPECT_EQ(back.moves[2].deadline, 4u);
  EXPECT_EQ(plan_to_json(back), json);
  EXPECT_EQ(to_string(MoveOp::writeback), "writeback");
  EXPECT_NE(plan_to_json(make_plan()).find("\"version\": 1"), std::string::npos);
}

TEST(WritebackFormat, MalformedWritebacksAreRejectedByTheReader) {
  const std::string json = plan_to_json(make_plan({mv(0, MoveOp::writeback, 1, 4)}));
  auto message = [&](const std::string& from, const std::string& to) {
    return test::reader_error(json, from, to, [](const std::string& text) { parse_plan(text, "p.json"); });
  };
  EXPECT_NE(message("\"version\": 2", "\"version\": 1").find("p.json: moves[2].op: \"writeback\" needs teraio.plan version 2"),
            std::string::npos);
  EXPECT_NE(message("\"op\": \"writeback\", \"tier\": \"host\"", "\"op\": \"writeback\"")
                .find("moves[2].tier: required field is missing"),
            std::string::npos)
      << message("\"op\": \"writeback\", \"tier\": \"host\"", "\"op\": \"writeback\"");
  EXPECT_NE(message("\"op\": \"writeback\", \"tier\": \"host\"", "\"op\": \"writeback\", \"tier\": \"nvme\"")
                .find("moves[2].tier: unknown tier \"nvme\""),
            std::string::npos);
}

TEST(WritebackCheck, AValidWritebackMakesItsOffloadsTierHoldTheTensorFromItsStart) {
  const Trace t = make_trace();
  const PlanCheck c = check(t, make_plan({mv(0, MoveOp::writeback, 1, 4)}));
  ASSERT_TRUE(c.valid) << all_errors(c);
  ASSERT_EQ(c.writebacks.size(), 1u);
  const WritebackMove& w = c.writebacks[0];
  EXPECT_EQ(w.move_index, 2u);
  EXPECT_EQ(c.pairs[w.pair_index].offload_index, 0u);
  EXPECT_EQ(w.to_offload, 3u);
  EXPECT_EQ(w.done, 3u);
  EXPECT_EQ(w.bytes, 100u);
  // The offload it precedes is clean; without it, that offload writes.
  EXPECT_EQ(clean_offloads(t, c)[w.pair_index], 1);
  const PlanCheck plain = check(t, make_plan());
  EXPECT_EQ(clean_offloads(t, plain)[0], 0);
  // Resident bytes are unchanged: it stays on the device.
  EXPECT_EQ(c.resident_bytes, plain.resident_bytes);
  // Deadline up to the offload's own; start as late as the offload's.
  EXPECT_EQ(first_error(t, make_plan({mv(0, MoveOp::writeback, 4, 4)})), "valid");
  EXPECT_EQ(first_error(t, make_plan({mv(0, MoveOp::writeback, 2, 3)})), "valid");
}

TEST(WritebackCheck, TierCapacityCountsFromTheWritebacksStart) {
  const Trace t = make_trace();
  // Q held by the host over kernels 2..3 (offloaded after 1, back before 4); P over 5 alone, and
  // with the writeback over 2..5.
  const std::vector<Move> q = {mv(1, MoveOp::offload, 1, 1), mv(1, MoveOp::prefetch, 3, 4)};
  std::vector<Move> with = q;
  with.push_back(mv(0, MoveOp::writeback, 1, 4));
  EXPECT_TRUE(check(t, make_plan(q, 150)).valid);
  const PlanCheck c = check(t, make_plan(with, 150));
  EXPECT_FALSE(c.valid);
  EXPECT_NE(all_errors(c).find("tier \"host\" holds up to 200 bytes at once, more than its capacity of 150"),
            std::string::npos)
      << all_errors(c);
  EXPECT_EQ(check(t, make_plan(with, 200)).tier_peak_bytes[0], 200u);
}

TEST(WritebackCheck, MalformedWritebacksAreRejectedWithTheirReason) {
  const Trace t = make_trace();
  auto err = [&](std::vector<Move> extra) { return first_error(t, make_plan(std::move(extra))); };
  EXPECT_NE(first_error(make_trace(false), make_plan({mv(0, MoveOp::writeback, 1, 4)}))
                .find("moves[2] (writeback of tensor 0 start 1 deadline 4): the trace does not record writes"),
            std::string::npos);
  // Kernel 1 writes P after a writeback that starts after kernel 0.
  EXPECT_NE(err({mv(0, MoveOp::writeback, 0, 4)}).find("a kernel from 1 through 4 writes tensor 0"), std::string::npos)
      << err({mv(0, MoveOp::writeback, 0, 4)});
  // After kernel 5 P is away (offloaded after 4, back before 0).
  EXPECT_NE(err({mv(0, MoveOp::writeback, 5, 4)}).find("is not resident from kernel 5 through the offload"),
            std::string::npos)
      << err({mv(0, MoveOp::writeback, 5, 4)});
  EXPECT_NE(err({mv(0, MoveOp::writeback, 1, 4, 1)}).find("writes tier \"ssd\" but the offload it precedes"),
            std::string::npos);
  EXPECT_NE(err({mv(0, MoveOp::writeback, 1, 5)}).find("must be complete by the end of the offload's deadline (kernel 4)"),
            std::string::npos)
      << err({mv(0, MoveOp::writeback, 1, 5)});
  EXPECT_NE(err({mv(0, MoveOp::writeback, 1, 4), mv(0, MoveOp::writeback, 2, 4)}).find("already has a writeback"),
            std::string::npos);
  // Q has no offload to make clean.
  EXPECT_NE(err({mv(1, MoveOp::writeback, 1, 4)}).find("no offload of tensor 1 follows it"), std::string::npos);
  // A transient tensor: within its life, no wrap, before its offload.
  Plan a = make_plan({mv(2, MoveOp::offload, 3, 3), mv(2, MoveOp::writeback, 2, 3)});
  Trace ta = make_trace();
  ta.tensors[2].alive_until = 5;
  EXPECT_EQ(first_error(ta, a), "valid");
  a.moves.back() = mv(2, MoveOp::writeback, 1, 3);
  EXPECT_NE(first_error(ta, a).find("is not persistent"), std::string::npos) << first_error(ta, a);
  // A discard writes nothing: nothing to write early.
  a.moves.back() = mv(2, MoveOp::writeback, 2, 3);
  a.discard_dead = true;
  EXPECT_NE(first_error(ta, a).find("is a discard"), std::string::npos) << first_error(ta, a);
  // An index out of range, as for any move.
  EXPECT_NE(err({mv(0, MoveOp::writeback, 1, 9)}).find("kernel index out of range"), std::string::npos);
}

}  // namespace
}  // namespace teraio
