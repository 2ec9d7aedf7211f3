// The file tier's layout: a byte space striped over one file per path, how a request splits into
// pieces (one stripe each), where a piece lies in its file, which of its bytes go through O_DIRECT
// and which through the page cache, and the files themselves (created, reserved, removed). No
// threads and no engines: file_engines.h moves the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "teraio/storage.h"

namespace teraio::storage::file {

constexpr uint64_t kBlock = 4096;  // O_DIRECT alignment of offsets, lengths and addresses
constexpr int kMaxRetries = 16;    // EINTR/EAGAIN retries of one transfer

// A piece of a request that lies within one stripe (so within one file and one bounce buffer).
struct Piece {
  int path = 0;
  uint64_t file_offset = 0;
  uint64_t tier_offset = 0;
  uint64_t size = 0;
  uint64_t buf_offset = 0;  // from the start of the request's buffer
};

// The pieces of [offset, offset + size) of a tier striped in units of `stripe` over `paths` files:
// stripe s is in file s % paths at (s / paths) * stripe.
std::vector<Piece> split(uint64_t stripe, int paths, uint64_t offset, uint64_t size);

// Bytes each path's file holds for `capacity` over `paths` (whole rows of stripes).
uint64_t per_path_bytes(uint64_t capacity, uint64_t stripe, int paths);

// One path's file, in its private locked directory (Note [Tier directory locks]). Move-only; the
// destructor closes the descriptors and removes the file, the lock file and the directory.
class PathFiles {
 public:
  // Creates <root>/<job>-<pid>-<n>/stripe.dat and reserves `bytes` (fallocate, else ftruncate), after
  // removing this job's stale directories under root. direct: also open it with O_DIRECT when the
  // filesystem accepts it. Every fallback is a line in `notes`. Throws teraio::Error naming root.
  static PathFiles create(const std::string& root, const std::string& job_name, uint64_t bytes,
                          bool direct, std::vector<std::string>& notes);
  PathFiles() = default;
  PathFiles(PathFiles&& o) noexcept;
  PathFiles& operator=(PathFiles&& o) noexcept;
  PathFiles(const PathFiles&) = delete;
  PathFiles& operator=(const PathFiles&) = delete;
  ~PathFiles();

  const std::string& dir() const { return dir_; }
  const std::string& file() const { return file_; }
  int fd_direct() const { return fd_direct_; }      // O_DIRECT, or -1
  int fd_buffered() const { return fd_buffered_; }  // always
  bool direct() const { return fd_direct_ >= 0; }

 private:
  void release() noexcept;
  std::string dir_, lock_file_, file_;
  int lock_fd_ = -1;  // flock'ed while the tier lives
  int fd_direct_ = -1;
  int fd_buffered_ = -1;
};

// One contiguous file I/O of a piece.
struct Segment {
  int fd = -1;
  std::byte* ptr = nullptr;
  uint64_t len = 0;
  uint64_t off = 0;
};

// How a piece's bytes move: up to three segments (unaligned head and tail buffered, the aligned
// body direct), staged at `stage` (the caller's memory or the bounce buffer).
struct PiecePlan {
  Segment seg[3];
  int n = 0;
  std::byte* stage = nullptr;
  bool use_bounce = false;
};
PiecePlan plan_piece(const PathFiles& files, const Piece& p, const BufferView& buf,
                     std::byte* bounce);

// Synchronous pread/pwrite of a whole segment: retries EINTR/EAGAIN and continues after short
// transfers. Returns 0 or an errno value (a read that meets the end of the file: ENODATA with `eof`
// set, Note [Lost bytes]; a write that makes no progress: EIO).
int full_io(const Segment& s, bool write, bool* eof);

}  // namespace teraio::storage::file
