// Synthetic traces: valid, round-trip through the v1 format, deterministic, with the kernel counts
// and parameter sizes of the model, real activation lifetimes and an AdamW step that touches every
// parameter's states.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <fmt/format.h>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/synth.h"
#include "one_micro_batch.h"

namespace teraio {
namespace {

SynthOptions tiny() {
  SynthOptions o;
  o.model = "tiny";
  return o;
}

std::map<std::string, TensorId> by_name(const Trace& trace) {
  std::map<std::string, TensorId> m;
  for (TensorId t = 0; t < trace.num_tensors(); ++t) m[trace.tensors[t].name] = t;
  return m;
}

// Kernel count implied by the operator lists in docs/synth.md (untied embeddings, foreach=False,
// persistent gradients): per layer and micro-batch 37 forward + 65 backward + 9 gradient adds; per
// micro-batch 19 forward + 20 backward + 3 gradient adds outside the layers; per parameter one
// zero_ and 8 AdamW ops.
uint64_t expected_kernels(const ModelShape& s, uint64_t micro_batches) {
  const uint64_t params = 9ull * s.layers + 3;
  return micro_batches * (111ull * s.layers + 42) + 9 * params;
}

TEST(Synth, ParameterCountsMatchPublishedModels) {
  EXPECT_EQ(parameter_count(model_shape("llama3-8b")), 8030261248ull);
  EXPECT_EQ(parameter_count(model_shape("llama3-70b")), 70553706496ull);
  EXPECT_EQ(parameter_count(model_shape("llama-1b")), 1235814400ull);
  EXPECT_EQ(parameter_count(model_shape("llama-3b")), 3212749824ull);
}

TEST(Synth, UnknownModelAndBadOptionsAreErrors) {
  SynthOptions o = tiny();
  o.model = "gpt5";
  EXPECT_THROW(synthesize(o), Error);
  o = tiny();
  o.batch = 3;
  o.micro_batches = 2;
  EXPECT_THROW(synthesize(o), Error);
  o = tiny();
  o.hbm_gbps = 0;
  EXPECT_THROW(synthesize(o), Error);
  EXPECT_THROW(parse_synth_dtype("fp8"), Error);
  EXPECT_EQ(parse_synth_dtype("bf16"), SynthDtype::bf16);
}

TEST(Synth, TinyTraceIsValidAndRoundTrips) {
  Trace trace = synthesize(tiny());
  trace.validate();
  const ModelShape s = model_shape("tiny");
  EXPECT_EQ(trace.num_kernels(), expected_kernels(s, s.default_micro_batches));
  EXPECT_EQ(trace.meta_value("model"), "\"tiny\"");
  EXPECT_EQ(trace.meta_value("micro_batches"), "2");
  EXPECT_EQ(trace.meta_value("generator"), "\"teraio synth\"");

  auto path = std::filesystem::temp_directory_path() / "teraio_synth_tiny_test.json";
  write_trace(trace, path.string());
  Trace back = read_trace(path.string());
  std::filesystem::remove(path);
  ASSERT_EQ(back.num_kernels(), trace.num_kernels());
  ASSERT_EQ(back.num_tensors(), trace.num_tensors());
  for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
    ASSERT_EQ(back.kernel_name(k), trace.kernel_name(k));
    ASSERT_DOUBLE_EQ(back.kernel_time_us(k), trace.kernel_time_us(k));
    auto a = trace.kernel_tensors(k), b = back.kernel_tensors(k);
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "kernel " << k;
  }
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    EXPECT_EQ(back.tensors[t].bytes, trace.tensors[t].bytes);
    EXPECT_EQ(back.tensors[t].kind, trace.tensors[t].kind);
    EXPECT_EQ(back.tensors[t].persistent, trace.tensors[t].persistent);
    EXPECT_EQ(back.tensors[t].name, trace.tensors[t].name);
  }
}

TEST(Synth, Deterministic) {
  SynthOptions o = tiny();
  o.dtype = SynthDtype::bf16;
  EXPECT_EQ(trace_to_json(synthesize(o)), trace_to_json(synthesize(o)));
}

