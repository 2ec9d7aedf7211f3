// Synthetic trace of one Llama training iteration (docs/synth.md): the ATen operators PyTorch eager
// runs for forward and backward of every micro-batch and for AdamW, the tensors each one touches
// with their kinds and real lifetimes, and roofline kernel times. Everything is computed from the
// model shape and the options; no randomness.
#include "teraio/synth.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "teraio/error.h"
#include "teraio/models.h"

namespace teraio {
namespace {

constexpr double kFp32Tflops = 67.0;         // H100/H200 SXM, CUDA cores
constexpr double kTensorCoreTflops = 989.0;  // H100/H200 SXM, dense bf16/fp16

enum class OpClass : uint8_t { matmul, attention, memory };

struct Param {
  TensorId param = 0, grad = 0, exp_avg = 0, exp_avg_sq = 0;
  uint64_t bytes = 0;
  bool grad_written = false;  // this iteration's backward already produced a gradient
  uint32_t grad_kernels = 1;  // kernels producing its gradient per micro-batch (2 when tied)
  uint32_t grads_made = 0;    // of them, run so far in this micro-batch
};

struct LayerParams {
  Param *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *w_gate, *w_up, *w_down;
};

// A projection y = x·Wᵀ as its backward sees it: the input and weight the matmul read (under amp
// the bf16 copies autocast made of them) and whether the layer's input x was fp32 (its gradient is
// cast back to fp32).
struct Linear {
  TensorId out = 0, input = 0, weight = 0;
  bool cast_input = false;
};

// What the forward of one layer saves for its backward.
struct LayerSaved {
  TensorId x_in, rsqrt1, h1, n1, q_rot, k_rep, v_rep, attn, lse, attn_t, x_mid, rsqrt2, h2, n2,
      gate, up, act, prod;
  // amp: the projections' saved bf16 operands; math attention: the scaled q and k and the
  // probabilities; fused attention under amp: the bf16 copies of q and k.
  Linear lq, lk, lv, lo, lg, lu, ld;
  TensorId q_s = 0, k_s = 0, probs = 0, q_att = 0, k_att = 0;
};

struct NormSaved {
  TensorId rsqrt, h, n;
};

class Builder {
 public:
  Builder(const SynthOptions& options, const ModelShape& shape, uint32_t micro_batch_size,
          uint32_t seq)
      : opt_(options), shape_(shape) {
    const bool fp32 = options.dtype == SynthDtype::fp32;
    amp_ = options.dtype == SynthDtype::amp;
    attention_ = resolve_attention(options.attention, options.dtype);
    sdpa_name_ =
        attention_ == SynthAttention::efficient ? "aten::_scaled_dot_product_efficient_attention"
        : attention_ == SynthAttention::flash   ? "aten::_scaled_dot_product_flash_attention"
                                                : "aten::_scaled_dot_product_cudnn_attention";
    sdpa_backward_name_ = sdpa_name_ + "_backward";
    // Element bytes: compute (matmul and attention outputs, the MLP), residual stream and norms,
    // parameters with their gradients and AdamW states.
    elt_ = fp32 ? 4 : 2;
    res_elt_ = fp32 || amp_ ? 4 : 2;
    param_elt_ = res_elt_;
    double tflops =
        options.gpu_tflops > 0 ? options.gpu_tflops : (fp32 ? kFp32Tflops : kTensorCoreTflops);
    peak_flops_ = tflops * 1e12;
    hbm_bytes_per_s_ = options.hbm_gbps * 1e9 * options.hbm_efficiency;
    mb_ = micro_batch_size;
    seq_ = seq;
    tokens_ = uint64_t{micro_batch_size} * seq;
    head_dim_ = shape.d_model / shape.heads;
    kv_dim_ = uint64_t{head_dim_} * shape.kv_heads;
  }

  Trace build() {
    make_params();
    const uint64_t kernels_per_layer = 120;
    trace_.reserve_kernels(
        kernels_per_layer * shape_.layers * micro_batches() + 16 * params_.size(),
        kernels_per_layer * shape_.layers * micro_batches() * 4);
    zero_grad();
    for (uint32_t m = 0; m < micro_batches(); ++m) micro_batch(m);
    if (!opt_.step_in_backward) optimizer_step();
    if (!opt_.persistent_gradients) {
      // zero_grad(set_to_none=True) after optimizer.step() frees the gradients, so each one is
      // held to the end of the iteration, past its last use in the optimizer.
      const KernelIndex end = static_cast<KernelIndex>(trace_.num_kernels() - 1);
      for (const Param& p : params_) {
        trace_.tensors[p.grad].alive_until = end;
      }
    }
    if (opt_.recomputable) mark_producers();
    trace_.writes_recorded = true;  // every in-place kernel says what it writes (written())
    return std::move(trace_);
  }

 private:
  uint32_t micro_batches() const { return opt_.micro_batches; }

  // Every non-persistent tensor's producer is its first kernel. As a Session's recorder marks them
  // (Note [Recomputable tensors]), an activation, or a temporary made by the forward pass (the
  // recorder reruns no operator the backward pass runs: Note [Rerunnable operators]), is
  // recomputable when rerunning that kernel gives
  // it back: the kernel is not in place (no trailing '_'), no in-place kernel touches the tensor
  // afterwards, and the tensor is what the operator returns, not a value made inside it (the math
  // attention's probabilities) unless one step of the operator made it from tensors that exist
  // before it (autocast's casts), which that step alone makes again (recompute_inputs, as the
  // Session's Note [Nested producers] says). Nothing here draws random numbers or aliases.
  // Whether recomputing is worth its time, and whether the producer's inputs are still there, is
  // the planner's to decide.
  void mark_producers() {
    const size_t nt = trace_.num_tensors();
    constexpr KernelIndex kNone = UINT32_MAX;
    std::vector<KernelIndex> first(nt, kNone);
    std::vector<uint8_t> mutated(nt, 0);
    for (KernelIndex k = 0; k < trace_.num_kernels(); ++k) {
      const bool in_place = trace_.kernel_name(k).ends_with('_');
      for (TensorId t : trace_.kernel_tensors(k)) {
        if (first[t] == kNone) {
          first[t] = k;
        } else if (in_place) {
          mutated[t] = 1;
        }
      }
    }
    for (TensorId t = 0; t < nt; ++t) {
      TensorInfo& info = trace_.tensors[t];
      if (info.persistent || first[t] == kNone) continue;
      info.producer = first[t];
      const bool kind_ok = info.kind == TensorKind::activation ||
                           (info.kind == TensorKind::temporary && forward_kernel_[first[t]]);
      info.recomputable = kind_ok && !internal_[t] &&
                          !trace_.kernel_name(first[t]).ends_with('_') && !mutated[t];
      auto nested = nested_.find(t);
      if (info.kind == TensorKind::activation && internal_[t] && nested != nested_.end() && !mutated[t]) {
        info.recomputable = true;
        info.recompute_inputs = nested->second.inputs;
        info.recompute_us = std::min(nested->second.us, trace_.kernel_time_us(first[t]));
      }
    }
  }

