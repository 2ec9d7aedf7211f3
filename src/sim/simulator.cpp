// Discrete-event replay of a plan (docs/simulator.md has the model). Kernels run back to back on
// one compute stream; every tier has a write direction (offloads) and a read direction
// (prefetches), each serving one transfer at a time in issue order, both slower while both move
// (Note [Duplex link]); a transfer a kernel waits for becomes urgent and preempts its direction. An
// offload of a tensor unchanged since it was read back from the same tier writes nothing and frees
// at once (Note [Clean offloads] in plan_check.cpp). An offload without a prefetch writes and frees, and nothing
// comes back (that of a persistent tensor no kernel uses moves nothing: in steady state it is
// already out). A recompute is compute-stream time (its producer's kernel time) just before the
// kernel it is due for, after that kernel's transfers. Links advance lazily, so the cost is
// O((kernels + moves) * iterations), no per-byte work.
#include "teraio/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <queue>

#include <fmt/format.h>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan_check.h"
#include "teraio/units.h"

namespace teraio {
namespace {

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Transfer {
  uint64_t bytes = 0;
  double rem_bytes = 0;    // not yet transferred (kept while suspended by an urgent transfer)
  double service_us = 0;   // time in service so far (suspensions excluded)
  double issue_us = kInf;  // set when the kernel loop issues it
  double begin_us = -1;    // first moment of service
  double end_us = 0;
  int64_t issue_kernel = 0;  // global kernel index (iteration * N + k)
  int64_t need_kernel = 0;   // the kernel that waits for it (global index; > last: none)
  size_t move = 0;           // its move in Plan::moves
  uint32_t link = 0;         // 2 * tier + (offload ? 0 : 1)
  bool offload = true;     // on the write direction: an offload or a writeback
  bool writeback = false;  // a writeback move (Note [Writebacks])
  bool done = false;
  bool urgent = false;
};

struct Segment {
  double begin_us;
  double end_us;
};

// One direction of one tier: transfers served one at a time in issue order (`seq`), urgent ones
// first (`front`). See Note [Urgent preemption].
struct Direction {
  std::vector<uint32_t> seq;    // transfer ids in issue order (known before the run)
  size_t issued = 0;            // seq[0, issued) have been issued
  size_t cursor = 0;            // first seq entry that may not have started
  std::vector<uint32_t> front;  // served before seq, in order: urgent ones, then a suspended one
  std::vector<uint32_t> cand;   // kDeadline: issued, not yet started (seq[0, issued) fed in)
  size_t fed = 0;
  uint32_t current = kNone;     // transfer in service
  double rem_bytes = 0;         // its bytes left at `Tier::now_`
  double seg_begin = 0;         // when its current service segment began
  double alone = 0;             // bytes per us while the other direction is idle
  double both = 0;              // bytes per us while the other direction is busy too
  std::vector<Segment> segments;
  double rate(bool other_busy) const { return other_busy ? both : alone; }
};

// Note [Duplex link]
// The two directions of a tier share one physical link: while both move bytes, each runs at
// min(its one-way rate, TierSpec::duplex_gbps) (a PCIe link to pinned host memory carries both
// directions at about 90% of each one's one-way speed, docs/benchmarks.md "The link both ways").
// duplex_gbps == 0 keeps the directions independent. A rate changes whenever the other direction
// starts or stops, so a transfer's remaining work is kept in bytes and re-timed at every such event
// rather than given a duration when it starts. The two directions therefore advance together, event
// by event (a completion or a start on either side); tiers stay independent of each other.
class TierLinks {
 public:
  Direction dir[2];  // [0] write (offloads), [1] read (prefetches)

  TierLinks(const TierSpec& t, SimOptions::LinkOrder order)
      : by_deadline_(order == SimOptions::LinkOrder::kDeadline),
        preemptive_(order == SimOptions::LinkOrder::kPreemptive) {
    dir[0].alone = t.write_gbps * 1e3;
    dir[1].alone = t.read_gbps * 1e3;
    for (Direction& d : dir)
      d.both = t.duplex_gbps > 0 ? std::min(d.alone, t.duplex_gbps * 1e3) : d.alone;
  }

  // Serves transfers until time t (>= the last time advanced to): completes those that end at or
  // before t, starts those that can start at or before t. Every transfer issued at or before t must
  // have been issued. With `stop` != kNone, returns as soon as transfer `stop` completes instead.
  void advance(std::vector<Transfer>& xs, double t, uint32_t stop = kNone) {
    for (;;) {
      start_idle(xs);
      const bool busy0 = dir[0].current != kNone, busy1 = dir[1].current != kNone;
      double next = kInf;
      int finishing = -1;  // direction whose transfer completes at `next`
      for (int d = 0; d < 2; ++d) {
        const Direction& D = dir[d];
        if (D.current != kNone) {
          const double end = now_ + D.rem_bytes / D.rate(d == 0 ? busy1 : busy0);
          if (end < next) {
            next = end;
            finishing = d;
          }
        } else if (const uint32_t id = next_issued(xs, d); id != kNone) {
          if (xs[id].issue_us < next) {  // a start, later than now_
            next = xs[id].issue_us;
            finishing = -1;
          }
        }
      }
      if (next == kInf) {  // nothing in service or issued: idle until the next issue
        TERAIO_INTERNAL_ASSERT(stop == kNone, "simulate: an urgent transfer was never served");
        if (std::isfinite(t)) now_ = t;
        return;
      }
      if (next > t) {
        progress(t, busy0, busy1);
        return;
      }
      progress(next, busy0, busy1);
      if (finishing >= 0) {
        const uint32_t id = dir[finishing].current;
        finish(xs, finishing, next);
        if (id == stop) return;
      }
    }
  }

  double now() const { return now_; }

  // Serves `urgent` (transfers of direction d not yet done, in issue order) from now_ on, which the
  // caller has advanced to: the transfer in service keeps going if it is urgent, else it is
  // suspended and resumes right after them. The other direction keeps serving meanwhile (it is
  // what slows them down). Returns when the last urgent transfer completes.
  double serve_urgent(std::vector<Transfer>& xs, int d, std::span<const uint32_t> urgent) {
    Direction& D = dir[d];
    if (!preemptive_) {  // the kernel waits until the link has served them
      for (uint32_t id : urgent)
        if (!xs[id].done) advance(xs, kInf, id);
      return now_;
    }
    std::vector<uint32_t> ahead;
    uint32_t last = D.current;  // the urgent transfer served last
    for (uint32_t id : urgent) {
      if (xs[id].done || id == D.current) continue;
      ahead.push_back(id);
      last = id;
    }
    if (D.current != kNone &&
        std::find(urgent.begin(), urgent.end(), D.current) == urgent.end())
      ahead.push_back(suspend(xs, d));
    D.front.insert(D.front.begin(), ahead.begin(), ahead.end());
    advance(xs, kInf, last);
    return now_;
  }

