// The file tier: a byte space striped over one file per path (one path per SSD, no RAID), reserved
// with fallocate in a private per-job directory (file_layout.h). A request is split into pieces,
// one stripe each, and each piece goes to its path's engine (file_engines.h): io_uring with
// registered pinned bounce buffers, a pool of pread/pwrite threads, or, for the synchronous oracle,
// the caller's thread; device buffers pass through the bounce buffers (or cuFile when GDS is
// usable). This file chooses the engine and holds what the paths share.
#include <cerrno>
#include <unordered_map>

#include "cuda_rt.h"
#include "cufile_shim.h"
#include "file_engines.h"
#include "internal.h"
#include "teraio/error.h"

namespace teraio::storage {
namespace {

using file::Chunk;
using file::PathEngine;
using file::PathFiles;

enum class Engine { kSync, kThreads, kIoUring };

// One path: its file, its cuFile handle (registered by the tier), its engine.
struct PathState {
  PathFiles files;
  cufile::Handle gds_handle = nullptr;
  std::unique_ptr<PathEngine> engine;
  ~PathState() {
    engine.reset();  // joins its threads before the handle and the files go
    if (gds_handle != nullptr) cufile::api().handle_deregister(gds_handle);
  }
};

class FileTier final : public Tier {
 public:
  FileTier(const FileTierOptions& o, bool sync) : o_(o), io_(o.checksums, crcs_) {
    TERAIO_CHECK(!o.paths.empty(), "file tier: at least one path is required");
    TERAIO_CHECK(o.capacity_bytes > 0, "file tier: capacity_bytes must be > 0");
    TERAIO_CHECK(o.stripe_bytes >= file::kBlock && o.stripe_bytes % file::kBlock == 0,
                 "file tier: stripe_bytes {} must be a positive multiple of 4096", o.stripe_bytes);
    TERAIO_CHECK(o.queue_depth >= 1 && o.queue_depth <= 1024,
                 "file tier: queue_depth {} must be in [1, 1024]", o.queue_depth);
    const int np = static_cast<int>(o.paths.size());
    const uint64_t per_path = file::per_path_bytes(o.capacity_bytes, o.stripe_bytes, np);
    try {
      for (const std::string& root : o.paths) {
        paths_.push_back(std::make_unique<PathState>());
        paths_.back()->files =
            PathFiles::create(root, o.job_name, per_path, o.direct_io && !sync, notes_);
      }
      choose_engine(sync);
      for (auto& ps : paths_) {
        file::PathContext ctx{&io_, &ps->files, gds_ ? ps->gds_handle : nullptr, o.stripe_bytes,
                              o.queue_depth};
        ps->engine = engine_ == Engine::kSync      ? file::make_sync_engine(ctx)
                     : engine_ == Engine::kIoUring ? file::make_uring_engine(ctx)
                                                   : file::make_thread_engine(ctx);
      }
    } catch (...) {
      close();
      throw;
    }
  }

  ~FileTier() override { close(); }

  Completion submit(const IoRequest& r) override {
    uint64_t size = r.buffer.size_bytes();
    TERAIO_CHECK(r.offset_bytes <= o_.capacity_bytes && size <= o_.capacity_bytes - r.offset_bytes,
                 "file tier: {} of {} bytes at offset {} is beyond the tier's capacity of {} bytes",
                 to_string(r.direction), size, r.offset_bytes, o_.capacity_bytes);
    TERAIO_CHECK(!closed_.load(), "file tier: submit after shutdown");
    if (r.buffer.is_device()) cuda::require_device(r.buffer.device(), "file tier");
    auto q = std::make_shared<file::Request>();
    q->req = r;
    q->state = std::make_shared<detail::CompletionState>();
    Completion completion(q->state);
    // Note [Reads after their write]: the file tiers wait for the write here, on the caller's CPU.
    if (auto f = detail::wait_after(r, "file tier")) {
      q->state->finish(std::move(*f));
      return completion;
    }
    if (r.buffer.is_device()) {
      q->state->event = cuda::event_create(r.buffer.device());
      if (r.ready_stream != nullptr) {
        q->ready_event = cuda::Event(r.buffer.device());
        cuda::event_record(q->ready_event.get(), r.ready_stream);
      }
      if (r.direction == Direction::kRead) q->h2d_stream = h2d_stream(r.buffer.device());
    }
    auto pieces = file::split(o_.stripe_bytes, static_cast<int>(paths_.size()), r.offset_bytes, size);
    if (pieces.empty()) {
      q->state->finish(IoResult{});
      return completion;
    }
    q->remaining.store(pieces.size());
    for (const auto& p : pieces) {
      if (!paths_[static_cast<size_t>(p.path)]->engine->submit(Chunk{q, p}, r.priority)) {
        io_.complete(Chunk{q, p}, failure(ECANCELED, "file tier: submit raced with shutdown"));
      }
    }
    return completion;
  }

