// The file tier: a byte space striped over one file per path (one path per SSD, no RAID), reserved
// with fallocate in a private per-job directory. Each path has its own priority queue and engine:
// io_uring with registered pinned bounce buffers, or a pool of pread/pwrite threads; device buffers
// pass through the bounce ring (or cuFile when GDS is usable). The synchronous engine is the
// oracle.
#include <fcntl.h>
#ifdef TERAIO_HAVE_LIBURING
#include <liburing.h>
#endif
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "cuda_rt.h"
#include "cufile_shim.h"
#include "internal.h"
#include "teraio/error.h"
#include "teraio/units.h"

namespace teraio::storage {
namespace {

constexpr uint64_t kBlock = 4096;
constexpr int kMaxRetries = 16;

uint64_t round_down(uint64_t x) {
  return x / kBlock * kBlock;
}
uint64_t round_up(uint64_t x) {
  return (x + kBlock - 1) / kBlock * kBlock;
}

// A piece of a request that lies within one stripe (so within one file and one bounce buffer).
struct Piece {
  int path = 0;
  uint64_t file_offset = 0;
  uint64_t tier_offset = 0;
  uint64_t size = 0;
  uint64_t buf_offset = 0;
};

std::vector<Piece> split(uint64_t stripe, int paths, uint64_t offset, uint64_t size) {
  std::vector<Piece> out;
  uint64_t done = 0;
  while (done < size) {
    uint64_t t = offset + done;
    uint64_t s = t / stripe;
    uint64_t within = t % stripe;
    uint64_t n = std::min(stripe - within, size - done);
    out.push_back(Piece{static_cast<int>(s % static_cast<uint64_t>(paths)),
                        (s / static_cast<uint64_t>(paths)) * stripe + within, t, n, done});
    done += n;
  }
  return out;
}

struct PathFiles {
  std::string dir;
  std::string lock_file;
  int lock_fd = -1;      // flock'ed while the tier lives (Note [Tier directory locks])
  std::string file;
  int fd_direct = -1;    // O_DIRECT, when the filesystem accepts it
  int fd_buffered = -1;  // always
  bool direct = false;
};

// One contiguous file I/O of a chunk.
struct Segment {
  int fd = -1;
  std::byte* ptr = nullptr;
  uint64_t len = 0;
  uint64_t off = 0;
};

struct ChunkPlan {
  Segment seg[3];
  int n = 0;
  std::byte* stage = nullptr;  // host copy of the piece's data (user memory or bounce)
  bool use_bounce = false;
};

// Note [Bounce buffer use]: the piece's data is staged at bounce + file_offset % 4096, so the
// 4 KiB-aligned body of the piece is at an aligned address in the bounce buffer and can go through
// O_DIRECT; the unaligned head and tail go through the buffered descriptor (the kernel keeps the
// page cache coherent with direct I/O for non-overlapping requests). Host buffers whose body is
// already aligned skip the bounce entirely.
ChunkPlan plan_chunk(const PathFiles& pf, const Piece& p, const BufferView& buf,
                     std::byte* bounce) {
  ChunkPlan c;
  std::byte* user = buf.bytes() + p.buf_offset;
  uint64_t end = p.file_offset + p.size;
  uint64_t body_start = round_up(p.file_offset), body_end = round_down(end);
  bool has_body = pf.direct && body_start < body_end;
  c.use_bounce =
      buf.is_device() ||
      (has_body && reinterpret_cast<uintptr_t>(user + (body_start - p.file_offset)) % kBlock != 0);
  c.stage = c.use_bounce ? bounce + p.file_offset % kBlock : user;
  auto add = [&](int fd, uint64_t from, uint64_t to) {
    if (from < to) c.seg[c.n++] = Segment{fd, c.stage + (from - p.file_offset), to - from, from};
  };
  if (has_body) {
    add(pf.fd_buffered, p.file_offset, body_start);
    add(pf.fd_direct, body_start, body_end);
    add(pf.fd_buffered, body_end, end);
  } else {
    add(pf.fd_buffered, p.file_offset, end);
  }
  return c;
}

// Synchronous pread/pwrite of a whole segment: retries EINTR/EAGAIN and continues after short
// transfers. Returns 0 or an errno value (a read that meets the end of the file: ENODATA with `eof`
// set, Note [Lost bytes]; a write that makes no progress: EIO).
int full_io(const Segment& s, bool write, bool* eof) {
  uint64_t done = 0;
  int retries = 0;
  while (done < s.len) {
    ssize_t n = write ? ::pwrite(s.fd, s.ptr + done, s.len - done, static_cast<off_t>(s.off + done))
                      : ::pread(s.fd, s.ptr + done, s.len - done, static_cast<off_t>(s.off + done));
    if (n < 0) {
      if ((errno == EINTR || errno == EAGAIN) && ++retries < kMaxRetries) continue;
      return errno;
    }
    if (n == 0) {
      *eof = true;
      return write ? EIO : ENODATA;
    }
    done += static_cast<uint64_t>(n);
  }
  return 0;
}

// State of one request split into chunks.
struct ReqCtx {
  IoRequest req;
  std::shared_ptr<detail::CompletionState> state;
  std::atomic<uint64_t> remaining{0};
  std::mutex mu;
  bool failed = false;
  IoResult first_error;
  void* ready_event = nullptr;  // owned
  void* h2d_stream = nullptr;   // the tier's stream for the buffer's device (reads)
  bool used_h2d = false;
  ~ReqCtx() { cuda::event_destroy(ready_event); }
};

struct Chunk {
  std::shared_ptr<ReqCtx> ctx;
  Piece piece;
};

class FileTier;

struct PathState {
  PathFiles files;
  PriorityQueue<Chunk> queue;
  std::vector<std::byte*> bounce;  // queue_depth buffers of stripe_bytes
  bool bounce_pinned = false;
  std::vector<std::thread> threads;
  cufile::Handle gds_handle = nullptr;
};

enum class Engine { kSync, kThreads, kIoUring };

class FileTier final : public Tier {
 public:
  FileTier(const FileTierOptions& o, bool sync) : o_(o) {
    TERAIO_CHECK(!o.paths.empty(), "file tier: at least one path is required");
    TERAIO_CHECK(o.capacity_bytes > 0, "file tier: capacity_bytes must be > 0");
    TERAIO_CHECK(o.stripe_bytes >= kBlock && o.stripe_bytes % kBlock == 0,
                 "file tier: stripe_bytes {} must be a positive multiple of 4096", o.stripe_bytes);
    TERAIO_CHECK(o.queue_depth >= 1 && o.queue_depth <= 1024,
                 "file tier: queue_depth {} must be in [1, 1024]", o.queue_depth);
    int np = static_cast<int>(o.paths.size());
    uint64_t row = o.stripe_bytes * static_cast<uint64_t>(np);
    per_path_bytes_ = (o.capacity_bytes + row - 1) / row * o.stripe_bytes;
    try {
      for (int i = 0; i < np; ++i) {
        paths_.push_back(std::make_unique<PathState>());
        open_path(*paths_.back(), o.paths[static_cast<size_t>(i)], sync);
      }
      choose_engine(sync);
      for (auto& ps : paths_) {
        int nbounce = engine_ == Engine::kSync ? 1 : o.queue_depth;
        for (int b = 0; b < nbounce; ++b) {
          if (cuda::device_count() > 0) {
            ps->bounce.push_back(static_cast<std::byte*>(cuda::host_alloc(o.stripe_bytes)));
            ps->bounce_pinned = true;
          } else {
            ps->bounce.push_back(static_cast<std::byte*>(
                aligned_host_alloc(o.stripe_bytes, "file tier bounce buffer")));
          }
        }
      }
      for (auto& ps : paths_) start_engine(*ps);
    } catch (...) {
      stop_and_close();
      throw;
    }
  }

