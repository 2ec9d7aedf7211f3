// Helpers for the simulator tests: small hand-built traces and a generator of random valid plans
// (every chosen inactive period gets an offload/prefetch pair with random inner points, or an
// offload alone when no use follows the period).
#pragma once

#include <algorithm>
#include <random>
#include <vector>

#include "teraio/analysis.h"
#include "teraio/plan.h"
#include "teraio/plan_check.h"
#include "teraio/trace.h"

namespace teraio::test {

struct TensorSpec {
  uint64_t bytes = 0;
  bool persistent = false;
};

// Kernel k takes times[k] us and touches uses[k].
inline Trace make_trace(const std::vector<double>& times, const std::vector<TensorSpec>& tensors,
                        const std::vector<std::vector<TensorId>>& uses) {
  Trace tr;
  for (const TensorSpec& t : tensors)
    tr.add_tensor(TensorInfo{t.bytes, TensorKind::activation, t.persistent, ""});
  for (size_t k = 0; k < times.size(); ++k) {
    const std::vector<TensorId> none;
    tr.add_kernel("k", times[k], k < uses.size() ? uses[k] : none);
  }
  return tr;
}

inline TierSpec tier(const char* name, double read_gbps, double write_gbps) {
  return TierSpec{name, uint64_t{1} << 50, read_gbps, write_gbps};
}

inline Move offload(TensorId t, KernelIndex start, KernelIndex deadline, uint32_t tier_index = 0) {
  return Move{t, MoveOp::offload, tier_index, start, deadline};
}
inline Move prefetch(TensorId t, KernelIndex start, KernelIndex deadline, uint32_t tier_index = 0) {
  return Move{t, MoveOp::prefetch, tier_index, start, deadline};
}

// Sets plan.budget_bytes to the plan's own resident peak, so that the plan is tight and valid.
inline void fit_budget(const Trace& trace, Plan& plan) {
  plan.budget_bytes = uint64_t{1} << 60;
  const Lifetimes lt(trace);
  plan.budget_bytes = check_plan(trace, lt, plan).peak_bytes;
}

// A random trace: kernels of 0-20 us, tensors of 1-100 kB, some persistent, 1-5 uses each.
// `heavy`: up to 40 tensors of up to 1 MB, so that links stay congested across iterations.
inline Trace random_trace(std::mt19937_64& rng, bool heavy = false) {
  std::uniform_int_distribution<int> nk(3, 60), nt(1, heavy ? 40 : 15), nu(1, 5);
  std::uniform_int_distribution<uint64_t> bytes(1000, heavy ? 1000000 : 100000);
  std::uniform_real_distribution<double> time(0.0, 20.0);
  const int n = nk(rng);
  const int t = nt(rng);
  std::vector<double> times(n);
  for (double& x : times) x = (rng() % 8 == 0) ? 0.0 : time(rng);
  std::vector<TensorSpec> tensors(t);
  std::vector<std::vector<TensorId>> uses(n);
  std::uniform_int_distribution<int> kernel(0, n - 1);
  for (int i = 0; i < t; ++i) {
    tensors[i] = {bytes(rng), rng() % 5 < 2};
    const int u = nu(rng);
    for (int j = 0; j < u; ++j) uses[kernel(rng)].push_back(static_cast<TensorId>(i));
  }
  return make_trace(times, tensors, uses);
}

// Gives about half of the non-persistent tensors a random alive_until after their last use and
// adds 0-2 persistent tensors no kernel uses.
inline void add_alive_until_and_idle(Trace& trace, std::mt19937_64& rng) {
  const Lifetimes lt(trace);
  const auto n = static_cast<KernelIndex>(trace.num_kernels());
  for (TensorId t = 0; t < trace.num_tensors(); ++t) {
    if (trace.tensors[t].persistent || !lt.used(t) || rng() % 2) continue;
    trace.tensors[t].alive_until = lt.last_use(t) + static_cast<KernelIndex>(rng() % (n - lt.last_use(t)));
  }
  for (uint64_t i = rng() % 3; i > 0; --i) {
    trace.add_tensor(TensorInfo{1000 + rng() % 100000, TensorKind::parameter, true, "idle"});
  }
}

// A random valid plan over 1-2 tiers: each inactive period is moved with probability 0.6, with a
// random offload deadline and prefetch start inside it (sometimes forced: deadline == start, or
// prefetch start == deadline). The budget is the plan's resident peak.
inline Plan random_plan(const Trace& trace, std::mt19937_64& rng) {
  const Lifetimes lt(trace);
  const auto n = static_cast<uint32_t>(trace.num_kernels());
  Plan plan;
  std::uniform_real_distribution<double> bw(0.5, 5.0);
  const int tiers = 1 + static_cast<int>(rng() % 2);
  for (int i = 0; i < tiers; ++i)
    plan.tiers.push_back(tier(i == 0 ? "ssd" : "host", bw(rng), bw(rng)));
  for (const InactivePeriod& p : inactive_periods(trace, lt)) {
    if (rng() % 10 >= 6) continue;
    if (p.no_next_use) {  // an offload alone: anywhere for an idle tensor, else done by `end`
      const auto ti = static_cast<uint32_t>(rng() % tiers);
      const auto start = static_cast<KernelIndex>(p.wraps ? rng() % n : p.start);
      const auto deadline = static_cast<KernelIndex>(p.wraps ? rng() % n : start + rng() % (p.end - start + 1));
      plan.moves.push_back(offload(p.tensor, start, deadline, ti));
      continue;
    }
    const uint32_t len =
        p.end == p.start ? n : (p.end + n - p.start) % n;    // cyclic distance to next use
    const uint32_t dd = static_cast<uint32_t>(rng() % len);  // [0, len-1]
    const uint32_t sd = dd + 1 + static_cast<uint32_t>(rng() % (len - dd));  // [dd+1, len]
    const auto ti = static_cast<uint32_t>(rng() % tiers);
    plan.moves.push_back(offload(p.tensor, p.start, (p.start + dd) % n, ti));
    plan.moves.push_back(prefetch(p.tensor, (p.start + sd) % n, p.end, ti));
  }
  fit_budget(trace, plan);
  return plan;
}

}  // namespace teraio::test
