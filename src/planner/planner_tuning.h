// Knobs behind the planner's decisions (docs/planner.md, "Decisions"), exposed to the tests and the
// benchmark so each decision can be re-measured. make_plan uses the defaults below; these are not
// part of the public API.
#pragma once

#include "teraio/planner.h"

namespace teraio::planner_detail {

struct PlannerTuning {
  // Benefit counts min(bytes, M'[k] - budget) per critical kernel instead of the full size (the
  // paper credits the full size). Default off: measured no better, and O(window) per score.
  bool clip_benefit = false;
  // Score = benefit / (transfer time to and from the tier) instead of benefit / bytes. Default off:
  // with per-byte cost the two rank identically within a tier, and per-time cost makes the fast
  // host tier win every tie, spending its (capped) capacity on the first candidates.
  bool cost_per_time = false;
  // After planning, drop pairs that memory no longer needs and start prefetches as early as memory
  // allows. Default on.
  bool prune = true;
  // Lazy greedy slack: a re-scored candidate is taken when its fresh score is within this fraction
  // of the best remaining upper bound (0 = exact greedy order). Default 0.1: see docs/planner.md.
  double lazy_slack = 0.1;
  bool hoist_prefetch = true;
  // After hoisting, make each offload due as late as memory allows (Note [Offloads due when memory
  // needs them], planner.cpp). Default on.
  bool offloads_due_when_needed = true;
  // A recomputable gap is recomputed when its producer's kernel time is at most this factor times
  // the time its bytes take on the fastest tier's slower link (and moving cannot relieve as much).
  // Default 1: recompute what is cheaper than one crossing of the link.
  double recompute_factor = 1.0;
  // Recompute no gap whose point would read a persistent tensor (a parameter) that the point's
  // kernel does not use. Default off; a plan_best variant (Note [Recomputes that read parameters],
  // planner.cpp).
  bool recompute_without_persistent_reads = false;
  // Deep recompute chains (Note [Deep recompute chains], planner.cpp): a recompute's inputs that
  // are freed or dead at its point are made there too, recursively, and freed again. Default off;
  // plan_best variants.
  bool revive_dead_inputs = false;
  // Recompute across the peak (Note [Recompute across the peak], planner.cpp): only the gaps that
  // span the kernel where memory peaks without a plan are recomputed, with deep chains up to
  // kMaxPeakDepth producers down, and a chain is priced at every producer it reruns. Default off;
  // plan_best variants (with revive_dead_inputs) unless PlannerOptions::recompute_across_peak is
  // false.
  bool recompute_across_peak = false;
  // Across the peak, a recompute's point is pulled back to the point of a recompute that reads it
  // (through dead inputs) when that is at most this many kernels before its own next use, so one
  // rerun serves both (Note [Points pulled to their readers'], planner.cpp). 0: off.
  uint32_t pull_window = 0;
  // A recompute's input that the trace has dead by the point (and that is not revived) is kept:
  // read at the point, so it lives on to it and the moves may carry it away and back meanwhile
  // (Note [Inputs kept for a recompute], planner.cpp). Default on; off, such a recompute is not
  // taken.
  bool keep_dead_inputs = true;
  // ... and only when what the point must bring for it (kept inputs, persistent reads) is at most
  // this fraction of the tensor's bytes.
  double kept_bytes_fraction = 0.25;
  // The forced pass evicts, at a kernel over the budget, the resident tensor whose next use is
  // farthest (Note [Forced eviction by next use], planner.cpp) instead of the smallest that covers
  // the overshoot. Default off; a plan_best variant.
  bool evict_farthest_use = false;
  // After planning, give dirty offloads writebacks where the write slots, scaled by this factor,
  // have room (Note [Planning writebacks], writeback.cpp). 0: off (the default); plan_best offers
  // variants with it.
  double writeback_slot_fraction = 0;
};

// The writeback pass of Note [Planning writebacks] over a finished, valid plan; `plan` unchanged
// when the trace does not record writes, `slot_fraction` <= 0 or nothing fits.
Plan add_writebacks(const Trace& trace, const Plan& plan, double slot_fraction);

// Extra numbers the planner knows that PlannerStats does not carry.
struct PlannerDiagnostics {
  uint64_t bytes_offloaded = 0;         // over all pairs
  std::vector<uint64_t> tier_bytes;     // offloaded bytes per tier
  uint64_t unhidden_bytes = 0;          // forced-pair bytes with no reserved bandwidth
  double estimated_stall_us = 0;        // unhidden bytes / link bandwidth (the planner's own model)
  size_t pruned = 0;                    // pairs dropped by the prune pass
  size_t hoisted = 0;                   // prefetches started earlier than planned
  size_t offloads_due_later = 0;        // offloads made due later than planned
  size_t rescores = 0;                  // candidate evaluations in the greedy loop
  double setup_seconds = 0, greedy_seconds = 0, force_seconds = 0, finish_seconds = 0;
};

Plan make_plan_tuned(const Trace& trace, const PlannerOptions& opts, const PlannerTuning& tuning,
                     PlannerStats* stats, PlannerDiagnostics* diag);

}  // namespace teraio::planner_detail
