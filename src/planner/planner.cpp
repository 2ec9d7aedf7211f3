// The migration planner: the paper's Algorithm 1 (greedy by critical-pressure time per byte, with
// per-kernel bandwidth slots), made fast with lazy re-scoring and the structures of structures.h,
// then a forced pass that resolves the pressure bandwidth cannot hide, a prune pass and prefetch
// hoisting. Periods that no use ends (tails, idle persistent tensors) become offloads without a
// prefetch. Before all that, gaps of recomputable tensors whose producer costs less than moving
// their bytes are recomputed instead (see Note [Recompute in the planner]). docs/planner.md
// describes the algorithm and every decision.
#include <algorithm>
#include <functional>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <queue>
#include <set>

#include "planner_tuning.h"
#include "structures.h"
#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/parallel.h"
#include "teraio/units.h"

namespace teraio {
namespace planner_detail {
namespace {

// A cyclic run of kernels [begin, begin + count) split into at most two linear ranges.
struct Pieces {
  size_t n = 0;
  size_t lo[2] = {0, 0};
  size_t hi[2] = {0, 0};
};

Pieces pieces(uint32_t num_kernels, uint64_t begin, uint64_t count) {
  Pieces p;
  if (count == 0 || num_kernels == 0) return p;
  begin %= num_kernels;
  count = std::min<uint64_t>(count, num_kernels);
  if (begin + count <= num_kernels) {
    p.n = 1;
    p.lo[0] = begin;
    p.hi[0] = begin + count;
  } else {
    p.n = 2;
    p.lo[0] = begin;
    p.hi[0] = num_kernels;
    p.lo[1] = 0;
    p.hi[1] = begin + count - num_kernels;
  }
  return p;
}

// Gap geometry of a period: distances from `start`; the gap's kernels are distances 1..len-1.
// A one-way gap has no next use: its absence runs to distance len-1 and no prefetch ends it (a
// tail: len-1 is the tensor's alive_until). An idle gap (a persistent tensor no kernel uses) is
// one-way with start 0 and len N + 1: once chosen the tensor is absent at every kernel and moves no
// bytes in steady state (docs/planner.md, "Tensors no kernel uses again").
struct Gap {
  TensorId tensor;
  int64_t bytes;
  uint32_t start;
  uint32_t end;
  uint32_t len;
  bool one_way = false;
  bool idle = false;
};

// A chosen period: offloaded on `tier`, done at distance `done`, prefetch from distance `begin`
// (`begin` == the gap's len for a one-way gap: no prefetch). A recompute (no tier) is absent from
// the gap's start to its point (done 0, begin = the point's distance: the gap's len, or less for an
// input a chain makes earlier, which is then resident from that point to the gap's end) and made
// again before the point.
struct Pair {
  uint32_t gap;
  uint32_t tier;
  uint32_t done;
  uint32_t begin;
  bool forced = false;
  bool live = true;
  bool late_offload = false;   // widened past its reserved bandwidth (counted once in diagnostics)
  bool late_prefetch = false;
  bool recompute = false;
};

// A recompute chosen before the moves: tensor absent after kernel `start`, made again before kernel
// `point`.
struct Span {
  TensorId tensor;
  KernelIndex start;
  KernelIndex point;
  std::vector<TensorId> reads;  // the producer's inputs read at `point` that the kernel there does not use
};

struct Window {
  uint32_t done = 0;
  uint32_t begin = 0;
  uint32_t offload_len = 0;   // slots reserved on the write link: distances 1..offload_len
  uint32_t prefetch_len = 0;  // slots on the read link: distances len-prefetch_len..len-1
  double score = 0;
};

class Planner {
 public:
  Planner(const Trace& trace, const PlannerOptions& opts, const PlannerTuning& tuning)
      : trace_(trace), opts_(opts), tuning_(tuning), n_(static_cast<uint32_t>(trace.num_kernels())) {}

  Plan run(PlannerStats* stats, PlannerDiagnostics* diag);

 private:
  const Trace& trace_;
  const PlannerOptions& opts_;
  const PlannerTuning& tuning_;
  const uint32_t n_;
  int64_t budget_ = 0;
  std::vector<double> tau_;
  std::vector<Gap> gaps_;
  std::vector<int32_t> pair_of_;  // per gap, index into pairs_ or -1
  std::vector<Pair> pairs_;
  PressureTree mem_;
  Fenwick<int64_t> crit_;           // tau_k (ns) while M'[k] > budget, else 0
  std::vector<int64_t> tau_ns_;
  std::vector<LinkSlots> write_;    // per tier: GPU -> tier
  std::vector<LinkSlots> read_;     // per tier: tier -> GPU
  std::vector<PressureTree> held_;  // per tier: bytes held, per kernel
  std::vector<double> tier_weight_;
  PlannerDiagnostics diag_;
  size_t forced_ = 0;

