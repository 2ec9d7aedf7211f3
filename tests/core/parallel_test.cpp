// parallel_for (include/teraio/parallel.h): the plan search's variants are planned and simulated
// with it, so every index must run exactly once and a failure must reach the caller.
#include "teraio/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

namespace teraio {
namespace {

TEST(ParallelFor, RunsEveryIndexOnce) {
  for (unsigned threads : {1u, 2u, 7u, 64u}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}}) {
      std::vector<std::atomic<int>> calls(n);
      parallel_for(n, [&](size_t i) { calls[i].fetch_add(1); }, threads);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(calls[i].load(), 1) << "index " << i << " of " << n << ", threads " << threads;
    }
  }
}

TEST(ParallelFor, RethrowsTheSmallestFailingIndexAfterAllRan) {
  std::atomic<int> ran{0};
  try {
    parallel_for(100, [&](size_t i) {
      ran.fetch_add(1);
      if (i == 80 || i == 30) throw std::runtime_error("index " + std::to_string(i));
    }, 4);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "index 30");
  }
  EXPECT_EQ(ran.load(), 100);  // the others still ran
}

TEST(ParallelFor, DefaultThreadsIsAtLeastOne) {
  EXPECT_GE(default_threads(), 1u);
  EXPECT_LE(default_threads(), 16u);
}

}  // namespace
}  // namespace teraio
