// The file tier's io_uring engine (Note [io_uring engine]), and probe_io_uring().
#ifdef TERAIO_HAVE_LIBURING
#include <liburing.h>
#endif

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "file_engines.h"
#include "teraio/error.h"

namespace teraio::storage {

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

namespace file {
namespace {

std::atomic<int> g_fail_next_ring_wait{0};

#ifdef TERAIO_HAVE_LIBURING
// Note [io_uring engine]: one thread per path owns the ring. Slot i (of queue_depth) owns bounce
// buffer i, registered with the ring, so staged I/O uses the fixed-buffer opcodes. The thread
// stages a piece (device-to-host copy), submits its segments, and when all of a piece's segments
// completed finishes it (checksum, host-to-device copy). Short transfers are resubmitted for the
// remainder; EINTR/EAGAIN are retried. While the kernel runs the other slots' I/O, the thread's own
// copies overlap with it. When the ring itself fails (its wait returns an error other than
// EINTR/EAGAIN/EBUSY), the pieces in flight fail with that error, the ring is closed, and the
// thread runs every later piece with blocking pread/pwrite, one at a time, in a bounce buffer of
// its own (not one the kernel may still hold); runtime_note() says so from then on.
class UringEngine final : public PathEngine {
 public:
  explicit UringEngine(const PathContext& ctx) : ctx_(ctx) {
    for (int i = 0; i < ctx.queue_depth; ++i)
      bounce_.push_back(Buffer::allocate(ctx.stripe_bytes, MemoryKind::kHostPinned));
    thread_ = std::thread([this] { loop(); });
  }
  ~UringEngine() override { close(); }
  bool submit(Chunk c, Priority priority) override { return queue_.push(std::move(c), priority); }
  std::vector<Chunk> take_queued() override { return queue_.take_all(); }
  void close() override {
    std::lock_guard lock(close_mu_);
    queue_.close();
    if (thread_.joinable()) thread_.join();
  }
  std::string runtime_note() const override {
    std::lock_guard lock(note_mu_);
    return note_;
  }

 private:
  struct Slot {
    bool busy = false;
    Chunk chunk;
    PiecePlan plan;
    uint64_t seg_done[3] = {0, 0, 0};
    int seg_left = 0;
    int retries = 0;
    IoResult result;
    cuda::Event h2d;
  };

  std::byte* bounce(size_t i) const { return static_cast<std::byte*>(bounce_[i].data()); }

  void loop() {
    io_uring ring;
    unsigned entries = static_cast<unsigned>(ctx_.queue_depth) * 4;
    int rc = io_uring_queue_init(entries, &ring, 0);
    if (rc < 0) {  // probed before, so rare
      blocking_loop(fmt::format("io_uring_queue_init failed: {}", std::strerror(-rc)));
      return;
    }
    std::vector<iovec> iov;
    for (size_t i = 0; i < bounce_.size(); ++i) iov.push_back(iovec{bounce(i), ctx_.stripe_bytes});
    fixed_ = io_uring_register_buffers(&ring, iov.data(), static_cast<unsigned>(iov.size())) == 0;
    slots_ = std::vector<Slot>(static_cast<size_t>(ctx_.queue_depth));
    int failed_wait = ring_loop(ring);
    if (fixed_) io_uring_unregister_buffers(&ring);
    io_uring_queue_exit(&ring);
    slots_.clear();
    if (failed_wait != 0) blocking_loop(fmt::format("io_uring wait failed: {}", std::strerror(failed_wait)));
  }

  // Runs pieces through the ring until the queue is closed and drained (returns 0) or the ring
  // fails (returns the errno; the pieces in flight have failed).
  int ring_loop(io_uring& ring) {
    const PathFiles& files = *ctx_.files;
    int active = 0;
    auto finish_slot = [&](size_t si) {
      finish(si);
      --active;
    };
    for (;;) {
      while (active < ctx_.queue_depth) {
        std::optional<Chunk> c = active == 0 ? queue_.pop_wait() : queue_.try_pop();
        if (!c) break;
        size_t si = 0;
        while (slots_[si].busy) ++si;
        Slot& s = slots_[si];
        s.busy = true;
        ++active;
        s.chunk = std::move(*c);
        s.result = IoResult{};
        s.retries = 0;
        const bool write = s.chunk.request->req.direction == Direction::kWrite;
        try {
          s.plan = plan_piece(files, s.chunk.piece, s.chunk.request->req.buffer, bounce(si));
          if (write) ctx_.io->stage_write(s.chunk, s.plan, d2h_, /*checksum_now=*/false);
        } catch (const std::exception& e) {
          s.result = PieceIo::failed(s.chunk, files, e);
          finish_slot(si);
          continue;
        }
        s.seg_left = s.plan.n;
        for (int k = 0; k < s.plan.n; ++k) {
          s.seg_done[k] = 0;
          submit_seg(ring, si, k);
        }
        if (write && ctx_.io->checksums()) {
          // The write's checksum while the kernel writes the same staged bytes: it is recorded
          // before this thread completes the piece (below), so before any read of it can start.
          io_uring_submit(&ring);
          ctx_.io->record_checksum(s.chunk, s.plan);
        }
      }
      if (active == 0) return 0;  // pop_wait returned nothing: the queue is closed and drained
      int injected = g_fail_next_ring_wait.exchange(0);
      int w = injected != 0 ? -injected : io_uring_submit_and_wait(&ring, 1);
      if (w < 0 && w != -EINTR && w != -EAGAIN && w != -EBUSY) {
        for (size_t si = 0; si < slots_.size(); ++si) {
          if (slots_[si].busy) {
            slots_[si].result =
                failure(-w, fmt::format("{} failed: the io_uring wait failed: {}",
                                        PieceIo::describe(slots_[si].chunk, files,
                                                          slots_[si].chunk.piece.file_offset,
                                                          slots_[si].chunk.piece.size),
                                        std::strerror(-w)));
            finish_slot(si);
          }
        }
        return -w;
      }
      io_uring_cqe* cqe = nullptr;
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
        Slot& s = slots_[si];
        const Segment& g = s.plan.seg[k];
        bool write = s.chunk.request->req.direction == Direction::kWrite;
        if (res < 0 && (res == -EINTR || res == -EAGAIN) && ++s.retries < kMaxRetries) {
          submit_seg(ring, si, k);
          continue;
        }
        if (res <= 0) {
          if (s.result.ok) {
            s.result = failure(
                res == 0 ? (write ? EIO : ENODATA) : -res,
                fmt::format("{} failed: {}",
                            PieceIo::describe(s.chunk, files, g.off + s.seg_done[k],
                                              g.len - s.seg_done[k]),
                            res == 0 ? (write ? "no progress" : "unexpected end of file")
                                     : std::strerror(-res)));
          }
        } else {
          s.seg_done[k] += static_cast<uint64_t>(res);
          if (s.seg_done[k] < g.len) {  // short transfer: submit the rest
            submit_seg(ring, si, k);
            continue;
          }
        }
        if (--s.seg_left == 0) finish_slot(si);
      }
    }
  }