  ~FileTier() override { stop_and_close(); }

  Completion submit(const IoRequest& r) override {
    uint64_t size = r.buffer.size_bytes();
    TERAIO_CHECK(r.offset_bytes <= o_.capacity_bytes && size <= o_.capacity_bytes - r.offset_bytes,
                 "file tier: {} of {} bytes at offset {} is beyond the tier's capacity of {} bytes",
                 to_string(r.direction), size, r.offset_bytes, o_.capacity_bytes);
    TERAIO_CHECK(!closed_.load(), "file tier: submit after shutdown");
    if (r.buffer.is_device()) cuda::require_device(r.buffer.device(), "file tier");
    auto ctx = std::make_shared<ReqCtx>();
    ctx->req = r;
    ctx->state = std::make_shared<detail::CompletionState>();
    Completion completion(ctx->state);
    if (r.buffer.is_device()) {
      ctx->state->event = cuda::event_create(r.buffer.device());
      if (r.ready_stream != nullptr) {
        ctx->ready_event = cuda::event_create(r.buffer.device());
        cuda::event_record(ctx->ready_event, r.ready_stream);
      }
      if (r.direction == Direction::kRead) ctx->h2d_stream = h2d_stream(r.buffer.device());
    }
    auto pieces = split(o_.stripe_bytes, static_cast<int>(paths_.size()), r.offset_bytes, size);
    if (pieces.empty()) {
      ctx->state->finish(IoResult{});
      return completion;
    }
    ctx->remaining.store(pieces.size());
    if (engine_ == Engine::kSync) {
      std::lock_guard lock(sync_mu_);
      for (const auto& p : pieces) {
        PathState& ps = *paths_[static_cast<size_t>(p.path)];
        run_chunk_blocking(ps, Chunk{ctx, p}, ps.bounce[0], sync_d2h_, sync_h2d_event_);
      }
      return completion;
    }
    for (const auto& p : pieces) {
      if (!paths_[static_cast<size_t>(p.path)]->queue.push(Chunk{ctx, p}, r.priority)) {
        chunk_done(ctx, failure(ECANCELED, "file tier: submit raced with shutdown"), p);
      }
    }
    return completion;
  }

