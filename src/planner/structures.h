// Data structures that make the planner fast (docs/planner.md, "Complexity"): a Fenwick tree for
// prefix sums with "first prefix reaching X" search, a lazy segment tree for range-add/range-max
// over the memory curve that also reports kernels leaving the critical set, and per-kernel
// bandwidth slots of one link with next/previous non-full pointers. Internal to src/planner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace teraio::planner_detail {

// Prefix sums over n values with point updates; T is int64_t (bytes) or double (microseconds).
template <typename T>
class Fenwick {
 public:
  Fenwick() = default;
  explicit Fenwick(const std::vector<T>& values) : n_(values.size()), tree_(values.size() + 1, T{}) {
    for (size_t i = 0; i < n_; ++i) {
      tree_[i + 1] += values[i];
      const size_t parent = (i + 1) + ((i + 1) & (~(i + 1) + 1));
      if (parent <= n_) tree_[parent] += tree_[i + 1];
    }
    top_bit_ = 1;
    while (top_bit_ * 2 <= n_) top_bit_ *= 2;
  }
  void add(size_t i, T delta) {
    for (size_t x = i + 1; x <= n_; x += x & (~x + 1)) tree_[x] += delta;
  }
  // Sum of values [0, i).
  T prefix(size_t i) const {
    T s{};
    for (size_t x = i; x > 0; x -= x & (~x + 1)) s += tree_[x];
    return s;
  }
  T range(size_t begin, size_t end) const { return end > begin ? prefix(end) - prefix(begin) : T{}; }
  // Largest i in [0, n] with prefix(i) <= y (strict=false) or prefix(i) < y (strict=true).
  // Requires non-negative values (prefix sums non-decreasing).
  size_t last_prefix_at_most(T y, bool strict) const {
    size_t pos = 0;
    T acc{};
    for (size_t step = top_bit_; step > 0; step >>= 1) {
      const size_t next = pos + step;
      if (next <= n_) {
        const T v = acc + tree_[next];
        if (strict ? v < y : v <= y) {
          pos = next;
          acc = v;
        }
      }
    }
    return pos;
  }
  size_t size() const { return n_; }

 private:
  size_t n_ = 0;
  std::vector<T> tree_;
  size_t top_bit_ = 0;
};

// Range add / range max over n int64 values, plus a "critical" flag per leaf: a leaf is critical
// while its value exceeds `line`; range_add (negative deltas) reports each leaf that stops being
// critical exactly once. Values may later grow again (hoisting); flags are not restored.
class PressureTree {
 public:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

  PressureTree() = default;
  PressureTree(const std::vector<int64_t>& values, int64_t line);

  size_t size() const { return n_; }
  // Adds delta to [begin, end); calls on_uncritical(k) for each leaf whose value drops to <= line.
  template <typename F>
  void range_add(size_t begin, size_t end, int64_t delta, F&& on_uncritical) {
    if (begin < end) add_rec(1, 0, n_, begin, end, delta, on_uncritical);
  }
  void range_add(size_t begin, size_t end, int64_t delta) {
    range_add(begin, end, delta, [](size_t) {});
  }
  int64_t max(size_t begin, size_t end) const;  // -inf (min int64) for an empty range
  int64_t max_all() const { return n_ ? max_[1] : std::numeric_limits<int64_t>::min(); }
  size_t argmax_all() const;
  int64_t value(size_t k) const { return max(k, k + 1); }
  // Largest k in [begin, end) with value > x, or SIZE_MAX when none.
  size_t last_above(size_t begin, size_t end, int64_t x) const;
  // Smallest k in [begin, end) with value > x, or SIZE_MAX when none.
  size_t first_above(size_t begin, size_t end, int64_t x) const;

 private:
  size_t n_ = 0;
  int64_t line_ = 0;
  std::vector<int64_t> max_;
  std::vector<int64_t> crit_min_;  // min value over critical leaves, kNone when none
  std::vector<int64_t> lazy_;