 private:
  // The next issued, not yet started transfer of seq for direction d (front is empty), or kNone.
  uint32_t next_issued(const std::vector<Transfer>& xs, int d) {
    Direction& D = dir[d];
    if (by_deadline_) {
      // The one due first among those issued by now_ (ties: issue order); else the next to be issued.
      for (; D.fed < D.issued; ++D.fed) D.cand.push_back(D.seq[D.fed]);
      uint32_t best = kNone;
      bool best_now = false;
      for (uint32_t id : D.cand) {
        const bool now = xs[id].issue_us <= now_;
        if (best == kNone || (now && !best_now) ||
            (now && best_now && xs[id].need_kernel < xs[best].need_kernel) ||
            (!now && !best_now && xs[id].issue_us < xs[best].issue_us)) {
          best = id;
          best_now = now;
        }
      }
      return best;
    }
    if (!D.front.empty()) return kNone;  // started at once by start_idle
    while (D.cursor < D.issued && xs[D.seq[D.cursor]].done) ++D.cursor;
    if (D.cursor == D.issued) return kNone;
    if (!xs[D.seq[D.cursor]].writeback || xs[D.seq[D.cursor]].urgent) return D.seq[D.cursor];
    // Note [Writebacks]: in the background. The first transfer issued by now that is no writeback
    // (or one a kernel waits for), else the first writeback issued by now, else the first issued.
    uint32_t first_bg = kNone;
    for (size_t i = D.cursor; i < D.issued; ++i) {
      const Transfer& x = xs[D.seq[i]];
      if (x.done || x.issue_us > now_) continue;
      if (!x.writeback || x.urgent) return D.seq[i];
      if (first_bg == kNone) first_bg = D.seq[i];
    }
    return first_bg != kNone ? first_bg : D.seq[D.cursor];
  }
  void start_idle(std::vector<Transfer>& xs) {
    for (int d = 0; d < 2; ++d) {
      Direction& D = dir[d];
      if (D.current != kNone) continue;
      while (!D.front.empty()) {
        const uint32_t id = D.front.front();
        D.front.erase(D.front.begin());
        if (!xs[id].done) {
          start(xs, d, id);
          break;
        }
      }
      if (D.current != kNone) continue;
      const uint32_t id = next_issued(xs, d);
      if (id != kNone && xs[id].issue_us <= now_) {
        if (by_deadline_) {
          D.cand.erase(std::find(D.cand.begin(), D.cand.end(), id));
        } else if (id == D.seq[D.cursor]) {
          ++D.cursor;  // else taken out of order (Note [Writebacks]): skipped once done
        }
        start(xs, d, id);
      }
    }
  }
  void progress(double t, bool busy0, bool busy1) {
    const double dt = t - now_;
    if (busy0) dir[0].rem_bytes = std::max(0.0, dir[0].rem_bytes - dt * dir[0].rate(busy1));
    if (busy1) dir[1].rem_bytes = std::max(0.0, dir[1].rem_bytes - dt * dir[1].rate(busy0));
    now_ = t;
  }
  void start(std::vector<Transfer>& xs, int d, uint32_t id) {
    Direction& D = dir[d];
    D.current = id;
    D.seg_begin = now_;
    D.rem_bytes = xs[id].rem_bytes;
    if (xs[id].begin_us < 0) xs[id].begin_us = now_;
  }
  void close_segment(std::vector<Transfer>& xs, int d) {
    Direction& D = dir[d];
    if (now_ > D.seg_begin) {
      D.segments.push_back({D.seg_begin, now_});
      xs[D.current].service_us += now_ - D.seg_begin;
    }
  }
  void finish(std::vector<Transfer>& xs, int d, double end) {
    Direction& D = dir[d];
    now_ = end;
    close_segment(xs, d);
    Transfer& x = xs[D.current];
    x.done = true;
    x.end_us = end;
    x.rem_bytes = 0;
    D.current = kNone;
  }
  // Takes direction d's transfer out of service, its remaining bytes kept; returns its id.
  uint32_t suspend(std::vector<Transfer>& xs, int d) {
    Direction& D = dir[d];
    close_segment(xs, d);
    const uint32_t id = D.current;
    xs[id].rem_bytes = D.rem_bytes;
    D.current = kNone;
    return id;
  }

