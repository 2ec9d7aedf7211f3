// Tiered storage engine: asynchronous moves between buffers (host pageable, host pinned, device)
// and storage tiers (a capped pinned-host arena; one or more SSD paths striped without RAID).
// Every tier is a byte-addressed space; an ExtentAllocator hands out 4 KiB-aligned extents of it.
// See docs/storage.md for the contracts summarised in the comments below.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace teraio::storage {

// ---------------------------------------------------------------------------------------------
// Buffers: a pointer always travels with its memory kind and device.

enum class MemoryKind { kHostPageable, kHostPinned, kDevice };
std::string_view to_string(MemoryKind kind);

// Number of usable CUDA devices: 0 when teraio was built without CUDA, when no driver or GPU is
// present, or when cudaGetDeviceCount fails. Thread-safe; probed once.
int cuda_device_count() noexcept;
// Why cuda_device_count() is 0 ("" when it is not).
std::string cuda_unavailable_reason();

// A non-owning view of memory of one kind. Cheap to copy. The caller keeps the memory alive until
// every request that uses the view has completed.
class BufferView {
 public:
  BufferView() = default;
  // `device` is the CUDA device index for kDevice (and the device a pinned buffer is used with);
  // it is ignored (-1) for pageable memory.
  BufferView(void* data, uint64_t size_bytes, MemoryKind kind, int device = -1);
  static BufferView host(void* data, uint64_t size_bytes) {
    return BufferView(data, size_bytes, MemoryKind::kHostPageable);
  }

  void* data() const { return data_; }
  std::byte* bytes() const { return static_cast<std::byte*>(data_); }
  uint64_t size_bytes() const { return size_bytes_; }
  MemoryKind kind() const { return kind_; }
  int device() const { return device_; }
  bool is_device() const { return kind_ == MemoryKind::kDevice; }
  // The sub-range [offset, offset + size); throws teraio::Error when it is out of range.
  BufferView subview(uint64_t offset_bytes, uint64_t size_bytes) const;

 private:
  void* data_ = nullptr;
  uint64_t size_bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kHostPageable;
  int device_ = -1;
};

// An owning, move-only buffer. Host memory is 4 KiB aligned. kHostPinned uses cudaHostAlloc when
// a GPU is present and falls back to ordinary aligned memory otherwise (pinned() says which).
// kDevice throws teraio::Error when no GPU is present.
class Buffer {
 public:
  Buffer() = default;
  static Buffer allocate(uint64_t size_bytes, MemoryKind kind, int device = 0);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  BufferView view() const { return view_; }
  void* data() const { return view_.data(); }
  uint64_t size_bytes() const { return view_.size_bytes(); }
  MemoryKind kind() const { return view_.kind(); }
  bool pinned() const { return pinned_; }  // true when cudaHostAlloc really pinned it

 private:
  void release() noexcept;
  BufferView view_;
  bool pinned_ = false;
};

// Copies between any two views of equal size (cudaMemcpy when either side is on a device).
void copy_buffer(BufferView dst, BufferView src);

// ---------------------------------------------------------------------------------------------
// Requests and completions.

enum class Direction { kWrite, kRead };  // kWrite: buffer -> tier; kRead: tier -> buffer
enum class Priority { kNormal, kUrgent };
std::string_view to_string(Direction direction);

using CudaStream = void*;  // a cudaStream_t; nullptr is the legacy default stream


// Note [Lost bytes]: two error codes say that a read can never succeed, whatever is retried:
// EBADMSG, the bytes read back do not match the checksum recorded when they were written (damaged on
// the disk or in the file), and ENODATA, the read reached the end of the file (it was truncated) or
// followed a write of the same bytes that failed (IoRequest::after). lost() is true for them. Every other failure (EIO, ENOSPC, EPERM, ...) may be transient: the bytes
// written before are still in the tier, and the same read can succeed once the fault clears.
struct IoResult {
  bool ok = true;
  uint64_t bytes = 0;         // bytes moved (== request size when ok)
  int error_code = 0;         // errno value (ECANCELED when cancelled at shutdown; Note [Lost bytes])
  std::string error;          // names the tier, path, offset and size
  uint64_t finish_ns = 0;     // steady_clock time of completion, for ordering and latency
  // The copy's own time, from its first byte to its last, where the tier can tell (the host tier:
  // Note [The link's rate in use] in src/storage/host_tier.cpp); 0 where it cannot.
  double transfer_us = 0;
};

