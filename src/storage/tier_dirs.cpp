// The file tier's directories: creating one under a lock held for the tier's life, and finding and
// removing those whose process died without removing them (SIGKILL, a machine reset), which would
// otherwise hold their whole fallocate'd reservation forever (docs/storage.md, "Stale tier
// directories").
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "internal.h"
#include "teraio/error.h"

namespace teraio::storage {

// Note [Tier directory locks]
// A tier directory <root>/<job>-<pid>-<n>/ holds `lock` (empty), flock(LOCK_EX)'ed by its tier
// until the tier is destroyed; the kernel drops the lock when the process dies however it dies, so
// "the lock can be taken" means "its owner is gone". The creator makes the directory, creates
// `lock`, takes the lock without waiting, and checks that `lock` is still linked; a cleaner takes
// the lock without waiting before it removes anything and removes while holding it. Either one
// wins: when the cleaner does (it saw `lock` before the creator locked it), the creator's lock
// fails or finds the file unlinked, and it starts over under a new name. Only the files teraio
// creates there are removed (`lock`, `stripe.dat`, `.teraio-odirect-probe-<pid>`), through
// descriptors of directories opened with O_NOFOLLOW, so a symbolic link is never followed; a
// directory holding anything else is left. A directory without `lock` (made by a teraio from before
// the locks) is stale only when no process has the pid in its name.

namespace {

constexpr const char* kLockName = "lock";
constexpr const char* kStripeName = "stripe.dat";
constexpr std::string_view kProbePrefix = ".teraio-odirect-probe-";
std::atomic<uint64_t> g_dir_counter{0};

std::string errno_text(int e) {
  return std::strerror(e);
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Splits "<job>-<pid>-<n>"; false when `name` is not in that form.
bool parse_tier_dir_name(std::string_view name, std::string_view* job, std::string_view* pid) {
  const size_t b = name.rfind('-');
  if (b == std::string_view::npos || b == 0) return false;
  const size_t a = name.rfind('-', b - 1);
  if (a == std::string_view::npos || a == 0) return false;
  if (!all_digits(name.substr(a + 1, b - a - 1)) || !all_digits(name.substr(b + 1))) return false;
  *job = name.substr(0, a);
  *pid = name.substr(a + 1, b - a - 1);
  return true;
}

bool is_teraio_file(std::string_view name) {
  return name == kLockName || name == kStripeName ||
         (name.starts_with(kProbePrefix) && all_digits(name.substr(kProbePrefix.size())));
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Whether a process with this pid exists (EPERM: it exists, owned by someone else).
bool process_exists(std::string_view pid_text) {
  if (pid_text.size() > 9) return false;  // beyond any pid_max
  const pid_t pid = static_cast<pid_t>(std::stol(std::string(pid_text)));
  if (pid <= 0) return false;
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

// Examines (and unless dry_run removes) one candidate directory `name` under `root_fd`. Returns
// false when it is not a tier directory at all (nothing to report).
bool clean_one(int root_fd, const std::string& root, const std::string& name, std::string_view pid,
               bool dry_run, TierDirReport* out) {
  out->path = root + "/" + name;
  const Fd dir(::openat(root_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.fd < 0) return false;  // a symbolic link, not a directory, or gone
  const int list_fd = ::dup(dir.fd);
  if (list_fd < 0) return false;
  std::unique_ptr<DIR, int (*)(DIR*)> listing(::fdopendir(list_fd), &::closedir);
  if (!listing) {
    ::close(list_fd);
    return false;
  }
  std::vector<std::string> ours;
  std::string foreign;
  bool has_lock = false;
  while (const dirent* e = ::readdir(listing.get())) {
    const std::string_view n = e->d_name;
    if (n == "." || n == "..") continue;
    struct stat st;
    const bool regular =
        ::fstatat(dir.fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
    if (is_teraio_file(n) && regular) {
      ours.emplace_back(n);
      has_lock |= n == kLockName;
    } else if (foreign.empty()) {
      foreign = std::string(n);
    }
  }
  if (ours.empty()) return false;  // an empty or foreign directory that happens to match the name

  // Whose is it? Take its lock (held until `lock` closes) or, without one, look for its process.
  std::unique_ptr<Fd> lock;
  if (has_lock) {
    lock = std::make_unique<Fd>(::openat(dir.fd, kLockName, O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (lock->fd < 0) {
      out->state = TierDirState::kKept;
      out->reason = fmt::format("cannot open its lock: {}", errno_text(errno));
      return true;
    }
    if (::flock(lock->fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      out->state = e == EWOULDBLOCK ? TierDirState::kInUse : TierDirState::kKept;
      out->reason = e == EWOULDBLOCK ? "locked by a running tier"
                                     : fmt::format("cannot take its lock: {}", errno_text(e));
      return true;
    }
  } else if (process_exists(pid)) {
    out->state = TierDirState::kInUse;
    out->reason = fmt::format("no lock file, and process {} is running", pid);
    return true;
  }
  for (const std::string& f : ours) {
    struct stat st;
    if (::fstatat(dir.fd, f.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      out->bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  if (!foreign.empty()) {
    out->state = TierDirState::kKept;
    out->reason = fmt::format("holds '{}', which teraio did not put there", foreign);
    return true;
  }
  if (dry_run) {
    out->state = TierDirState::kStale;
    return true;
  }
  for (const std::string& f : ours) {
    if (::unlinkat(dir.fd, f.c_str(), 0) != 0 && errno != ENOENT) {
      out->state = TierDirState::kKept;
      out->reason = fmt::format("cannot remove {}: {}", f, errno_text(errno));
      return true;
    }
  }
  if (::unlinkat(root_fd, name.c_str(), AT_REMOVEDIR) != 0) {
    out->state = TierDirState::kKept;
    out->reason = fmt::format("its files are removed, the directory stays: {}", errno_text(errno));
    return true;
  }
  out->state = TierDirState::kRemoved;
  return true;
}

}  // namespace

std::string_view to_string(TierDirState state) {
  switch (state) {
    case TierDirState::kRemoved:
      return "removed";
    case TierDirState::kStale:
      return "stale";
    case TierDirState::kInUse:
      return "in use";
    case TierDirState::kKept:
      return "kept";
  }
  return "?";
}

std::vector<TierDirReport> clean_tier_dirs(const std::string& root,
                                           const CleanTierDirsOptions& options) {
  const Fd root_fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  TERAIO_CHECK(root_fd.fd >= 0, "{}: {}", root,
               errno == ENOTDIR ? std::string("not a directory") : errno_text(errno));
  std::vector<std::string> names;
  {
    const int list_fd = ::dup(root_fd.fd);
    TERAIO_CHECK(list_fd >= 0, "{}: {}", root, errno_text(errno));
    std::unique_ptr<DIR, int (*)(DIR*)> listing(::fdopendir(list_fd), &::closedir);
    if (!listing) {
      const int e = errno;
      ::close(list_fd);
      throw Error(fmt::format("{}: cannot list: {}", root, errno_text(e)));
    }
    errno = 0;
    while (const dirent* e = ::readdir(listing.get())) names.emplace_back(e->d_name);
    TERAIO_CHECK(errno == 0, "{}: cannot list: {}", root, errno_text(errno));
  }
  std::sort(names.begin(), names.end());
  std::vector<TierDirReport> out;
  const std::string shown =
      root.size() > 1 && root.back() == '/' ? root.substr(0, root.size() - 1) : root;
  for (const std::string& name : names) {
    std::string_view job, pid;
    if (!parse_tier_dir_name(name, &job, &pid)) continue;
    if (!options.job_name.empty() && job != options.job_name) continue;
    TierDirReport r;
    if (clean_one(root_fd.fd, shown, name, pid, options.dry_run, &r)) out.push_back(std::move(r));
  }
  return out;
}

LockedTierDir create_locked_tier_dir(const std::string& root, const std::string& job_name) {
  TERAIO_CHECK(!job_name.empty() && job_name.find('/') == std::string::npos,
               "file tier: job_name \"{}\" must be a non-empty name without '/'", job_name);
  for (int attempt = 0; attempt < 64; ++attempt) {
    LockedTierDir d;
    d.dir = fmt::format("{}/{}-{}-{}", root, job_name, ::getpid(), g_dir_counter.fetch_add(1));
    if (::mkdir(d.dir.c_str(), 0700) != 0) {
      if (errno == EEXIST) continue;  // a directory left by an earlier process with our pid
      throw Error(fmt::format("file tier: cannot create {}: {}", d.dir, errno_text(errno)));
    }
    d.lock_file = d.dir + "/" + kLockName;
    d.lock_fd =
        ::open(d.lock_file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (d.lock_fd < 0) {
      const int e = errno;
      if (e == ENOENT) continue;  // a cleaner removed the empty directory: start over
      ::rmdir(d.dir.c_str());
      throw Error(fmt::format("file tier: cannot create {}: {}", d.lock_file, errno_text(e)));
    }
    if (::flock(d.lock_fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e == EWOULDBLOCK) {  // a cleaner holds it and is removing the directory: start over
        ::close(d.lock_fd);
        continue;
      }
      d.note = fmt::format(
          "{}: cannot lock {} ({}); teraio clean will not remove it if this process dies", root,
          d.lock_file, errno_text(e));
    }
    struct stat st;
    if (::fstat(d.lock_fd, &st) == 0 && st.st_nlink == 0) {  // a cleaner removed it first
      ::close(d.lock_fd);
      continue;
    }
    return d;
  }
  throw Error(
      fmt::format("file tier: cannot create a directory in {} (64 attempts raced with "
                  "cleaners or old directories)",
                  root));
}

}  // namespace teraio::storage
