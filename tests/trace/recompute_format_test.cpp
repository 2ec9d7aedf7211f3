// Recompute in the formats (docs/formats.md, "Recompute"): trace v2 producers and the recomputable
// flag (v1 still read, its tensors never recomputable), the plan's recompute move, and when
// check_plan accepts one: the tensor recomputable, freed within one unused gap, its producer's
// inputs resident at the recompute point (chains one level deep), malformed moves named clearly.
#include <gtest/gtest.h>

#include "check_util.h"

#include <string>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan.h"
#include "teraio/plan_check.h"
#include "teraio/trace.h"

namespace teraio {
namespace {

// 8 kernels, 100 B tensors. W persistent. X = mm(W) at 0 (not recomputable), Y = relu(X) at 1,
// Z = mul(Y) at 2 (both recomputable). Backward: Z at 5, Y and X at 6.
Trace chain_trace() {
  Trace t;
  t.add_tensor({100, TensorKind::parameter, true, "W"});
  TensorInfo x{100, TensorKind::activation, false, "X"};
  x.producer = 0;
  t.add_tensor(x);
  TensorInfo y{100, TensorKind::activation, false, "Y"};
  y.producer = 1;
  y.recomputable = true;
  t.add_tensor(y);
  TensorInfo z{100, TensorKind::activation, false, "Z"};
  z.producer = 2;
  z.recomputable = true;
  t.add_tensor(z);
  const std::vector<std::vector<TensorId>> kernels = {{0, 1}, {1, 2}, {2, 3}, {0}, {0}, {3}, {2, 1}, {0}};
  const double times[] = {10, 3, 4, 10, 10, 10, 10, 10};
  const char* names[] = {"aten::mm", "aten::relu", "aten::mul", "k3", "k4", "bwd_z", "bwd_y", "k7"};
  for (size_t k = 0; k < kernels.size(); ++k) t.add_kernel(names[k], times[k], kernels[k]);
  t.validate();
  return t;
}

Plan plan_of(std::vector<Move> moves, uint64_t budget = 1000) {
  Plan p;
  p.budget_bytes = budget;
  p.tiers = {{"host", 1000, 10, 10}};
  p.moves = std::move(moves);
  return p;
}

Move recompute(TensorId t, KernelIndex start, KernelIndex deadline) {
  return Move{t, MoveOp::recompute, 0, start, deadline};
}

using test::check;

std::string errors(const PlanCheck& c) {
  std::string s;
  for (const auto& e : c.errors) s += e + "\n";
  return s;
}

TEST(RecomputeFormat, TraceV2RoundTripKeepsProducersAndTheFlag) {
  const Trace t = chain_trace();
  const std::string json = trace_to_json(t);
  EXPECT_NE(json.find("\"version\": 2"), std::string::npos);
  EXPECT_NE(json.find("\"producer\": 1, \"recomputable\": true"), std::string::npos);
  const Trace back = parse_trace(json, "t.json");
  ASSERT_EQ(back.num_tensors(), t.num_tensors());
  for (size_t i = 0; i < t.num_tensors(); ++i) {
    EXPECT_EQ(back.tensors[i].producer, t.tensors[i].producer) << i;
    EXPECT_EQ(back.tensors[i].recomputable, t.tensors[i].recomputable) << i;
  }
  EXPECT_EQ(trace_to_json(back), json);
  EXPECT_TRUE(has_recomputable(back));
}

TEST(RecomputeFormat, ATraceWithoutProducersIsStillWrittenAsV1) {
  Trace t = chain_trace();
  for (TensorInfo& info : t.tensors) {
    info.producer.reset();
    info.recomputable = false;
  }
  EXPECT_NE(trace_to_json(t).find("\"version\": 1"), std::string::npos);
}

TEST(RecomputeFormat, V1TracesAreReadAndNothingInThemIsRecomputable) {
  // A v1 file with the v2 fields: a v1 reader ignored unknown fields, so this one does too.
  std::string json = trace_to_json(chain_trace());
  json.replace(json.find("\"version\": 2"), 12, "\"version\": 1");
  const Trace t = parse_trace(json, "t.json");
  EXPECT_FALSE(has_recomputable(t));
  for (const TensorInfo& info : t.tensors) EXPECT_FALSE(info.producer.has_value());
}

TEST(RecomputeFormat, BadProducersAreRejectedNamingTheField) {
  const std::string good = trace_to_json(chain_trace());
  auto message = [&](const std::string& from, const std::string& to) {
    return test::reader_error(good, from, to, [](const std::string& text) { parse_trace(text, "t.json"); });
  };
  EXPECT_NE(message("\"producer\": 2,", "\"producer\": 1,").find("t.json: tensors[3].producer: kernel 1 is not the "
                                                                  "tensor's first use (kernel 2)"),
            std::string::npos);
  EXPECT_NE(message("\"producer\": 2,", "\"producer\": 99,").find("tensors[3].producer: kernel 99 is out of range"),
            std::string::npos);
  EXPECT_NE(message("\"producer\": 2,", "\"producer\": \"x\",").find("tensors[3].producer: expected"),
            std::string::npos);
  EXPECT_NE(message("\"recomputable\": true}", "\"recomputable\": 1}").find("recomputable: expected true or false"),
            std::string::npos);
  // In memory: a recomputable tensor needs its producer; a persistent tensor has none.
  Trace t = chain_trace();
  t.tensors[2].producer.reset();
  EXPECT_THROW(t.validate(), Error);
  t = chain_trace();
  t.tensors[0].producer = 0;
  try {
    t.validate();
    ADD_FAILURE() << "a persistent tensor with a producer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensors[0].producer: the tensor is persistent"), std::string::npos);
  }
}