  bool by_deadline_ = false;  // SimOptions::LinkOrder::kDeadline
  bool preemptive_ = false;   // SimOptions::LinkOrder::kPreemptive
  double now_ = 0;  // the time both directions have been served up to
};

// Compressed lists of transfer ids per global kernel index.
struct Csr {
  std::vector<uint32_t> offsets;
  std::vector<uint32_t> ids;
  std::span<const uint32_t> at(size_t g) const {
    return {ids.data() + offsets[g], ids.data() + offsets[g + 1]};
  }
};

Csr build_csr(size_t slots, const std::vector<std::pair<int64_t, uint32_t>>& keyed) {
  Csr c;
  c.offsets.assign(slots + 1, 0);
  for (const auto& [g, id] : keyed) ++c.offsets[static_cast<size_t>(g) + 1];
  for (size_t i = 0; i < slots; ++i) c.offsets[i + 1] += c.offsets[i];
  c.ids.resize(keyed.size());
  std::vector<uint32_t> fill(c.offsets.begin(), c.offsets.end() - 1);
  for (const auto& [g, id] : keyed) c.ids[fill[static_cast<size_t>(g)]++] = id;
  return c;
}


// Note [Writebacks]
// A writeback move (docs/formats.md, "Writebacks") copies a tensor to its tier while it stays
// resident, after its last write before the offload that follows; that offload is then clean
// (Note [Clean offloads]): it frees the memory when issued. The copy is a transfer on the tier's
// write direction like an offload (same link, same duplex rules), issued when kernel `start` ends;
// kernel `deadline + 1` waits for it. It is background work: on an `issue` link the direction
// serves a writeback only when no other transfer issued by then waits (and one a kernel waits for
// like any other, in issue order), so an early copy never delays an offload that frees memory or a
// prefetch; the `deadline` link order takes transfers by due kernel anyway, and `preemptive` lets
// urgent ones preempt it. check_plan requires the deadline to be no later than the
// offload's, so the kernel that needs the offload's memory also finds the copy complete, and no
// kernel writes the tensor between the writeback and the offload (after the offload it is away).
// A writeback whose start falls in iteration -1 counts as done, like any transfer issued before
// time 0. Its bytes are counted in writeback_bytes (not offload_bytes), its time in write_busy_us,
// and both in the floor: they cross the link.
}  // namespace

// Note [Urgent preemption]
// A kernel that must wait for a transfer marks it urgent. Urgent transfers are served at once, at
// full link bandwidth, preempting the transfer in service (which resumes right after them, before
// anything else queued): chunked preemption with chunks small enough to ignore. Without preemption
// (urgent only jumps the queue) more bandwidth can make a plan slower: a small urgent prefetch
// stuck behind a large transfer that started only because the link got free earlier.
// Note [The host lane]: on a GPU the host launches kernels ahead of the device, and a step is as
// fast as its kernels and transfers only while the host keeps ahead. Small kernels (bf16 autocast
// at small batches: 4,817 operators in 94 ms for llama-1b) leave it no lead, and every recompute
// costs host time to rerun its producer besides the producer's kernels (docs/benchmarks.md,
// "Recompute chains, writebacks and the peers with checkpointing on the H200": predictions 22-31%
// fast where the host was the bound). A trace with host times (kernels[k].host_us, recorded by a
// Session on CUDA) is replayed with a host lane: the host reaches kernel k's operator when it has
// launched kernel k-1, spends the host time of the recomputes due there, then kernel k's host
// time, and only then can kernel k start; the compute stream waits for it (host_wait_us) where the
// host is behind. The host waits for the device once a step (a training loop reads its loss), so
// kernel 0 of every iteration after the first starts its host time when the device is done. Host
// times do not depend on bandwidth, so a kernel's start still never grows with it. Without host
// times the host is taken to keep ahead, as before.
// Note [The runner's host time]: what runs the plan costs host time too, which a recorded trace
// does not hold: a Session's operator callbacks in planned steps (lookups, the plan's moves, the
// sweeps), measured by the Session per operator over its planned steps (stats()["hook_us"] less
// the stalls, which the simulator models as such). SimOptions::runner_host_us_per_kernel adds it
// to every kernel's host time on the host lane; a trace without host times is a CPU's, whose
// kernels the host runs itself, so there every kernel waits for it (host_wait_us), in series.
// Spread evenly over the kernels: the callbacks that issue moves cost more than the others, which
// shifts when the host falls behind within a step but not the host's total.
// Note [The recomputes' host time]: a recompute's host time in the replay is its producer's
// recorded host time (recompute_host_us in analysis.cpp: the producer reruns through the
// dispatcher). What the runner pays to rerun it can differ: the Session's engine makes room, pins
// the inputs and runs a recipe, and the recorded host times are the profiled steps' (Note [Host
// times of planned steps] in controller.cpp). A runner that measured its recomputes' host time per
// iteration passes it (SimOptions::recompute_host_us_per_iteration); the replay then shares it
// among the recomputes in proportion to their producers' recorded host times, so where the host
// lane falls behind still follows the plan. Measured that way it is no longer part of the runner's
// per-kernel host time (the Session leaves it out there), so it is counted once.
// Note [Reads back behind the writes]: an operator that reads a device value back to the host (a
// tensor's item(), is_nonzero, nonzero's size; kernels[k].reads_back, recorded by a Session on
// CUDA) copies it device-to-host on the compute stream, and the GPU's copy engine serves that copy
// after the device-to-host copies queued before it on the transfer streams. Measured on the H200
// (Llama-3-8B shape in autocast, docs/benchmarks.md): HF Llama's mask check reads a flag back at
// its 14th operator, just after the step had issued two 2 GiB offloads; its 1-byte copy ran when
// the second ended, and the compute stream sat idle 75 ms of a 1.09 s step. So such a kernel
// starts only when every write issued before it has ended (counted in stall_us), and the host,
// which waits for the value, reaches the next operator only after the kernel (with a host lane).
// Writes issued after it are not in its way: the Session's issue order moves the writes it can past
// such operators (Note [Writes after reads back]).
// Note [Reported iteration]
// iteration_us is the mean over the simulated iterations: ideal plus every stall from time 0 to the
// start of kernel 0 of the iteration after the last, divided by the iteration count. Each kernel's
// start time never grows when bandwidth grows, so this mean never does either. The last iteration
// alone (last_iteration_us) is closer to the steady state but is a difference of two start times,
// and that difference can grow with bandwidth while the pipeline warms up (a faster iteration 0
// leaves more transfers running into iteration 1).
Prediction prediction_of(const SimResult& r) {
  return Prediction{r.iteration_us, r.ideal_us, r.stall_us, static_cast<double>(r.peak_bytes)};
}

SimResult simulate(const Trace& trace, const Plan& plan, const SimOptions& opts) {
  TERAIO_CHECK(opts.iterations >= 1 && opts.iterations <= 1000,
               "simulate: iterations must be in [1, 1000], got {}", opts.iterations);
  trace.validate();
  const std::vector<TierSpec>& tiers = opts.actual_tiers.empty() ? plan.tiers : opts.actual_tiers;
  TERAIO_CHECK(tiers.size() == plan.tiers.size(),
               "simulate: {} actual tiers given but the plan has {} tiers", tiers.size(),
               plan.tiers.size());

  const Lifetimes lifetimes(trace);
  const PlanCheck check = check_plan(trace, lifetimes, plan, 5);
  if (!check.valid) {
    std::string msg = fmt::format("simulate: the plan is not valid for this trace ({} problems):",
                                  check.error_count);
    for (const std::string& e : check.errors) msg += "\n  " + e;
    throw Error(msg);
  }
  for (const Move& m : plan.moves) {
    if (m.op == MoveOp::recompute) continue;  // no tier, no link
    const TierSpec& ts = tiers[m.tier];
    const bool writes = m.op != MoveOp::prefetch;  // an offload or a writeback
    const double gbps = writes ? ts.write_gbps : ts.read_gbps;
    TERAIO_CHECK(std::isfinite(gbps) && gbps > 0,
                 "simulate: tier \"{}\" has {} bandwidth {} GB/s but moves use it", ts.name,
                 writes ? "write" : "read", gbps);
  }
  for (const TierSpec& ts : tiers) {
    TERAIO_CHECK(std::isfinite(ts.duplex_gbps) && ts.duplex_gbps >= 0,
                 "simulate: tier \"{}\" has both-ways bandwidth {} GB/s; it must be >= 0 (0: the "
                 "directions are independent)",
                 ts.name, ts.duplex_gbps);
  }

  SimResult result;
  result.tiers.resize(tiers.size());
  const auto n = static_cast<int64_t>(trace.num_kernels());
  result.ideal_us = trace.total_time_us();
  result.peak_bytes = check.peak_bytes;
  if (n == 0) return result;

  // Compute-stream time inserted before each kernel by the recomputes due for it.
  std::vector<double> recompute_before(static_cast<size_t>(n), 0);
  for (const RecomputeMove& r : check.recomputes) {
    recompute_before[r.deadline] += r.time_us;
    result.recompute_us += r.time_us;
  }
  result.recomputes = check.recomputes.size();
  // Host time spent before each kernel's own launch by the recomputes due for it: each reruns its
  // producer (or the nested part of it: the share of the producer's time it takes) through the
  // dispatcher, at the producer's host time.
  TERAIO_CHECK(std::isfinite(opts.runner_host_us_per_kernel) && opts.runner_host_us_per_kernel >= 0,
               "simulate: runner_host_us_per_kernel must be a finite number >= 0, got {}",
               opts.runner_host_us_per_kernel);
  const bool host_lane = trace.has_host_times();
  const double runner_us = opts.runner_host_us_per_kernel;  // Note [The runner's host time]
  TERAIO_CHECK(std::isfinite(opts.recompute_host_us_per_iteration) &&
                   opts.recompute_host_us_per_iteration >= 0,
               "simulate: recompute_host_us_per_iteration must be a finite number >= 0, got {}",
               opts.recompute_host_us_per_iteration);
  std::vector<double> host_recompute_before;
  if (host_lane) {
    host_recompute_before.assign(static_cast<size_t>(n), 0);
    for (const RecomputeMove& r : check.recomputes) {
      const double us = recompute_host_us(trace, r.tensor);
      host_recompute_before[r.deadline] += us;
      result.recompute_host_us += us;
    }
    // Note [The recomputes' host time]
    const double measured = opts.recompute_host_us_per_iteration;
    if (measured > 0 && result.recompute_host_us > 0) {
      for (double& us : host_recompute_before) us *= measured / result.recompute_host_us;
      result.recompute_host_us = measured;
    }
    for (size_t k = 0; k < static_cast<size_t>(n); ++k)
      result.host_us += trace.kernel_host_us(static_cast<KernelIndex>(k)) + host_recompute_before[k];
  }
  result.host_us += runner_us * static_cast<double>(n);

  const int64_t iters = opts.iterations;
  const int64_t last_g = iters * n;  // kernel 0 of the iteration after the last: only its start
  const int64_t first_g = (iters - 1) * n;  // kernel 0 of the last iteration
  TERAIO_CHECK(last_g <= 50'000'000,
               "simulate: {} iterations of {} kernels is too many kernel steps "
               "(at most 50 million; lower the iteration count)",
               iters, n);

  // One offload and one prefetch transfer per pair and iteration. Iteration -1 contributes the part
  // of wrap-around pairs that lands in iteration 0; whatever it issued before time 0 counts as
  // done.
  std::vector<Transfer> xs;
  std::vector<std::pair<int64_t, uint32_t>> issue_keyed, need_keyed;
  xs.reserve(check.pairs.size() * 2 * static_cast<size_t>(iters + 1));
  auto add = [&](const MovePair& p, bool offload, int64_t issue_g, int64_t need_g) {
    Transfer x;
    x.bytes = p.bytes;
    x.rem_bytes = static_cast<double>(p.bytes);
    x.offload = offload;
    x.link = p.tier * 2 + (offload ? 0 : 1);
    x.issue_kernel = issue_g;
    x.need_kernel = need_g;
    x.move = offload ? p.offload_index : p.prefetch_index;
    const auto id = static_cast<uint32_t>(xs.size());
    xs.push_back(x);
    issue_keyed.emplace_back(issue_g, id);
    if (need_g <= last_g) need_keyed.emplace_back(need_g, id);
  };
  // Discards (Note [Dead tensors]): with plan.discard_dead, a tail of a transient tensor (an offload
  // no prefetch follows; it dies before anything reads it) frees its memory when issued and writes
  // nothing, like a clean offload (and before one: the runtime discards those too). Counted in
  // discards, not in the bytes moved nor the floor.
  std::vector<uint8_t> discard(check.pairs.size(), 0);
  if (plan.discard_dead) {
    for (size_t i = 0; i < check.pairs.size(); ++i) {
      const MovePair& p = check.pairs[i];
      if (is_discard(trace, plan, p)) {
        discard[i] = 1;
        ++result.discards;
        result.discarded_bytes += p.bytes;
      }
    }
  }
  // Clean offloads (Note [Clean offloads] in plan_check.cpp; writebacks make some) free the memory
  // when issued: no transfer.
  std::vector<uint8_t> clean = clean_offloads(trace, check);
  for (size_t i = 0; i < check.pairs.size(); ++i) {
    if (discard[i]) clean[i] = 0;
    if (!clean[i]) continue;
    const MovePair& p = check.pairs[i];
    ++result.clean_offloads;
    result.clean_offload_bytes += p.bytes;
    ++result.tiers[p.tier].clean_offloads;
    result.tiers[p.tier].clean_offload_bytes += p.bytes;
  }
  for (const WritebackMove& w : check.writebacks) {  // Note [Writebacks]
    ++result.writebacks;
    result.writeback_bytes += w.bytes;
    ++result.tiers[w.tier].writebacks;
    result.tiers[w.tier].writeback_bytes += w.bytes;
  }
  for (int64_t it = -1; it < iters; ++it) {
    for (size_t i = 0; i < check.pairs.size(); ++i) {
      const MovePair& p = check.pairs[i];
      if (p.idle || discard[i]) continue;  // out since an earlier iteration / freed: nothing moves
      const int64_t base = it * n + p.start;
      const int64_t off_issue = base;  // at the end of this kernel
      const int64_t off_need = base + p.offload_done + 1;
      const int64_t pre_issue = base + p.prefetch_begin;  // at the beginning of this kernel
      const int64_t pre_need = base + p.prefetch_deadline;
      if (off_issue >= 0 && !clean[i]) add(p, true, off_issue, off_need);
      if (p.one_way()) continue;  // dies where it is: nothing comes back
      if (pre_issue >= 0 && pre_issue <= last_g) add(p, false, pre_issue, pre_need);
    }
    for (const WritebackMove& w : check.writebacks) {  // Note [Writebacks]
      const int64_t issue_g = it * n + w.start;  // at the end of this kernel
      if (issue_g < 0) continue;
      add(check.pairs[w.pair_index], true, issue_g, issue_g + w.done + 1);
      xs.back().writeback = true;
      xs.back().move = w.move_index;
    }
  }
  TERAIO_CHECK(xs.size() < kNone, "simulate: too many transfers ({})", xs.size());
  // One kernel's transfers are issued in the plan's order of their moves, as the runtime issues
  // them (Schedule::add_move keeps it per operator).
  std::stable_sort(issue_keyed.begin(), issue_keyed.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : xs[a.second].move < xs[b.second].move;
  });
  const Csr issue = build_csr(static_cast<size_t>(last_g) + 1, issue_keyed);
  const Csr need = build_csr(static_cast<size_t>(last_g) + 1, need_keyed);
  issue_keyed = {};
  need_keyed = {};