  void build(size_t node, size_t lo, size_t hi, const std::vector<int64_t>& values);
  void apply(size_t node, int64_t delta) {
    max_[node] += delta;
    if (crit_min_[node] != kNone) crit_min_[node] += delta;
    lazy_[node] += delta;
  }
  void push(size_t node) {
    if (lazy_[node] != 0) {
      apply(2 * node, lazy_[node]);
      apply(2 * node + 1, lazy_[node]);
      lazy_[node] = 0;
    }
  }
  void pull(size_t node) {
    max_[node] = max_[2 * node] > max_[2 * node + 1] ? max_[2 * node] : max_[2 * node + 1];
    crit_min_[node] = crit_min_[2 * node] < crit_min_[2 * node + 1] ? crit_min_[2 * node] : crit_min_[2 * node + 1];
  }
  template <typename F>
  void add_rec(size_t node, size_t lo, size_t hi, size_t begin, size_t end, int64_t delta, F& cb) {
    if (end <= lo || hi <= begin) return;
    if (begin <= lo && hi <= end) {
      apply(node, delta);
      collect(node, lo, hi, cb);
      return;
    }
    push(node);
    const size_t mid = (lo + hi) / 2;
    add_rec(2 * node, lo, mid, begin, end, delta, cb);
    add_rec(2 * node + 1, mid, hi, begin, end, delta, cb);
    pull(node);
  }
  // Reports and unflags every critical leaf under `node` whose value is now <= line.
  template <typename F>
  void collect(size_t node, size_t lo, size_t hi, F& cb) {
    if (crit_min_[node] == kNone || crit_min_[node] > line_) return;
    if (hi - lo == 1) {
      crit_min_[node] = kNone;
      cb(lo);
      return;
    }
    push(node);
    const size_t mid = (lo + hi) / 2;
    collect(2 * node, lo, mid, cb);
    collect(2 * node + 1, mid, hi, cb);
    pull(node);
  }
  int64_t max_rec(size_t node, size_t lo, size_t hi, size_t begin, size_t end) const;
  size_t last_rec(size_t node, size_t lo, size_t hi, size_t begin, size_t end, int64_t x, int64_t carry) const;
  size_t first_rec(size_t node, size_t lo, size_t hi, size_t begin, size_t end, int64_t x, int64_t carry) const;
};

// The per-kernel bandwidth slots of one link (one direction of one tier): slot k can carry
// bandwidth x tau_k bytes. Free capacity lives in a Fenwick tree (searches in O(log n)); full slots
// are skipped by union-find pointers when reserving (each slot fills once: amortised O(alpha)).
class LinkSlots {
 public:
  LinkSlots() = default;
  LinkSlots(const std::vector<double>& time_us, double gbps);

  // Smallest L in [1, max_len] such that the free bytes of the L slots starting at `from`
  // (cyclically) reach `bytes`; 0 when none does.
  uint32_t forward_len(uint32_t from, uint32_t max_len, int64_t bytes) const;
  // Smallest L in [1, max_len] such that the free bytes of the L slots ending just before `end`
  // (cyclically: slots end-L .. end-1) reach `bytes`; 0 when none does.
  uint32_t backward_len(uint32_t end, uint32_t max_len, int64_t bytes) const;
  // Reserves up to `bytes` in the `len` slots starting at `from`, filling earliest first; returns
  // the bytes reserved.
  int64_t reserve_forward(uint32_t from, uint32_t len, int64_t bytes);
  // Reserves up to `bytes` in the `len` slots ending just before `end`, filling latest first.
  int64_t reserve_backward(uint32_t end, uint32_t len, int64_t bytes);
  int64_t free_bytes(uint32_t from, uint32_t len) const;
  double bytes_per_us() const { return bytes_per_us_; }

 private:
  uint32_t n_ = 0;
  double bytes_per_us_ = 0;
  std::vector<int64_t> free_;
  Fenwick<int64_t> fen_;
  std::vector<uint32_t> next_;  // next_[k]: candidate next non-full slot >= k (n_ = none)
  std::vector<uint32_t> prev_;  // prev_[k+1]: candidate previous non-full slot <= k, +1 (0 = none)

  uint32_t find_next(uint32_t k);
  uint32_t find_prev(uint32_t k_plus_1);
  int64_t take(uint32_t k, int64_t want);
};

}  // namespace teraio::planner_detail
