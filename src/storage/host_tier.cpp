// The host tier: a pinned (when a GPU is present) arena allocated once with a hard byte cap.
// Device buffers (Note [Copies queued on the GPU]): submit() enqueues the copy at once on one CUDA
// stream per device and direction (one more for urgent requests), after an event on the request's
// ready stream; a thread per stream reports each copy done, in order. Host buffers, and every
// request when checksums are on (a read is verified on the CPU before its bytes move), go through
// worker threads that take requests in priority order and copy with memcpy (or cudaMemcpyAsync on
// their own streams, one copy at a time). Reads and writes have their own queue and workers: the
// link carries both directions at once (bench/duplex_gpu.py: at 90% of each one's one-way speed),
// and the simulator counts on it (two channels sharing one link, docs/simulator.md "Duplex links").
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <thread>
#include <unordered_map>

#include "cuda_rt.h"
#include "internal.h"
#include "teraio/error.h"
#include "teraio/units.h"

namespace teraio::storage {
namespace {

struct HostJob {
  IoRequest request;
  std::shared_ptr<detail::CompletionState> state;
  void* ready_event = nullptr;  // owned
};

// Note [Copies queued on the GPU]: a worker that enqueues one device copy and waits for it before
// taking the next keeps the CPU of a caller that needs the copy's event (Completion::stream_wait:
// a prefetch about to be used, an offload whose memory is due) waiting until the copies queued
// before it have *ended*. Measured on the H200 (docs/benchmarks.md, "Where a planned step waits"):
// the Session's CPU waited 0.57 s of a 0.79 s llama-1b step, launched nothing meanwhile, and the
// compute stream sat idle 124 ms starved of kernels while the link moved data 67% of the step.
// Enqueueing every copy at submit on one stream fixed the CPU's waits but served the copies in
// submission order, where a write due in the next iteration (issued in the optimizer step) holds
// up one due at the next kernel: the compute stream then waited 119 ms for writes, and the
// simulator replaying the plan with such links predicted the step within 2.5%.
//
// So a lane (one CUDA stream per device, direction and priority) keeps the copies not yet on its
// stream in order of IoRequest::due (earliest first, then submission) and its thread feeds the
// stream a few at a time (kLaneDepth copies or kLaneBytes, whichever is more), taking the next as
// each ends: the link serves the copy due first, as the simulator's LinkOrder::kDeadline models.
// A caller waiting for a copy not yet on the stream does not wait on the CPU: each request gets a
// 32-bit flag in device memory that the lane's stream sets after the copy (cuStreamWriteValue32),
// and stream_wait makes the caller's stream wait for that flag on the GPU (cuStreamWaitValue32).
// A flag slot is reused only after its copy ended, with a larger ticket, so a wait for an old ticket
// stays satisfied. Without stream memory operations (or out of slots) the copy is put on the stream
// at submit, in submission order. Urgent requests take a lane of their own, so they run beside the
// queued copies instead of after them.
struct LaneCopy {
  std::shared_ptr<detail::CompletionState> state;
  Direction direction = Direction::kWrite;
  std::byte* host = nullptr;
  void* device = nullptr;
  uint64_t offset_bytes = 0, size_bytes = 0;
  void* ready_event = nullptr;  // owned until the copy is enqueued
  uint64_t due = 0, seq = 0;
  uint32_t slot = 0, ticket = 0;
  bool flagged = false;
  bool operator>(const LaneCopy& o) const { return due != o.due ? due > o.due : seq > o.seq; }
};
struct Lane {
  std::mutex mu;
  std::condition_variable cv;
  int device = 0;
  void* stream = nullptr;
  std::vector<LaneCopy> waiting;   // a min-heap by (due, seq): not yet on the stream
  std::deque<LaneCopy> on_stream;  // enqueued, in stream order
  uint64_t on_stream_bytes = 0;
  uint64_t seq = 0;
  uint32_t* flags = nullptr;  // device memory, kLaneSlots words; null: no reordering
  std::vector<uint32_t> free_slots;
  uint32_t ticket = 0;
  bool closed = false;
  std::thread thread;
};
constexpr size_t kLaneDepth = 2;
constexpr uint64_t kLaneBytes = 32ull << 20;
constexpr uint32_t kLaneSlots = 16384;

class HostTier final : public Tier {
 public:
  explicit HostTier(const HostTierOptions& o) : options_(o) {
    TERAIO_CHECK(o.capacity_bytes > 0, "host tier: capacity_bytes must be > 0");
    TERAIO_CHECK(o.worker_threads > 0, "host tier: worker_threads must be > 0, got {}",
                 o.worker_threads);
    if (o.pin && cuda::device_count() > 0) {
      arena_ = static_cast<std::byte*>(cuda::host_alloc(o.capacity_bytes));
      pinned_ = true;
      notes_.push_back("arena pinned with cudaHostAlloc");
    } else {
      arena_ = static_cast<std::byte*>(aligned_host_alloc(o.capacity_bytes, "host tier arena"));
      notes_.push_back(o.pin ? "arena not pinned: " + cuda::unavailable_reason()
                             : "arena not pinned (pin=false)");
    }
    if (!o.checksums)
      notes_.push_back("device buffers: copies queued at submit, one stream per direction");
    for (int i = 0; i < o.worker_threads; ++i) {
      workers_.emplace_back([this] { work(reads_); });
      workers_.emplace_back([this] { work(writes_); });
    }
  }
  ~HostTier() override {
    shutdown(ShutdownMode::kDrain);
    if (pinned_) {
      cuda::free_host(arena_);
    } else {
      std::free(arena_);
    }
  }