  // ---- tensors and kernels ----------------------------------------------------------------------
  TensorId tensor(std::string name, uint64_t bytes, TensorKind kind, bool persistent = false) {
    TensorInfo info;
    info.bytes = bytes;
    info.kind = kind;
    info.persistent = persistent;
    info.name = std::move(name);
    internal_.push_back(composite_.active ? 1 : 0);
    return trace_.add_tensor(std::move(info));
  }
  TensorId act(const std::string& name, uint64_t bytes) {
    return tensor(prefix_ + name, bytes, TensorKind::activation);
  }
  TensorId tmp(const std::string& name, uint64_t bytes) {
    return tensor(prefix_ + name, bytes, TensorKind::temporary);
  }

  double kernel_time_us(OpClass cls, double flops, double bytes) const {
    double eff = cls == OpClass::attention ? opt_.attention_efficiency : opt_.matmul_efficiency;
    double compute_s = flops / (peak_flops_ * eff);
    double memory_s = bytes / hbm_bytes_per_s_;
    return std::max(compute_s, memory_s) * 1e6 + opt_.launch_overhead_us;
  }

  // A kernel touching `ids`; its memory traffic is the bytes of those tensors unless given.
  void op(std::string_view name, OpClass cls, double flops, std::span<const TensorId> ids,
          double bytes = -1) {
    if (bytes < 0) {
      bytes = 0;
      for (TensorId t : ids) bytes += static_cast<double>(trace_.tensors[t].bytes);
    }
    const double us = kernel_time_us(cls, flops, bytes);
    if (composite_.active) {  // one step of an operator being built: its time and tensors add up
      // A value this step makes from tensors that exist before the operator (autocast's casts) can
      // be made again by this step alone (TensorInfo::recompute_inputs; docs/synth.md).
      std::vector<TensorId> made, inputs;
      bool from_outside = !name.ends_with('_');
      for (TensorId t : ids) {
        if (internal_[t] && std::find(composite_.ids.begin(), composite_.ids.end(), t) == composite_.ids.end())
          made.push_back(t);
        else if (internal_[t])
          from_outside = false;
        else
          inputs.push_back(t);
      }
      if (from_outside)
        for (TensorId t : made) nested_.emplace(t, Nested{inputs, us});
      composite_.us += us;
      for (TensorId t : ids) {
        if (std::find(composite_.ids.begin(), composite_.ids.end(), t) == composite_.ids.end())
          composite_.ids.push_back(t);
      }
      return;
    }
    add_kernel(name, us, ids);
  }

  // Note [Writes in place in synth]: an in-place kernel (its name ends in '_') names what it writes
  // with written() just before it is made (in an operator being built, before its end): the
  // gradients zero_ clears and add_ accumulates into, the optimizer's parameters and AdamW states
  // and its denominators, the attention scores the causal bias is added to. The trace records these
  // writes (writes_recorded), so a tensor read back and not written since may be offloaded again
  // without writing (Note [Clean offloads] in src/trace/plan_check.cpp): a parameter between the
  // forward and the backward, and after the backward up to the optimizer. Out-of-place kernels
  // write only the tensors they make, which is not a write in place.
  void written(std::span<const TensorId> ids) {
    pending_writes_.insert(pending_writes_.end(), ids.begin(), ids.end());
  }
  void written(std::initializer_list<TensorId> ids) {
    written(std::span<const TensorId>(ids.begin(), ids.size()));
  }
  void add_kernel(std::string_view name, double us, std::span<const TensorId> ids) {
    const auto k = static_cast<KernelIndex>(trace_.num_kernels());
    trace_.add_kernel(name, us, ids);
    forward_kernel_.push_back(forward_ ? 1 : 0);
    for (TensorId t : pending_writes_) {
      std::vector<KernelIndex>& w = trace_.tensors[t].written_at;
      if (w.empty() || w.back() != k) w.push_back(k);
    }
    pending_writes_.clear();
  }

  // One ATen operator that runs several kernels (aten::linear under autocast: the casts, then the
  // matmul): the ops between begin and end become one kernel of their summed time that touches
  // all their tensors. The tensors made in between are values made inside the operator (not
  // recomputable by rerunning it) except `outputs`, what it returns.
  void begin_operator(std::string name) { composite_ = Composite{std::move(name), 0, {}, true}; }
  void end_operator(std::initializer_list<TensorId> outputs) {
    composite_.active = false;
    for (TensorId t : outputs) internal_[t] = 0;
    add_kernel(composite_.name, composite_.us, composite_.ids);
  }
  void op(std::string_view name, OpClass cls, double flops, std::initializer_list<TensorId> ids,
          double bytes = -1) {
    op(name, cls, flops, std::span<const TensorId>(ids.begin(), ids.size()), bytes);
  }
  // Memory-bound elementwise/reduction kernel: one FLOP per element of its tensors.
  void ew(std::string_view name, std::initializer_list<TensorId> ids) {
    double elements = 0;
    for (TensorId t : ids) elements += static_cast<double>(trace_.tensors[t].bytes) / elt_;
    op(name, OpClass::memory, elements, ids);
  }
  void mm(double m, double k, double n, std::initializer_list<TensorId> ids) {
    op("aten::mm", OpClass::matmul, 2 * m * k * n, ids);
  }

  // A kernel that produces the gradient of `p` from `inputs`. The first producer of the iteration
  // writes .grad directly when gradients are not persistent (AccumulateGrad steals the tensor);
  // otherwise the result goes to a temporary that `add_` accumulates into .grad.
  void grad_op(std::string_view name, OpClass cls, double flops,
               std::initializer_list<TensorId> inputs, Param& p) {
    std::vector<TensorId> ids(inputs);
    if (!opt_.persistent_gradients && !p.grad_written) {
      ids.push_back(p.grad);
      op(name, cls, flops, ids);
    } else {
      TensorId g = tmp(trace_.tensors[p.param].name + ".grad_part", p.bytes);
      ids.push_back(g);
      op(name, cls, flops, ids);
      written({p.grad});
      ew("aten::add_", {p.grad, g});
    }
    p.grad_written = true;
    // Session.watch(..., step_in_backward=True): the parameter's update runs from its
    // post-accumulate-grad hook once its gradient is complete (one micro-batch: checked).
    if (opt_.step_in_backward && ++p.grads_made == p.grad_kernels) adamw_update(p);
  }

  // Backward of a projection y = x·Wᵀ with x of `in` and y of `out` features: the input gradient
  // dx = dy·W goes to a new temporary `name` of `bytes`, then dW = dyᵀ·x.
  TensorId linear_backward(const std::string& name, uint64_t bytes, TensorId grad_out,
                           TensorId input, double in, double out, Param& w) {
    const double t = static_cast<double>(tokens_);
    TensorId grad_in = tmp(name, bytes);
    mm(t, out, in, {grad_out, w.param, grad_in});
    grad_op("aten::mm", OpClass::matmul, 2 * t * in * out, {grad_out, input}, w);
    return grad_in;
  }

