// Host cost of the CUDA runtime calls a planned step makes per transfer (docs/benchmarks.md, "What a
// transfer costs the host"): the host tier's submit_to_lane creates two timed events and, with a
// ready stream, a third it records and destroys, waits on it, records two, queues the copy; the
// lane's thread destroys them. On the H100, llama-3b in autocast at 1/2 makes about 660 transfers
// a step and the Session's callbacks cost 8.4 us for each of its 5,861 operators (session 49), so
// each microsecond a transfer costs is about 0.7 ms a step. Measured here per call, on the GPU machine's host, with the
// GPU idle and with the calls made as the tier makes them, events created afresh or taken from a
// pool. Build and run on the GPU machine (no PyTorch; its image has nvcc):
//   nvcc -O2 -std=c++20 bench/cuda_api_cost.cpp -o /tmp/cuda_api_cost && /tmp/cuda_api_cost [N]
// Prints one line per measurement: microseconds per call (median of 5 rounds of N calls, min, max).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs body(i) n times per round, 5 rounds (a synchronize between rounds, not timed); prints the
// microseconds per call.
void measure(const char* name, int n, const std::function<void(int)>& body, const std::function<void()>& after = {}) {
  std::vector<double> per;
  for (int round = 0; round < 5; ++round) {
    const double t0 = now_us();
    for (int i = 0; i < n; ++i) body(i);
    per.push_back((now_us() - t0) / n);
    if (after) after();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::sort(per.begin(), per.end());
  std::printf("%-58s %7.2f us/call [%.2f, %.2f]\n", name, per[2], per.front(), per.back());
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2000;
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t compute, lane;
  check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&lane, cudaStreamNonBlocking), "stream");
  const size_t bytes = 1 << 20;
  void* dev = nullptr;
  void* host = nullptr;
  check(cudaMalloc(&dev, bytes * 4), "cudaMalloc");
  check(cudaHostAlloc(&host, bytes * 4, cudaHostAllocDefault), "cudaHostAlloc");
  std::vector<cudaEvent_t> ev(n);

  measure("cudaEventCreate (timing)", n, [&](int i) { check(cudaEventCreate(&ev[i]), "create"); },
          [&] { for (auto e : ev) cudaEventDestroy(e); });
  measure("cudaEventCreate (timing disabled)", n,
          [&](int i) { check(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming), "create"); },
          [&] { for (auto e : ev) cudaEventDestroy(e); });
  for (auto& e : ev) check(cudaEventCreate(&e), "create");
  measure("cudaEventRecord (an idle stream)", n, [&](int i) { check(cudaEventRecord(ev[i], lane), "record"); });
  measure("cudaEventQuery (complete)", n, [&](int i) { (void)cudaEventQuery(ev[i]); });
  measure("cudaStreamWaitEvent", n, [&](int i) { check(cudaStreamWaitEvent(lane, ev[i], 0), "wait"); });
  measure("cudaEventDestroy (complete)", n, [&](int i) { check(cudaEventDestroy(ev[i]), "destroy"); });
  measure("cudaMemcpyAsync 1 MiB device to pinned host", n / 4, [&](int) {
    check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDefault, lane), "memcpy");
  });
  measure("cudaMemcpyAsync 1 MiB pinned host to device", n / 4, [&](int) {
    check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyDefault, lane), "memcpy");
  });

  // The host tier's sequence per transfer, events made afresh (as now) or reused from a pool.
  // The copies are small (64 KiB) so that the GPU keeps up and the calls do not wait for room in
  // the stream's queue; the destroys happen after, as the lane's thread does them.
  const size_t small = 64 << 10;
  std::vector<cudaEvent_t> done(n), start(n);
  measure("per transfer as submit_to_lane makes it (3 creates)", n,
          [&](int i) {
            cudaEvent_t ready;
            check(cudaEventCreate(&done[i]), "create");
            check(cudaEventCreate(&start[i]), "create");
            check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "create");
            check(cudaEventRecord(ready, compute), "record");
            check(cudaStreamWaitEvent(lane, ready, 0), "wait");
            check(cudaEventRecord(start[i], lane), "record");
            check(cudaMemcpyAsync(host, dev, small, cudaMemcpyDefault, lane), "memcpy");
            check(cudaEventRecord(done[i], lane), "record");
            check(cudaEventDestroy(ready), "destroy");
          },
          [&] {
            check(cudaStreamSynchronize(lane), "sync");
            for (int i = 0; i < n; ++i) {
              cudaEventDestroy(done[i]);
              cudaEventDestroy(start[i]);
            }
          });
  std::vector<cudaEvent_t> pool_timed(2 * n), pool_plain(n);
  for (auto& e : pool_timed) check(cudaEventCreate(&e), "create");
  for (auto& e : pool_plain) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "create");
  measure("per transfer with pooled events", n, [&](int i) {
    cudaEvent_t ready = pool_plain[i];
    check(cudaEventRecord(ready, compute), "record");
    check(cudaStreamWaitEvent(lane, ready, 0), "wait");
    check(cudaEventRecord(pool_timed[2 * i], lane), "record");
    check(cudaMemcpyAsync(host, dev, small, cudaMemcpyDefault, lane), "memcpy");
    check(cudaEventRecord(pool_timed[2 * i + 1], lane), "record");
  }, [&] { check(cudaStreamSynchronize(lane), "sync"); });
  measure("the same with no ready stream wait", n, [&](int i) {
    check(cudaEventRecord(pool_timed[2 * i], lane), "record");
    check(cudaMemcpyAsync(host, dev, small, cudaMemcpyDefault, lane), "memcpy");
    check(cudaEventRecord(pool_timed[2 * i + 1], lane), "record");
  }, [&] { check(cudaStreamSynchronize(lane), "sync"); });
  for (auto e : pool_timed) cudaEventDestroy(e);
  for (auto e : pool_plain) cudaEventDestroy(e);
  cudaFreeHost(host);
  cudaFree(dev);
  return 0;
}
