// Lifetime analysis of a trace: when each tensor is used and how long it stays allocated, its
// inactive periods (the gaps between consecutive uses, wrapping around the iteration for persistent
// tensors, and the periods after which nothing uses it again), the memory curve M[k], the active
// bytes of each kernel and where a tensor is written in place. Everything the planner, simulator
// and `analyze` share.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "teraio/trace.h"

namespace teraio {

// Uses of every tensor, in kernel order (CSR), and how long each non-persistent tensor stays
// allocated. Built in O(total uses). Throws teraio::Error on a tensor id out of range or an invalid
// alive_until (Trace::validate).
class Lifetimes {
 public:
  explicit Lifetimes(const Trace& trace);

  std::span<const KernelIndex> uses(TensorId t) const {
    return {use_kernels_.data() + offsets_[t], use_kernels_.data() + offsets_[t + 1]};
  }
  bool used(TensorId t) const { return offsets_[t + 1] > offsets_[t]; }
  KernelIndex first_use(TensorId t) const { return use_kernels_[offsets_[t]]; }
  KernelIndex last_use(TensorId t) const { return use_kernels_[offsets_[t + 1] - 1]; }
  // The last kernel through which a used tensor holds its memory within the iteration: the trace's
  // alive_until when set (non-persistent tensors only), else its last use.
  KernelIndex alive_until(TensorId t) const {
    return alive_until_.empty() ? last_use(t) : alive_until_[t];
  }
  // Is tensor t used by kernel k? O(log uses).
  bool is_used_at(TensorId t, KernelIndex k) const;
  // The first use of t at or after k, cyclically (for persistent tensors) or not; returns false if
  // none. `wrapped` tells whether the search went past the end of the iteration.
  bool next_use(TensorId t, KernelIndex k, KernelIndex* use, bool* wrapped) const;

 private:
  std::vector<uint64_t> offsets_;
  std::vector<KernelIndex> use_kernels_;
  std::vector<KernelIndex> alive_until_;  // per tensor; empty when no tensor has alive_until
};

// A gap between two consecutive uses of a tensor: the tensor is used at kernel `start` and next at
// kernel `end`, and by no kernel in between. `wraps` when the gap crosses the iteration boundary
// (persistent tensors only; then end <= start). Only gaps of at least one kernel are periods.
//
// A period with `no_next_use` is followed by no use: nothing needs the tensor back, so it can be
// offloaded without a prefetch (docs/formats.md). Its kernels are start+1 .. end, `end` included:
// - a tail: a non-persistent tensor alive after its last use, from `start` = the last use to
//   `end` = its alive_until (the last kernel it holds memory; then it dies);
// - an idle persistent tensor (no kernel uses it): the whole iteration, start = end = N - 1,
//   `wraps`, N kernels.
struct InactivePeriod {
  TensorId tensor = 0;
  uint64_t bytes = 0;
  KernelIndex start = 0;
  KernelIndex end = 0;
  bool wraps = false;
  uint32_t kernels = 0;  // strictly inside the gap (start+1 .. end with no_next_use)
  double length_us = 0;  // their total time
  bool no_next_use = false;
};

// Start time of every kernel: prefix[k] = sum of times of kernels < k; prefix[N] = total.
std::vector<double> time_prefix_us(const Trace& trace);

// All inactive periods, ordered by tensor, then start (a tail comes last among its tensor's).
std::vector<InactivePeriod> inactive_periods(const Trace& trace, const Lifetimes& lifetimes);

// M[k]: bytes that must be on the device at kernel k without offloading: persistent tensors
// always, others from their first use to their alive_until (both included; alive_until defaults to
// the last use).
std::vector<uint64_t> memory_curve(const Trace& trace, const Lifetimes& lifetimes);

// The tensors a rerun of kernel k reads: those of its tensors that exist before it runs (persistent,
// or first used by an earlier kernel). The others are made by k (docs/formats.md, "Recompute").
std::vector<TensorId> kernel_inputs(const Trace& trace, const Lifetimes& lifetimes, KernelIndex k);

// What a recompute of recomputable tensor t reads and costs: its recompute_inputs and recompute_us
// when the trace gives them (an operator nested in the producer, rerun alone), else the producer's
// inputs (kernel_inputs) and kernel time.
std::vector<TensorId> recompute_reads(const Trace& trace, const Lifetimes& lifetimes, TensorId t);
double recompute_time_us(const Trace& trace, TensorId t);
// The host's time to rerun t's producer (or the nested part of it: the producer's host time times
// the share of its time the recompute takes); 0 for a trace without host times (Note [The host
// lane] in src/sim/simulator.cpp).
double recompute_host_us(const Trace& trace, TensorId t);

// Whether some kernel from `first_kernel` through `last_kernel` (both included) writes tensor t in
// place (TensorInfo::written_at). first_kernel > last_kernel wraps around the iteration's end (a
// persistent tensor's gap): first_kernel .. N-1, then 0 .. last_kernel. True whenever the trace
// does not record writes (every use may write). Note [Clean offloads] in plan_check.cpp.
bool written_between(const Trace& trace, TensorId t, int64_t first_kernel, int64_t last_kernel);

// Bytes of the distinct tensors each kernel touches.
std::vector<uint64_t> active_bytes(const Trace& trace);

// Throws teraio::Error when some kernel alone touches more than budget_bytes (no plan can fit),
// naming the kernel that touches the most, the budget that would fit it, and what to change.
void check_kernels_fit(const Trace& trace, uint64_t budget_bytes);

}  // namespace teraio
