// The file tier's piece steps (PieceIo) and its two blocking engines: the synchronous oracle and
// the pool of pread/pwrite threads. The io_uring engine is in file_uring.cpp.
#include <cerrno>
#include <cstring>
#include <thread>

#include "file_engines.h"
#include "teraio/error.h"

namespace teraio::storage::file {

void PieceIo::complete(const Chunk& c, IoResult r) const {
  Request& q = *c.request;
  if (!r.ok) {
    std::lock_guard lock(q.mu);
    if (!q.failed) {
      q.failed = true;
      q.first_error = std::move(r);
    }
  }
  if (q.remaining.fetch_sub(1) != 1) return;
  IoResult final;
  bool failed;
  {
    std::lock_guard lock(q.mu);
    failed = q.failed;
    if (failed) final = q.first_error;
  }
  if (!failed) {
    final.bytes = q.req.buffer.size_bytes();
    if (q.h2d_stream != nullptr) {
      try {
        cuda::event_record(q.state->event, q.h2d_stream);
        q.state->publish_event();
        cuda::event_sync(q.state->event);
      } catch (const std::exception& e) {
        final = failure(EIO, fmt::format("file tier: read of {} bytes at tier offset {}: {}",
                                         q.req.buffer.size_bytes(), q.req.offset_bytes, e.what()));
      }
    }
  }
  q.state->finish(std::move(final));
}

void PieceIo::stage_write(const Chunk& c, const PiecePlan& plan, cuda::Stream& d2h,
                          bool checksum_now) const {
  const BufferView& buf = c.request->req.buffer;
  std::byte* user = buf.bytes() + c.piece.buf_offset;
  if (buf.is_device()) {
    cuda::set_device(buf.device());
    void* stream = d2h.get_or_create(buf.device());
    if (c.request->ready_event.get() != nullptr)
      cuda::stream_wait_event(stream, c.request->ready_event.get());
    cuda::memcpy_async(plan.stage, user, c.piece.size, stream);
    cuda::stream_sync(stream);
  } else if (plan.use_bounce) {
    std::memcpy(plan.stage, user, c.piece.size);
  }
  if (checksum_now) record_checksum(c, plan);
}

void PieceIo::record_checksum(const Chunk& c, const PiecePlan& plan) const {
  if (checksums_) table_.record(c.piece.tier_offset, c.piece.size, checksum(plan.stage, c.piece.size));
}

// Note [Checksum beside the copy]: a device buffer's host-to-device copy is enqueued first and
// the checksum computed while it runs (both only read the staged bytes); on a mismatch the copy
// is waited for and the read fails, so the buffer holds bytes nobody will use (the request
// failed: the caller never installs them).
IoResult PieceIo::deliver_read(const Chunk& c, const PathFiles& files, const PiecePlan& plan,
                               cuda::Event& h2d) const {
  const Request& q = *c.request;
  const BufferView& buf = q.req.buffer;
  std::byte* user = buf.bytes() + c.piece.buf_offset;
  if (buf.is_device()) {
    cuda::set_device(buf.device());
    void* event = h2d.get_or_create(buf.device());
    if (q.ready_event.get() != nullptr) cuda::stream_wait_event(q.h2d_stream, q.ready_event.get());
    cuda::memcpy_async(user, plan.stage, c.piece.size, q.h2d_stream);
    cuda::event_record(event, q.h2d_stream);
  }
  if (checksums_) {
    const uint64_t sum = checksum(plan.stage, c.piece.size);
    if (auto expected = table_.mismatch(c.piece.tier_offset, c.piece.size, sum)) {
      if (buf.is_device()) cuda::event_sync(h2d.get());  // Note [Copies before completion]
      return checksum_failure(describe(c, files, c.piece.file_offset, c.piece.size), *expected,
                              sum);
    }
  }
  if (!buf.is_device() && plan.use_bounce) std::memcpy(user, plan.stage, c.piece.size);
  IoResult ok;
  ok.bytes = c.piece.size;
  return ok;
}

IoResult PieceIo::gds_piece(const PathFiles& files, cufile::Handle gds, const Chunk& c) const {
  const auto& a = cufile::api();
  const BufferView& buf = c.request->req.buffer;
  std::byte* user = buf.bytes() + c.piece.buf_offset;
  bool write = c.request->req.direction == Direction::kWrite;
  if (c.request->ready_event.get() != nullptr) cuda::event_sync(c.request->ready_event.get());
  uint64_t done = 0;
  while (done < c.piece.size) {
    ssize_t n = write ? a.write(gds, user, c.piece.size - done,
                                static_cast<off_t>(c.piece.file_offset + done), static_cast<off_t>(done))
                      : a.read(gds, user, c.piece.size - done,
                               static_cast<off_t>(c.piece.file_offset + done), static_cast<off_t>(done));
    if (n <= 0) {
      int code = n == -1 ? errno : static_cast<int>(-n);
      return failure(n == -1 ? errno : EIO,
                     fmt::format("{} failed through cuFile: {} {}",
                                 describe(c, files, c.piece.file_offset + done, c.piece.size - done),
                                 n == -1 ? "errno" : "cuFile error", code));
    }
    done += static_cast<uint64_t>(n);
  }
  IoResult ok;
  ok.bytes = c.piece.size;
  return ok;
}

void PieceIo::run_blocking(const PathFiles& files, cufile::Handle gds, const Chunk& c,
                           std::byte* bounce, cuda::Stream& d2h, cuda::Event& h2d) const {
  IoResult r;
  const bool write = c.request->req.direction == Direction::kWrite;
  const bool device = c.request->req.buffer.is_device();
  try {
    if (gds != nullptr && device) {
      r = gds_piece(files, gds, c);
    } else {
      PiecePlan plan = plan_piece(files, c.piece, c.request->req.buffer, bounce);
      if (write) stage_write(c, plan, d2h);
      for (int i = 0; i < plan.n && r.ok; ++i) {
        bool eof = false;
        int e = full_io(plan.seg[i], write, &eof);
        if (e != 0) {
          r = failure(e, fmt::format("{} failed: {}",
                                     describe(c, files, plan.seg[i].off, plan.seg[i].len),
                                     eof ? (write ? "no progress" : "unexpected end of file")
                                         : std::strerror(e)));
        }
      }
      if (r.ok && !write) r = deliver_read(c, files, plan, h2d);
      if (r.ok && write) r.bytes = c.piece.size;
    }
  } catch (const std::exception& e) {
    r = failed(c, files, e);
  }
  // Note [Copies before completion]: a piece's host-to-device copy has finished before the piece
  // counts as done, so when a request completes (failed, too) nothing still writes into the
  // caller's device memory, which it may then free. The bounce buffer is reused only after it.
  if (r.ok && h2d.get() != nullptr && !write && device) {
    try {
      cuda::event_sync(h2d.get());
    } catch (const std::exception& e) {
      r = failed(c, files, e);
    }
  }
  complete(c, std::move(r));
}

std::string PieceIo::describe(const Chunk& c, const PathFiles& files, uint64_t file_off,
                              uint64_t len) {
  return fmt::format("file tier: {} of {} bytes at offset {} of {} (tier offset {})",
                     to_string(c.request->req.direction), len, file_off, files.file(),
                     c.piece.tier_offset);
}

IoResult PieceIo::failed(const Chunk& c, const PathFiles& files, const std::exception& e) {
  return failure(EIO, fmt::format("{}: {}",
                                  describe(c, files, c.piece.file_offset, c.piece.size), e.what()));
}

namespace {

// The reference: every piece in the submitting thread, one at a time per path (one bounce buffer,
// one stream, one event).
class SyncEngine final : public PathEngine {
 public:
  explicit SyncEngine(const PathContext& ctx)
      : ctx_(ctx), bounce_(Buffer::allocate(ctx.stripe_bytes, MemoryKind::kHostPinned)) {}
  bool submit(Chunk c, Priority) override {
    std::lock_guard lock(mu_);
    ctx_.io->run_blocking(*ctx_.files, nullptr, c, static_cast<std::byte*>(bounce_.data()), d2h_,
                          h2d_);
    return true;
  }
  std::vector<Chunk> take_queued() override { return {}; }
  void close() override {}

