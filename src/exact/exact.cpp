// The exact planner: builds the slot-model mixed-integer program of docs/planner.md ("How good is
// the plan") for every inactive period and tier, solves it with GLPK's branch and bound (seeded with
// the greedy plan), and turns the solution back into a teraio plan that check_plan accepts. A gap of a
// recomputable tensor may be recomputed instead (Note [Recompute in the slot model]).
// Bytes are expressed in MB (1e6) and times in microseconds inside the program, to keep GLPK's
// coefficients near 1.
#include "teraio/exact.h"

#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan_check.h"
#include "teraio/planner.h"
#include "teraio/units.h"

namespace teraio {
namespace {

constexpr double kMB = 1e6;
// Tie-break toward moving fewer bytes: objective weight per MB moved. A plan moves at most a few
// 1e5 MB on the instances this solver is meant for, so the whole term stays below 1e-3 us.
constexpr double kPenaltyPerMB = 1e-9;

// An inactive period as the program sees it: distances 1..len-1 from `start` are its kernels.
// One-way (no next use): the absence runs to len-1 and nothing is read back; idle (a persistent
// tensor no kernel uses; start 0, len N + 1): absent at every kernel and nothing moves in steady
// state, as in the greedy planner (docs/planner.md, "Tensors no kernel uses again").
struct Gap {
  TensorId tensor;
  uint64_t bytes;
  uint32_t start;
  uint32_t end;
  uint32_t len;
  bool one_way = false;
  bool idle = false;
  int recompute = 0;         // column of "recomputed over the whole gap" (binary), 0 = not offered
  double recompute_us = 0;   // its recompute's time (recompute_time_us)
};

// Note [Recompute in the slot model]
// A gap between two uses of a recomputable tensor gets a binary R: absent at every kernel of the
// gap, at most one of R and the gap's tier candidates, R x the producer's time in the objective,
// and that time added to the capacity of every link's stall slot before the gap's end kernel (the
// simulator runs it there while the links keep going: so the model stays a relaxation). The
// producer's inputs are read before the end kernel d (docs/formats.md): for each input's gap G
// around d and each of its tier candidates, R = 1 forbids absence at d (U[j] - E[j-1] + R <= 1)
// and, when the absence began before d, prefetch bytes in slots after d (the prefetch is due by
// d); an input recomputed over G conflicts with R. One absence per gap and whole-gap recomputes:
// chains (a recompute point moved earlier for a consumer) and a second absence after a read are
// not modelled, so a plan using them has no completion (model_stall_us refuses it).

// Columns of one (gap, tier) candidate. U[j] (j = 1..len-1): absence has begun by distance j;
// E[j]: absence has ended by distance j (j is at or after its last kernel). Both are binary step
// functions; U[len-1] == E[len-1] says whether the period is offloaded to this tier at all. A
// one-way candidate has no E (absence never ends: all 0) and no prefetch columns; an idle one has a
// single binary and no transfer columns.
// wc/ws: offload MB in the kernel / stall slot at distance j; rc/rs: the same for the prefetch.
struct Cand {
  uint32_t gap;
  uint32_t tier;
  std::vector<int> U, E, wc, ws, rc, rs;  // column numbers (1-based), 0 = absent
};

struct GlpDeleter {
  void operator()(glp_prob* p) const { glp_delete_prob(p); }
};
using GlpProb = std::unique_ptr<glp_prob, GlpDeleter>;

// GLPK prints some messages (e.g. from its basis construction) whatever msg_lev says; the library
// never prints, so terminal output is off while a solver object is alive.
struct GlpQuiet {
  GlpQuiet() : previous(glp_term_out(GLP_OFF)) {}
  ~GlpQuiet() { glp_term_out(previous); }
  GlpQuiet(const GlpQuiet&) = delete;
  GlpQuiet& operator=(const GlpQuiet&) = delete;
  int previous;
};

class Model {
 public:
  Model(const Trace& trace, uint64_t budget, const std::vector<TierSpec>& tiers);
  glp_prob* prob() { return prob_.get(); }
  const std::vector<Cand>& cands() const { return cands_; }
  const std::vector<Gap>& gaps() const { return gaps_; }
  size_t binaries() const { return binaries_; }
  bool has_recompute() const {
    return std::any_of(gaps_.begin(), gaps_.end(), [](const Gap& g) { return g.recompute != 0; });
  }
  double penalty_max() const { return penalty_max_; }
  uint32_t n() const { return n_; }
  // Column values of the best completion of `plan` (its windows fixed), or empty when the LP has
  // no solution. `stall_us` receives the model stall.
  std::vector<double> complete(const Plan& plan, double* stall_us) const;
  double stall_of(const std::vector<double>& x) const;  // x 1-based, as GLPK
  Plan extract(const std::vector<double>& x) const;

