// Discrete-event replay of a plan over a trace: kernels take their traced time, each tier has a
// read and a write direction sharing one link (each slower while both move: TierSpec::duplex_gbps),
// an offload of a tensor unchanged since it was read back from the same tier writes nothing,
// transfers queue, kernels wait for late prefetches (urgent fetches jump the
// queue) and prefetches wait for memory; a recompute reruns its producer on the compute stream just
// before the kernel it is due for. docs/simulator.md has the model.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "teraio/plan.h"
#include "teraio/trace.h"

namespace teraio {

struct SimOptions {
  // Bandwidths to simulate with; when empty, the plan's tier bandwidths are used. Must match the
  // plan's tiers by index when given (used to replay a plan at a bandwidth it was not made for).
  std::vector<TierSpec> actual_tiers;
  // Iterations to replay (1..1000). Times are means over them (the first starts as if every earlier
  // transfer had completed); the timeline and urgent_fetches are the last iteration's.
  int iterations = 2;
  bool record_timeline = false;  // fill SimResult::kernel_start_us / transfers
  // How each direction of a link orders its transfers (docs/simulator.md, "Link order").
  // kIssue: one at a time in issue order, whole, no preemption: a kernel waiting for a transfer
  // waits for those issued before it too. What the host tier's copy lanes do (Note [Copies queued
  // on the GPU]): the Session's predictions and plan search use it.
  // kDeadline: among the issued ones, the one due first (its kernel earliest), whole, no
  // preemption: what lanes that reorder their copies would give.
  // kPreemptive: issue order, but a transfer a kernel waits for preempts the one in service (Note
  // [Urgent preemption]): an idealised link; more bandwidth never makes a plan slower there.
  enum class LinkOrder { kIssue, kDeadline, kPreemptive };
  LinkOrder link_order = LinkOrder::kIssue;
  // Host time the runner spends per kernel besides the trace's (a Session's own operator callbacks
  // in planned steps, as it measured them: Note [The runner's host time] in simulator.cpp). With
  // host times it lengthens the host lane; without them (a CPU trace, where the host runs the
  // kernels) every kernel waits for it. 0: none.
  double runner_host_us_per_kernel = 0;
  // Host time the plan's recomputes take per iteration in all, as a runner measured it (a
  // Session's engine running their recipes: Note [The recomputes' host time] in simulator.cpp),
  // shared among them in proportion to their producers' host times in the trace. With host times
  // only; 0: each takes its producer's host time, as recorded.
  double recompute_host_us_per_iteration = 0;
};

struct TierTraffic {
  uint64_t offload_bytes = 0;   // GPU -> tier (write link); clean offloads write nothing
  uint64_t prefetch_bytes = 0;  // tier -> GPU (read link)
  // Offloads to this tier that write nothing (Note [Clean offloads] in plan_check.cpp): the tier
  // still holds the bytes the tensor was read back from, so only the device memory is freed.
  size_t clean_offloads = 0;
  uint64_t clean_offload_bytes = 0;
  // Writeback moves to this tier (Note [Writebacks] in simulator.cpp): copies on the write link of
  // tensors that stay resident, each making the offload after it clean. Not in offload_bytes; in
  // write_busy_us and the floor.
  size_t writebacks = 0;
  uint64_t writeback_bytes = 0;
  double write_busy_us = 0;
  double read_busy_us = 0;
};

struct SimTransfer {
  uint32_t tier = 0;
  bool offload = true;
  bool urgent = false;
  double begin_us = 0;
  double end_us = 0;
  uint64_t bytes = 0;
  size_t move = 0;  // index into Plan::moves
  bool writeback = false;
  // Kernels from kernel 0 of the last iteration (may be >= the trace's kernels: the next one): the
  // kernel at whose end (an offload) or beginning (a prefetch) it is issued, and the kernel that
  // waits for it.
  int64_t issue_kernel = 0;
  int64_t need_kernel = 0;
};

struct SimResult {
  double iteration_us = 0;  // wall time of an iteration, mean over the simulated iterations
  double ideal_us = 0;      // sum of kernel times
  double stall_us = 0;      // time the compute stream waits for transfers: iteration - ideal - recompute - host_wait
  // Time the compute stream waits for the host to launch the next kernel, per iteration (Note [The
  // host lane] in simulator.cpp); 0 for a trace without host times and without
  // SimOptions::runner_host_us_per_kernel.
  double host_wait_us = 0;
  // The host's time per iteration: the trace's host times, the recomputes' and the runner's (0
  // without any).
  double host_us = 0;
  double recompute_us = 0;  // producer time rerun by the plan's recompute moves, per iteration
  // Host time of those reruns per iteration (in host_us; 0 without host times): the trace's
  // producers' host times, or SimOptions::recompute_host_us_per_iteration when given.
  double recompute_host_us = 0;
  size_t recomputes = 0;    // recompute moves per iteration
  double overlap_us = 0;    // transfer time hidden behind kernels (per iteration, summed over links)
  double last_iteration_us = 0;  // wall time of the last iteration alone (see docs/simulator.md)
  uint64_t peak_bytes = 0;  // most bytes resident at once
  std::vector<TierTraffic> tiers;
  // Clean offloads per iteration over all tiers (TierTraffic::clean_offloads): counted in neither
  // offload_bytes nor the floor. Always 0 for a trace that does not record writes.
  size_t clean_offloads = 0;
  uint64_t clean_offload_bytes = 0;
  // Discards per iteration (plan.discard_dead; Note [Dead tensors] in simulator.cpp): tails of
  // transient tensors freed without a write; counted in neither offload_bytes nor the floor.
  size_t discards = 0;
  uint64_t discarded_bytes = 0;
  // Writeback moves per iteration over all tiers (TierTraffic::writebacks).
  size_t writebacks = 0;
  uint64_t writeback_bytes = 0;
  size_t urgent_fetches = 0;  // transfers a kernel of the last iteration had to wait for
  // The floor of docs/simulator.md ("The floor"): no schedule of these moves can take less than
  // max(compute: ideal + recompute, each tier's offloaded bytes / write bandwidth, each tier's
  // prefetched bytes / read bandwidth). floor_bound names the term that sets it: "compute" or
  // "<tier> write" / "<tier> read".
  double floor_us = 0;
  std::string floor_bound = "compute";
  // Bytes per iteration over all tiers by the moved tensors' kind (index: TensorKind): which bytes
  // cross the links (optimizer states, parameters, activations, ...).
  std::array<uint64_t, kNumTensorKinds> offload_bytes_by_kind{};
  std::array<uint64_t, kNumTensorKinds> prefetch_bytes_by_kind{};
  // With record_timeline: start time of each kernel of the last iteration, and its transfers
  // (clean offloads move nothing and are not among them).
  std::vector<double> kernel_start_us;
  std::vector<SimTransfer> transfers;
};

SimResult simulate(const Trace& trace, const Plan& plan, const SimOptions& opts = {});
// A replay as a plan's `predicted` (iteration, ideal, stall, peak).
Prediction prediction_of(const SimResult& result);

// What plans are compared by (plan_best, issue_in_deadline_order): the slower of the mean
// iteration and the last one alone (Note [Ranking plans by their later iterations], sweep.cpp).
double ranking_us(const SimResult& r);

// "parameter 6.55 GiB out / 6.55 GiB in, optimizer_state ..." for the kinds that moved, most bytes
// first; "nothing" when nothing moved. And the same as a JSON object {"parameter": {"offload_bytes":
// N, "prefetch_bytes": N}, ...}.
std::string bytes_by_kind_text(const SimResult& r);
std::string bytes_by_kind_json(const SimResult& r);

// Note [Issue in deadline order]: the same plan with each offload and prefetch issued where it
// would begin on links that serve the transfer due first (LinkOrder::kDeadline), so that links
// serving in issue order (the host tier's copy lanes, LinkOrder::kIssue) run them in about that
// order; and issued where a schedule that may leave a link idle for a transfer due sooner would
// begin it (Note [Leaving the link idle for a transfer due sooner], simulator.cpp). A move is only
// ever issued later than planned, never after its deadline. Returns the fastest under `opts` (its
// link order, bandwidths and iterations; by ranking_us) of the two and the plan unchanged, leaving
// out those that would not be valid. With `as_run`, also the kept plan's replay under `opts`
// (without a timeline), which it has made anyway.
Plan issue_in_deadline_order(const Trace& trace, const Plan& plan, const SimOptions& opts = {},
                             SimResult* as_run = nullptr);

}  // namespace teraio