  // The same for a projection made by linear(): under amp both matmuls run in bf16 on the saved
  // copies, the weight gradient is cast to fp32 (AccumulateGrad of the fp32 parameter) and, when
  // the input was fp32, so is the input gradient. `grad_out` is in the compute type.
  TensorId linear_backward(const std::string& name, TensorId grad_out, const Linear& l, double in,
                           double out, Param& w) {
    const uint64_t bytes = tokens_ * static_cast<uint64_t>(in) * elt_;
    if (!amp_) return linear_backward(name, bytes, grad_out, l.input, in, out, w);
    const double t = static_cast<double>(tokens_);
    TensorId grad_in = tmp(name, bytes);
    mm(t, out, in, {grad_out, l.weight, grad_in});
    TensorId gw = tmp(trace_.tensors[w.param].name + ".grad_bf16", w.bytes / 2);
    mm(out, t, in, {grad_out, l.input, gw});
    grad_op("aten::_to_copy", OpClass::memory, 0, {gw}, w);
    if (!l.cast_input) return grad_in;
    TensorId g32 = tmp(name + "_fp32", bytes * 2);
    ew("aten::_to_copy", {grad_in, g32});
    return g32;
  }

  // y = x·Wᵀ into `out` (an activation when `saved`). Under amp one aten::linear: autocast casts the
  // weight and an fp32 input to bf16 and autograd keeps those copies for the backward; rerunning
  // the operator needs x and the fp32 weight.
  Linear linear(const std::string& name, TensorId x, double in, double out, Param& w, bool saved) {
    const double t = static_cast<double>(tokens_);
    Linear l;
    l.input = x;
    l.weight = w.param;
    if (amp_) {
      begin_operator("aten::linear");
      l.weight = act(name + ".weight_bf16", w.bytes / 2);
      ew("aten::_to_copy", {w.param, l.weight});
      l.cast_input = trace_.tensors[x].bytes == tokens_ * static_cast<uint64_t>(in) * 4;
      if (l.cast_input) {
        l.input = act(name + ".input_bf16", tokens_ * static_cast<uint64_t>(in) * 2);
        ew("aten::_to_copy", {x, l.input});
      }
    }
    const uint64_t bytes = tokens_ * static_cast<uint64_t>(out) * elt_;
    l.out = saved ? act(name, bytes) : tmp(name, bytes);
    mm(t, in, out, {l.input, l.weight, l.out});
    if (amp_) end_operator({l.out});
    return l;
  }

  // ---- model ------------------------------------------------------------------------------------
  void param(const std::string& name, uint64_t elements) {
    Param p;
    p.bytes = elements * param_elt_;
    p.param = tensor(name, p.bytes, TensorKind::parameter, true);
    p.grad = tensor(name + ".grad", p.bytes, TensorKind::gradient, opt_.persistent_gradients);
    p.exp_avg = tensor(name + ".exp_avg", p.bytes, TensorKind::optimizer_state, true);
    p.exp_avg_sq = tensor(name + ".exp_avg_sq", p.bytes, TensorKind::optimizer_state, true);
    params_.push_back(p);  // pointers into params_ are taken once it stops growing
  }

  void make_params() {
    const uint64_t d = shape_.d_model, f = shape_.ffn, v = shape_.vocab;
    params_.reserve(9 * shape_.layers + 3);
    param("embed", v * d);
    for (uint32_t l = 0; l < shape_.layers; ++l) {
      std::string p = fmt::format("layers.{}.", l);
      param(p + "attn_norm", d);
      param(p + "attn.wq", d * d);
      param(p + "attn.wk", d * kv_dim_);
      param(p + "attn.wv", d * kv_dim_);
      param(p + "attn.wo", d * d);
      param(p + "mlp_norm", d);
      param(p + "mlp.w_gate", d * f);
      param(p + "mlp.w_up", d * f);
      param(p + "mlp.w_down", f * d);
    }
    param("norm", d);
    if (!shape_.tied_embeddings) param("lm_head", v * d);
    embed_ = &params_[0];
    for (uint32_t l = 0; l < shape_.layers; ++l) {
      Param* b = &params_[1 + 9 * l];
      layers_.push_back({b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7, b + 8});
    }
    final_norm_ = &params_[1 + 9 * shape_.layers];
    lm_head_ = shape_.tied_embeddings ? embed_ : &params_[2 + 9 * shape_.layers];
    if (shape_.tied_embeddings) embed_->grad_kernels = 2;  // the LM head's and the embedding's
    inv_freq_ = tensor("rope.inv_freq", head_dim_ / 2 * 4, TensorKind::other, true);
  }

  void zero_grad() {
    if (!opt_.persistent_gradients) return;  // set_to_none: no kernels
    if (opt_.foreach) {
      std::vector<TensorId> grads;
      for (const Param& p : params_) grads.push_back(p.grad);
      written(grads);
      op("aten::_foreach_zero_", OpClass::memory, 0, grads);
    } else {
      for (const Param& p : params_) {
        written({p.grad});
        op("aten::zero_", OpClass::memory, 0, {p.grad});
      }
    }
  }

  // RMSNorm as HF Llama runs it: x * rsqrt(mean(x^2) + eps) * w.
  NormSaved norm_forward(const std::string& name, TensorId x, Param& w) {
    const uint64_t bd = tokens_ * shape_.d_model * res_elt_, bs = tokens_ * 4;
    TensorId pw = tmp(name + ".pow", bd);
    ew("aten::pow", {x, pw});
    TensorId mean = tmp(name + ".mean", bs);
    ew("aten::mean", {pw, mean});
    TensorId var = tmp(name + ".var_eps", bs);
    ew("aten::add", {mean, var});
    NormSaved s;
    s.rsqrt = act(name + ".rsqrt", bs);
    ew("aten::rsqrt", {var, s.rsqrt});
    s.h = act(name + ".normed", bd);
    ew("aten::mul", {x, s.rsqrt, s.h});
    // Under amp the projections keep their own bf16 copies of the output, not the output.
    s.n = amp_ ? tmp(name + ".out", bd) : act(name + ".out", bd);
    ew("aten::mul", {w.param, s.h, s.n});
    return s;
  }