 private:
  const Trace& trace_;
  uint64_t budget_;
  std::vector<TierSpec> tiers_;
  uint32_t n_;
  GlpQuiet quiet_;  // before prob_: output stays off for the model's whole life
  GlpProb prob_;
  std::vector<Gap> gaps_;
  std::vector<Cand> cands_;
  std::vector<int> stall_col_;  // per kernel
  std::vector<uint32_t> gap_begin_;  // per tensor: its first gap in gaps_ (gaps are by tensor, start)
  // The gap of tensor t with kernel k strictly inside it and the distance of k, or -1.
  int64_t gap_containing(TensorId t, uint32_t k, uint32_t* distance) const {
    for (uint32_t gi = gap_begin_[t]; gi < gap_begin_[t + 1]; ++gi) {
      const Gap& g = gaps_[gi];
      const uint32_t x = (k + n_ - g.start) % n_;
      if (!g.idle && x >= 1 && x < g.len) {
        *distance = x;
        return gi;
      }
    }
    return -1;
  }
  size_t binaries_ = 0;
  double penalty_max_ = 0;

  // Sparse matrix under construction.
  std::vector<int> ia_{0}, ja_{0};
  std::vector<double> ar_{0};
  int add_col(double lo, double hi, double cost, bool binary);
  int add_row(int type, double lo, double hi);
  void put(int row, int col, double v) {
    if (col == 0 || v == 0) return;
    ia_.push_back(row);
    ja_.push_back(col);
    ar_.push_back(v);
  }
};

int Model::add_col(double lo, double hi, double cost, bool binary) {
  const int c = glp_add_cols(prob_.get(), 1);
  if (binary) {
    glp_set_col_kind(prob_.get(), c, GLP_BV);
    ++binaries_;
  } else {
    glp_set_col_bnds(prob_.get(), c, hi == std::numeric_limits<double>::infinity() ? GLP_LO : GLP_DB, lo, hi);
  }
  glp_set_obj_coef(prob_.get(), c, cost);
  return c;
}

int Model::add_row(int type, double lo, double hi) {
  const int r = glp_add_rows(prob_.get(), 1);
  glp_set_row_bnds(prob_.get(), r, type, lo, hi);
  return r;
}

Model::Model(const Trace& trace, uint64_t budget, const std::vector<TierSpec>& tiers)
    : trace_(trace), budget_(budget), tiers_(tiers), n_(static_cast<uint32_t>(trace.num_kernels())),
      prob_(glp_create_prob()) {
  const double inf = std::numeric_limits<double>::infinity();
  glp_set_obj_dir(prob_.get(), GLP_MIN);
  const Lifetimes lifetimes(trace);
  for (const InactivePeriod& p : inactive_periods(trace, lifetimes)) {
    if (p.bytes == 0) continue;
    if (p.no_next_use && p.wraps) {
      gaps_.push_back(Gap{p.tensor, p.bytes, 0, 0, n_ + 1, true, true});
    } else if (p.no_next_use) {
      gaps_.push_back(Gap{p.tensor, p.bytes, p.start, (p.end + 1) % n_, p.end + 1 - p.start, true});
    } else {
      const uint32_t len = p.end > p.start ? p.end - p.start : p.end + n_ - p.start;
      if (len >= 2) gaps_.push_back(Gap{p.tensor, p.bytes, p.start, p.end, len});
    }
  }
  const std::vector<uint64_t> curve = memory_curve(trace, lifetimes);
  const std::span<const double> tau = trace.kernel_times_us();
  auto at = [&](const Gap& g, uint32_t j) { return (g.start + j) % n_; };
  gap_begin_.assign(trace.num_tensors() + 1, 0);
  for (const Gap& g : gaps_) ++gap_begin_[g.tensor + 1];
  for (size_t t = 0; t < trace.num_tensors(); ++t) gap_begin_[t + 1] += gap_begin_[t];

  stall_col_.resize(n_);
  for (uint32_t k = 0; k < n_; ++k) stall_col_[k] = add_col(0, inf, 1.0, false);

  // Rows shared by all candidates, filled as candidates are added.
  std::vector<int> mem_row(n_, 0);
  for (uint32_t k = 0; k < n_; ++k) {
    if (curve[k] > budget_) {
      mem_row[k] = add_row(GLP_LO, static_cast<double>(curve[k] - budget_) / kMB, 0);
    }
  }
  const size_t nt = tiers_.size();
  std::vector<int> wc_row(nt * n_), ws_row(nt * n_), rc_row(nt * n_), rs_row(nt * n_), cap_row(nt * n_);
  for (size_t t = 0; t < nt; ++t) {
    const double wmb = tiers_[t].write_gbps * 1e3 / kMB;  // MB per us
    const double rmb = tiers_[t].read_gbps * 1e3 / kMB;
    for (uint32_t k = 0; k < n_; ++k) {
      const size_t i = t * n_ + k;
      wc_row[i] = add_row(GLP_UP, 0, wmb * tau[k]);
      rc_row[i] = add_row(GLP_UP, 0, rmb * tau[k]);
      ws_row[i] = add_row(GLP_UP, 0, 0);
      put(ws_row[i], stall_col_[k], -wmb);
      rs_row[i] = add_row(GLP_UP, 0, 0);
      put(rs_row[i], stall_col_[k], -rmb);
      cap_row[i] = add_row(GLP_UP, 0, static_cast<double>(tiers_[t].capacity_bytes) / kMB);
    }
  }

  for (uint32_t gi = 0; gi < gaps_.size(); ++gi) {
    const Gap& g = gaps_[gi];
    const double b = static_cast<double>(g.bytes) / kMB;
    const uint32_t last = g.len - 1;
    const int one_tier = add_row(GLP_UP, 0, 1);
    const TensorInfo& info = trace.tensors[g.tensor];
    if (info.recomputable && !g.one_way && g.start + g.len < n_ && g.len >= 2) {
      bool any_over = false, inputs_alive = true;
      for (uint32_t j = 1; j <= last; ++j) any_over |= mem_row[at(g, j)] != 0;
      for (TensorId i : recompute_reads(trace, lifetimes, g.tensor)) {
        inputs_alive &= trace.tensors[i].persistent ||
                        (lifetimes.first_use(i) <= g.end && g.end <= lifetimes.alive_until(i));
      }
      if (any_over && inputs_alive) {
        Gap& gm = gaps_[gi];
        gm.recompute_us = recompute_time_us(trace, g.tensor);
        gm.recompute = add_col(0, 1, gm.recompute_us, true);
        put(one_tier, gm.recompute, 1);
        for (uint32_t j = 1; j <= last; ++j) {
          if (mem_row[at(g, j)]) put(mem_row[at(g, j)], gm.recompute, b);
        }
        for (size_t t = 0; t < nt; ++t) {  // its time carries transfers like a stall
          put(ws_row[t * n_ + g.end], gm.recompute, -tiers_[t].write_gbps * 1e3 / kMB * gm.recompute_us);
          put(rs_row[t * n_ + g.end], gm.recompute, -tiers_[t].read_gbps * 1e3 / kMB * gm.recompute_us);
        }
      }
    }
    for (uint32_t t = 0; t < nt; ++t) {
      if (g.bytes > tiers_[t].capacity_bytes) continue;
      const double wmb = tiers_[t].write_gbps * 1e3 / kMB;
      const double rmb = tiers_[t].read_gbps * 1e3 / kMB;
      Cand c;
      c.gap = gi;
      c.tier = t;
      c.U.assign(g.len, 0);
      c.E.assign(g.len, 0);
      c.wc.assign(g.len + 1, 0);
      c.ws.assign(g.len + 1, 0);
      c.rc.assign(g.len + 1, 0);
      c.rs.assign(g.len + 1, 0);
      // Absence begins and ends, without loss, at kernels over the budget: moving its first
      // kernel later or its last earlier past a kernel within the budget keeps memory feasible and
      // only widens the transfer windows. So U and E change value only at those kernels; elsewhere
      // they repeat the previous column (0 = the constant zero before the first one).
      // An idle candidate has one binary: absent everywhere or not at all.
      bool any = false;
      for (uint32_t j = 1; j <= last; ++j) {
        if (mem_row[at(g, j)] && !(g.idle && any)) {
          c.U[j] = add_col(0, 1, 0, true);
          c.E[j] = g.one_way ? 0 : add_col(0, 1, 0, true);
          any = true;
        } else {
          c.U[j] = c.U[j - 1];
          c.E[j] = c.E[j - 1];
        }
      }
      if (!any) continue;  // absent only where memory is within the budget: never useful
      glp_set_obj_coef(prob_.get(), c.U[last], kPenaltyPerMB * b);
      penalty_max_ += kPenaltyPerMB * b;
      put(one_tier, c.U[last], 1);
      // Step functions (non-decreasing), the absence non-empty (E[j] <= U[j]), same totals.
      for (uint32_t j = 1; j <= last; ++j) {
        if (c.U[j] == c.U[j - 1]) continue;
        if (c.U[j - 1] != 0) {
          int r = add_row(GLP_UP, 0, 0);  // U[j-1] - U[j] <= 0
          put(r, c.U[j - 1], 1);
          put(r, c.U[j], -1);
          r = add_row(GLP_UP, 0, 0);
          put(r, c.E[j - 1], 1);
          put(r, c.E[j], -1);
        }
        if (g.one_way) continue;
        const int r = add_row(GLP_UP, 0, 0);  // E[j] - U[j] <= 0
        put(r, c.E[j], 1);
        put(r, c.U[j], -1);
      }
      if (!g.one_way) {
        const int r = add_row(GLP_FX, 0, 0);
        put(r, c.U[last], 1);
        put(r, c.E[last], -1);
      }
      // Absent at distance j: U[j] - E[j-1].
      for (uint32_t j = 1; j <= last; ++j) {
        const uint32_t k = at(g, j);
        if (mem_row[k]) {
          put(mem_row[k], c.U[j], b);
          if (j > 1) put(mem_row[k], c.E[j - 1], -b);
        }
        put(cap_row[t * n_ + k], c.U[last], b);
      }
      if (g.idle) {  // moves nothing in steady state: no transfer columns
        cands_.push_back(std::move(c));
        continue;
      }
      // Offload: kernel slot j allowed while j < first absent (U[j] == 0), stall slot j while
      // j <= first absent (U[j-1] == 0). Prefetch: both allowed once E[j-1] == 1.
      const int off_sum = add_row(GLP_FX, 0, 0);
      const int pre_sum = g.one_way ? 0 : add_row(GLP_FX, 0, 0);
      put(off_sum, c.U[last], -b);
      if (pre_sum) put(pre_sum, c.U[last], -b);
      for (uint32_t j = 1; j <= g.len; ++j) {
        const uint32_t k = at(g, j);
        if (j <= last - 1) {  // offload kernel slot
          const double cap = std::min(b, wmb * tau[k]);
          if (cap > 0) {
            c.wc[j] = add_col(0, cap, 0, false);
            put(off_sum, c.wc[j], 1);
            put(wc_row[t * n_ + k], c.wc[j], 1);
            const int r = add_row(GLP_UP, 0, 0);  // wc[j] <= cap * (U[last] - U[j])
            put(r, c.wc[j], 1);
            put(r, c.U[last], -cap);
            put(r, c.U[j], cap);
          }
        }
        if (j <= last) {  // offload stall slot
          c.ws[j] = add_col(0, b, 0, false);
          put(off_sum, c.ws[j], 1);
          put(ws_row[t * n_ + k], c.ws[j], 1);
          const int r = add_row(GLP_UP, 0, 0);  // ws[j] <= b * (U[last] - U[j-1])
          put(r, c.ws[j], 1);
          put(r, c.U[last], -b);
          if (j > 1) put(r, c.U[j - 1], b);
        }
        if (j >= 2 && !g.one_way) {
          if (j <= last) {  // prefetch kernel slot
            const double cap = std::min(b, rmb * tau[k]);
            if (cap > 0) {
              c.rc[j] = add_col(0, cap, 0, false);
              put(pre_sum, c.rc[j], 1);
              put(rc_row[t * n_ + k], c.rc[j], 1);
              const int r = add_row(GLP_UP, 0, 0);  // rc[j] <= cap * E[j-1]
              put(r, c.rc[j], 1);
              put(r, c.E[j - 1], -cap);
            }
          }
          c.rs[j] = add_col(0, b, 0, false);  // prefetch stall slot
          put(pre_sum, c.rs[j], 1);
          put(rs_row[t * n_ + k], c.rs[j], 1);
          const int r = add_row(GLP_UP, 0, 0);
          put(r, c.rs[j], 1);
          put(r, c.E[j - 1], -b);
        }
      }
      // Cumulative forms of the same rules, which tighten the relaxation: once absence has begun
      // by distance j, all bytes are written in the slots up to j; while it has not ended by j,
      // all bytes are read in the slots after j.
      for (uint32_t j = 1; j <= last; ++j) {
        int r = add_row(GLP_LO, 0, 0);  // sum_{i<=j} ws[i] + sum_{i<j} wc[i] - b U[j] >= 0
        put(r, c.U[j], -b);
        for (uint32_t i = 1; i <= j; ++i) put(r, c.ws[i], 1);
        for (uint32_t i = 1; i < j; ++i) put(r, c.wc[i], 1);
        if (g.one_way) continue;
        r = add_row(GLP_LO, 0, 0);  // sum_{i>j} (rs[i] + rc[i]) - b (U[last] - E[j]) >= 0
        put(r, c.U[last], -b);
        put(r, c.E[j], b);
        for (uint32_t i = j + 1; i <= g.len; ++i) {
          put(r, c.rs[i], 1);
          put(r, c.rc[i], 1);
        }
      }
      cands_.push_back(std::move(c));
    }
  }
  // Inputs of each recompute resident before its end kernel (Note [Recompute in the slot model]).
  std::vector<std::vector<uint32_t>> cands_of(gaps_.size());
  for (uint32_t ci = 0; ci < cands_.size(); ++ci) cands_of[cands_[ci].gap].push_back(ci);
  for (const Gap& g : gaps_) {
    if (!g.recompute) continue;
    for (TensorId i : recompute_reads(trace, lifetimes, g.tensor)) {
      uint32_t jd = 0;
      const int64_t gi = gap_containing(i, g.end, &jd);
      if (gi < 0) continue;
      const Gap& G = gaps_[static_cast<size_t>(gi)];
      const double bi = static_cast<double>(G.bytes) / kMB;
      if (G.recompute) {
        const int r = add_row(GLP_UP, 0, 1);
        put(r, G.recompute, 1);
        put(r, g.recompute, 1);
      }
      for (uint32_t ci : cands_of[static_cast<size_t>(gi)]) {
        const Cand& c = cands_[ci];
        int r = add_row(GLP_UP, 0, 1);  // not absent at d
        put(r, c.U[jd], 1);
        if (jd > 1) put(r, c.E[jd - 1], -1);
        put(r, g.recompute, 1);
        // Absence after d: the offload starts after the read, so it writes only after d.
        r = add_row(GLP_UP, 0, bi);
        for (uint32_t j = 1; j <= jd; ++j) {
          put(r, c.wc[j], 1);
          put(r, c.ws[j], 1);
        }
        put(r, g.recompute, bi);
        put(r, c.U[jd], -bi);
        if (G.one_way || G.idle) continue;
        r = add_row(GLP_UP, 0, 2 * bi);  // absence begun before d: prefetched by d
        for (uint32_t j = jd; j <= G.len; ++j) {
          if (j < G.len) put(r, c.rc[j], 1);
          if (j > jd) put(r, c.rs[j], 1);
        }
        put(r, g.recompute, bi);
        put(r, c.U[jd], bi);
      }
    }
  }
  // Aliased columns can repeat an entry of a row: merge them (GLPK rejects duplicates).
  std::vector<size_t> order(ia_.size() - 1);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i + 1;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ia_[a] != ia_[b] ? ia_[a] < ia_[b] : ja_[a] < ja_[b];
  });
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0};
  for (size_t i : order) {
    if (ia.size() > 1 && ia.back() == ia_[i] && ja.back() == ja_[i]) {
      ar.back() += ar_[i];
    } else {
      ia.push_back(ia_[i]);
      ja.push_back(ja_[i]);
      ar.push_back(ar_[i]);
    }
  }
  size_t w = 1;
  for (size_t i = 1; i < ia.size(); ++i) {
    if (ar[i] == 0) continue;
    ia[w] = ia[i];
    ja[w] = ja[i];
    ar[w] = ar[i];
    ++w;
  }
  glp_load_matrix(prob_.get(), static_cast<int>(w - 1), ia.data(), ja.data(), ar.data());
  ia_ = {};
  ja_ = {};
  ar_ = {};
}