TEST(Synth, KernelCountFollowsLayersAndMicroBatches) {
  SynthOptions o = tiny();
  o.batch = 6;
  o.micro_batches = 3;
  EXPECT_EQ(synthesize(o).num_kernels(), expected_kernels(model_shape("tiny"), 3));
  SynthOptions only_micro = tiny();  // batch follows: one sequence per micro-batch
  only_micro.micro_batches = 5;
  Trace t5 = synthesize(only_micro);
  EXPECT_EQ(t5.meta_value("batch"), "5");
  EXPECT_EQ(t5.num_kernels(), expected_kernels(model_shape("tiny"), 5));
  o.foreach = true;  // 8 optimizer ops and one _foreach_zero_ in all
  EXPECT_EQ(synthesize(o).num_kernels(), expected_kernels(model_shape("tiny"), 3) - 9 * 21 + 9);
}

TEST(Synth, Llama8bDefaultsNear50kKernelsAndParameterBytes) {
  SynthOptions o;
  o.model = "llama3-8b";
  Trace trace = synthesize(o);
  const ModelShape s = model_shape("llama3-8b");
  EXPECT_EQ(trace.num_kernels(), expected_kernels(s, s.default_micro_batches));
  EXPECT_GT(trace.num_kernels(), 45000u);
  EXPECT_LT(trace.num_kernels(), 55000u);
  uint64_t bytes[kNumTensorKinds] = {};
  for (const TensorInfo& t : trace.tensors) {
    if (t.persistent) bytes[static_cast<int>(t.kind)] += t.bytes;
  }
  const uint64_t p = parameter_count(s);
  EXPECT_EQ(bytes[static_cast<int>(TensorKind::parameter)], 4 * p);
  EXPECT_EQ(bytes[static_cast<int>(TensorKind::gradient)], 4 * p);
  EXPECT_EQ(bytes[static_cast<int>(TensorKind::optimizer_state)], 8 * p);
}

TEST(Synth, Bf16HalvesParameterBytesAndUsesFlashAttention) {
  SynthOptions o = tiny();
  o.dtype = SynthDtype::bf16;
  Trace trace = synthesize(o);
  uint64_t param_bytes = 0;
  bool flash = false;
  for (const TensorInfo& t : trace.tensors) {
    if (t.kind == TensorKind::parameter) param_bytes += t.bytes;
  }
  for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
    flash |= trace.kernel_name(k) == "aten::_scaled_dot_product_flash_attention";
  }
  EXPECT_EQ(param_bytes, 2 * parameter_count(model_shape("tiny")));
  EXPECT_TRUE(flash);
}

// Index of the k-th kernel named `name`.
KernelIndex nth_kernel(const Trace& trace, std::string_view name, int n) {
  for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
    if (trace.kernel_name(k) == name && n-- == 0) return k;
  }
  ADD_FAILURE() << "no kernel " << name;
  return 0;
}

// The optimizer step's first kernel: AdamW's first multiply, per parameter or foreach.
KernelIndex optimizer_start(const Trace& trace, bool foreach) {
  return nth_kernel(trace, foreach ? "aten::_foreach_mul_" : "aten::mul_", 0);
}