// True when a failed read can never succeed (Note [Lost bytes]).
bool lost(const IoResult& result);

class Completion;
namespace detail {
struct CompletionState;
CompletionState* state_of(const Completion& completion);  // the tiers' access (internal.h)
}  // namespace detail

// The handle of a submitted request. Copyable; all copies refer to the same request.
// Thread-safe: any thread may wait.
class Completion {
 public:
  Completion() = default;
  explicit Completion(std::shared_ptr<detail::CompletionState> state) : state_(std::move(state)) {}
  bool valid() const { return state_ != nullptr; }
  bool ready() const;
  // Blocks until the request has completed (successfully or not).
  const IoResult& wait() const;
  bool wait_for(std::chrono::nanoseconds timeout) const;
  // wait(), then throws teraio::Error with the result's message on failure.
  void get() const;
  // Makes `stream` wait on the GPU instead of the CPU: for a read into a device buffer, for its
  // data (the final host-to-device copy); for a write from a device buffer to the host tier, for the
  // end of the device-to-host copy, after which the buffer may be reused (the write's result is
  // final later: ready()/wait()). Blocks the CPU only until that copy has been enqueued, then
  // cudaStreamWaitEvent. For other requests (and tiers that publish no event) it is wait(). Throws
  // teraio::Error when the request has already failed.
  void stream_wait(CudaStream stream) const;

 private:
  friend detail::CompletionState* detail::state_of(const Completion& completion);
  std::shared_ptr<detail::CompletionState> state_;
};

struct IoRequest {
  Direction direction = Direction::kWrite;
  BufferView buffer;                       // the whole view is moved
  uint64_t offset_bytes = 0;               // address in the tier
  Priority priority = Priority::kNormal;   // kUrgent is taken before every queued kNormal
  // Device buffers only: when set, the copy out of (write) or into (read) the buffer starts after
  // the work queued on this stream at submit time (an event is recorded on it, nothing waits on
  // the CPU). For a write, the buffer's contents are final then; for a read, kernels still using
  // the memory before it was handed to the request are done. When null, the caller guarantees
  // both at submit.
  CudaStream ready_stream = nullptr;
  // Note [Reads after their write]: when valid (a write of the same bytes, still running), the
  // request moves its bytes only once `after` has put its own in the tier, and fails with ENODATA
  // (lost(): nothing can be read back) when `after` failed. The host tier orders a read into a
  // device buffer after one of its own device writes on the GPU (the read's copy waits for the
  // write's event; no CPU waits); otherwise its workers wait for `after` before the copy, and the
  // file tiers wait for it in submit().
  Completion after;
};

// ---------------------------------------------------------------------------------------------
// Tiers.

enum class ShutdownMode {
  kDrain,   // complete every queued request, then stop (the destructor's mode)
  kCancel,  // fail every request not yet started with ECANCELED; in-flight ones finish
};

struct TierInfo {
  std::string name;              // "host", "file", "file-sync", "fault(file)"
  std::string engine;            // "memcpy", "io_uring", "threads", "sync", "cufile"
  std::vector<std::string> notes;  // fallbacks taken and why (e.g. "O_DIRECT refused on /dev/shm")
  uint64_t capacity_bytes = 0;
  std::vector<std::string> files;  // file tiers: the backing file of each path, in stripe order
  // File tiers: some path goes through the page cache (O_DIRECT off or refused, or the sync
  // reference), so what it moves may never reach the disk and reads may come from memory.
  bool buffered_io = false;
};