  // Backward of norm_forward given the gradient of its output; returns the gradient of x (without
  // the residual path).
  TensorId norm_backward(const std::string& name, TensorId g, TensorId x, const NormSaved& s,
                         Param& w) {
    const uint64_t bd = tokens_ * shape_.d_model * res_elt_, bs = tokens_ * 4;
    TensorId gh = tmp(name + ".grad_normed", bd);
    ew("aten::mul", {g, w.param, gh});
    TensorId gw = tmp(name + ".grad_w_prod", bd);
    ew("aten::mul", {g, s.h, gw});
    grad_op("aten::sum", OpClass::memory, static_cast<double>(tokens_ * shape_.d_model), {gw}, w);
    TensorId ga = tmp(name + ".grad_x_a", bd);
    ew("aten::mul", {gh, s.rsqrt, ga});
    TensorId gx = tmp(name + ".grad_rsqrt_prod", bd);
    ew("aten::mul", {gh, x, gx});
    TensorId gr = tmp(name + ".grad_rsqrt", bs);
    ew("aten::sum", {gx, gr});
    TensorId r3 = tmp(name + ".rsqrt_cubed", bs);
    ew("aten::pow", {s.rsqrt, r3});
    TensorId gv1 = tmp(name + ".grad_var_a", bs);
    ew("aten::mul", {gr, r3, gv1});
    TensorId gv = tmp(name + ".grad_var", bs);
    ew("aten::mul", {gv1, gv});
    TensorId gp = tmp(name + ".grad_pow", bd);
    ew("aten::div", {gv, gp});
    TensorId x2 = tmp(name + ".two_x", bd);
    ew("aten::mul", {x, x2});
    TensorId gb = tmp(name + ".grad_x_b", bd);
    ew("aten::mul", {gp, x2, gb});
    TensorId gxn = tmp(name + ".grad_x", bd);
    ew("aten::add", {ga, gb, gxn});
    return gxn;
  }

  // Rotary embedding: x*cos + rotate_half(x)*sin. Returns the rotated tensor (an activation when
  // `saved`). `bytes` is the result's size; under amp x is bf16 and the tables fp32, so the
  // products and the result are fp32 (type promotion) while the rotate-half copies stay bf16.
  TensorId rope_forward(const std::string& name, TensorId x, uint64_t bytes, bool saved) {
    const uint64_t in_bytes = trace_.tensors[x].bytes;
    TensorId a = tmp(name + ".cos_term", bytes);
    ew("aten::mul", {x, cos_, a});
    TensorId ng = tmp(name + ".neg_half", in_bytes / 2);
    ew("aten::neg", {x, ng});
    TensorId rot = tmp(name + ".rotated", in_bytes);
    ew("aten::cat", {ng, x, rot});
    TensorId b = tmp(name + ".sin_term", bytes);
    ew("aten::mul", {rot, sin_, b});
    TensorId out = saved ? act(name + ".rope", bytes) : tmp(name + ".rope", bytes);
    ew("aten::add", {a, b, out});
    return out;
  }

  // The gradient of the rotary input from `g` (the result's gradient, of `bytes`); under amp cast
  // to bf16 (`out_bytes`) at the end, the input's type.
  TensorId rope_backward(const std::string& name, TensorId g, uint64_t bytes, uint64_t out_bytes) {
    TensorId a = tmp(name + ".grad_cos_term", bytes);
    ew("aten::mul", {g, cos_, a});
    TensorId b = tmp(name + ".grad_sin_term", bytes);
    ew("aten::mul", {g, sin_, b});
    TensorId ng = tmp(name + ".grad_neg_half", bytes / 2);
    ew("aten::neg", {b, ng});
    TensorId s1 = tmp(name + ".grad_slice_a", bytes);
    ew("aten::slice_backward", {ng, s1});
    TensorId s2 = tmp(name + ".grad_slice_b", bytes);
    ew("aten::slice_backward", {b, s2});
    TensorId r = tmp(name + ".grad_rotated", bytes);
    ew("aten::add", {s1, s2, r});
    TensorId out = tmp(name + ".grad_pre_rope", bytes);
    ew("aten::add", {a, r, out});
    if (out_bytes == bytes) return out;
    TensorId cast = tmp(name + ".grad_pre_rope_bf16", out_bytes);
    ew("aten::_to_copy", {out, cast});
    return cast;
  }

  double attention_flops_forward() const {
    // Causal: half of QK^T and PV, 2 FLOPs per multiply-add.
    return 2.0 * mb_ * shape_.heads * static_cast<double>(seq_) * seq_ * head_dim_;
  }

  // Under amp, a gradient of the fp32 residual stream cast to bf16 where it enters a projection
  // that produced bf16 (autograd's backward of the type promotion in the residual add).
  TensorId to_compute(const std::string& name, TensorId g) {
    if (!amp_) return g;
    TensorId c = tmp(name, trace_.tensors[g].bytes / 2);
    ew("aten::_to_copy", {g, c});
    return c;
  }

  // The math path of scaled_dot_product_attention, one operator: K and V repeated to every head, q
  // and k scaled, the full (not causal-halved) scores through a causal bias and softmax, the
  // probabilities saved; then the output made token-major.
  void math_attention_forward(const std::string& L, LayerSaved& s, TensorId k_rot) {
    const uint64_t bd = tokens_ * shape_.d_model * elt_, bkv = tokens_ * kv_dim_ * elt_;
    const uint64_t scores_bytes = uint64_t{mb_} * shape_.heads * seq_ * seq_ * elt_;
    begin_operator("aten::scaled_dot_product_attention");
    TensorId q_in = s.q_rot, k_in = k_rot;
    if (amp_) {
      q_in = tmp(L + "attn.q_bf16", bd);
      ew("aten::_to_copy", {s.q_rot, q_in});
      k_in = tmp(L + "attn.k_bf16", bkv);
      ew("aten::_to_copy", {k_rot, k_in});
    }
    TensorId k_rep = tmp(L + "attn.k_repeated", bd);
    ew("aten::repeat_interleave", {k_in, k_rep});
    s.v_rep = act(L + "attn.v_repeated", bd);
    ew("aten::repeat_interleave", {s.lv.out, s.v_rep});
    s.q_s = act(L + "attn.q_scaled", bd);
    ew("aten::mul", {q_in, s.q_s});
    s.k_s = act(L + "attn.k_scaled", bd);
    ew("aten::mul", {k_rep, s.k_s});
    TensorId scores = tmp(L + "attn.scores", scores_bytes);
    op("aten::bmm", OpClass::matmul, attention_flops_forward(), {s.q_s, s.k_s, scores});
    TensorId bias = tmp(L + "attn.causal_bias", uint64_t{seq_} * seq_ * elt_);
    ew("aten::masked_fill", {bias});
    written({scores});
    ew("aten::add_", {scores, bias});
    s.probs = act(L + "attn.probs", scores_bytes);
    ew("aten::_softmax", {scores, s.probs});
    s.attn = tmp(L + "attn.sdpa_out", bd);
    op("aten::bmm", OpClass::matmul, attention_flops_forward(), {s.probs, s.v_rep, s.attn});
    end_operator({s.attn});
    s.attn_t = act(L + "attn.sdpa_out_t", bd);
    ew("aten::clone", {s.attn, s.attn_t});
  }

