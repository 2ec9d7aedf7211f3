// A small random trace generator for planner tests and the planner benchmark: tensors of random
// sizes (some persistent), kernels touching 1-4 random tensors, log-uniform kernel times.
// Deterministic per seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "teraio/trace.h"

namespace teraio::testing {

struct RandomTraceShape {
  uint32_t kernels = 200;
  uint32_t tensors = 40;
  double persistent_fraction = 0.3;
  double min_bytes = 4096;
  double max_bytes = 256.0 * 1024 * 1024;
  double min_time_us = 5;
  double max_time_us = 5000;
};

inline Trace random_trace(uint64_t seed, const RandomTraceShape& shape = {}) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto log_uniform = [&](double lo, double hi) { return std::exp(std::log(lo) + unit(rng) * std::log(hi / lo)); };
  Trace trace;
  for (uint32_t t = 0; t < shape.tensors; ++t) {
    TensorInfo info;
    info.bytes = static_cast<uint64_t>(log_uniform(shape.min_bytes, shape.max_bytes));
    info.persistent = unit(rng) < shape.persistent_fraction;
    info.kind = info.persistent ? TensorKind::parameter : TensorKind::activation;
    info.name = "t" + std::to_string(t);
    trace.add_tensor(info);
  }
  std::uniform_int_distribution<uint32_t> pick(0, shape.tensors - 1);
  std::uniform_int_distribution<int> count(1, 4);
  std::vector<TensorId> ids;
  for (uint32_t k = 0; k < shape.kernels; ++k) {
    ids.clear();
    const int c = count(rng);
    for (int i = 0; i < c; ++i) ids.push_back(pick(rng));
    // Every tensor is used at least once (a tensor never used cannot be moved).
    const auto spread = static_cast<uint64_t>(k) * shape.tensors / shape.kernels;
    const auto next = static_cast<uint64_t>(k + 1) * shape.tensors / shape.kernels;
    for (uint64_t t = spread; t < next; ++t) ids.push_back(static_cast<TensorId>(t));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    trace.add_kernel(k % 3 == 0 ? "aten::mm" : "aten::add", log_uniform(shape.min_time_us, shape.max_time_us), ids);
  }
  return trace;
}

}  // namespace teraio::testing
