// teraio.plan v1 and v2 (v2: recompute moves, which name no tier): reader and writer, and the
// planner's view of the CLI's tier specs (tier_args.h).
#include <algorithm>
#include <string>
#include <vector>

#include "json_util.h"
#include "teraio/json_text.h"
#include "teraio/output_file.h"
#include "teraio/plan.h"
#include "teraio/tier_args.h"
#include "teraio/units.h"

namespace teraio {

std::string_view to_string(MoveOp op) {
  switch (op) {
    case MoveOp::offload: return "offload";
    case MoveOp::prefetch: return "prefetch";
    case MoveOp::recompute: return "recompute";
    case MoveOp::writeback: return "writeback";
  }
  return "unknown";
}

namespace {

// A tier for the planner: its name, capacity and bandwidths (a file tier's directories are not
// used; they let the same spec serve `teraio train` and `teraio plan`).
TierSpec planner_tier(const TierArg& t) {
  TERAIO_CHECK(t.bandwidths_given(),
               "--tier \"{}\": planning needs the tier's bandwidths; append :READ_GBPS:WRITE_GBPS "
               "(GB/s), e.g. {}:6.5:6.5",
               t.text, t.text);
  return TierSpec{t.name, t.capacity_bytes, t.read_gbps, t.write_gbps, t.duplex_gbps};
}

}  // namespace

TierSpec parse_tier_spec(std::string_view text) { return planner_tier(parse_tier_arg(text)); }

std::vector<TierSpec> parse_tier_specs(const std::vector<std::string>& texts) {
  std::vector<TierSpec> tiers;
  for (const std::string& text : texts) {
    for (const TierArg& t : parse_tier_arg_list(text)) tiers.push_back(planner_tier(t));
  }
  check_tier_names(tiers, "--tier");
  return tiers;
}

void check_tier_names(const std::vector<TierSpec>& tiers, std::string_view what) {
  for (size_t i = 0; i < tiers.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      TERAIO_CHECK(tiers[i].name != tiers[j].name,
                   "{}: two tiers are named {}; each tier needs its own name", what,
                   json_quote(tiers[i].name));
    }
  }
}

Plan parse_plan(std::string_view text, std::string_view source) {
  simdjson::dom::parser parser;
  const json::Reader r(source);
  const json::Path top;
  auto root = r.object(json::parse_document(parser, text, source), top);
  const uint64_t version = r.header(root, "teraio.plan", 2);

  Plan plan;
  plan.budget_bytes = r.u64(r.field(root, "budget_bytes", top), top.field("budget_bytes"));

  const json::Path tp = top.field("tiers");
  size_t i = 0;
  for (auto e : r.array(r.field(root, "tiers", top), tp)) {
    const json::Path p = tp.at(i++);
    auto o = r.object(e, p);
    TierSpec t;
    t.name = std::string(r.string(r.field(o, "name", p), p.field("name")));
    if (t.name.empty()) r.fail(p.field("name"), "must not be empty");
    for (const TierSpec& other : plan.tiers) {
      if (other.name == t.name) r.fail(p.field("name"), fmt::format("duplicate tier \"{}\"", t.name));
    }
    t.capacity_bytes = r.u64(r.field(o, "capacity_bytes", p), p.field("capacity_bytes"));
    t.read_gbps = r.non_negative(r.field(o, "read_gbps", p), p.field("read_gbps"));
    t.write_gbps = r.non_negative(r.field(o, "write_gbps", p), p.field("write_gbps"));
    if (t.read_gbps <= 0) r.fail(p.field("read_gbps"), "must be > 0");
    if (t.write_gbps <= 0) r.fail(p.field("write_gbps"), "must be > 0");
    if (r.has(o, "duplex_gbps"))  // optional: absent (older plans) means independent directions
      t.duplex_gbps = r.non_negative(r.field(o, "duplex_gbps", p), p.field("duplex_gbps"));
    plan.tiers.push_back(std::move(t));
  }

  const json::Path mp = top.field("moves");
  auto moves = r.array(r.field(root, "moves", top), mp);
  plan.moves.reserve(moves.size());
  i = 0;
  for (auto e : moves) {
    const json::Path p = mp.at(i++);
    auto o = r.object(e, p);
    Move m;
    const uint64_t tensor = r.u64(r.field(o, "tensor", p), p.field("tensor"));
    if (tensor > 0xffffffffull) r.fail(p.field("tensor"), "tensor id is out of range");
    m.tensor = static_cast<TensorId>(tensor);
    const std::string_view op = r.string(r.field(o, "op", p), p.field("op"));
    if (op == "offload") {
      m.op = MoveOp::offload;
    } else if (op == "prefetch") {
      m.op = MoveOp::prefetch;
    } else if (op == "recompute" && version >= 2) {
      m.op = MoveOp::recompute;
    } else if (op == "writeback" && version >= 2) {
      m.op = MoveOp::writeback;
    } else if (op == "recompute" || op == "writeback") {
      r.fail(p.field("op"), fmt::format("\"{}\" needs teraio.plan version 2 (this file says version 1)", op));
    } else {
      r.fail(p.field("op"), version >= 2
                                ? fmt::format("expected \"offload\", \"prefetch\", \"recompute\" or \"writeback\", got \"{}\"", op)
                                : fmt::format("expected \"offload\" or \"prefetch\", got \"{}\"", op));
    }
    if (m.op == MoveOp::recompute) {
      // Moves no bytes through a tier, so it names none.
      if (r.has(o, "tier")) r.fail(p.field("tier"), "a recompute move names no tier (it moves no bytes)");
    } else {
      const std::string_view tier = r.string(r.field(o, "tier", p), p.field("tier"));
      bool found = false;
      for (size_t t = 0; t < plan.tiers.size(); ++t) {
        if (plan.tiers[t].name == tier) {
          m.tier = static_cast<uint32_t>(t);
          found = true;
        }
      }
      if (!found) r.fail(p.field("tier"), fmt::format("unknown tier \"{}\" (not in \"tiers\")", tier));
    }
    const uint64_t start = r.u64(r.field(o, "start", p), p.field("start"));
    const uint64_t deadline = r.u64(r.field(o, "deadline", p), p.field("deadline"));
    if (start > 0xffffffffull) r.fail(p.field("start"), "kernel index is out of range");
    if (deadline > 0xffffffffull) r.fail(p.field("deadline"), "kernel index is out of range");
    m.start = static_cast<KernelIndex>(start);
    m.deadline = static_cast<KernelIndex>(deadline);
    plan.moves.push_back(m);
  }

  if (r.has(root, "predicted")) {
    const json::Path pp = top.field("predicted");
    auto o = r.object(r.field(root, "predicted", top), pp);
    auto get = [&](std::string_view key, double* out) {
      if (r.has(o, key)) *out = r.non_negative(r.field(o, key, pp), pp.field(key));
    };
    get("iteration_us", &plan.predicted.iteration_us);
    get("ideal_us", &plan.predicted.ideal_us);
    get("stall_us", &plan.predicted.stall_us);
    get("peak_bytes", &plan.predicted.peak_bytes);
  }
  if (r.has(root, "discard_dead"))  // optional in either version: absent means false
    plan.discard_dead = r.boolean(r.field(root, "discard_dead", top), top.field("discard_dead"));
  static constexpr std::string_view kKnown[] = {"format", "version", "budget_bytes", "tiers",
                                                "moves", "predicted", "discard_dead"};
  for (auto [key, value] : root) {
    bool known = false;
    for (auto k : kKnown) known |= (k == key);
    if (!known) plan.extra.emplace_back(std::string(key), simdjson::minify(value));
  }
  return plan;
}

