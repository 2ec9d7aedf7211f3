// GPU time per profiled operator, from CUPTI's activity records (no PyTorch headers here).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

namespace teraio {

// Note [Kernel times from CUPTI]: a profiled operator's time is what the GPU spent on it: the sum of
// the durations of the kernels, copies and memsets it launched, as CUPTI's activity API reports
// them. CUDA events around the operator measure more than that: when the CPU falls behind the GPU
// (in profiled steps it does, slowed by the recording and the reactive moves), the stream runs dry
// between the start event and the operator's first kernel, and that launch gap is counted as the
// operator's time. Summed over thousands of small operators the events gave a trace 1.8x longer
// than the real step (llama-1b in autocast on the H200, docs/benchmarks.md), and plans made for a
// slower GPU than the real one. The work is attributed through CUPTI's external correlation ids:
// enter(token) on the thread that runs the operator, leave() after it; every CUDA call made on that
// thread in between (also by operators nested in it) carries the token. teraio's own transfers are
// made outside enter/leave or on its worker threads, so they are not counted. CUPTI has one set of
// buffer callbacks per process: while another profiler (torch.profiler, Nsight Systems) holds them,
// start() says so and the Session times operators with events, as before.
class KernelTimer {
 public:
  // Begins collecting. Null, with the reason in *why, when CUPTI is not there (a CPU build, no
  // libcupti) or not free (another profiler, or another KernelTimer in this process).
  static std::unique_ptr<KernelTimer> start(std::string* why);
  ~KernelTimer();
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

  // The CUDA work this thread launches from now until leave() belongs to `token` (nonzero).
  void enter(uint64_t token);
  void leave();

  // Stops collecting and returns the GPU microseconds per token. Call after the device has
  // finished the work (the caller synchronizes). Empty, with the reason in *why, when records were
  // dropped or CUPTI failed: the caller falls back to its events.
  std::optional<std::unordered_map<uint64_t, double>> finish(std::string* why);

 private:
  KernelTimer() = default;
  bool finished_ = false;
};

}  // namespace teraio
