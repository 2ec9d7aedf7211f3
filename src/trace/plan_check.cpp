// Validity of a plan (docs/formats.md, "When a plan is valid"). Pairs every offload with the first
// prefetch of the same tensor whose deadline follows it (cyclically for persistent tensors), checks
// the ordering and the no-use window of each pair and the offloads no prefetch follows, then the
// recompute moves (recomputable, within one unused gap, the producer's inputs resident at the
// recompute point), then sums resident bytes per kernel with a difference array.
#include "teraio/plan_check.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace teraio {
namespace {

class Checker {
 public:
  Checker(const Trace& trace, const Lifetimes& lifetimes, const Plan& plan, size_t max_errors)
      : trace_(trace), life_(lifetimes), plan_(plan), max_errors_(max_errors),
        n_(static_cast<uint32_t>(trace.num_kernels())) {}

  PlanCheck run();

 private:
  template <typename... Args>
  void error(fmt::format_string<Args...> f, Args&&... args) {
    out_.valid = false;
    ++out_.error_count;
    if (out_.errors.size() < max_errors_) out_.errors.push_back(fmt::format(f, std::forward<Args>(args)...));
  }
  std::string describe(size_t i) const {
    const Move& m = plan_.moves[i];
    return fmt::format("moves[{}] ({} of tensor {} start {} deadline {})", i, to_string(m.op), m.tensor,
                       m.start, m.deadline);
  }
  uint32_t dist(KernelIndex from, KernelIndex to) const { return (to + n_ - from) % n_; }
  uint32_t dist_nz(KernelIndex from, KernelIndex to) const {
    const uint32_t d = dist(from, to);
    return d == 0 ? n_ : d;
  }
  // A kernel needs tensor t when it uses it or when a recompute due before it reads t (one of its
  // producer's inputs): docs/formats.md, "Recompute".
  bool needed_at(TensorId t, KernelIndex k) const {
    return life_.is_used_at(t, k) || std::binary_search(reads_[t].begin(), reads_[t].end(), k);
  }
  // The first kernel at or after k (cyclically) that needs t; false if none.
  bool next_need(TensorId t, KernelIndex k, KernelIndex* need, bool* wrapped) const {
    KernelIndex u = 0;
    bool uw = false;
    const bool has_use = life_.next_use(t, k, &u, &uw);
    const auto& r = reads_[t];
    if (r.empty()) {
      *need = u;
      *wrapped = uw;
      return has_use;
    }
    auto it = std::lower_bound(r.begin(), r.end(), k);
    const bool rw = it == r.end();
    const KernelIndex rk = rw ? r.front() : *it;
    const auto d = [&](KernelIndex x, bool w) { return w ? uint64_t{x} + n_ - k : uint64_t{x} - k; };
    if (!has_use || d(rk, rw) < d(u, uw)) {
      *need = rk;
      *wrapped = rw;
    } else {
      *need = u;
      *wrapped = uw;
    }
    return true;
  }
  KernelIndex last_need(TensorId t) const {
    return reads_[t].empty() ? life_.last_use(t) : std::max(life_.last_use(t), reads_[t].back());
  }
  // The fields of a MovePair that the offload moves[oi] alone decides.
  MovePair offload_part(size_t oi) const;
  void check_pair(size_t oi, size_t pi);
  // An offload no prefetch follows: valid when nothing uses the tensor after its start.
  void check_one_way(size_t oi, std::vector<size_t>& one_way_of);
  // A recompute alone (tensor, window, uses); its inputs are checked by check_recompute_inputs.
  bool check_recompute(size_t ri, RecomputeMove* out);
  // The producer's inputs are resident at the recompute point: alive, not away under a pair, not
  // freed by another recompute (one recomputed at the same point runs first: earlier producer).
  bool check_recompute_inputs(const RecomputeMove& r, const std::vector<std::vector<size_t>>& pairs_of,
                              const std::vector<std::vector<size_t>>& recomputes_of);
  // A writeback (docs/formats.md, "Writebacks") against the valid pairs and recomputes of its tensor.
  void check_writeback(size_t wi, const std::vector<std::vector<size_t>>& pairs_of,
                       const std::vector<std::vector<size_t>>& recomputes_of, std::vector<size_t>& writeback_of);
  // Whether the cyclic kernel ranges [a, a + la) and [b, b + lb) share a kernel (la, lb <= N).
  bool overlap(uint32_t a, uint32_t la, uint32_t b, uint32_t lb) const {
    return la > 0 && lb > 0 && (dist(a, b) < la || dist(b, a) < lb);
  }
  std::string lifetime_rule(TensorId t) const {
    return fmt::format(
        "tensor {} is not persistent, so its moves must lie within its lifetime [{}, {}] and not wrap",
        t, life_.first_use(t), life_.last_use(t));
  }
  // Adds `delta` to diff over the cyclic kernel range [from, from + len).
  static void add_cyclic(std::vector<int64_t>& diff, uint32_t n, uint32_t from, uint32_t len, int64_t delta);