// A storage tier. submit() is thread-safe and never blocks on I/O (it may block briefly for a
// lock). A request's buffer must stay valid until its completion is ready. Requests that overlap
// in the tier are not ordered with respect to each other. Errors in a request (bad range, refused
// device buffer, closed tier) throw teraio::Error from submit(); I/O failures are reported in the
// IoResult, never thrown from a worker and never printed.
// What a tier's own copies took, summed since it was made, per direction: the bytes and time of
// its timed transfers (IoResult::transfer_us) of at least kTimedTransferMinBytes (smaller ones wait
// on latency more than on the link; HostTierOptions::timed_min_bytes). Note [The link's rate in use] in src/storage/host_tier.cpp.
struct TransferTimes {
  uint64_t read_bytes = 0, write_bytes = 0;
  double read_us = 0, write_us = 0;
  // GB/s (1e9 bytes/s) over the timed transfers; 0 when none was timed.
  double read_gbps() const { return read_us > 0 ? static_cast<double>(read_bytes) / read_us / 1e3 : 0; }
  double write_gbps() const { return write_us > 0 ? static_cast<double>(write_bytes) / write_us / 1e3 : 0; }
  // What was timed after `base` (an earlier reading of the same tier).
  TransferTimes since(const TransferTimes& base) const {
    return {read_bytes - base.read_bytes, write_bytes - base.write_bytes, read_us - base.read_us,
            write_us - base.write_us};
  }
};
inline constexpr uint64_t kTimedTransferMinBytes = 1 << 20;

class Tier {
 public:
  virtual ~Tier() = default;
  virtual Completion submit(const IoRequest& request) = 0;
  virtual void shutdown(ShutdownMode mode) = 0;  // idempotent; submit() afterwards throws
  virtual TierInfo info() const = 0;
  // Thread-safe; all zero for a tier that does not time its copies (file tiers today).
  virtual TransferTimes transfer_times() const { return {}; }
  uint64_t capacity_bytes() const { return info().capacity_bytes; }

  // Convenience: submit and wait, throwing on failure.
  void write(BufferView buffer, uint64_t offset_bytes);
  void read(BufferView buffer, uint64_t offset_bytes);
};

// Pinned host arena with a hard byte cap, allocated once at creation.
struct HostTierOptions {
  uint64_t capacity_bytes = 0;   // required; the arena is allocated (and pinned) up front
  bool pin = true;               // cudaHostAlloc when a GPU is present; plain memory otherwise
  int worker_threads = 2;        // copy threads per direction (each with its own CUDA streams)
  bool checksums = false;        // checksum per written extent, verified on read of the same extent
  uint64_t timed_min_bytes = kTimedTransferMinBytes;  // transfer_times() counts copies this large
};
std::unique_ptr<Tier> make_host_tier(const HostTierOptions& options);

enum class FileEngine { kAuto, kIoUring, kThreads };
enum class GdsMode { kOff, kOn, kAuto };
std::string_view to_string(GdsMode mode);
GdsMode parse_gds_mode(std::string_view text);  // "on", "off", "auto"

struct FileTierOptions {
  std::vector<std::string> paths;      // one directory per SSD; required
  uint64_t capacity_bytes = 0;         // total over all paths; required; fallocated at creation
  uint64_t stripe_bytes = 1 << 20;     // striping unit and bounce-buffer size; multiple of 4 KiB
  int queue_depth = 8;                 // in-flight chunks (and bounce buffers) per path
  FileEngine engine = FileEngine::kAuto;  // kAuto: io_uring, else threads (reason in notes)
  bool direct_io = true;               // O_DIRECT when the filesystem accepts it
  bool checksums = false;              // checksum (XXH3) per chunk written, verified on read
  GdsMode gds = GdsMode::kOff;         // cuFile for device buffers (kAuto probes, then falls back)
  std::string job_name = "teraio";     // files go to <path>/<job_name>-<pid>-<n>/stripe.dat
};
// Creates the tier. First removes, from each path, the <job_name>-* tier directories whose process
// is gone (clean_tier_dirs; one line per directory in info().notes), then makes its own directory,
// locked for the tier's life (Note [Tier directory locks] in tier_dirs.cpp).
std::unique_ptr<Tier> make_file_tier(const FileTierOptions& options);

