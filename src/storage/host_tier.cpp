// The host tier: a pinned (when a GPU is present) arena allocated once with a hard byte cap.
// Device buffers (Note [Copies queued on the GPU]): submit() enqueues the copy at once on one CUDA
// stream per device and direction (one more for urgent requests), after an event on the request's
// ready stream; a thread per stream reports each copy done, in order. Host buffers, and every
// request when checksums are on (a read is verified on the CPU before its bytes move), go through
// worker threads that take requests in priority order and copy with memcpy (or cudaMemcpyAsync on
// their own streams, one copy at a time). Reads and writes have their own queue and workers: the
// link carries both directions at once (bench/duplex_gpu.py: at 90% of each one's one-way speed),
// and the simulator counts on it (two channels sharing one link, docs/simulator.md "Duplex links").
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
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
// a prefetch about to be used, an offload whose memory is due) waiting until every copy queued
// before it has *ended*. Measured on the H200 (docs/benchmarks.md, "Where a planned step waits"):
// the Session's CPU waited 0.57 s of a 0.79 s llama-1b step, launched nothing meanwhile, and the
// compute stream sat idle 124 ms starved of kernels while the link moved data 67% of the step. Two
// workers per direction also split the link between two copies, so the one needed first arrived
// late. A lane is one stream per device, direction and priority: submit() enqueues the copy on it
// at once (the CPU never waits for earlier copies), in submission order; the GPU runs them one
// after the other at full speed. Its thread waits for each copy's event in that order and finishes
// the request. Urgent requests take a lane of their own, so they run beside the queued copies
// instead of after them. In submission order, a copy due soon waits behind every one submitted
// before it, also those due much later: the Session therefore submits a plan's transfers in about
// the order they are due (Note [Issue in deadline order] in src/sim/simulator.cpp), and the
// simulator models lanes as LinkOrder::kIssue. (Lanes that reorder their copies themselves, with
// streams waiting on device flags for copies not yet enqueued, were tried and hung a step on the
// H200: docs/benchmarks.md.)
// Note [Reads after their write]: the runtime frees an offloaded tensor's device memory in stream
// order once its write's device-to-host copy is on a lane (stream-ordered offloads), and may read the
// tensor back before that write has ended. The tier does not order overlapping requests, so the
// engine used to wait on the CPU for the write before submitting the read: on the H200 that was
// 13-34 ms a step of llama-1b in autocast at 1/2 and 1/4 of its footprint (docs/benchmarks.md,
// "Writebacks taken over, the A/B again"), the CPU launching nothing meanwhile. IoRequest::after
// names the write instead. On a lane the write's event marks its bytes in the arena (event_lands),
// so the read's lane stream waits for that event on the GPU: no CPU waits, and only the reads
// queued behind it on the same lane wait with it. The read's result includes the write's: the
// lane's thread, finishing the read, waits for the write's result (already on its way: its copy
// ended before the read's) and fails the read with ENODATA when it failed, since the arena then
// holds what was there before. Requests the lanes do not take (host buffers, checksums on) wait for
// the write in their worker; a write that is not a lane's is waited for in submit().
// Note [The link's rate in use]: a plan is made for the link's bandwidth the Session's probe
// measured, and a probe can be wrong (Note [A probe caught in a slow moment] in bandwidth.cpp: an
// H100 probe read at half the link's speed, and the plan made for it predicted 0.681 s for a step
// that ran 0.396 s). What the planned steps' copies take says what the link does: each lane copy
// runs between a timed event recorded on its stream once its waits are over (the previous copy of
// the lane, the ready stream's work, the write it follows) and its completion event, so
// cudaEventElapsedTime between the two is the copy's own time, with no queueing in it
// (IoResult::transfer_us). A worker's memcpy is timed on the CPU clock; a worker's device copy
// (checksums on) is not timed. The tier sums the bytes and times of those of at least
// timed_min_bytes per direction (transfer_times(); the engine's stats carry them, EngineStats::Tier),
// stats()["tiers"] reports the rates (read_gbps_in_use, write_gbps_in_use),
// and the Controller plans again for them when they are far from the plan's (Note [Plans for the
// link in use] in src/offload/controller.cpp).
struct Queued {
  std::shared_ptr<detail::CompletionState> state;
  Direction direction;
  uint64_t offset_bytes, size_bytes;
  Completion after;  // a read ordered after this write (Note [Reads after their write])
  void* start = nullptr;  // owned: timed, recorded when the copy may begin (Note [The link's rate in use])
};
struct Lane {
  std::mutex mu;  // held while enqueueing: submission order is stream order
  std::condition_variable cv;
  void* stream = nullptr;
  std::deque<Queued> queued;  // in stream order
  bool closed = false;
  std::thread thread;
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
  TransferTimes transfer_times() const override {
    std::lock_guard lock(times_mu_);
    return times_;
  }

