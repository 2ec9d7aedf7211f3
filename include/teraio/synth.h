// Synthetic traces: one training iteration of a Llama-style decoder-only transformer trained with
// AdamW, at ATen-operator granularity, with roofline-modelled kernel times. Lets the planner,
// simulator and benchmarks run on realistic 10^4–2.5·10^5-kernel traces without a GPU.
// Deterministic: the same options always give the same trace. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/trace.h"

namespace teraio {

// fp32, bf16 and fp16 hold everything in that type; amp is mixed precision as torch.autocast(bf16)
// runs it over fp32 parameters: fp32 parameters, gradients, AdamW states, residual stream and
// norms, bf16 matmuls and attention on bf16 copies autocast makes of their inputs and weights.
enum class SynthDtype : uint8_t { fp32, bf16, fp16, amp };
std::string_view to_string(SynthDtype dtype);
// Throws teraio::Error naming `text` unless it is fp32, bf16, fp16 or amp.
SynthDtype parse_synth_dtype(std::string_view text);

// How attention runs (docs/synth.md, "Attention"). automatic: efficient for fp32, flash for bf16
// and fp16, fused for amp. efficient / flash: K and V repeated to every head (two clones), then one
// memory-efficient / flash kernel. fused: one kernel reads the grouped K and V as they are
// (cuDNN's, PyTorch 2.11 under autocast on an H200). math: the scores and probabilities
// materialised (batch x heads x seq^2 each): what PyTorch 2.11 runs for HF Llama with grouped K/V
// in fp32.
enum class SynthAttention : uint8_t { automatic, efficient, flash, fused, math };
std::string_view to_string(SynthAttention attention);
// Throws teraio::Error naming `text` unless it is auto, efficient, flash, fused or math.
SynthAttention parse_synth_attention(std::string_view text);
// What `automatic` means for `dtype`; any other choice is returned as it is.
SynthAttention resolve_attention(SynthAttention attention, SynthDtype dtype);

// Shape of a Llama-architecture model, with the iteration it is traced with by default: the
// model table's entry (teraio/models.h, data/models.json) that a synth --model name means.
struct ModelShape {
  std::string name;       // as asked for, e.g. "llama3-8b"
  std::string canonical;  // the table's name of the shape, e.g. "llama3.1-8b"
  uint32_t layers = 0;
  uint32_t d_model = 0;
  uint32_t heads = 0;
  uint32_t kv_heads = 0;
  uint32_t ffn = 0;  // hidden size of the SwiGLU MLP
  uint32_t vocab = 0;
  bool tied_embeddings = false;  // LM head reuses the embedding matrix (Llama 3.2 1B/3B)
  // data/models.json's synth_iterations, chosen so that llama3-8b / llama3-70b land near the
  // paper's ~50k / ~250k kernels.
  uint32_t default_batch = 1;
  uint32_t default_seq = 0;
  uint32_t default_micro_batches = 1;
};

// Synth's names (tiny, llama-1b, llama-3b, llama3-8b, llama3-70b); model_shape() also takes the
// table's canonical name of every Llama-architecture entry (synth-tiny, llama3.2-1b, ...,
// llama-1b-v32k, the shapes bench/llm_bench.py trains); an entry without a synth iteration in the
// table defaults to one sequence of its max_seq tokens.
std::vector<std::string> synth_models();
// The model table's other Llama-architecture entries synth takes by their canonical names
// (llama-small-v32k, llama-1b-v32k, llama-3b-v32k, ...: the shapes bench/llm_bench.py trains).
std::vector<std::string> synth_table_models();
// Throws teraio::Error listing the known models when `name` is not one of them.
ModelShape model_shape(std::string_view name);
// Parameter elements of the model (embedding, layers, final norm, LM head unless tied).
uint64_t parameter_count(const ModelShape& shape);

struct SynthOptions {
  std::string model = "tiny";
  // 0 = the model's default (ModelShape::default_*); when only micro_batches is given, batch keeps
  // the default sequences per micro-batch. `batch` is the global batch in sequences; it must be a
  // multiple of `micro_batches`.
  uint32_t batch = 0;
  uint32_t seq = 0;
  uint32_t micro_batches = 0;
  // 0 = the model's; otherwise the model's shape with this many decoder layers (the width kept):
  // "the largest model of this width that trains here".
  uint32_t layers = 0;
  // Element type of parameters, gradients, optimizer states and activations (RMSNorm statistics
  // and the attention log-sum-exp stay fp32).
  SynthDtype dtype = SynthDtype::fp32;
  SynthAttention attention = SynthAttention::automatic;
  // Peak dense compute. 0 = 67 TFLOPS for fp32 (H100/H200 SXM CUDA cores, no TF32 — PyTorch's
  // default for fp32 matmul) and 989 TFLOPS for bf16/fp16/amp (H100/H200 dense tensor cores).
  double gpu_tflops = 0;
  double hbm_gbps = 4800;             // H200 HBM3e
  double matmul_efficiency = 0.7;     // fraction of peak FLOPs reached by matmuls
  double attention_efficiency = 0.5;  // fraction of peak FLOPs reached by fused attention
  double hbm_efficiency = 0.8;        // fraction of peak HBM bandwidth reached by memory-bound ops
  double launch_overhead_us = 2.0;    // added to every kernel
  // AdamW as PyTorch's foreach=False (8 ops per parameter) or foreach=True (8 ops over the group).
  bool foreach = false;
  // Gradients exist across iterations (zero_grad(set_to_none=False)). When false they are
  // allocated by the first backward and freed after the optimizer (set_to_none=True).
  bool persistent_gradients = true;
  // Each parameter's AdamW update runs in the backward right after its gradient is complete
  // (Session.watch(..., step_in_backward=True)) instead of after the backward; one micro-batch.
  bool step_in_backward = false;
  // Record each non-persistent tensor's producer and mark activations made by cheap, memory-bound
  // kernels recomputable (teraio.trace v2; docs/synth.md). false: a v1 trace without producers.
  bool recomputable = true;
};

// Builds the trace of one iteration: forward and backward of every micro-batch (gradients
// accumulated), then the AdamW step. Throws teraio::Error on an unknown model or bad options.
// Meta keys: model, batch, seq, micro_batches, layers, dtype, attention, optimizer, foreach,
// gpu_tflops, hbm_gbps, generator ("teraio synth").
Trace synthesize(const SynthOptions& options);

}  // namespace teraio