// Under amp every persistent tensor stays fp32, each projection's weight gets a bf16 copy made in
// the forward and read by the backward, and the attention reads the grouped K and V as they are.
TEST(Synth, AmpKeepsFp32StateAndSavesBf16Copies) {
  SynthOptions o = tiny();
  o.dtype = SynthDtype::amp;
  o.persistent_gradients = false;
  Trace trace = synthesize(o);
  const uint64_t params = parameter_count(model_shape("tiny"));
  std::map<TensorKind, uint64_t> bytes;
  for (const TensorInfo& t : trace.tensors) bytes[t.kind] += t.bytes;
  EXPECT_EQ(bytes[TensorKind::parameter], 4 * params);
  EXPECT_EQ(bytes[TensorKind::gradient], 4 * params);
  EXPECT_EQ(bytes[TensorKind::optimizer_state], 8 * params);
  const auto names = by_name(trace);
  Lifetimes life(trace);
  const KernelIndex bwd = nth_kernel(trace, "aten::ones_like", 0);
  int copies = 0;
  for (const auto& [name, id] : names) {
    if (!name.starts_with("mb0.") || !name.ends_with(".weight_bf16")) continue;  // micro-batch 0
    ++copies;
    const TensorInfo& info = trace.tensors[id];
    EXPECT_EQ(info.kind, TensorKind::activation) << name;
    // Made inside aten::linear by its cast of the weight: that cast alone makes it again
    // (recompute_inputs: the fp32 parameter; its time a part of the linear's).
    EXPECT_TRUE(info.recomputable) << name;
    ASSERT_TRUE(info.recompute_inputs.has_value()) << name;
    ASSERT_EQ(info.recompute_inputs->size(), 1u) << name;
    EXPECT_EQ(trace.tensors[info.recompute_inputs->front()].kind, TensorKind::parameter) << name;
    EXPECT_EQ(trace.tensors[info.recompute_inputs->front()].bytes, 2 * info.bytes) << name;
    EXPECT_EQ(trace.kernel_name(*info.producer), "aten::linear") << name;
    EXPECT_LT(*info.recompute_us, trace.kernel_time_us(*info.producer)) << name;
    EXPECT_LT(life.first_use(id), bwd) << name;
    EXPECT_GT(life.last_use(id), bwd) << name;
  }
  EXPECT_EQ(copies, 7 * 2 + 1);  // 7 projections per layer, the LM head
  bool fused = false;
  for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
    fused |= trace.kernel_name(k) == "aten::_scaled_dot_product_cudnn_attention";
  }
  EXPECT_TRUE(fused);
  EXPECT_EQ(names.count("mb0.layers.0.attn.k_repeated"), 0u);
  // The residual stream is fp32, the MLP's activations bf16.
  const uint64_t tokens = 32;  // one sequence of 32 per micro-batch
  EXPECT_EQ(trace.tensors[names.at("mb0.layers.0.residual_mid")].bytes, tokens * 64 * 4);
  EXPECT_EQ(trace.tensors[names.at("mb0.layers.0.mlp.gate")].bytes, tokens * 128 * 2);
  EXPECT_EQ(trace.meta_value("dtype"), "\"amp\"");
  EXPECT_EQ(trace.meta_value("attention"), "\"fused\"");
}

TEST(Synth, MathAttentionStoresTheProbabilities) {
  SynthOptions o = tiny();
  o.attention = SynthAttention::math;
  Trace trace = synthesize(o);
  const auto names = by_name(trace);
  const TensorInfo& probs = trace.tensors[names.at("mb1.layers.1.attn.probs")];
  EXPECT_EQ(probs.kind, TensorKind::activation);
  EXPECT_EQ(probs.bytes, 1ull * 4 * 32 * 32 * 4);  // one sequence x 4 heads x 32^2 fp32
  EXPECT_EQ(trace.meta_value("attention"), "\"math\"");
  int bmm = 0;
  for (KernelIndex k = 0; k < trace.num_kernels(); ++k) bmm += trace.kernel_name(k) == "aten::bmm";
  EXPECT_EQ(bmm, 2 * (1 + 4 * 2));  // per micro-batch: the rotary table, 4 per layer backward (the
                                   // forward's two are inside scaled_dot_product_attention)
}

// llama-1b-v32k (the bench's llama-1b), batch 4 x 1024, set_to_none, as bench/llm_bench.py trained
// it on the H200 (2026-12-04, PyTorch 2.11, HF transformers): the peak of the profiled trace's
// memory curve (teraio analyze) and its CUPTI kernel time. fp32 ran the math attention (grouped K/V
// in fp32), autocast cuDNN's. bench/results/h200-2026-12-04-execution/call4-issue-order/trace.json.xz
// and call2-lanes/trace-recompute-1of2-llama-1b-amp.json.xz; docs/synth.md "Checked against".
TEST(Synth, PeakMatchesTheProfiledH200Runs) {
  struct Case {
    SynthDtype dtype;
    SynthAttention attention;
    uint64_t peak, activations;
    double kernel_us;
  };
  for (const Case& c : {Case{SynthDtype::fp32, SynthAttention::math, 37473820672ull, 23174103040ull, 631120.4},
                        Case{SynthDtype::amp, SynthAttention::automatic, 25449799680ull, 11150082048ull, 94103.4}}) {
    SynthOptions o;
    o.model = "llama-1b-v32k";
    o.batch = 4;
    o.seq = 1024;
    o.micro_batches = 1;
    o.persistent_gradients = false;
    o.dtype = c.dtype;
    o.attention = c.attention;
    Trace trace = synthesize(o);
    Lifetimes life(trace);
    const std::vector<uint64_t> curve = memory_curve(trace, life);
    const uint64_t peak = *std::max_element(curve.begin(), curve.end());
    uint64_t activations = 0;
    for (const TensorInfo& t : trace.tensors) activations += t.kind == TensorKind::activation ? t.bytes : 0;
    const std::string what(to_string(c.dtype));
    EXPECT_NEAR(static_cast<double>(peak), static_cast<double>(c.peak), 0.001 * c.peak) << what;
    EXPECT_NEAR(static_cast<double>(activations), static_cast<double>(c.activations), 0.01 * c.activations)
        << what;
    EXPECT_NEAR(trace.total_time_us(), c.kernel_us, 0.1 * c.kernel_us) << what;
  }
}