  void check_options() const;
  void check_active_bytes() const;
  double crit_time(const Gap& g, uint32_t first, uint32_t count) const;
  double clipped_time(const Gap& g, uint32_t first, uint32_t count) const;
  bool tier_has_room(uint32_t tier, const Gap& g) const;
  bool evaluate(const Gap& g, uint32_t tier, Window* w) const;
  bool evaluate_one_way(const Gap& g, uint32_t tier, Window* w) const;
  void subtract(const Gap& g, uint32_t first, uint32_t count);
  void add_back(const Gap& g, uint32_t first, uint32_t count);
  void hold(uint32_t tier, const Gap& g);
  void take_idle();
  // Note [Dead tensors in the planner]
  bool discardable(const Gap& g) const {
    return opts_.discard_dead && g.one_way && !g.idle && !trace_.tensors[g.tensor].persistent;
  }
  void take_tails();
  // Recompute (Note [Recompute in the planner]).
  std::vector<Span> choose_recomputes(const Lifetimes& lifetimes, const std::vector<uint64_t>& curve,
                                      std::vector<std::vector<TensorId>>* reads) const;
  void take_recomputes(const std::vector<Span>& spans);
  // Recompute pairs (by pair index) with their reads, and how many live recomputes read each
  // (tensor, kernel): a read some move relies on keeps its last reader from being pruned.
  std::vector<std::pair<uint32_t, Span>> recompute_pairs_;
  std::map<uint64_t, uint32_t> readers_;
  static uint64_t read_key(TensorId t, KernelIndex k) { return (uint64_t{k} << 32) | t; }
  bool read_matters(TensorId t, KernelIndex k) const;
  void greedy();
  void force();
  void force_at(uint32_t gi, uint32_t x);
  void prune_and_hoist();
  void hoist();
  void make_offloads_due_when_needed();
  Plan emit() const;
};

void Planner::check_options() const {
  trace_.validate();
  TERAIO_CHECK(!opts_.tiers.empty(), "planner: at least one tier is required (--tier NAME:CAPACITY:READ:WRITE)");
  check_tier_names(opts_.tiers, "planner");
  for (const TierSpec& t : opts_.tiers) {
    TERAIO_CHECK(std::isfinite(t.read_gbps) && t.read_gbps > 0 && std::isfinite(t.write_gbps) && t.write_gbps > 0,
                 "planner: tier '{}' needs positive read and write bandwidth (got {} and {} GB/s)", t.name,
                 t.read_gbps, t.write_gbps);
    TERAIO_CHECK(std::isfinite(t.duplex_gbps) && t.duplex_gbps >= 0,
                 "planner: tier '{}' has both-ways bandwidth {} GB/s; it must be >= 0 (0: independent directions)",
                 t.name, t.duplex_gbps);
  }
  TERAIO_CHECK(opts_.budget_bytes <= static_cast<uint64_t>(INT64_MAX / 4), "planner: budget {} is too large",
               opts_.budget_bytes);
}

void Planner::check_active_bytes() const { check_kernels_fit(trace_, opts_.budget_bytes); }

double Planner::crit_time(const Gap& g, uint32_t first, uint32_t count) const {
  const Pieces p = pieces(n_, uint64_t{g.start} + first, count);
  int64_t s = 0;
  for (size_t i = 0; i < p.n; ++i) s += crit_.range(p.lo[i], p.hi[i]);
  return static_cast<double>(s) * 1e-3;
}

// Sum of tau_k * min(bytes, M'[k] - budget)+ / bytes over the window: O(window log n).
double Planner::clipped_time(const Gap& g, uint32_t first, uint32_t count) const {
  const Pieces p = pieces(n_, uint64_t{g.start} + first, count);
  double s = 0;
  for (size_t i = 0; i < p.n; ++i) {
    for (size_t k = mem_.first_above(p.lo[i], p.hi[i], budget_); k != SIZE_MAX;
         k = mem_.first_above(k + 1, p.hi[i], budget_)) {
      const int64_t over = mem_.value(k) - budget_;
      s += tau_[k] * static_cast<double>(std::min(over, g.bytes)) / static_cast<double>(g.bytes);
    }
  }
  return s;
}

// Bytes sit in the tier at the gap's kernels (as plan_check counts them: after the offload's
// start kernel, before the prefetch's deadline kernel).
bool Planner::tier_has_room(uint32_t tier, const Gap& g) const {
  if (discardable(g)) return true;  // a discard holds no tier space
  const auto capacity = static_cast<int64_t>(std::min<uint64_t>(opts_.tiers[tier].capacity_bytes, INT64_MAX / 2));
  if (held_[tier].max_all() + g.bytes <= capacity) return true;  // room everywhere
  const Pieces p = pieces(n_, uint64_t{g.start} + 1, g.len - 1);
  int64_t m = 0;
  for (size_t i = 0; i < p.n; ++i) m = std::max(m, held_[tier].max(p.lo[i], p.hi[i]));
  return m + g.bytes <= capacity;
}

void Planner::hold(uint32_t tier, const Gap& g) {
  if (discardable(g)) return;
  const Pieces p = pieces(n_, uint64_t{g.start} + 1, g.len - 1);
  for (size_t i = 0; i < p.n; ++i) held_[tier].range_add(p.lo[i], p.hi[i], g.bytes);
}

// Earliest offload completion filling free write slots forward from distance 1, latest prefetch
// start filling free read slots backward from the gap's end; false when they do not leave at least
// one kernel in between. A one-way gap has no prefetch (absent through its last kernel); an idle
// gap moves nothing and is absent everywhere.
bool Planner::evaluate(const Gap& g, uint32_t tier, Window* w) const {
  if (g.one_way) return evaluate_one_way(g, tier, w);
  if (g.len < 3) return false;
  const uint32_t off = write_[tier].forward_len((g.start + 1) % n_, g.len - 2, g.bytes);
  if (off == 0) return false;
  const uint32_t pre = read_[tier].backward_len(g.end, g.len - 1 - off - 1, g.bytes);
  if (pre == 0) return false;
  w->offload_len = off;
  w->prefetch_len = pre;
  w->done = off;
  w->begin = g.len - pre;
  if (w->begin <= w->done + 1) return false;
  const uint32_t count = w->begin - w->done - 1;
  w->score = (tuning_.clip_benefit ? clipped_time(g, w->done + 1, count) : crit_time(g, w->done + 1, count)) *
             tier_weight_[tier];
  return true;
}

// evaluate() for a gap no use ends: no prefetch, the absence runs to its last kernel.
bool Planner::evaluate_one_way(const Gap& g, uint32_t tier, Window* w) const {
  *w = Window{};
  w->begin = g.len;
  if (discardable(g)) {  // freed after the kernel that follows its start: no write, no link
    if (g.len < 3) return false;
    w->done = 1;
  } else if (!g.idle) {
    if (g.len < 3) return false;
    w->offload_len = write_[tier].forward_len((g.start + 1) % n_, g.len - 2, g.bytes);
    if (w->offload_len == 0) return false;
    w->done = w->offload_len;
  }
  const uint32_t count = w->begin - w->done - 1;
  w->score = (tuning_.clip_benefit ? clipped_time(g, w->done + 1, count) : crit_time(g, w->done + 1, count)) *
             tier_weight_[tier];
  return true;
}

void Planner::subtract(const Gap& g, uint32_t first, uint32_t count) {
  const Pieces p = pieces(n_, uint64_t{g.start} + first, count);
  for (size_t i = 0; i < p.n; ++i) {
    mem_.range_add(p.lo[i], p.hi[i], -g.bytes, [this](size_t k) { crit_.add(k, -tau_ns_[k]); });
  }
}

void Planner::add_back(const Gap& g, uint32_t first, uint32_t count) {
  const Pieces p = pieces(n_, uint64_t{g.start} + first, count);
  for (size_t i = 0; i < p.n; ++i) mem_.range_add(p.lo[i], p.hi[i], g.bytes);
}

// Note [Recompute in the planner]
// A gap between two uses of a recomputable tensor may be recomputed instead of moved: the tensor is
// absent over the whole gap and its producer runs again just before the next use, costing its
// kernel time on the compute stream and no link time. Under a budget the links cannot serve, every
// byte moved costs link time, so a gap is recomputed when its producer's time is at most
// recompute_factor x (bytes / the fastest tier's slower link) and the gap spans a kernel over the
// budget (else nothing needs it away); the prune pass drops those memory did not need after all.
// The producer's inputs must be resident at the recompute point: each becomes *read* there, a use
// in the trace the moves are planned on (so an input may be offloaded before the point and
// prefetched by it, like before any use), which check_plan also counts (docs/formats.md). An input
// recomputed in a gap around the point is made at the point instead (a chain), when its own inputs
// are resident there (chains one level deep). Gaps are taken in producer order, so every input's
// decision is final when its consumer is decided. The point's own tensors, reads and the tensor must
// fit in the budget together.
// Note [Chains that cost more than they free]
// A chain moves its input's recompute point back to the consumer's point d, so the input is resident
// from d to its old point instead of absent. Near the backward's uses that costs a kernel or two;
// but a gap early in the forward pass can chain an input recomputed for the whole stretch up to the
// backward: on the H200's Llama-3-8B autocast profile, the normalised input of each layer's q, k
// and v projections (`weight * normed`, a temporary read by the three linears) is recomputable, and
// recomputing it between the q and v linears made each layer's `normed` (an activation) a chain
// made at once, resident through the rest of the forward pass: 6.6 GB more moved each way per
// iteration, 1.119 s simulated (0.994 s with this rule). So a chain is taken only when the consumer's
// gap frees more than the chains keep: bytes x kernels over the budget without a plan, over
// (start, d) for the consumer and over [d, old point) for each chained input.
// Note [Deep recompute chains]
// PlannerTuning::revive_dead_inputs (PlannerOptions::deep_recompute): making a tensor at its point
// d makes there what its producer reads, recursively (gather, up to four producers down; eight
// across the peak: Note [Recompute across the peak]). An input freed at d by its own span is made
// at d too and the span split in two, (start, d) and (d, point): its producer runs twice and it is
// never resident between, where a one-level chain would keep it from d to its point (Note [Chains
// that cost more than they free]). An input the trace has dead by d, recomputable and cheap, is
// revived: made at d, absent since the last kernel that used or read it (a span from there; a later
// read's span over d now starts at d). The recompute that reads it keeps it alive at run time (the
// recipe holds its arguments; the engine lets a recipe go after its tensor's last recompute of the
// step), and check_plan counts it resident to its last read. Reads are uses of the trace the moves
// are planned on, so every span must end at a read and start at a use or read: a split or revive
// that would leave no kernel between two of them is not taken; one read right after its last need
// keeps it resident instead. Decided for the whole candidate in gather before any read of d is
// added, then applied.
// Note [Recompute across the peak]
// PlannerTuning::recompute_across_peak: under a budget far below the footprint every kernel is over
// it without a plan (in bf16 autocast the fp32 parameters and AdamW states alone exceed half the
// footprint), so every gap of the forward pass is a candidate, and deep chains remade whole
// decoder layers at the forward's short gaps: on the H100's llama-3b autocast profile at 1/2
// (bench/results/h100-2026-12-07-s46), chains four producers deep failed on each layer's RMSNorm
// (seven operators from the residual stream to the normalised input of the MLP), so 5.2-6.0 GiB
// of activations (the MLP's products, SiLU outputs, the residual stream, attention outputs) stayed
// resident across the loss and as many bytes of AdamW state crossed the link each way instead;
// eight deep, 2,601 recomputes a step remade each layer's MLP again and again (558 ms simulated
// against 473 ms). The activations that matter there are those resident at the peak: recomputed
// across it, they leave room for the optimizer states the backward pass would otherwise read
// over the link, which bounds that step. So this variant takes only the gaps that span the kernel
// where memory peaks without a plan, lets chains go kMaxPeakDepth producers down, and takes a
// candidate only when all that its chain reruns (its own producer, the inputs made at its point
// again and the ones revived there) costs at most the rule's price of its bytes: a chain that
// remakes a whole MLP to free one 48 MiB residual is not taken. plan_best keeps it where the
// simulator finds it fastest: on that profile 378 ms against 411 ms (docs/planner.md,
// "Recompute across the peak").
// Note [Points pulled to their readers']
// PlannerTuning::pull_window, across the peak: a candidate's point is its next use, and the
// backward pass uses a layer's activations in the reverse of the order they were made, so a
// recompute's input is often needed for itself a few kernels after its reader's point. Made at the
// reader's point for the reader, the input was freed again and made a second time at its own
// point (the span split in two: Note [Deep recompute chains]), and the chain was priced at both: on
// the H100's llama-3b autocast profile at 1/2 (bench/results/h100-2026-12-07-s47), the MLP's
// product (64 MiB, the down projection's input, read by its weight gradient two kernels before
// the SiLU output and the up projection it is made from are read by the product's own backward)
// was priced at both matmuls again and not taken: 1.5 GiB of products stayed resident across
// the loss. So before choosing, readers first, every candidate's point is pulled back to the
// point of a candidate that reads it (directly or through inputs dead there, which are made there
// again) when that is at most pull_window kernels before its next use: it is made once, there,
// and resident until its use, as activation checkpointing makes a layer's activations once at the
// start of its backward. The bytes held over the window are not priced; the window bounds them
// (kPullWindow, about a decoder layer's backward: 80-150 kernels on those profiles). A variant:
// plan_best keeps it where the simulator finds it fastest (docs/planner.md, "Points pulled to their
// readers").
// Note [Inputs kept for a recompute]
// PlannerTuning::keep_dead_inputs: a recompute's input that the trace has dead by the point d (a
// temporary its producer read once) need not be made there: the recompute's recipe holds it at run
// time anyway, so it can simply live on to d, read there like any other input, and the moves may
// carry it away and bring it back meanwhile. That is what makes an expensive-to-move tensor made
// from small ones worth recomputing: fp32 math attention saves its 512 MiB of softmax
// probabilities per layer of llama-1b (4 x 1024), made by one nested operator from the 48 MiB of
// rotated q, k and v, temporaries dead after the forward's attention; before, such a recompute
// was refused (its inputs dead), and at FSDP2's 4.1 GiB the probabilities crossed the link both
// ways, 8 GiB of the 13.3 GiB of activations moved. A kept input costs its bytes from its last
// use or read before d up to d, counted with the chains' in Note [Chains that cost more than they
// free], and it may cross the link where the tensor would have. So such a recompute is taken only
// when what the point must bring for it (the kept inputs and the persistent tensors it reads, not
// read there already) is at most PlannerTuning::kept_bytes_fraction of the tensor's bytes, and the
// producer's time passes the rule above against the tensor's bytes less those. Without the bound,
// keeping autocast's 32 MiB normalised input to remake a 64 MiB projection in the backward (which
// reads the 64 MiB fp32 weight there too) cost the H200's llama-1b at 1/2 10% and the 8B 9%,
// simulated. With deep chains a dead input is revived when its own inputs can be had at d without
// keeping any (reviving a chain down to a kept leaf would move as many bytes and compute more),
// else kept. check_plan and the simulator already count an input resident from the end of its
// life up to its last read (docs/formats.md, rule 12).
// Note [Recomputes that read parameters]
// A recompute's point reads its producer's inputs (above); when one is a persistent tensor the
// point's kernel does not use (autocast's aten::linear reads its fp32 weight, which the backward
// pass does not), the weight must be resident there: kept in, or brought back early, at twice the
// bytes of the bf16 output being recomputed. The choice above prices only the producer's time, so
// plan_best also tries plans that leave those gaps to the moves (PlannerTuning::
// recompute_without_persistent_reads). On the H200's autocast traces (docs/planner.md, "Recompute")
// that variant won: Llama-3-8B at 110 GiB 1.966 -> 1.811 s, llama-1b at 1/2 379 -> 360 ms and at
// 1/4 818 -> 773 ms, simulated; fp32 traces kept their plans.
// Note [Recompute's host time]
// A recompute reruns its producer through the dispatcher: its kernels take the producer's time on
// the device, and the host spends the producer's host time to launch them (Note [The host lane] in
// simulator.cpp). With host times in the trace, a recompute is priced at the longer of the two (a
// nested one at the share of its producer it reruns): where small kernels leave the host no lead
// (bf16 autocast at small batches), its host time is what the step pays; elsewhere its device
// time, as without host times.
double recompute_cost_us(const Trace& trace, TensorId t) {
  return std::max(recompute_time_us(trace, t), recompute_host_us(trace, t));
}

std::vector<Span> Planner::choose_recomputes(const Lifetimes& lifetimes, const std::vector<uint64_t>& curve,
                                             std::vector<std::vector<TensorId>>* reads) const {
  std::vector<Span> spans;
  if (!opts_.recompute || !has_recomputable(trace_)) return spans;
  double bytes_per_us = 0;  // the fastest tier's slower direction
  for (const TierSpec& t : opts_.tiers) bytes_per_us = std::max(bytes_per_us, std::min(t.read_gbps, t.write_gbps) * 1e3);
  std::vector<uint32_t> over(n_ + 1, 0);  // prefix count of kernels over the budget without a plan
  for (uint32_t k = 0; k < n_; ++k) over[k + 1] = over[k] + (static_cast<int64_t>(curve[k]) > budget_ ? 1 : 0);
  // Note [Recompute across the peak]: the kernel where memory peaks without a plan.
  const auto peak = static_cast<KernelIndex>(std::max_element(curve.begin(), curve.end()) - curve.begin());
  const bool across_peak = tuning_.recompute_across_peak && tuning_.revive_dead_inputs;
  struct Cand {
    KernelIndex producer, start, end;
    TensorId tensor;
    KernelIndex point;  // end, or earlier when pulled (Note [Points pulled to their readers'])
  };
  // Cheaper to make again than to move: its producer's time within recompute_factor x its link time
  // (Note [Recompute's host time]: the host's time to rerun it where that is longer).
  auto cheap = [&](TensorId t) {
    return recompute_cost_us(trace_, t) <=
           tuning_.recompute_factor * static_cast<double>(trace_.tensors[t].bytes) / bytes_per_us;
  };
  std::vector<Cand> cands;
  const size_t nt = trace_.num_tensors();
  for (TensorId t = 0; t < nt; ++t) {
    const TensorInfo& info = trace_.tensors[t];
    if (!info.recomputable || info.bytes < opts_.min_tensor_bytes || !lifetimes.used(t) || !cheap(t)) continue;
    auto uses = lifetimes.uses(t);
    for (size_t j = 1; j < uses.size(); ++j) {
      if (across_peak && !(uses[j - 1] < peak && peak < uses[j])) continue;
      if (uses[j] > uses[j - 1] + 1 && over[uses[j]] > over[uses[j - 1] + 1]) {
        cands.push_back({*info.producer, uses[j - 1], uses[j], t, uses[j]});
      }
    }
  }
  std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return a.producer != b.producer ? a.producer < b.producer : a.start < b.start;
  });
  auto alive_at = [&](TensorId t, KernelIndex k) {
    return trace_.tensors[t].persistent || (lifetimes.first_use(t) <= k && k <= lifetimes.alive_until(t));
  };
  constexpr int kMaxPeakDepth = 8;
  const int max_depth = across_peak ? kMaxPeakDepth : 4;
  // Note [Points pulled to their readers']: readers first, so that a point pulled back pulls its
  // inputs' along.
  if (across_peak && tuning_.pull_window > 0) {
    std::vector<int64_t> cand_of(nt, -1);  // across the peak, a tensor has one candidate gap
    for (size_t ci = 0; ci < cands.size(); ++ci) cand_of[cands[ci].tensor] = static_cast<int64_t>(ci);
    std::vector<std::pair<TensorId, int>> stack;
    std::vector<TensorId> seen;
    for (size_t ci = cands.size(); ci-- > 0;) {
      const KernelIndex d = cands[ci].point;
      stack.clear();
      seen.clear();
      for (TensorId i : recompute_reads(trace_, lifetimes, cands[ci].tensor)) stack.emplace_back(i, 0);
      while (!stack.empty()) {
        const auto [i, depth] = stack.back();
        stack.pop_back();
        if (std::find(seen.begin(), seen.end(), i) != seen.end()) continue;
        seen.push_back(i);
        const TensorInfo& info = trace_.tensors[i];
        if (info.persistent) continue;
        if (!alive_at(i, d)) {  // dead by d: made there from its own inputs (a revive), if at all
          if (info.recomputable && info.producer && depth + 1 < max_depth) {
            for (TensorId ii : recompute_reads(trace_, lifetimes, i)) stack.emplace_back(ii, depth + 1);
          }
          continue;
        }
        if (cand_of[i] < 0) continue;
        Cand& ic = cands[static_cast<size_t>(cand_of[i])];
        if (ic.start < d && d < ic.point && ic.end - d <= tuning_.pull_window) ic.point = d;
      }
    }
  }
  std::vector<std::vector<uint32_t>> spans_of(nt);  // chosen spans per tensor
  const std::vector<uint64_t> active = active_bytes(trace_);
  std::vector<int64_t> extra_bytes(n_, 0);  // bytes read at a kernel beyond its own tensors
  std::map<uint64_t, uint32_t> count;       // readers per (tensor, kernel)
  auto key = [](TensorId t, KernelIndex k) { return (uint64_t{k} << 32) | t; };
  std::vector<std::set<KernelIndex>> read_points(nt);  // per tensor: the kernels it is read at
  auto add_read = [&](TensorId t, KernelIndex k) {
    if (count[key(t, k)]++ == 0) {
      extra_bytes[k] += static_cast<int64_t>(trace_.tensors[t].bytes);
      read_points[t].insert(k);
    }
  };
  auto drop_read = [&](TensorId t, KernelIndex k) {
    auto it = count.find(key(t, k));
    if (--it->second == 0) {
      extra_bytes[k] -= static_cast<int64_t>(trace_.tensors[t].bytes);
      count.erase(it);
      read_points[t].erase(k);
    }
  };
  // The span of tensor t freeing it at kernel k (start < k < point), or -1.
  auto freed_at = [&](TensorId t, KernelIndex k) -> int64_t {
    for (uint32_t si : spans_of[t]) {
      if (spans[si].start < k && k < spans[si].point) return si;
    }
    return -1;
  };
  // The inputs of t's recompute read at k that kernel k does not use.
  auto reads_at = [&](TensorId t, KernelIndex k) {
    std::vector<TensorId> r;
    for (TensorId i : recompute_reads(trace_, lifetimes, t)) {
      if (!lifetimes.is_used_at(i, k)) r.push_back(i);
    }
    return r;
  };
  // Note [Deep recompute chains]: a tensor read at d that the trace has dead by then, which could be
  // made there (its inputs: gather).
  auto revivable = [&](TensorId i, KernelIndex d) {
    const TensorInfo& info = trace_.tensors[i];
    return tuning_.revive_dead_inputs && !info.persistent && info.recomputable && info.producer &&
           lifetimes.used(i) && lifetimes.alive_until(i) < d && cheap(i);
  };
  // A dead tensor i read at d: the last kernel before d that uses or reads it, and whether d needs
  // it made again (a kernel or more in between, and not read at d already).
  auto last_need_before = [&](TensorId i, KernelIndex d) {
    KernelIndex prev = lifetimes.last_use(i);
    const std::set<KernelIndex>& r = read_points[i];
    auto it = r.lower_bound(d);
    if (it != r.begin()) prev = std::max(prev, *std::prev(it));
    return prev;
  };
  auto remade_at = [&](TensorId i, KernelIndex d) {
    return !read_points[i].count(d) && d > last_need_before(i, d) + 1;
  };
  std::vector<uint32_t> chains, splits, shifts;
  std::vector<TensorId> revives, visited, kept;
  // Note [Inputs kept for a recompute]: an input dead by d, not made there, kept alive to d instead.
  auto keepable = [&](TensorId i, KernelIndex d) {
    return tuning_.keep_dead_inputs && !trace_.tensors[i].persistent && lifetimes.used(i) &&
           lifetimes.alive_until(i) < d && freed_at(i, d) < 0;
  };
  // Note [Deep recompute chains]: what making t at d needs made there too, up to max_depth
  // producers down: an input freed by a recompute span is made at d as well and again at its own
  // point (the span split), a dead one is revived when its own inputs can be had at d without
  // keeping any, else kept (Note [Inputs kept for a recompute]) when allow_keep; false when some
  // input cannot be.
  std::function<bool(TensorId, KernelIndex, int, bool)> gather = [&](TensorId t, KernelIndex d, int depth,
                                                                     bool allow_keep) {
    for (TensorId i : recompute_reads(trace_, lifetimes, t)) {
      if (std::find(visited.begin(), visited.end(), i) != visited.end()) continue;
      if (alive_at(i, d)) {
        const int64_t si = freed_at(i, d);
        if (si < 0) continue;  // resident
        // Split: made at d too, so freed for a kernel or more on both sides of d.
        if (d <= spans[si].start + 1 || spans[si].point <= d + 1 || depth >= max_depth) return false;
        visited.push_back(i);
        if (!gather(i, d, depth + 1, allow_keep)) return false;
        splits.push_back(static_cast<uint32_t>(si));
        continue;
      }
      const auto keep = [&] {
        if (!allow_keep || !keepable(i, d)) return false;
        visited.push_back(i);
        kept.push_back(i);
        return true;
      };
      if (!revivable(i, d) || depth >= max_depth) {
        if (!keep()) return false;
        continue;
      }
      // Read right after its last use or read, or read there already: kept alive there, not made
      // again (its inputs are not read).
      if (remade_at(i, d)) {
        const int64_t si = freed_at(i, d);  // a later read's span, split at d: a kernel or more left
        if (si >= 0 && spans[si].point <= d + 1) return false;
        const size_t marks[] = {visited.size(), splits.size(), revives.size(), shifts.size(), kept.size()};
        visited.push_back(i);
        if (!gather(i, d, depth + 1, false)) {  // undo what the failed attempt gathered
          visited.resize(marks[0]);
          splits.resize(marks[1]);
          revives.resize(marks[2]);
          shifts.resize(marks[3]);
          kept.resize(marks[4]);
          if (!keep()) return false;
          continue;
        }
        revives.push_back(i);
      } else if (!read_points[i].count(d)) {  // kept alive from the kernel before d: nothing to make
        visited.push_back(i);
        const int64_t si = freed_at(i, d);  // a span from d - 1 now starts at d
        if (si >= 0) {
          if (spans[si].point <= d + 1) return false;
          shifts.push_back(static_cast<uint32_t>(si));
        }
      } else {
        visited.push_back(i);
      }
    }
    return true;
  };
  for (const Cand& c : cands) {
    const KernelIndex d = c.point;
    chains.clear();
    splits.clear();
    shifts.clear();
    revives.clear();
    visited.clear();
    kept.clear();
    bool ok = true;
    if (tuning_.revive_dead_inputs) {
      ok = gather(c.tensor, d, 0, true);
    } else {
      for (TensorId i : recompute_reads(trace_, lifetimes, c.tensor)) {
        if (!alive_at(i, d)) {
          if (!keepable(i, d)) { ok = false; break; }
          kept.push_back(i);
          continue;
        }
        const int64_t si = freed_at(i, d);
        if (si < 0) continue;
        // i made at d must still be freed for a kernel or more before it: its window would be
        // (start, d), and a window with no kernel inside is no recompute (and no gap once d reads i).
        if (d <= spans[si].start + 1) { ok = false; break; }
        // A chain: make i at d instead, if its own inputs are resident there.
        for (TensorId ii : recompute_reads(trace_, lifetimes, i)) {
          if (!alive_at(ii, d) || freed_at(ii, d) >= 0) { ok = false; break; }
        }
        if (!ok) break;
        chains.push_back(static_cast<uint32_t>(si));
      }
    }
    if (!ok) continue;
    // Note [Recompute across the peak]: priced at every producer the chain reruns.
    if (across_peak && (!splits.empty() || !revives.empty())) {
      double cost = recompute_cost_us(trace_, c.tensor);
      for (uint32_t si : splits) cost += recompute_cost_us(trace_, spans[si].tensor);
      for (TensorId i : revives) cost += recompute_cost_us(trace_, i);
      const double price = tuning_.recompute_factor * static_cast<double>(trace_.tensors[c.tensor].bytes) / bytes_per_us;
      if (cost > price) continue;
    }
    // A chain keeps its input resident from d to the input's old point (Note [Chains that cost
    // more than they free]), a kept input from its last need to d (Note [Inputs kept for a
    // recompute]): taken only when this gap frees more than they give back.
    if (!chains.empty() || !kept.empty()) {
      const auto over_in = [&](KernelIndex lo, KernelIndex hi) {  // kernels over the budget in [lo, hi)
        return lo < hi ? static_cast<double>(over[hi] - over[lo]) : 0.0;
      };
      const double freed = static_cast<double>(trace_.tensors[c.tensor].bytes) * over_in(c.start + 1, d);
      double held = 0;
      for (uint32_t si : chains)
        held += static_cast<double>(trace_.tensors[spans[si].tensor].bytes) * over_in(d, spans[si].point);
      for (TensorId i : kept)
        held += static_cast<double>(trace_.tensors[i].bytes) * over_in(last_need_before(i, d) + 1, d);
      if (held >= freed) continue;
    }
    // Everything that must be resident at d fits: d's own tensors, the reads so far and the new ones.
    Span span{c.tensor, c.start, d, reads_at(c.tensor, d)};
    if (tuning_.recompute_without_persistent_reads &&
        std::any_of(span.reads.begin(), span.reads.end(),
                    [&](TensorId t) { return trace_.tensors[t].persistent; }))
      continue;
    // Note [Inputs kept for a recompute]: what keeping costs on the link, the kept inputs and the
    // persistent tensors the point must bring (not read at d already), comes off what the
    // recompute saves there.
    if (!kept.empty()) {
      double carried = 0;
      for (TensorId i : kept)
        if (!count.count(key(i, d))) carried += static_cast<double>(trace_.tensors[i].bytes);
      for (TensorId i : span.reads)
        if (trace_.tensors[i].persistent && !count.count(key(i, d)))
          carried += static_cast<double>(trace_.tensors[i].bytes);
      const auto bytes = static_cast<double>(trace_.tensors[c.tensor].bytes);
      if (carried > tuning_.kept_bytes_fraction * bytes ||
          recompute_cost_us(trace_, c.tensor) > tuning_.recompute_factor * (bytes - carried) / bytes_per_us)
        continue;
    }
    std::vector<TensorId> fresh;
    auto note = [&](TensorId t) {
      if (!count.count(key(t, d)) && std::find(fresh.begin(), fresh.end(), t) == fresh.end()) fresh.push_back(t);
    };
    for (TensorId t : span.reads) note(t);
    for (uint32_t si : chains) {
      for (TensorId t : reads_at(spans[si].tensor, d)) note(t);
    }
    for (uint32_t si : splits) {
      for (TensorId t : reads_at(spans[si].tensor, d)) note(t);
    }
    for (TensorId i : revives) {
      for (TensorId t : reads_at(i, d)) note(t);
    }
    int64_t add = 0;
    for (TensorId t : fresh) add += static_cast<int64_t>(trace_.tensors[t].bytes);
    if (static_cast<int64_t>(active[d]) + extra_bytes[d] + add > budget_) continue;
    for (uint32_t si : chains) {  // its reads move from the old point to d
      Span& ch = spans[si];
      for (TensorId t : ch.reads) drop_read(t, ch.point);
      ch.point = d;
      ch.reads = reads_at(ch.tensor, d);
      for (TensorId t : ch.reads) add_read(t, d);
    }
    for (uint32_t si : splits) {
      // Made at d for this recompute, freed again after d and made again at its own point.
      const TensorId ct = spans[si].tensor;
      const KernelIndex old_point = spans[si].point;
      std::vector<TensorId> old_reads = spans[si].reads;  // stay at the old point
      spans[si].point = d;
      spans[si].reads = reads_at(ct, d);
      for (TensorId t : spans[si].reads) add_read(t, d);
      spans_of[ct].push_back(static_cast<uint32_t>(spans.size()));  // old_point > d + 1 (gather)
      spans.push_back(Span{ct, d, old_point, std::move(old_reads)});
    }
    for (uint32_t si : shifts) spans[si].start = d;
    for (TensorId i : revives) {
      // Made at d (gather decided, before this candidate's reads at d): absent from the last use
      // or read before d; a span over d now starts at d.
      const KernelIndex prev = last_need_before(i, d);
      if (const int64_t si = freed_at(i, d); si >= 0) spans[si].start = d;  // point > d + 1 (gather)
      Span rs{i, prev, d, reads_at(i, d)};
      for (TensorId t : rs.reads) add_read(t, d);
      spans_of[i].push_back(static_cast<uint32_t>(spans.size()));
      spans.push_back(std::move(rs));
    }
    for (TensorId t : span.reads) add_read(t, d);
    spans_of[c.tensor].push_back(static_cast<uint32_t>(spans.size()));
    spans.push_back(std::move(span));
  }
  for (const auto& [k, n] : count) {
    (*reads)[static_cast<size_t>(k >> 32)].push_back(static_cast<TensorId>(k & 0xffffffffu));
  }
  return spans;
}

// Recomputed gaps are absent from the start (the greedy loop and the forced pass leave them alone).
void Planner::take_recomputes(const std::vector<Span>& spans) {
  for (const Span& sp : spans) {
    auto it = std::lower_bound(gaps_.begin(), gaps_.end(), sp, [](const Gap& g, const Span& x) {
      return g.tensor != x.tensor ? g.tensor < x.tensor : g.start < x.start;
    });
    // A chain's input is made at its consumer's point, before its own gap ends (Note [Recompute in
    // the planner]): absent up to that point only.
    TERAIO_INTERNAL_ASSERT(it != gaps_.end() && it->tensor == sp.tensor && it->start == sp.start &&
                               sp.start < sp.point && sp.point <= it->end && !it->one_way,
                           "planner: recompute of tensor {} after kernel {} matches no gap", sp.tensor, sp.start);
    const auto gi = static_cast<uint32_t>(it - gaps_.begin());
    const uint32_t absent = sp.point - sp.start;  // recompute gaps never wrap
    subtract(*it, 1, absent - 1);
    pair_of_[gi] = static_cast<int32_t>(pairs_.size());
    Pair pr{gi, 0, 0, absent};
    pr.recompute = true;
    recompute_pairs_.emplace_back(static_cast<uint32_t>(pairs_.size()), sp);
    for (TensorId t : sp.reads) ++readers_[read_key(t, sp.point)];
    pairs_.push_back(pr);
  }
}

// Whether a live move of t starts or is due at kernel k, where only a recompute's read needs t: a
// gap of the planned-on trace starting or ending there that is chosen.
bool Planner::read_matters(TensorId t, KernelIndex k) const {
  auto it = std::lower_bound(gaps_.begin(), gaps_.end(), std::make_pair(t, k),
                             [](const Gap& g, const std::pair<TensorId, KernelIndex>& x) {
                               return g.tensor != x.first ? g.tensor < x.first : g.start < x.second;
                             });
  const auto live = [&](size_t gi) { return pair_of_[gi] >= 0 && pairs_[pair_of_[gi]].live; };
  if (it != gaps_.end() && it->tensor == t && it->start == k && live(static_cast<size_t>(it - gaps_.begin()))) {
    return true;
  }
  if (it != gaps_.begin()) {
    const auto prev = static_cast<size_t>(it - gaps_.begin()) - 1;
    if (gaps_[prev].tensor == t && gaps_[prev].end == k && live(prev)) return true;
  }
  return false;
}

// Idle gaps before the greedy loop (docs/planner.md, "Tensors no kernel uses again"): their score,
// the critical time of every kernel, is the largest any candidate can have, and they move no bytes
// in steady state. Largest first (the greedy's tie-break), each on the first tier with room.
void Planner::take_idle() {
  std::vector<uint32_t> idle;
  for (uint32_t i = 0; i < gaps_.size(); ++i) {
    const Gap& g = gaps_[i];
    if (g.idle && g.bytes > 0 && static_cast<uint64_t>(g.bytes) >= opts_.min_tensor_bytes) idle.push_back(i);
  }
  std::stable_sort(idle.begin(), idle.end(),
                   [&](uint32_t a, uint32_t b) { return gaps_[a].bytes > gaps_[b].bytes; });
  for (uint32_t gi : idle) {
    if (mem_.max_all() <= budget_) return;
    const Gap& g = gaps_[gi];
    for (uint32_t t = 0; t < opts_.tiers.size(); ++t) {
      if (!tier_has_room(t, g)) continue;
      subtract(g, 1, g.len - 1);
      hold(t, g);
      pair_of_[gi] = static_cast<int32_t>(pairs_.size());
      pairs_.push_back(Pair{gi, t, 0, g.len});
      break;
    }
  }
}

// Note [Dead tensors in the planner]
// With PlannerOptions::discard_dead the runtime frees a transient tensor's tail (its absence from
// its last use until it dies; a one-way gap) without writing it (Note [Dead tensors] in the
// engine): no write bandwidth, no tier space, gone from the kernel after its start on. Such gaps
// cost nothing, so they are taken before the greedy loop, largest first, wherever their absence
// crosses a kernel over the budget; the prune pass drops those memory did not need after all
// (latest chosen first: the moves that cost bandwidth go before these).
void Planner::take_tails() {
  if (!opts_.discard_dead) return;
  std::vector<uint32_t> tails;
  for (uint32_t i = 0; i < gaps_.size(); ++i) {
    const Gap& g = gaps_[i];
    if (discardable(g) && pair_of_[i] < 0 && g.len >= 3 && g.bytes > 0 &&
        static_cast<uint64_t>(g.bytes) >= opts_.min_tensor_bytes)
      tails.push_back(i);
  }
  std::stable_sort(tails.begin(), tails.end(),
                   [&](uint32_t a, uint32_t b) { return gaps_[a].bytes > gaps_[b].bytes; });
  for (uint32_t gi : tails) {
    if (mem_.max_all() <= budget_) return;
    const Gap& g = gaps_[gi];
    if (crit_time(g, 2, g.len - 2) <= 0) continue;  // never over the budget while it would be away
    subtract(g, 2, g.len - 2);
    pair_of_[gi] = static_cast<int32_t>(pairs_.size());
    pairs_.push_back(Pair{gi, 0, 1, g.len});
  }
}

// Lazy greedy: a candidate's key is an upper bound on its score (scores only fall as M' drops and
// bandwidth fills), so a popped candidate whose fresh score still beats the next key is the best.
void Planner::greedy() {
  struct Entry {
    double key;
    int64_t bytes;
    uint32_t gap;
    bool operator<(const Entry& o) const {
      if (key != o.key) return key < o.key;
      if (bytes != o.bytes) return bytes < o.bytes;
      return gap > o.gap;
    }
  };
  const double max_weight = *std::max_element(tier_weight_.begin(), tier_weight_.end());
  std::vector<Entry> initial;
  for (uint32_t i = 0; i < gaps_.size(); ++i) {
    const Gap& g = gaps_[i];
    if (g.bytes <= 0 || static_cast<uint64_t>(g.bytes) < opts_.min_tensor_bytes || g.len < 3) continue;
    if (g.idle || pair_of_[i] >= 0) continue;  // taken before the loop (take_idle, recomputes)
    const double bound = crit_time(g, 1, g.len - 1) * max_weight;
    if (bound > 0) initial.push_back({bound, g.bytes, i});
  }
  std::priority_queue<Entry> queue(std::less<Entry>(), std::move(initial));
  while (!queue.empty() && mem_.max_all() > budget_) {
    const Entry top = queue.top();
    queue.pop();
    const Gap& g = gaps_[top.gap];
    Window best;
    int best_tier = -1;
    // No window can include the offload's first slot or the prefetch's last one.
    const double ceiling = g.one_way     ? crit_time(g, 2, g.len - 2)
                           : g.len >= 4 ? crit_time(g, 2, g.len - 3)
                                        : 0.0;
    for (uint32_t t = 0; t < opts_.tiers.size(); ++t) {
      if (best_tier >= 0 && best.score >= ceiling * tier_weight_[t]) break;  // no later tier can do better
      Window w;
      if (!tier_has_room(t, g) || !evaluate(g, t, &w)) continue;
      ++diag_.rescores;
      // The first tier in preference order wins unless a later one saves strictly more.
      if (w.score > 0 && (best_tier < 0 || w.score > best.score * (1 + 1e-9))) {
        best = w;
        best_tier = static_cast<int>(t);
      }
    }
    if (best_tier < 0) continue;  // not viable on any tier now: never again (bandwidth only fills)
    if (!queue.empty() && best.score < queue.top().key * (1.0 - tuning_.lazy_slack)) {
      queue.push({best.score, top.bytes, top.gap});
      continue;
    }
    const auto tier = static_cast<uint32_t>(best_tier);
    if (best.offload_len > 0) write_[tier].reserve_forward((g.start + 1) % n_, best.offload_len, g.bytes);
    if (best.prefetch_len > 0) read_[tier].reserve_backward(g.end, best.prefetch_len, g.bytes);
    subtract(g, best.done + 1, best.begin - best.done - 1);
    hold(tier, g);
    pair_of_[top.gap] = static_cast<int32_t>(pairs_.size());
    pairs_.push_back(Pair{top.gap, tier, best.done, best.begin});
  }
}

// Resolves what bandwidth could not hide: for every kernel still over budget, in order, move out
// (or widen the absence of) tensors that are resident there but not used by it. Such pairs stall.
void Planner::force() {
  if (mem_.max_all() <= budget_) return;
  // A gap is "removable" at kernel k when k is in the gap and the tensor is not already absent
  // there. Each gap sits in `present` (by size) while the sweep is inside one of its removable
  // linear ranges; events add and remove it, stamped with a version that changes on every update.
  struct Event {
    uint32_t at;
    uint32_t until;  // last kernel of the range
    uint32_t gap;
    uint32_t version;
    bool operator>(const Event& o) const { return at > o.at; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> adds;
  std::priority_queue<std::pair<uint32_t, uint32_t>, std::vector<std::pair<uint32_t, uint32_t>>,
                      std::greater<>>
      removes;  // (last kernel, gap)
  std::vector<uint32_t> version(gaps_.size(), 0);
  std::vector<uint32_t> until(gaps_.size(), 0);
  std::vector<uint8_t> in_set(gaps_.size(), 0);
  // The gaps a forced eviction may pick at the current kernel, by their key: their bytes (the
  // smallest covering the overshoot is evicted) or, with evict_farthest_use, the kernel of their next
  // use (the farthest is evicted; Note [Forced eviction by next use]), one-way gaps last (never read
  // back).
  std::set<std::pair<int64_t, uint32_t>> present;
  std::vector<int64_t> key(gaps_.size(), 0);
  auto key_of = [&](uint32_t gi, uint32_t at) -> int64_t {
    const Gap& g = gaps_[gi];
    if (!tuning_.evict_farthest_use) return g.bytes;
    if (g.one_way) return INT64_MAX / 2 - static_cast<int64_t>(gi);
    const int64_t end = int64_t{g.start} + g.len;  // the next use, in the coordinates of [start, start + len]
    return at > g.start ? end : end - n_;          // `at` in the wrapped part of the gap
  };

  // Kernels over budget when the pass starts, as prefix counts (for the initial scheduling).
  std::vector<uint32_t> over_prefix(n_ + 1, 0);
  for (size_t k = mem_.first_above(0, n_, budget_); k != SIZE_MAX; k = mem_.first_above(k + 1, n_, budget_)) {
    over_prefix[k + 1] = 1;
  }
  for (uint32_t k = 0; k < n_; ++k) over_prefix[k + 1] += over_prefix[k];
  auto schedule_range = [&](uint32_t gi, uint32_t first, uint32_t last, int64_t after) {
    if (first > last) return;
    const Gap& g = gaps_[gi];
    const Pieces p = pieces(n_, uint64_t{g.start} + first, uint64_t{last} - first + 1);
    for (size_t i = 0; i < p.n; ++i) {
      const int64_t lo = std::max<int64_t>(static_cast<int64_t>(p.lo[i]), after + 1);
      const int64_t hi = static_cast<int64_t>(p.hi[i]);
      if (lo >= hi) continue;
      if (over_prefix.empty() ? mem_.max(static_cast<size_t>(lo), static_cast<size_t>(hi)) <= budget_
                              : over_prefix[hi] == over_prefix[lo]) {
        continue;  // nothing over budget there, and M' only falls during this pass
      }
      adds.push({static_cast<uint32_t>(lo), static_cast<uint32_t>(hi - 1), gi, version[gi]});
    }
  };
  auto schedule = [&](uint32_t gi, int64_t after) {
    const Gap& g = gaps_[gi];
    if (g.bytes <= 0) return;
    if (pair_of_[gi] < 0) {
      schedule_range(gi, 1, g.len - 1, after);
    } else {
      const Pair& pr = pairs_[pair_of_[gi]];
      // A recompute is absent up to its point and stays as it is: a chain's input, present from
      // the point to the gap's end, is not moved there (a forced move would free it where its
      // consumer's recompute reads it).
      if (pr.recompute) return;
      schedule_range(gi, 1, pr.done, after);
      schedule_range(gi, pr.begin, g.len - 1, after);
    }
  };
  for (uint32_t gi = 0; gi < gaps_.size(); ++gi) schedule(gi, -1);
  over_prefix.clear();

  for (size_t k = mem_.first_above(0, n_, budget_); k != SIZE_MAX; k = mem_.first_above(k + 1, n_, budget_)) {
    while (!adds.empty() && adds.top().at <= k) {
      const Event e = adds.top();
      adds.pop();
      if (e.version != version[e.gap] || e.until < k) continue;
      if (in_set[e.gap]) present.erase({key[e.gap], e.gap});
      key[e.gap] = key_of(e.gap, e.at);
      present.insert({key[e.gap], e.gap});
      in_set[e.gap] = 1;
      until[e.gap] = e.until;
      removes.push({e.until, e.gap});
    }
    while (!removes.empty() && removes.top().first < k) {
      const uint32_t gi = removes.top().second;
      const uint32_t last = removes.top().first;
      removes.pop();
      if (in_set[gi] && until[gi] == last) {
        present.erase({key[gi], gi});
        in_set[gi] = 0;
      }
    }
    while (mem_.value(k) > budget_) {
      const int64_t over = mem_.value(k) - budget_;
      if (present.empty()) {
        throw Error(fmt::format(
            "planner: kernel {} ({}) keeps {} resident, over the budget of {}, and no tensor resident there "
            "can be moved (tier capacity exhausted)",
            k, trace_.kernel_name(static_cast<KernelIndex>(k)), format_bytes(static_cast<double>(mem_.value(k))),
            format_bytes(static_cast<double>(budget_))));
      }
      auto it = std::prev(present.end());
      if (!tuning_.evict_farthest_use) {
        it = present.lower_bound({over, 0});
        if (it == present.end()) it = std::prev(present.end());
      }
      const uint32_t gi = it->second;
      present.erase(it);
      in_set[gi] = 0;
      ++version[gi];
      const Gap& g = gaps_[gi];
      const uint32_t x = (static_cast<uint32_t>(k) + n_ - g.start) % n_;  // distance inside the gap
      force_at(gi, x == 0 ? n_ : x);
      if (pair_of_[gi] >= 0) schedule(gi, static_cast<int64_t>(k));
    }
  }
}

// Makes gap `gi` absent at distance x: a new (stalling) pair, or a wider window for a chosen one.
void Planner::force_at(uint32_t gi, uint32_t x) {
  const Gap& g = gaps_[gi];
  // Keep the tensor away up to the last kernel of its gap still over budget (the sweep would
  // otherwise widen it one kernel at a time); hoisting later starts the prefetch as early as
  // memory allows.
  auto last_over = [&](uint32_t from) -> uint32_t {
    if (from > g.len - 1) return 0;
    const Pieces p = pieces(n_, uint64_t{g.start} + from, g.len - from);
    for (size_t j = p.n; j-- > 0;) {
      const size_t k = mem_.last_above(p.lo[j], p.hi[j], budget_);
      if (k != SIZE_MAX) return static_cast<uint32_t>((k + n_ - g.start) % n_);
    }
    return 0;
  };
  if (pair_of_[gi] >= 0) {
    Pair& pr = pairs_[pair_of_[gi]];
    if (x <= pr.done) {
      subtract(g, x, pr.done - x + 1);
      pr.done = x - 1;
      if (!pr.late_offload) {
        pr.late_offload = true;
        diag_.unhidden_bytes += g.bytes;
        diag_.estimated_stall_us += static_cast<double>(g.bytes) / write_[pr.tier].bytes_per_us();
      }
    } else if (x >= pr.begin) {
      const uint32_t new_begin = std::max(x, last_over(x + 1)) + 1;
      subtract(g, pr.begin, new_begin - pr.begin);
      pr.begin = new_begin;
      if (!pr.late_prefetch) {
        pr.late_prefetch = true;
        diag_.unhidden_bytes += g.bytes;
        diag_.estimated_stall_us += static_cast<double>(g.bytes) / read_[pr.tier].bytes_per_us();
      }
    }
    if (!pr.forced) {
      pr.forced = true;
      ++forced_;
    }
    return;
  }
  int tier = -1;
  Window fit;
  for (uint32_t t = 0; t < opts_.tiers.size() && tier < 0; ++t) {
    if (!tier_has_room(t, g)) continue;
    Window w;
    if (evaluate(g, t, &w) && w.done < x && x < w.begin) {
      tier = static_cast<int>(t);
      fit = w;
    }
  }
  if (tier < 0) {
    for (uint32_t t = 0; t < opts_.tiers.size() && tier < 0; ++t) {
      if (tier_has_room(t, g)) tier = static_cast<int>(t);
    }
    if (tier < 0) return;  // no tier can hold it: the caller tries another tensor
    // Use whatever bandwidth the tier has left, but be away from x on regardless.
    const auto t = static_cast<uint32_t>(tier);
    const uint32_t off = discardable(g) ? 1 : write_[t].forward_len((g.start + 1) % n_, g.len - 1, g.bytes);
    fit.done = off > 0 ? std::min(off, x - 1) : x - 1;
    if (g.one_way) {
      fit.begin = g.len;
    } else {
      const uint32_t pre = read_[t].backward_len(g.end, g.len - 1, g.bytes);
      fit.begin = std::max(pre > 0 ? g.len - pre : 0, std::max(x, last_over(x + 1)) + 1);
    }
  }
  const auto t = static_cast<uint32_t>(tier);
  // An idle gap moves no bytes, a one-way gap none back: nothing of theirs is left unhidden.
  const int64_t out = g.idle || discardable(g) ? g.bytes
                                               : write_[t].reserve_forward((g.start + 1) % n_, fit.done, g.bytes);
  const int64_t in = g.one_way ? g.bytes : read_[t].reserve_backward(g.end, g.len - fit.begin, g.bytes);
  diag_.unhidden_bytes += static_cast<uint64_t>((g.bytes - out) + (g.bytes - in));
  diag_.estimated_stall_us += static_cast<double>(g.bytes - out) / write_[t].bytes_per_us() +
                              static_cast<double>(g.bytes - in) / read_[t].bytes_per_us();
  subtract(g, fit.done + 1, fit.begin - fit.done - 1);
  hold(t, g);
  pair_of_[gi] = static_cast<int32_t>(pairs_.size());
  Pair pr{gi, t, fit.done, fit.begin};
  pr.forced = out < g.bytes || in < g.bytes;
  pr.late_offload = out < g.bytes;
  pr.late_prefetch = in < g.bytes;
  if (pr.forced) ++forced_;
  pairs_.push_back(pr);
}

// Drops pairs memory no longer needs (latest chosen first), then starts each prefetch as early as
// the budget allows, keeping at least one kernel of absence. Bandwidth reservations are kept.
void Planner::prune_and_hoist() {
  auto window_max = [&](const Gap& g, uint32_t first, uint32_t count) {
    const Pieces p = pieces(n_, uint64_t{g.start} + first, count);
    int64_t m = INT64_MIN;
    for (size_t i = 0; i < p.n; ++i) m = std::max(m, mem_.max(p.lo[i], p.hi[i]));
    return m;
  };
  if (tuning_.prune) {
    std::vector<int32_t> recompute_of(pairs_.size(), -1);  // pair -> recompute_pairs_ index
    for (size_t r = 0; r < recompute_pairs_.size(); ++r) recompute_of[recompute_pairs_[r].first] = static_cast<int32_t>(r);
    for (size_t i = pairs_.size(); i-- > 0;) {
      Pair& pr = pairs_[i];
      const Gap& g = gaps_[pr.gap];
      const uint32_t count = pr.begin - pr.done - 1;
      if (count > 0 && window_max(g, pr.done + 1, count) + g.bytes > budget_) continue;
      if (pr.recompute) {  // its reads go with it, unless a move relies on one it alone makes
        const Span& sp = recompute_pairs_[static_cast<size_t>(recompute_of[i])].second;
        bool needed = false;
        for (TensorId t : sp.reads) needed |= readers_[read_key(t, sp.point)] == 1 && read_matters(t, sp.point);
        if (needed) continue;
        for (TensorId t : sp.reads) --readers_[read_key(t, sp.point)];
      }
      add_back(g, pr.done + 1, count);
      pr.live = false;
      pair_of_[pr.gap] = -1;
      ++diag_.pruned;
    }
  }
  if (tuning_.hoist_prefetch) hoist();
  if (tuning_.offloads_due_when_needed) make_offloads_due_when_needed();
}

void Planner::hoist() {
  std::vector<uint32_t> order;
  for (uint32_t i = 0; i < pairs_.size(); ++i) {
    // One-way pairs and recomputes have no prefetch to hoist.
    if (pairs_[i].live && !gaps_[pairs_[i].gap].one_way && !pairs_[i].recompute) order.push_back(i);
  }
  auto prefetch_at = [&](uint32_t i) { return (gaps_[pairs_[i].gap].start + pairs_[i].begin) % n_; };
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return prefetch_at(a) < prefetch_at(b); });
  for (uint32_t i : order) {
    Pair& pr = pairs_[i];
    const Gap& g = gaps_[pr.gap];
    if (pr.begin <= pr.done + 2) continue;
    // Latest distance in [done+2, begin-1] where adding the tensor back would exceed the budget.
    const uint32_t first = pr.done + 2;
    const Pieces p = pieces(n_, uint64_t{g.start} + first, pr.begin - first);
    uint32_t blocked = 0;  // distance, 0 = none
    for (size_t j = p.n; j-- > 0 && blocked == 0;) {
      const size_t k = mem_.last_above(p.lo[j], p.hi[j], budget_ - g.bytes);
      if (k != SIZE_MAX) blocked = static_cast<uint32_t>((k + n_ - g.start) % n_);
    }
    const uint32_t new_begin = blocked == 0 ? first : blocked + 1;
    if (new_begin >= pr.begin) continue;
    add_back(g, new_begin, pr.begin - new_begin);
    pr.begin = new_begin;
    ++diag_.hoisted;
  }
}

// Note [Offloads due when memory needs them]
// An offload is due (Move::deadline) where the slot model's window of write slots ends: the write
// is planned to take the link then, and the tensor counts as absent from there. But a kernel waits
// at an offload's deadline for its copy to end (the engine frees the memory only then, and the
// simulator models that), and the link often runs behind the slot model: with both directions busy
// each moves at the both-ways rate, a stretched variant's slots are wider than the link (Note
// [Planning for a stretched iteration]), and the Session issues transfers in due order (docs/
// simulator.md, "Issue order"). A deadline earlier than memory needs the bytes away then makes a
// kernel wait for room nothing uses yet: on session 48's H100 llama-3b autocast run at 1/2 (its
// profile with the Session's host times), 164 backward kernels waited 39 ms a step for AdamW states
// going out and forward kernels 30 ms for weights and activations. So after hoisting, each offload is made due as
// late as memory allows: the kernel before the first one where keeping the tensor would exceed the
// budget, and at least a kernel before its prefetch begins (a period needs one absent kernel) -
// the mirror of hoisting a prefetch to where memory first allows it. Latest first: a later offload
// sits further back in its link's queue, so it takes the room near it before an earlier one does.
// That run's search then replays at 299.3 ms instead of 323.9 (docs/benchmarks.md, "Where llama-3b's
// autocast steps wait, and offloads due when memory needs them, predicted").
void Planner::make_offloads_due_when_needed() {
  std::vector<uint32_t> order;
  for (uint32_t i = 0; i < pairs_.size(); ++i) {
    const Pair& pr = pairs_[i];
    if (!pr.live || pr.recompute || gaps_[pr.gap].idle || discardable(gaps_[pr.gap])) continue;
    order.push_back(i);
  }
  auto done_at = [&](uint32_t i) { return (gaps_[pairs_[i].gap].start + pairs_[i].done) % n_; };
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return done_at(a) > done_at(b); });
  for (uint32_t i : order) {
    Pair& pr = pairs_[i];
    const Gap& g = gaps_[pr.gap];
    // At most begin - 2: a kernel between done and begin stays absent.
    const uint32_t limit = pr.begin >= 2 ? pr.begin - 2 : 0;
    if (limit <= pr.done) continue;
    const uint32_t first = pr.done + 1;
    const Pieces p = pieces(n_, uint64_t{g.start} + first, limit - first + 1);
    uint32_t new_done = limit;
    for (size_t j = 0; j < p.n; ++j) {
      const size_t k = mem_.first_above(p.lo[j], p.hi[j], budget_ - g.bytes);
      if (k != SIZE_MAX) {
        const uint32_t dist = static_cast<uint32_t>((k + n_ - g.start) % n_);
        new_done = dist - 1;
        break;
      }
    }
    if (new_done <= pr.done) continue;
    add_back(g, first, new_done - pr.done);
    pr.done = new_done;
    ++diag_.offloads_due_later;
  }
}

