// `teraio synth`: writes the synthetic trace of one Llama training iteration (docs/synth.md), so
// the planner and simulator can be exercised at the paper's scale without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "command.h"
#include "option_checks.h"
#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/synth.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

struct SynthArgs {
  SynthOptions options;
  std::string dtype = "fp32";
  std::string attention = "auto";
  std::string optimizer = "adamw";
  std::string output;
  bool list = false;
};

int run_synth(const SynthArgs& args) {
  if (args.list) {
    std::vector<std::string> names = synth_models();
    for (const std::string& name : synth_table_models()) names.push_back(name);
    for (const std::string& name : names) {
      ModelShape s = model_shape(name);
      fmt::print(
          "{:<11} {:<13} layers {:>2}  d {:>5}  heads {:>2}/{:<2}  ffn {:>5}  vocab {:>6}  params "
          "{:.3g}  "
          "defaults: batch {} seq {} micro-batches {}\n",
          s.name, s.canonical, s.layers, s.d_model, s.heads, s.kv_heads, s.ffn, s.vocab,
          static_cast<double>(parameter_count(s)), s.default_batch, s.default_seq,
          s.default_micro_batches);
    }
    return 0;
  }
  TERAIO_CHECK(!args.output.empty(), "synth: -o TRACE is required");
  SynthOptions options = args.options;
  options.dtype = parse_synth_dtype(args.dtype);
  options.attention = parse_synth_attention(args.attention);
  auto t0 = std::chrono::steady_clock::now();
  Trace trace = synthesize(options);
  write_trace(trace, args.output);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t recomputable = 0;
  for (const TensorInfo& t : trace.tensors) recomputable += t.recomputable;
  // The memory the iteration needs without offloading: what a GPU budget is compared with.
  const std::vector<uint64_t> curve = memory_curve(trace, Lifetimes(trace));
  const uint64_t peak = curve.empty() ? 0 : *std::max_element(curve.begin(), curve.end());
  fmt::print(
      "{}: {} kernels, {} tensors ({} recomputable), peak {} without offloading, iteration {} "
      "(model {}, batch {}, seq {}, micro-batches {}, {}, {} attention) in {:.2f} s\n",
      args.output, trace.num_kernels(), trace.num_tensors(), recomputable,
      format_bytes(static_cast<double>(peak)), format_us(trace.total_time_us()), options.model, trace.meta_value("batch"),
      trace.meta_value("seq"), trace.meta_value("micro_batches"), args.dtype,
      to_string(resolve_attention(options.attention, options.dtype)), seconds);
  return 0;
}

const Registration kSynth{{
    "synth",
    "Write the synthetic trace of one Llama training iteration (AdamW)",
    20,
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<SynthArgs>();
      sub.add_option(
             "--model", args->options.model,
             "tiny, llama-1b, llama-3b, llama3-8b or llama3-70b, or the model table's name of "
             "one or of another Llama-architecture entry such as llama-1b-v32k (--list shows them "
             "all, and the shapes)")
          ->capture_default_str();
      sub.add_option(
             "--batch", args->options.batch,
             "global batch in sequences, a multiple of --micro-batches (default: the model's, or "
             "--micro-batches x the model's sequences per micro-batch)")
          ->check(positive<uint32_t>());
      sub.add_option("--seq", args->options.seq, "sequence length in tokens (default: the model's)")
          ->check(positive<uint32_t>());
      sub.add_option("--micro-batches", args->options.micro_batches,
                     "gradient-accumulation steps per iteration (default: the model's)")
          ->check(positive<uint32_t>());
      sub.add_option("--layers", args->options.layers,
                     "decoder layers, the model's width kept (default: the model's)")
          ->check(in_range(1u, 4096u));
      sub.add_option(
             "--dtype", args->dtype,
             "fp32, bf16 or fp16 (everything in that type), or amp: bf16 autocast over fp32 "
             "parameters, gradients and AdamW states")
          ->capture_default_str();
      sub.add_option(
             "--attention", args->attention,
             "auto (efficient for fp32, flash for bf16/fp16, fused for amp), efficient, flash, "
             "fused (grouped K/V read as they are) or math (scores and probabilities stored)")
          ->check(CLI::IsMember({"auto", "efficient", "flash", "fused", "math"}))
          ->capture_default_str();
      sub.add_option("--gpu-tflops", args->options.gpu_tflops,
                     "peak dense TFLOPS (default: 67 for fp32, 989 for bf16/fp16/amp)")
          ->check(positive<double>());
      sub.add_option("--hbm-gbps", args->options.hbm_gbps, "HBM bandwidth in GB/s")
          ->capture_default_str()
          ->check(positive<double>());
      sub.add_option("--launch-us", args->options.launch_overhead_us,
                     "fixed overhead added to every kernel, in us")
          ->capture_default_str()
          ->check(in_range(0.0, 1e9));
      sub.add_option("--optimizer", args->optimizer, "optimizer (only adamw)")
          ->check(CLI::IsMember({"adamw"}))
          ->capture_default_str();
      sub.add_flag("--foreach", args->options.foreach,
                   "AdamW foreach=True: 8 ops over all parameters instead of 8 per parameter");
      sub.add_flag(
          "--grad-set-to-none", [args](int64_t) { args->options.persistent_gradients = false; },
          "gradients are freed after the optimizer (zero_grad(set_to_none=True)) instead "
          "of persistent");
      sub.add_flag("--step-in-backward", args->options.step_in_backward,
                   "each parameter's AdamW update runs in the backward once its gradient is "
                   "complete (Session.watch(..., step_in_backward=True)); one micro-batch");
      sub.add_flag(
          "--no-recompute-info", [args](int64_t) { args->options.recomputable = false; },
          "write no producers and mark nothing recomputable (a teraio.trace v1 file)");
      sub.add_flag("--list", args->list,
                   "list the models (data/models.json), their shapes and defaults, then exit");
      sub.add_option("-o,--output", args->output, "trace file to write (JSON)");
      return [args] { return run_synth(*args); };
    },
}};

}  // namespace
}  // namespace teraio::cli
