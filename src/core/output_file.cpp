// write_file_atomically (Note [Atomic output files] in teraio/output_file.h): temporary file next
// to the target, checked writes, rename into place; the one writer of every output file.
#include "teraio/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <system_error>

#include "teraio/error.h"

namespace teraio {
namespace {

std::atomic<uint64_t> g_temp_counter{0};

std::string errno_text(int e) {
  return std::error_code(e, std::generic_category()).message();
}

// Writes all of `content`; returns 0 or the errno of the failure.
int write_all(int fd, std::string_view content, detail::WriteFn write_fn) {
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = write_fn(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;  // write(2) never does this for a non-empty buffer
    done += static_cast<size_t>(n);
  }
  return 0;
}

// A path that exists and is not a regular file (/dev/null, /dev/full, a FIFO): written in place.
void write_in_place(const std::string& path, std::string_view content, detail::WriteFn write_fn) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot write {}: {}", path, errno_text(errno)));
  int err = write_all(fd, content, write_fn);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) throw Error(fmt::format("cannot write {}: {}", path, errno_text(err)));
}

}  // namespace

void detail::write_file_atomically(const std::string& path, std::string_view content,
                                   WriteFn write_fn) {
  TERAIO_CHECK(!path.empty(), "cannot write a file with an empty name");
  std::string target = path;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char* real = ::realpath(path.c_str(), nullptr);
    if (real == nullptr) {
      throw Error(fmt::format("cannot write {}: {} (a symbolic link that does not resolve)", path,
                              errno_text(errno)));
    }
    target = real;
    std::free(real);
  }
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) {
    throw Error(fmt::format("cannot write {}: {}", path, errno_text(EISDIR)));
  }
  if (exists && !S_ISREG(st.st_mode)) return write_in_place(path, content, write_fn);

  const size_t slash = target.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : target.substr(0, slash + 1);
  std::string name = slash == std::string::npos ? target : target.substr(slash + 1);
  if (name.size() > 200) name.resize(200);  // room for the suffix within NAME_MAX
  const std::string temp =
      fmt::format("{}{}.{}.tmp-{}-{}", dir, slash == std::string::npos ? "/" : "", name, ::getpid(),
                  g_temp_counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    throw Error(fmt::format("cannot write {}: {} (creating the temporary file {})", path,
                            errno_text(errno), temp));
  }
  if (exists) (void)::fchmod(fd, st.st_mode & 07777);  // keep the old file's mode
  int err = write_all(fd, content, write_fn);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    throw Error(fmt::format("cannot write {}: {}", path, errno_text(err)));
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    err = errno;
    ::unlink(temp.c_str());
    throw Error(
        fmt::format("cannot write {}: {} (renaming {} into place)", path, errno_text(err), temp));
  }
}

void write_file_atomically(const std::string& path, std::string_view content) {
  detail::write_file_atomically(path, content, &::write);
}

}  // namespace teraio