  void shutdown(ShutdownMode mode) override {
    std::lock_guard lock(shutdown_mu_);
    closed_.store(true);
    for (auto& ps : paths_) {
      if (mode == ShutdownMode::kCancel) {
        for (auto& c : ps->queue.take_all()) {
          chunk_done(c.ctx,
                     failure(ECANCELED,
                             fmt::format("file tier: {} at tier offset {} cancelled by shutdown",
                                         to_string(c.ctx->req.direction), c.ctx->req.offset_bytes)),
                     c.piece);
        }
      }
      ps->queue.close();
    }
    for (auto& ps : paths_) {
      for (auto& t : ps->threads) {
        if (t.joinable()) t.join();
      }
      ps->threads.clear();
    }
  }

  TierInfo info() const override {
    const char* e = engine_ == Engine::kSync      ? "sync"
                    : engine_ == Engine::kIoUring ? "io_uring"
                                                  : "threads";
    TierInfo i{engine_ == Engine::kSync ? "file-sync" : "file",
               gds_ ? std::string(e) + "+cufile" : e,
               notes_,
               o_.capacity_bytes,
               {}};
    for (const auto& ps : paths_) {
      i.files.push_back(ps->files.file);
      i.buffered_io = i.buffered_io || !ps->files.direct;
    }
    return i;
  }

