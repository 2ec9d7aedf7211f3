// The host tier: a pinned (when a GPU is present) arena allocated once with a hard byte cap.
// Worker threads take requests in priority order and copy with memcpy (host buffers) or
// cudaMemcpyAsync on their own streams, ordered after the producer by an event (device buffers).
// Reads and writes have their own queue and workers: the link carries both directions at once
// (bench/duplex_gpu.py: at 90% of each one's one-way speed), and the simulator counts on it (two
// channels sharing one link, docs/simulator.md "Duplex links"). With one
// shared pool, a pool busy with reads (or with a write waiting for its producer's kernel) left the
// other direction idle.
#include <cerrno>
#include <cstdlib>
#include <cstring>
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
  std::mutex shutdown_mu_;
  ChecksumTable crcs_;
};

}  // namespace

std::unique_ptr<Tier> make_host_tier(const HostTierOptions& options) {
  return std::make_unique<HostTier>(options);
}

}  // namespace teraio::storage
