// A tensor made by an operator nested in its producer and recomputed by that operator alone
// (docs/formats.md, "Recompute": recompute_inputs, recompute_us): autocast's bf16 copy of a weight,
// made inside aten::linear, whose fp32 input is dead by the backward. The trace fields round-trip
// and are validated; check_plan reads only the named inputs at the recompute point; the planner
// recomputes the copy where it could not rerun the whole operator; the simulator charges the
// nested operator's time, not the producer's.
#include <gtest/gtest.h>

#include <string>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/simulator.h"
#include "teraio/trace.h"

namespace teraio {
namespace {

constexpr uint64_t kGB = 1'000'000'000;

// W (fp32 weight, 2 GB, persistent). Kernel 0 makes X (1 GB, the normalised input, used only by
// the linear). Kernel 1 is aten::linear over X and W, making WC (W's bf16 copy, 1 GB, kept for
// the backward) inside it and returning Y. Kernels 2..9 use C (2 GB). The backward reads WC and Y
// at kernel 10, W at 11. `nested`: the trace says a cast of W alone (1 ms) makes WC again.
Trace linear_trace(bool nested) {
  Trace t;
  const TensorId w = t.add_tensor({2 * kGB, TensorKind::parameter, true, "W"});
  TensorInfo x{kGB, TensorKind::temporary, false, "X"};
  x.producer = 0;
  x.recomputable = true;
  const TensorId xi = t.add_tensor(x);
  TensorInfo wc{kGB, TensorKind::activation, false, "WC"};
  wc.producer = 1;
  if (nested) {
    wc.recomputable = true;
    wc.recompute_inputs = std::vector<TensorId>{w};
    wc.recompute_us = 1'000;
  }
  const TensorId wci = t.add_tensor(wc);
  TensorInfo y{kGB / 10, TensorKind::activation, false, "Y"};
  y.producer = 1;
  const TensorId yi = t.add_tensor(y);
  const TensorId c = t.add_tensor({2 * kGB, TensorKind::temporary, false, "C"});
  t.add_kernel("aten::rms_norm", 1'000, std::vector<TensorId>{xi});
  t.add_kernel("aten::linear", 50'000, std::vector<TensorId>{xi, w, wci, yi});
  for (int k = 2; k < 10; ++k) t.add_kernel("mid", 100'000, std::vector<TensorId>{c});
  t.add_kernel("linear_backward", 50'000, std::vector<TensorId>{wci, yi});
  t.add_kernel("weight_update", 50'000, std::vector<TensorId>{w});
  t.validate();
  return t;
}

constexpr TensorId kW = 0, kX = 1, kWC = 2;

Plan plan_of(std::vector<Move> moves) {
  Plan p;
  p.budget_bytes = 6 * kGB;
  p.tiers = {{"host", 100 * kGB, 1, 1}};
  p.moves = std::move(moves);
  return p;
}

std::string error_of(const Trace& t) {
  try {
    t.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(NestedRecompute, TheFieldsRoundTripAndAV1TraceHasNone) {
  const Trace t = linear_trace(true);
  const std::string json = trace_to_json(t);
  EXPECT_NE(json.find("\"recompute_inputs\": [0], \"recompute_us\": 1000"), std::string::npos) << json;
  const Trace back = parse_trace(json, "t.json");
  ASSERT_TRUE(back.tensors[kWC].recompute_inputs.has_value());
  EXPECT_EQ(*back.tensors[kWC].recompute_inputs, std::vector<TensorId>{kW});
  EXPECT_EQ(back.tensors[kWC].recompute_us, 1'000);
  EXPECT_FALSE(back.tensors[kX].recompute_inputs.has_value());
  EXPECT_EQ(trace_to_json(back), json);
  // What a recompute reads and costs: the nested operator's, else the producer's.
  const Lifetimes life(back);
  EXPECT_EQ(recompute_reads(back, life, kWC), std::vector<TensorId>{kW});
  EXPECT_DOUBLE_EQ(recompute_time_us(back, kWC), 1'000);
  EXPECT_DOUBLE_EQ(recompute_time_us(back, kX), 1'000);  // rms_norm's own time
  // A v1 reader never saw these fields: they are ignored there, like producers.
  std::string v1 = json;
  v1.replace(v1.find("\"version\": 2"), 12, "\"version\": 1");
  const Trace old = parse_trace(v1, "t.json");
  EXPECT_FALSE(old.tensors[kWC].recompute_inputs.has_value());
  EXPECT_FALSE(old.tensors[kWC].recompute_us.has_value());
  EXPECT_FALSE(has_recomputable(old));
}

TEST(NestedRecompute, BadFieldsAreRejectedNamingThem) {
  Trace t = linear_trace(true);
  t.tensors[kWC].recomputable = false;
  EXPECT_NE(error_of(t).find("tensors[2].recompute_inputs: the tensor is not recomputable"), std::string::npos)
      << error_of(t);
  t = linear_trace(true);
  t.tensors[kWC].recompute_inputs = std::vector<TensorId>{3};  // Y: made by the producer itself
  EXPECT_NE(error_of(t).find("tensors[2].recompute_inputs[0]: tensor 3 (Y) is not an input of the producer (kernel 1, aten::linear)"),
            std::string::npos)
      << error_of(t);
  t.tensors[kWC].recompute_inputs = std::vector<TensorId>{4};  // C: not listed by the producer
  EXPECT_NE(error_of(t).find("tensor 4 (C) is not an input of the producer"), std::string::npos) << error_of(t);
  t.tensors[kWC].recompute_inputs = std::vector<TensorId>{kW, kW};
  EXPECT_NE(error_of(t).find("recompute_inputs[1]: tensor 0 is listed twice"), std::string::npos) << error_of(t);
  t.tensors[kWC].recompute_inputs = std::vector<TensorId>{9};
  EXPECT_NE(error_of(t).find("recompute_inputs[0]: tensor 9 is out of range"), std::string::npos) << error_of(t);
  t = linear_trace(true);
  t.tensors[kWC].recompute_us = 60'000;  // more than the whole linear
  EXPECT_NE(error_of(t).find("tensors[2].recompute_us: must be a finite number from 0 to the producer's time "
                             "(50000 us, kernel 1), got 60000"),
            std::string::npos)
      << error_of(t);
  // From JSON too, with the file's name.
  std::string json = trace_to_json(linear_trace(true));
  json.replace(json.find("\"recompute_inputs\": [0]"), 23, "\"recompute_inputs\": [3]");
  try {
    parse_trace(json, "t.json");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: tensors[2].recompute_inputs[0]"), std::string::npos) << e.what();
  }
}

TEST(NestedRecompute, CheckPlanReadsOnlyTheNestedInputs) {
  const Move rc{kWC, MoveOp::recompute, 0, 1, 10};
  // Rerunning the whole linear reads X, dead after kernel 1: the recompute keeps it alive to its
  // point (Note [Deep recompute chains]), so X counts as resident through the middle: 5.1 GB with
  // W, C and Y, within 6 GB but not within 5.
  const Trace whole = linear_trace(false);
  Trace marked = whole;
  marked.tensors[kWC].recomputable = true;  // recomputable, but by the whole producer
  PlanCheck c = check_plan(marked, Lifetimes(marked), plan_of({rc}));
  EXPECT_TRUE(c.valid) << (c.errors.empty() ? "" : c.errors.front());
  EXPECT_EQ(c.resident_bytes[5], 5 * kGB + kGB / 10);
  Plan tight = plan_of({rc});
  tight.budget_bytes = 5 * kGB;
  c = check_plan(marked, Lifetimes(marked), tight);
  EXPECT_FALSE(c.valid);
  ASSERT_FALSE(c.errors.empty());
  EXPECT_NE(c.errors.front().find("exceed the budget"), std::string::npos) << c.errors.front();
  // The cast alone reads W, which is there.
  const Trace t = linear_trace(true);
  c = check_plan(t, Lifetimes(t), plan_of({rc}));
  EXPECT_TRUE(c.valid) << (c.errors.empty() ? "" : c.errors.front());
  ASSERT_EQ(c.recomputes.size(), 1u);
  EXPECT_DOUBLE_EQ(c.recomputes[0].time_us, 1'000);
  // W away at the point: invalid, naming it.
  c = check_plan(t, Lifetimes(t),
                 plan_of({rc, {kW, MoveOp::offload, 0, 1, 9}, {kW, MoveOp::prefetch, 0, 10, 11}}));
  EXPECT_FALSE(c.valid);
}

TEST(NestedRecompute, ThePlannerRecomputesTheCopyAndTheSimulatorChargesTheCast) {
  PlannerOptions o;
  o.budget_bytes = 4 * kGB + kGB / 10;  // W, C and Y: WC must leave the middle
  o.tiers = {{"host", 100 * kGB, 1, 1}};
  o.min_tensor_bytes = 0;
  const Trace t = linear_trace(true);
  PlannerStats st;
  const Plan p = make_plan(t, o, &st);
  const PlanCheck c = check_plan(t, Lifetimes(t), p);
  ASSERT_TRUE(c.valid) << (c.errors.empty() ? "" : c.errors.front());
  size_t recomputes = 0, moves_of_wc = 0;
  for (const Move& m : p.moves) {
    recomputes += m.op == MoveOp::recompute && m.tensor == kWC;
    moves_of_wc += m.op != MoveOp::recompute && m.tensor == kWC;
  }
  EXPECT_EQ(recomputes, 1u);
  EXPECT_EQ(moves_of_wc, 0u);
  EXPECT_DOUBLE_EQ(st.recompute_us, 1'000);
  const SimResult r = simulate(t, p);
  EXPECT_DOUBLE_EQ(r.recompute_us, 1'000);
  EXPECT_NEAR(r.iteration_us, r.ideal_us + 1'000, 1e-6);  // nothing crosses the link
  // Without the nested fields the copy must cross the link (1 GB each way at 1 GB/s).
  const Trace plain = linear_trace(false);
  const Plan q = make_plan(plain, o);
  const SimResult rq = simulate(plain, q);
  EXPECT_EQ(rq.recomputes, 0u);
  EXPECT_GT(rq.iteration_us, r.iteration_us);
}

}  // namespace
}  // namespace teraio
