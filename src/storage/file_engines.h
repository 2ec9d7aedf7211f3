// The file tier's engines: what moves one path's pieces between the caller's buffers and that
// path's file. Each path has its own engine behind PathEngine: the synchronous oracle (in the
// caller's thread), a pool of pread/pwrite threads (and cuFile for device buffers), or io_uring
// with registered bounce buffers. The steps every engine shares (staging a write on the host,
// delivering a read with its checksum and host-to-device copy, completing the request) are PieceIo.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_rt.h"
#include "cufile_shim.h"
#include "file_layout.h"
#include "internal.h"

namespace teraio::storage::file {

// One request, split into pieces; the last piece to finish completes it (Note [Completion states]).
struct Request {
  IoRequest req;
  std::shared_ptr<detail::CompletionState> state;
  std::atomic<uint64_t> remaining{0};
  std::mutex mu;
  bool failed = false;
  IoResult first_error;
  cuda::Event ready_event;      // recorded on req.ready_stream (device buffers with one)
  void* h2d_stream = nullptr;   // device reads: the tier's stream for the buffer's device
};

struct Chunk {
  std::shared_ptr<Request> request;
  Piece piece;
};

// The engine-independent steps of a piece. Thread-safe (the checksum table locks).
class PieceIo {
 public:
  PieceIo(bool checksums, ChecksumTable& table) : checksums_(checksums), table_(table) {}
  bool checksums() const { return checksums_; }

  // Counts the piece done with `r`; the last piece completes the request.
  void complete(const Chunk& c, IoResult r) const;
  // Before the file write: stage the data on the host (device-to-host copy on `d2h`, or a copy
  // into the bounce buffer), and record its checksum when checksum_now (else record_checksum).
  void stage_write(const Chunk& c, const PiecePlan& plan, cuda::Stream& d2h,
                   bool checksum_now = true) const;
  void record_checksum(const Chunk& c, const PiecePlan& plan) const;
  // After the file read: deliver to the caller's buffer and verify (Note [Checksum beside the
  // copy]). A device buffer's copy is enqueued on the request's h2d stream and `h2d` recorded.
  IoResult deliver_read(const Chunk& c, const PathFiles& files, const PiecePlan& plan,
                        cuda::Event& h2d) const;
  // The whole piece in the calling thread (through cuFile when `gds` is a handle and the buffer is
  // on a device), completed before it returns (Note [Copies before completion]).
  void run_blocking(const PathFiles& files, cufile::Handle gds, const Chunk& c, std::byte* bounce,
                    cuda::Stream& d2h, cuda::Event& h2d) const;
  // "file tier: read of N bytes at offset O of FILE (tier offset T)"
  static std::string describe(const Chunk& c, const PathFiles& files, uint64_t file_off,
                              uint64_t len);
  // A failure of the piece from an exception (a CUDA call that threw).
  static IoResult failed(const Chunk& c, const PathFiles& files, const std::exception& e);

 private:
  IoResult gds_piece(const PathFiles& files, cufile::Handle gds, const Chunk& c) const;
  bool checksums_;
  ChecksumTable& table_;
};

// One path's engine. Thread-safe.
class PathEngine {
 public:
  virtual ~PathEngine() = default;  // after close()
  // Takes a piece of this path: runs it before returning (the sync engine) or queues it. False
  // when the engine is closed (the piece was not taken).
  virtual bool submit(Chunk c, Priority priority) = 0;
  // Removes the queued pieces and returns them (shutdown with kCancel); running ones finish.
  virtual std::vector<Chunk> take_queued() = 0;
  // Refuses new pieces, finishes the queued and running ones, joins its threads. Idempotent.
  virtual void close() = 0;
  // "" or how the engine changed while running and why (io_uring: the ring failed).
  virtual std::string runtime_note() const { return {}; }
};

// What an engine of one path is given; the tier owns it and it outlives the engine.
struct PathContext {
  const PieceIo* io = nullptr;
  const PathFiles* files = nullptr;
  cufile::Handle gds = nullptr;  // cuFile handle of files->fd_direct(), or nullptr
  uint64_t stripe_bytes = 0;     // the size of each bounce buffer
  int queue_depth = 1;           // threads (thread engine) or slots (io_uring)
};

// Bounce buffers (stripe_bytes each) are pinned when a GPU is present (Buffer::allocate).
std::unique_ptr<PathEngine> make_sync_engine(const PathContext& ctx);
std::unique_ptr<PathEngine> make_thread_engine(const PathContext& ctx);
// Note [io_uring engine]. Only when probe_io_uring() said yes.
std::unique_ptr<PathEngine> make_uring_engine(const PathContext& ctx);

namespace testing {
// Fault injection for tests: the next wait of an io_uring engine's ring (any engine's, once)
// fails with -error as if the ring itself had failed, before anything was submitted to the kernel.
void fail_next_ring_wait(int error);
}  // namespace testing

}  // namespace teraio::storage::file
