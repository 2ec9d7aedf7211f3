// Buffers, completions, checksums (XXH3), the extent allocator and the process-wide cleanup registry:
// the small pieces every storage tier shares.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cuda_rt.h"
#include "internal.h"
#include "teraio/error.h"
#include "teraio/units.h"

namespace teraio::storage {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

IoResult failure(int error_code, std::string message) {
  IoResult r;
  r.ok = false;
  r.error_code = error_code;
  r.error = std::move(message);
  return r;
}

IoResult checksum_failure(std::string_view where, uint64_t expected, uint64_t actual) {
  return failure(EBADMSG, fmt::format("{}: checksum mismatch (written {:016x}, read {:016x}): the "
                                      "stored bytes are damaged",
                                      where, expected, actual));
}

bool lost(const IoResult& result) {
  return !result.ok && (result.error_code == EBADMSG || result.error_code == ENODATA);
}

void* aligned_host_alloc(uint64_t size_bytes, const char* what) {
  void* p = nullptr;
  int rc = posix_memalign(&p, 4096, std::max<uint64_t>(size_bytes, 1));
  TERAIO_CHECK(rc == 0, "{}: cannot allocate {} of host memory ({})", what, format_bytes(size_bytes),
               std::strerror(rc));
  return p;
}

std::string_view to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHostPageable: return "host";
    case MemoryKind::kHostPinned: return "pinned";
    case MemoryKind::kDevice: return "device";
  }
  return "?";
}

std::string_view to_string(Direction direction) {
  return direction == Direction::kWrite ? "write" : "read";
}

int cuda_device_count() noexcept { return cuda::device_count(); }
std::string cuda_unavailable_reason() { return cuda::unavailable_reason(); }

// ---- BufferView / Buffer ----------------------------------------------------------------------

BufferView::BufferView(void* data, uint64_t size_bytes, MemoryKind kind, int device)
    : data_(data), size_bytes_(size_bytes), kind_(kind),
      device_(kind == MemoryKind::kHostPageable ? -1 : device) {
  TERAIO_CHECK(data != nullptr || size_bytes == 0, "BufferView: null pointer with {} bytes", size_bytes);
  TERAIO_CHECK(kind != MemoryKind::kDevice || device >= 0, "BufferView: device buffer needs a device index, got {}",
               device);
}

BufferView BufferView::subview(uint64_t offset_bytes, uint64_t size_bytes) const {
  TERAIO_CHECK(offset_bytes <= size_bytes_ && size_bytes <= size_bytes_ - offset_bytes,
               "BufferView::subview: [{}, +{}) is outside a buffer of {} bytes", offset_bytes, size_bytes,
               size_bytes_);
  BufferView v = *this;
  v.data_ = bytes() + offset_bytes;
  v.size_bytes_ = size_bytes;
  return v;
}

Buffer Buffer::allocate(uint64_t size_bytes, MemoryKind kind, int device) {
  Buffer b;
  switch (kind) {
    case MemoryKind::kDevice:
      b.view_ = BufferView(cuda::malloc_device(std::max<uint64_t>(size_bytes, 1), device), size_bytes, kind, device);
      break;
    case MemoryKind::kHostPinned:
      if (cuda::device_count() > 0) {
        b.view_ = BufferView(cuda::host_alloc(std::max<uint64_t>(size_bytes, 1)), size_bytes, kind, device);
        b.pinned_ = true;
      } else {
        b.view_ = BufferView(aligned_host_alloc(size_bytes, "Buffer::allocate"), size_bytes, kind, device);
      }
      break;
    case MemoryKind::kHostPageable:
      b.view_ = BufferView(aligned_host_alloc(size_bytes, "Buffer::allocate"), size_bytes, kind);
      break;
  }
  return b;
}

Buffer::Buffer(Buffer&& other) noexcept : view_(other.view_), pinned_(other.pinned_) {
  other.view_ = BufferView();
  other.pinned_ = false;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    view_ = other.view_;
    pinned_ = other.pinned_;
    other.view_ = BufferView();
    other.pinned_ = false;
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (view_.data() == nullptr) return;
  if (view_.kind() == MemoryKind::kDevice) {
    cuda::free_device(view_.data(), view_.device());
  } else if (pinned_) {
    cuda::free_host(view_.data());
  } else {
    std::free(view_.data());
  }
  view_ = BufferView();
}

void copy_buffer(BufferView dst, BufferView src) {
  TERAIO_CHECK(dst.size_bytes() == src.size_bytes(), "copy_buffer: sizes differ ({} vs {})", dst.size_bytes(),
               src.size_bytes());
  if (dst.size_bytes() == 0) return;
  if (dst.is_device() || src.is_device()) {
    cuda::memcpy_sync(dst.data(), src.data(), dst.size_bytes());
  } else {
    std::memcpy(dst.data(), src.data(), dst.size_bytes());
  }
}

// ---- Completion -------------------------------------------------------------------------------