  TensorId layer_forward(uint32_t l, TensorId x, LayerParams& p, LayerSaved& s) {
    const double d = shape_.d_model, f = shape_.ffn;
    const double kvd = static_cast<double>(kv_dim_);
    const uint64_t bd = tokens_ * shape_.d_model * elt_, bkv = tokens_ * kv_dim_ * elt_,
                   bf = tokens_ * shape_.ffn * elt_;
    // The residual stream and the rotary results (fp32 under amp: fp32 tables times bf16 q, k).
    const uint64_t br = tokens_ * shape_.d_model * res_elt_, bkv_r = tokens_ * kv_dim_ * res_elt_;
    const bool fused = attention_ == SynthAttention::fused,
               math = attention_ == SynthAttention::math;
    const std::string L = fmt::format("layers.{}.", l);
    s.x_in = x;
    NormSaved n1 = norm_forward(L + "attn_norm", x, *p.attn_norm);
    s.rsqrt1 = n1.rsqrt, s.h1 = n1.h, s.n1 = n1.n;
    s.lq = linear(L + "attn.q", s.n1, d, d, *p.wq, false);
    s.lk = linear(L + "attn.k", s.n1, d, kvd, *p.wk, false);
    s.lv = linear(L + "attn.v", s.n1, d, kvd, *p.wv, fused);  // fused attention saves v as it is
    // The attention kernel saves its q and k, unless autocast's bf16 copies (fused) or the scaled
    // copies (math) are what it keeps.
    s.q_rot = rope_forward(L + "attn.q", s.lq.out, br, !math && !(fused && amp_));
    TensorId k_rot = rope_forward(L + "attn.k", s.lk.out, bkv_r, fused && !amp_);
    if (fused) {
      s.q_att = s.q_rot, s.k_att = k_rot;
      if (amp_) {  // autocast's casts inside scaled_dot_product_attention
        begin_operator(sdpa_name_);
        s.q_att = act(L + "attn.q_bf16", bd);
        ew("aten::_to_copy", {s.q_rot, s.q_att});
        s.k_att = act(L + "attn.k_bf16", bkv);
        ew("aten::_to_copy", {k_rot, s.k_att});
      }
      s.attn = act(L + "attn.sdpa_out", bd);
      s.lse = act(L + "attn.logsumexp", tokens_ * shape_.heads * 4);
      op(sdpa_name_, OpClass::attention, attention_flops_forward(),
         {s.q_att, s.k_att, s.lv.out, s.attn, s.lse});
      if (amp_) end_operator({s.attn, s.lse});
      s.attn_t = s.attn;  // already token-major
    } else if (math) {
      math_attention_forward(L, s, k_rot);
    } else {
      s.k_rep = act(L + "attn.k_repeated", bd);
      ew("aten::clone", {k_rot, s.k_rep});
      s.v_rep = act(L + "attn.v_repeated", bd);
      ew("aten::clone", {s.lv.out, s.v_rep});
      s.attn = act(L + "attn.sdpa_out", bd);
      s.lse = act(L + "attn.logsumexp", tokens_ * shape_.heads * 4);
      op(sdpa_name_, OpClass::attention, attention_flops_forward(),
         {s.q_rot, s.k_rep, s.v_rep, s.attn, s.lse});
      s.attn_t = act(L + "attn.sdpa_out_t", bd);
      ew("aten::clone", {s.attn, s.attn_t});
    }
    s.lo = linear(L + "attn.o", s.attn_t, d, d, *p.wo, false);
    s.x_mid = act(L + "residual_mid", br);
    ew("aten::add", {x, s.lo.out, s.x_mid});
    NormSaved n2 = norm_forward(L + "mlp_norm", s.x_mid, *p.mlp_norm);
    s.rsqrt2 = n2.rsqrt, s.h2 = n2.h, s.n2 = n2.n;
    s.lg = linear(L + "mlp.gate", s.n2, d, f, *p.w_gate, true);
    s.gate = s.lg.out;
    s.lu = linear(L + "mlp.up", s.n2, d, f, *p.w_up, true);
    s.up = s.lu.out;
    s.act = act(L + "mlp.silu", bf);
    ew("aten::silu", {s.gate, s.act});
    s.prod = act(L + "mlp.prod", bf);
    ew("aten::mul", {s.act, s.up, s.prod});
    s.ld = linear(L + "mlp.down", s.prod, f, d, *p.w_down, false);
    TensorId out = act(L + "residual_out", br);
    ew("aten::add", {s.x_mid, s.ld.out, out});
    return out;
  }

