// Errors of teraio: user errors (bad input, bad configuration, failed I/O) throw teraio::Error;
// broken invariants inside the library throw teraio::InternalError. The library never prints,
// exits or aborts; the `teraio` command turns exceptions into a message and a non-zero exit.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace teraio {

// A user-facing error: the message names the failing input (file, field, position, path, offset).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A transfer between the device and a tier failed (a disk error, a full or read-only file, damaged
// or truncated bytes): the message names the tensor, the tier, the path, the offset and the errno
// text. Raised from the training step in which it happened (docs/pytorch.md, "Faults").
class IoError : public Error {
 public:
  // `results_intact`: only writes failed, so nothing was lost and the step computed what it would
  // have without the fault (the tensors stayed on the device); the caller may go on.
  explicit IoError(const std::string& what, bool results_intact = false)
      : Error(what), results_intact_(results_intact) {}
  bool results_intact() const { return results_intact_; }

 private:
  bool results_intact_;
};

// A bug in teraio: an invariant that must hold regardless of input.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace teraio

// TERAIO_CHECK(cond, "fmt {}", args...): throws teraio::Error with the formatted message if !cond.
#define TERAIO_CHECK(cond, ...)                                        \
  do {                                                                 \
    if (!(cond)) [[unlikely]] {                                        \
      throw ::teraio::Error(::fmt::format(__VA_ARGS__));               \
    }                                                                  \
  } while (0)

// TERAIO_INTERNAL_ASSERT(cond, "fmt {}", args...): throws teraio::InternalError if !cond.
#define TERAIO_INTERNAL_ASSERT(cond, ...)                                                      \
  do {                                                                                         \
    if (!(cond)) [[unlikely]] {                                                                \
      ::teraio::detail::throw_internal(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
    }                                                                                          \
  } while (0)