double Model::stall_of(const std::vector<double>& x) const {
  double s = 0;
  for (int c : stall_col_) s += x[static_cast<size_t>(c)];
  for (const Gap& g : gaps_) {
    if (g.recompute) s += g.recompute_us * std::round(x[static_cast<size_t>(g.recompute)]);
  }
  return s;
}

std::vector<double> Model::complete(const Plan& plan, double* stall_us) const {
  const Lifetimes lifetimes(trace_);
  const PlanCheck check = check_plan(trace_, lifetimes, plan, 3);
  TERAIO_CHECK(check.valid, "exact: the plan is not valid for the trace: {}",
               check.errors.empty() ? "" : check.errors.front());
  // Fix every binary: a chosen (gap, tier) gets its window, all others stay at zero.
  std::map<TensorId, uint32_t> one_way_gap;  // a tensor has at most one period no use ends
  for (uint32_t gi = 0; gi < gaps_.size(); ++gi) {
    if (gaps_[gi].one_way) one_way_gap[gaps_[gi].tensor] = gi;
  }
  // Recomputes: each must be a whole gap the program offers one for (no chains).
  std::vector<char> recomputed(gaps_.size(), 0);
  for (const RecomputeMove& r : check.recomputes) {
    uint32_t x = 0;
    const int64_t gi = gap_containing(r.tensor, r.start + 1, &x);
    if (gi < 0) return {};
    const Gap& g = gaps_[static_cast<size_t>(gi)];
    if (!g.recompute || g.start != r.start || g.end != r.deadline) return {};
    recomputed[static_cast<size_t>(gi)] = 1;
  }
  std::map<std::pair<uint32_t, uint32_t>, std::pair<uint32_t, uint32_t>> window;  // (gap, tier) -> (p, q)
  for (const MovePair& pr : check.pairs) {
    uint32_t gi = 0;
    if (pr.one_way()) {
      auto it = one_way_gap.find(pr.tensor);
      TERAIO_INTERNAL_ASSERT(it != one_way_gap.end(),
                             "exact: offload of tensor {} matches no inactive period", pr.tensor);
      gi = it->second;
    } else {  // the gap its offload starts; its prefetch may be due earlier, at a recompute's read
      uint32_t x = 0;
      const int64_t found = gap_containing(pr.tensor, (pr.start + 1) % n_, &x);
      if (found < 0) continue;  // no kernel strictly inside: absent nowhere
      gi = static_cast<uint32_t>(found);
    }
    const Gap& g = gaps_[gi];
    if (g.idle) {
      window[{gi, pr.tier}] = {1, g.len - 1};
      continue;
    }
    for (uint32_t t = 0; t < tiers_.size(); ++t) {
      if (window.count({gi, t})) return {};  // two absences in one gap (split by a read): not modelled
    }
    const uint32_t shift = (pr.start + n_ - g.start) % n_;
    const uint32_t p = shift + pr.offload_done + 1;
    const uint32_t q = g.one_way ? g.len - 1 : shift + pr.prefetch_begin - 1;
    window[{gi, pr.tier}] = {p, q};
  }
  GlpQuiet quiet;
  GlpProb lp(glp_create_prob());
  glp_copy_prob(lp.get(), prob_.get(), GLP_OFF);
  for (size_t gi = 0; gi < gaps_.size(); ++gi) {
    if (!gaps_[gi].recompute) continue;
    const double v = recomputed[gi] ? 1.0 : 0.0;
    glp_set_col_kind(lp.get(), gaps_[gi].recompute, GLP_CV);
    glp_set_col_bnds(lp.get(), gaps_[gi].recompute, GLP_FX, v, v);
  }
  for (const Cand& c : cands_) {
    const Gap& g = gaps_[c.gap];
    auto it = window.find({c.gap, c.tier});
    // The window narrowed to its kernels over the budget (see the constructor); a window with
    // none of them frees no memory that matters and is left out.
    uint32_t p = g.len, q = 0;
    if (it != window.end()) {
      for (uint32_t j = it->second.first; j <= std::min(it->second.second, g.len - 1); ++j) {
        if (c.U[j] != c.U[j - 1]) {
          p = std::min(p, j);
          q = j;
        }
      }
    }
    for (uint32_t j = 1; j < g.len; ++j) {
      if (c.U[j] == c.U[j - 1]) continue;  // an alias: fixed where its column first appears
      const double u = p <= q && j >= p ? 1.0 : 0.0;
      const double e = p <= q && j >= q ? 1.0 : 0.0;
      glp_set_col_kind(lp.get(), c.U[j], GLP_CV);
      glp_set_col_bnds(lp.get(), c.U[j], GLP_FX, u, u);
      if (c.E[j] == 0) continue;  // one-way: the absence never ends
      glp_set_col_kind(lp.get(), c.E[j], GLP_CV);
      glp_set_col_bnds(lp.get(), c.E[j], GLP_FX, e, e);
    }
  }
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.presolve = GLP_ON;
  const int rc = glp_simplex(lp.get(), &parm);
  if (rc != 0 || glp_get_status(lp.get()) != GLP_OPT) return {};
  std::vector<double> x(static_cast<size_t>(glp_get_num_cols(lp.get())) + 1, 0);
  for (size_t c = 1; c < x.size(); ++c) x[c] = glp_get_col_prim(lp.get(), static_cast<int>(c));
  // Binaries exactly, for the branch and bound's feasibility check.
  for (const Gap& g : gaps_) {
    if (g.recompute) x[static_cast<size_t>(g.recompute)] = std::round(x[static_cast<size_t>(g.recompute)]);
  }
  for (const Cand& c : cands_) {
    for (uint32_t j = 1; j < gaps_[c.gap].len; ++j) {
      if (c.U[j] == 0) continue;
      x[static_cast<size_t>(c.U[j])] = std::round(x[static_cast<size_t>(c.U[j])]);
      if (c.E[j] != 0) x[static_cast<size_t>(c.E[j])] = std::round(x[static_cast<size_t>(c.E[j])]);
    }
  }
  if (stall_us) *stall_us = stall_of(x);
  return x;
}

