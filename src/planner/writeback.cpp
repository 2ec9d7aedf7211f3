// The planner's writeback pass (docs/planner.md, "Writebacks"): moves the write of a dirty offload
// earlier, to a writeback placed after the tensor's last write where the tier's write slots have
// room, so that the offload itself is clean (frees at once, no link time). A post-pass over a
// finished plan; plan_best keeps it only where the simulator finds it faster.
#include <algorithm>
#include <span>

#include "planner_tuning.h"
#include "teraio/analysis.h"
#include "teraio/plan_check.h"

namespace teraio::planner_detail {

// Note [Planning writebacks]
// On a link-bound plan the write direction is idle in some phases and saturated in others (steps
// in backward: the backward reads, and the forward writes what the backward's updates left dirty).
// The slot model of the greedy (each kernel's slot carries write_gbps x its time) says where: the
// plan's dirty offloads fill their slots forward from their start, as the greedy reserved them.
// Then, for each dirty offload, in the order of the earliest kernel its writeback could start at
// (after the tensor's last write before the offload, cyclically: for a parameter, the update of
// the previous iteration's backward; and after it is resident again), its own reservation is given
// back and its bytes are filled into the free write slots forward from there; when they fit before
// the offload's deadline and at least part of them lands before the offload's start (otherwise
// nothing moves earlier), the offload gets a writeback from the first slot with room, due by the
// offload's deadline, and the reservation stays; else it keeps its own. The tier must hold the
// tensor from the writeback's start (check_plan's accounting). `slot_fraction` scales the slots
// (a link-bound iteration lasts longer than its kernels: more room per kernel than the slot
// model's); a nonpositive one turns the pass off.
Plan add_writebacks(const Trace& trace, const Plan& plan, double slot_fraction) {
  if (!trace.writes_recorded || slot_fraction <= 0 || trace.num_kernels() == 0) return plan;
  const Lifetimes life(trace);
  const PlanCheck check = check_plan(trace, life, plan, 1);
  if (!check.valid) return plan;
  const auto n = static_cast<uint32_t>(trace.num_kernels());
  const std::span<const double> times = trace.kernel_times_us();
  auto dist = [n](uint32_t from, uint32_t to) { return (to + n - from) % n; };
  const std::vector<uint8_t> clean = clean_offloads(trace, check);
  const size_t tiers = plan.tiers.size();

  // Free write capacity per tier and kernel, and what each tier holds per kernel.
  std::vector<std::vector<double>> slots(tiers, std::vector<double>(n));
  for (size_t t = 0; t < tiers; ++t)
    for (uint32_t k = 0; k < n; ++k) slots[t][k] = plan.tiers[t].write_gbps * 1e3 * times[k] * slot_fraction;
  std::vector<std::vector<int64_t>> held(tiers, std::vector<int64_t>(n, 0));
  auto hold = [&](uint32_t tier, uint32_t from, uint32_t len, int64_t b) {
    for (uint32_t i = 0; i < len; ++i) held[tier][(from + i) % n] += b;
  };
  // Fills `bytes` forward into the free slots of kernels from+1 .. from+len; returns what is left.
  auto fill = [&](std::vector<double>& f, uint32_t from, uint32_t len, double bytes,
                  std::vector<std::pair<uint32_t, double>>* taken) {
    for (uint32_t i = 1; i <= len && bytes > 0; ++i) {
      const uint32_t k = (from + i) % n;
      const double x = std::min(bytes, f[k]);
      if (x <= 0) continue;
      f[k] -= x;
      bytes -= x;
      if (taken) taken->emplace_back(k, x);
    }
    return bytes;
  };
  std::vector<std::vector<std::pair<uint32_t, double>>> own(check.pairs.size());
  std::vector<size_t> dirty;
  for (size_t i = 0; i < check.pairs.size(); ++i) {
    const MovePair& p = check.pairs[i];
    if (p.idle) {
      hold(p.tier, 0, n, static_cast<int64_t>(p.bytes));
      continue;
    }
    if (is_discard(trace, plan, p)) continue;
    hold(p.tier, p.start + 1, p.prefetch_deadline - 1, static_cast<int64_t>(p.bytes));
    if (clean[i]) continue;
    fill(slots[p.tier], p.start, p.offload_done, static_cast<double>(p.bytes), &own[i]);
    dirty.push_back(i);
  }

  // Per tensor: its pairs (to find the previous one) and its recomputes.
  std::vector<std::vector<size_t>> pairs_of(trace.num_tensors());
  for (size_t i = 0; i < check.pairs.size(); ++i)
    if (!check.pairs[i].idle) pairs_of[check.pairs[i].tensor].push_back(i);
  std::vector<std::vector<const RecomputeMove*>> recomputes_of(trace.num_tensors());
  for (const RecomputeMove& r : check.recomputes) recomputes_of[r.tensor].push_back(&r);

  // The earliest kernel after which a writeback of pair i's tensor may start, as a distance back
  // from the offload's start (0: none earlier than the offload itself).
  auto earliest_back = [&](size_t i) -> uint32_t {
    const MovePair& o = check.pairs[i];
    const TensorId t = o.tensor;
    const TensorInfo& info = trace.tensors[t];
    // Resident since: the previous pair's prefetch deadline, else (non-persistent) its first use.
    uint32_t back = n - 1;
    if (!info.persistent) back = o.start - life.first_use(t);
    for (size_t j : pairs_of[t]) {
      const MovePair& p = check.pairs[j];
      if (p.one_way()) continue;  // its own pair too: a persistent tensor's read-back one iteration earlier
      const uint32_t arrive = (p.start + p.prefetch_deadline) % n;
      back = std::min(back, dist(arrive, o.start));
    }
    for (const RecomputeMove* r : recomputes_of[t]) {
      // Freed and made again through kernel r->deadline: the writeback starts after it.
      if (r->deadline < o.start) back = std::min(back, o.start - r->deadline - 1);
      else if (r->start <= o.start) back = 0;
    }
    // After the last write at or before the offload's start (within `back`).
    const std::vector<KernelIndex>& w = info.written_at;
    if (!w.empty()) {
      auto it = std::upper_bound(w.begin(), w.end(), o.start);
      const KernelIndex last = it == w.begin() ? w.back() : *(it - 1);
      if (info.persistent || last <= o.start) back = std::min(back, dist(last, o.start));
    }
    return back;
  };

  std::vector<std::pair<uint32_t, size_t>> order;  // (earliest start, pair)
  for (size_t i : dirty) {
    const uint32_t back = earliest_back(i);
    if (back == 0) continue;
    order.emplace_back((check.pairs[i].start + n - back) % n, i);
  }
  std::sort(order.begin(), order.end());

  Plan out = plan;
  for (const auto& [s0, i] : order) {
    const MovePair& o = check.pairs[i];
    const uint32_t to_offload = dist(s0, o.start);
    const uint32_t window = to_offload + o.offload_done;  // kernels s0+1 .. offload deadline
    // The tier holds the tensor from s0 + 1 on.
    const uint64_t cap = plan.tiers[o.tier].capacity_bytes;
    bool room = true;
    for (uint32_t d = 1; d <= to_offload && room; ++d)
      room = static_cast<uint64_t>(held[o.tier][(s0 + d) % n]) + o.bytes <= cap;
    if (!room) continue;
    std::vector<double>& f = slots[o.tier];
    for (const auto& [k, x] : own[i]) f[k] += x;  // give its own reservation back
    std::vector<std::pair<uint32_t, double>> taken;
    const double left = fill(f, s0, window, static_cast<double>(o.bytes), &taken);
    const bool earlier = !taken.empty() && dist(s0, taken.front().first) <= to_offload;
    if (left > 0 || !earlier) {
      for (const auto& [k, x] : taken) f[k] += x;
      for (const auto& [k, x] : own[i]) f[k] -= x;
      continue;
    }
    // Start after the kernel before the first slot it uses (the link is idle until then).
    const uint32_t first = taken.front().first;
    const uint32_t start = (first + n - 1) % n;
    hold(o.tier, (start + 1) % n, dist(start, o.start), static_cast<int64_t>(o.bytes));
    const Move& off = plan.moves[o.offload_index];
    out.moves.push_back(Move{o.tensor, MoveOp::writeback, o.tier, start, off.deadline});
  }
  if (out.moves.size() == plan.moves.size()) return plan;
  // The pass keeps every rule by construction; a plan it broke would be a bug, not a variant.
  if (!check_plan(trace, life, out, 1).valid) return plan;
  return out;
}

}  // namespace teraio::planner_detail
