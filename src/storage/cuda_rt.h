// Thin wrapper over the CUDA runtime used by the storage tiers. Built against libcudart when the
// CUDA toolkit is found (TERAIO_HAVE_CUDA); otherwise every call reports that CUDA is absent.
// Streams and events are opaque pointers so that no other file includes CUDA headers.
// Every failing call throws teraio::Error naming the call and the CUDA error string.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace teraio::storage::cuda {

int device_count() noexcept;          // cached; 0 when unavailable
std::string unavailable_reason();     // "" when device_count() > 0
void require_device(int device, const char* what);  // throws when the device cannot be used

void set_device(int device);
void* malloc_device(uint64_t size_bytes, int device);
void free_device(void* ptr, int device) noexcept;
void* host_alloc(uint64_t size_bytes);  // pinned; throws teraio::Error when it fails
void free_host(void* ptr) noexcept;

void* stream_create(int device);  // non-blocking stream
void stream_destroy(void* stream) noexcept;
void stream_sync(void* stream);
void* event_create(int device);   // timing disabled
void* event_create_timed(int device);  // timing enabled (event_elapsed_us)
// Microseconds from `start` to `end`, both timing-enabled and complete; negative when CUDA cannot
// say (an event without timing, not recorded): never throws.
double event_elapsed_us(void* start, void* end) noexcept;
void event_destroy(void* event) noexcept;
void event_record(void* event, void* stream);
bool event_query(void* event);    // true when complete; throws on error
void event_sync(void* event);
void stream_wait_event(void* stream, void* event);
void memcpy_async(void* dst, const void* src, uint64_t size_bytes, void* stream);  // cudaMemcpyDefault
void memcpy_sync(void* dst, const void* src, uint64_t size_bytes);

// Owning handles: destroyed with their owner, movable, empty (nullptr) until created. get_or_create
// makes the stream or event on first use, on `device`, and returns it after (the device of a later
// call is not compared). Not thread-safe: one owner uses each.
template <void* (*Create)(int), void (*Destroy)(void*) noexcept>
class Handle {
 public:
  Handle() = default;
  explicit Handle(int device) : p_(Create(device)) {}
  ~Handle() { Destroy(p_); }
  Handle(Handle&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      Destroy(p_);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  void* get() const { return p_; }
  void* get_or_create(int device) {
    if (p_ == nullptr) p_ = Create(device);
    return p_;
  }

 private:
  void* p_ = nullptr;
};
using Stream = Handle<stream_create, stream_destroy>;  // non-blocking stream
using Event = Handle<event_create, event_destroy>;     // timing disabled

}  // namespace teraio::storage::cuda