// The reference: synchronous buffered pread/pwrite in the caller's thread, same striped layout.
// submit() completes the request before returning. Used as the test oracle.
std::unique_ptr<Tier> make_sync_file_tier(const FileTierOptions& options);

// Fault injection (tests, and users rehearsing their recovery): wraps a tier and fails, shortens or
// delays chosen requests. Rules can be given at creation or added while the tier runs.
enum class FaultKind {
  kNone,
  kEio,         // the request fails with EIO
  kEnospc,      // ... with ENOSPC
  kShortRead,   // half the bytes move, then the request fails (EIO, "short read")
  kShortWrite,  // the same for writes
  kSlow,        // completes delay_us late
  kError,       // fails with error_code (EPERM for a read-only file, EBADMSG, ENODATA, ...)
};
struct FaultRule {
  FaultKind kind = FaultKind::kNone;
  // Counted over the requests the rule applies to (its direction, or all), from when it was added:
  uint64_t nth_request = 0;     // applies to the nth such request (0-based) ...
  uint64_t count = 1;           // ... and the count-1 following ones
  uint64_t delay_us = 0;        // kSlow: extra latency before the completion is reported
  std::optional<Direction> direction;  // only reads or only writes; unset: both
  int error_code = 0;           // kError: the errno value reported
};
struct FaultOptions {
  std::vector<FaultRule> rules;  // empty: pass-through
};
class FaultTier : public Tier {
 public:
  // Adds a rule (thread-safe; applies to requests submitted from now on). When several rules
  // apply to one request, the one added last wins.
  virtual void inject(const FaultRule& rule) = 0;
  virtual void clear_faults() = 0;  // removes every rule: the tier passes everything through
};
std::unique_ptr<FaultTier> make_fault_tier(std::unique_ptr<Tier> inner, FaultOptions options);

// ---------------------------------------------------------------------------------------------
// Extents of a tier's address space.

struct Extent {
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;  // rounded up to the alignment
};

// First-fit allocator with coalescing of freed neighbours. Not thread-safe (one owner).
class ExtentAllocator {
 public:
  explicit ExtentAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes = 4096);
  // Throws teraio::Error naming the request and the free space when it does not fit.
  Extent allocate(uint64_t size_bytes);
  std::optional<Extent> try_allocate(uint64_t size_bytes);
  void free(Extent extent);  // throws teraio::Error on a double or foreign free
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free_bytes() const;
  uint64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  uint64_t capacity_bytes_;
  uint64_t alignment_bytes_;
  uint64_t free_bytes_;
  std::vector<Extent> free_;  // sorted by offset, never adjacent
};

// ---------------------------------------------------------------------------------------------
// Bandwidth (src/storage/bandwidth.cpp; docs/storage.md, "Bandwidth probe"): what a tier moves,
// measured through its own submit() path, so bounce buffers, O_DIRECT, io_uring and pinned copies
// are what is measured. Shared by the Session (tiers without a given bandwidth) and iobench.

struct Spread {
  double median = 0, min = 0, max = 0;
  double upper = 0;  // the upper quartile (75th percentile, interpolated between the values)
};
Spread spread(std::vector<double> values);  // all 0 when empty

// One pass over tier bytes [offset_bytes, offset_bytes + size_bytes) in requests of
// request_bytes, `window` of them in flight; request i uses slot i % window of the scratch buffer
// (window * request_bytes bytes at most).
struct PassOptions {
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
  uint64_t request_bytes = 4 << 20;
  int window = 8;
  CudaStream ready_stream = nullptr;  // passed to every request (device scratch)
  // No request is submitted after this time (those in flight finish): the pass is then shorter
  // and PassResult::cut says so. Unset: no limit.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Optional, inside the timing (iobench --verify): called before a write's submit with its slot
  // and tier offset, and after a read completed.
  std::function<void(BufferView slot, uint64_t tier_offset)> before_write;
  std::function<void(BufferView slot, uint64_t tier_offset)> after_read;
};
struct PassResult {
  uint64_t bytes = 0;   // moved (size_bytes unless cut)
  double seconds = 0;
  bool cut = false;     // stopped at the deadline
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};
// Waits for every request it submitted, then throws teraio::Error with the first failing request's
// message (tier, file, offset, size) when one failed.
PassResult run_pass(Tier& tier, Direction direction, BufferView scratch, const PassOptions& options);