 private:
  Lane& lane(int device, bool write, bool urgent) {
    std::lock_guard lock(lanes_mu_);
    if (lanes_closed_) throw teraio::Error("host tier: submit after shutdown");
    std::unique_ptr<Lane>& l = lanes_[{device, write, urgent}];
    if (!l) {
      auto fresh = std::make_unique<Lane>();
      fresh->stream = cuda::stream_create(device);
      Lane* raw = fresh.get();
      fresh->thread = std::thread([this, raw] { finish_in_order(*raw); });
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
    const bool write = r.direction == Direction::kWrite;
    Lane& l = lane(dev, write, r.priority == Priority::kUrgent);
    auto state = std::make_shared<detail::CompletionState>();
    std::byte* slot = arena_ + r.offset_bytes;
    // Note [Reads after their write]: a write still running on one of this tier's lanes published
    // the event that ends its copy into the arena; the read's copy waits for it on the GPU. Any
    // other write is waited for here.
    void* landed = nullptr;
    if (r.after.valid()) {
      detail::CompletionState* w = detail::state_of(r.after);
      std::unique_lock wl(w->mu);
      if (!w->done && w->event_published && w->event_lands) {
        landed = w->event;
      } else {
        wl.unlock();
        if (auto f = detail::wait_after(r, "host tier")) {
          state->finish(std::move(*f));
          return Completion(state);
        }
      }
    }
    std::lock_guard lock(l.mu);
    if (l.closed) throw teraio::Error("host tier: submit after shutdown");
    void* start = nullptr;
    try {
      state->event = cuda::event_create_timed(dev);
      start = cuda::event_create_timed(dev);
      if (r.ready_stream != nullptr) {
        cuda::Event ready(dev);
        cuda::event_record(ready.get(), r.ready_stream);
        cuda::stream_wait_event(l.stream, ready.get());  // the wait keeps what it needs
      }
      if (landed != nullptr) cuda::stream_wait_event(l.stream, landed);
      cuda::event_record(start, l.stream);
      if (size > 0) {
        if (write) {
          cuda::memcpy_async(slot, r.buffer.data(), size, l.stream);
        } else {
          cuda::memcpy_async(r.buffer.data(), slot, size, l.stream);
        }
      }
      cuda::event_record(state->event, l.stream);
    } catch (const std::exception& e) {
      cuda::event_destroy(start);
      state->finish(failure(EIO, fmt::format("{}: {}",
                                             detail::request_text("host tier", r.direction, size,
                                                                  r.offset_bytes),
                                             e.what())));
      return Completion(state);
    }
    if (write) state->event_lands = true;  // set before anyone can see the state
    state->publish_event();  // a read's data is in place / a write's source free after it
    l.queued.push_back(
        Queued{state, r.direction, r.offset_bytes, size, landed ? r.after : Completion(), start});
    l.cv.notify_one();
    return Completion(state);
  }

  // Note [The link's rate in use]
  void add_time(Direction d, const IoResult& r) {
    if (!r.ok || r.transfer_us <= 0 || r.bytes < options_.timed_min_bytes) return;
    std::lock_guard lock(times_mu_);
    if (d == Direction::kWrite) {
      times_.write_bytes += r.bytes;
      times_.write_us += r.transfer_us;
    } else {
      times_.read_bytes += r.bytes;
      times_.read_us += r.transfer_us;
    }
  }

  // A lane's thread: finishes its requests in stream order as their copies end.
  void finish_in_order(Lane& l) {
    for (;;) {
      std::optional<Queued> q;
      {
        std::unique_lock lock(l.mu);
        l.cv.wait(lock, [&] { return l.closed || !l.queued.empty(); });
        if (l.queued.empty()) break;
        q = std::move(l.queued.front());
        l.queued.pop_front();
      }
      IoResult r;
      try {
        cuda::event_sync(q->state->event);
        r.bytes = q->size_bytes;
        r.transfer_us = std::max(0.0, cuda::event_elapsed_us(q->start, q->state->event));
      } catch (const std::exception& e) {
        r = failure(EIO, fmt::format("{}: {}",
                                     detail::request_text("host tier", q->direction, q->size_bytes,
                                                          q->offset_bytes),
                                     e.what()));
      }
      // The write this read followed on the GPU has ended too (its lane reports it shortly): a
      // failed one left nothing to read.
      if (r.ok) {
        if (auto f = detail::wait_after(q->after, "host tier", q->direction, q->size_bytes,
                                        q->offset_bytes))
          r = std::move(*f);
      }
      cuda::event_destroy(q->start);
      add_time(q->direction, r);
      q->state->finish(std::move(r));
    }
    cuda::stream_destroy(l.stream);
  }

  void work(PriorityQueue<HostJob>& queue) {
    std::unordered_map<int, void*> streams;  // device -> this worker's stream
    while (auto job = queue.pop_wait()) {
      IoResult r;
      try {
        // Note [Reads after their write]: a worker waits for the write before the copy.
        auto f = detail::wait_after(job->request, "host tier");
        r = f ? std::move(*f) : run(*job, streams);
      } catch (const std::exception& e) {
        const IoRequest& q = job->request;
        r = failure(EIO, fmt::format("{}: {}",
                                     detail::request_text("host tier", q.direction,
                                                          q.buffer.size_bytes(), q.offset_bytes),
                                     e.what()));
      }
      cuda::event_destroy(job->ready_event);
      add_time(job->request.direction, r);
      job->state->finish(std::move(r));
    }
    for (auto& [dev, s] : streams) cuda::stream_destroy(s);
  }

  IoResult run(HostJob& job, std::unordered_map<int, void*>& streams) {
    const IoRequest& q = job.request;
    uint64_t size = q.buffer.size_bytes();
    std::byte* slot = arena_ + q.offset_bytes;
    bool write = q.direction == Direction::kWrite;
    double copy_us = 0;
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
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        if (write) {
          std::memcpy(slot, q.buffer.data(), size);
        } else {
          std::memcpy(q.buffer.data(), slot, size);
        }
        copy_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    if (write && options_.checksums) record(q.offset_bytes, size);
    IoResult ok;
    ok.bytes = size;
    ok.transfer_us = copy_us;  // Note [The link's rate in use]
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
  mutable std::mutex times_mu_;
  TransferTimes times_;  // Note [The link's rate in use]
};

}  // namespace

std::unique_ptr<Tier> make_host_tier(const HostTierOptions& options) {
  return std::make_unique<HostTier>(options);
}

}  // namespace teraio::storage
