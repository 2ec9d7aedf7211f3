// Trace v1 and plan v1 formats: round trips, and every malformed input a user can produce gets a
// message that names the field and position.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan.h"
#include "teraio/trace.h"

namespace teraio {
namespace {

const char* kTrace = R"({
  "format": "teraio.trace", "version": 1,
  "meta": {"model": "unit", "layers": 2, "nested": {"a": [1, 2]}},
  "tensors": [
    {"id": 0, "bytes": 67108864, "kind": "parameter", "persistent": true, "name": "w \"q\""},
    {"id": 1, "bytes": 1024, "kind": "activation", "persistent": false, "name": "act"},
    {"id": 2, "bytes": 0, "kind": "temporary", "persistent": false, "extra": 5}
  ],
  "kernels": [
    {"name": "aten::mm", "time_us": 812.5, "tensors": [0, 1]},
    {"name": "aten::relu", "time_us": 3, "tensors": [1, 2, 1]},
    {"name": "aten::mm", "time_us": 0.125, "tensors": []}
  ]
})";

// Parses `text` and returns the error message (empty if it parsed).
std::string parse_error(const std::string& text) {
  try {
    parse_trace(text, "t.json");
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// Validates a trace built in memory and returns the error message (empty if it is valid).
std::string validate_error(const Trace& trace) {
  try {
    trace.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

std::string with(std::string text, const std::string& from, const std::string& to) {
  const size_t pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return text.replace(pos, from.size(), to);
}

TEST(TraceFormat, ReadsEveryField) {
  const Trace t = parse_trace(kTrace);
  ASSERT_EQ(t.num_tensors(), 3u);
  ASSERT_EQ(t.num_kernels(), 3u);
  EXPECT_EQ(t.tensors[0].bytes, 67108864u);
  EXPECT_EQ(t.tensors[0].kind, TensorKind::parameter);
  EXPECT_TRUE(t.tensors[0].persistent);
  EXPECT_EQ(t.tensors[0].name, "w \"q\"");
  EXPECT_EQ(t.tensors[2].name, "");
  EXPECT_EQ(t.kernel_name(0), "aten::mm");
  EXPECT_EQ(t.kernel_name(2), "aten::mm");
  EXPECT_DOUBLE_EQ(t.kernel_time_us(0), 812.5);
  EXPECT_DOUBLE_EQ(t.kernel_time_us(1), 3.0);
  ASSERT_EQ(t.kernel_tensors(1).size(), 2u) << "duplicate ids within a kernel collapse";
  EXPECT_EQ(t.kernel_tensors(2).size(), 0u);
  EXPECT_EQ(t.meta_value("model"), "\"unit\"");
  EXPECT_EQ(t.meta_value("layers"), "2");
  EXPECT_EQ(t.meta_value("nested"), R"({"a":[1,2]})");
}

TEST(TraceFormat, RoundTripsThroughAFile) {
  const Trace a = parse_trace(kTrace);
  const auto path = std::filesystem::temp_directory_path() / "teraio_roundtrip.trace.json";
  write_trace(a, path.string());
  const Trace b = read_trace(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(trace_to_json(a), trace_to_json(b));
  ASSERT_EQ(b.num_kernels(), a.num_kernels());
  for (KernelIndex k = 0; k < a.num_kernels(); ++k) {
    EXPECT_EQ(a.kernel_time_us(k), b.kernel_time_us(k));  // bit-exact doubles
    EXPECT_EQ(a.kernel_name(k), b.kernel_name(k));
  }
  EXPECT_EQ(b.meta, a.meta);
}

TEST(TraceFormat, TimesRoundTripExactly) {
  Trace t;
  t.add_tensor({8, TensorKind::other, false, "x"});
  // Large ones too, within the bound on the total (kMaxTraceTimeUs).
  const double times[] = {0.1, 1.0 / 3.0, 1e-9, 123456789.123, 9e14, 4.5e13 + 0.25, 0};
  for (double v : times) t.add_kernel("k", v, std::vector<TensorId>{0});
  const Trace b = parse_trace(trace_to_json(t));
  for (KernelIndex k = 0; k < t.num_kernels(); ++k) EXPECT_EQ(b.kernel_time_us(k), t.kernel_time_us(k));
}

TEST(TraceFormat, RejectsMalformedInputNamingTheField) {
  struct Case {
    std::string text;
    std::string expected;
  };
  const std::string t = kTrace;
  const Case cases[] = {
      {with(t, "\"version\": 1", "\"version\": 3"), "version: unsupported version 3 (this teraio reads teraio.trace versions 1 to 2)"},
      {with(t, "\"teraio.trace\"", "\"teraio.plan\""), "format: expected \"teraio.trace\""},
      {with(t, "\"format\": \"teraio.trace\", ", ""), "format: required field is missing"},
      {with(t, "\"bytes\": 1024", "\"bytes\": -1024"), "tensors[1].bytes: must be >= 0"},
      {with(t, "\"bytes\": 1024", "\"bytes\": \"1024\""), "tensors[1].bytes: expected an integer"},
      {with(t, "\"bytes\": 1024", "\"bytes\": 10.5"), "tensors[1].bytes: must be a whole number"},
      {with(t, "\"id\": 1,", "\"id\": 7,"), "tensors[1].id: must equal its position 1"},
      {with(t, "\"kind\": \"activation\"", "\"kind\": \"weights\""), "tensors[1].kind: unknown kind"},
      {with(t, "\"persistent\": false, \"name\": \"act\"", "\"persistent\": 0, \"name\": \"act\""),
       "tensors[1].persistent: expected true or false"},
      {with(t, "\"time_us\": 3,", "\"time_us\": -3,"), "kernels[1].time_us: must be >= 0"},
      {with(t, "\"time_us\": 3,", "\"time_us\": null,"), "kernels[1].time_us: expected a number"},
      {with(t, "[1, 2, 1]", "[1, 9, 1]"), "kernels[1].tensors[1]: tensor id 9 is out of range"},
      {with(t, "[1, 2, 1]", "[1, -2, 1]"), "kernels[1].tensors[1]: must be >= 0"},
      {with(t, "[1, 2, 1]", "{}"), "kernels[1].tensors: expected an array"},
      {with(t, "\"name\": \"aten::relu\", ", ""), "kernels[1].name: required field is missing"},
      {t.substr(0, t.size() / 2), "t.json: not valid JSON"},
      {"", "t.json: not valid JSON"},
      {"[1,2]", "expected a JSON object at the top level"},
      {with(t, "\"tensors\": [\n", "\"tensorz\": [\n"), "tensors: required field is missing"},
      // The bounds (docs/formats.md, "Bounds"): no sum of bytes or times can overflow.
      {with(t, "\"bytes\": 1024", "\"bytes\": 9007199254740992"),
       "tensors[1].bytes: the tensors' bytes add up to more than 2^53 (8 PiB)"},
      {with(t, "\"bytes\": 1024", "\"bytes\": 18446744073709551615"), "tensors[1].bytes: the tensors' bytes"},
      {with(t, "\"time_us\": 3,", "\"time_us\": 1e15,"),
       "kernels[1].time_us: the kernels' times add up to more than 1e15 us"},
      {with(t, "\"time_us\": 3,", "\"time_us\": 1.7e308,"), "kernels[1].time_us: the kernels' times"},
  };
  for (const Case& c : cases) {
    const std::string msg = parse_error(c.text);
    // The message starts with the file, then the field path from the document's top.
    const std::string full = c.expected.starts_with("t.json") ? c.expected : "t.json: " + c.expected;
    EXPECT_EQ(msg.rfind(full, 0), 0u) << "expected '" << full << "' at the start of '" << msg << "'";
  }
}

// Tensor 1 (used at 0 and 1) stays allocated through kernel 2; tensor 2 (used at 1) has no field.
std::string with_alive_until(const std::string& value) {
  return with(kTrace, "\"name\": \"act\"}", "\"name\": \"act\", \"alive_until\": " + value + "}");
}

TEST(TraceFormat, AliveUntilRoundTripsAndDefaultsToTheLastUse) {
  const Trace t = parse_trace(with_alive_until("2"));
  ASSERT_TRUE(t.tensors[1].alive_until.has_value());
  EXPECT_EQ(*t.tensors[1].alive_until, 2u);
  EXPECT_FALSE(t.tensors[0].alive_until.has_value());
  EXPECT_FALSE(t.tensors[2].alive_until.has_value());
  const Lifetimes l(t);
  EXPECT_EQ(l.last_use(1), 1u);
  EXPECT_EQ(l.alive_until(1), 2u);
  EXPECT_EQ(l.alive_until(2), 1u);  // readers default it to the last use
  const std::string json = trace_to_json(t);
  EXPECT_NE(json.find("\"name\": \"act\", \"alive_until\": 2}"), std::string::npos) << json;
  const Trace b = parse_trace(json);
  EXPECT_EQ(b.tensors[1].alive_until, t.tensors[1].alive_until);
  EXPECT_EQ(trace_to_json(b), json);
  // Equal to the last use: valid, and not written.
  const Trace same = parse_trace(with_alive_until("1"));
  EXPECT_EQ(trace_to_json(same).find("alive_until"), std::string::npos);
  EXPECT_EQ(trace_to_json(same), trace_to_json(parse_trace(kTrace)));
}

TEST(TraceFormat, RejectsBadAliveUntilNamingTheField) {
  // Tensor 2 made unused: drop it from kernel 1.
  const std::string unused = with(with(kTrace, "[1, 2, 1]", "[1, 1]"), "\"extra\": 5}", "\"extra\": 5, \"alive_until\": 2}");
  const std::pair<std::string, std::string> cases[] = {
      {with_alive_until("3"), "tensors[1].alive_until: kernel 3 is out of range (the trace has 3 kernels)"},
      {with_alive_until("10000000000"), "tensors[1].alive_until: kernel 10000000000 is out of range"},
      {with_alive_until("0"), "tensors[1].alive_until: kernel 0 is before the tensor's last use (kernel 1)"},
      {with_alive_until("-1"), "tensors[1].alive_until: must be >= 0"},
      {with_alive_until("\"2\""), "tensors[1].alive_until: expected an integer"},
      {with_alive_until("1.5"), "tensors[1].alive_until: must be a whole number"},
      {with(kTrace, "\"name\": \"w \\\"q\\\"\"}", "\"name\": \"w\", \"alive_until\": 2}"),
       "tensors[0].alive_until: the tensor is persistent"},
      {unused, "tensors[2].alive_until: no kernel uses the tensor"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string msg = parse_error(text);
    EXPECT_NE(msg.find(expected), std::string::npos) << "expected '" << expected << "' in '" << msg << "'";
    EXPECT_EQ(msg.rfind("t.json: ", 0), 0u) << msg;
  }
  // The same rules for a trace built in memory (validate, and every analysis).
  Trace t = parse_trace(kTrace);
  t.tensors[1].alive_until = 0;
  const std::string before = validate_error(t);
  EXPECT_NE(before.find("tensors[1].alive_until: kernel 0 is before"), std::string::npos) << before;
  EXPECT_THROW(Lifetimes{t}, Error);
  EXPECT_THROW(write_trace(t, "/nonexistent/never-written.json"), Error);
}

// Writes in place (docs/formats.md): writes_recorded and written_at round-trip, are left out when
// unset (old traces read and write as before), and a bad written_at names the field.
std::string with_writes(const std::string& written_at, const char* recorded = "true") {
  return with(
      with(kTrace, "\"meta\":", std::string("\"writes_recorded\": ") + recorded + ", \"meta\":"),
      "\"name\": \"act\"}", "\"name\": \"act\", \"written_at\": " + written_at + "}");
}

TEST(TraceFormat, WritesInPlaceRoundTripAndAreChecked) {
  const Trace old = parse_trace(kTrace);
  EXPECT_FALSE(old.writes_recorded);
  EXPECT_TRUE(written_between(old, 1, 0, 2));
  EXPECT_EQ(trace_to_json(old).find("writes_recorded"), std::string::npos);
  EXPECT_EQ(trace_to_json(old).find("written_at"), std::string::npos);

  const Trace t = parse_trace(with_writes("[1]"));
  EXPECT_TRUE(t.writes_recorded);
  EXPECT_EQ(t.tensors[1].written_at, std::vector<KernelIndex>{1});
  EXPECT_TRUE(t.tensors[0].written_at.empty());
  EXPECT_FALSE(written_between(t, 1, 0, 0));
  EXPECT_TRUE(written_between(t, 1, 0, 1));
  EXPECT_FALSE(written_between(t, 0, 0, 2)) << "recorded, and none listed: never written";
  const std::string json = trace_to_json(t);
  EXPECT_NE(json.find("\"writes_recorded\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\": \"act\", \"written_at\": [1]}"), std::string::npos) << json;
  const Trace b = parse_trace(json);
  EXPECT_TRUE(b.writes_recorded);
  EXPECT_EQ(b.tensors[1].written_at, t.tensors[1].written_at);
  EXPECT_EQ(trace_to_json(b), json);
  // Recorded with no tensor written: the flag alone survives.
  const Trace none = parse_trace(with_writes("[]"));
  EXPECT_TRUE(none.writes_recorded);
  EXPECT_TRUE(parse_trace(trace_to_json(none)).writes_recorded);
  // false: as absent.
  EXPECT_FALSE(parse_trace(with(kTrace, "\"meta\":", "\"writes_recorded\": false, \"meta\":"))
                   .writes_recorded);

  const std::pair<std::string, std::string> cases[] = {
      {with_writes("[2]"), "tensors[1].written_at: kernel 2 does not use the tensor"},
      {with_writes("[0, 3]"),
       "tensors[1].written_at: kernel 3 is out of range (the trace has 3 kernels)"},
      {with_writes("[1, 0]"),
       "tensors[1].written_at: kernel 0 comes after kernel 1; the list must be sorted and "
       "distinct"},
      {with_writes("[1, 1]"), "tensors[1].written_at: kernel 1 comes after kernel 1"},
      {with_writes("[1]", "false"), "tensors[1].written_at: the trace does not record writes"},
      {with_writes("[-1]"), "tensors[1].written_at[0]: must be >= 0"},
      {with_writes("1"), "tensors[1].written_at: expected an array"},
      {with_writes("[1]", "1"), "writes_recorded: expected true or false"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string msg = parse_error(text);
    EXPECT_NE(msg.find(expected), std::string::npos)
        << "expected '" << expected << "' in '" << msg << "'";
    EXPECT_EQ(msg.rfind("t.json: ", 0), 0u) << msg;
  }
  // The same rules for a trace built in memory.
  Trace m = parse_trace(kTrace);
  m.tensors[0].written_at = {1};
  std::string msg = validate_error(m);
  EXPECT_NE(msg.find("tensors[0].written_at: the trace does not record writes"), std::string::npos) << msg;
  m.writes_recorded = true;
  msg = validate_error(m);
  EXPECT_NE(msg.find("tensors[0].written_at: kernel 1 does not use the tensor"), std::string::npos) << msg;
  EXPECT_THROW(write_trace(m, "/nonexistent/never-written.json"), Error);
  m.tensors[0].written_at = {0};
  EXPECT_NO_THROW(m.validate());
}

TEST(TraceFormat, ReadingAMissingFileNamesIt) {
  try {
    read_trace("/nonexistent/dir/x.trace.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.trace.json"), std::string::npos);
  }
}

const char* kPlan = R"({
  "format": "teraio.plan", "version": 1,
  "budget_bytes": 42949672960,
  "tiers": [{"name": "host", "capacity_bytes": 68719476736, "read_gbps": 50.0, "write_gbps": 50.0},
            {"name": "ssd", "capacity_bytes": 1000, "read_gbps": 6.5, "write_gbps": 6}],
  "moves": [
    {"tensor": 0, "op": "offload", "tier": "host", "start": 120, "deadline": 131},
    {"tensor": 0, "op": "prefetch", "tier": "ssd", "start": 40021, "deadline": 40188}
  ],
  "predicted": {"iteration_us": 1.0e6, "ideal_us": 0.95e6, "stall_us": 5.0e4, "peak_bytes": 4.1e10},
  "planner": {"seconds": 0.5}
})";

TEST(PlanFormat, ReadsAndRoundTrips) {
  const Plan p = parse_plan(kPlan);
  EXPECT_EQ(p.budget_bytes, 42949672960u);
  ASSERT_EQ(p.tiers.size(), 2u);
  EXPECT_EQ(p.tiers[1].name, "ssd");
  EXPECT_DOUBLE_EQ(p.tiers[1].write_gbps, 6.0);
  ASSERT_EQ(p.moves.size(), 2u);
  EXPECT_EQ(p.moves[1].op, MoveOp::prefetch);
  EXPECT_EQ(p.moves[1].tier, 1u);
  EXPECT_EQ(p.moves[1].deadline, 40188u);
  EXPECT_DOUBLE_EQ(p.predicted.peak_bytes, 4.1e10);
  ASSERT_EQ(p.extra.size(), 1u);
  EXPECT_EQ(p.extra[0].first, "planner");
  const Plan q = parse_plan(plan_to_json(p));
  EXPECT_EQ(plan_to_json(p), plan_to_json(q));
}

TEST(PlanFormat, DiscardDeadIsOptionalAndRoundTrips) {
  const Plan old = parse_plan(kPlan);
  EXPECT_FALSE(old.discard_dead);  // absent: every offload writes
  EXPECT_EQ(plan_to_json(old).find("discard_dead"), std::string::npos);
  Plan p = old;
  p.discard_dead = true;
  const std::string text = plan_to_json(p);
  EXPECT_NE(text.find("\"discard_dead\": true"), std::string::npos);
  EXPECT_NE(text.find("\"version\": 1"), std::string::npos);  // still v1: older readers ignore it
  const Plan q = parse_plan(text);
  EXPECT_TRUE(q.discard_dead);
  EXPECT_TRUE(q.extra.size() == old.extra.size()) << "a known field, not kept as extra";
  EXPECT_EQ(plan_to_json(q), text);
  std::string msg;
  try {
    parse_plan(with(text, "\"discard_dead\": true", "\"discard_dead\": 1"), "p.json");
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("p.json: discard_dead"), std::string::npos) << msg;
}

TEST(PlanFormat, BothWaysBandwidthIsOptionalAndRoundTrips) {
  // Older plans have no duplex_gbps: independent directions (0), and writing them back adds none.
  const Plan old = parse_plan(kPlan);
  EXPECT_EQ(old.tiers[0].duplex_gbps, 0);
  EXPECT_EQ(plan_to_json(old).find("duplex_gbps"), std::string::npos);
  Plan p = old;
  p.tiers[0].duplex_gbps = 49.6;
  const std::string text = plan_to_json(p);
  EXPECT_NE(text.find("\"version\": 1"), std::string::npos);  // still v1: older readers ignore it
  const Plan q = parse_plan(text);
  EXPECT_DOUBLE_EQ(q.tiers[0].duplex_gbps, 49.6);
  EXPECT_EQ(q.tiers[1].duplex_gbps, 0);
  EXPECT_EQ(plan_to_json(q), text);
  EXPECT_DOUBLE_EQ(parse_tier_spec("host:64GiB:55.2:55.1:49.6").duplex_gbps, 49.6);
  std::string msg;
  try {
    parse_plan(with(kPlan, "\"write_gbps\": 6}", "\"write_gbps\": 6, \"duplex_gbps\": -1}"), "p.json");
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind("p.json: tiers[1].duplex_gbps: must be >= 0", 0), 0u) << msg;
}

TEST(PlanFormat, RejectsMalformedInputNamingTheField) {
  const std::string p = kPlan;
  const std::pair<std::string, std::string> cases[] = {
      {with(p, "\"version\": 1", "\"version\": 0"), "version: unsupported version 0"},
      {with(p, "\"tier\": \"ssd\"", "\"tier\": \"nvme\""), "moves[1].tier: unknown tier \"nvme\""},
      {with(p, "\"op\": \"offload\"", "\"op\": \"evict\""), "moves[0].op: expected \"offload\" or \"prefetch\""},
      {with(p, "\"start\": 120", "\"start\": -1"), "moves[0].start: must be >= 0"},
      {with(p, "\"write_gbps\": 6}", "\"write_gbps\": 0}"), "tiers[1].write_gbps: must be > 0"},
      {with(p, "\"name\": \"ssd\"", "\"name\": \"host\""), "tiers[1].name: duplicate tier"},
      {with(p, "\"budget_bytes\": 42949672960,", ""), "budget_bytes: required field is missing"},
      {with(p, "\"stall_us\": 5.0e4", "\"stall_us\": -1"), "predicted.stall_us: must be >= 0"},
      {p.substr(0, p.size() - 10), "not valid JSON"},
  };
  for (const auto& [text, expected] : cases) {
    std::string msg;
    try {
      parse_plan(text, "p.json");
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_EQ(msg.rfind("p.json: " + expected, 0), 0u) << "expected 'p.json: " << expected << "' in '" << msg << "'";
  }
}

TEST(PlanFormat, TierNamesAreEscapedAndMustDiffer) {
  Plan plan;
  plan.tiers = {{"my \"ssd\"\\", 1 << 20, 1, 1}};
  plan.moves = {{0, MoveOp::offload, 0, 0, 1}};
  EXPECT_EQ(parse_plan(plan_to_json(plan)).tiers[0].name, "my \"ssd\"\\");
  plan.tiers.push_back(plan.tiers[0]);
  try {
    plan_to_json(plan);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two tiers are named"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_tier_specs({"a:1GiB:1:1", "b:1GiB:1:1", "a:2GiB:2:2"}), Error);
  EXPECT_EQ(parse_tier_specs({"a:1GiB:1:1", "b:1GiB:1:1"}).size(), 2u);
}

TEST(TraceBounds, ValidateRefusesTracesWhoseSumsCouldOverflow) {
  Trace t;
  t.add_tensor({kMaxTraceBytes, TensorKind::activation, false, "a"});
  t.add_kernel("k", 1, std::vector<TensorId>{0});
  EXPECT_NO_THROW(t.validate());
  t.add_tensor({1, TensorKind::activation, false, "b"});
  const std::string msg = validate_error(t);
  EXPECT_EQ(msg.rfind("tensors[1].bytes: the tensors' bytes add up", 0), 0u) << msg;
  Trace slow;
  slow.add_kernel("k", kMaxTraceTimeUs, {});
  EXPECT_NO_THROW(slow.validate());
  slow.add_kernel("k", 1e300, {});
  EXPECT_THROW(slow.validate(), Error);
}

TEST(PlanFormat, ParsesTierSpecs) {
  const TierSpec s = parse_tier_spec("ssd:2TiB:6.5:6");
  EXPECT_EQ(s.name, "ssd");
  EXPECT_EQ(s.capacity_bytes, 2ull << 40);
  EXPECT_DOUBLE_EQ(s.read_gbps, 6.5);
  EXPECT_DOUBLE_EQ(s.write_gbps, 6.0);
  EXPECT_THROW(parse_tier_spec("ssd:2TiB:6.5"), Error);
  EXPECT_THROW(parse_tier_spec("ssd:2XB:6.5:6"), Error);
  EXPECT_THROW(parse_tier_spec("ssd:2TiB:0:6"), Error);
  EXPECT_THROW(parse_tier_spec(":2TiB:1:6"), Error);
}

}  // namespace
}  // namespace teraio
