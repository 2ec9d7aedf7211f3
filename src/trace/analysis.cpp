// Lifetime analysis: uses per tensor (CSR), inactive periods with wrap-around for persistent
// tensors and the periods no use ends (tails, idle persistent tensors), the no-offload memory
// curve M[k], per-kernel active bytes and writes between two kernels. All O(kernels + uses).
#include "teraio/analysis.h"

#include <algorithm>
#include <limits>

#include "teraio/error.h"
#include "teraio/units.h"

namespace teraio {

Lifetimes::Lifetimes(const Trace& trace) {
  const size_t nt = trace.num_tensors();
  const size_t nk = trace.num_kernels();
  offsets_.assign(nt + 1, 0);
  for (size_t k = 0; k < nk; ++k) {
    for (TensorId t : trace.kernel_tensors(static_cast<KernelIndex>(k))) {
      TERAIO_CHECK(t < nt, "kernels[{}]: tensor id {} is out of range", k, t);
      ++offsets_[t + 1];
    }
  }
  for (size_t t = 0; t < nt; ++t) offsets_[t + 1] += offsets_[t];
  use_kernels_.resize(offsets_[nt]);
  std::vector<uint64_t> fill(offsets_.begin(), offsets_.end() - 1);
  for (size_t k = 0; k < nk; ++k) {
    for (TensorId t : trace.kernel_tensors(static_cast<KernelIndex>(k))) {
      use_kernels_[fill[t]++] = static_cast<KernelIndex>(k);
    }
  }
  const bool extended = std::any_of(trace.tensors.begin(), trace.tensors.end(),
                                    [](const TensorInfo& info) { return info.alive_until.has_value(); });
  if (extended) {
    trace.validate();  // alive_until: in range, not before the last use, non-persistent, used
    alive_until_.resize(nt);
    for (TensorId t = 0; t < nt; ++t) {
      if (used(t)) alive_until_[t] = trace.tensors[t].alive_until.value_or(last_use(t));
    }
  }
}

bool Lifetimes::is_used_at(TensorId t, KernelIndex k) const {
  auto u = uses(t);
  return std::binary_search(u.begin(), u.end(), k);
}

bool Lifetimes::next_use(TensorId t, KernelIndex k, KernelIndex* use, bool* wrapped) const {
  auto u = uses(t);
  if (u.empty()) return false;
  auto it = std::lower_bound(u.begin(), u.end(), k);
  if (it != u.end()) {
    *use = *it;
    *wrapped = false;
  } else {
    *use = u.front();
    *wrapped = true;
  }
  return true;
}

std::vector<double> time_prefix_us(const Trace& trace) {
  const size_t n = trace.num_kernels();
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t k = 0; k < n; ++k) prefix[k + 1] = prefix[k] + trace.kernel_time_us(static_cast<KernelIndex>(k));
  return prefix;
}

std::vector<InactivePeriod> inactive_periods(const Trace& trace, const Lifetimes& lifetimes) {
  const auto n = static_cast<uint32_t>(trace.num_kernels());
  const std::vector<double> prefix = time_prefix_us(trace);
  std::vector<InactivePeriod> out;
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    auto u = lifetimes.uses(t);
    const TensorInfo& info = trace.tensors[t];
    if (u.empty()) {
      // Idle persistent tensor: resident the whole iteration, and nothing ever needs it.
      if (info.persistent && n > 0) {
        out.push_back(InactivePeriod{t, info.bytes, n - 1, n - 1, true, n, prefix[n], true});
      }
      continue;
    }
    for (size_t i = 0; i + 1 < u.size(); ++i) {
      if (u[i + 1] > u[i] + 1) {
        out.push_back(InactivePeriod{t, info.bytes, u[i], u[i + 1], false, u[i + 1] - u[i] - 1,
                                     prefix[u[i + 1]] - prefix[u[i] + 1]});
      }
    }
    if (info.persistent) {
      const KernelIndex last = u.back();
      const KernelIndex first = u.front();
      const uint32_t kernels = (n - 1 - last) + first;
      if (kernels > 0) {
        out.push_back(InactivePeriod{t, info.bytes, last, first, true, kernels,
                                     (prefix[n] - prefix[last + 1]) + prefix[first]});
      }
    } else if (const KernelIndex until = lifetimes.alive_until(t); until > u.back()) {
      // Tail: allocated but unused after the last use, until it dies after kernel `until`.
      out.push_back(InactivePeriod{t, info.bytes, u.back(), until, false, until - u.back(),
                                   prefix[until + 1] - prefix[u.back() + 1], true});
    }
  }
  return out;
}