  // g: gradient of the layer's output. Returns the gradient of its input.
  TensorId layer_backward(uint32_t l, TensorId g, LayerParams& p, const LayerSaved& s) {
    const double d = shape_.d_model, f = shape_.ffn;
    const double kvd = static_cast<double>(kv_dim_);
    const uint64_t bd = tokens_ * shape_.d_model * elt_, bkv = tokens_ * kv_dim_ * elt_,
                   bf = tokens_ * shape_.ffn * elt_;
    const uint64_t br = tokens_ * shape_.d_model * res_elt_, bkv_r = tokens_ * kv_dim_ * res_elt_;
    const std::string L = fmt::format("layers.{}.", l);
    // MLP
    TensorId g_prod = linear_backward(
        L + "mlp.grad_prod", to_compute(L + "grad_residual_out_bf16", g), s.ld, f, d, *p.w_down);
    TensorId g_act = tmp(L + "mlp.grad_silu", bf);
    ew("aten::mul", {g_prod, s.up, g_act});
    TensorId g_up = tmp(L + "mlp.grad_up", bf);
    ew("aten::mul", {g_prod, s.act, g_up});
    TensorId g_gate = tmp(L + "mlp.grad_gate", bf);
    ew("aten::silu_backward", {g_act, s.gate, g_gate});
    TensorId g_n2a = linear_backward(L + "mlp.grad_norm_out_up", g_up, s.lu, d, f, *p.w_up);
    TensorId g_n2b = linear_backward(L + "mlp.grad_norm_out_gate", g_gate, s.lg, d, f, *p.w_gate);
    TensorId g_n2 = tmp(L + "mlp_norm.grad_out", br);
    ew("aten::add", {g_n2a, g_n2b, g_n2});
    TensorId g_mid_n =
        norm_backward(L + "mlp_norm", g_n2, s.x_mid, {s.rsqrt2, s.h2, s.n2}, *p.mlp_norm);
    TensorId g_mid = tmp(L + "grad_residual_mid", br);
    ew("aten::add", {g, g_mid_n, g_mid});
    // Attention
    TensorId g_attn =
        linear_backward(L + "attn.grad_sdpa_out", to_compute(L + "grad_residual_mid_bf16", g_mid),
                        s.lo, d, d, *p.wo);
    TensorId g_q = 0, g_k = 0, g_v = 0, g_krep = 0, g_vrep = 0;
    if (attention_ == SynthAttention::fused) {
      g_q = tmp(L + "attn.grad_q_rope", bd);
      g_k = tmp(L + "attn.grad_k_rope", bkv);
      g_v = tmp(L + "attn.grad_v", bkv);
      op(sdpa_backward_name_, OpClass::attention, 2.5 * attention_flops_forward(),
         {g_attn, s.q_att, s.k_att, s.lv.out, s.attn, s.lse, g_q, g_k, g_v});
    } else if (attention_ == SynthAttention::math) {
      const uint64_t scores_bytes = uint64_t{mb_} * shape_.heads * seq_ * seq_ * elt_;
      TensorId g_probs = tmp(L + "attn.grad_probs", scores_bytes);
      op("aten::bmm", OpClass::matmul, attention_flops_forward(), {g_attn, s.v_rep, g_probs});
      g_vrep = tmp(L + "attn.grad_v_repeated", bd);
      op("aten::bmm", OpClass::matmul, attention_flops_forward(), {s.probs, g_attn, g_vrep});
      TensorId g_scores = tmp(L + "attn.grad_scores", scores_bytes);
      ew("aten::_softmax_backward_data", {g_probs, s.probs, g_scores});
      TensorId g_qs = tmp(L + "attn.grad_q_scaled", bd);
      op("aten::bmm", OpClass::matmul, attention_flops_forward(), {g_scores, s.k_s, g_qs});
      TensorId g_ks = tmp(L + "attn.grad_k_scaled", bd);
      op("aten::bmm", OpClass::matmul, attention_flops_forward(), {g_scores, s.q_s, g_ks});
      g_q = tmp(L + "attn.grad_q_rope", bd);
      ew("aten::mul", {g_qs, g_q});
      g_krep = tmp(L + "attn.grad_k_repeated", bd);
      ew("aten::mul", {g_ks, g_krep});
    } else {
      g_q = tmp(L + "attn.grad_q_rope", bd);
      g_krep = tmp(L + "attn.grad_k_repeated", bd);
      g_vrep = tmp(L + "attn.grad_v_repeated", bd);
      op(sdpa_backward_name_, OpClass::attention, 2.5 * attention_flops_forward(),
         {g_attn, s.q_rot, s.k_rep, s.v_rep, s.attn, s.lse, g_q, g_krep, g_vrep});
    }
    if (attention_ != SynthAttention::fused) {  // K and V were repeated to every head: sum back
      g_k = tmp(L + "attn.grad_k_rope", bkv);
      ew("aten::sum", {g_krep, g_k});
      g_v = tmp(L + "attn.grad_v", bkv);
      ew("aten::sum", {g_vrep, g_v});
    }
    if (amp_) {  // back through autocast's casts of the rotary results to their fp32
      TensorId q32 = tmp(L + "attn.grad_q_rope_fp32", br);
      ew("aten::_to_copy", {g_q, q32});
      g_q = q32;
      TensorId k32 = tmp(L + "attn.grad_k_rope_fp32", bkv_r);
      ew("aten::_to_copy", {g_k, k32});
      g_k = k32;
    }
    TensorId g_qp = rope_backward(L + "attn.q", g_q, br, bd);
    TensorId g_kp = rope_backward(L + "attn.k", g_k, bkv_r, bkv);
    TensorId g_n1v = linear_backward(L + "attn.grad_norm_out_v", g_v, s.lv, d, kvd, *p.wv);
    TensorId g_n1k = linear_backward(L + "attn.grad_norm_out_k", g_kp, s.lk, d, kvd, *p.wk);
    TensorId g_n1q = linear_backward(L + "attn.grad_norm_out_q", g_qp, s.lq, d, d, *p.wq);
    TensorId g_n1a = tmp(L + "attn_norm.grad_out_vk", br);
    ew("aten::add", {g_n1v, g_n1k, g_n1a});
    TensorId g_n1 = tmp(L + "attn_norm.grad_out", br);
    ew("aten::add", {g_n1a, g_n1q, g_n1});
    TensorId g_in_n =
        norm_backward(L + "attn_norm", g_n1, s.x_in, {s.rsqrt1, s.h1, s.n1}, *p.attn_norm);
    TensorId g_in = tmp(L + "grad_residual_in", br);
    ew("aten::add", {g_mid, g_in_n, g_in});
    return g_in;
  }

  void micro_batch(uint32_t m) {
    prefix_ = fmt::format("mb{}.", m);
    const double t = static_cast<double>(tokens_), d = shape_.d_model, v = shape_.vocab;
    const uint64_t bd = tokens_ * shape_.d_model * res_elt_;  // the residual stream
    const uint64_t logits_bytes = tokens_ * shape_.vocab * elt_,
                   logits32 = tokens_ * shape_.vocab * 4;
    TensorId ids = tensor(prefix_ + "input_ids", tokens_ * 8, TensorKind::other);
    TensorId labels = tensor(prefix_ + "labels", tokens_ * 8, TensorKind::other);

    // Forward: embedding, rotary tables, layers, final norm, LM head, cross-entropy.
    forward_ = true;
    TensorId x = act("embed.out", bd);
    op("aten::embedding", OpClass::memory, 0, {embed_->param, ids, x},
       static_cast<double>(2 * bd + tokens_ * 8));
    TensorId pos = tmp("rope.position_ids", tokens_ * 8);
    ew("aten::arange", {pos});
    TensorId freqs = tmp("rope.freqs", tokens_ * head_dim_ / 2 * 4);
    op("aten::bmm", OpClass::matmul, t * head_dim_, {inv_freq_, pos, freqs});
    TensorId emb = tmp("rope.emb", tokens_ * head_dim_ * 4);
    ew("aten::cat", {freqs, emb});
    TensorId c0 = tmp("rope.cos_raw", tokens_ * head_dim_ * 4);
    ew("aten::cos", {emb, c0});
    cos_ = act("rope.cos", tokens_ * head_dim_ * res_elt_);
    ew("aten::mul", {c0, cos_});
    TensorId s0 = tmp("rope.sin_raw", tokens_ * head_dim_ * 4);
    ew("aten::sin", {emb, s0});
    sin_ = act("rope.sin", tokens_ * head_dim_ * res_elt_);
    ew("aten::mul", {s0, sin_});

    std::vector<LayerSaved> saved(shape_.layers);
    for (uint32_t l = 0; l < shape_.layers; ++l) x = layer_forward(l, x, layers_[l], saved[l]);

    NormSaved nf = norm_forward("norm", x, *final_norm_);
    const Linear head = linear("lm_head.logits", nf.n, d, v, *lm_head_, false);
    TensorId logits = head.out;
    if (elt_ != 4) {  // HF upcasts logits to fp32 for the loss
      TensorId l32 = tmp("lm_head.logits_fp32", logits32);
      ew("aten::_to_copy", {logits, l32});
      logits = l32;
    }
    TensorId shifted = act("loss.shifted_labels", tokens_ * 8);
    ew("aten::constant_pad_nd", {labels, shifted});
    TensorId logp = act("loss.log_probs", logits32);
    ew("aten::_log_softmax", {logits, logp});
    TensorId loss = tmp("loss.value", 4);
    op("aten::nll_loss_forward", OpClass::memory, t, {logp, shifted, loss}, t * 12);
    TensorId loss_scaled = tmp("loss.scaled", 4);
    ew("aten::div", {loss, loss_scaled});

    // Backward, in the order autograd runs it.
    forward_ = false;
    TensorId g1 = tmp("loss.grad_seed", 4);
    ew("aten::ones_like", {loss_scaled, g1});
    TensorId g2 = tmp("loss.grad", 4);
    ew("aten::div", {g1, g2});
    TensorId g_logp = tmp("loss.grad_log_probs", logits32);
    ew("aten::nll_loss_backward", {g2, shifted, g_logp});
    TensorId g_logits = tmp("lm_head.grad_logits", logits32);
    ew("aten::_log_softmax_backward_data", {g_logp, logp, g_logits});
    if (elt_ != 4) {
      TensorId ge = tmp("lm_head.grad_logits_lowp", logits_bytes);
      ew("aten::_to_copy", {g_logits, ge});
      g_logits = ge;
    }
    TensorId g_nf = linear_backward("norm.grad_out", g_logits, head, d, v, *lm_head_);
    TensorId g_xn = norm_backward("norm", g_nf, x, nf, *final_norm_);
    TensorId g = g_xn;
    for (uint32_t l = shape_.layers; l-- > 0;) g = layer_backward(l, g, layers_[l], saved[l]);
    grad_op("aten::embedding_dense_backward", OpClass::memory, 0, {g, ids}, *embed_);
    prefix_.clear();
  }