Plan Planner::emit() const {
  Plan plan;
  plan.budget_bytes = opts_.budget_bytes;
  plan.tiers = opts_.tiers;
  plan.discard_dead = opts_.discard_dead;
  for (const Pair& pr : pairs_) {
    if (!pr.live) continue;
    const Gap& g = gaps_[pr.gap];
    if (pr.recompute) {
      plan.moves.push_back(Move{g.tensor, MoveOp::recompute, 0, g.start, g.start + pr.begin});
      continue;
    }
    if (g.idle) {
      // Moves bytes only when the tensor is found on the device (the first iteration, or after a
      // drifted one used it): due when the tier's spare write bandwidth would have written it.
      const uint32_t len = write_[pr.tier].forward_len((g.start + 1) % n_, n_ - 1, g.bytes);
      const KernelIndex deadline = len > 0 ? (g.start + len) % n_ : n_ - 1;
      plan.moves.push_back(Move{g.tensor, MoveOp::offload, pr.tier, g.start, deadline});
      continue;
    }
    plan.moves.push_back(Move{g.tensor, MoveOp::offload, pr.tier, g.start, (g.start + pr.done) % n_});
    if (g.one_way) continue;
    plan.moves.push_back(Move{g.tensor, MoveOp::prefetch, pr.tier, (g.start + pr.begin) % n_, g.end});
  }
  std::stable_sort(plan.moves.begin(), plan.moves.end(), [](const Move& a, const Move& b) {
    if (a.start != b.start) return a.start < b.start;
    return a.op < b.op;
  });
  return plan;
}

