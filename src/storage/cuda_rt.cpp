// CUDA runtime calls of the storage tiers (see cuda_rt.h). Without TERAIO_HAVE_CUDA the functions
// compile to "CUDA is not available" so the host and file tiers still work on host buffers.
#include "cuda_rt.h"

#include <mutex>

#include "teraio/error.h"

#ifdef TERAIO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace teraio::storage::cuda {

#ifdef TERAIO_HAVE_CUDA
namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      r.reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
      (void)cudaGetLastError();
    } else if (n == 0) {
      r.reason = "no CUDA device present";
    } else {
      r.count = n;
    }
    return r;
  }();
  return p;
}

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) [[unlikely]] {
    (void)cudaGetLastError();
    throw teraio::Error(std::string(call) + " failed: " + cudaGetErrorString(e));
  }
}

}  // namespace

int device_count() noexcept { return probe().count; }
std::string unavailable_reason() { return probe().reason; }

void require_device(int device, const char* what) {
  TERAIO_CHECK(device_count() > 0, "{}: device buffers need a GPU ({})", what, unavailable_reason());
  TERAIO_CHECK(device >= 0 && device < device_count(), "{}: CUDA device {} does not exist ({} present)",
               what, device, device_count());
}

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

void* malloc_device(uint64_t size_bytes, int device) {
  require_device(device, "cudaMalloc");
  set_device(device);
  void* p = nullptr;
  check(cudaMalloc(&p, size_bytes), "cudaMalloc");
  return p;
}
void free_device(void* ptr, int device) noexcept {
  if (ptr == nullptr) return;
  (void)cudaSetDevice(device);
  (void)cudaFree(ptr);
}
void* host_alloc(uint64_t size_bytes) {
  TERAIO_CHECK(device_count() > 0, "cudaHostAlloc: {}", unavailable_reason());
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, size_bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw teraio::Error("cannot pin " + std::to_string(size_bytes) +
                        " bytes of host memory (cudaHostAlloc: " + cudaGetErrorString(e) + ")");
  }
  return p;
}
void free_host(void* ptr) noexcept {
  if (ptr != nullptr) (void)cudaFreeHost(ptr);
}
namespace {
// Makes `device` current for a creation call and restores the caller's device after: tiers create
// streams and events from the caller's thread (a PyTorch thread whose current device is its own).
struct OnDevice {
  int previous = -1;
  explicit OnDevice(int device) {
    if (cudaGetDevice(&previous) != cudaSuccess) {
      (void)cudaGetLastError();
      previous = -1;
    }
    if (previous != device) set_device(device);
  }
  ~OnDevice() {
    int now = -1;
    if (previous >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous)
      (void)cudaSetDevice(previous);
  }
};
}  // namespace

void* stream_create(int device) {
  OnDevice on(device);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void stream_destroy(void* stream) noexcept {
  if (stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}
void stream_sync(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}
void* event_create(int device) {
  OnDevice on(device);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}
void* event_create_timed(int device) {
  OnDevice on(device);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDefault), "cudaEventCreate");
  return e;
}
double event_elapsed_us(void* start, void* end) noexcept {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return static_cast<double>(ms) * 1000.0;
}
void event_destroy(void* event) noexcept {
  if (event != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}
void event_record(void* event, void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}
bool event_query(void* event) {
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery");
  return true;
}
void event_sync(void* event) {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
}
void stream_wait_event(void* stream, void* event) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent");
}
void memcpy_async(void* dst, const void* src, uint64_t size_bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, size_bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}
void memcpy_sync(void* dst, const void* src, uint64_t size_bytes) {
  check(cudaMemcpy(dst, src, size_bytes, cudaMemcpyDefault), "cudaMemcpy");
}

#else  // no CUDA toolkit at build time

namespace {
[[noreturn]] void absent(const char* call) {
  throw teraio::Error(std::string(call) + ": teraio was built without CUDA");
}
}  // namespace

int device_count() noexcept { return 0; }
std::string unavailable_reason() { return "teraio was built without the CUDA toolkit"; }
void require_device(int, const char* what) { absent(what); }
void set_device(int) { absent("cudaSetDevice"); }
void* malloc_device(uint64_t, int) { absent("cudaMalloc"); }
void free_device(void*, int) noexcept {}
void* host_alloc(uint64_t) { absent("cudaHostAlloc"); }
void free_host(void*) noexcept {}
void* stream_create(int) { absent("cudaStreamCreate"); }
void stream_destroy(void*) noexcept {}
void stream_sync(void*) { absent("cudaStreamSynchronize"); }
void* event_create(int) { absent("cudaEventCreate"); }
void* event_create_timed(int) { absent("cudaEventCreate"); }
double event_elapsed_us(void*, void*) noexcept { return -1; }
void event_destroy(void*) noexcept {}
void event_record(void*, void*) { absent("cudaEventRecord"); }
bool event_query(void*) { absent("cudaEventQuery"); }
void event_sync(void*) { absent("cudaEventSynchronize"); }
void stream_wait_event(void*, void*) { absent("cudaStreamWaitEvent"); }
void memcpy_async(void*, const void*, uint64_t, void*) { absent("cudaMemcpyAsync"); }
void memcpy_sync(void*, const void*, uint64_t) { absent("cudaMemcpy"); }

#endif

}  // namespace teraio::storage::cuda