Plan Model::extract(const std::vector<double>& x) const {
  Plan plan;
  plan.budget_bytes = budget_;
  plan.tiers = tiers_;
  const Lifetimes lifetimes(trace_);
  std::vector<std::vector<uint32_t>> reads(gaps_.size());  // per gap: distances of recompute reads
  for (const Gap& g : gaps_) {
    if (!g.recompute || x[static_cast<size_t>(g.recompute)] < 0.5) continue;
    plan.moves.push_back(Move{g.tensor, MoveOp::recompute, 0, g.start, g.end});
    for (TensorId i : recompute_reads(trace_, lifetimes, g.tensor)) {
      uint32_t jd = 0;
      const int64_t gi = gap_containing(i, g.end, &jd);
      if (gi >= 0) reads[static_cast<size_t>(gi)].push_back(jd);
    }
  }
  for (const Cand& c : cands_) {
    const Gap& g = gaps_[c.gap];
    const uint32_t last = g.len - 1;
    if (x[static_cast<size_t>(c.U[last])] < 0.5) continue;
    if (g.idle) {  // out for good; the deadline matters only where it is found on the device
      plan.moves.push_back(Move{g.tensor, MoveOp::offload, c.tier, g.start, g.start});
      continue;
    }
    auto val = [&](int col) { return col == 0 ? 0.0 : x[static_cast<size_t>(col)]; };
    uint32_t p = 1, q = g.one_way ? last : 1;
    while (p < last && val(c.U[p]) < 0.5) ++p;
    while (q < last && val(c.E[q]) < 0.5) ++q;
    if (q < p) continue;  // empty absence: frees nothing
    const uint32_t done = p - 1, begin = q + 1;
    // A recompute's read inside the gap is a use (docs/formats.md): the offload starts at the last
    // read before the absence and the prefetch is due at the first read after it.
    uint32_t from = 0, due = g.len;
    for (uint32_t r : reads[c.gap]) {
      if (r < p) from = std::max(from, r);
      if (r > q) due = std::min(due, r);
    }
    plan.moves.push_back(Move{g.tensor, MoveOp::offload, c.tier, (g.start + from) % n_, (g.start + done) % n_});
    if (g.one_way) continue;
    plan.moves.push_back(Move{g.tensor, MoveOp::prefetch, c.tier, (g.start + begin) % n_, (g.start + due) % n_});
  }
  return plan;
}

