// The recorder (src/offload/recorder.h): logical ids by first appearance, kind guessing (Note
// [Tensor kinds]) and the trace of a recording (Note [Trace of a recording]): lifetimes extended to
// where a tensor was still alive, persistent tensors, idle and pinned ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "recorder.h"

namespace teraio::offload {
namespace {

class HostMemory : public runtime::Memory {
 public:
  HostMemory(uint64_t n, const std::set<LogicalId>* alive, LogicalId id)
      : data_(n), alive_(alive), id_(id) {}
  uint64_t bytes() const override { return data_.size(); }
  storage::BufferView detach() override { return storage::BufferView::host(data_.data(), 0); }
  void attach() override {}
  void drop() override {}
  storage::BufferView allocate() override { return storage::BufferView::host(data_.data(), 0); }
  bool alive() const override { return alive_->count(id_) > 0; }

 private:
  std::vector<std::byte> data_;
  const std::set<LogicalId>* alive_;
  LogicalId id_;
};

class FakeSource : public TensorSource {
 public:
  bool alive(LogicalId id) const override { return live.count(id) > 0; }
  std::vector<LogicalId> live_tensors() const override { return {live.begin(), live.end()}; }
  double operator_time_us(size_t k, double host_us) const override {
    return host_us + static_cast<double>(k);  // "device time": distinguishable from the host's
  }
  std::string device_name() const override { return "fake:0"; }
  bool host_times() const override { return with_host_times; }
  std::set<LogicalId> live;
  bool with_host_times = false;
};

// Note [Host times of a recording]: where the operators' times are the device's, the trace keeps
// each operator's host time as kernels[k].host_us; where they are the host's (CPU), it has none.
TEST(Recorder, HostTimesGoIntoTheTraceOnlyWhereTimesAreTheDevices) {
  for (bool device : {false, true}) {
    Recorder r;
    FakeSource src;
    src.with_host_times = device;
    r.begin_iteration(1);
    const LogicalId a = r.id_for_key(make_key(0, 0, false), src);
    r.note_bound(a, make_key(0, 0, false), 4096, true);
    src.live.insert(a);
    r.add_operator("first", 10, std::vector<LogicalId>{a}, {}, src, 25);
    r.add_operator("second", 10, std::vector<LogicalId>{a}, {}, src, 7.5, /*reads_back=*/true);
    runtime::Engine engine(runtime::EngineOptions{}, {});
    const Trace t = r.build_trace(engine, src).trace;
    ASSERT_EQ(t.num_kernels(), 2u);
    EXPECT_EQ(t.has_host_times(), device);
    // Note [Reads back behind the writes]: kept with the host times (a device's), never on the CPU.
    EXPECT_FALSE(t.kernel_reads_back(0));
    EXPECT_EQ(t.kernel_reads_back(1), device);
    EXPECT_DOUBLE_EQ(t.kernel_host_us(0), device ? 25 : 0);
    EXPECT_DOUBLE_EQ(t.kernel_host_us(1), device ? 7.5 : 0);
    EXPECT_DOUBLE_EQ(t.kernel_time_us(1), 11);  // the device's time (the fake's)
  }
}

TEST(Recorder, KeysNameTheSameTensorAcrossIterationsWhileItIsGone) {
  Recorder r;
  FakeSource src;
  const uint64_t key = make_key(3, 1, true);
  const LogicalId a = r.id_for_key(key, src);
  r.note_bound(a, key, 4096, false);
  r.tensor(a).name = "x";
  src.live.insert(a);
  EXPECT_NE(r.id_for_key(key, src), a) << "the key's tensor is alive: another tensor";
  const LogicalId b = static_cast<LogicalId>(r.num_tensors() - 1);
  src.live = {};
  EXPECT_EQ(r.id_for_key(make_key(3, 1, true), src), b) << "the key now names the newer one";
  r.note_bound(a, key, 4096, false);
  EXPECT_EQ(r.tensor(a).name, "x") << "the same key keeps its labels";
  r.note_bound(a, make_key(4, 0, false), 4096, false);
  EXPECT_EQ(r.tensor(a).name, "") << "a new key is a new logical tensor";
  EXPECT_EQ(r.tensor(a).display_name(), "op4.in0");
}

TEST(Recorder, GuessesKinds) {
  TensorFacts f;
  f.key = make_key(0, 0, false);
  EXPECT_EQ(f.guess_kind(false, 1), TensorKind::other) << "an input never produced: a batch";
  f.is_param = true;
  EXPECT_EQ(f.guess_kind(true, 1), TensorKind::parameter);
  f.named_kind = TensorKind::optimizer_state;
  EXPECT_EQ(f.guess_kind(true, 1), TensorKind::optimizer_state) << "a given kind wins";
  TensorFacts g;
  g.key = make_key(5, 0, true);
  g.produced_in_backward = true;
  EXPECT_EQ(g.guess_kind(true, 1), TensorKind::gradient) << "alive at the end";
  EXPECT_EQ(g.guess_kind(false, 1), TensorKind::temporary);
  g.used_after_backward = true;
  EXPECT_EQ(g.guess_kind(false, 1), TensorKind::gradient) << "the optimizer used it";
  TensorFacts a;
  a.key = make_key(1, 0, true);
  a.produced_in_forward = true;
  a.used_in_backward = true;
  a.first_iteration = 1;
  EXPECT_EQ(a.guess_kind(false, 1), TensorKind::activation);
  a.used_in_backward = false;
  EXPECT_EQ(a.guess_kind(false, 1), TensorKind::temporary);
  TensorFacts s;
  s.key = make_key(7, 2, true);
  s.first_iteration = 0;
  EXPECT_EQ(s.guess_kind(true, 1), TensorKind::optimizer_state) << "alive, from an earlier one";
  EXPECT_EQ(s.idle_kind(), TensorKind::optimizer_state);
}

// An engine over an unpinned 1 MiB host tier, for the tests that build traces.
struct HostEngine {
  std::unique_ptr<storage::Tier> host = [] {
    storage::HostTierOptions h;
    h.capacity_bytes = 1 << 20;
    h.pin = false;
    return storage::make_host_tier(h);
  }();
  runtime::Engine engine{runtime::EngineOptions{0}, {{"host", host.get(), 1 << 20}}};
};

TEST(Recorder, TraceOfAnIteration) {
  HostEngine host_engine;
  runtime::Engine& engine = host_engine.engine;
  Recorder r;
  FakeSource src;
  auto bind = [&](uint64_t key, uint64_t bytes, bool param) {
    const LogicalId id = r.id_for_key(key, src);
    r.note_bound(id, key, bytes, param);
    engine.bind(id, std::make_unique<HostMemory>(bytes, &src.live, id));
    src.live.insert(id);
    return id;
  };
  // Iteration 0 binds the optimizer state and an idle tensor; iteration 1 is recorded.
  r.begin_iteration(0);
  const LogicalId s = bind(make_key(3, 2, false), 1000, false);
  const LogicalId idle = bind(make_key(3, 3, false), 700, false);
  r.begin_iteration(1);
  const LogicalId p = bind(make_key(0, 0, false), 2000, true);
  const LogicalId x = bind(make_key(0, 1, false), 100, false);
  auto op = [&](const char* name, std::vector<LogicalId> in, std::vector<LogicalId> out,
                bool backward) {
    for (LogicalId id : in) r.note_input(id, backward);
    for (LogicalId id : out) r.note_output(id, backward, /*grad_enabled=*/true);
    r.add_signature(r.operators().size());
    r.add_operator(name, 10, in, out, src);
  };
  const LogicalId a = bind(make_key(0, 0, true), 500, false);
  op("fwd", {p, x}, {a}, false);
  const LogicalId y = bind(make_key(1, 0, true), 300, false);
  op("fwd2", {a}, {y}, false);
  const LogicalId g = bind(make_key(2, 0, true), 2000, false);
  op("bwd", {a, y, p}, {g}, true);
  src.live.erase(a);  // a dies after its last use; y lives on (Python holds it) until after opt
  op("opt", {p, g, s}, {}, false);
  src.live.erase(y);
  src.live.erase(x);
  op("log", {}, {}, false);
  engine.pin_permanently(s);  // as if given to a collective

  const Recording rec = r.build_trace(engine, src);
  const Trace& t = rec.trace;
  ASSERT_EQ(t.num_kernels(), 5u);
  auto find = [&](LogicalId id) {
    for (size_t i = 0; i < rec.tensors.size(); ++i)
      if (rec.tensors[i].id == id) return static_cast<TensorId>(i);
    ADD_FAILURE() << "tensor " << id << " not in the trace";
    return TensorId(0);
  };
  EXPECT_EQ(t.tensors[find(p)].kind, TensorKind::parameter);
  EXPECT_TRUE(t.tensors[find(p)].persistent);
  EXPECT_EQ(t.tensors[find(x)].kind, TensorKind::other);
  EXPECT_EQ(t.tensors[find(a)].kind, TensorKind::activation);
  EXPECT_FALSE(t.tensors[find(a)].alive_until.has_value()) << "died after its last use";
  EXPECT_EQ(t.tensors[find(y)].kind, TensorKind::activation);
  EXPECT_EQ(t.tensors[find(y)].alive_until, std::optional<KernelIndex>(3))
      << "alive through opt, last used by bwd";
  EXPECT_EQ(t.tensors[find(g)].kind, TensorKind::gradient);
  EXPECT_TRUE(rec.tensors[find(g)].made_this_iteration);
  EXPECT_EQ(t.tensors[find(s)].kind, TensorKind::optimizer_state);
  EXPECT_FALSE(rec.tensors[find(s)].made_this_iteration);
  // The pinned state is listed at every operator (no move can plan around it).
  for (KernelIndex k = 0; k < 5; ++k) {
    const auto ts = t.kernel_tensors(k);
    EXPECT_NE(std::find(ts.begin(), ts.end(), find(s)), ts.end()) << "kernel " << k;
  }
  // The idle tensor: persistent, used by no operator, at the end of the tensor list.
  const TensorId i = find(idle);
  EXPECT_EQ(i, t.num_tensors() - 1);
  EXPECT_TRUE(t.tensors[i].persistent);
  EXPECT_EQ(t.tensors[i].kind, TensorKind::optimizer_state);
  EXPECT_DOUBLE_EQ(t.kernel_time_us(2), 12.0) << "the source's device time";
  EXPECT_EQ(t.tensors[find(a)].name, "op0.out0");
  bool device_meta = false;
  for (const auto& [k, v] : t.meta)
    device_meta = device_meta || (k == "device" && v == "\"fake:0\"");
  EXPECT_TRUE(device_meta);
  EXPECT_EQ(r.signatures().size(), 5u);
  r.set_times(t);
  EXPECT_DOUBLE_EQ(r.operators()[4].time_us, 14.0);
  const std::vector<OperatorRecord> ops = r.take_operators();
  EXPECT_EQ(ops.size(), 5u);
  EXPECT_TRUE(r.operators().empty());
}

// Note [Recomputable tensors] and [Rerunnable operators]: producers of a recorded iteration, and
// which tensors rerunning them recreates, from the plain facts the binding reports.
// A recorder over host-memory tensors, each bound under a key of its own, with a version counter.
class RecorderBench : public ::testing::Test {
 protected:
  HostEngine host_engine;
  runtime::Engine& engine = host_engine.engine;
  Recorder r;
  FakeSource src;
  std::map<LogicalId, uint32_t> version;
  uint32_t next_key = 0;
  LogicalId bind(uint64_t bytes, bool param) {
    const uint64_t key = make_key(next_key++, 0, true);
    const LogicalId id = r.id_for_key(key, src);
    r.note_bound(id, key, bytes, param);
    engine.bind(id, std::make_unique<HostMemory>(bytes, &src.live, id));
    src.live.insert(id);
    version[id] = 0;
    return id;
  }
  // A tensor made inside an operator: the nested operator that made it (empty: none named) and
  // that operator's inputs.
  struct Inner {
    LogicalId id;
    const char* op;
    std::vector<LogicalId> inputs;
  };
  // An operator with inputs `in` (`writes` among them written), outputs `out` and tensors made
  // inside it, taking `us`.
  void op(const char* name, std::vector<LogicalId> in, std::vector<LogicalId> out,
          std::vector<Inner> inner, std::vector<LogicalId> writes = {}, double us = 100) {
    for (LogicalId id : in) r.note_version(id, version[id]);
    for (LogicalId id : writes) version[id]++;
    for (LogicalId id : in) r.note_version(id, version[id]);
    std::vector<LogicalId> all;
    for (const Inner& i : inner) {
      r.note_output(i.id, false, true);
      all.push_back(i.id);
    }
    for (LogicalId id : out) {
      r.note_output(id, false, true);
      r.note_produced(id, name, {});
      r.note_version(id, version[id]);
      all.push_back(id);
    }
    ProductionFacts nested;
    nested.nested_only = true;
    for (const Inner& i : inner) {
      if (*i.op) r.note_nested(i.id, i.op, i.inputs);
      r.note_produced(i.id, name, nested);
      r.note_version(i.id, version[i.id]);
    }
    r.add_operator(name, us, in, all, src);
  }
  // The trace index of `id` in `rec`.
  static TensorId index_of(const Recording& rec, LogicalId id) {
    for (size_t i = 0; i < rec.tensors.size(); ++i)
      if (rec.tensors[i].id == id) return static_cast<TensorId>(i);
    ADD_FAILURE() << "tensor " << id << " not in the trace";
    return 0;
  }
};

TEST_F(RecorderBench, ProducersAndRecomputableTensors) {
  r.begin_iteration(1);
  const LogicalId p = bind(4096, true);
  const LogicalId x = bind(4096, false);
  // An operator as the Session reports it: input versions at its start; `writes` bumped by it;
  // input and output versions at its end; its new outputs produced (the rest alias an input).
  auto op = [&](const char* name, std::vector<LogicalId> in, std::vector<LogicalId> fresh,
                std::vector<LogicalId> aliased, std::vector<LogicalId> writes,
                ProductionFacts f = {}) {
    for (LogicalId id : in) r.note_version(id, version[id]);
    for (LogicalId id : writes) {
      version[id]++;
      f.mutates_input = f.mutates_input || std::find(in.begin(), in.end(), id) != in.end();
    }
    for (LogicalId id : in) r.note_version(id, version[id]);
    std::vector<LogicalId> out = fresh;
    out.insert(out.end(), aliased.begin(), aliased.end());
    for (LogicalId id : fresh) {
      r.note_output(id, f.in_backward, true);
      r.note_produced(id, name, f);
      r.note_version(id, version[id]);
    }
    ProductionFacts alias = f;
    alias.aliases_input = true;
    for (LogicalId id : aliased) {
      r.note_produced(id, name, alias);
      r.note_version(id, version[id]);
    }
    r.add_operator(name, 10, in, out, src);
  };
  const LogicalId a = bind(4096, false);
  op("aten::linear", {p, x}, {a}, {}, {});  // 0
  const LogicalId d = bind(4096, false), mask = bind(4096, false);
  op("aten::native_dropout", {a}, {d, mask}, {}, {});  // 1
  const LogicalId rl = bind(4096, false);
  op("aten::relu", {a}, {rl}, {}, {});      // 2
  op("aten::relu_", {rl}, {}, {rl}, {rl});  // 3
  const LogicalId m = bind(4096, false);
  op("aten::mul", {x, a}, {m}, {}, {});  // 4
  op("aten::add_", {x}, {}, {x}, {x});   // 5
  const LogicalId n = bind(4096, false);
  ProductionFacts nested;
  nested.nested_only = true;
  op("aten::scaled_dot_product_attention", {m}, {n}, {}, {}, nested);  // 6
  const LogicalId bn = bind(4096, false);
  const LogicalId stats = bind(4096, false);  // running statistics, written by batch norm
  op("aten::native_batch_norm", {d, stats}, {bn}, {}, {stats});  // 7
  const LogicalId u = bind(4096, false);
  ProductionFacts small;
  small.untracked_input = true;
  op("aten::gelu", {rl}, {u}, {}, {}, small);  // 8
  const LogicalId g = bind(4096, false);
  ProductionFacts bwd;
  bwd.in_backward = true;
  op("aten::mm", {n, bn, u, mask, d, m}, {g}, {}, {}, bwd);  // 9
  for (LogicalId id : {a, d, mask, rl, m, n, bn, u, g}) src.live.erase(id);
  op("aten::sum", {}, {}, {}, {});  // 10

  const Recording rec = r.build_trace(engine, src);
  const Trace& t = rec.trace;
  auto info = [&](LogicalId id) -> const TensorInfo& {
    for (size_t i = 0; i < rec.tensors.size(); ++i)
      if (rec.tensors[i].id == id) return t.tensors[i];
    ADD_FAILURE() << "tensor " << id << " not in the trace";
    return t.tensors[0];
  };
  using K = std::optional<KernelIndex>;
  EXPECT_FALSE(info(p).producer.has_value()) << "persistent: made before the iteration";
  EXPECT_FALSE(info(x).producer.has_value());
  EXPECT_FALSE(info(stats).producer.has_value()) << "an input only, never produced";
  EXPECT_EQ(info(a).producer, K(0));
  EXPECT_TRUE(info(a).recomputable) << "x is written at 5, after a's last use (4)";
  EXPECT_EQ(info(d).producer, K(1));
  EXPECT_EQ(info(mask).producer, K(1)) << "every output of a multi-output operator";
  EXPECT_FALSE(info(d).recomputable) << "dropout draws random numbers";
  EXPECT_FALSE(info(mask).recomputable);
  EXPECT_EQ(info(rl).producer, K(2)) << "the in-place relu_ does not produce it again";
  EXPECT_FALSE(info(rl).recomputable) << "written in place after its production";
  EXPECT_EQ(info(m).producer, K(4));
  EXPECT_FALSE(info(m).recomputable) << "its producer's input x is written before m's last use";
  EXPECT_EQ(info(n).producer, K(6));
  EXPECT_FALSE(info(n).recomputable) << "made by a nested operator only";
  EXPECT_FALSE(info(bn).recomputable) << "its producer writes an input (running statistics)";
  EXPECT_FALSE(info(u).recomputable) << "an input the recorder cannot watch";
  EXPECT_EQ(info(g).producer, K(9));
  EXPECT_FALSE(info(g).recomputable) << "a backward operator";
  EXPECT_TRUE(has_recomputable(t));

  // The next iteration starts afresh: the facts of this one do not leak into it.
  r.begin_iteration(2);
  src.live.insert(a);
  op("aten::exp", {a}, {}, {}, {});
  src.live.erase(a);
  const Recording rec2 = r.build_trace(engine, src);
  for (const TensorInfo& ti : rec2.trace.tensors) EXPECT_FALSE(ti.producer.has_value()) << ti.name;
}

// Note [Nested producers]: a tensor made inside an operator (nested_only) is recomputable by the
// nested operator that made it when the Session named one (note_nested) that may be rerun, reading
// only tensors the operator lists that exist before it and are not written before the tensor's last
// use; the trace then carries its recompute_inputs and its share of the operator's time.
TEST_F(RecorderBench, TensorsMadeByNestedOperators) {
  r.begin_iteration(1);
  const LogicalId w = bind(8192, true), x = bind(4096, false), other = bind(4096, false);
  const LogicalId wc = bind(4096, false), xc = bind(2048, false), y = bind(2048, false);
  const LogicalId e = bind(4096, false), q = bind(4096, false);
  op("aten::linear", {x, w}, {y},
     {{wc, "aten::to", {w}}, {xc, "aten::to", {x}}, {e, "aten::empty_strided", {}}, {q, "aten::to", {other}}});  // 0
  op("aten::add_", {x}, {}, {}, {x});  // 1: x written before xc's last use
  op("aten::mm", {wc, xc, y, e, q, other}, {}, {});  // 2: the backward's reads
  for (LogicalId id : {x, wc, xc, y, e, q}) src.live.erase(id);
  op("aten::sum", {}, {}, {});  // 3

  const Recording rec = r.build_trace(engine, src);
  const Trace& t = rec.trace;
  auto tid = [&](LogicalId id) { return index_of(rec, id); };
  const TensorInfo& copy = t.tensors[tid(wc)];
  EXPECT_EQ(copy.producer, std::optional<KernelIndex>(0));
  EXPECT_TRUE(copy.recomputable) << "the weight's cast alone makes it again";
  ASSERT_TRUE(copy.recompute_inputs.has_value());
  EXPECT_EQ(*copy.recompute_inputs, std::vector<TensorId>{tid(w)});
  // Its share of the linear's 100 us by bytes read and written: (8192 + 4096) of the linear's
  // x, w, wc, xc, y, e, q (4096 + 8192 + 4096 + 2048 + 2048 + 4096 + 4096).
  ASSERT_TRUE(copy.recompute_us.has_value());
  EXPECT_NEAR(*copy.recompute_us, 100.0 * 12288 / 28672, 1e-9);
  EXPECT_FALSE(t.tensors[tid(xc)].recomputable) << "its cast's input x is written before its last use";
  EXPECT_FALSE(t.tensors[tid(e)].recomputable) << "empty_strided leaves memory uninitialised";
  EXPECT_FALSE(t.tensors[tid(e)].recompute_inputs.has_value());
  EXPECT_FALSE(t.tensors[tid(q)].recomputable) << "its input is not one the linear lists";
  EXPECT_NO_THROW(t.validate());
}

// A nested operator reading a tensor the iteration made outside the recorded operators (first
// listed by the operator it is nested in, made by none): the trace could not tell that input from an
// output of the operator, so the tensor it makes is not recomputable, and the trace is valid. (A tiny
// HF Llama on the CPU with min_tensor_bytes=0 failed its first step's end on such a trace.)
TEST_F(RecorderBench, ANestedProducersInputFirstListedByItsOperatorIsNotRead) {
  r.begin_iteration(1);
  const LogicalId w = bind(8192, true);
  const LogicalId x = bind(4096, false), y = bind(4096, false), xc = bind(2048, false);
  op("aten::exp", {w}, {y}, {});                                // 0
  op("aten::mul", {y, x}, {}, {{xc, "aten::to", {x}}});          // 1: x first listed here
  op("aten::mm", {xc, y}, {}, {});                              // 2: the backward's read
  for (LogicalId id : {x, y, xc}) src.live.erase(id);
  op("aten::sum", {}, {}, {});                                   // 3

  Recording rec;
  ASSERT_NO_THROW(rec = r.build_trace(engine, src));
  const TensorInfo& cast = rec.trace.tensors[index_of(rec, xc)];
  EXPECT_EQ(cast.producer, std::optional<KernelIndex>(1));
  EXPECT_FALSE(cast.recomputable) << "its input x is first listed by the mul that made the cast";
  EXPECT_FALSE(cast.recompute_inputs.has_value());
  EXPECT_NO_THROW(rec.trace.validate());
}

// A nested operator's time is its share of the operator's by bytes, but no more than its bytes
// take at the memory rate the profile shows (the 90th percentile of bytes per microsecond over
// operators touching 1 MiB or more): a cast inside a compute-bound matmul is memory-bound.
TEST_F(RecorderBench, ANestedProducersTimeIsCappedByTheProfilesMemoryRate) {
  r.begin_iteration(1);
  const LogicalId w = bind(64 << 20, true), x = bind(8 << 20, false);
  const LogicalId wc = bind(32 << 20, false), y = bind(8 << 20, false);
  op("aten::linear", {x, w}, {y}, {{wc, "aten::to", {w}}}, {}, 10'000);  // 0: 112 MiB in 10 ms
  std::vector<LogicalId> made;
  for (int i = 0; i < 20; ++i) {  // 1..20: 10 MiB each (y and the product)
    made.push_back(bind(2 << 20, false));
    op("aten::mul", {y}, {made.back()}, {}, {}, 5);
  }
  op("aten::mm", {wc, y}, {}, {});  // the backward's read
  for (LogicalId id : made) src.live.erase(id);
  for (LogicalId id : {x, wc, y}) src.live.erase(id);
  const Recording rec = r.build_trace(engine, src);
  const TensorInfo& copy = rec.trace.tensors[index_of(rec, wc)];
  ASSERT_TRUE(copy.recomputable && copy.recompute_us.has_value());
  // By share: 10 ms x 96 / 112 MiB = 8.57 ms. FakeSource adds k us to operator k's time, so the muls
  // take 6..25 us; of the 22 operators touching 1 MiB or more (the linear, 20 muls, the mm), the
  // 90th percentile of bytes per us is the mul at k = 4: 10 MiB in 9 us. 96 MiB at that rate: 86.4 us.
  const double rate = double(10 << 20) / 9;
  EXPECT_NEAR(*copy.recompute_us, double(96 << 20) / rate, 1e-9);
  EXPECT_LT(*copy.recompute_us, 10'000.0 * 96 / 112);
}

// Note [Writes of a recording]: written_at from the version counters observed at every recorded
// operator's start and end, over the recorded iteration and across its start for persistent
// tensors; tensors never observed are written at every use.
TEST(Recorder, WritesInPlaceOfTheRecordedIteration) {
  HostEngine host_engine;
  runtime::Engine& engine = host_engine.engine;
  Recorder r;
  FakeSource src;
  std::map<LogicalId, uint32_t> version;
  auto bind = [&](uint32_t key_op, uint64_t bytes, bool param) {
    const uint64_t key = make_key(key_op, 0, true);
    const LogicalId id = r.id_for_key(key, src);
    r.note_bound(id, key, bytes, param);
    engine.bind(id, std::make_unique<HostMemory>(bytes, &src.live, id));
    src.live.insert(id);
    version[id] = 0;  // a new storage's counter
    return id;
  };
  std::set<LogicalId> unversioned;
  auto observe = [&](LogicalId id) {
    if (unversioned.count(id))
      r.note_unversioned(id);
    else
      r.note_version(id, version[id]);
  };
  // As the Session reports an operator: its inputs observed at its start, `writes` bumped by it,
  // inputs and outputs observed at its end.
  auto op = [&](const char* name, std::vector<LogicalId> in, std::vector<LogicalId> out,
                std::vector<LogicalId> writes) {
    for (LogicalId id : in) observe(id);
    for (LogicalId id : writes) version[id]++;
    for (LogicalId id : in) observe(id);
    for (LogicalId id : out) {
      r.note_output(id, false, true);
      r.note_produced(id, name, {});
      observe(id);
    }
    r.add_operator(name, 10, in, out, src);
  };
  LogicalId p = 0, x = 0, u = 0, a = 0, m = 0;
  auto iteration = [&](uint64_t it) {
    r.begin_iteration(it);
    if (it == 1) {
      p = bind(100, 4096, true);
      x = bind(101, 4096, false);
      u = bind(102, 4096, false);
      unversioned.insert(u);
    }
    a = bind(0, 4096, false);
    op("aten::linear", {p, x}, {a}, {});  // 0: reads p
    op("aten::relu_", {a}, {}, {a});      // 1: writes a in place
    m = bind(2, 4096, false);
    op("aten::mul", {a, u}, {m}, {});  // 2: u has no version counter
    version[x]++;                      // written by nothing recorded, after 0's end
    op("aten::sum", {m, p}, {}, {});   // 3: reads p again
    op("aten::add_", {p}, {}, {p});    // 4: the optimizer writes p
    op("aten::mul", {u, x}, {}, {});   // 5: sees x's new version
    for (LogicalId id : {m}) observe(id);
    r.note_written(m);                 // 6: its schema writes m; the counter does not move
    for (LogicalId id : {m}) observe(id);
    r.add_operator("fsdp::split_with_sizes_copy", 10, std::vector<LogicalId>{m}, {}, src);
    for (LogicalId id : {a, m}) src.live.erase(id);
    return r.build_trace(engine, src);
  };
  using W = std::vector<KernelIndex>;
  auto written_at = [&](const Recording& rec, LogicalId id) {
    for (size_t i = 0; i < rec.tensors.size(); ++i)
      if (rec.tensors[i].id == id) return rec.trace.tensors[i].written_at;
    ADD_FAILURE() << "tensor " << id << " not in the trace";
    return W{};
  };
  const Recording one = iteration(1);
  EXPECT_TRUE(one.trace.writes_recorded);
  EXPECT_EQ(written_at(one, p), W{4}) << "only the optimizer writes the parameter";
  EXPECT_EQ(written_at(one, a), W{1}) << "written in place by relu_; made by linear (no write)";
  EXPECT_EQ(written_at(one, m), W{6}) << "read after it was made, then written by a schema's say";
  EXPECT_EQ(written_at(one, x), W{5}) << "a write no operator made: at the use after it";
  EXPECT_EQ(written_at(one, u), (W{2, 5})) << "unversioned: written at every use";
  const Trace back = parse_trace(trace_to_json(one.trace));  // and through the format
  EXPECT_TRUE(back.writes_recorded);
  for (TensorId t = 0; t < back.num_tensors(); ++t)
    EXPECT_EQ(back.tensors[t].written_at, one.trace.tensors[t].written_at) << t;

  // The next iteration: p written between the iterations, where nothing observed it, is written
  // at its first use; a and m (new storages under the same logical ids) are not written by being
  // made.
  version[p] += 3;
  const Recording two = iteration(2);
  EXPECT_EQ(written_at(two, p), (W{0, 4}));
  EXPECT_EQ(written_at(two, a), W{1});
  EXPECT_EQ(written_at(two, m), W{6});
  EXPECT_EQ(written_at(two, x), W{5});

  // Operators spliced in from another profile, never observed in this iteration: every use of
  // their tensors may write.
  const std::vector<OperatorRecord> ops = r.operators();
  r.begin_iteration(3);
  r.splice(ops, {});
  const Recording three = r.build_trace(engine, src);
  EXPECT_EQ(written_at(three, p), (W{0, 3, 4}));
  EXPECT_EQ(written_at(three, x), (W{0, 5}));
}

TEST(Recorder, RerunnableOperatorsByName) {
  EXPECT_TRUE(rerunnable_operator("aten::add"));
  EXPECT_TRUE(rerunnable_operator("aten::native_layer_norm"));
  EXPECT_TRUE(rerunnable_operator("aten::silu"));
  EXPECT_TRUE(rerunnable_operator("aten::linear"));
  for (const char* n :
       {"aten::native_dropout", "aten::dropout", "aten::rand_like", "aten::randn",
        "aten::bernoulli_", "aten::multinomial", "aten::normal", "aten::uniform_",
        "aten::rrelu_with_noise", "aten::empty_like", "aten::empty_strided", "aten::index_add",
        "aten::index_put_", "aten::scatter_add", "aten::embedding_dense_backward",
        "aten::embedding_bag", "c10d::allreduce_", "mylib::custom_op", "aten::nonzero"})
    EXPECT_FALSE(rerunnable_operator(n)) << n;
}

TEST(Recorder, CollectivesAreRecognised) {
  EXPECT_TRUE(is_collective("c10d::allreduce_"));
  EXPECT_TRUE(is_collective("_c10d_functional::all_reduce"));
  EXPECT_TRUE(is_collective("c10d_functional::all_gather_into_tensor"));
  EXPECT_FALSE(is_collective("aten::add"));
}

}  // namespace
}  // namespace teraio::offload