  std::vector<TierLinks> links;
  for (const TierSpec& ts : tiers) links.emplace_back(ts, opts.link_order);
  auto direction = [&](uint32_t link) -> Direction& { return links[link / 2].dir[link % 2]; };
  for (size_t g = 0; g <= static_cast<size_t>(last_g); ++g) {
    for (uint32_t id : issue.at(g)) direction(xs[id].link).seq.push_back(id);
  }

  std::vector<double> start_us(static_cast<size_t>(n) + 1);  // kernel starts of the last iteration
  std::vector<Segment> gaps;  // compute-stream idle intervals, all iterations
  double stall_us = 0;        // all iterations
  size_t urgent = 0;
  std::vector<std::pair<uint32_t, uint32_t>> waiting;  // (link, transfer)
  std::vector<uint32_t> group;

  // Waits until every transfer of `kind` that kernel g needs is done; returns the time it is.
  auto satisfy = [&](int64_t g, bool offload, double t) {
    waiting.clear();
    for (uint32_t id : need.at(static_cast<size_t>(g))) {
      Transfer& x = xs[id];
      if (x.offload != offload) continue;
      links[x.link / 2].advance(xs, t);
      if (!x.done) waiting.emplace_back(x.link, id);
    }
    if (waiting.empty()) return t;
    // By link, then in issue order (the order among one kernel's urgent transfers only changes
    // which of them lands first, not when the kernel can start).
    std::sort(waiting.begin(), waiting.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first < b.first;
      return xs[a.second].issue_kernel != xs[b.second].issue_kernel
                 ? xs[a.second].issue_kernel < xs[b.second].issue_kernel
                 : a.second < b.second;
    });
    double ready = t;
    for (size_t i = 0; i < waiting.size();) {
      const uint32_t link = waiting[i].first;
      group.clear();
      for (; i < waiting.size() && waiting[i].first == link; ++i) {
        group.push_back(waiting[i].second);
        xs[waiting[i].second].urgent = true;
      }
      if (g > first_g) urgent += group.size();
      ready = std::max(ready, links[link / 2].serve_urgent(xs, static_cast<int>(link % 2), group));
    }
    return ready;
  };
  auto issue_all = [&](int64_t g, bool offload, double t) {
    for (uint32_t id : issue.at(static_cast<size_t>(g))) {
      Transfer& x = xs[id];
      if (x.offload != offload) continue;
      x.issue_us = t;
      ++direction(x.link).issued;
    }
  };

  double t = 0;  // when the compute stream is free
  double h = 0;  // when the host has launched every kernel so far (Note [The host lane])
  double host_wait_us = 0;  // all iterations
  const std::span<const double> times = trace.kernel_times_us();
  for (int64_t g = 0; g <= last_g; ++g) {
    const auto k = static_cast<size_t>(g % n);
    double host_reach = 0;  // when the host reaches kernel g's operator
    if (host_lane) {
      if (k == 0 && g > 0) h = std::max(h, t);  // the loop waits for the device once a step
      host_reach = h;
      if (host_reach > t) {
        host_wait_us += host_reach - t;
        gaps.push_back({t, host_reach});
        t = host_reach;
      }
    }
    const double free_us = t;
    t = satisfy(g, true, t);   // offloads that free the memory kernel g needs
    issue_all(g, false, t);    // prefetches issued as kernel g begins take memory now
    t = satisfy(g, false, t);  // prefetches kernel g reads
    // Note [Reads back behind the writes]
    if (g < last_g && trace.kernel_reads_back(static_cast<KernelIndex>(k))) {
      for (TierLinks& l : links) {
        Direction& w = l.dir[0];
        l.advance(xs, t);
        for (size_t i = 0; i < w.issued; ++i)
          if (!xs[w.seq[i]].done) l.advance(xs, kInf, w.seq[i]);
        t = std::max(t, l.now());
      }
    }
    if (t > free_us) {
      stall_us += t - free_us;
      gaps.push_back({free_us, t});
    }
    if (g < last_g) t += recompute_before[k];  // inputs resident (check_plan)
    if (!host_lane && runner_us > 0 && g < last_g) {  // the host runs the kernels: in series
      host_wait_us += runner_us;
      gaps.push_back({t, t + runner_us});
      t += runner_us;
    }
    if (host_lane && g < last_g) {
      h = host_reach + host_recompute_before[k] +
          trace.kernel_host_us(static_cast<KernelIndex>(k)) + runner_us;
      if (h > t) {
        host_wait_us += h - t;
        gaps.push_back({t, h});
        t = h;
      }
    }
    if (g >= first_g) start_us[static_cast<size_t>(g - first_g)] = t;
    if (g == last_g) break;
    t += times[static_cast<size_t>(g % n)];
    // The host waits for the value it reads back (Note [Reads back behind the writes]).
    if (host_lane && trace.kernel_reads_back(static_cast<KernelIndex>(k))) h = std::max(h, t);
    issue_all(g, true, t);  // offloads begin once kernel g has finished
  }
  for (TierLinks& l : links) l.advance(xs, kInf);

  // See Note [Reported iteration].
  result.stall_us = stall_us / static_cast<double>(iters);
  result.host_wait_us = host_wait_us / static_cast<double>(iters);
  result.iteration_us = result.ideal_us + result.stall_us + result.recompute_us + result.host_wait_us;
  result.last_iteration_us = start_us[static_cast<size_t>(n)] - start_us[0];
  result.urgent_fetches = urgent;

  // Per-iteration traffic: the transfers issued by the kernels of the last iteration.
  const double t0 = start_us[0];
  const double t1 = start_us[static_cast<size_t>(n)];
  for (const Transfer& x : xs) {
    if (x.issue_kernel < first_g || x.issue_kernel >= last_g) continue;
    TierTraffic& tt = result.tiers[x.link / 2];
    (x.offload ? tt.write_busy_us : tt.read_busy_us) += x.service_us;
    if (opts.record_timeline) {
      result.transfers.push_back(
          {x.link / 2, x.offload, x.urgent, x.begin_us - t0, x.end_us - t0, x.bytes, x.move, x.writeback,
           x.issue_kernel - first_g, x.need_kernel - first_g});
    }
    if (x.writeback) continue;  // counted in writeback_bytes
    (x.offload ? tt.offload_bytes : tt.prefetch_bytes) += x.bytes;
    const auto kind = static_cast<size_t>(trace.tensors[plan.moves[x.move].tensor].kind);
    (x.offload ? result.offload_bytes_by_kind : result.prefetch_bytes_by_kind)[kind] += x.bytes;
  }
  if (opts.record_timeline) {
    result.kernel_start_us.resize(static_cast<size_t>(n));
    for (size_t k = 0; k < static_cast<size_t>(n); ++k)
      result.kernel_start_us[k] = start_us[k] - t0;
  }

  // Overlap: link service time before the end of the last iteration minus the part of it spent
  // while the stream waited, per iteration.
  std::vector<double> gap_prefix(gaps.size() + 1, 0);
  for (size_t i = 0; i < gaps.size(); ++i)
    gap_prefix[i + 1] = gap_prefix[i] + (gaps[i].end_us - gaps[i].begin_us);
  auto stalled_before = [&](double x) {  // total gap time in (-inf, x]
    auto it = std::upper_bound(gaps.begin(), gaps.end(), x,
                               [](double v, const Segment& s) { return v < s.begin_us; });
    const size_t i = static_cast<size_t>(it - gaps.begin());
    if (i == 0) return 0.0;
    return gap_prefix[i - 1] + std::min(x, gaps[i - 1].end_us) - gaps[i - 1].begin_us;
  };
  double overlap = 0;
  for (const TierLinks& l : links) {
    for (const Direction& d : l.dir) {
      for (const Segment& s : d.segments) {
        const double a = s.begin_us;
        const double b = std::min(s.end_us, t1);
        if (b <= a) continue;
        overlap += (b - a) - (stalled_before(b) - stalled_before(a));
      }
    }
  }
  result.overlap_us = std::max(0.0, overlap / static_cast<double>(iters));
  // The floor: per-direction link time at each direction's full bandwidth, or the compute.
  result.floor_us = result.ideal_us + result.recompute_us;
  result.floor_bound = "compute";
  for (size_t i = 0; i < tiers.size(); ++i) {
    const TierTraffic& traffic = result.tiers[i];
    const uint64_t written = traffic.offload_bytes + traffic.writeback_bytes;
    const double write_us = written ? static_cast<double>(written) / (tiers[i].write_gbps * 1e3) : 0;
    const double read_us = traffic.prefetch_bytes
                               ? static_cast<double>(traffic.prefetch_bytes) / (tiers[i].read_gbps * 1e3)
                               : 0;
    if (write_us > result.floor_us) result.floor_us = write_us, result.floor_bound = tiers[i].name + " write";
    if (read_us > result.floor_us) result.floor_us = read_us, result.floor_bound = tiers[i].name + " read";
  }
  return result;
}

}  // namespace teraio