Plan Planner::run(PlannerStats* stats, PlannerDiagnostics* diag) {
  const auto t0 = std::chrono::steady_clock::now();
  check_options();
  check_active_bytes();
  budget_ = static_cast<int64_t>(opts_.budget_bytes);
  PlannerStats st;
  if (n_ > 0) {
    // Recomputes first; the moves are then planned on the trace in which each recompute point reads
    // the producer's inputs (Note [Recompute in the planner]).
    std::vector<Span> spans;
    Trace with_reads;
    const Trace* view = &trace_;
    {
      const Lifetimes original(trace_);
      std::vector<std::vector<TensorId>> reads(n_);
      spans = choose_recomputes(original, memory_curve(trace_, original), &reads);
      if (!spans.empty()) {
        with_reads.tensors = trace_.tensors;
        with_reads.writes_recorded = trace_.writes_recorded;  // written_at stays listed
        std::vector<TensorId> ids;
        for (KernelIndex k = 0; k < n_; ++k) {
          const auto own = trace_.kernel_tensors(k);
          ids.assign(own.begin(), own.end());
          ids.insert(ids.end(), reads[k].begin(), reads[k].end());
          with_reads.add_kernel(trace_.kernel_name(k), trace_.kernel_time_us(k), ids);
          for (TensorId t : reads[k]) {  // a revived tensor lives to its last read (Note [Deep recompute chains])
            std::optional<KernelIndex>& until = with_reads.tensors[t].alive_until;
            if (until && *until < k) until.reset();
          }
        }
        view = &with_reads;
      }
    }
    const Lifetimes lifetimes(*view);
    const std::vector<InactivePeriod> periods = inactive_periods(*view, lifetimes);
    const std::vector<uint64_t> curve = memory_curve(*view, lifetimes);
    tau_.assign(trace_.kernel_times_us().begin(), trace_.kernel_times_us().end());
    gaps_.reserve(periods.size());
    for (const InactivePeriod& p : periods) {
      Gap g{p.tensor, static_cast<int64_t>(p.bytes), p.start, p.end,
            p.end > p.start ? p.end - p.start : p.end + n_ - p.start};
      if (p.no_next_use && p.wraps) {  // idle: offloaded after kernel 0, absent everywhere
        g = Gap{p.tensor, g.bytes, 0, 0, n_ + 1, true, true};
      } else if (p.no_next_use) {  // tail: kernels start+1 .. end, then the tensor dies
        g = Gap{p.tensor, g.bytes, p.start, (p.end + 1) % n_, p.end + 1 - p.start, true};
      }
      gaps_.push_back(g);
      if (p.bytes >= opts_.min_tensor_bytes) ++st.candidates;
    }
    pair_of_.assign(gaps_.size(), -1);
    std::vector<int64_t> m(curve.begin(), curve.end());
    std::vector<int64_t> crit(n_, 0);
    tau_ns_.resize(n_);
    for (uint32_t k = 0; k < n_; ++k) {
      tau_ns_[k] = tau_[k] > 0 ? std::max<int64_t>(1, std::llround(tau_[k] * 1e3)) : 0;
      if (m[k] > budget_) crit[k] = tau_ns_[k];
      st.peak_before_bytes = std::max(st.peak_before_bytes, curve[k]);
    }
    mem_ = PressureTree(m, budget_);
    crit_ = Fenwick<int64_t>(crit);
    const std::vector<int64_t> zeros(n_, 0);
    for (const TierSpec& t : opts_.tiers) {
      write_.emplace_back(tau_, t.write_gbps);
      read_.emplace_back(tau_, t.read_gbps);
      held_.emplace_back(zeros, INT64_MAX);
      tier_weight_.push_back(tuning_.cost_per_time ? 1.0 / (1.0 / t.write_gbps + 1.0 / t.read_gbps) : 1.0);
    }
    diag_.tier_bytes.assign(opts_.tiers.size(), 0);
    auto lap = [last = std::chrono::steady_clock::now()]() mutable {
      const auto now = std::chrono::steady_clock::now();
      const double s = std::chrono::duration<double>(now - last).count();
      last = now;
      return s;
    };
    diag_.setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    take_recomputes(spans);
    take_idle();
    take_tails();
    greedy();
    diag_.greedy_seconds = lap();
    force();
    diag_.force_seconds = lap();
    prune_and_hoist();
    diag_.finish_seconds = lap();
    const int64_t peak = mem_.max_all();
    if (peak > budget_) {
      const size_t k = mem_.argmax_all();
      throw Error(fmt::format("planner: kernel {} ({}) keeps {} resident, over the budget of {}, and nothing "
                              "resident there can be moved",
                              k, trace_.kernel_name(static_cast<KernelIndex>(k)),
                              format_bytes(static_cast<double>(peak)), format_bytes(static_cast<double>(budget_))));
    }
    st.peak_after_bytes = static_cast<uint64_t>(std::max<int64_t>(peak, 0));
    size_t live_chosen = 0, live_forced = 0, offload_only = 0;
    for (const Pair& pr : pairs_) {
      if (!pr.live) continue;
      if (pr.recompute) {
        ++st.recomputes;
        st.recompute_us += recompute_time_us(trace_, gaps_[pr.gap].tensor);
        continue;
      }
      (pr.forced ? live_forced : live_chosen)++;
      offload_only += gaps_[pr.gap].one_way;
      if (gaps_[pr.gap].idle) continue;  // moves no bytes in steady state
      if (discardable(gaps_[pr.gap])) {
        ++st.discards;
        continue;  // freed, not written
      }
      diag_.bytes_offloaded += static_cast<uint64_t>(gaps_[pr.gap].bytes);
      diag_.tier_bytes[pr.tier] += static_cast<uint64_t>(gaps_[pr.gap].bytes);
    }
    st.chosen = live_chosen;
    st.forced = live_forced;
    st.offload_only = offload_only;
  }
  Plan plan = emit();
  st.plan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stats) *stats = st;
  if (diag) *diag = diag_;
  return plan;
}

}  // namespace