struct BandwidthProbeOptions {
  uint64_t request_bytes = 16 << 20;  // bytes per request (tensors are moved one request each)
  int queue_depth = 4;                // requests in flight (limited by the scratch buffer)
  int repetitions = 3;                // timed passes per direction (median, min, max)
  double time_limit_s = 1.5;          // the probe submits nothing after this (see probe_bandwidth)
  // Also time reads and writes at once (BandwidthProbe::both_gbps): the last quarter of the time.
  bool both_ways = true;
  // Device scratch: work queued on this stream before the probe (kernels that used the memory
  // before it was handed over) finishes before the tier's copies touch it. nullptr: none.
  CudaStream ready_stream = nullptr;
};

struct BandwidthProbe {
  std::string tier;    // TierInfo::name
  std::string engine;  // TierInfo::engine
  std::string memory;  // the scratch's kind: "device", "pinned" or "host" (pageable)
  Spread write_gbps;   // buffer -> tier (offload), GB/s = 1e9 bytes/s
  Spread read_gbps;    // tier -> buffer (prefetch)
  int write_passes = 0, read_passes = 0;  // timed passes behind each spread
  // Per direction while reads and writes run at once (both_ways; 0 and no passes when it did not
  // run: the option was off, or the scratch holds a single request).
  Spread both_gbps;
  int both_passes = 0;
  uint64_t pass_bytes = 0;                // bytes of the tier each write pass covers
  uint64_t request_bytes = 0;
  int queue_depth = 0;
  double elapsed_s = 0;  // wall time of the whole probe, warm-up included
  bool cut = false;      // the time limit shortened it (fewer or partial passes)
  bool page_cache = false;  // TierInfo::buffered_io: the numbers are the page cache's, not the disk's
  std::vector<std::string> notes;  // the two flags above, in words
};

// Measures `tier` by writing and reading tier bytes [offset_bytes, offset_bytes + size_bytes) from
// and into `scratch` (use the memory tensors live in: device memory on a GPU, the allocator's host
// memory on CPU). Only that range of the tier and the scratch buffer are written; their previous
// contents are lost, nothing else is touched. Order: one untimed warm-up write pass (within the
// first quarter of time_limit_s; the timed passes cover what it wrote), timed write passes (until
// half of it), then timed read passes of what was written (until the end, or until three quarters
// of it with both_ways), then passes that read the first half of the range while writing the
// second, requests of the two directions alternating in the scratch's slots (until the end). A pass is not started
// when the previous one of its direction says it would not finish in time, and stops submitting at
// its direction's limit; at least one timed pass per direction runs (at least one request). The
// whole probe takes at most time_limit_s plus the requests in flight at each limit.
// Throws teraio::Error naming the tier when a request fails (never a number for a failing tier) or
// when the range is outside the tier or the scratch is under 4 KiB. Not thread-safe with other
// users of that range of the tier.
BandwidthProbe probe_bandwidth(Tier& tier, BufferView scratch, uint64_t offset_bytes,
                               uint64_t size_bytes, const BandwidthProbeOptions& options = {});

// The quick probe: what a Session measures for a tier whose bandwidth was not given, and what
// `teraio iobench --quick` runs. kQuickProbeScratchBytes of scratch (less when the budget is
// small: the requests shrink), the first min(kQuickProbeTierBytes, capacity) bytes of the tier,
// the default options with a time limit of 0.5 s for a host tier and 1.5 s for others.
inline constexpr uint64_t kQuickProbeScratchBytes = 64ull << 20;
inline constexpr uint64_t kQuickProbeTierBytes = 256ull << 20;
// Timed passes per direction of the quick probe of a host tier (engine "memcpy"), within its time limit (Note [A
// probe caught in a slow moment] in src/storage/bandwidth.cpp); other tiers take the default 3.
inline constexpr int kQuickProbeHostPasses = 15;
BandwidthProbeOptions quick_probe_options(const TierInfo& info);
// The figure a Session plans with from a quick probe's passes of `info`'s tier: their upper
// quartile for a host tier (engine "memcpy"), their median for others (Note [A probe caught in a
// slow moment]); planned_statistic names which.
double planned_gbps(const Spread& passes, const TierInfo& info);
std::string_view planned_statistic(const TierInfo& info);