  void shutdown(ShutdownMode mode) override {
    std::lock_guard lock(shutdown_mu_);
    closed_.store(true);
    for (auto& ps : paths_) {
      if (ps->engine == nullptr) continue;
      if (mode == ShutdownMode::kCancel) {
        for (auto& c : ps->engine->take_queued()) {
          io_.complete(c, failure(ECANCELED,
                                  fmt::format("file tier: {} at tier offset {} cancelled by shutdown",
                                              to_string(c.request->req.direction),
                                              c.request->req.offset_bytes)));
        }
      }
    }
    for (auto& ps : paths_) {
      if (ps->engine != nullptr) ps->engine->close();
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
      i.files.push_back(ps->files.file());
      i.buffered_io = i.buffered_io || !ps->files.direct();
      if (ps->engine != nullptr) {
        std::string note = ps->engine->runtime_note();
        if (!note.empty()) i.notes.push_back(std::move(note));
      }
    }
    return i;
  }

 private:
  void choose_engine(bool sync) {
    if (sync) {
      engine_ = Engine::kSync;
      return;
    }
    if (o_.gds != GdsMode::kOff) {
      for (auto& ps : paths_) {
        auto p = probe_gds(ps->files.dir());
        if (!p.usable) {
          TERAIO_CHECK(o_.gds != GdsMode::kOn,
                       "file tier: GDS mode on, but cuFile is unusable on {}: {}", ps->files.dir(),
                       p.reason);
          notes_.push_back("GDS: " + p.reason);
          gds_ = false;
          break;
        }
        gds_ = true;
      }
      if (gds_) {
        for (auto& ps : paths_) {
          TERAIO_CHECK(ps->files.fd_direct() >= 0, "file tier: GDS needs O_DIRECT on {}",
                       ps->files.dir());
          cufile::Descr d{};
          d.type = cufile::kHandleTypeOpaqueFd;
          d.handle.fd = ps->files.fd_direct();
          auto e = cufile::api().handle_register(&ps->gds_handle, &d);
          if (e.err != 0) {
            TERAIO_CHECK(o_.gds != GdsMode::kOn,
                         "file tier: cuFileHandleRegister on {} failed with cuFile error {}",
                         ps->files.file(), e.err);
            notes_.push_back(fmt::format(
                "GDS: cuFileHandleRegister on {} failed with cuFile error {}; POSIX path used",
                ps->files.file(), e.err));
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

  // Drains and joins the engines, then frees the paths (files removed) and the streams.
  void close() {
    shutdown(ShutdownMode::kDrain);
    paths_.clear();
    std::lock_guard lock(streams_mu_);
    h2d_streams_.clear();
  }

  void* h2d_stream(int device) {
    std::lock_guard lock(streams_mu_);
    return h2d_streams_[device].get_or_create(device);
  }

  FileTierOptions o_;
  ChecksumTable crcs_;
  file::PieceIo io_;  // uses crcs_
  std::vector<std::unique_ptr<PathState>> paths_;
  std::vector<std::string> notes_;
  Engine engine_ = Engine::kThreads;
  bool gds_ = false;
  std::atomic<bool> closed_{false};
  std::mutex shutdown_mu_;
  std::mutex streams_mu_;
  std::unordered_map<int, cuda::Stream> h2d_streams_;
};

}  // namespace

std::unique_ptr<Tier> make_file_tier(const FileTierOptions& options) {
  return std::make_unique<FileTier>(options, false);
}

std::unique_ptr<Tier> make_sync_file_tier(const FileTierOptions& options) {
  return std::make_unique<FileTier>(options, true);
}

}  // namespace teraio::storage
