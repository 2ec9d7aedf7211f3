// A parallel loop for independent work items (the plan search's variants: docs/planner.md,
// `--search`). Internal to teraio's libraries; not part of the public API.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace teraio {

// Threads parallel_for uses by default: the machine's hardware threads, at most kMaxThreads (each
// plan-search worker holds a planner's or a simulator's state for one variant at a time).
inline unsigned default_threads() {
  constexpr unsigned kMaxThreads = 16;
  return std::clamp(std::thread::hardware_concurrency(), 1u, kMaxThreads);
}

// Calls f(i) once for every i in [0, n), on up to `threads` threads (the caller's among them), and
// returns when all calls have returned. Calls for distinct i may run concurrently. When calls throw,
// the exception of the smallest such i is rethrown after all calls have finished.
template <typename F>
void parallel_for(size_t n, F&& f, unsigned threads = default_threads()) {
  const size_t workers = std::min<size_t>(std::max(threads, 1u), n);
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(n);
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      try {
        f(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t w = 1; w < workers; ++w) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {  // no more threads to be had: those started do the work
      break;
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace teraio