TEST(RecomputeFormat, PlanV2RoundTripWritesNoTierForARecompute) {
  const Plan p = plan_of({{1, MoveOp::offload, 0, 1, 2}, recompute(3, 2, 5), {1, MoveOp::prefetch, 0, 4, 6}});
  const std::string json = plan_to_json(p);
  EXPECT_NE(json.find("\"version\": 2"), std::string::npos);
  EXPECT_NE(json.find("{\"tensor\": 3, \"op\": \"recompute\", \"start\": 2, \"deadline\": 5}"), std::string::npos)
      << json;
  const Plan back = parse_plan(json, "p.json");
  ASSERT_EQ(back.moves.size(), 3u);
  EXPECT_EQ(back.moves[1].op, MoveOp::recompute);
  EXPECT_EQ(back.moves[1].start, 2u);
  EXPECT_EQ(back.moves[1].deadline, 5u);
  EXPECT_EQ(plan_to_json(back), json);
  // Without a recompute the plan stays v1.
  EXPECT_NE(plan_to_json(plan_of({})).find("\"version\": 1"), std::string::npos);
}

TEST(RecomputeFormat, MalformedRecomputeMovesAreRejectedByTheReader) {
  const std::string json = plan_to_json(plan_of({recompute(3, 2, 5)}));
  auto message = [&](const std::string& from, const std::string& to) {
    return test::reader_error(json, from, to, [](const std::string& text) { parse_plan(text, "p.json"); });
  };
  EXPECT_NE(message("\"version\": 2", "\"version\": 1")
                .find("p.json: moves[0].op: \"recompute\" needs teraio.plan version 2"),
            std::string::npos);
  EXPECT_NE(message("\"op\": \"recompute\"", "\"op\": \"recompute\", \"tier\": \"host\"")
                .find("moves[0].tier: a recompute move names no tier"),
            std::string::npos);
  EXPECT_NE(message("\"op\": \"recompute\"", "\"op\": \"redo\"").find("expected \"offload\", \"prefetch\", \"recompute\" or \"writeback\""),
            std::string::npos);
}

TEST(RecomputeCheck, ARecomputeFreesTheTensorUntilItsPoint) {
  const Trace t = chain_trace();
  const PlanCheck c = check(t, plan_of({recompute(3, 2, 5)}));
  ASSERT_TRUE(c.valid) << errors(c);
  ASSERT_EQ(c.recomputes.size(), 1u);
  EXPECT_EQ(c.recomputes[0].producer, 2u);
  EXPECT_EQ(c.recomputes[0].time_us, 4);
  const PlanCheck none = check(t, plan_of({}));
  for (KernelIndex k = 0; k < 8; ++k) {
    const uint64_t freed = (k == 3 || k == 4) ? 100 : 0;
    EXPECT_EQ(c.resident_bytes[k] + freed, none.resident_bytes[k]) << k;
  }
}

TEST(RecomputeCheck, OnlyARecomputableTensorCanBeRecomputed) {
  const Trace t = chain_trace();
  EXPECT_NE(errors(check(t, plan_of({recompute(1, 1, 6)}))).find("tensor 1 is not recomputable"),
            std::string::npos);
  EXPECT_NE(errors(check(t, plan_of({recompute(0, 1, 3)}))).find("tensor 0 is not recomputable"),
            std::string::npos);
}

