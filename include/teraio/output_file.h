// Writing an output file so that a reader sees either the old file or the whole new one, never a
// part: every file a command writes (trace, plan, report, run report, study results) goes through
// write_file_atomically. No fsync (a crash of the machine may lose the new file, never mix the
// two); every write, the close and the rename are checked.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace teraio {

// Note [Atomic output files]: `content` goes to a temporary file `.NAME.tmp-PID-N` next to `path`
// (same directory, so the rename cannot cross filesystems), created with mode 0666 less the umask
// (or the old file's mode when `path` exists); once every byte is written and the file closed it
// is renamed over `path`. On any failure the temporary file is removed, `path` is left as it was,
// and teraio::Error says the path and strerror(errno), e.g. "cannot write out/report.html: No space
// left on device". A symbolic link is followed (its target is replaced, the link kept). A path that
// exists and is not a regular file (/dev/null, /dev/stdout, a FIFO) is written in place: there is
// nothing to rename over. Thread-safe; no printing.
void write_file_atomically(const std::string& path, std::string_view content);

namespace detail {
// The write(2) the helper uses, replaceable so tests can inject failures (e.g. ENOSPC after some
// bytes). Must behave like write(2): the bytes written, or -1 with errno set.
using WriteFn = ssize_t (*)(int fd, const void* data, size_t size);
void write_file_atomically(const std::string& path, std::string_view content, WriteFn write_fn);
}  // namespace detail

}  // namespace teraio