Plan make_plan_tuned(const Trace& trace, const PlannerOptions& opts, const PlannerTuning& tuning,
                     PlannerStats* stats, PlannerDiagnostics* diag) {
  Planner planner(trace, opts, tuning);
  Plan plan = planner.run(stats, diag);
  if (tuning.writeback_slot_fraction > 0) plan = add_writebacks(trace, plan, tuning.writeback_slot_fraction);
  return plan;
}

}  // namespace planner_detail

Plan make_plan(const Trace& trace, const PlannerOptions& opts, PlannerStats* stats) {
  planner_detail::PlannerTuning tuning;
  tuning.revive_dead_inputs = opts.deep_recompute;
  return planner_detail::make_plan_tuned(trace, opts, tuning, stats, nullptr);
}

// Note [Planning for a duplex link]
// The slot model gives each direction of a tier its own slots at its one-way bandwidth; it does
// not know that a slot used both ways carries less each way (TierSpec::duplex_gbps; the simulator's
// Note [Duplex link]). Coupling the two directions' slots would make a slot's capacity depend on
// what the other direction reserves there later, shrinking slots already filled and undoing
// earlier decisions of the greedy loop. Instead the variants include plans made at the both-ways
// bandwidth in both directions (as if every transfer overlapped one going the other way: the
// pessimistic end), beside the one-way ones, and plan_best keeps whichever the simulator, which
// models the shared link, finds fastest.
namespace {

// Note [Planning for a stretched iteration]
// The slot model gives each kernel's link slot bandwidth x its kernel time: links carry bytes only
// while kernels run. When the bytes to move take longer than the kernels (a link-bound plan, e.g.
// bf16 autocast at a quarter of the footprint: 94 ms of kernels, 20 GiB each way), the iteration
// stretches to several times its compute, the links keep moving bytes during the stalls, and the
// slots (sized for an iteration with no stall) run out long before the link does: the greedy
// leaves most of the pressure to the forced pass, which ignores the links. A plan made with every
// slot scaled by the stretch the plan will have - the bytes make_plan's own plan moves per
// direction at the tier's bandwidth, over the compute (its floor over the ideal) - spreads the
// greedy's moves over the time the iteration will have; sqrt(stretch) sits between. plan_best keeps
// whichever the simulator (which times stalls) finds fastest.
// Scaling the bandwidths also scales the recompute rule's price of a byte (Note [Recompute in the
// planner]: a producer is rerun when its time is within recompute_factor x the bytes' link time),
// so a stretched plan recomputes only what is cheap against a link f times faster than the real
// one, and moves the rest over the real one. On the H200 profile of llama-1b in bf16 autocast at
// 1/4 of its footprint with steps in backward, each layer's MLP gate and up projections (244 us
// of kernel for 64 MiB, 1.23 ms on the link) then stayed resident across the loss instead of being
// made again in the backward, whose kernels wait on the link most of the time. So each stretched
// variant is also tried with recompute_factor x f: the stretched slots, recompute priced against
// the link as it is (docs/planner.md, "Link-bound plans").
constexpr double kMinStretch = 1.25;
// Note [Points pulled to their readers']: on session 47's llama-3b profile at 1/2 windows of 32,
// 64, 128, 256 and 1,024 kernels searched to 374, 368, 370, 368 and 374 ms (388 without).
constexpr uint32_t kPullWindow = 128;
// What a variant's name gains when make_plan_variants adds writebacks to it (variant_settings).
constexpr std::string_view kWritebacksSuffix = ", writebacks x";

double link_stretch(const Trace& trace, const PlannerOptions& opts, const Plan& plan) {
  const double ideal_us = trace.total_time_us();
  if (ideal_us <= 0) return 1;
  std::vector<double> out(opts.tiers.size(), 0), in(opts.tiers.size(), 0);
  for (const Move& m : plan.moves) {
    if (m.op == MoveOp::recompute) continue;
    (m.op == MoveOp::prefetch ? in : out)[m.tier] += static_cast<double>(trace.tensors[m.tensor].bytes);
  }
  double floor_us = ideal_us;
  for (size_t t = 0; t < opts.tiers.size(); ++t) {
    floor_us = std::max({floor_us, out[t] / (opts.tiers[t].write_gbps * 1e3), in[t] / (opts.tiers[t].read_gbps * 1e3)});
  }
  return floor_us / ideal_us;
}

}  // namespace