  const Trace& trace_;
  const Lifetimes& life_;
  const Plan& plan_;
  size_t max_errors_;
  uint32_t n_;
  PlanCheck out_;
  std::vector<std::vector<KernelIndex>> reads_;  // per tensor: kernels before which a recompute reads it
};

void Checker::add_cyclic(std::vector<int64_t>& diff, uint32_t n, uint32_t from, uint32_t len,
                         int64_t delta) {
  if (len == 0) return;
  from %= n;
  if (from + len <= n) {
    diff[from] += delta;
    diff[from + len] -= delta;
  } else {
    diff[from] += delta;
    diff[n] -= delta;
    diff[0] += delta;
    diff[from + len - n] -= delta;
  }
}

MovePair Checker::offload_part(size_t oi) const {
  const Move& o = plan_.moves[oi];
  MovePair pair;
  pair.offload_index = oi;
  pair.tensor = o.tensor;
  pair.tier = o.tier;
  pair.bytes = trace_.tensors[o.tensor].bytes;
  pair.start = o.start;
  pair.offload_done = dist(o.start, o.deadline);
  return pair;
}

void Checker::check_pair(size_t oi, size_t pi) {
  const Move& o = plan_.moves[oi];
  const Move& p = plan_.moves[pi];
  const TensorId t = o.tensor;
  const TensorInfo& info = trace_.tensors[t];
  MovePair pair = offload_part(oi);
  pair.prefetch_index = pi;
  pair.prefetch_begin = dist_nz(o.start, p.start);
  pair.prefetch_deadline = dist_nz(o.start, p.deadline);
  if (p.tier != o.tier) {
    error("{}: its prefetch {} reads tier \"{}\" but the offload wrote tier \"{}\"", describe(oi),
          describe(pi), plan_.tiers[p.tier].name, plan_.tiers[o.tier].name);
    return;
  }
  if (!(pair.offload_done < pair.prefetch_begin && pair.prefetch_begin <= pair.prefetch_deadline)) {
    error("{}: out of order with its prefetch {} (need offload start < offload deadline < prefetch "
          "start <= prefetch deadline, cyclically)",
          describe(oi), describe(pi));
    return;
  }
  if (!needed_at(t, p.deadline)) {
    error("{}: the prefetch deadline must be a kernel that uses tensor {} (or before which a recompute "
          "reads it)",
          describe(pi), t);
    return;
  }
  KernelIndex next = 0;
  bool wrapped = false;
  next_need(t, (o.start + 1) % n_, &next, &wrapped);
  const uint32_t next_d = dist_nz(o.start, next);
  if (next_d < pair.prefetch_deadline) {
    error("{}: tensor {} is used by kernel {} while it is away (offloaded after kernel {}, back "
          "before kernel {})",
          describe(oi), t, next, o.start, p.deadline);
    return;
  }
  if (!info.persistent) {
    if (o.start < life_.first_use(t) || o.start + pair.prefetch_deadline >= n_) {
      error("{}: {}", describe(oi), lifetime_rule(t));
      return;
    }
  }
  out_.pairs.push_back(pair);
}

void Checker::check_one_way(size_t oi, std::vector<size_t>& one_way_of) {
  const Move& o = plan_.moves[oi];
  const TensorId t = o.tensor;
  const TensorInfo& info = trace_.tensors[t];
  const bool used = life_.used(t);
  if (used && (info.persistent || o.start < last_need(t))) {
    KernelIndex next = 0;
    bool wrapped = false;
    next_need(t, (o.start + 1) % n_, &next, &wrapped);
    error("{}: no prefetch brings tensor {} back before kernel {} uses it (an offload without a prefetch "
          "is valid only after the tensor's last use)",
          describe(oi), t, next);
    return;
  }
  MovePair pair = offload_part(oi);
  pair.prefetch_index = kNoPrefetch;
  if (used) {  // a tail: from the last use through alive_until, then the tensor dies
    const KernelIndex until = life_.alive_until(t);
    if (o.start > until || o.deadline < o.start || o.deadline > until) {
      error("{}: tensor {} is not persistent and no prefetch follows this offload, so it must start and be "
            "complete within the tensor's life after its last use, kernels [{}, {}] (alive_until {})",
            describe(oi), t, life_.last_use(t), until, until);
      return;
    }
    pair.prefetch_begin = pair.prefetch_deadline = until + 1 - o.start;
  } else {  // an idle persistent tensor: out for good
    pair.prefetch_begin = pair.prefetch_deadline = n_;
    pair.idle = true;
  }
  if (one_way_of[t] != kNoPrefetch) {
    error("{}: tensor {} is already offloaded without a prefetch by {}; nothing brings it back in between",
          describe(oi), t, describe(one_way_of[t]));
    return;
  }
  one_way_of[t] = oi;
  out_.pairs.push_back(pair);
}

bool Checker::check_recompute(size_t ri, RecomputeMove* out) {
  const Move& m = plan_.moves[ri];
  const TensorId t = m.tensor;
  const TensorInfo& info = trace_.tensors[t];
  if (!info.recomputable || !info.producer) {
    error("{}: tensor {} is not recomputable ({}); only a tensor the trace marks recomputable can be "
          "recomputed (docs/formats.md, \"Recompute\")",
          describe(ri), t, info.producer ? "its producer cannot be rerun safely" : "the trace names no producer");
    return false;
  }
  const KernelIndex producer = *info.producer;
  if (m.start < producer || m.start + 1 >= m.deadline) {
    error("{}: a recompute frees the tensor after kernel start and makes it again before kernel deadline, "
          "so it needs producer ({}) <= start < deadline - 1, without wrapping",
          describe(ri), producer);
    return false;
  }
  KernelIndex next = 0;
  bool wrapped = false;
  const bool used_after = life_.next_use(t, m.start + 1, &next, &wrapped) && !wrapped;
  // or a recompute reads it after the start (a revived input: Note [Deep recompute chains])
  const bool read_after = !reads_[t].empty() && reads_[t].back() > m.start;
  if (!used_after && !read_after) {
    error("{}: no kernel uses tensor {} after kernel {}, so nothing needs it recomputed (offload it without "
          "a prefetch, or let it die)",
          describe(ri), t, m.start);
    return false;
  }
  if (used_after && next < m.deadline) {
    error("{}: tensor {} is used by kernel {} while it is freed (after kernel {}, made again before kernel {})",
          describe(ri), t, next, m.start, m.deadline);
    return false;
  }
  out->move_index = ri;
  out->tensor = t;
  out->bytes = info.bytes;
  out->start = m.start;
  out->deadline = m.deadline;
  out->producer = producer;
  out->time_us = recompute_time_us(trace_, t);
  return true;
}

bool Checker::check_recompute_inputs(const RecomputeMove& r, const std::vector<std::vector<size_t>>& pairs_of,
                                     const std::vector<std::vector<size_t>>& recomputes_of) {
  const KernelIndex d = r.deadline;
  for (TensorId i : recompute_reads(trace_, life_, r.tensor)) {
    const TensorInfo& in = trace_.tensors[i];
    // Read after its life, the input lives on to that read (the recompute holds it; Note [Deep
    // recompute chains] in src/planner/planner.cpp): resident there unless freed, checked below.
    if (!in.persistent && d < life_.first_use(i)) {
      error("{}: input tensor {} of the producer (kernel {}) is not alive at kernel {} (its life is [{}, {}])",
            describe(r.move_index), i, r.producer, d, life_.first_use(i), life_.alive_until(i));
      return false;
    }
    for (size_t pi : pairs_of[i]) {
      const MovePair& p = out_.pairs[pi];
      const uint32_t x = dist(p.start, d);
      if (p.idle || (x > p.offload_done && x < p.prefetch_deadline)) {
        error("{}: input tensor {} of the producer (kernel {}) is not resident at kernel {}: {} has it away or "
              "still arriving (its prefetch must be complete by then)",
              describe(r.move_index), i, r.producer, d, describe(p.offload_index));
        return false;
      }
    }
    for (size_t ri : recomputes_of[i]) {
      const RecomputeMove& o = out_.recomputes[ri];
      if (o.start < d && d < o.deadline) {
        error("{}: input tensor {} of the producer (kernel {}) is freed at kernel {} by {} (recompute it at or "
              "before kernel {})",
              describe(r.move_index), i, r.producer, d, describe(o.move_index), d);
        return false;
      }
    }
  }
  return true;
}

void Checker::check_writeback(size_t wi, const std::vector<std::vector<size_t>>& pairs_of,
                              const std::vector<std::vector<size_t>>& recomputes_of,
                              std::vector<size_t>& writeback_of) {
  const Move& w = plan_.moves[wi];
  const TensorId t = w.tensor;
  if (!trace_.writes_recorded) {
    error("{}: the trace does not record writes (\"writes_recorded\" is not true), so nothing says the "
          "tensor is unchanged after a writeback",
          describe(wi));
    return;
  }
  // The offload it relies on: the valid offload of t whose start comes first at or after w.start.
  size_t best = kNoPrefetch;
  for (size_t pi : pairs_of[t]) {
    const MovePair& p = out_.pairs[pi];
    if (p.idle) continue;
    if (best == kNoPrefetch || dist(w.start, p.start) < dist(w.start, out_.pairs[best].start)) best = pi;
  }
  if (best == kNoPrefetch) {
    error("{}: no offload of tensor {} follows it (a writeback makes the next offload of its tensor, to "
          "the same tier, clean)",
          describe(wi), t);
    return;
  }
  const MovePair& o = out_.pairs[best];
  const uint32_t to_offload = dist(w.start, o.start);
  if (o.tier != w.tier) {
    error("{}: writes tier \"{}\" but the offload it precedes, {}, writes tier \"{}\"", describe(wi),
          plan_.tiers[w.tier].name, describe(o.offload_index), plan_.tiers[o.tier].name);
    return;
  }
  if (!trace_.tensors[t].persistent && (w.start < life_.first_use(t) || w.start > o.start)) {
    error("{}: {} (the writeback must come at or after its first use and before the offload {})",
          describe(wi), lifetime_rule(t), describe(o.offload_index));
    return;
  }
  // Resident at every kernel from its start through the offload's start: no pair has t away or
  // arriving there (kernels p.start + 1 .. p.start + prefetch_deadline - 1), no recompute frees
  // and remakes it there (kernels r.start + 1 .. r.deadline).
  for (size_t pi : pairs_of[t]) {
    const MovePair& p = out_.pairs[pi];
    if (overlap(w.start, to_offload + 1, (p.start + 1) % n_, p.prefetch_deadline - 1)) {
      error("{}: tensor {} is not resident from kernel {} through the offload {}: {} has it away or arriving",
            describe(wi), t, w.start, describe(o.offload_index), describe(p.offload_index));
      return;
    }
  }
  for (size_t ri : recomputes_of[t]) {
    const RecomputeMove& r = out_.recomputes[ri];
    if (overlap(w.start, to_offload + 1, (r.start + 1) % n_, r.deadline - r.start)) {
      error("{}: {} frees and remakes tensor {} between the writeback and the offload {}", describe(wi),
            describe(r.move_index), t, describe(o.offload_index));
      return;
    }
  }
  if (to_offload > 0 && written_between(trace_, t, (w.start + 1) % n_, o.start)) {
    error("{}: a kernel from {} through {} writes tensor {} (its written_at), after the writeback copies it "
          "and before the offload {} that relies on the copy",
          describe(wi), (w.start + 1) % n_, o.start, t, describe(o.offload_index));
    return;
  }
  const uint32_t done = dist(w.start, w.deadline);
  if (done > to_offload + o.offload_done) {
    error("{}: must be complete by the end of the offload's deadline (kernel {}), which relies on it",
          describe(wi), plan_.moves[o.offload_index].deadline);
    return;
  }
  if (is_discard(trace_, plan_, o)) {
    error("{}: the offload it precedes, {}, is a discard (\"discard_dead\": it writes nothing), so there is "
          "nothing to write early",
          describe(wi), describe(o.offload_index));
    return;
  }
  if (writeback_of[best] != kNoPrefetch) {
    error("{}: the offload {} already has a writeback, {}", describe(wi), describe(o.offload_index),
          describe(writeback_of[best]));
    return;
  }
  writeback_of[best] = wi;
  WritebackMove out;
  out.move_index = wi;
  out.pair_index = best;
  out.tensor = t;
  out.tier = w.tier;
  out.bytes = o.bytes;
  out.start = w.start;
  out.done = done;
  out.to_offload = to_offload;
  out_.writebacks.push_back(out);
}

PlanCheck Checker::run() {
  const size_t nt = trace_.num_tensors();
  // Range checks; collect per-tensor move lists.
  std::vector<std::vector<size_t>> offloads(nt), prefetches(nt), recompute_moves(nt);
  std::vector<size_t> writeback_moves;
  for (size_t i = 0; i < plan_.moves.size(); ++i) {
    const Move& m = plan_.moves[i];
    if (m.tensor >= nt) {
      error("{}: tensor {} is out of range (the trace has {} tensors)", describe(i), m.tensor, nt);
      continue;
    }
    if (m.op != MoveOp::recompute && m.tier >= plan_.tiers.size()) {
      error("{}: tier index {} is out of range", describe(i), m.tier);
      continue;
    }
    if (m.start >= n_ || m.deadline >= n_) {
      error("{}: kernel index out of range (the trace has {} kernels)", describe(i), n_);
      continue;
    }
    if (!life_.used(m.tensor)) {
      if (!trace_.tensors[m.tensor].persistent) {
        error("{}: tensor {} is never used, so it cannot be moved", describe(i), m.tensor);
        continue;
      }
      if (m.op != MoveOp::offload) {
        error("{}: tensor {} is never used, so nothing needs it back: it can be offloaded, not {}",
              describe(i), m.tensor,
              m.op == MoveOp::prefetch ? "prefetched" : m.op == MoveOp::recompute ? "recomputed" : "written back");
        continue;
      }
    }
    switch (m.op) {
      case MoveOp::offload: offloads[m.tensor].push_back(i); break;
      case MoveOp::prefetch: prefetches[m.tensor].push_back(i); break;
      case MoveOp::recompute: recompute_moves[m.tensor].push_back(i); break;
      case MoveOp::writeback: writeback_moves.push_back(i); break;
    }
  }
  // Recompute moves alone, then the kernels before which they read their producer's inputs: those
  // need the inputs as a use does.
  // The reads first (a recompute's window may end at a read of its tensor alone: Note [Deep
  // recompute chains] in src/planner/planner.cpp), then each move.
  reads_.assign(nt, {});
  for (size_t t = 0; t < nt; ++t) {
    const TensorInfo& info = trace_.tensors[t];
    if (!info.recomputable || !info.producer) continue;  // check_recompute says why
    for (size_t ri : recompute_moves[t]) {
      for (TensorId i : recompute_reads(trace_, life_, static_cast<TensorId>(t)))
        reads_[i].push_back(plan_.moves[ri].deadline);
    }
  }
  for (auto& r : reads_) {
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
  }
  std::vector<RecomputeMove> basic;
  for (size_t t = 0; t < nt; ++t) {
    for (size_t ri : recompute_moves[t]) {
      RecomputeMove r;
      if (check_recompute(ri, &r)) basic.push_back(r);
    }
  }
  // Pair each offload with the prefetch whose deadline comes first after the offload's start
  // (cyclically for a persistent tensor; a non-persistent one's pairs never wrap). An offload that
  // no prefetch follows is an offload without a prefetch.
  std::vector<size_t> one_way_of(nt, kNoPrefetch);
  for (size_t t = 0; t < nt; ++t) {
    auto& pf = prefetches[t];
    if (offloads[t].empty() && pf.empty()) continue;
    std::sort(pf.begin(), pf.end(),
              [&](size_t a, size_t b) { return plan_.moves[a].deadline < plan_.moves[b].deadline; });
    std::vector<char> taken(pf.size(), 0);
    for (size_t oi : offloads[t]) {
      const KernelIndex a = plan_.moves[oi].start;
      auto it = std::upper_bound(pf.begin(), pf.end(), a, [&](KernelIndex v, size_t idx) {
        return v < plan_.moves[idx].deadline;
      });
      if (it == pf.end() && trace_.tensors[t].persistent) it = pf.begin();
      if (it == pf.end()) {
        check_one_way(oi, one_way_of);
        continue;
      }
      const size_t j = static_cast<size_t>(it - pf.begin());
      if (taken[j]) {
        error("{}: shares its prefetch {} with another offload of tensor {} (offload twice within "
              "one unused gap)",
              describe(oi), describe(pf[j]), t);
        continue;
      }
      taken[j] = 1;
      check_pair(oi, pf[j]);
    }
    for (size_t j = 0; j < pf.size(); ++j) {
      if (taken[j]) continue;
      const auto tid = static_cast<TensorId>(t);
      if (!trace_.tensors[t].persistent && plan_.moves[pf[j]].deadline == life_.first_use(tid)) {
        error("{}: no offload precedes this prefetch of tensor {}: {}", describe(pf[j]), t,
              lifetime_rule(tid));
      } else {
        error("{}: no offload precedes this prefetch of tensor {}", describe(pf[j]), t);
      }
    }
  }

  // Recompute moves (each checked alone above): against the pairs and other recomputes of its tensor,
  // then its inputs at the recompute point (which needs every tensor's pairs and recomputes).
  std::vector<std::vector<size_t>> pairs_of(nt), recomputes_of(nt);
  for (size_t pi = 0; pi < out_.pairs.size(); ++pi) pairs_of[out_.pairs[pi].tensor].push_back(pi);
  std::sort(basic.begin(), basic.end(), [](const RecomputeMove& a, const RecomputeMove& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.start < b.start;
  });
  KernelIndex previous_deadline = 0;
  size_t previous = kNoPrefetch;  // the last kept recompute of the same tensor
  TensorId previous_tensor = 0;
  for (const RecomputeMove& r : basic) {
    const TensorId t = r.tensor;
    const size_t ri = r.move_index;
    if (previous_tensor != t) previous = kNoPrefetch;
    previous_tensor = t;
    if (previous != kNoPrefetch && r.start < previous_deadline) {
      error("{}: tensor {} is already freed there by {} (two recomputes within one unused gap)", describe(ri), t,
            describe(previous));
      continue;
    }
    bool overlaps = false;
    for (size_t pi : pairs_of[t]) {
      const MovePair& p = out_.pairs[pi];
      // A recomputable tensor is not persistent, so its pairs do not wrap.
      if (r.start < p.start + p.prefetch_deadline && p.start < r.deadline) {
        error("{}: overlaps {}, which moves tensor {} within the same unused gap", describe(ri),
              describe(p.offload_index), t);
        overlaps = true;
        break;
      }
    }
    if (overlaps) continue;
    previous = ri;
    previous_deadline = r.deadline;
    recomputes_of[t].push_back(out_.recomputes.size());
    out_.recomputes.push_back(r);
  }
  std::vector<char> inputs_ok(out_.recomputes.size(), 1);
  for (size_t j = 0; j < out_.recomputes.size(); ++j) {
    inputs_ok[j] = check_recompute_inputs(out_.recomputes[j], pairs_of, recomputes_of) ? 1 : 0;
  }
  {
    std::vector<RecomputeMove> kept;
    for (size_t j = 0; j < out_.recomputes.size(); ++j) {
      if (inputs_ok[j]) kept.push_back(out_.recomputes[j]);
    }
    std::sort(kept.begin(), kept.end(), [](const RecomputeMove& a, const RecomputeMove& b) {
      return a.deadline != b.deadline ? a.deadline < b.deadline : a.producer < b.producer;
    });
    out_.recomputes = std::move(kept);
  }

  // Writebacks, against the pairs and recomputes kept.
  {
    std::vector<std::vector<size_t>> kept_recomputes(nt);
    for (size_t j = 0; j < out_.recomputes.size(); ++j) kept_recomputes[out_.recomputes[j].tensor].push_back(j);
    std::vector<size_t> writeback_of(out_.pairs.size(), kNoPrefetch);
    for (size_t wi : writeback_moves) check_writeback(wi, pairs_of, kept_recomputes, writeback_of);
  }

  // Resident bytes and tier occupancy.
  const std::vector<uint64_t> m = memory_curve(trace_, life_);
  std::vector<int64_t> diff(n_ + 1, 0);
  std::vector<std::vector<int64_t>> tier_diff(plan_.tiers.size(), std::vector<int64_t>(n_ + 1, 0));
  for (const MovePair& p : out_.pairs) {
    const auto b = static_cast<int64_t>(p.bytes);
    if (p.idle) {  // out for good: absent, and on the tier, at every kernel
      add_cyclic(diff, n_, 0, n_, -b);
      add_cyclic(tier_diff[p.tier], n_, 0, n_, b);
      continue;
    }
    add_cyclic(diff, n_, p.start + p.offload_done + 1, p.prefetch_begin - p.offload_done - 1, -b);
    if (is_discard(trace_, plan_, p)) continue;  // written nowhere: no tier holds it
    add_cyclic(tier_diff[p.tier], n_, p.start + 1, p.prefetch_deadline - 1, b);
  }
  for (const WritebackMove& w : out_.writebacks) {  // held from after its start, up to the offload's
    add_cyclic(tier_diff[w.tier], n_, w.start + 1, w.to_offload, static_cast<int64_t>(w.bytes));
  }
  // A tensor read by a recompute after its life (revived) is resident up to its last read, less
  // its recompute windows below.
  for (size_t t = 0; t < nt; ++t) {
    const auto tid = static_cast<TensorId>(t);
    if (trace_.tensors[t].persistent || reads_[t].empty() || !life_.used(tid)) continue;
    const KernelIndex until = life_.alive_until(tid);
    if (reads_[t].back() > until)
      add_cyclic(diff, n_, until + 1, reads_[t].back() - until, static_cast<int64_t>(trace_.tensors[t].bytes));
  }
  for (const RecomputeMove& r : out_.recomputes) {
    add_cyclic(diff, n_, r.start + 1, r.deadline - r.start - 1, -static_cast<int64_t>(r.bytes));
  }
  out_.resident_bytes.resize(n_);
  int64_t running = 0;
  size_t over = 0;
  for (uint32_t k = 0; k < n_; ++k) {
    running += diff[k];
    const uint64_t r = static_cast<uint64_t>(static_cast<int64_t>(m[k]) + running);
    out_.resident_bytes[k] = r;
    if (r > out_.peak_bytes || k == 0) {
      out_.peak_bytes = r;
      out_.peak_kernel = k;
    }
    if (r > plan_.budget_bytes) {
      if (over++ < 3) {
        error("kernel {} ({}): {} bytes resident under the plan exceed the budget of {} bytes", k,
              trace_.kernel_name(k), r, plan_.budget_bytes);
      } else {
        ++out_.error_count;
        out_.valid = false;
      }
    }
  }
  out_.tier_peak_bytes.assign(plan_.tiers.size(), 0);
  for (size_t tier = 0; tier < plan_.tiers.size(); ++tier) {
    int64_t held = 0;
    uint64_t peak = 0;
    for (uint32_t k = 0; k < n_; ++k) {
      held += tier_diff[tier][k];
      peak = std::max(peak, static_cast<uint64_t>(held));
    }
    out_.tier_peak_bytes[tier] = peak;
    if (peak > plan_.tiers[tier].capacity_bytes) {
      error("tier \"{}\" holds up to {} bytes at once, more than its capacity of {} bytes",
            plan_.tiers[tier].name, peak, plan_.tiers[tier].capacity_bytes);
    }
  }
  return std::move(out_);
}

}  // namespace