  void submit_seg(io_uring& ring, size_t si, int k) {
    Slot& s = slots_[si];
    const Segment& g = s.plan.seg[k];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) {
      io_uring_submit(&ring);
      sqe = io_uring_get_sqe(&ring);
    }
    std::byte* p = g.ptr + s.seg_done[k];
    unsigned len = static_cast<unsigned>(g.len - s.seg_done[k]);
    off_t off = static_cast<off_t>(g.off + s.seg_done[k]);
    bool write = s.chunk.request->req.direction == Direction::kWrite;
    bool in_bounce = fixed_ && p >= bounce(si) && p + len <= bounce(si) + ctx_.stripe_bytes;
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
  }

  // A slot whose segments all completed (or whose piece failed): deliver and complete the piece.
  void finish(size_t si) {
    Slot& s = slots_[si];
    const PathFiles& files = *ctx_.files;
    const bool write = s.chunk.request->req.direction == Direction::kWrite;
    IoResult r = std::move(s.result);
    if (r.ok) {
      try {
        if (write) {
          r.bytes = s.chunk.piece.size;
        } else {
          r = ctx_.io->deliver_read(s.chunk, files, s.plan, s.h2d);
        }
      } catch (const std::exception& e) {
        r = PieceIo::failed(s.chunk, files, e);
      }
    }
    if (!write && s.chunk.request->req.buffer.is_device() && r.ok) {
      try {
        cuda::event_sync(s.h2d.get());  // Note [Copies before completion]
      } catch (const std::exception& e) {
        r = PieceIo::failed(s.chunk, files, e);
      }
    }
    ctx_.io->complete(s.chunk, std::move(r));
    s.chunk = Chunk{};
    s.busy = false;
  }

  // After the ring failed (or could not be made): blocking I/O for every later piece.
  void blocking_loop(const std::string& why) {
    {
      std::lock_guard lock(note_mu_);
      note_ = fmt::format("{}: {}; blocking pread/pwrite used from then on", ctx_.files->dir(), why);
    }
    Buffer own;
    std::string alloc_error;
    try {
      own = Buffer::allocate(ctx_.stripe_bytes, MemoryKind::kHostPinned);
    } catch (const std::exception& e) {
      alloc_error = e.what();
    }
    cuda::Event h2d;
    while (auto c = queue_.pop_wait()) {
      if (own.data() == nullptr) {
        ctx_.io->complete(*c, failure(ENOMEM, fmt::format("{} failed: {}; {}",
                                                          PieceIo::describe(*c, *ctx_.files,
                                                                            c->piece.file_offset,
                                                                            c->piece.size),
                                                          why, alloc_error)));
        continue;
      }
      ctx_.io->run_blocking(*ctx_.files, nullptr, *c, static_cast<std::byte*>(own.data()), d2h_,
                            h2d);
    }
  }

  PathContext ctx_;
  std::vector<Buffer> bounce_;
  PriorityQueue<Chunk> queue_;
  // Used by the engine's thread only:
  std::vector<Slot> slots_;
  bool fixed_ = false;
  cuda::Stream d2h_;
  // Shared:
  mutable std::mutex note_mu_;
  std::string note_;
  std::mutex close_mu_;
  std::thread thread_;
};
#endif

}  // namespace

std::unique_ptr<PathEngine> make_uring_engine(const PathContext& ctx) {
#ifdef TERAIO_HAVE_LIBURING
  return std::make_unique<UringEngine>(ctx);
#else
  (void)ctx;  // not reached: probe_io_uring() reports no io_uring
  throw teraio::Error("file tier: teraio was built without liburing");
#endif
}

namespace testing {
void fail_next_ring_wait(int error) { g_fail_next_ring_wait.store(error); }
}  // namespace testing

}  // namespace file
}  // namespace teraio::storage