  void optimizer_step() {
    if (opt_.foreach) {
      std::vector<TensorId> params, grads, m1, m2, sqrt;
      for (const Param& p : params_) {
        params.push_back(p.param);
        grads.push_back(p.grad);
        m1.push_back(p.exp_avg);
        m2.push_back(p.exp_avg_sq);
        sqrt.push_back(
            tensor(trace_.tensors[p.param].name + ".denom", p.bytes, TensorKind::temporary));
      }
      auto cat = [](std::initializer_list<const std::vector<TensorId>*> lists) {
        std::vector<TensorId> all;
        for (auto* l : lists) all.insert(all.end(), l->begin(), l->end());
        return all;
      };
      auto group = [&](std::string_view name, const std::vector<TensorId>& ids) {
        double elements = 0;
        for (TensorId t : ids) elements += static_cast<double>(trace_.tensors[t].bytes) / elt_;
        op(name, OpClass::memory, elements, ids);
      };
      written(params);
      group("aten::_foreach_mul_", params);
      written(m1);
      group("aten::_foreach_lerp_", cat({&m1, &grads}));
      written(m2);
      group("aten::_foreach_mul_", m2);
      written(m2);
      group("aten::_foreach_addcmul_", cat({&m2, &grads}));
      group("aten::_foreach_sqrt", cat({&m2, &sqrt}));
      written(sqrt);
      group("aten::_foreach_div_", sqrt);
      written(sqrt);
      group("aten::_foreach_add_", sqrt);
      written(params);
      group("aten::_foreach_addcdiv_", cat({&params, &m1, &sqrt}));
      return;
    }
    // torch.optim.AdamW(foreach=False): _single_tensor_adamw, one parameter at a time.
    for (const Param& p : params_) adamw_update(p);
  }

  // One parameter's AdamW update: _single_tensor_adamw's 8 operators, or with --foreach the 8
  // foreach operators over that parameter alone (a step_in_backward hook's sub-group).
  void adamw_update(const Param& p) {
    const std::string name = trace_.tensors[p.param].name;  // a copy: tensor() below may reallocate
    const bool fe = opt_.foreach;
    written({p.param});
    ew(fe ? "aten::_foreach_mul_" : "aten::mul_", {p.param});  // decoupled weight decay
    written({p.exp_avg});
    ew(fe ? "aten::_foreach_lerp_" : "aten::lerp_", {p.exp_avg, p.grad});
    written({p.exp_avg_sq});
    ew(fe ? "aten::_foreach_mul_" : "aten::mul_", {p.exp_avg_sq});
    written({p.exp_avg_sq});
    ew(fe ? "aten::_foreach_addcmul_" : "aten::addcmul_", {p.exp_avg_sq, p.grad});
    // foreach: the square root is the denominator, divided and added to in place.
    TensorId root = tensor(name + (fe ? ".denom" : ".exp_avg_sq_sqrt"), p.bytes, TensorKind::temporary);
    ew(fe ? "aten::_foreach_sqrt" : "aten::sqrt", {p.exp_avg_sq, root});
    TensorId denom = root;
    if (!fe) {
      denom = tensor(name + ".denom", p.bytes, TensorKind::temporary);
      ew("aten::div", {root, denom});
    } else {
      written({denom});
      ew("aten::_foreach_div_", {denom});
    }
    written({denom});
    ew(fe ? "aten::_foreach_add_" : "aten::add_", {denom});
    written({p.param});
    ew(fe ? "aten::_foreach_addcdiv_" : "aten::addcdiv_", {p.param, p.exp_avg, denom});
  }