namespace {

struct VariantJob {
  std::string name;
  PlannerOptions opts;
  planner_detail::PlannerTuning tuning;
};

// The search's settings besides make_plan's own; `own` is make_plan's plan, by whose bytes the
// stretched variants are scaled (Note [Planning for a stretched iteration]).
std::vector<VariantJob> variant_jobs(const Trace& trace, const PlannerOptions& opts, const Plan& own) {
  using planner_detail::PlannerTuning;
  const PlannerTuning base;
  std::vector<VariantJob> jobs;
  auto add = [&](std::string name, const PlannerOptions& o, const PlannerTuning& t) {
    jobs.push_back({std::move(name), o, t});
  };
  // A variant's tuning: the base with these knobs.
  const auto tuned = [&](double slack, bool farthest = false, bool without_persistent_reads = false,
                         bool deep_chains = false, bool across_peak = false) {
    PlannerTuning t = base;
    t.lazy_slack = slack;
    t.evict_farthest_use = farthest;
    t.recompute_without_persistent_reads = without_persistent_reads;
    t.revive_dead_inputs = deep_chains;
    t.recompute_across_peak = across_peak;
    return t;
  };
  // The options with every tier's bandwidths times f.
  const auto scaled = [&](double f) {
    PlannerOptions o = opts;
    for (TierSpec& tier : o.tiers) {
      tier.read_gbps *= f;
      tier.write_gbps *= f;
      tier.duplex_gbps *= f;
    }
    return o;
  };
  const char* const kFarthest = ", evict farthest use";
  const char* const kWithoutReads = ", recompute without persistent reads";
  const char* const kAcrossPeak = "deep recompute across the peak";
  const char* const kPulled = ", points pulled to their readers";
  for (double slack : {0.0, 0.03, 0.25, 0.5, 0.75, 1.0}) add(fmt::format("slack {}", slack), opts, tuned(slack));
  for (double slack : {0.1, 0.25}) {
    PlannerTuning t = tuned(slack);
    t.hoist_prefetch = false;
    add(fmt::format("slack {}, no hoisting", slack), opts, t);
  }
  for (uint64_t floor : {uint64_t{1} << 20, uint64_t{16} << 20}) {  // small tensors: forced pass only
    if (floor <= opts.min_tensor_bytes) continue;
    PlannerOptions o = opts;
    o.min_tensor_bytes = floor;
    for (double slack : {0.1, 0.5}) add(fmt::format("min tensor {}, slack {}", format_bytes(double(floor)), slack), o, tuned(slack));
  }
  const bool rc = opts.recompute && has_recomputable(trace);
  if (rc) {  // how much to recompute depends on the trace
    PlannerOptions o = opts;
    o.recompute = false;
    add("no recompute", o, base);
    for (double factor : {0.25, 4.0}) {
      PlannerTuning t = base;
      t.recompute_factor = factor;
      add(fmt::format("recompute factor {}", factor), opts, t);
    }
    // Note [Recomputes that read parameters]
    for (double slack : {0.1, 0.5, 0.75, 1.0}) {
      add(fmt::format("recompute without persistent reads, slack {}", slack), opts, tuned(slack, false, true));
    }
  }
  // Note [Forced eviction by next use]
  // The forced pass evicts, by default, the smallest tensor that covers the overshoot: few bytes per
  // eviction, but a tensor used again soon is evicted again and again (at the optimizer step, a
  // parameter just updated leaves dirty and is read back before the next forward). Evicting the one
  // used again last (Belady's rule) covers the most kernels per eviction, so fewer bytes cross the
  // link when the forced pass places most of the moves (docs/planner.md, "Link-bound plans").
  for (bool without : {false, true}) {
    if (without && !rc) continue;
    for (double slack : {0.1, 0.5, 0.75}) {
      add(fmt::format("evict farthest use{}, slack {}", without ? kWithoutReads : "", slack), opts,
          tuned(slack, true, without));
    }
  }
  // Note [Deep recompute chains]
  const bool deep = opts.deep_recompute && rc;
  if (deep) {
    for (bool farthest : {false, true}) {
      for (double slack : {0.1, 0.5, 0.75}) {
        add(fmt::format("deep recompute{}, slack {}", farthest ? kFarthest : "", slack), opts,
            tuned(slack, farthest, false, true));
      }
    }
    // Note [Recompute across the peak]
    if (opts.recompute_across_peak) {
      for (bool pulled : {false, true}) {  // Note [Points pulled to their readers']
        for (bool farthest : {false, true}) {
          for (double slack : {0.1, 0.5}) {
            PlannerTuning t = tuned(slack, farthest, false, true, true);
            if (pulled) t.pull_window = kPullWindow;
            add(fmt::format("{}{}{}, slack {}", kAcrossPeak, pulled ? kPulled : "", farthest ? kFarthest : "", slack),
                opts, t);
          }
        }
      }
    }
  }
  // Note [Planning for a stretched iteration]
  if (const double stretch = link_stretch(trace, opts, own); stretch > kMinStretch) {
    for (double f : {std::sqrt(stretch), stretch}) {
      const PlannerOptions o = scaled(f);
      for (bool farthest : {false, true}) {
        for (bool without : {false, true}) {
          if (without && !rc) continue;
          for (double slack : {0.1, 0.5}) {
            for (bool true_price : {false, true}) {
              if (true_price && !rc) continue;
              const char* const priced = true_price ? ", recompute at the true link" : "";
              for (int chains : {0, 1, 2, 3}) {  // none, deep, deep across the peak, and pulled
                if (chains > 0 && (without || !deep)) continue;
                if (chains >= 2 && !opts.recompute_across_peak) continue;
                PlannerTuning t = tuned(slack, farthest, without, chains > 0, chains >= 2);
                if (chains == 3) t.pull_window = kPullWindow;
                if (true_price) t.recompute_factor *= f;
                add(fmt::format("stretch {:.2f}{}{}{}{}{}, slack {}", f, priced,
                                chains == 0 ? "" : chains == 1 ? ", deep recompute" : ", " + std::string(kAcrossPeak),
                                chains == 3 ? kPulled : "", farthest ? kFarthest : "", without ? kWithoutReads : "",
                                slack),
                    o, t);
              }
            }
          }
        }
      }
    }
  }
  for (double slack : {0.1, 0.25}) add(fmt::format("bandwidth x0.8, slack {}", slack), scaled(0.8), tuned(slack));
  // See Note [Planning for a duplex link].
  PlannerOptions both = opts;
  bool shared = false;
  for (TierSpec& tier : both.tiers) {
    if (tier.duplex_gbps <= 0) continue;
    shared |= tier.duplex_gbps < std::max(tier.read_gbps, tier.write_gbps);
    tier.read_gbps = std::min(tier.read_gbps, tier.duplex_gbps);
    tier.write_gbps = std::min(tier.write_gbps, tier.duplex_gbps);
  }
  if (shared) {
    for (double slack : {0.0, 0.25, 0.5}) {
      PlannerTuning t = base;
      t.lazy_slack = slack;
      add(fmt::format("both-ways bandwidth, slack {}", slack), both, t);
    }
  }
  return jobs;
}

// Plans `jobs` on parallel threads (each planner is independent of the others) after `out`, kept
// in the order queued; one failing (no recompute, small tensors left to the forced pass: more to
// hold than the tiers can) only leaves that variant out. Then, with opts.writebacks, every variant
// again with writebacks.
std::vector<PlanVariant> plan_jobs(const Trace& trace, const PlannerOptions& opts, std::vector<VariantJob> jobs,
                                   std::vector<PlanVariant> out) {
  std::vector<std::optional<Plan>> plans(jobs.size());
  parallel_for(jobs.size(), [&](size_t i) {
    try {
      plans[i] = planner_detail::make_plan_tuned(trace, jobs[i].opts, jobs[i].tuning, nullptr, nullptr);
      plans[i]->tiers = opts.tiers;  // the true bandwidths, whatever the variant planned with
    } catch (const Error&) {
      // left out (above)
    }
  });
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (plans[i]) out.push_back({std::move(jobs[i].name), std::move(*plans[i])});
  }
  // Note [Planning writebacks] (writeback.cpp): every variant again with its dirty offloads written
  // early where the write slots have room, at the slot model's bandwidth and at the stretch the
  // variant's own bytes imply (a link-bound iteration lasts longer than its kernels).
  if (opts.writebacks && trace.writes_recorded) {
    const size_t planned = out.size();
    std::vector<std::vector<PlanVariant>> more(planned);
    parallel_for(planned, [&](size_t i) {
      const double stretch = link_stretch(trace, opts, out[i].plan);
      std::vector<double> fractions{1.0};
      if (stretch > kMinStretch) fractions.push_back(stretch);
      for (double f : fractions) {
        Plan p = planner_detail::add_writebacks(trace, out[i].plan, f);
        if (p.moves.size() == out[i].plan.moves.size()) continue;  // none fits
        more[i].push_back({fmt::format("{}{}{:.2f}", out[i].name, kWritebacksSuffix, f), std::move(p)});
      }
    });
    for (std::vector<PlanVariant>& m : more) {
      for (PlanVariant& v : m) out.push_back(std::move(v));
    }
  }
  return out;
}

}  // namespace