// Note [Clean offloads]
// A tensor read back from a tier and not written in place since is still what the tier holds:
// offloading it again to that tier need write nothing, only free the device memory (an OS's clean
// page). The runtime does so; the simulator models it so that its predictions match. An offload of
// tensor t to tier T is clean when
//   - the trace records writes (Trace::writes_recorded; otherwise any use may have written t),
//   - the move of t before it is a prefetch from T: the previous pair's, cyclically for a
//     persistent tensor (a single pair's own prefetch, one iteration earlier), never across the
//     iteration's start for a non-persistent one (its first offload always writes), and no
//     recompute of t in between (a recompute frees t and makes it anew on the device),
//   - no kernel from that prefetch's deadline through this offload's start writes t
//     (written_between: each write is attributed to a kernel that lists t, conservatively).
// A clean offload takes no link time and completes when issued: the memory it frees is free at
// once, nothing queues behind it, and its bytes count in clean_offload_bytes, not offload_bytes
// nor the floor. In steady state, as everywhere in the simulator: iteration 0's first clean offload
// of a persistent tensor is clean too (its read-back happened in iteration -1). The planner does
// not model clean offloads yet (docs/planner.md): it may offload more than it would if it did.
std::vector<uint8_t> clean_offloads(const Trace& trace, const PlanCheck& check) {
  std::vector<uint8_t> clean(check.pairs.size(), 0);
  const auto n = static_cast<int64_t>(trace.num_kernels());
  if (!trace.writes_recorded || n == 0) return clean;
  // Each tensor's pairs in the order of their offloads; its recomputes' starts.
  std::vector<size_t> order;
  for (size_t i = 0; i < check.pairs.size(); ++i)
    if (!check.pairs[i].idle) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const MovePair &x = check.pairs[a], &y = check.pairs[b];
    return x.tensor != y.tensor ? x.tensor < y.tensor : x.start < y.start;
  });
  std::vector<std::pair<TensorId, KernelIndex>> recomputes;
  for (const RecomputeMove& r : check.recomputes) recomputes.emplace_back(r.tensor, r.start);
  std::sort(recomputes.begin(), recomputes.end());
  for (size_t b = 0; b < order.size();) {
    const TensorId t = check.pairs[order[b]].tensor;
    size_t e = b;
    while (e < order.size() && check.pairs[order[e]].tensor == t) ++e;
    const bool persistent = trace.tensors[t].persistent;
    for (size_t i = b; i < e; ++i) {
      const MovePair& cur = check.pairs[order[i]];
      if (i == b && !persistent) continue;  // the first offload of the iteration writes
      const MovePair& prev = check.pairs[order[i == b ? e - 1 : i - 1]];
      if (prev.one_way() || prev.tier != cur.tier) continue;
      const int64_t read_back = (prev.start + int64_t{prev.prefetch_deadline}) % n;
      const int64_t s = cur.start;
      // A recompute of t since the read-back (non-persistent tensors only: no wrap).
      auto r = std::lower_bound(recomputes.begin(), recomputes.end(),
                                std::make_pair(t, static_cast<KernelIndex>(read_back)));
      if (!persistent && r != recomputes.end() && r->first == t && r->second <= s) continue;
      clean[order[i]] = written_between(trace, t, read_back, s) ? 0 : 1;
    }
    b = e;
  }
  for (const WritebackMove& w : check.writebacks) clean[w.pair_index] = 1;  // Note [Writebacks]
  return clean;
}

PlanCheck check_plan(const Trace& trace, const Lifetimes& lifetimes, const Plan& plan,
                     size_t max_errors) {
  if (trace.num_kernels() == 0) {
    PlanCheck c;
    c.tier_peak_bytes.assign(plan.tiers.size(), 0);  // one entry per tier, as for any trace
    if (!plan.moves.empty()) {
      c.valid = false;
      c.error_count = 1;
      c.errors.push_back("the trace has no kernels, so the plan must have no moves");
    }
    return c;
  }
  return Checker(trace, lifetimes, plan, max_errors).run();
}

}  // namespace teraio