Plan read_plan(const std::string& path) {
  const simdjson::padded_string text = json::load_file(path);
  return parse_plan(std::string_view(text.data(), text.size()), path);
}

std::string plan_to_json(const Plan& plan) {
  check_tier_names(plan.tiers, "plan");
  std::string out;
  out.reserve(256 + plan.moves.size() * 80);
  // v1 unless a move needs v2 (a recompute or a writeback), so that plans without them stay readable by older teraio.
  const bool v2 = std::any_of(plan.moves.begin(), plan.moves.end(),
                              [](const Move& m) { return m.op == MoveOp::recompute || m.op == MoveOp::writeback; });
  fmt::format_to(std::back_inserter(out),
                 "{{\n  \"format\": \"teraio.plan\", \"version\": {},\n  \"budget_bytes\": {},\n  \"tiers\": [",
                 v2 ? 2 : 1, plan.budget_bytes);
  for (size_t i = 0; i < plan.tiers.size(); ++i) {
    const TierSpec& t = plan.tiers[i];
    out += i ? ",\n    {\"name\": " : "\n    {\"name\": ";
    append_json_quoted(out, t.name);
    fmt::format_to(std::back_inserter(out), ", \"capacity_bytes\": {}, \"read_gbps\": ", t.capacity_bytes);
    append_json_number(out, t.read_gbps, "a tier's read_gbps");
    out += ", \"write_gbps\": ";
    append_json_number(out, t.write_gbps, "a tier's write_gbps");
    if (t.duplex_gbps > 0) {  // written only when set, so that older readers read the plan
      out += ", \"duplex_gbps\": ";
      append_json_number(out, t.duplex_gbps, "a tier's duplex_gbps");
    }
    out += '}';
  }
  out += plan.tiers.empty() ? "]," : "\n  ],";
  if (plan.discard_dead) out += "\n  \"discard_dead\": true,";  // only when set: older readers ignore it
  out += "\n  \"moves\": [";
  for (size_t i = 0; i < plan.moves.size(); ++i) {
    const Move& m = plan.moves[i];
    out += i ? ",\n    {\"tensor\": " : "\n    {\"tensor\": ";
    fmt::format_to(std::back_inserter(out), "{}, \"op\": \"{}\"", m.tensor, to_string(m.op));
    if (m.op != MoveOp::recompute) {
      TERAIO_CHECK(m.tier < plan.tiers.size(), "moves[{}]: tier index {} is out of range", i, m.tier);
      out += ", \"tier\": ";
      append_json_quoted(out, plan.tiers[m.tier].name);
    }
    fmt::format_to(std::back_inserter(out), ", \"start\": {}, \"deadline\": {}}}", m.start, m.deadline);
  }
  out += plan.moves.empty() ? "],\n  \"predicted\": {" : "\n  ],\n  \"predicted\": {";
  out += "\"iteration_us\": ";
  append_json_number(out, plan.predicted.iteration_us, "predicted.iteration_us");
  out += ", \"ideal_us\": ";
  append_json_number(out, plan.predicted.ideal_us, "predicted.ideal_us");
  out += ", \"stall_us\": ";
  append_json_number(out, plan.predicted.stall_us, "predicted.stall_us");
  out += ", \"peak_bytes\": ";
  append_json_number(out, plan.predicted.peak_bytes, "predicted.peak_bytes");
  out += '}';
  for (const auto& [key, value] : plan.extra) {
    out += ",\n  ";
    append_json_quoted(out, key);
    out += ": ";
    out += value;
  }
  out += "\n}\n";
  return out;
}

void write_plan(const Plan& plan, const std::string& path) {
  write_file_atomically(path, plan_to_json(plan));
}

}  // namespace teraio
