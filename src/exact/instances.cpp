// Small transformer-like traces for measuring planners against the exact solver: per layer a
// persistent weight, gradient and optimizer state and an activation saved forward -> backward.
// Deterministic per seed (std::mt19937_64 and hand-rolled distributions, identical on every
// standard library).
#include <cmath>
#include <random>
#include <string>

#include "teraio/error.h"
#include "teraio/exact.h"

namespace teraio {

Trace small_instance(uint64_t seed, const SmallInstanceOptions& opts) {
  TERAIO_CHECK(opts.layers >= 1 && opts.layers <= 10, "small instance: layers must be in [1, 10], got {}",
               opts.layers);
  TERAIO_CHECK(opts.min_bytes >= 1 && opts.max_bytes >= opts.min_bytes,
               "small instance: need 1 <= min_bytes <= max_bytes (got {} and {})", opts.min_bytes, opts.max_bytes);
  TERAIO_CHECK(opts.min_time_us > 0 && opts.max_time_us >= opts.min_time_us,
               "small instance: need 0 < min_time_us <= max_time_us (got {} and {})", opts.min_time_us,
               opts.max_time_us);
  std::mt19937_64 rng(seed);
  // Uniform in [0, 1) from the top 53 bits: the same on every platform, unlike std distributions.
  auto unit = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  auto log_uniform = [&](double lo, double hi) { return std::exp(std::log(lo) + unit() * std::log(hi / lo)); };
  auto bytes = [&] { return static_cast<uint64_t>(std::llround(log_uniform(opts.min_bytes, opts.max_bytes))); };
  auto time = [&] { return std::round(log_uniform(opts.min_time_us, opts.max_time_us) * 100) / 100; };

  Trace trace;
  trace.set_meta("model", "\"small-instance\"");
  trace.set_meta("seed", std::to_string(seed));
  trace.set_meta("layers", std::to_string(opts.layers));
  const uint32_t L = opts.layers;
  if (opts.recompute) trace.set_meta("recompute", "true");
  std::vector<TensorId> w(L), g(L), o(L), a(L + 1), z(L);
  a[0] = trace.add_tensor({bytes(), TensorKind::activation, false, "input"});
  for (uint32_t l = 0; l < L; ++l) {
    const uint64_t wb = bytes();
    const std::string p = "layers." + std::to_string(l);
    w[l] = trace.add_tensor({wb, TensorKind::parameter, true, p + ".weight"});
    g[l] = trace.add_tensor({wb, TensorKind::gradient, true, p + ".weight.grad"});
    o[l] = trace.add_tensor({2 * wb, TensorKind::optimizer_state, true, p + ".weight.adam"});
    a[l + 1] = trace.add_tensor({bytes(), TensorKind::activation, false, p + ".out"});
  }
  auto kernel = [&](const char* name, std::initializer_list<TensorId> ids) {
    const std::vector<TensorId> v(ids);
    trace.add_kernel(name, time(), v);
  };
  if (opts.recompute) {
    // z[l] = mm(w[l], a[l]); a[l+1] = gelu(z[l]), recomputable (memory-bound: 1 us per MB moved).
    for (uint32_t l = 0; l < L; ++l) {
      const std::string p = "layers." + std::to_string(l);
      z[l] = trace.add_tensor({bytes(), TensorKind::activation, false, p + ".mm_out"});
      trace.tensors[z[l]].producer = static_cast<KernelIndex>(trace.num_kernels());
      kernel("aten::mm", {w[l], a[l], z[l]});
      TensorInfo& act = trace.tensors[a[l + 1]];
      act.producer = static_cast<KernelIndex>(trace.num_kernels());
      act.recomputable = true;
      const double mb = static_cast<double>(trace.tensors[z[l]].bytes + act.bytes) / 1e6;
      trace.add_kernel("aten::gelu", std::round(mb * 100) / 100, std::vector<TensorId>{z[l], a[l + 1]});
    }
    kernel("aten::nll_loss", {a[L]});
    for (uint32_t l = L; l-- > 0;) {  // backward: gelu grad, input grad, weight grad
      kernel("aten::gelu_backward", {z[l], a[l + 1]});
      kernel("aten::mm", {w[l], z[l]});
      kernel("aten::mm", {a[l], g[l]});
    }
    for (uint32_t l = 0; l < L; ++l) kernel("aten::_fused_adam", {w[l], g[l], o[l]});
    trace.validate();
    return trace;
  }
  for (uint32_t l = 0; l < L; ++l) {  // forward: matmul, activation, norm
    kernel("aten::mm", {w[l], a[l], a[l + 1]});
    kernel("aten::gelu", {a[l + 1]});
    kernel("aten::add", {a[l + 1]});
  }
  kernel("aten::nll_loss", {a[L]});
  for (uint32_t l = L; l-- > 0;) {  // backward: gelu grad, input grad, weight grad
    kernel("aten::gelu_backward", {a[l + 1]});
    kernel("aten::mm", {w[l], a[l + 1]});
    kernel("aten::mm", {a[l], g[l]});
  }
  for (uint32_t l = 0; l < L; ++l) kernel("aten::_fused_adam", {w[l], g[l], o[l]});
  trace.validate();
  return trace;
}

}  // namespace teraio