std::vector<uint64_t> memory_curve(const Trace& trace, const Lifetimes& lifetimes) {
  const size_t n = trace.num_kernels();
  std::vector<int64_t> diff(n + 1, 0);
  int64_t persistent = 0;
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    const TensorInfo& info = trace.tensors[t];
    const auto bytes = static_cast<int64_t>(info.bytes);
    if (info.persistent) {
      persistent += bytes;
    } else if (lifetimes.used(t)) {
      diff[lifetimes.first_use(t)] += bytes;
      diff[lifetimes.alive_until(t) + 1] -= bytes;
    }
  }
  std::vector<uint64_t> m(n);
  int64_t running = persistent;
  for (size_t k = 0; k < n; ++k) {
    running += diff[k];
    m[k] = static_cast<uint64_t>(running);
  }
  return m;
}

std::vector<uint64_t> active_bytes(const Trace& trace) {
  const size_t n = trace.num_kernels();
  std::vector<uint64_t> a(n, 0);
  for (size_t k = 0; k < n; ++k) {
    uint64_t sum = 0;
    for (TensorId t : trace.kernel_tensors(static_cast<KernelIndex>(k))) sum += trace.tensors[t].bytes;
    a[k] = sum;
  }
  return a;
}

void check_kernels_fit(const Trace& trace, uint64_t budget_bytes) {
  const std::vector<uint64_t> active = active_bytes(trace);
  size_t over = 0, worst = 0;
  for (size_t k = 0; k < active.size(); ++k) {
    if (active[k] > budget_bytes) over++;
    if (active[k] > active[worst]) worst = k;
  }
  if (over == 0) return;
  const auto k = static_cast<KernelIndex>(worst);
  throw Error(fmt::format(
      "kernel {} ({}) alone touches {} ({} bytes), more than the budget of {} ({} bytes): no plan "
      "can fit. The budget must be at least {} (the most one kernel touches; {} of the trace's {} "
      "kernels touch more than the budget), or the step's tensors smaller (a smaller batch or "
      "sequence length)",
      k, trace.kernel_name(k), format_bytes(static_cast<double>(active[worst])), active[worst],
      format_bytes(static_cast<double>(budget_bytes)), budget_bytes,
      format_bytes(static_cast<double>(active[worst])), over, active.size()));
}

bool written_between(const Trace& trace, TensorId t, int64_t first_kernel, int64_t last_kernel) {
  if (!trace.writes_recorded) return true;
  const std::vector<KernelIndex>& w = trace.tensors[t].written_at;
  auto any_in = [&](int64_t lo, int64_t hi) {  // some write in [lo, hi]
    auto it = std::lower_bound(w.begin(), w.end(), lo, [](KernelIndex k, int64_t v) {
      return static_cast<int64_t>(k) < v;
    });
    return it != w.end() && static_cast<int64_t>(*it) <= hi;
  };
  if (first_kernel <= last_kernel) return any_in(first_kernel, last_kernel);
  return any_in(first_kernel, std::numeric_limits<int64_t>::max()) || any_in(0, last_kernel);
}

std::vector<TensorId> kernel_inputs(const Trace& trace, const Lifetimes& lifetimes, KernelIndex k) {
  std::vector<TensorId> inputs;
  for (TensorId t : trace.kernel_tensors(k)) {
    if (trace.tensors[t].persistent || lifetimes.first_use(t) < k) inputs.push_back(t);
  }
  return inputs;
}

std::vector<TensorId> recompute_reads(const Trace& trace, const Lifetimes& lifetimes, TensorId t) {
  const TensorInfo& info = trace.tensors[t];
  if (info.recompute_inputs) return *info.recompute_inputs;
  return kernel_inputs(trace, lifetimes, *info.producer);
}

double recompute_time_us(const Trace& trace, TensorId t) {
  const TensorInfo& info = trace.tensors[t];
  return info.recompute_us ? *info.recompute_us : trace.kernel_time_us(*info.producer);
}

double recompute_host_us(const Trace& trace, TensorId t) {
  if (!trace.has_host_times()) return 0;
  const KernelIndex p = *trace.tensors[t].producer;
  const double producer_us = trace.kernel_time_us(p);
  const double share = producer_us > 0 ? std::min(1.0, recompute_time_us(trace, t) / producer_us) : 1.0;
  return trace.kernel_host_us(p) * share;
}

}  // namespace teraio