namespace teraio {

// Note [Issue in deadline order]: links that serve in issue order make a transfer due soon wait
// behind every one issued before it, also those due much later (on the H200, a write due in the
// next step, issued in the optimizer step, held up writes due at the next kernel: the simulator
// replaying llama-1b's plan predicted 775 ms with such links, 699 ms with preemption and 676 ms
// with links that take the transfer due first). Issuing each transfer where the due-first link
// would start it gives an issue order that is that service order. The begin times come from the
// last simulated iteration; one later than the iteration's end lands in the next one, at the same
// offset (the steady state repeats).
// Note [Leaving the link idle for a transfer due sooner]
// A due-first link still starts whatever is waiting when it falls idle, and a long transfer it
// starts then holds it, whole, while one due much sooner is issued behind it. On the H200's
// Llama-3-8B autocast profile with steps in backward, the embedding's exp_avg_sq (2 GB, written
// after the embedding's update at the end of the backward, due well into the next forward) took
// the write link 4 ms before the embedding weight was free to go (after the forward's first
// kernel), and the forward stood 34.5 ms at its 316th kernel waiting for that weight: 1.014 s
// simulated, 0.988 s with the weight and its exp_avg issued first by hand, 0.997 s as the search
// now issues it (docs/benchmarks.md, "Issue order that leaves a link idle"). So the begin times are also
// made by a schedule that may leave the link idle: each direction of each tier, over two periods of
// the last iteration (the second keeps what the first leaves running at its end), takes, when the
// link is free, the waiting transfer due first, unless one issued before it would end, due sooner,
// comes out later than it should behind it and less late when the link waits for it (the larger
// lateness of the two taken either way; due: the end of the kernel before the one that waits for
// it, in the reference run). Writebacks keep their begin times (they yield to other writes). The
// moves one kernel issues are listed in the order they begin (the runtime and the simulator issue
// them in the plan's order). Both issue orders are simulated as run, and the fastest of them and
// the plan as it was is kept (by ranking_us).
namespace {

// A replay's kernels extended periodically: kernel k counted from kernel 0 of the last iteration
// (k may be negative or >= the trace's kernels), each iteration repeating the last one.
struct PeriodicKernels {
  const Trace& trace;
  const SimResult& r;  // with kernel_start_us (record_timeline)
  int64_t n() const { return static_cast<int64_t>(trace.num_kernels()); }
  int64_t wraps(int64_t k) const { return k >= 0 ? k / n() : -((-k + n() - 1) / n()); }
  int64_t within(int64_t k) const { return k - wraps(k) * n(); }  // its index in the trace
  double start_of(int64_t k) const {
    return r.kernel_start_us[static_cast<size_t>(within(k))] +
           static_cast<double>(wraps(k)) * r.last_iteration_us;
  }
  double end_of(int64_t k) const {
    return start_of(k) + trace.kernel_time_us(static_cast<KernelIndex>(within(k)));
  }
};

// Per transfer of the reference run (indexed as r.transfers), the begin time of the schedule of
// Note [Leaving the link idle for a transfer due sooner]; the reference's own where it keeps it.
std::vector<double> begins_leaving_idle(const Trace& trace, const Plan& plan, const SimResult& r) {
  const PeriodicKernels kernels{trace, r};
  const double period = r.last_iteration_us;
  std::vector<double> begin(r.transfers.size());
  struct Job {
    double release, due, length;
    size_t transfer;
    bool copy;  // the second period's
  };
  std::map<std::pair<uint32_t, bool>, std::vector<Job>> links;
  for (size_t i = 0; i < r.transfers.size(); ++i) {
    const SimTransfer& x = r.transfers[i];
    begin[i] = x.begin_us;
    if (x.writeback) continue;
    const TierSpec& tier = plan.tiers.at(x.tier);
    const double gbps = x.offload ? tier.write_gbps : tier.read_gbps;
    if (!(gbps > 0)) continue;
    const double release = x.offload ? kernels.end_of(x.issue_kernel) : kernels.start_of(x.issue_kernel);
    const double due = kernels.end_of(x.need_kernel - 1);
    const double length = static_cast<double>(x.bytes) / (gbps * 1e3);
    std::vector<Job>& jobs = links[{x.tier, x.offload}];
    jobs.push_back({release, due, length, i, false});
    jobs.push_back({release + period, due + period, length, i, true});
  }
  for (auto& [link, jobs] : links) {
    std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
      return a.release != b.release ? a.release < b.release : a.due < b.due;
    });
    auto later_due = [&](size_t a, size_t b) { return jobs[a].due > jobs[b].due; };
    std::priority_queue<size_t, std::vector<size_t>, decltype(later_due)> waiting(later_due);
    size_t next = 0;  // first job not yet released
    double t = -kInf;
    while (next < jobs.size() || !waiting.empty()) {
      if (waiting.empty()) t = std::max(t, jobs[next].release);
      while (next < jobs.size() && jobs[next].release <= t) waiting.push(next++);
      const size_t c = waiting.top();
      const Job& J = jobs[c];
      // A job released while c would run, due sooner, better served first after an idle wait.
      std::optional<size_t> first;
      for (size_t j = next; j < jobs.size() && jobs[j].release < t + J.length; ++j) {
        const Job& X = jobs[j];
        if (X.due >= J.due) continue;
        const double c_first = std::max({0.0, t + J.length - J.due, t + J.length + X.length - X.due});
        const double x_first =
            std::max({0.0, X.release + X.length - X.due, X.release + X.length + J.length - J.due});
        if (x_first < c_first && (!first || X.due < jobs[*first].due)) first = j;
      }
      if (first) {
        t = jobs[*first].release;
        continue;  // released at the next turn, then taken first (due before every one waiting)
      }
      waiting.pop();
      if (J.copy) begin[J.transfer] = t - period;
      t += J.length;
    }
  }
  return begin;
}