  Completion submit(const IoRequest& r) override {
    if (r.buffer.is_device() && !options_.checksums) return submit_to_lane(r);
    uint64_t size = r.buffer.size_bytes();
    TERAIO_CHECK(
        r.offset_bytes <= options_.capacity_bytes &&
            size <= options_.capacity_bytes - r.offset_bytes,
        "host tier: {} of {} bytes at offset {} exceeds the host memory cap of {} ({} bytes)",
        to_string(r.direction), size, r.offset_bytes,
        format_bytes(static_cast<double>(options_.capacity_bytes)), options_.capacity_bytes);
    if (r.buffer.is_device()) cuda::require_device(r.buffer.device(), "host tier");
    auto state = std::make_shared<detail::CompletionState>();
    HostJob job{r, state, nullptr};
    if (r.buffer.is_device()) {
      state->event = cuda::event_create(r.buffer.device());
      if (r.ready_stream != nullptr) {
        job.ready_event = cuda::event_create(r.buffer.device());
        cuda::event_record(job.ready_event, r.ready_stream);
      }
    }
    Priority p = r.priority;
    PriorityQueue<HostJob>& queue = r.direction == Direction::kWrite ? writes_ : reads_;
    if (!queue.push(std::move(job), p)) {
      throw teraio::Error("host tier: submit after shutdown");
    }
    return Completion(state);
  }