// Starts each prefetch as early as the budget allows (keeping one kernel of absence), in order of
// prefetch start; the slot model's stall cannot grow (every window only widens).
void hoist(const Trace& trace, Plan* plan) {
  const Lifetimes lifetimes(trace);
  PlanCheck check = check_plan(trace, lifetimes, *plan, 1);
  if (!check.valid) return;
  const auto n = static_cast<uint32_t>(trace.num_kernels());
  std::vector<int64_t> res(check.resident_bytes.begin(), check.resident_bytes.end());
  const auto budget = static_cast<int64_t>(plan->budget_bytes);
  std::sort(check.pairs.begin(), check.pairs.end(), [&](const MovePair& a, const MovePair& b) {
    return (a.start + a.prefetch_begin) % n < (b.start + b.prefetch_begin) % n;
  });
  for (const MovePair& pr : check.pairs) {
    if (pr.one_way()) continue;  // no prefetch
    const auto bytes = static_cast<int64_t>(pr.bytes);
    uint32_t begin = pr.prefetch_begin;
    while (begin > pr.offload_done + 2 && res[(pr.start + begin - 1) % n] + bytes <= budget) {
      --begin;
      res[(pr.start + begin) % n] += bytes;
    }
    plan->moves[pr.prefetch_index].start = (pr.start + begin) % n;
  }
}