// Note [Writes after reads back]: a write still running when an operator reads a value back holds
// that operator, and the host behind it, until the write ends (Note [Reads back behind the
// writes]). An offload issued before such an operator whose copy, in the replay `r`, ends after the
// kernel before the operator, and which may begin as late as the operator's end (before its
// deadline), is issued there instead; so is a writeback, where that is still at or before the
// offload that relies on it. nullopt when none is, or the plan would not be valid.
// issue_in_deadline_order keeps it where the replay is faster.
std::optional<Plan> writes_after_reads_back(const Trace& trace, const Lifetimes& lifetimes,
                                            const Plan& plan, const SimResult& r) {
  const auto N = static_cast<int64_t>(trace.num_kernels());
  std::vector<int64_t> reads;
  for (int64_t k = 0; k < N; ++k)
    if (trace.kernel_reads_back(static_cast<KernelIndex>(k))) reads.push_back(k);
  if (reads.empty() || r.kernel_start_us.size() < static_cast<size_t>(N)) return std::nullopt;
  const PeriodicKernels kernels{trace, r};
  // The first kernel that reads back after kernel k (periodically).
  auto next_read = [&](int64_t k) {
    const int64_t wraps = kernels.wraps(k);
    const auto it = std::upper_bound(reads.begin(), reads.end(), kernels.within(k));
    return it != reads.end() ? *it + wraps * N : reads.front() + (wraps + 1) * N;
  };
  Plan out = plan;
  // How far past its start a move whose transfer is x is issued instead: to the end of the first
  // kernel that reads back after it, when x is in that kernel's way and the move's deadline allows;
  // 0 when not.
  auto past_the_read = [&](const SimTransfer& x, const Move& m) -> int64_t {
    const int64_t read = next_read(x.issue_kernel);
    // Ended before the reading kernel could start (the kernel before it ended): not in its way.
    if (x.end_us <= kernels.end_of(read - 1)) return 0;
    const int64_t span = (static_cast<int64_t>(m.deadline) - m.start + N) % N;
    const int64_t d = read - x.issue_kernel;  // issued at the end of the reading kernel instead
    return d > span - 1 ? 0 : d;              // too late for its deadline
  };
  // The distance from a writeback's start to the offload that relies on it (the first of its
  // tensor, to its tier, at or after its start); -1 when none does.
  auto relied_on_at = [&](const Move& w) {
    int64_t relied = -1;
    for (const Move& o : out.moves)
      if (o.op == MoveOp::offload && o.tensor == w.tensor && o.tier == w.tier) {
        const int64_t at = (static_cast<int64_t>(o.start) - w.start + N) % N;
        if (relied < 0 || at < relied) relied = at;
      }
    return relied;
  };
  // The offloads first, then the writebacks in its way too (offloads only move later): a writeback
  // moves no further than the offload that relies on it, so that offload still relies on it and
  // the tensor stays resident and unchanged in between.
  bool changed = false;
  for (const MoveOp op : {MoveOp::offload, MoveOp::writeback}) {
    for (const SimTransfer& x : r.transfers) {
      const bool ours = op == MoveOp::writeback ? x.writeback : x.offload && !x.writeback;
      if (!ours || x.move >= out.moves.size() || out.moves[x.move].op != op) continue;
      Move& m = out.moves[x.move];
      const int64_t d = past_the_read(x, m);
      if (d == 0) continue;
      if (op == MoveOp::writeback) {
        const int64_t relied = relied_on_at(m);
        if (relied < 0 || d > relied) continue;
      }
      m.start = static_cast<KernelIndex>((m.start + d) % N);
      changed = true;
    }
  }
  if (!changed) return std::nullopt;
  std::stable_sort(out.moves.begin(), out.moves.end(),
                   [](const Move& a, const Move& b) { return a.start < b.start; });
  if (!check_plan(trace, lifetimes, out, 1).valid) return std::nullopt;
  return out;
}

}  // namespace