std::vector<PlanVariant> make_plan_variants(const Trace& trace, const PlannerOptions& opts) {
  // make_plan's own plan first: its failure is the answer (nothing fits).
  std::vector<PlanVariant> out;
  out.push_back({"default", planner_detail::make_plan_tuned(trace, opts, {}, nullptr, nullptr)});
  std::vector<VariantJob> jobs = variant_jobs(trace, opts, out.front().plan);
  return plan_jobs(trace, opts, std::move(jobs), std::move(out));
}

// Note [Refining the fastest variant's recomputes]
// How much to recompute is a choice of its own, next to the heuristics' settings the variants
// cross: where the link has room (a compute-bound iteration) moving a tensor costs the step
// nothing and a recompute costs its producer's time. Recomputing fp32 math attention's
// probabilities (2.4 ms each for 512 MiB, a quarter of their link time; Note [Inputs kept for a
// recompute]) cost llama-1b at 1/2 of its footprint on the H200's profile 6% simulated in the
// variant that won without them, while a variant recomputing less (factor 0.25) won nothing with
// the other settings at their defaults. So the search plans the fastest variant's own settings
// again with the rule's factor times 0.1, 0.25 and 4, and without kept inputs, and keeps whichever
// the simulator finds fastest (plan_best).
std::string_view variant_settings(std::string_view name) {
  return name.substr(0, name.find(kWritebacksSuffix));
}

std::vector<PlanVariant> refine_plan_variant(const Trace& trace, const PlannerOptions& opts, const Plan& own,
                                             std::string_view name) {
  if (!opts.recompute || !has_recomputable(trace)) return {};
  const std::string_view base_name = variant_settings(name);
  std::optional<VariantJob> job;
  if (base_name == "default") {
    job = VariantJob{"default", opts, {}};
  } else {
    for (VariantJob& j : variant_jobs(trace, opts, own)) {
      if (j.name == base_name) {
        job = std::move(j);
        break;
      }
    }
  }
  if (!job || !job->opts.recompute) return {};
  std::vector<VariantJob> jobs;
  for (double f : {0.1, 0.25, 4.0}) {
    VariantJob j = *job;
    j.tuning.recompute_factor *= f;
    j.name = fmt::format("{}, recompute factor x{}", job->name, f);
    jobs.push_back(std::move(j));
  }
  if (job->tuning.keep_dead_inputs) {
    VariantJob j = *job;
    j.tuning.keep_dead_inputs = false;
    j.name = fmt::format("{}, no kept inputs", job->name);
    jobs.push_back(std::move(j));
  }
  return plan_jobs(trace, opts, std::move(jobs), {});
}

}  // namespace teraio