struct SearchState {
  const std::vector<double>* incumbent = nullptr;  // offered once at the first heuristic call
  bool offered = false;
  double bound = -std::numeric_limits<double>::infinity();
};

void callback(glp_tree* tree, void* info) {
  auto* st = static_cast<SearchState*>(info);
  const int best = glp_ios_best_node(tree);
  if (best != 0) st->bound = std::max(st->bound, glp_ios_node_bound(tree, best));
  if (glp_ios_reason(tree) == GLP_IHEUR && st->incumbent && !st->offered) {
    st->offered = true;
    glp_ios_heur_sol(tree, st->incumbent->data());
  }
}

void check_options(const Trace& trace, const ExactOptions& opts) {
  TERAIO_CHECK(!opts.tiers.empty(), "exact: at least one tier is required (--tier NAME:CAPACITY:READ:WRITE)");
  check_tier_names(opts.tiers, "exact");
  for (const TierSpec& t : opts.tiers) {
    TERAIO_CHECK(std::isfinite(t.read_gbps) && t.read_gbps > 0 && std::isfinite(t.write_gbps) && t.write_gbps > 0,
                 "exact: tier '{}' needs positive read and write bandwidth (got {} and {} GB/s)", t.name, t.read_gbps,
                 t.write_gbps);
  }
  TERAIO_CHECK(std::isfinite(opts.time_limit_s) && opts.time_limit_s > 0 && opts.time_limit_s <= 1e6,
               "exact: time limit must be in (0, 1e6] s, got {}", opts.time_limit_s);
  TERAIO_CHECK(opts.relative_gap >= 0 && opts.relative_gap < 1, "exact: relative gap must be in [0, 1), got {}",
               opts.relative_gap);
  check_kernels_fit(trace, opts.budget_bytes);
}

}  // namespace

