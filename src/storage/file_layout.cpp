// The file tier's layout (file_layout.h): stripes, pieces, segments, and each path's file.
#include "file_layout.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "internal.h"
#include "teraio/error.h"
#include "teraio/units.h"

namespace teraio::storage::file {
namespace {

uint64_t round_down(uint64_t x) {
  return x / kBlock * kBlock;
}
uint64_t round_up(uint64_t x) {
  return (x + kBlock - 1) / kBlock * kBlock;
}

// The directories of this job under `root` whose process is gone (docs/storage.md, "Stale tier
// directories"): removed, one note each; a failure to scan is a note too, never an error.
void remove_stale_dirs(const std::string& root, const std::string& job_name,
                       std::vector<std::string>& notes) {
  try {
    for (const TierDirReport& r : clean_tier_dirs(root, {job_name, false})) {
      if (r.state == TierDirState::kRemoved) {
        notes.push_back(fmt::format("removed stale tier directory {} ({} freed; its process is gone)",
                                    r.path, format_bytes(static_cast<double>(r.bytes))));
      } else if (r.state == TierDirState::kKept) {
        notes.push_back(fmt::format("left stale tier directory {}: {}", r.path, r.reason));
      }
    }
  } catch (const teraio::Error& e) {
    notes.push_back(fmt::format("cannot look for stale tier directories: {}", e.what()));
  }
}

}  // namespace

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

uint64_t per_path_bytes(uint64_t capacity, uint64_t stripe, int paths) {
  uint64_t row = stripe * static_cast<uint64_t>(paths);
  return (capacity + row - 1) / row * stripe;
}

PathFiles PathFiles::create(const std::string& root, const std::string& job_name, uint64_t bytes,
                            bool direct, std::vector<std::string>& notes) {
  struct stat st;
  TERAIO_CHECK(::stat(root.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
               "file tier: path {} is not a directory ({})", root, std::strerror(errno));
  remove_stale_dirs(root, job_name, notes);
  PathFiles f;  // from here on, its destructor removes what was made when a step throws
  LockedTierDir locked = create_locked_tier_dir(root, job_name);
  f.dir_ = locked.dir;
  f.lock_file_ = locked.lock_file;
  f.lock_fd_ = locked.lock_fd;
  cleanup_register(f.dir_);
  cleanup_register(f.lock_file_);
  if (!locked.note.empty()) notes.push_back(locked.note);
  const std::string file = f.dir_ + "/stripe.dat";
  f.fd_buffered_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  TERAIO_CHECK(f.fd_buffered_ >= 0, "file tier: cannot create {}: {}", file, std::strerror(errno));
  f.file_ = file;
  cleanup_register(f.file_);
  (void)::fchmod(f.fd_buffered_, 0600);  // independent of the umask
  int rc = ::fallocate(f.fd_buffered_, 0, 0, static_cast<off_t>(bytes));
  if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
    notes.push_back(fmt::format("{}: fallocate unsupported; space not reserved in advance", root));
    rc = ::ftruncate(f.fd_buffered_, static_cast<off_t>(bytes));
  }
  if (rc != 0) {
    int e = errno;
    struct statvfs vfs;
    uint64_t avail = ::statvfs(root.c_str(), &vfs) == 0 ? uint64_t(vfs.f_bavail) * vfs.f_frsize : 0;
    throw teraio::Error(fmt::format("file tier: cannot reserve {} ({} bytes) in {}: {} ({} available)",
                                    format_bytes(static_cast<double>(bytes)), bytes, root,
                                    std::strerror(e), format_bytes(static_cast<double>(avail))));
  }
  if (direct) {
    f.fd_direct_ = ::open(f.file_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (f.fd_direct_ >= 0) {
      auto probe = probe_direct_io(f.dir_);
      if (!probe.supported) {
        ::close(f.fd_direct_);
        f.fd_direct_ = -1;
        notes.push_back(root + ": " + probe.reason);
      }
    } else {
      notes.push_back(
          fmt::format("{}: O_DIRECT refused ({}); buffered I/O used", root, std::strerror(errno)));
    }
  }
  return f;
}

PathFiles::PathFiles(PathFiles&& o) noexcept
    : dir_(std::move(o.dir_)),
      lock_file_(std::move(o.lock_file_)),
      file_(std::move(o.file_)),
      lock_fd_(std::exchange(o.lock_fd_, -1)),
      fd_direct_(std::exchange(o.fd_direct_, -1)),
      fd_buffered_(std::exchange(o.fd_buffered_, -1)) {
  o.dir_.clear();
  o.lock_file_.clear();
  o.file_.clear();
}

PathFiles& PathFiles::operator=(PathFiles&& o) noexcept {
  if (this != &o) {
    release();
    dir_ = std::exchange(o.dir_, {});
    lock_file_ = std::exchange(o.lock_file_, {});
    file_ = std::exchange(o.file_, {});
    lock_fd_ = std::exchange(o.lock_fd_, -1);
    fd_direct_ = std::exchange(o.fd_direct_, -1);
    fd_buffered_ = std::exchange(o.fd_buffered_, -1);
  }
  return *this;
}

PathFiles::~PathFiles() { release(); }

void PathFiles::release() noexcept {
  if (fd_direct_ >= 0) ::close(fd_direct_);
  if (fd_buffered_ >= 0) ::close(fd_buffered_);
  fd_direct_ = fd_buffered_ = -1;
  if (!file_.empty()) {
    ::unlink(file_.c_str());
    cleanup_unregister(file_);
  }
  if (!lock_file_.empty()) {
    ::unlink(lock_file_.c_str());
    cleanup_unregister(lock_file_);
  }
  if (!dir_.empty()) {
    ::rmdir(dir_.c_str());
    cleanup_unregister(dir_);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);  // last: the directory is gone while we hold it
  lock_fd_ = -1;
  file_.clear();
  lock_file_.clear();
  dir_.clear();
}

// Note [Bounce buffer use]: the piece's data is staged at bounce + file_offset % 4096, so the
// 4 KiB-aligned body of the piece is at an aligned address in the bounce buffer and can go through
// O_DIRECT; the unaligned head and tail go through the buffered descriptor (the kernel keeps the
// page cache coherent with direct I/O for non-overlapping requests). Host buffers whose body is
// already aligned skip the bounce entirely.
PiecePlan plan_piece(const PathFiles& files, const Piece& p, const BufferView& buf,
                     std::byte* bounce) {
  PiecePlan c;
  std::byte* user = buf.bytes() + p.buf_offset;
  uint64_t end = p.file_offset + p.size;
  uint64_t body_start = round_up(p.file_offset), body_end = round_down(end);
  bool has_body = files.direct() && body_start < body_end;
  c.use_bounce =
      buf.is_device() ||
      (has_body && reinterpret_cast<uintptr_t>(user + (body_start - p.file_offset)) % kBlock != 0);
  c.stage = c.use_bounce ? bounce + p.file_offset % kBlock : user;
  auto add = [&](int fd, uint64_t from, uint64_t to) {
    if (from < to) c.seg[c.n++] = Segment{fd, c.stage + (from - p.file_offset), to - from, from};
  };
  if (has_body) {
    add(files.fd_buffered(), p.file_offset, body_start);
    add(files.fd_direct(), body_start, body_end);
    add(files.fd_buffered(), body_end, end);
  } else {
    add(files.fd_buffered(), p.file_offset, end);
  }
  return c;
}

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

}  // namespace teraio::storage::file