namespace detail {

CompletionState::~CompletionState() { cuda::event_destroy(event); }

void CompletionState::publish_event() {
  {
    std::lock_guard lock(mu);
    event_published = true;
  }
  cv.notify_all();
}

void CompletionState::finish(IoResult r) {
  r.finish_ns = now_ns();
  {
    std::lock_guard lock(mu);
    result = std::move(r);
    done = true;
  }
  cv.notify_all();
}

CompletionState* state_of(const Completion& completion) { return completion.state_.get(); }

std::string request_text(std::string_view tier, Direction direction, uint64_t size_bytes,
                         uint64_t offset_bytes) {
  return fmt::format("{}: {} of {} bytes at offset {}", tier, to_string(direction), size_bytes,
                     offset_bytes);
}

std::optional<IoResult> wait_after(const Completion& after, std::string_view tier,
                                   Direction direction, uint64_t size_bytes, uint64_t offset_bytes) {
  if (!after.valid()) return std::nullopt;
  const IoResult& w = after.wait();
  if (w.ok) return std::nullopt;
  return failure(ENODATA, fmt::format("{} follows a write of the same bytes that failed, so nothing "
                                      "can be read back: {}",
                                      request_text(tier, direction, size_bytes, offset_bytes), w.error));
}

}  // namespace detail

bool Completion::ready() const {
  TERAIO_CHECK(state_ != nullptr, "Completion: not attached to a request");
  std::lock_guard lock(state_->mu);
  return state_->done;
}

const IoResult& Completion::wait() const {
  TERAIO_CHECK(state_ != nullptr, "Completion: not attached to a request");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->result;
}

bool Completion::wait_for(std::chrono::nanoseconds timeout) const {
  TERAIO_CHECK(state_ != nullptr, "Completion: not attached to a request");
  std::unique_lock lock(state_->mu);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->done; });
}

void Completion::get() const {
  const IoResult& r = wait();
  if (!r.ok) throw teraio::Error(r.error);
}

void Completion::stream_wait(CudaStream stream) const {
  TERAIO_CHECK(state_ != nullptr, "Completion: not attached to a request");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done || state_->event_published; });
  if (state_->done) {
    if (!state_->result.ok) throw teraio::Error(state_->result.error);
    return;  // data already in place; nothing for the stream to wait on
  }
  void* event = state_->event;
  lock.unlock();
  cuda::stream_wait_event(stream, event);
}

void Tier::write(BufferView buffer, uint64_t offset_bytes) {
  submit(IoRequest{Direction::kWrite, buffer, offset_bytes}).get();
}
void Tier::read(BufferView buffer, uint64_t offset_bytes) {
  submit(IoRequest{Direction::kRead, buffer, offset_bytes}).get();
}

// ---- ChecksumTable ----------------------------------------------------------------------------

void ChecksumTable::record(uint64_t offset, uint64_t size, uint64_t sum) {
  std::lock_guard lock(mu_);
  auto it = table_.lower_bound(offset);
  if (it != table_.begin()) --it;
  while (it != table_.end() && it->first < offset + std::max<uint64_t>(size, 1)) {
    if (it->first + it->second.first > offset || it->first == offset) {
      it = table_.erase(it);
    } else {
      ++it;
    }
  }
  table_[offset] = {size, sum};
}

std::optional<uint64_t> ChecksumTable::mismatch(uint64_t offset, uint64_t size, uint64_t sum) const {
  std::lock_guard lock(mu_);
  auto it = table_.find(offset);
  if (it == table_.end() || it->second.first != size || it->second.second == sum) return std::nullopt;
  return it->second.second;
}

bool ChecksumTable::has(uint64_t offset, uint64_t size) const {
  std::lock_guard lock(mu_);
  auto it = table_.find(offset);
  return it != table_.end() && it->second.first == size;
}

// ---- Checksums -------------------------------------------------------------------------------

// XXH3 (libxxhash, header-only inline build): about 30 GB/s per core with AVX2 on x86-64, so the
// check costs a few percent of one core at SSD speed (docs/benchmarks.md, "Integrity").
uint64_t checksum(const void* data, uint64_t size_bytes) {
  return XXH3_64bits(data, static_cast<size_t>(size_bytes));
}

// ---- ExtentAllocator --------------------------------------------------------------------------

ExtentAllocator::ExtentAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes)
    : capacity_bytes_(capacity_bytes), alignment_bytes_(alignment_bytes), free_bytes_(0) {
  TERAIO_CHECK(alignment_bytes > 0 && (alignment_bytes & (alignment_bytes - 1)) == 0,
               "ExtentAllocator: alignment {} is not a power of two", alignment_bytes);
  uint64_t usable = capacity_bytes / alignment_bytes * alignment_bytes;
  if (usable > 0) free_.push_back({0, usable});
  free_bytes_ = usable;
}

std::optional<Extent> ExtentAllocator::try_allocate(uint64_t size_bytes) {
  uint64_t want = (std::max<uint64_t>(size_bytes, 1) + alignment_bytes_ - 1) / alignment_bytes_ * alignment_bytes_;
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].size_bytes < want) continue;
    Extent e{free_[i].offset_bytes, want};
    free_[i].offset_bytes += want;
    free_[i].size_bytes -= want;
    if (free_[i].size_bytes == 0) free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
    free_bytes_ -= want;
    return e;
  }
  return std::nullopt;
}