 private:
  PathContext ctx_;
  std::mutex mu_;
  Buffer bounce_;
  cuda::Stream d2h_;
  cuda::Event h2d_;
};

// queue_depth threads, each with its own bounce buffer, taking pieces from one priority queue.
class ThreadEngine final : public PathEngine {
 public:
  explicit ThreadEngine(const PathContext& ctx) : ctx_(ctx) {
    for (int i = 0; i < ctx.queue_depth; ++i)
      bounce_.push_back(Buffer::allocate(ctx.stripe_bytes, MemoryKind::kHostPinned));
    try {
      for (int i = 0; i < ctx.queue_depth; ++i) {
        auto* b = static_cast<std::byte*>(bounce_[static_cast<size_t>(i)].data());
        threads_.emplace_back([this, b] { loop(b); });
      }
    } catch (...) {
      close();
      throw;
    }
  }
  ~ThreadEngine() override { close(); }
  bool submit(Chunk c, Priority priority) override { return queue_.push(std::move(c), priority); }
  std::vector<Chunk> take_queued() override { return queue_.take_all(); }
  void close() override {
    std::lock_guard lock(close_mu_);
    queue_.close();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

 private:
  void loop(std::byte* bounce) {
    cuda::Stream d2h;
    cuda::Event h2d;
    while (auto c = queue_.pop_wait()) ctx_.io->run_blocking(*ctx_.files, ctx_.gds, *c, bounce, d2h, h2d);
  }
  PathContext ctx_;
  std::vector<Buffer> bounce_;
  PriorityQueue<Chunk> queue_;
  std::mutex close_mu_;
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<PathEngine> make_sync_engine(const PathContext& ctx) {
  return std::make_unique<SyncEngine>(ctx);
}

std::unique_ptr<PathEngine> make_thread_engine(const PathContext& ctx) {
  return std::make_unique<ThreadEngine>(ctx);
}

}  // namespace teraio::storage::file