 private:
  std::string sdpa_name_, sdpa_backward_name_;
  const SynthOptions& opt_;
  const ModelShape& shape_;
  Trace trace_;
  uint64_t elt_ = 4;        // compute: matmul and attention outputs, the MLP
  uint64_t res_elt_ = 4;    // residual stream, norms, rotary tables
  uint64_t param_elt_ = 4;  // parameters, gradients, AdamW states
  bool amp_ = false;
  struct Composite {
    std::string name;
    double us = 0;
    std::vector<TensorId> ids;
    bool active = false;
  } composite_;  // the operator begin_operator() is building
  SynthAttention attention_ = SynthAttention::efficient;
  double peak_flops_ = 0, hbm_bytes_per_s_ = 0;
  uint32_t mb_ = 1, seq_ = 0, head_dim_ = 0;
  uint64_t tokens_ = 0, kv_dim_ = 0;
  std::vector<Param> params_;
  std::vector<LayerParams> layers_;
  Param *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
  TensorId inv_freq_ = 0, cos_ = 0, sin_ = 0;
  std::string prefix_;
  std::vector<uint8_t> internal_;  // per tensor: made inside an operator, not what it returns
  bool forward_ = false;                // kernels made now belong to a forward pass
  std::vector<uint8_t> forward_kernel_;  // per kernel: made by a forward pass
  // Values made inside an operator by one of its steps from tensors that exist before it: that
  // step's inputs and time (the step alone makes the value again).
  struct Nested {
    std::vector<TensorId> inputs;
    double us = 0;
  };
  std::map<TensorId, Nested> nested_;
  std::vector<TensorId> pending_writes_;  // written by the next kernel made (written())
};

std::string quoted(std::string_view s) {
  return fmt::format("\"{}\"", s);
}

}  // namespace

std::string_view to_string(SynthDtype dtype) {
  switch (dtype) {
    case SynthDtype::fp32:
      return "fp32";
    case SynthDtype::bf16:
      return "bf16";
    case SynthDtype::fp16:
      return "fp16";
    case SynthDtype::amp:
      return "amp";
  }
  return "fp32";
}

SynthDtype parse_synth_dtype(std::string_view text) {
  if (text == "fp32") return SynthDtype::fp32;
  if (text == "bf16") return SynthDtype::bf16;
  if (text == "fp16") return SynthDtype::fp16;
  if (text == "amp") return SynthDtype::amp;
  throw Error(fmt::format("--dtype: '{}' is not one of fp32, bf16, fp16, amp", text));
}

std::string_view to_string(SynthAttention attention) {
  switch (attention) {
    case SynthAttention::automatic:
      return "auto";
    case SynthAttention::efficient:
      return "efficient";
    case SynthAttention::flash:
      return "flash";
    case SynthAttention::fused:
      return "fused";
    case SynthAttention::math:
      return "math";
  }
  return "auto";
}

SynthAttention resolve_attention(SynthAttention attention, SynthDtype dtype) {
  if (attention != SynthAttention::automatic) return attention;
  return dtype == SynthDtype::fp32  ? SynthAttention::efficient
         : dtype == SynthDtype::amp ? SynthAttention::fused
                                    : SynthAttention::flash;
}

SynthAttention parse_synth_attention(std::string_view text) {
  for (SynthAttention a : {SynthAttention::automatic, SynthAttention::efficient,
                           SynthAttention::flash, SynthAttention::fused, SynthAttention::math}) {
    if (text == to_string(a)) return a;
  }
  throw Error(
      fmt::format("--attention: '{}' is not one of auto, efficient, flash, fused, math", text));
}

std::vector<std::string> synth_models() {
  std::vector<std::string> names;
  for (const auto& [name, canonical] : model_names("synth")) names.push_back(name);
  return names;
}

namespace {

// Synth's own names first; else any Llama-architecture entry of the table by its canonical name.
const ModelEntry& find_synth_model(std::string_view name) {
  try {
    return find_model("synth", name);
  } catch (const Error&) {
    for (const ModelEntry& m : model_table()) {
      if (m.name != name) continue;
      TERAIO_CHECK(m.arch == "llama",
                   "--model \"{}\": a {} model; synth traces Llama-architecture decoders only", name,
                   m.arch);
      return m;
    }
    std::string known;
    for (const auto& [n, c] : model_names("synth"))
      known += fmt::format("{}{} ({})", known.empty() ? "" : ", ", n, c);
    throw Error(fmt::format("--model \"{}\": unknown model (known: {}; and the model table's {})",
                            name, known, fmt::join(synth_table_models(), ", ")));
  }
}

}  // namespace

std::vector<std::string> synth_table_models() {
  std::vector<std::string> names;
  for (const ModelEntry& m : model_table()) {
    bool synth_name = false;
    for (const auto& [n, c] : model_names("synth")) synth_name |= c == m.name;
    if (m.arch == "llama" && !synth_name) names.push_back(m.name);
  }
  return names;
}

ModelShape model_shape(std::string_view name) {
  const ModelEntry& m = find_synth_model(name);
  const ModelIteration* it = synth_iteration(m.name);
  ModelShape s;
  s.name = std::string(name);
  s.canonical = m.name;
  s.layers = m.layers;
  s.d_model = m.d_model;
  s.heads = m.heads;
  s.kv_heads = m.kv_heads;
  s.ffn = m.ffn;
  s.vocab = m.vocab;
  s.tied_embeddings = m.tied_embeddings;
  // An entry the table gives no synth iteration: one sequence of its longest length.
  s.default_batch = it ? it->batch : 1;
  s.default_seq = it ? it->seq : m.max_seq;
  s.default_micro_batches = it ? it->micro_batches : 1;
  return s;
}

uint64_t parameter_count(const ModelShape& s) {
  const uint64_t d = s.d_model, kv = uint64_t{d / s.heads} * s.kv_heads;
  const uint64_t per_layer = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * s.ffn;
  return uint64_t{s.vocab} * d * (s.tied_embeddings ? 1 : 2) + s.layers * per_layer + d;
}

Trace synthesize(const SynthOptions& options) {
  ModelShape shape = model_shape(options.model);
  if (options.layers > 0) {
    TERAIO_CHECK(options.layers <= 4096, "--layers {} is more than 4096", options.layers);
    shape.layers = options.layers;
  }
  SynthOptions o = options;
  const uint32_t default_mb_size = shape.default_batch / shape.default_micro_batches;
  if (o.batch == 0) {
    o.batch = o.micro_batches ? o.micro_batches * default_mb_size : shape.default_batch;
  }
  if (o.seq == 0) o.seq = shape.default_seq;
  if (o.micro_batches == 0) o.micro_batches = std::min(shape.default_micro_batches, o.batch);
  TERAIO_CHECK(!o.step_in_backward || o.micro_batches == 1,
               "--step-in-backward updates each parameter during its backward, so it needs one "
               "micro-batch (gradient accumulation over {} is not possible); use --micro-batches 1",
               o.micro_batches);
  TERAIO_CHECK(o.batch % o.micro_batches == 0, "--batch {} is not a multiple of --micro-batches {}",
               o.batch, o.micro_batches);
  TERAIO_CHECK(o.gpu_tflops >= 0 && std::isfinite(o.gpu_tflops),
               "--gpu-tflops must be positive, got {}", o.gpu_tflops);
  TERAIO_CHECK(o.hbm_gbps > 0 && std::isfinite(o.hbm_gbps), "--hbm-gbps must be positive, got {}",
               o.hbm_gbps);
  for (double e : {o.matmul_efficiency, o.attention_efficiency, o.hbm_efficiency}) {
    TERAIO_CHECK(e > 0 && e <= 1, "efficiencies must be in (0, 1], got {}", e);
  }
  TERAIO_CHECK(o.launch_overhead_us >= 0 && std::isfinite(o.launch_overhead_us),
               "launch overhead must be >= 0 us, got {}", o.launch_overhead_us);
  TERAIO_CHECK(static_cast<uint64_t>(o.batch / o.micro_batches) * o.seq <= (1ull << 24),
               "micro-batch of {} x {} tokens is too large", o.batch / o.micro_batches, o.seq);

  Builder b(o, shape, o.batch / o.micro_batches, o.seq);
  Trace trace = b.build();
  trace.set_meta("model", quoted(shape.name));
  trace.set_meta("batch", fmt::format("{}", o.batch));
  trace.set_meta("seq", fmt::format("{}", o.seq));
  trace.set_meta("micro_batches", fmt::format("{}", o.micro_batches));
  trace.set_meta("layers", fmt::format("{}", shape.layers));
  trace.set_meta("dtype", quoted(to_string(o.dtype)));
  trace.set_meta("attention", quoted(to_string(resolve_attention(o.attention, o.dtype))));
  trace.set_meta("optimizer", quoted("adamw"));
  trace.set_meta("foreach", o.foreach ? "true" : "false");
  trace.set_meta("persistent_gradients", o.persistent_gradients ? "true" : "false");
  if (o.step_in_backward) trace.set_meta("step_in_backward", "true");
  double tflops = o.gpu_tflops > 0
                      ? o.gpu_tflops
                      : (o.dtype == SynthDtype::fp32 ? kFp32Tflops : kTensorCoreTflops);
  // (amp uses the tensor cores' peak: its matmuls and attention run in bf16)
  trace.set_meta("gpu_tflops", fmt::format("{}", tflops));
  trace.set_meta("hbm_gbps", fmt::format("{}", o.hbm_gbps));
  trace.set_meta("generator", quoted("teraio synth"));
  return trace;
}

}  // namespace teraio