Extent ExtentAllocator::allocate(uint64_t size_bytes) {
  auto e = try_allocate(size_bytes);
  TERAIO_CHECK(e.has_value(), "tier full: cannot allocate {} ({} bytes); {} free of {}, largest free extent {}",
               format_bytes(static_cast<double>(size_bytes)), size_bytes, format_bytes(static_cast<double>(free_bytes_)),
               format_bytes(static_cast<double>(capacity_bytes_)),
               format_bytes(static_cast<double>(largest_free_bytes())));
  return *e;
}

void ExtentAllocator::free(Extent extent) {
  TERAIO_CHECK(extent.size_bytes > 0 && extent.offset_bytes % alignment_bytes_ == 0 &&
                   extent.size_bytes % alignment_bytes_ == 0 &&
                   extent.offset_bytes + extent.size_bytes <= capacity_bytes_,
               "ExtentAllocator::free: [{}, +{}) was not allocated here", extent.offset_bytes, extent.size_bytes);
  auto it = std::lower_bound(free_.begin(), free_.end(), extent.offset_bytes,
                             [](const Extent& f, uint64_t off) { return f.offset_bytes < off; });
  uint64_t end = extent.offset_bytes + extent.size_bytes;
  bool overlaps_next = it != free_.end() && it->offset_bytes < end;
  bool overlaps_prev = it != free_.begin() && std::prev(it)->offset_bytes + std::prev(it)->size_bytes > extent.offset_bytes;
  TERAIO_CHECK(!overlaps_next && !overlaps_prev, "ExtentAllocator::free: [{}, +{}) is already free (double free)",
               extent.offset_bytes, extent.size_bytes);
  it = free_.insert(it, extent);
  free_bytes_ += extent.size_bytes;
  auto next = std::next(it);
  if (next != free_.end() && it->offset_bytes + it->size_bytes == next->offset_bytes) {
    it->size_bytes += next->size_bytes;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->offset_bytes + prev->size_bytes == it->offset_bytes) {
      prev->size_bytes += it->size_bytes;
      free_.erase(it);
    }
  }
}

uint64_t ExtentAllocator::largest_free_bytes() const {
  uint64_t m = 0;
  for (const auto& f : free_) m = std::max(m, f.size_bytes);
  return m;
}

// ---- Cleanup registry -------------------------------------------------------------------------
// Note [Cleanup on signals]: paths live in fixed slots so that the SIGINT/SIGTERM handler can walk
// them without locks or allocation (unlink/rmdir are async-signal-safe). A slot is claimed with a
// CAS (0 -> 1 "writing"), filled, then published (2). Directories are removed after files because
// rmdir fails on a non-empty directory; the handler makes two passes.

namespace {
constexpr int kSlots = 1024;
constexpr int kPathMax = 4096;
struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 busy, 2 ready
  char path[kPathMax];
};
Slot g_slots[kSlots];
std::atomic<bool> g_handlers_installed{false};
struct sigaction g_old_int, g_old_term;

void remove_all_async_safe() {
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& s : g_slots) {
      if (s.state.load(std::memory_order_acquire) != 2) continue;
      struct stat st;
      if (lstat(s.path, &st) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        if (pass == 1) rmdir(s.path);
      } else {
        unlink(s.path);
      }
    }
  }
}

void on_signal(int sig) {
  remove_all_async_safe();
  sigaction(sig, sig == SIGINT ? &g_old_int : &g_old_term, nullptr);
  raise(sig);
}

void install_handlers() {
  bool expected = false;
  if (!g_handlers_installed.compare_exchange_strong(expected, true)) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  // A signal the process ignores stays ignored: removing files and carrying on would break the job.
  if (g_old_int.sa_handler == SIG_IGN) sigaction(SIGINT, &g_old_int, nullptr);
  if (g_old_term.sa_handler == SIG_IGN) sigaction(SIGTERM, &g_old_term, nullptr);
  std::atexit([] { remove_all_async_safe(); });
}
}  // namespace

void cleanup_register(const std::string& path) {
  TERAIO_CHECK(path.size() < kPathMax, "cleanup_register: path too long: {}", path);
  install_handlers();
  for (auto& s : g_slots) {
    int expected = 0;
    if (s.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      std::memcpy(s.path, path.c_str(), path.size() + 1);
      s.state.store(2, std::memory_order_release);
      return;
    }
  }
  throw teraio::Error("cleanup_register: more than 1024 temporary paths registered; cannot track " + path);
}

void cleanup_unregister(const std::string& path) {
  for (auto& s : g_slots) {
    int expected = 2;
    if (s.state.load(std::memory_order_acquire) == 2 && path == s.path &&
        s.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      s.path[0] = '\0';
      s.state.store(0, std::memory_order_release);
      return;
    }
  }
}

void cleanup_run_now() { remove_all_async_safe(); }

}  // namespace teraio::storage