ExactResult solve_exact(const Trace& trace, const ExactOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  trace.validate();
  check_options(trace, opts);
  ExactResult out;
  out.plan.budget_bytes = opts.budget_bytes;
  out.plan.tiers = opts.tiers;
  if (trace.num_kernels() == 0) {
    out.has_solution = out.optimal = true;
    return out;
  }
  Model model(trace, opts.budget_bytes, opts.tiers);
  glp_prob* prob = model.prob();
  out.columns = static_cast<size_t>(glp_get_num_cols(prob));
  out.rows = static_cast<size_t>(glp_get_num_rows(prob));
  out.binaries = model.binaries();

  std::vector<double> warm;
  if (opts.warm_start_greedy) {
    PlannerOptions popts;
    popts.budget_bytes = opts.budget_bytes;
    popts.tiers = opts.tiers;
    popts.min_tensor_bytes = 0;
    try {
      const Plan greedy = make_plan(trace, popts);
      double stall = 0;
      warm = model.complete(greedy, &stall);
      if (!warm.empty()) out.greedy_model_stall_us = stall;
    } catch (const Error&) {
      warm.clear();  // the greedy can refuse where the program is still feasible; solve cold
    }
  }

  const auto remaining_ms = [&] {
    const double used = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<int>(std::clamp((opts.time_limit_s - used) * 1e3, 1.0, 2e9));
  };
  glp_smcp sm;
  glp_init_smcp(&sm);
  sm.msg_lev = GLP_MSG_OFF;
  sm.tm_lim = remaining_ms();
  const int lp_rc = glp_simplex(prob, &sm);
  const int lp_status = glp_get_status(prob);
  TERAIO_CHECK(lp_rc == 0 || lp_rc == GLP_ETMLIM, "exact: GLPK's simplex failed (code {})", lp_rc);
  TERAIO_CHECK(lp_status != GLP_NOFEAS,
               "exact: no plan keeps every kernel within the budget of {} (tier capacity too small)",
               format_bytes(static_cast<double>(opts.budget_bytes)));

  SearchState st;
  st.incumbent = warm.empty() ? nullptr : &warm;
  int mip_rc = GLP_ETMLIM;
  if (lp_status == GLP_OPT) {
    st.bound = glp_get_obj_val(prob);
    glp_iocp ip;
    glp_init_iocp(&ip);
    ip.msg_lev = GLP_MSG_OFF;
    ip.tm_lim = remaining_ms();
    ip.mip_gap = opts.relative_gap;
    ip.cb_func = callback;
    ip.cb_info = &st;
    ip.mir_cuts = GLP_ON;
    // GLPK 5.0 aborted (spxprim.c, "teta_lim >= 0.0") re-solving after Gomory cuts on an instance
    // with recompute columns (study gap --recompute, seed 6); without them it solves.
    ip.gmi_cuts = model.has_recompute() ? GLP_OFF : GLP_ON;
    ip.br_tech = GLP_BR_PCH;
    ip.bt_tech = GLP_BT_BLB;
    mip_rc = glp_intopt(prob, &ip);
  }
  const int mip_status = glp_mip_status(prob);
  std::vector<double> x;
  if (mip_status == GLP_OPT || mip_status == GLP_FEAS) {
    x.resize(static_cast<size_t>(glp_get_num_cols(prob)) + 1);
    for (size_t c = 1; c < x.size(); ++c) x[c] = glp_mip_col_val(prob, static_cast<int>(c));
  } else if (!warm.empty()) {
    x = warm;
  }
  TERAIO_CHECK(mip_status != GLP_NOFEAS,
               "exact: no plan keeps every kernel within the budget of {} (tier capacity too small)",
               format_bytes(static_cast<double>(opts.budget_bytes)));
  if (!x.empty()) {
    out.has_solution = true;
    out.plan = model.extract(x);
    if (opts.hoist_prefetch) hoist(trace, &out.plan);
    std::stable_sort(out.plan.moves.begin(), out.plan.moves.end(), [](const Move& a, const Move& b) {
      if (a.start != b.start) return a.start < b.start;
      return a.op < b.op;
    });
    double stall = 0;
    const std::vector<double> check_x = model.complete(out.plan, &stall);
    TERAIO_INTERNAL_ASSERT(!check_x.empty(), "exact: the extracted plan has no slot-model completion");
    out.model_stall_us = stall;
  }
  const bool proved = mip_rc == 0 && mip_status == GLP_OPT;
  out.optimal = proved;
  // The bound is on stall + tie-break penalty; the penalty is below penalty_max().
  out.bound_stall_us = std::max(0.0, (proved ? glp_mip_obj_val(prob) : st.bound) - model.penalty_max());
  if (out.has_solution) out.bound_stall_us = std::min(out.bound_stall_us, out.model_stall_us);
  out.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

double model_stall_us(const Trace& trace, const Plan& plan) {
  trace.validate();
  Model model(trace, plan.budget_bytes, plan.tiers);
  double stall = 0;
  const std::vector<double> x = model.complete(plan, &stall);
  TERAIO_CHECK(!x.empty(),
               "exact: the plan has no completion in the slot model: it recomputes part of a gap (a chain) "
               "or offloads an input twice within one gap around a recompute's read, which the model does not "
               "cover (docs/planner.md, \"How good is the plan\")");
  return stall;
}

}  // namespace teraio
