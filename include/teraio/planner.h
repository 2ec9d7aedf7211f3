// The migration planner (the paper's Algorithm 1, made fast, plus recompute as a third place):
// trace + budget + tiers -> Plan.
// Pure computation: no CUDA, no I/O, no threads. docs/planner.md explains every decision.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/plan.h"
#include "teraio/trace.h"

namespace teraio {

struct PlannerOptions {
  uint64_t budget_bytes = 0;
  // In order of preference (e.g. ssd first, then host). Each tier has its own read and write link.
  std::vector<TierSpec> tiers;
  // Tensors smaller than this are left out of the greedy search; they are moved only when nothing
  // else can bring a kernel within the budget (docs/planner.md, "Minimum tensor size").
  uint64_t min_tensor_bytes = 1 << 20;
  // Recompute tensors the trace marks recomputable where that costs less than moving them
  // (docs/planner.md, "Recompute"). Has no effect on a trace without recomputable tensors (every v1
  // trace). false: plan moves only (`teraio plan --no-recompute`).
  bool recompute = true;
  // The plan is run by something that discards dead tensors (Plan::discard_dead; docs/planner.md,
  // "Dead tensors"): a transient tensor's tail, from its last use until it dies, may then be taken
  // away for free. False: such tails are written like any offload.
  bool discard_dead = false;
  // The plan is run by something that executes writeback moves (docs/formats.md, "Writebacks"):
  // make_plan_variants then offers variants with writebacks (docs/planner.md, "Writebacks"). False
  // (the default): no writeback in any plan (the Session sets it unless TERAIO_WRITEBACKS=0).
  bool writebacks = false;
  // Recompute chains of any depth (docs/planner.md, "Deep recompute chains"): a recompute's inputs
  // freed or dead at its point are made there too and freed again. make_plan plans that way and
  // make_plan_variants offers such variants. False (the default; the Session sets it unless
  // TERAIO_DEEP_RECOMPUTE=0).
  bool deep_recompute = false;
  // With deep_recompute, make_plan_variants also offers deep chains across the peak
  // (docs/planner.md, "Recompute across the peak"). True (the default; a Session clears it with
  // TERAIO_RECOMPUTE_ACROSS_PEAK=0, for an A/B).
  bool recompute_across_peak = true;
};

struct PlannerStats {
  size_t candidates = 0;        // inactive periods considered
  size_t chosen = 0;            // periods turned into an offload/prefetch pair
  size_t forced = 0;            // pairs added for pressure the bandwidth cannot hide (they stall)
  // Of chosen + forced: offloads without a prefetch (a tail after a tensor's last use, or a
  // persistent tensor no kernel uses); each is one move instead of two.
  size_t offload_only = 0;
  size_t discards = 0;          // of offload_only: dead tails freed without a write (discard_dead)
  size_t recomputes = 0;        // periods recomputed instead of moved
  double recompute_us = 0;      // their producers' kernel time, added to the compute stream
  uint64_t peak_before_bytes = 0;
  uint64_t peak_after_bytes = 0;  // planned resident peak (<= budget when the plan fits)
  double plan_seconds = 0;
};

// Plans moves so that resident bytes stay within opts.budget_bytes at every kernel. Throws
// teraio::Error naming the kernel when one kernel's own tensors exceed the budget, or on bad
// options (no tiers, zero bandwidth). The returned plan is valid (see plan_check.h); its
// `predicted` field is left for the simulator to fill.
Plan make_plan(const Trace& trace, const PlannerOptions& opts, PlannerStats* stats = nullptr);

// Candidate plans for a search (plan_best in teraio/sweep.h): make_plan's plan first, then plans
// made with other settings of the planner's heuristics (the greedy loop's slack, prefetch hoisting,
// planning for 80% of each tier's bandwidth so that transfers get slack). Each is valid for `opts`;
// which one runs fastest depends on the trace, and planning is cheap next to training. The
// variants are planned on parallel threads (each planner single-threaded); the list and its order
// do not depend on the thread count.
struct PlanVariant {
  std::string name;  // e.g. "default", "slack 0.25, no hoisting", "bandwidth x0.8"
  Plan plan;
};
std::vector<PlanVariant> make_plan_variants(const Trace& trace, const PlannerOptions& opts);

// The settings a variant's name stands for: the name less the writebacks make_plan_variants added
// to it ("slack 0.5, writebacks x1.00" -> "slack 0.5").
std::string_view variant_settings(std::string_view name);

// The settings of variant `name` (one make_plan_variants returned) planned again with the recompute
// rule's factor times 0.1, 0.25 and 4 and without inputs kept for a recompute, each also with
// writebacks when opts.writebacks (Note [Refining the fastest variant's recomputes],
// src/planner/planner.cpp); empty when the trace has nothing to recompute, recompute is off, or
// `name` is not a variant with recompute. `own` is make_plan's plan for (trace, opts), the first
// variant, by whose bytes the stretched settings are scaled.
std::vector<PlanVariant> refine_plan_variant(const Trace& trace, const PlannerOptions& opts, const Plan& own,
                                             std::string_view name);

}  // namespace teraio
