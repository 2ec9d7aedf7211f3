// Implementation of the planner's segment tree and bandwidth slots (structures.h).
#include "structures.h"

#include <algorithm>
#include <cmath>

namespace teraio::planner_detail {

PressureTree::PressureTree(const std::vector<int64_t>& values, int64_t line)
    : n_(values.size()), line_(line) {
  size_t cap = 1;
  while (cap < n_) cap *= 2;
  max_.assign(2 * cap, std::numeric_limits<int64_t>::min());
  crit_min_.assign(2 * cap, kNone);
  lazy_.assign(2 * cap, 0);
  if (n_ > 0) build(1, 0, n_, values);
}

void PressureTree::build(size_t node, size_t lo, size_t hi, const std::vector<int64_t>& values) {
  if (hi - lo == 1) {
    max_[node] = values[lo];
    crit_min_[node] = values[lo] > line_ ? values[lo] : kNone;
    return;
  }
  const size_t mid = (lo + hi) / 2;
  build(2 * node, lo, mid, values);
  build(2 * node + 1, mid, hi, values);
  pull(node);
}

int64_t PressureTree::max_rec(size_t node, size_t lo, size_t hi, size_t begin, size_t end) const {
  if (end <= lo || hi <= begin) return std::numeric_limits<int64_t>::min();
  if (begin <= lo && hi <= end) return max_[node];
  const size_t mid = (lo + hi) / 2;
  const int64_t a = max_rec(2 * node, lo, mid, begin, end);
  const int64_t b = max_rec(2 * node + 1, mid, hi, begin, end);
  const int64_t m = std::max(a, b);
  return m == std::numeric_limits<int64_t>::min() ? m : m + lazy_[node];
}

int64_t PressureTree::max(size_t begin, size_t end) const {
  if (begin >= end) return std::numeric_limits<int64_t>::min();
  return max_rec(1, 0, n_, begin, end);
}

size_t PressureTree::argmax_all() const {
  size_t node = 1, lo = 0, hi = n_;
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (max_[2 * node] >= max_[2 * node + 1]) {
      node = 2 * node;
      hi = mid;
    } else {
      node = 2 * node + 1;
      lo = mid;
    }
  }
  return lo;
}

// `carry` is the sum of the lazy tags of the ancestors (children's stored values omit them).
size_t PressureTree::last_rec(size_t node, size_t lo, size_t hi, size_t begin, size_t end, int64_t x,
                              int64_t carry) const {
  if (end <= lo || hi <= begin || max_[node] + carry <= x) return SIZE_MAX;
  if (hi - lo == 1) return lo;
  const size_t mid = (lo + hi) / 2;
  const int64_t c = carry + lazy_[node];
  const size_t r = last_rec(2 * node + 1, mid, hi, begin, end, x, c);
  if (r != SIZE_MAX) return r;
  return last_rec(2 * node, lo, mid, begin, end, x, c);
}

size_t PressureTree::first_rec(size_t node, size_t lo, size_t hi, size_t begin, size_t end, int64_t x,
                               int64_t carry) const {
  if (end <= lo || hi <= begin || max_[node] + carry <= x) return SIZE_MAX;
  if (hi - lo == 1) return lo;
  const size_t mid = (lo + hi) / 2;
  const int64_t c = carry + lazy_[node];
  const size_t r = first_rec(2 * node, lo, mid, begin, end, x, c);
  if (r != SIZE_MAX) return r;
  return first_rec(2 * node + 1, mid, hi, begin, end, x, c);
}

size_t PressureTree::last_above(size_t begin, size_t end, int64_t x) const {
  if (begin >= end) return SIZE_MAX;
  return last_rec(1, 0, n_, begin, end, x, 0);
}

size_t PressureTree::first_above(size_t begin, size_t end, int64_t x) const {
  if (begin >= end) return SIZE_MAX;
  return first_rec(1, 0, n_, begin, end, x, 0);
}

LinkSlots::LinkSlots(const std::vector<double>& time_us, double gbps)
    : n_(static_cast<uint32_t>(time_us.size())), bytes_per_us_(gbps * 1e3) {
  free_.resize(n_);
  for (uint32_t k = 0; k < n_; ++k) {
    free_[k] = static_cast<int64_t>(std::floor(bytes_per_us_ * time_us[k]));
  }
  fen_ = Fenwick<int64_t>(free_);
  next_.resize(n_ + 1);
  prev_.resize(n_ + 1);
  for (uint32_t k = 0; k <= n_; ++k) {
    next_[k] = (k < n_ && free_[k] == 0) ? k + 1 : k;
    prev_[k] = (k > 0 && free_[k - 1] == 0) ? k - 1 : k;
  }
}