  void shutdown(ShutdownMode mode) override {
    std::lock_guard lock(shutdown_mu_);
    {
      std::lock_guard lanes_lock(lanes_mu_);
      lanes_closed_ = true;
    }
    for (auto& [key, lane] : lanes_) {  // what is on a stream finishes: nothing is left pending
      {
        std::lock_guard l(lane->mu);
        lane->closed = true;
      }
      lane->cv.notify_all();
      if (lane->thread.joinable()) lane->thread.join();
    }
    for (PriorityQueue<HostJob>* queue : {&reads_, &writes_}) {
      if (mode == ShutdownMode::kCancel) {
        for (auto& job : queue->take_all()) {
          cuda::event_destroy(job.ready_event);
          job.state->finish(failure(
              ECANCELED, fmt::format("host tier: {} at offset {} cancelled by shutdown",
                                     to_string(job.request.direction), job.request.offset_bytes)));
        }
      }
      queue->close();
    }
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

  TierInfo info() const override {
    return TierInfo{"host", "memcpy", notes_, options_.capacity_bytes, {}};
  }

 private:
  Lane& lane(int device, bool write, bool urgent) {
    std::lock_guard lock(lanes_mu_);
    if (lanes_closed_) throw teraio::Error("host tier: submit after shutdown");
    std::unique_ptr<Lane>& l = lanes_[{device, write, urgent}];
    if (!l) {
      auto fresh = std::make_unique<Lane>();
      fresh->device = device;
      fresh->stream = cuda::stream_create(device);
      if (cuda::stream_mem_ops()) {
        fresh->flags = static_cast<uint32_t*>(cuda::malloc_device(kLaneSlots * 4, device));
        cuda::memset_sync(fresh->flags, 0, kLaneSlots * 4);
        fresh->free_slots.resize(kLaneSlots);
        for (uint32_t i = 0; i < kLaneSlots; ++i) fresh->free_slots[i] = kLaneSlots - 1 - i;
      }
      Lane* raw = fresh.get();
      fresh->thread = std::thread([this, raw] { feed(*raw); });
      l = std::move(fresh);
    }
    return *l;
  }

  Completion submit_to_lane(const IoRequest& r) {
    const int dev = r.buffer.device();
    cuda::require_device(dev, "host tier");
    const uint64_t size = r.buffer.size_bytes();
    TERAIO_CHECK(
        r.offset_bytes <= options_.capacity_bytes && size <= options_.capacity_bytes - r.offset_bytes,
        "host tier: {} of {} bytes at offset {} exceeds the host memory cap of {} ({} bytes)",
        to_string(r.direction), size, r.offset_bytes,
        format_bytes(static_cast<double>(options_.capacity_bytes)), options_.capacity_bytes);
    Lane& l = lane(dev, r.direction == Direction::kWrite, r.priority == Priority::kUrgent);
    auto state = std::make_shared<detail::CompletionState>();
    LaneCopy c;
    c.state = state;
    c.direction = r.direction;
    c.host = arena_ + r.offset_bytes;
    c.device = r.buffer.data();
    c.offset_bytes = r.offset_bytes;
    c.size_bytes = size;
    c.due = r.due == 0 ? ~uint64_t{0} : r.due;
    state->event = cuda::event_create(dev);
    if (r.ready_stream != nullptr) {  // the stream's work at submit, whenever the copy starts
      c.ready_event = cuda::event_create(dev);
      cuda::event_record(c.ready_event, r.ready_stream);
    }
    std::unique_lock lock(l.mu);
    if (l.closed) {
      cuda::event_destroy(c.ready_event);
      throw teraio::Error("host tier: submit after shutdown");
    }
    c.seq = ++l.seq;
    if (l.flags != nullptr && !l.free_slots.empty()) {
      c.slot = l.free_slots.back();
      l.free_slots.pop_back();
      c.ticket = ++l.ticket;
      c.flagged = true;
      state->flag = l.flags + c.slot;
      state->flag_value = c.ticket;
      l.waiting.push_back(std::move(c));
      std::push_heap(l.waiting.begin(), l.waiting.end(), std::greater<>());
      fill_locked(l);  // the stream may have room for it now
    } else {
      enqueue_locked(l, std::move(c));  // no flag: on the stream now, in submission order
    }
    l.cv.notify_one();
    return Completion(state);
  }

  // Puts one copy on the lane's stream: after its ready event, the copy, the completion event and
  // its flag. On a CUDA error the request fails (and its flag is set, so no stream waits forever).
  void enqueue_locked(Lane& l, LaneCopy c) {
    try {
      if (c.ready_event != nullptr) cuda::stream_wait_event(l.stream, c.ready_event);
      if (c.size_bytes > 0) {
        if (c.direction == Direction::kWrite) {
          cuda::memcpy_async(c.host, c.device, c.size_bytes, l.stream);
        } else {
          cuda::memcpy_async(c.device, c.host, c.size_bytes, l.stream);
        }
      }
      if (c.flagged) cuda::stream_write_value(l.stream, l.flags + c.slot, c.ticket);
      cuda::event_record(c.state->event, l.stream);  // after the flag: the slot is free after it
    } catch (const std::exception& e) {
      cuda::event_destroy(c.ready_event);
      if (c.flagged) {
        try {
          cuda::memcpy_sync(l.flags + c.slot, &c.ticket, 4);
        } catch (const std::exception&) {
        }
        l.free_slots.push_back(c.slot);
      }
      c.state->finish(failure(EIO, fmt::format("host tier: {} of {} bytes at offset {}: {}",
                                               to_string(c.direction), c.size_bytes,
                                               c.offset_bytes, e.what())));
      return;
    }
    cuda::event_destroy(c.ready_event);  // the stream's wait keeps what it needs
    c.ready_event = nullptr;
    c.state->publish_event();
    l.on_stream_bytes += c.size_bytes;
    l.on_stream.push_back(std::move(c));
  }

  // Moves the copies due first onto the stream while it holds fewer than kLaneDepth copies or
  // kLaneBytes.
  void fill_locked(Lane& l) {
    while (!l.waiting.empty() &&
           (l.on_stream.size() < kLaneDepth || l.on_stream_bytes < kLaneBytes)) {
      std::pop_heap(l.waiting.begin(), l.waiting.end(), std::greater<>());
      LaneCopy c = std::move(l.waiting.back());
      l.waiting.pop_back();
      enqueue_locked(l, std::move(c));
    }
  }

  // A lane's thread: keeps the stream fed and finishes each request as its copy ends, in stream
  // order. At shutdown, what is waiting still goes on the stream: nothing is left pending.
  void feed(Lane& l) {
    for (;;) {
      std::unique_lock lock(l.mu);
      l.cv.wait(lock, [&] { return l.closed || !l.on_stream.empty() || !l.waiting.empty(); });
      fill_locked(l);
      if (l.on_stream.empty()) {
        if (l.closed && l.waiting.empty()) break;
        continue;
      }
      void* event = l.on_stream.front().state->event;
      lock.unlock();
      IoResult r;
      std::string error;
      try {
        cuda::event_sync(event);
      } catch (const std::exception& e) {
        error = e.what();
      }
      lock.lock();
      LaneCopy c = std::move(l.on_stream.front());
      l.on_stream.pop_front();
      l.on_stream_bytes -= c.size_bytes;
      if (c.flagged) l.free_slots.push_back(c.slot);
      fill_locked(l);  // before finishing: the link stays busy
      lock.unlock();
      if (error.empty()) {
        r.bytes = c.size_bytes;
      } else {
        r = failure(EIO, fmt::format("host tier: {} of {} bytes at offset {}: {}",
                                     to_string(c.direction), c.size_bytes, c.offset_bytes, error));
      }
      c.state->finish(std::move(r));
    }
    cuda::stream_destroy(l.stream);
    if (l.flags != nullptr) cuda::free_device(l.flags, l.device);
  }

  void work(PriorityQueue<HostJob>& queue) {
    std::unordered_map<int, void*> streams;  // device -> this worker's stream
    while (auto job = queue.pop_wait()) {
      IoResult r;
      try {
        r = run(*job, streams);
      } catch (const std::exception& e) {
        r = failure(EIO,
                    fmt::format("host tier: {} of {} bytes at offset {}: {}",
                                to_string(job->request.direction), job->request.buffer.size_bytes(),
                                job->request.offset_bytes, e.what()));
      }
      cuda::event_destroy(job->ready_event);
      job->state->finish(std::move(r));
    }
    for (auto& [dev, s] : streams) cuda::stream_destroy(s);
  }

  IoResult run(HostJob& job, std::unordered_map<int, void*>& streams) {
    const IoRequest& q = job.request;
    uint64_t size = q.buffer.size_bytes();
    std::byte* slot = arena_ + q.offset_bytes;
    bool write = q.direction == Direction::kWrite;
    if (!write && options_.checksums) {
      const uint64_t sum = checksum(arena_ + q.offset_bytes, size);
      if (auto expected = crcs_.mismatch(q.offset_bytes, size, sum))
        return checksum_failure(
            fmt::format("host tier: read of {} bytes at offset {}", size, q.offset_bytes),
            *expected, sum);
    }
    if (size > 0) {
      if (q.buffer.is_device()) {
        int dev = q.buffer.device();
        cuda::set_device(dev);
        void*& s = streams[dev];
        if (s == nullptr) s = cuda::stream_create(dev);
        if (job.ready_event != nullptr) cuda::stream_wait_event(s, job.ready_event);
        if (write) {
          cuda::memcpy_async(slot, q.buffer.data(), size, s);
        } else {
          cuda::memcpy_async(q.buffer.data(), slot, size, s);
        }
        cuda::event_record(job.state->event, s);
        job.state->publish_event();  // a read's data is in place / a write's source free then
        cuda::event_sync(job.state->event);
      } else if (write) {
        std::memcpy(slot, q.buffer.data(), size);
      } else {
        std::memcpy(q.buffer.data(), slot, size);
      }
    }
    if (write && options_.checksums) record(q.offset_bytes, size);
    IoResult ok;
    ok.bytes = size;
    return ok;
  }

  void record(uint64_t offset, uint64_t size) {
    crcs_.record(offset, size, checksum(arena_ + offset, size));
  }

  HostTierOptions options_;
  std::byte* arena_ = nullptr;
  bool pinned_ = false;
  std::vector<std::string> notes_;
  PriorityQueue<HostJob> reads_, writes_;  // one queue per direction, each with its workers
  std::vector<std::thread> workers_;
  std::mutex lanes_mu_;
  bool lanes_closed_ = false;
  std::map<std::tuple<int, bool, bool>, std::unique_ptr<Lane>> lanes_;  // (device, write, urgent)
  std::mutex shutdown_mu_;
  ChecksumTable crcs_;
};

}  // namespace

std::unique_ptr<Tier> make_host_tier(const HostTierOptions& options) {
  return std::make_unique<HostTier>(options);
}

}  // namespace teraio::storage