 private:
  void open_path(PathState& ps, const std::string& root, bool sync) {
    struct stat st;
    TERAIO_CHECK(::stat(root.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
                 "file tier: path {} is not a directory ({})", root, std::strerror(errno));
    remove_stale_dirs(root);
    PathFiles& f = ps.files;
    LockedTierDir locked = create_locked_tier_dir(root, o_.job_name);
    f.dir = locked.dir;
    f.lock_file = locked.lock_file;
    f.lock_fd = locked.lock_fd;
    cleanup_register(f.dir);
    cleanup_register(f.lock_file);
    if (!locked.note.empty()) notes_.push_back(locked.note);
    f.file = f.dir + "/stripe.dat";
    f.fd_buffered = ::open(f.file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    TERAIO_CHECK(f.fd_buffered >= 0, "file tier: cannot create {}: {}", f.file,
                 std::strerror(errno));
    cleanup_register(f.file);
    (void)::fchmod(f.fd_buffered, 0600);  // independent of the umask
    int rc = ::fallocate(f.fd_buffered, 0, 0, static_cast<off_t>(per_path_bytes_));
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
      notes_.push_back(
          fmt::format("{}: fallocate unsupported; space not reserved in advance", root));
      rc = ::ftruncate(f.fd_buffered, static_cast<off_t>(per_path_bytes_));
    }
    if (rc != 0) {
      int e = errno;
      struct statvfs vfs;
      uint64_t avail =
          ::statvfs(root.c_str(), &vfs) == 0 ? uint64_t(vfs.f_bavail) * vfs.f_frsize : 0;
      throw teraio::Error(
          fmt::format("file tier: cannot reserve {} ({} bytes) in {}: {} ({} available)",
                      format_bytes(static_cast<double>(per_path_bytes_)), per_path_bytes_, root,
                      std::strerror(e), format_bytes(static_cast<double>(avail))));
    }
    if (o_.direct_io && !sync) {
      f.fd_direct = ::open(f.file.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
      if (f.fd_direct >= 0) {
        auto probe = probe_direct_io(f.dir);
        if (!probe.supported) {
          ::close(f.fd_direct);
          f.fd_direct = -1;
          notes_.push_back(root + ": " + probe.reason);
        }
      } else {
        notes_.push_back(fmt::format("{}: O_DIRECT refused ({}); buffered I/O used", root,
                                     std::strerror(errno)));
      }
      f.direct = f.fd_direct >= 0;
    }
  }

  // The directories of this job under `root` whose process is gone (docs/storage.md, "Stale tier
  // directories"): removed, one note each; a failure to scan is a note too, never an error.
  void remove_stale_dirs(const std::string& root) {
    try {
      for (const TierDirReport& r : clean_tier_dirs(root, {o_.job_name, false})) {
        if (r.state == TierDirState::kRemoved) {
          notes_.push_back(fmt::format("removed stale tier directory {} ({} freed; its process is gone)",
                                       r.path, format_bytes(static_cast<double>(r.bytes))));
        } else if (r.state == TierDirState::kKept) {
          notes_.push_back(fmt::format("left stale tier directory {}: {}", r.path, r.reason));
        }
      }
    } catch (const teraio::Error& e) {
      notes_.push_back(fmt::format("cannot look for stale tier directories: {}", e.what()));
    }
  }

  void choose_engine(bool sync) {
    if (sync) {
      engine_ = Engine::kSync;
      return;
    }
    if (o_.gds != GdsMode::kOff) {
      for (auto& ps : paths_) {
        auto p = probe_gds(ps->files.dir);
        if (!p.usable) {
          TERAIO_CHECK(o_.gds != GdsMode::kOn,
                       "file tier: GDS mode on, but cuFile is unusable on {}: {}", ps->files.dir,
                       p.reason);
          notes_.push_back("GDS: " + p.reason);
          gds_ = false;
          break;
        }
        gds_ = true;
      }
      if (gds_) {
        for (auto& ps : paths_) {
          TERAIO_CHECK(ps->files.fd_direct >= 0, "file tier: GDS needs O_DIRECT on {}",
                       ps->files.dir);
          cufile::Descr d{};
          d.type = cufile::kHandleTypeOpaqueFd;
          d.handle.fd = ps->files.fd_direct;
          auto e = cufile::api().handle_register(&ps->gds_handle, &d);
          if (e.err != 0) {
            TERAIO_CHECK(o_.gds != GdsMode::kOn,
                         "file tier: cuFileHandleRegister on {} failed with cuFile error {}",
                         ps->files.file, e.err);
            notes_.push_back(fmt::format(
                "GDS: cuFileHandleRegister on {} failed with cuFile error {}; POSIX path used",
                ps->files.file, e.err));
            ps->gds_handle = nullptr;
            gds_ = false;
          }
        }
        if (gds_)
          notes_.push_back(
              "GDS: device buffers use cuFile (thread engine: cuFile calls are synchronous)");
      }
    }
    if (gds_ || o_.engine == FileEngine::kThreads) {
      engine_ = Engine::kThreads;
      return;
    }
    auto probe = probe_io_uring();
    if (probe.supported) {
      engine_ = Engine::kIoUring;
      return;
    }
    TERAIO_CHECK(o_.engine != FileEngine::kIoUring,
                 "file tier: io_uring requested but unavailable: {}", probe.reason);
    notes_.push_back("io_uring unavailable (" + probe.reason + "); thread-pool pread/pwrite used");
    engine_ = Engine::kThreads;
  }

  void start_engine(PathState& ps) {
    if (engine_ == Engine::kSync) return;
    if (engine_ == Engine::kThreads) {
      for (int i = 0; i < o_.queue_depth; ++i) {
        ps.threads.emplace_back(
            [this, &ps, i] { thread_loop(ps, ps.bounce[static_cast<size_t>(i)]); });
      }
    } else {
      ps.threads.emplace_back([this, &ps] { uring_loop(ps); });
    }
  }

  void stop_and_close() {
    shutdown(ShutdownMode::kDrain);
    for (auto& ps : paths_) {
      if (ps->gds_handle != nullptr) cufile::api().handle_deregister(ps->gds_handle);
      for (auto* b : ps->bounce) {
        if (ps->bounce_pinned) {
          cuda::free_host(b);
        } else {
          std::free(b);
        }
      }
      ps->bounce.clear();
      PathFiles& f = ps->files;
      if (f.fd_direct >= 0) ::close(f.fd_direct);
      if (f.fd_buffered >= 0) ::close(f.fd_buffered);
      f.fd_direct = f.fd_buffered = -1;
      if (!f.file.empty()) {
        ::unlink(f.file.c_str());
        cleanup_unregister(f.file);
      }
      if (!f.lock_file.empty()) {
        ::unlink(f.lock_file.c_str());
        cleanup_unregister(f.lock_file);
      }
      if (!f.dir.empty()) {
        ::rmdir(f.dir.c_str());
        cleanup_unregister(f.dir);
      }
      if (f.lock_fd >= 0) ::close(f.lock_fd);  // last: the directory is gone while we hold it
      f.lock_fd = -1;
    }
    for (auto& [dev, s] : h2d_streams_) cuda::stream_destroy(s);
    h2d_streams_.clear();
    cuda::stream_destroy(sync_d2h_);
    cuda::event_destroy(sync_h2d_event_);
    sync_d2h_ = sync_h2d_event_ = nullptr;
  }

  void* h2d_stream(int device) {
    std::lock_guard lock(streams_mu_);
    void*& s = h2d_streams_[device];
    if (s == nullptr) s = cuda::stream_create(device);
    return s;
  }

  std::string describe(const Chunk& c, const PathState& ps, uint64_t file_off, uint64_t len) const {
    return fmt::format("file tier: {} of {} bytes at offset {} of {} (tier offset {})",
                       to_string(c.ctx->req.direction), len, file_off, ps.files.file,
                       c.piece.tier_offset);
  }

  // Called once per piece; the last one completes the request (Note [Completion states]).
  void chunk_done(const std::shared_ptr<ReqCtx>& ctx, IoResult r, const Piece&) {
    if (!r.ok) {
      std::lock_guard lock(ctx->mu);
      if (!ctx->failed) {
        ctx->failed = true;
        ctx->first_error = std::move(r);
      }
    }
    if (ctx->remaining.fetch_sub(1) != 1) return;
    IoResult final;
    bool failed;
    {
      std::lock_guard lock(ctx->mu);
      failed = ctx->failed;
      if (failed) final = ctx->first_error;
    }
    if (!failed) {
      final.bytes = ctx->req.buffer.size_bytes();
      if (ctx->h2d_stream != nullptr) {
        try {
          cuda::event_record(ctx->state->event, ctx->h2d_stream);
          ctx->state->publish_event();
          cuda::event_sync(ctx->state->event);
        } catch (const std::exception& e) {
          final = failure(
              EIO, fmt::format("file tier: read of {} bytes at tier offset {}: {}",
                               ctx->req.buffer.size_bytes(), ctx->req.offset_bytes, e.what()));
        }
      }
    }
    ctx->state->finish(std::move(final));
  }

  // Before the file write: stage the data on the host (and record its checksum unless the caller
  // does it while the write runs: record_checksum).
  void prepare_write(const Chunk& c, const ChunkPlan& plan, void*& d2h_stream,
                     bool checksum_now = true) {
    const BufferView& buf = c.ctx->req.buffer;
    std::byte* user = buf.bytes() + c.piece.buf_offset;
    if (buf.is_device()) {
      cuda::set_device(buf.device());
      if (d2h_stream == nullptr) d2h_stream = cuda::stream_create(buf.device());
      if (c.ctx->ready_event != nullptr) cuda::stream_wait_event(d2h_stream, c.ctx->ready_event);
      cuda::memcpy_async(plan.stage, user, c.piece.size, d2h_stream);
      cuda::stream_sync(d2h_stream);
    } else if (plan.use_bounce) {
      std::memcpy(plan.stage, user, c.piece.size);
    }
    if (checksum_now) record_checksum(c, plan);
  }
  void record_checksum(const Chunk& c, const ChunkPlan& plan) {
    if (o_.checksums)
      crcs_.record(c.piece.tier_offset, c.piece.size, checksum(plan.stage, c.piece.size));
  }

  // After the file read: deliver to the user's buffer and verify. Returns an error or ok.
  // Note [Checksum beside the copy]: a device buffer's host-to-device copy is enqueued first and
  // the checksum computed while it runs (both only read the staged bytes); on a mismatch the copy
  // is waited for and the read fails, so the buffer holds bytes nobody will use (the request
  // failed: the caller never installs them).
  IoResult finish_read(const Chunk& c, const ChunkPlan& plan, void*& h2d_event) {
    const BufferView& buf = c.ctx->req.buffer;
    std::byte* user = buf.bytes() + c.piece.buf_offset;
    if (buf.is_device()) {
      cuda::set_device(buf.device());
      if (h2d_event == nullptr) h2d_event = cuda::event_create(buf.device());
      if (c.ctx->ready_event != nullptr)
        cuda::stream_wait_event(c.ctx->h2d_stream, c.ctx->ready_event);
      cuda::memcpy_async(user, plan.stage, c.piece.size, c.ctx->h2d_stream);
      cuda::event_record(h2d_event, c.ctx->h2d_stream);
    }
    if (o_.checksums) {
      const uint64_t sum = checksum(plan.stage, c.piece.size);
      if (auto expected = crcs_.mismatch(c.piece.tier_offset, c.piece.size, sum)) {
        if (buf.is_device()) cuda::event_sync(h2d_event);  // Note [Copies before completion]
        return checksum_failure(describe(c, *paths_[static_cast<size_t>(c.piece.path)],
                                         c.piece.file_offset, c.piece.size),
                                *expected, sum);
      }
    }
    if (!buf.is_device() && plan.use_bounce) std::memcpy(user, plan.stage, c.piece.size);
    IoResult ok;
    ok.bytes = c.piece.size;
    return ok;
  }

  IoResult gds_chunk(PathState& ps, const Chunk& c) {
    const auto& a = cufile::api();
    const BufferView& buf = c.ctx->req.buffer;
    std::byte* user = buf.bytes() + c.piece.buf_offset;
    bool write = c.ctx->req.direction == Direction::kWrite;
    if (c.ctx->ready_event != nullptr) cuda::event_sync(c.ctx->ready_event);
    uint64_t done = 0;
    while (done < c.piece.size) {
      ssize_t n =
          write ? a.write(ps.gds_handle, user, c.piece.size - done,
                          static_cast<off_t>(c.piece.file_offset + done), static_cast<off_t>(done))
                : a.read(ps.gds_handle, user, c.piece.size - done,
                         static_cast<off_t>(c.piece.file_offset + done), static_cast<off_t>(done));
      if (n <= 0) {
        int code = n == -1 ? errno : static_cast<int>(-n);
        return failure(n == -1 ? errno : EIO,
                       fmt::format("{} failed through cuFile: {} {}",
                                   describe(c, ps, c.piece.file_offset + done, c.piece.size - done),
                                   n == -1 ? "errno" : "cuFile error", code));
      }
      done += static_cast<uint64_t>(n);
    }
    IoResult ok;
    ok.bytes = c.piece.size;
    return ok;
  }

  // The whole piece in the calling thread (sync and thread engines).
  void run_chunk_blocking(PathState& ps, const Chunk& c, std::byte* bounce, void*& d2h_stream,
                          void*& h2d_event) {
    IoResult r;
    bool write = c.ctx->req.direction == Direction::kWrite;
    try {
      if (gds_ && ps.gds_handle != nullptr && c.ctx->req.buffer.is_device()) {
        r = gds_chunk(ps, c);
      } else {
        ChunkPlan plan = plan_chunk(ps.files, c.piece, c.ctx->req.buffer, bounce);
        if (write) prepare_write(c, plan, d2h_stream);
        for (int i = 0; i < plan.n && r.ok; ++i) {
          bool eof = false;
          int e = full_io(plan.seg[i], write, &eof);
          if (e != 0) {
            r = failure(
                e, fmt::format("{} failed: {}", describe(c, ps, plan.seg[i].off, plan.seg[i].len),
                               eof ? (write ? "no progress" : "unexpected end of file")
                                   : std::strerror(e)));
          }
        }
        if (r.ok && !write) r = finish_read(c, plan, h2d_event);
        if (r.ok && write) r.bytes = c.piece.size;
      }
    } catch (const std::exception& e) {
      r = failure(
          EIO, fmt::format("{}: {}", describe(c, ps, c.piece.file_offset, c.piece.size), e.what()));
    }
    // Note [Copies before completion]: a piece's host-to-device copy has finished before the piece
    // counts as done, so when a request completes (failed, too) nothing still writes into the
    // caller's device memory, which it may then free. The bounce buffer is reused only after it.
    if (r.ok && h2d_event != nullptr && !write && c.ctx->req.buffer.is_device()) {
      try {
        cuda::event_sync(h2d_event);
      } catch (const std::exception& e) {
        r = failure(EIO, fmt::format("{}: {}", describe(c, ps, c.piece.file_offset, c.piece.size),
                                     e.what()));
      }
    }
    chunk_done(c.ctx, std::move(r), c.piece);
  }

  void thread_loop(PathState& ps, std::byte* bounce) {
    void* d2h = nullptr;
    void* h2d_event = nullptr;
    while (auto c = ps.queue.pop_wait()) run_chunk_blocking(ps, *c, bounce, d2h, h2d_event);
    cuda::stream_destroy(d2h);
    cuda::event_destroy(h2d_event);
  }

#ifdef TERAIO_HAVE_LIBURING
  // Note [io_uring engine]: one thread per path owns the ring. Slot i (of queue_depth) owns bounce
  // buffer i, registered with the ring, so staged I/O uses the fixed-buffer opcodes. The thread
  // stages a chunk (device-to-host copy), submits its segments, and when all of a chunk's
  // segments completed finishes it (checksum, host-to-device copy). Short transfers are resubmitted
  // for the remainder; EINTR/EAGAIN are retried. While the kernel runs the other slots' I/O, the
  // thread's own copies overlap with it.
  struct Slot {
    bool busy = false;
    Chunk chunk;
    ChunkPlan plan;
    uint64_t seg_done[3] = {0, 0, 0};
    int seg_left = 0;
    int retries = 0;
    IoResult result;
    void* h2d_event = nullptr;
  };

  void uring_loop(PathState& ps) {
    io_uring ring;
    unsigned entries = static_cast<unsigned>(o_.queue_depth) * 4;
    int rc = io_uring_queue_init(entries, &ring, 0);
    if (rc < 0) {  // probed before, so rare: fail every chunk rather than hang
      while (auto c = ps.queue.pop_wait()) {
        chunk_done(c->ctx,
                   failure(-rc, fmt::format("file tier: io_uring_queue_init failed: {}",
                                            std::strerror(-rc))),
                   c->piece);
      }
      return;
    }
    std::vector<iovec> iov;
    for (auto* b : ps.bounce) iov.push_back(iovec{b, o_.stripe_bytes});
    bool fixed =
        io_uring_register_buffers(&ring, iov.data(), static_cast<unsigned>(iov.size())) == 0;
    std::vector<Slot> slots(static_cast<size_t>(o_.queue_depth));
    void* d2h = nullptr;
    int active = 0;

    auto submit_seg = [&](size_t si, int k) {
      Slot& s = slots[si];
      const Segment& g = s.plan.seg[k];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) {
        io_uring_submit(&ring);
        sqe = io_uring_get_sqe(&ring);
      }
      std::byte* p = g.ptr + s.seg_done[k];
      unsigned len = static_cast<unsigned>(g.len - s.seg_done[k]);
      off_t off = static_cast<off_t>(g.off + s.seg_done[k]);
      bool write = s.chunk.ctx->req.direction == Direction::kWrite;
      bool in_bounce = fixed && p >= ps.bounce[si] && p + len <= ps.bounce[si] + o_.stripe_bytes;
      if (in_bounce) {
        if (write) {
          io_uring_prep_write_fixed(sqe, g.fd, p, len, off, static_cast<int>(si));
        } else {
          io_uring_prep_read_fixed(sqe, g.fd, p, len, off, static_cast<int>(si));
        }
      } else if (write) {
        io_uring_prep_write(sqe, g.fd, p, len, static_cast<uint64_t>(off));
      } else {
        io_uring_prep_read(sqe, g.fd, p, len, static_cast<uint64_t>(off));
      }
      io_uring_sqe_set_data64(sqe, (static_cast<uint64_t>(si) << 2) | static_cast<uint64_t>(k));
    };

    auto finish_slot = [&](size_t si) {
      Slot& s = slots[si];
      bool write = s.chunk.ctx->req.direction == Direction::kWrite;
      IoResult r = std::move(s.result);
      if (r.ok) {
        try {
          if (write) {
            r.bytes = s.chunk.piece.size;
          } else {
            r = finish_read(s.chunk, s.plan, s.h2d_event);
          }
        } catch (const std::exception& e) {
          r = failure(
              EIO, fmt::format("{}: {}",
                               describe(s.chunk, ps, s.chunk.piece.file_offset, s.chunk.piece.size),
                               e.what()));
        }
      }
      if (!write && s.chunk.ctx->req.buffer.is_device() && r.ok) {
        try {
          cuda::event_sync(s.h2d_event);  // Note [Copies before completion]
        } catch (const std::exception& e) {
          r = failure(EIO, fmt::format("{}: {}",
                                       describe(s.chunk, ps, s.chunk.piece.file_offset,
                                                s.chunk.piece.size),
                                       e.what()));
        }
      }
      chunk_done(s.chunk.ctx, std::move(r), s.chunk.piece);
      s.chunk = Chunk{};
      s.busy = false;
      --active;
    };

    for (;;) {
      while (active < o_.queue_depth) {
        std::optional<Chunk> c = active == 0 ? ps.queue.pop_wait() : ps.queue.try_pop();
        if (!c) break;
        size_t si = 0;
        while (slots[si].busy) ++si;
        Slot& s = slots[si];
        s.busy = true;
        ++active;
        s.chunk = std::move(*c);
        s.result = IoResult{};
        s.retries = 0;
        try {
          s.plan = plan_chunk(ps.files, s.chunk.piece, s.chunk.ctx->req.buffer, ps.bounce[si]);
          if (s.chunk.ctx->req.direction == Direction::kWrite)
            prepare_write(s.chunk, s.plan, d2h, /*checksum_now=*/false);
        } catch (const std::exception& e) {
          s.result = failure(
              EIO, fmt::format("{}: {}",
                               describe(s.chunk, ps, s.chunk.piece.file_offset, s.chunk.piece.size),
                               e.what()));
          finish_slot(si);
          continue;
        }
        s.seg_left = s.plan.n;
        for (int k = 0; k < s.plan.n; ++k) {
          s.seg_done[k] = 0;
          submit_seg(si, k);
        }
        if (o_.checksums && s.chunk.ctx->req.direction == Direction::kWrite) {
          // The write's checksum while the kernel writes the same staged bytes: it is recorded
          // before this thread completes the chunk (below), so before any read of it can start.
          io_uring_submit(&ring);
          record_checksum(s.chunk, s.plan);
        }
      }
      if (active == 0) break;  // pop_wait returned nothing: the queue is closed and drained
      io_uring_cqe* cqe = nullptr;
      int w = io_uring_submit_and_wait(&ring, 1);
      if (w < 0 && w != -EINTR && w != -EAGAIN && w != -EBUSY) {
        // The ring itself failed: fail what is in flight and fall back to blocking I/O per chunk.
        for (size_t si = 0; si < slots.size(); ++si) {
          if (slots[si].busy) {
            slots[si].result = failure(
                -w, fmt::format("file tier: io_uring_submit failed: {}", std::strerror(-w)));
            finish_slot(si);
          }
        }
        continue;
      }
      unsigned head;
      unsigned seen = 0;
      std::vector<std::pair<uint64_t, int>> done;
      io_uring_for_each_cqe(&ring, head, cqe) {
        done.emplace_back(io_uring_cqe_get_data64(cqe), cqe->res);
        ++seen;
      }
      io_uring_cq_advance(&ring, seen);
      for (auto [data, res] : done) {
        size_t si = static_cast<size_t>(data >> 2);
        int k = static_cast<int>(data & 3);
        Slot& s = slots[si];
        const Segment& g = s.plan.seg[k];
        bool write = s.chunk.ctx->req.direction == Direction::kWrite;
        if (res < 0 && (res == -EINTR || res == -EAGAIN) && ++s.retries < kMaxRetries) {
          submit_seg(si, k);
          continue;
        }
        if (res <= 0) {
          if (s.result.ok) {
            s.result = failure(
                res == 0 ? (write ? EIO : ENODATA) : -res,
                fmt::format("{} failed: {}",
                            describe(s.chunk, ps, g.off + s.seg_done[k], g.len - s.seg_done[k]),
                            res == 0 ? (write ? "no progress" : "unexpected end of file")
                                     : std::strerror(-res)));
          }
        } else {
          s.seg_done[k] += static_cast<uint64_t>(res);
          if (s.seg_done[k] < g.len) {  // short transfer: submit the rest
            submit_seg(si, k);
            continue;
          }
        }
        if (--s.seg_left == 0) finish_slot(si);
      }
    }
    if (fixed) io_uring_unregister_buffers(&ring);
    io_uring_queue_exit(&ring);
    for (auto& s : slots) cuda::event_destroy(s.h2d_event);
    cuda::stream_destroy(d2h);
  }

#else
  void uring_loop(PathState& ps) {  // not reached: probe_io_uring() reports no io_uring
    while (auto c = ps.queue.pop_wait()) {
      chunk_done(c->ctx, failure(ENOSYS, "file tier: built without liburing"), c->piece);
    }
  }
#endif

  FileTierOptions o_;
  uint64_t per_path_bytes_ = 0;
  std::vector<std::unique_ptr<PathState>> paths_;
  std::vector<std::string> notes_;
  Engine engine_ = Engine::kThreads;
  bool gds_ = false;
  std::atomic<bool> closed_{false};
  std::mutex shutdown_mu_;
  std::mutex sync_mu_;
  void* sync_d2h_ = nullptr;
  void* sync_h2d_event_ = nullptr;
  std::mutex streams_mu_;
  std::unordered_map<int, void*> h2d_streams_;
  ChecksumTable crcs_;
};

}  // namespace

IoUringProbe probe_io_uring() {
#ifndef TERAIO_HAVE_LIBURING
  return {false, "teraio was built without liburing"};
#else
  io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) return {false, fmt::format("io_uring_queue_init failed: {}", std::strerror(-rc))};
  io_uring_queue_exit(&ring);
  return {true, ""};
#endif
}

std::unique_ptr<Tier> make_file_tier(const FileTierOptions& options) {
  return std::make_unique<FileTier>(options, false);
}

std::unique_ptr<Tier> make_sync_file_tier(const FileTierOptions& options) {
  return std::make_unique<FileTier>(options, true);
}

}  // namespace teraio::storage
