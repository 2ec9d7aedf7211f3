// Lifetime analysis of a trace: when each tensor is used, its inactive periods (the gaps between
// consecutive uses, wrapping around the iteration for persistent tensors), the memory curve M[k]
// and the active bytes of each kernel. Everything the planner, simulator and `analyze` share.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "teraio/trace.h"

namespace teraio {

// Uses of every tensor, in kernel order (CSR). Built in O(total uses).
class Lifetimes {
 public:
  explicit Lifetimes(const Trace& trace);

  std::span<const KernelIndex> uses(TensorId t) const {
    return {use_kernels_.data() + offsets_[t], use_kernels_.data() + offsets_[t + 1]};
  }
  bool used(TensorId t) const { return offsets_[t + 1] > offsets_[t]; }
  KernelIndex first_use(TensorId t) const { return use_kernels_[offsets_[t]]; }
  KernelIndex last_use(TensorId t) const { return use_kernels_[offsets_[t + 1] - 1]; }
  // Is tensor t used by kernel k? O(log uses).
  bool is_used_at(TensorId t, KernelIndex k) const;
  // The first use of t at or after k, cyclically (for persistent tensors) or not; returns false if
  // none. `wrapped` tells whether the search went past the end of the iteration.
  bool next_use(TensorId t, KernelIndex k, KernelIndex* use, bool* wrapped) const;

 private:
  std::vector<uint64_t> offsets_;
  std::vector<KernelIndex> use_kernels_;
};

// A gap between two consecutive uses of a tensor: the tensor is used at kernel `start` and next at
// kernel `end`, and by no kernel in between. `wraps` when the gap crosses the iteration boundary
// (persistent tensors only; then end <= start). Only gaps of at least one kernel are periods.
struct InactivePeriod {
  TensorId tensor = 0;
  uint64_t bytes = 0;
  KernelIndex start = 0;
  KernelIndex end = 0;
  bool wraps = false;
  uint32_t kernels = 0;  // kernels strictly inside the gap
  double length_us = 0;  // their total time
};

// Start time of every kernel: prefix[k] = sum of times of kernels < k; prefix[N] = total.
std::vector<double> time_prefix_us(const Trace& trace);

// All inactive periods, ordered by tensor, then start.
std::vector<InactivePeriod> inactive_periods(const Trace& trace, const Lifetimes& lifetimes);

// M[k]: bytes that must be on the device at kernel k without offloading: persistent tensors
// always, others from their first use to their last use (both included).
std::vector<uint64_t> memory_curve(const Trace& trace, const Lifetimes& lifetimes);

// Bytes of the distinct tensors each kernel touches.
std::vector<uint64_t> active_bytes(const Trace& trace);

}  // namespace teraio
