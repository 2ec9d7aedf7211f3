// A migration plan (format teraio.plan v2, docs/formats.md; v1 is still read): the moves of one
// iteration, repeated every iteration. Move indices are kernel indices of the trace the plan was
// made for.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "teraio/trace.h"

namespace teraio {

// A storage tier as the planner sees it. read = tier -> GPU (prefetch), write = GPU -> tier
// (offload). Bandwidths in GB/s = 1e9 bytes per second.
struct TierSpec {
  std::string name;
  uint64_t capacity_bytes = 0;
  double read_gbps = 0;
  double write_gbps = 0;
  // Per direction while reads and writes of this tier move at once (one link carries both: a PCIe
  // link ran 49.6 GB/s each way against 55.2 one way on the H200); each direction then runs at
  // min(its own bandwidth, duplex_gbps). 0: the directions are independent (the v1 model; what a
  // plan file without the field means). docs/simulator.md, "Duplex links".
  double duplex_gbps = 0;
};

// The both-ways bandwidth assumed when only one-way figures are known (Session tiers with a given
// bandwidth, or whose probe could not run both ways): this fraction of the slower direction, the
// ratio measured on the H200's host link (docs/benchmarks.md, "The link both ways").
inline constexpr double kDefaultDuplexFraction = 0.9;
inline double default_duplex_gbps(double read_gbps, double write_gbps) {
  return kDefaultDuplexFraction * (read_gbps < write_gbps ? read_gbps : write_gbps);
}

// Parses one tier spec of include/teraio/tier_args.h with its bandwidths, e.g. "ssd:2TiB:6.5:6.5"
// or "host:64GiB:50:50" (named "host"); throws teraio::Error, also when the bandwidths are missing.
TierSpec parse_tier_spec(std::string_view text);
// Parses every --tier text (each one spec or a comma-separated list of them) and checks that the
// names are distinct.
std::vector<TierSpec> parse_tier_specs(const std::vector<std::string>& texts);
// Throws teraio::Error naming `what` when two tiers share a name: a plan names its tier in every
// move, so the names must tell the tiers apart.
void check_tier_names(const std::vector<TierSpec>& tiers, std::string_view what);

enum class MoveOp : uint8_t { offload, prefetch, recompute, writeback };
std::string_view to_string(MoveOp op);

// offload: may begin once kernel `start` has finished, must be complete by the end of kernel
// `deadline`; the tensor's device memory is free from then on.
// prefetch: takes the tensor's device memory when kernel `start` begins, must be complete before
// kernel `deadline` begins (the kernel that next uses the tensor).
// An offload no prefetch follows moves a tensor nothing uses again: away until it dies (after its
// alive_until), or for good (a persistent tensor no kernel uses). docs/formats.md has the rules.
// Indices are cyclic: deadline < start wraps into the next iteration.
// recompute: the tensor's device memory is freed once kernel `start` has finished and the tensor is
// made again, by rerunning its producer on the compute stream, just before kernel `deadline`
// begins (start < deadline - 1, no wrap). No tier, no link: it costs the producer's kernel time.
// Several recomputes before one kernel run in the order of their producers (docs/formats.md).
// writeback (v2): copies the tensor to `tier` once kernel `start` has finished, complete by the end
// of kernel `deadline`, while the tensor STAYS resident; the next move of the tensor is an offload
// to the same tier with no write in between, which is then clean (frees at once, writes nothing).
// Needs a trace that records writes. docs/formats.md, "Writebacks".
struct Move {
  TensorId tensor = 0;
  MoveOp op = MoveOp::offload;
  uint32_t tier = 0;  // index into Plan::tiers; 0 and unused for a recompute
  KernelIndex start = 0;
  KernelIndex deadline = 0;
};

struct Prediction {
  double iteration_us = 0;  // ideal + stall + recompute time
  double ideal_us = 0;
  double stall_us = 0;
  double peak_bytes = 0;
};

struct Plan {
  uint64_t budget_bytes = 0;
  std::vector<TierSpec> tiers;
  std::vector<Move> moves;
  Prediction predicted;
  // Whoever runs the plan frees a transient tensor that an offload takes away after its last use (a
  // tail: no prefetch follows, it dies first) without writing it anywhere: a *discard* (docs/
  // formats.md, "Dead tensors"). The simulator then gives such offloads no link time, and the
  // planner plans them as free. False: every offload writes. Written only when true.
  bool discard_dead = false;
  // Extra fields written by the planner for people (e.g. planner statistics), as raw JSON.
  std::vector<std::pair<std::string, std::string>> extra;
};

// Reads teraio.plan v1 or v2 (v2 adds recompute and writeback moves). Writes v1 unless a move is
// a recompute or a writeback.
Plan read_plan(const std::string& path);
Plan parse_plan(std::string_view json, std::string_view source = "<plan>");
void write_plan(const Plan& plan, const std::string& path);
std::string plan_to_json(const Plan& plan);

}  // namespace teraio