TEST(RecomputeCheck, TheWindowMustLieInOneUnusedGap) {
  const Trace t = chain_trace();
  EXPECT_NE(errors(check(t, plan_of({recompute(2, 1, 6)}))).find("used by kernel 2 while it is freed"),
            std::string::npos);
  EXPECT_NE(errors(check(t, plan_of({recompute(3, 2, 3)}))).find("start < deadline - 1"), std::string::npos);
  EXPECT_NE(errors(check(t, plan_of({recompute(3, 5, 2)}))).find("start < deadline - 1"), std::string::npos);
  EXPECT_NE(errors(check(t, plan_of({recompute(3, 5, 7)}))).find("no kernel uses tensor 3 after kernel 5"),
            std::string::npos);
  EXPECT_NE(errors(check(t, plan_of({recompute(3, 2, 5), recompute(3, 3, 5)}))).find("two recomputes"),
            std::string::npos);
  EXPECT_NE(errors(check(t, plan_of({recompute(3, 2, 5), {3, MoveOp::offload, 0, 2, 3}, {3, MoveOp::prefetch, 0, 4, 5}})))
                .find("overlaps"),
            std::string::npos);
}

TEST(RecomputeCheck, InputsMustBeResidentAtThePoint) {
  const Trace t = chain_trace();
  // Y freed by its own recompute until 6 while Z's recompute reads it at 5.
  EXPECT_NE(errors(check(t, plan_of({recompute(2, 2, 6), recompute(3, 2, 5)})))
                .find("input tensor 2 of the producer (kernel 2) is freed at kernel 5"),
            std::string::npos);
  // Y offloaded over 3..5 and brought back only for 6: the read at 5 is a use while it is away.
  EXPECT_NE(errors(check(t, plan_of({{2, MoveOp::offload, 0, 2, 2}, {2, MoveOp::prefetch, 0, 5, 6}, recompute(3, 2, 5)})))
                .find("tensor 2 is used by kernel 5 while it is away"),
            std::string::npos);
  // Its prefetch still arriving at 5 is not enough either.
  EXPECT_FALSE(check(t, plan_of({{2, MoveOp::offload, 0, 2, 2}, {2, MoveOp::prefetch, 0, 4, 6}, recompute(3, 2, 5)})).valid);
}

TEST(RecomputeCheck, AnInputPrefetchedByThePointIsResident) {
  const Trace t = chain_trace();
  // X offloaded after its use at 1, prefetched by 5 (a recompute of Y reads it there: a use).
  const PlanCheck c =
      check(t, plan_of({{1, MoveOp::offload, 0, 1, 2}, {1, MoveOp::prefetch, 0, 4, 5}, recompute(2, 2, 5)}));
  EXPECT_TRUE(c.valid) << errors(c);
  // Without the recompute, a prefetch due at 5 is not due at a use of X.
  EXPECT_NE(errors(check(t, plan_of({{1, MoveOp::offload, 0, 1, 2}, {1, MoveOp::prefetch, 0, 4, 5}})))
                .find("the prefetch deadline must be a kernel that uses tensor 1"),
            std::string::npos);
}

TEST(RecomputeCheck, AChainRecomputesTheInputAtTheSamePointFirst) {
  const Trace t = chain_trace();
  // Y made again before 5 from X (resident), then Z from Y: producers 1 then 2, in any move order.
  const PlanCheck c = check(t, plan_of({recompute(3, 2, 5), recompute(2, 2, 5)}));
  ASSERT_TRUE(c.valid) << errors(c);
  ASSERT_EQ(c.recomputes.size(), 2u);
  EXPECT_EQ(c.recomputes[0].tensor, 2u);  // run order: producer 1 before producer 2
  EXPECT_EQ(c.recomputes[1].tensor, 3u);
  // Y's producer reads X, which must then be resident at 5: not if X is away until 6.
  EXPECT_NE(errors(check(t, plan_of({recompute(3, 2, 5), recompute(2, 2, 5), {1, MoveOp::offload, 0, 1, 1},
                                     {1, MoveOp::prefetch, 0, 5, 6}})))
                .find("tensor 1 is used by kernel 5 while it is away"),
            std::string::npos);
}

}  // namespace
}  // namespace teraio
