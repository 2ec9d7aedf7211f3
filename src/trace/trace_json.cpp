// teraio.trace v1 and v2: the JSON reader (simdjson DOM; a 250k-kernel trace parses in well under a
// second) and writer (one kernel per line so diffs and greps stay readable; v2 only when a tensor
// has a producer). A tensor's optional alive_until, producer and written_at are checked against its
// uses once all kernels are read.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "json_util.h"
#include "teraio/json_text.h"
#include "teraio/output_file.h"
#include "teraio/trace.h"

namespace teraio {

Trace parse_trace(std::string_view text, std::string_view source) {
  simdjson::dom::parser parser;
  const json::Reader r(source);
  const json::Path top;
  auto root = r.object(json::parse_document(parser, text, source), top);
  const uint64_t version = r.header(root, "teraio.trace", 2);

  Trace trace;
  // Any version: a reader that does not know these fields ignores them, and a trace read without
  // them records no writes (every use may write), which only ever costs bytes.
  if (r.has(root, "writes_recorded")) {
    trace.writes_recorded =
        r.boolean(r.field(root, "writes_recorded", top), top.field("writes_recorded"));
  }
  if (r.has(root, "meta")) {
    const json::Path mp = top.field("meta");
    for (auto [key, value] : r.object(r.field(root, "meta", top), mp)) {
      trace.meta.emplace_back(std::string(key), simdjson::minify(value));
    }
  }

  const json::Path tp = top.field("tensors");
  auto tensors = r.array(r.field(root, "tensors", top), tp);
  trace.tensors.reserve(tensors.size());
  bool check_uses = false;  // alive_until or producer: checked against the uses at the end
  size_t i = 0;
  uint64_t total_bytes = 0;
  for (auto e : tensors) {
    const json::Path p = tp.at(i);
    auto o = r.object(e, p);
    const uint64_t id = r.u64(r.field(o, "id", p), p.field("id"));
    if (id != i) r.fail(p.field("id"), fmt::format("must equal its position {}, got {}", i, id));
    TensorInfo info;
    info.bytes = r.u64(r.field(o, "bytes", p), p.field("bytes"));
    if (info.bytes > kMaxTraceBytes || total_bytes + info.bytes > kMaxTraceBytes) {
      r.fail(p.field("bytes"), Trace::bytes_bound_message(info.bytes));
    }
    total_bytes += info.bytes;
    const std::string_view kind = r.string(r.field(o, "kind", p), p.field("kind"));
    if (!parse_tensor_kind(kind, &info.kind)) {
      r.fail(p.field("kind"),
             fmt::format("unknown kind \"{}\" (expected parameter, gradient, optimizer_state, "
                         "activation, temporary or other)",
                         kind));
    }
    info.persistent = r.boolean(r.field(o, "persistent", p), p.field("persistent"));
    size_t fields = 4;  // id, bytes, kind, persistent
    if (r.has(o, "name")) {
      info.name = std::string(r.string(r.field(o, "name", p), p.field("name")));
      ++fields;
    }
    auto kernel_index = [&](std::string_view key) {
      const uint64_t k = r.u64(r.field(o, key, p), p.field(key));
      if (k > std::numeric_limits<KernelIndex>::max()) {
        r.fail(p.field(key), fmt::format("kernel {} is out of range", k));
      }
      return static_cast<KernelIndex>(k);
    };
    if (o.size() > fields) {  // optional fields looked up only when there are more
      if (r.has(o, "alive_until")) {
        info.alive_until = kernel_index("alive_until");
        check_uses = true;
      }
      // v2 only; a v1 reader ignored these fields, so a v1 file's tensors stay not recomputable.
      if (version >= 2 && r.has(o, "producer")) {
        info.producer = kernel_index("producer");
        check_uses = true;
      }
      if (version >= 2 && r.has(o, "recomputable")) {
        info.recomputable = r.boolean(r.field(o, "recomputable", p), p.field("recomputable"));
        check_uses = true;
      }
      if (version >= 2 && r.has(o, "recompute_inputs")) {  // checked against the producer at the end
        const json::Path ip = p.field("recompute_inputs");
        std::vector<TensorId> inputs;
        size_t j = 0;
        for (auto w : r.array(r.field(o, "recompute_inputs", p), ip)) {
          const uint64_t t = r.u64(w, ip.at(j++));
          if (t > std::numeric_limits<TensorId>::max()) r.fail(ip, fmt::format("tensor id {} is out of range", t));
          inputs.push_back(static_cast<TensorId>(t));
        }
        info.recompute_inputs = std::move(inputs);
        check_uses = true;
      }
      if (version >= 2 && r.has(o, "recompute_us")) {
        info.recompute_us = r.non_negative(r.field(o, "recompute_us", p), p.field("recompute_us"));
        check_uses = true;
      }
      if (r.has(o, "written_at")) {  // Note [Clean offloads] in plan_check.cpp
        const json::Path wp = p.field("written_at");
        size_t j = 0;
        for (auto w : r.array(r.field(o, "written_at", p), wp)) {
          const uint64_t k = r.u64(w, wp.at(j++));
          if (k > std::numeric_limits<KernelIndex>::max()) {
            r.fail(wp, fmt::format("kernel {} is out of range", k));
          }
          info.written_at.push_back(static_cast<KernelIndex>(k));
        }
        check_uses = true;  // sorted, in range, listing the tensor: checked with the uses
      }
    }
    trace.tensors.push_back(std::move(info));
    ++i;
  }

  const json::Path kp = top.field("kernels");
  auto kernels = r.array(r.field(root, "kernels", top), kp);
  trace.reserve_kernels(kernels.size(), kernels.size() * 4);
  std::vector<TensorId> ids;
  const uint64_t num_tensors = trace.tensors.size();
  size_t k = 0;
  double total_us = 0;
  double total_host_us = 0;
  for (auto e : kernels) {
    const json::Path p = kp.at(k);
    auto o = r.object(e, p);
    const std::string_view name = r.string(r.field(o, "name", p), p.field("name"));
    const double time_us = r.non_negative(r.field(o, "time_us", p), p.field("time_us"));
    total_us += time_us;
    if (total_us > kMaxTraceTimeUs) r.fail(p.field("time_us"), Trace::time_bound_message(time_us));
    const json::Path lp = p.field("tensors");
    ids.clear();
    size_t j = 0;
    for (auto t : r.array(r.field(o, "tensors", p), lp)) {
      const uint64_t id = r.u64(t, lp.at(j));
      if (id >= num_tensors) {
        r.fail(lp.at(j), fmt::format("tensor id {} is out of range (the trace has {} tensors)", id,
                                     num_tensors));
      }
      ids.push_back(static_cast<TensorId>(id));
      ++j;
    }
    trace.add_kernel(name, time_us, ids);
    if (version >= 2 && r.has(o, "host_us")) {
      const double host_us = r.non_negative(r.field(o, "host_us", p), p.field("host_us"));
      total_host_us += host_us;
      if (total_host_us > kMaxTraceTimeUs) r.fail(p.field("host_us"), Trace::time_bound_message(host_us));
      trace.set_kernel_host_us(static_cast<KernelIndex>(k), host_us);
    }
    if (version >= 2 && r.has(o, "reads_back") &&
        r.boolean(r.field(o, "reads_back", p), p.field("reads_back")))
      trace.set_kernel_reads_back(static_cast<KernelIndex>(k), true);
    ++k;
  }
  if (check_uses) {  // checked against the uses, which are known only now
    try {
      trace.validate();
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", source, e.what()));
    }
  }
  return trace;
}

Trace read_trace(const std::string& path) {
  const simdjson::padded_string text = json::load_file(path);
  return parse_trace(std::string_view(text.data(), text.size()), path);
}

std::string trace_to_json(const Trace& trace) {
  std::string out;
  out.reserve(64 + trace.num_tensors() * 96 + trace.num_kernels() * 64);
  // v1 when nothing needs v2, so that files without producers stay readable by older teraio.
  const bool v2 = trace.has_host_times() || trace.has_reads_back() ||
                  std::any_of(trace.tensors.begin(), trace.tensors.end(), [](const TensorInfo& t) {
                    return t.producer.has_value() || t.recomputable;
                  });
  out += v2 ? "{\n  \"format\": \"teraio.trace\", \"version\": 2,\n"
            : "{\n  \"format\": \"teraio.trace\", \"version\": 1,\n";
  if (trace.writes_recorded) out += "  \"writes_recorded\": true,\n";
  out += "  \"meta\": {";
  for (size_t i = 0; i < trace.meta.size(); ++i) {
    if (i) out += ", ";
    append_json_quoted(out, trace.meta[i].first);
    out += ": ";
    out += trace.meta[i].second;
  }
  out += "},\n  \"tensors\": [";
  // alive_until is written only where it differs from the tensor's last use.
  std::vector<int64_t> last_use;
  if (std::any_of(trace.tensors.begin(), trace.tensors.end(),
                  [](const TensorInfo& t) { return t.alive_until.has_value(); })) {
    last_use.assign(trace.num_tensors(), -1);
    for (size_t k = 0; k < trace.num_kernels(); ++k) {
      for (TensorId t : trace.kernel_tensors(static_cast<KernelIndex>(k))) {
        last_use[t] = static_cast<int64_t>(k);
      }
    }
  }
  for (size_t i = 0; i < trace.num_tensors(); ++i) {
    const TensorInfo& t = trace.tensors[i];
    out += i ? ",\n    " : "\n    ";
    fmt::format_to(std::back_inserter(out), "{{\"id\": {}, \"bytes\": {}, \"kind\": \"{}\", \"persistent\": {}, \"name\": ",
                   i, t.bytes, to_string(t.kind), t.persistent ? "true" : "false");
    append_json_quoted(out, t.name);
    if (t.alive_until && static_cast<int64_t>(*t.alive_until) != last_use[i]) {
      fmt::format_to(std::back_inserter(out), ", \"alive_until\": {}", *t.alive_until);
    }
    if (t.producer) {
      fmt::format_to(std::back_inserter(out), ", \"producer\": {}, \"recomputable\": {}", *t.producer,
                     t.recomputable ? "true" : "false");
    }
    if (t.recompute_inputs) {
      fmt::format_to(std::back_inserter(out), ", \"recompute_inputs\": [{}]", fmt::join(*t.recompute_inputs, ", "));
    }
    if (t.recompute_us) {
      out += ", \"recompute_us\": ";
      append_json_number(out, *t.recompute_us, "a recompute time");
    }
    if (!t.written_at.empty()) {
      fmt::format_to(std::back_inserter(out), ", \"written_at\": [{}]", fmt::join(t.written_at, ", "));
    }
    out += '}';
  }
  out += trace.num_tensors() ? "\n  ],\n  \"kernels\": [" : "],\n  \"kernels\": [";
  for (size_t k = 0; k < trace.num_kernels(); ++k) {
    const auto ki = static_cast<KernelIndex>(k);
    out += k ? ",\n    " : "\n    ";
    out += "{\"name\": ";
    append_json_quoted(out, trace.kernel_name(ki));
    out += ", \"time_us\": ";
    append_json_number(out, trace.kernel_time_us(ki), "a kernel time");
    if (trace.has_host_times()) {
      out += ", \"host_us\": ";
      append_json_number(out, trace.kernel_host_us(ki), "a host time");
    }
    if (trace.kernel_reads_back(ki)) out += ", \"reads_back\": true";
    fmt::format_to(std::back_inserter(out), ", \"tensors\": [{}]}}",
                   fmt::join(trace.kernel_tensors(ki), ", "));
  }
  out += trace.num_kernels() ? "\n  ]\n}\n" : "]\n}\n";
  return out;
}

void write_trace(const Trace& trace, const std::string& path) {
  trace.validate();
  write_file_atomically(path, trace_to_json(trace));
}

}  // namespace teraio
