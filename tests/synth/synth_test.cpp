// Synthetic traces: valid, round-trip through the v1 format, deterministic, with the kernel counts
// and parameter sizes of the model, real activation lifetimes and an AdamW step that touches every
// parameter's states.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/synth.h"

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
    const KernelIndex opt_start = foreach ? nth_kernel(trace, "aten::_foreach_mul_", 0)
                                          : nth_kernel(trace, "aten::mul_", 0);
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