// ---------------------------------------------------------------------------------------------
// Integrity and cleanup.

// XXH3-64 of the bytes: the tiers' integrity check (HostTierOptions/FileTierOptions::checksums).
uint64_t checksum(const void* data, uint64_t size_bytes);

// Process-wide registry of files and directories to remove at exit and on SIGINT/SIGTERM (the
// handler removes them, restores the previous action and re-raises). Thread-safe; the signal
// handler is async-signal-safe. Holds at most 1024 paths of up to 4095 bytes.
void cleanup_register(const std::string& path);
void cleanup_unregister(const std::string& path);  // after the owner removed it itself
void cleanup_run_now();                             // removes everything registered

// Stale tier directories (docs/storage.md, "Stale tier directories"): a file tier's directory
// <path>/<job>-<pid>-<n>/ holds `lock`, flock'ed while the tier lives, and stripe.dat. A process
// killed with SIGKILL leaves it, holding its whole reservation; clean_tier_dirs finds such
// directories (the lock can be taken: its owner is gone) and removes their files and themselves.
// A directory whose lock is held is never touched; a directory holding anything teraio did not put
// there is left alone; symbolic links are never followed.
enum class TierDirState {
  kRemoved,  // its owner was gone; files and directory removed
  kStale,    // its owner is gone; left in place because of dry_run
  kInUse,    // its owner is alive (lock held, or, without a lock file, its pid runs)
  kKept,     // left in place for `reason` (foreign files, a failed removal, no locking)
};
std::string_view to_string(TierDirState state);
struct TierDirReport {
  std::string path;
  TierDirState state = TierDirState::kKept;
  uint64_t bytes = 0;  // disk space its files take (freed when kRemoved, freeable when kStale)
  std::string reason;  // for kKept and kInUse: why, in a few words
};
struct CleanTierDirsOptions {
  std::string job_name;  // only <job_name>-<pid>-<n>; empty: every tier directory
  bool dry_run = false;  // report, remove nothing
};
// Scans `root` (not recursively) for tier directories. Throws teraio::Error when `root` is not a
// readable directory; problems with single directories are reported as kKept. Reports nothing for
// entries that are not tier directories. Thread-safe.
std::vector<TierDirReport> clean_tier_dirs(const std::string& root,
                                           const CleanTierDirsOptions& options);

// ---------------------------------------------------------------------------------------------
// GPUDirect Storage (cuFile, loaded with dlopen).

struct GdsProbe {
  bool library_loaded = false;   // libcufile.so.0 found
  bool driver_opened = false;    // cuFileDriverOpen succeeded
  bool handle_registered = false;
  bool io_ok = false;            // a 4 KiB write + read through cuFile matched
  bool usable = false;           // all of the above
  int error_code = 0;            // the numeric cuFile error of the failing step (e.g. 5027)
  std::string step;              // the failing step ("dlopen", "cuFileHandleRegister", ...)
  std::string reason;            // one line: why GDS is or is not used
};
// Probes cuFile on a directory: loads the library, opens the driver, registers a handle on a
// temporary O_DIRECT file there, writes and reads 4 KiB from a device buffer. Never throws.
GdsProbe probe_gds(const std::string& directory);

// Whether O_DIRECT open works in `directory` (tmpfs refuses it), with the reason when not.
struct DirectIoProbe {
  bool supported = false;
  std::string reason;
};
DirectIoProbe probe_direct_io(const std::string& directory);

// Whether io_uring can be initialised in this process (sandboxes often forbid it).
struct IoUringProbe {
  bool supported = false;
  std::string reason;
};
IoUringProbe probe_io_uring();

}  // namespace teraio::storage
