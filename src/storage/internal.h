// Internals shared by the storage tiers: the completion state behind teraio::storage::Completion,
// the two-level priority queue every tier's workers take requests from, and small helpers.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "teraio/storage.h"

namespace teraio::storage {

uint64_t now_ns();

namespace detail {

// Note [Completion states]: a request is `done` once its IoResult is final. For reads into device
// memory the state also carries a CUDA event recorded after the last host-to-device copy; it is
// published (event_published) as soon as that copy is enqueued, before the worker waits for it, so
// a compute stream can wait on the GPU instead of on the CPU (Completion::stream_wait). The host
// tier publishes the same for writes from device memory (the event after the device-to-host copy),
// so that the source's memory can be reused in stream order before the CPU sees the write done;
// for its copy lanes that event also marks the bytes in place in the arena (event_lands), so a
// read of the same bytes can wait for it on the GPU (Note [Reads after their write]).
struct CompletionState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  IoResult result;
  void* event = nullptr;  // owned; created lazily by the tier
  bool event_published = false;
  bool event_lands = false;  // a write's event marks its bytes in the tier (host tier lanes)

  ~CompletionState();
  void publish_event();
  void finish(IoResult r);
};

// "<tier>: read of N bytes at offset X", the start of a failed request's message.
std::string request_text(std::string_view tier, Direction direction, uint64_t size_bytes,
                         uint64_t offset_bytes);
// The failure of a request ordered after the write `after` (Note [Reads after their write]): ENODATA,
// saying that the request (request_text) followed that failed write; nullopt when `after` is unset
// or succeeded. Waits for it; formats nothing unless it failed.
std::optional<IoResult> wait_after(const Completion& after, std::string_view tier,
                                   Direction direction, uint64_t size_bytes, uint64_t offset_bytes);
inline std::optional<IoResult> wait_after(const IoRequest& r, std::string_view tier) {
  return wait_after(r.after, tier, r.direction, r.buffer.size_bytes(), r.offset_bytes);
}

}  // namespace detail

// Two-level FIFO: urgent items are always taken before normal ones.
template <class T>
class PriorityQueue {
 public:
  // Returns false when the queue is closed (the item is not queued).
  bool push(T item, Priority priority) {
    {
      std::lock_guard lock(mu_);
      if (closed_) return false;
      (priority == Priority::kUrgent ? urgent_ : normal_).push_back(std::move(item));
    }
    cv_.notify_one();
    return true;
  }
  // Blocks until an item is available; nullopt once closed and empty.
  std::optional<T> pop_wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return closed_ || !urgent_.empty() || !normal_.empty(); });
    return pop_locked();
  }
  std::optional<T> try_pop() {
    std::lock_guard lock(mu_);
    return pop_locked();
  }
  // Waits at most `timeout` for an item.
  template <class Duration>
  std::optional<T> pop_wait_for(Duration timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return closed_ || !urgent_.empty() || !normal_.empty(); });
    return pop_locked();
  }
  std::vector<T> take_all() {
    std::lock_guard lock(mu_);
    std::vector<T> out;
    for (auto& x : urgent_) out.push_back(std::move(x));
    for (auto& x : normal_) out.push_back(std::move(x));
    urgent_.clear();
    normal_.clear();
    return out;
  }
  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  bool closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }

 private:
  std::optional<T> pop_locked() {
    std::deque<T>* q = !urgent_.empty() ? &urgent_ : (!normal_.empty() ? &normal_ : nullptr);
    if (q == nullptr) return std::nullopt;
    T item = std::move(q->front());
    q->pop_front();
    return item;
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> urgent_, normal_;
  bool closed_ = false;
};

// Checksums of written extents (Note [Checksums]): a write records the checksum of exactly the
// range it wrote and drops every recorded range it overlaps; a read of exactly a recorded range is
// verified, other reads are not. Thread-safe.
class ChecksumTable {
 public:
  void record(uint64_t offset, uint64_t size, uint64_t sum);
  // The recorded checksum when the range was recorded and `sum` differs from it; nullopt when it
  // matches or the range was not recorded.
  std::optional<uint64_t> mismatch(uint64_t offset, uint64_t size, uint64_t sum) const;
  bool has(uint64_t offset, uint64_t size) const;

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> table_;  // offset -> (size, checksum)
};

// The failure of a read whose checksum does not match what was written (EBADMSG: the bytes are
// damaged; reading again returns the same bytes).
IoResult checksum_failure(std::string_view where, uint64_t expected, uint64_t actual);

// An IoResult for a failure.
IoResult failure(int error_code, std::string message);

// Host memory aligned to 4 KiB (posix_memalign); throws teraio::Error naming `what` on failure.
void* aligned_host_alloc(uint64_t size_bytes, const char* what);

// A file tier's private directory <root>/<job>-<pid>-<n>/ and its lock (tier_dirs.cpp, Note [Tier
// directory locks]). lock_fd holds flock(LOCK_EX) until closed; `note` says why when the
// filesystem refused the lock (the directory then looks foreign to clean_tier_dirs: never removed).
struct LockedTierDir {
  std::string dir;
  std::string lock_file;
  int lock_fd = -1;
  std::string note;
};
// Creates and locks a fresh tier directory under `root`. Throws teraio::Error naming the path.
LockedTierDir create_locked_tier_dir(const std::string& root, const std::string& job_name);

}  // namespace teraio::storage