TEST(Synth, AnyLlamaShapeOfTheTableAndFewerOrMoreLayers) {
  const ModelShape bench1b = model_shape("llama-1b-v32k");
  EXPECT_EQ(bench1b.vocab, 32000u);
  EXPECT_FALSE(bench1b.tied_embeddings);
  EXPECT_EQ(bench1b.default_batch, 1u);  // no synth iteration in the table: one longest sequence
  EXPECT_EQ(bench1b.default_seq, 4096u);
  try {
    model_shape("mixtral-2b");
    FAIL() << "mixtral accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Llama-architecture"), std::string::npos) << e.what();
  }
  try {
    model_shape("gpt5");
    FAIL() << "unknown model accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama-1b-v32k"), std::string::npos) << e.what();
  }
  SynthOptions o = tiny();
  o.layers = 5;
  Trace five = synthesize(o);
  ModelShape s = model_shape("tiny");
  s.layers = 5;
  EXPECT_EQ(five.num_kernels(), expected_kernels(s, s.default_micro_batches));
  EXPECT_EQ(five.meta_value("layers"), "5");
  uint64_t param_bytes = 0;
  for (const TensorInfo& t : five.tensors) param_bytes += t.kind == TensorKind::parameter ? t.bytes : 0;
  EXPECT_EQ(param_bytes, 4 * parameter_count(s));
  EXPECT_EQ(parse_synth_dtype("amp"), SynthDtype::amp);
  EXPECT_EQ(parse_synth_attention("math"), SynthAttention::math);
  EXPECT_THROW(parse_synth_attention("sparse"), Error);
}

TEST(Synth, ActivationsLiveFromForwardToBackwardOfTheirMicroBatch) {
  SynthOptions o = tiny();
  o.batch = 4;
  o.micro_batches = 4;
  Trace trace = synthesize(o);
  const Lifetimes life(trace);
  int activations = 0;
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    const TensorInfo& info = trace.tensors[t];
    if (info.kind == TensorKind::temporary) {
      EXPECT_FALSE(info.persistent);
      EXPECT_TRUE(life.used(t)) << info.name;
    }
    if (info.kind != TensorKind::activation) continue;
    ++activations;
    ASSERT_FALSE(info.persistent) << info.name;
    ASSERT_EQ(info.name.rfind("mb", 0), 0u) << info.name;
    const int m = std::stoi(info.name.substr(2));
    // Backward of micro-batch m starts at its loss-gradient seed; it ends before the next
    // micro-batch's embedding.
    const KernelIndex fwd_start = nth_kernel(trace, "aten::embedding", m);
    const KernelIndex bwd_start = nth_kernel(trace, "aten::ones_like", m);
    const KernelIndex bwd_end =
        m + 1 < 4 ? nth_kernel(trace, "aten::embedding", m + 1) : nth_kernel(trace, "aten::mul_", 0);
    ASSERT_TRUE(life.used(t)) << info.name;
    EXPECT_GE(life.first_use(t), fwd_start) << info.name;
    EXPECT_LT(life.first_use(t), bwd_start) << info.name;
    EXPECT_GT(life.last_use(t), bwd_start) << info.name;
    EXPECT_LT(life.last_use(t), bwd_end) << info.name;
  }
  EXPECT_GT(activations, 4 * 2 * 18);
}