namespace {
// Union-find root of k in `parent`, compressing the path on the way back.
uint32_t find_root(std::vector<uint32_t>& parent, uint32_t k) {
  uint32_t root = k;
  while (parent[root] != root) root = parent[root];
  while (parent[k] != root) {
    const uint32_t up = parent[k];
    parent[k] = root;
    k = up;
  }
  return root;
}
}  // namespace

uint32_t LinkSlots::find_next(uint32_t k) { return find_root(next_, k); }

uint32_t LinkSlots::find_prev(uint32_t k) { return find_root(prev_, k); }

int64_t LinkSlots::take(uint32_t k, int64_t want) {
  const int64_t got = std::min(want, free_[k]);
  free_[k] -= got;
  fen_.add(k, -got);
  if (free_[k] == 0) {
    next_[k] = k + 1;
    prev_[k + 1] = k;
  }
  return got;
}

int64_t LinkSlots::free_bytes(uint32_t from, uint32_t len) const {
  if (len == 0 || n_ == 0) return 0;
  if (from + len <= n_) return fen_.range(from, from + len);
  return fen_.range(from, n_) + fen_.prefix(from + len - n_);
}

uint32_t LinkSlots::forward_len(uint32_t from, uint32_t max_len, int64_t bytes) const {
  if (max_len == 0 || n_ == 0) return 0;
  if (bytes <= 0) return 1;
  const int64_t head = fen_.range(from, n_);
  uint64_t len;
  if (head >= bytes) {
    // Smallest i with prefix(i) >= prefix(from) + bytes.
    const size_t i = fen_.last_prefix_at_most(fen_.prefix(from) + bytes, true) + 1;
    len = i - from;
  } else {
    const int64_t rem = bytes - head;
    if (fen_.prefix(n_) - head < rem && max_len <= n_) return 0;  // even a full wrap is short
    const size_t i = fen_.last_prefix_at_most(rem, true) + 1;
    if (i > n_) return 0;
    len = (n_ - from) + i;
  }
  return len <= max_len ? static_cast<uint32_t>(len) : 0;
}

uint32_t LinkSlots::backward_len(uint32_t end, uint32_t max_len, int64_t bytes) const {
  if (max_len == 0 || n_ == 0) return 0;
  if (bytes <= 0) return 1;
  const int64_t head = fen_.prefix(end);
  uint64_t len;
  if (head >= bytes) {
    // Largest j with prefix(j) <= prefix(end) - bytes.
    const size_t j = fen_.last_prefix_at_most(head - bytes, false);
    len = end - j;
  } else {
    const int64_t rem = bytes - head;
    const int64_t total = fen_.prefix(n_);
    if (total - head < rem) return 0;
    const size_t j = fen_.last_prefix_at_most(total - rem, false);
    if (j < end) return 0;
    len = end + (n_ - j);
  }
  return len <= max_len ? static_cast<uint32_t>(len) : 0;
}

int64_t LinkSlots::reserve_forward(uint32_t from, uint32_t len, int64_t bytes) {
  int64_t got = 0;
  if (n_ == 0) return 0;
  uint64_t pos = from;  // unwrapped position, < from + len
  const uint64_t stop = static_cast<uint64_t>(from) + len;
  while (got < bytes && pos < stop) {
    const uint32_t base = static_cast<uint32_t>(pos % n_);
    const uint32_t k = find_next(base);
    if (k == n_) {  // nothing free up to the end: wrap
      pos += n_ - base;
      continue;
    }
    pos += k - base;
    if (pos >= stop) break;
    got += take(k, bytes - got);
    if (got < bytes) ++pos;
  }
  return got;
}

int64_t LinkSlots::reserve_backward(uint32_t end, uint32_t len, int64_t bytes) {
  int64_t got = 0;
  if (n_ == 0) return 0;
  // Unwrapped exclusive end position `pos`; slots pos-1 down to end-len.
  int64_t pos = end;
  const int64_t stop = static_cast<int64_t>(end) - static_cast<int64_t>(len);
  while (got < bytes && pos > stop) {
    const int64_t wrapped = ((pos % n_) + n_) % n_;
    const uint32_t base = wrapped == 0 ? n_ : static_cast<uint32_t>(wrapped);  // exclusive end in [1, n]
    const uint32_t kp1 = find_prev(base);                                      // last non-full slot + 1
    if (kp1 == 0) {
      pos -= base;
      continue;
    }
    pos -= base - kp1;  // now slot pos-1 is non-full
    if (pos <= stop) break;
    got += take(kp1 - 1, bytes - got);
    if (got < bytes) --pos;
  }
  return got;
}

}  // namespace teraio::planner_detail
