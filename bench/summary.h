// Medians and spread of repeated timings, shared by the benchmark programs of this folder.
#pragma once

#include <algorithm>
#include <vector>

namespace teraio::bench {

struct Summary {
  double median = 0, min = 0, max = 0;
};

inline Summary summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

}  // namespace teraio::bench