TEST(Synth, AdamwTouchesEveryParameterAndItsStates) {
  for (bool foreach : {false, true}) {
    SCOPED_TRACE(foreach ? "foreach" : "per-parameter");
    SynthOptions o = tiny();
    o.foreach = foreach;
    Trace trace = synthesize(o);
    const Lifetimes life(trace);
    const auto names = by_name(trace);
    const KernelIndex opt_start = optimizer_start(trace, foreach);
    int params = 0;
    for (TensorId p = 0; p < trace.num_tensors(); ++p) {
      if (trace.tensors[p].kind != TensorKind::parameter) continue;
      ++params;
      const std::string& n = trace.tensors[p].name;
      const TensorId g = names.at(n + ".grad"), m1 = names.at(n + ".exp_avg"),
                     m2 = names.at(n + ".exp_avg_sq");
      EXPECT_TRUE(trace.tensors[m1].persistent && trace.tensors[m2].persistent);
      EXPECT_EQ(trace.tensors[m1].kind, TensorKind::optimizer_state);
      EXPECT_EQ(trace.tensors[g].kind, TensorKind::gradient);
      // The step updates the parameter last, after reading both moments; the states are used
      // only by the optimizer; the gradient is read by it last.
      EXPECT_GE(life.first_use(m1), opt_start) << n;
      EXPECT_GE(life.first_use(m2), opt_start) << n;
      EXPECT_GE(life.last_use(g), opt_start) << n;
      EXPECT_EQ(life.last_use(p), life.last_use(m1)) << n;
      EXPECT_GT(life.last_use(p), life.last_use(m2)) << n;
      EXPECT_LT(life.first_use(p), opt_start) << n;  // used by forward
      EXPECT_EQ(life.uses(m1).size(), 2u) << n;  // lerp_, addcdiv_
    }
    EXPECT_EQ(params, 9 * 2 + 3);
  }
}

// --step-in-backward: each parameter's 8 AdamW kernels follow the last kernel of its gradient (a
// tied embedding's second one), inside the backward; the same kernels as the step after it.
TEST(Synth, StepInBackwardUpdatesEachParameterOnceItsGradientIsComplete) {
  for (const char* model : {"tiny", "llama-1b"}) {
    for (bool foreach : {false, true}) {
      for (SynthDtype dtype : {SynthDtype::fp32, SynthDtype::amp}) {
        SCOPED_TRACE(fmt::format("{} foreach={} amp={}", model, foreach, dtype == SynthDtype::amp));
        SynthOptions o = one_micro_batch(model, foreach, dtype, 1);
        const Trace after = synthesize(o);
        o.step_in_backward = true;
        const Trace trace = synthesize(o);
        trace.validate();
        EXPECT_EQ(trace.meta_value("step_in_backward"), "true");
        const Lifetimes life(trace);
        const auto names = by_name(trace);
        KernelIndex embedding_backward = 0;
        for (KernelIndex k = 0; k < trace.num_kernels(); ++k)
          if (trace.kernel_name(k) == "aten::embedding_dense_backward") embedding_backward = k;
        int params = 0, tied = 0;
        for (TensorId p = 0; p < trace.num_tensors(); ++p) {
          if (trace.tensors[p].kind != TensorKind::parameter) continue;
          ++params;
          const std::string& n = trace.tensors[p].name;
          const auto g = life.uses(names.at(n + ".grad"));
          ASSERT_GE(g.size(), 3u) << n;  // made (once, or twice when tied), lerp_, addcmul_
          tied += g.size() == 4;
          const KernelIndex made = g[g.size() - 3];
          // Weight decay right after the gradient is complete, the update 7 kernels later.
          ASSERT_EQ(trace.tensors[p].written_at.size(), 2u) << n;
          EXPECT_EQ(trace.tensors[p].written_at.front(), made + 1) << n;
          EXPECT_EQ(trace.tensors[p].written_at.back(), made + 8) << n;
          EXPECT_EQ(life.first_use(names.at(n + ".exp_avg")), made + 2) << n;
          // Inside the backward: before the embedding's gradient, except the embedding's update.
          if (n != "embed") {
            EXPECT_LT(made, embedding_backward) << n;
          }
        }
        EXPECT_EQ(params, std::string(model) == "tiny" ? 9 + 3 : 9 + 2);
        EXPECT_EQ(tied, std::string(model) == "tiny" ? 0 : 1);
        // The kernels of the step after the backward (foreach: 8 over the group instead).
        EXPECT_EQ(trace.num_kernels(), after.num_kernels() + (foreach ? 8 * (params - 1) : 0));
      }
    }
  }
  SynthOptions o = tiny();  // two micro-batches
  o.step_in_backward = true;
  EXPECT_THROW(synthesize(o), Error);
}