Plan issue_in_deadline_order(const Trace& trace, const Plan& plan, const SimOptions& opts, SimResult* as_run) {
  const size_t n = trace.num_kernels();
  SimOptions run_opts = opts;  // the replays compared, as run
  run_opts.record_timeline = false;
  if (n == 0 || plan.moves.empty()) {
    if (as_run) *as_run = simulate(trace, plan, run_opts);
    return plan;
  }
  SimOptions o = opts;
  o.link_order = SimOptions::LinkOrder::kDeadline;
  o.record_timeline = true;
  o.iterations = std::max(o.iterations, 3);
  const SimResult r = simulate(trace, plan, o);
  const std::vector<double>& start = r.kernel_start_us;
  const double period = r.last_iteration_us;
  // The last kernel of (the periodic extension of) the last iteration that starts at or before t,
  // as an offset from kernel 0 of that iteration (may be >= n).
  auto kernel_at = [&](double t) -> int64_t {
    const auto wraps = period > 0 ? static_cast<int64_t>(std::floor(t / period)) : 0;
    const double in = t - static_cast<double>(wraps) * period;
    const auto it = std::upper_bound(start.begin(), start.end(), in);
    const int64_t k = it == start.begin() ? 0 : (it - start.begin()) - 1;
    return wraps * static_cast<int64_t>(n) + k;
  };
  const auto N = static_cast<int64_t>(n);
  const Lifetimes lifetimes(trace);
  // The plan with each transfer issued where it begins at `begin` (per r.transfers), or nullopt
  // when that plan is not valid.
  auto reissued = [&](const std::vector<double>& begin) -> std::optional<Plan> {
    Plan out = plan;
    // Moves issued by one kernel go in the order they begin (the lanes take them in plan order);
    // those with no transfer here (recomputes, writebacks, clean offloads, discards) first.
    std::vector<double> at_time(out.moves.size(), -kInf);
    for (size_t i = 0; i < r.transfers.size(); ++i) {
      const SimTransfer& x = r.transfers[i];
      if (x.move >= out.moves.size()) continue;
      Move& m = out.moves[x.move];
      at_time[x.move] = begin[i];
      // A writeback stays where it was planned: moved later it could pass the offload that relies
      // on it (which only moves later), or a write.
      if (m.op == MoveOp::writeback) continue;
      // Distances along the iteration from the planned start: never earlier, never past the deadline.
      const int64_t s = m.start;
      const int64_t span = (static_cast<int64_t>(m.deadline) - s + N) % N;
      int64_t at = kernel_at(begin[i]);  // the kernel running when it begins
      if (x.offload) at -= 1;            // an offload is issued at the end of the kernel before
      const int64_t last = x.offload ? std::max<int64_t>(span - 1, 0) : span;
      const int64_t d = std::clamp<int64_t>(at - s, 0, last);
      m.start = static_cast<KernelIndex>((s + d) % N);
    }
    std::vector<size_t> order(out.moves.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const Move& x = out.moves[a];
      const Move& y = out.moves[b];
      return x.start != y.start ? x.start < y.start : at_time[a] < at_time[b];
    });
    std::vector<Move> sorted;
    sorted.reserve(order.size());
    for (size_t i : order) sorted.push_back(out.moves[i]);
    out.moves = std::move(sorted);
    if (!check_plan(trace, lifetimes, out, 1).valid) return std::nullopt;
    return out;
  };
  std::vector<double> due_first(r.transfers.size());
  for (size_t i = 0; i < r.transfers.size(); ++i) due_first[i] = r.transfers[i].begin_us;
  // Usually much faster; where it is not (issue order is not the due-first order everywhere, and
  // a link that serves in issue order is not monotonic), the plan as it was.
  Plan best = plan;
  SimResult best_run = simulate(trace, plan, run_opts);
  // due first: kept on a tie with the plan as it was; leaving idle: only when faster than both
  bool tie_wins = true;
  for (const std::vector<double>& begin : {due_first, begins_leaving_idle(trace, plan, r)}) {
    if (std::optional<Plan> out = reissued(begin)) {
      SimResult run = simulate(trace, *out, run_opts);
      const double us = ranking_us(run), best_us = ranking_us(best_run);
      if (us < best_us || (tie_wins && us == best_us)) best = std::move(*out), best_run = std::move(run);
    }
    tie_wins = false;
  }
  // Note [Writes after reads back]: only where faster, and tried only where a kernel that reads
  // back started late in the reference replay (two more replays per plan searched otherwise).
  const PeriodicKernels kernels{trace, r};
  bool read_waited = false;
  for (int64_t k = 1; k < N && !read_waited; ++k)
    read_waited = trace.kernel_reads_back(static_cast<KernelIndex>(k)) &&
                  kernels.start_of(k) > kernels.end_of(k - 1) + 1e-6;
  if (read_waited) {
    SimOptions shown = run_opts;
    shown.record_timeline = true;
    if (std::optional<Plan> out = writes_after_reads_back(trace, lifetimes, best, simulate(trace, best, shown))) {
      SimResult run = simulate(trace, *out, run_opts);
      if (ranking_us(run) < ranking_us(best_run)) best = std::move(*out), best_run = std::move(run);
    }
  }
  if (as_run) *as_run = std::move(best_run);
  return best;
}

