// The host tier: a pinned (when a GPU is present) arena allocated once with a hard byte cap.
// Worker threads take requests in priority order and copy with memcpy (host buffers) or
// cudaMemcpyAsync on their own streams, ordered after the producer by an event (device buffers),
// several copies in flight per worker (Note [Copies in flight]).
// Reads and writes have their own queue and workers: the link carries both directions at once
// (bench/duplex_gpu.py: at 90% of each one's one-way speed), and the simulator counts on it (two
// channels sharing one link, docs/simulator.md "Duplex links"). With one
// shared pool, a pool busy with reads (or with a write waiting for its producer's kernel) left the
// other direction idle.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
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
  // Note [Copies in flight]: a worker does not wait for one device copy before it enqueues the next:
  // up to kInFlight copies of a worker are on its stream at once (their events published, so a
  // compute stream can wait for them on the GPU), and a job is finished when its copy's event has
  // completed, oldest first. Waiting for each copy before taking the next job kept every request
  // in the queue until the copies before it had ended, so a CPU that waits for a copy to be
  // *enqueued* (Completion::stream_wait: a read an operator needs, a write whose memory is released
  // in stream order) waited for the link instead, and launched no kernels meanwhile. Priority still
  // reorders the requests not yet enqueued; at most kInFlight per worker are ahead of an urgent one.
  static constexpr size_t kInFlight = 4;

  void work(PriorityQueue<HostJob>& queue) {
    std::unordered_map<int, void*> streams;  // device -> this worker's stream
    std::deque<HostJob> inflight;            // device copies enqueued, oldest first
    auto fail = [](HostJob& job, const std::exception& e) {
      return failure(EIO, fmt::format("host tier: {} of {} bytes at offset {}: {}",
                                      to_string(job.request.direction),
                                      job.request.buffer.size_bytes(), job.request.offset_bytes,
                                      e.what()));
    };
    auto finish = [&](HostJob& job, IoResult r) {
      cuda::event_destroy(job.ready_event);
      job.ready_event = nullptr;
      job.state->finish(std::move(r));
    };
    auto complete_oldest = [&] {
      HostJob job = std::move(inflight.front());
      inflight.pop_front();
      IoResult r;
      try {
        r = complete(job);
      } catch (const std::exception& e) {
        r = fail(job, e);
      }
      finish(job, std::move(r));
    };
    for (;;) {
      std::optional<HostJob> job = inflight.empty() ? queue.pop_wait() : queue.try_pop();
      if (!job) {
        if (inflight.empty()) break;  // closed and drained
        complete_oldest();            // nothing new: finish what the stream has done
        continue;
      }
      bool enqueued = false;
      IoResult r;
      try {
        enqueued = start(*job, streams, &r);
      } catch (const std::exception& e) {
        r = fail(*job, e);
      }
      if (!enqueued) {
        finish(*job, std::move(r));
        continue;
      }
      inflight.push_back(std::move(*job));
      if (inflight.size() > kInFlight) complete_oldest();
    }
    for (auto& [dev, s] : streams) cuda::stream_destroy(s);
  }

  // Starts `job`: a device copy is enqueued on the worker's stream and its event published (true:
  // complete() finishes it); a host copy, a failed checksum or an empty request is done at once
  // (false, *result set).
  bool start(HostJob& job, std::unordered_map<int, void*>& streams, IoResult* result) {
    const IoRequest& q = job.request;
    uint64_t size = q.buffer.size_bytes();
    std::byte* slot = arena_ + q.offset_bytes;
    bool write = q.direction == Direction::kWrite;
    if (!write && options_.checksums) {
      const uint64_t sum = checksum(arena_ + q.offset_bytes, size);
      if (auto expected = crcs_.mismatch(q.offset_bytes, size, sum)) {
        *result = checksum_failure(
            fmt::format("host tier: read of {} bytes at offset {}", size, q.offset_bytes),
            *expected, sum);
        return false;
      }
    }
    if (size > 0 && q.buffer.is_device()) {
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
      return true;
    }
    if (size > 0) {
      if (write) {
        std::memcpy(slot, q.buffer.data(), size);
      } else {
        std::memcpy(q.buffer.data(), slot, size);
      }
    }
    *result = done(q);
    return false;
  }

  // Waits for an enqueued device copy; the job's result.
  IoResult complete(HostJob& job) {
    cuda::event_sync(job.state->event);
    return done(job.request);
  }

  IoResult done(const IoRequest& q) {
    const uint64_t size = q.buffer.size_bytes();
    if (q.direction == Direction::kWrite && options_.checksums) record(q.offset_bytes, size);
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