// Note [Writes in place in synth]: the trace records writes; parameters and AdamW states are
// written only by the optimizer step (each by the kernels that update it), gradients by zero_ and
// the add_ that accumulates each micro-batch's part, and every written_at kernel is an in-place one
// that lists the tensor.
TEST(Synth, ParametersAreWrittenOnlyByTheOptimizer) {
  for (bool foreach : {false, true}) {
    for (bool persistent_gradients : {true, false}) {
      SCOPED_TRACE(std::string(foreach ? "foreach" : "per-parameter") +
                   (persistent_gradients ? ", persistent gradients" : ", gradients set to none"));
      SynthOptions o = tiny();
      o.foreach = foreach;
      o.persistent_gradients = persistent_gradients;
      const Trace trace = synthesize(o);
      trace.validate();
      ASSERT_TRUE(trace.writes_recorded);
      ASSERT_EQ(trace.meta_value("micro_batches"), "2");
      const auto names = by_name(trace);
      const KernelIndex opt_start = optimizer_start(trace, foreach);
      int params = 0;
      for (TensorId p = 0; p < trace.num_tensors(); ++p) {
        if (trace.tensors[p].kind != TensorKind::parameter) continue;
        ++params;
        const std::string& n = trace.tensors[p].name;
        const std::vector<KernelIndex>& w = trace.tensors[p].written_at;
        // Weight decay and the update: two kernels, both in the optimizer part.
        ASSERT_EQ(w.size(), 2u) << n;
        EXPECT_GE(w.front(), opt_start) << n;
        for (KernelIndex k : w) EXPECT_TRUE(trace.kernel_name(k).ends_with('_')) << n << " " << k;
        EXPECT_FALSE(written_between(trace, p, 0, opt_start - 1))
            << n << ": forward and backward only read it";
        EXPECT_TRUE(
            written_between(trace, p, opt_start, static_cast<int64_t>(trace.num_kernels()) - 1));
        for (const char* state : {".exp_avg", ".exp_avg_sq"}) {
          const TensorId st = names.at(n + state);
          EXPECT_FALSE(trace.tensors[st].written_at.empty()) << n << state;
          EXPECT_GE(trace.tensors[st].written_at.front(), opt_start) << n << state;
        }
        // The gradient: written where partials are accumulated (every micro-batch with persistent
        // gradients, after zero_; all but the first without), never by the optimizer.
        const std::vector<KernelIndex>& gw = trace.tensors[names.at(n + ".grad")].written_at;
        const size_t accumulations = persistent_gradients ? 1 + 2 : 2 - 1;  // tiny: 2 micro-batches
        EXPECT_EQ(gw.size(), accumulations) << n;
        if (!gw.empty()) {
          EXPECT_LT(gw.back(), opt_start) << n;
        }
      }
      EXPECT_EQ(params, 9 * 2 + 3);
      // Nothing out of place is marked: every written_at kernel is in place.
      for (TensorId t = 0; t < trace.num_tensors(); ++t)
        for (KernelIndex k : trace.tensors[t].written_at)
          EXPECT_TRUE(trace.kernel_name(k).ends_with('_')) << trace.tensors[t].name << " " << k;
    }
  }
}

// data/llama3-8b.trace.json.xz is what `teraio synth --model llama3-8b` writes (data/README.md).
TEST(Synth, BundledTraceMatchesGenerator) {
  const std::string path = std::string(TERAIO_SOURCE_DIR) + "/data/llama3-8b.trace.json.xz";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  FILE* pipe = popen(("xz -dc '" + path + "' 2>/dev/null").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string bundled;
  char buf[1 << 16];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) bundled.append(buf, n);
  const int status = pclose(pipe);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) GTEST_SKIP() << "no xz to decompress " << path;
  ASSERT_EQ(status, 0) << "xz -dc " << path << " failed";
  SynthOptions o;
  o.model = "llama3-8b";
  EXPECT_TRUE(bundled == trace_to_json(synthesize(o)))
      << "regenerate it: teraio synth --model llama3-8b -o data/llama3-8b.trace.json && xz -9 "
         "data/llama3-8b.trace.json";
}

}  // namespace
}  // namespace teraio