double ranking_us(const SimResult& r) { return std::max(r.iteration_us, r.last_iteration_us); }

std::string bytes_by_kind_text(const SimResult& r) {
  std::vector<size_t> kinds;
  for (size_t k = 0; k < kNumTensorKinds; ++k)
    if (r.offload_bytes_by_kind[k] || r.prefetch_bytes_by_kind[k]) kinds.push_back(k);
  std::stable_sort(kinds.begin(), kinds.end(), [&](size_t a, size_t b) {
    return r.offload_bytes_by_kind[a] + r.prefetch_bytes_by_kind[a] >
           r.offload_bytes_by_kind[b] + r.prefetch_bytes_by_kind[b];
  });
  std::string out;
  for (size_t k : kinds) {
    out += fmt::format("{}{} {} out / {} in", out.empty() ? "" : ", ",
                       to_string(static_cast<TensorKind>(k)),
                       format_bytes(static_cast<double>(r.offload_bytes_by_kind[k])),
                       format_bytes(static_cast<double>(r.prefetch_bytes_by_kind[k])));
  }
  return out.empty() ? "nothing" : out;
}

std::string bytes_by_kind_json(const SimResult& r) {
  std::string out;
  for (size_t k = 0; k < kNumTensorKinds; ++k) {
    if (!r.offload_bytes_by_kind[k] && !r.prefetch_bytes_by_kind[k]) continue;
    out += fmt::format("{}\"{}\": {{\"offload_bytes\": {}, \"prefetch_bytes\": {}}}", out.empty() ? "" : ", ",
                       to_string(static_cast<TensorKind>(k)), r.offload_bytes_by_kind[k],
                       r.prefetch_bytes_by_kind[k]);
  }
  return "{" + out + "}";
}

}  // namespace teraio
