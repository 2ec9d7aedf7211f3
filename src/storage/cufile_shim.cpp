// dlopen loader of cuFile and the GDS probe (`teraio iobench --probe`): AUTO mode opens the driver,
// registers a handle on an O_DIRECT file in the target directory, writes and reads 4 KiB from a
// device buffer, and reports the first failing step with its numeric cuFile error (e.g. 5027).
#include "cufile_shim.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda_rt.h"
#include "teraio/error.h"
#include "teraio/storage.h"

namespace teraio::storage {
namespace cufile {

const Api& api() {
  static const Api a = [] {
    Api r;
    void* lib = nullptr;
    for (const char* name : {"libcufile.so.0", "libcufile.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      const char* e = dlerror();
      r.load_error = e != nullptr ? e : "dlopen failed";
    }
    if (lib == nullptr) return r;
    auto sym = [&](const char* name) { return dlsym(lib, name); };
    r.driver_open = reinterpret_cast<decltype(r.driver_open)>(sym("cuFileDriverOpen"));
    r.driver_close = reinterpret_cast<decltype(r.driver_close)>(sym("cuFileDriverClose_v2"));
    if (r.driver_close == nullptr) r.driver_close = reinterpret_cast<decltype(r.driver_close)>(sym("cuFileDriverClose"));
    r.handle_register = reinterpret_cast<decltype(r.handle_register)>(sym("cuFileHandleRegister"));
    r.handle_deregister = reinterpret_cast<decltype(r.handle_deregister)>(sym("cuFileHandleDeregister"));
    r.buf_register = reinterpret_cast<decltype(r.buf_register)>(sym("cuFileBufRegister"));
    r.buf_deregister = reinterpret_cast<decltype(r.buf_deregister)>(sym("cuFileBufDeregister"));
    r.read = reinterpret_cast<decltype(r.read)>(sym("cuFileRead"));
    r.write = reinterpret_cast<decltype(r.write)>(sym("cuFileWrite"));
    if (r.driver_open == nullptr || r.handle_register == nullptr || r.handle_deregister == nullptr ||
        r.read == nullptr || r.write == nullptr) {
      r.load_error = "libcufile lacks cuFileDriverOpen/HandleRegister/Read/Write";
      return r;
    }
    r.loaded = true;
    return r;
  }();
  return a;
}

Error driver_open_once() {
  static std::once_flag once;
  static Error result{0, 0};
  std::call_once(once, [] { result = api().driver_open(); });
  return result;
}

}  // namespace cufile

std::string_view to_string(GdsMode mode) {
  switch (mode) {
    case GdsMode::kOff: return "off";
    case GdsMode::kOn: return "on";
    case GdsMode::kAuto: return "auto";
  }
  return "?";
}

GdsMode parse_gds_mode(std::string_view text) {
  if (text == "off" || text == "OFF") return GdsMode::kOff;
  if (text == "on" || text == "ON") return GdsMode::kOn;
  if (text == "auto" || text == "AUTO") return GdsMode::kAuto;
  throw teraio::Error(fmt::format("GDS mode '{}' is not one of on, off, auto", text));
}

DirectIoProbe probe_direct_io(const std::string& directory) {
  std::string path = directory + "/.teraio-odirect-probe-" + std::to_string(getpid());
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    int e = errno;
    // Without O_DIRECT, to tell "refused" from "cannot create".
    int fd2 = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd2 >= 0) {
      ::close(fd2);
      ::unlink(path.c_str());
      return {false, fmt::format("O_DIRECT refused on {} ({}); buffered I/O used", directory, std::strerror(e))};
    }
    return {false, fmt::format("cannot create a file in {}: {}", directory, std::strerror(e))};
  }
  // Some filesystems accept the flag and fail the I/O: try one aligned write.
  void* buf = nullptr;
  bool ok = posix_memalign(&buf, 4096, 4096) == 0;
  std::string reason;
  if (ok) {
    std::memset(buf, 0, 4096);
    ssize_t n = ::pwrite(fd, buf, 4096, 0);
    if (n != 4096) {
      ok = false;
      reason = fmt::format("O_DIRECT write refused on {} ({}); buffered I/O used", directory,
                           n < 0 ? std::strerror(errno) : "short write");
    }
    std::free(buf);
  }
  ::close(fd);
  ::unlink(path.c_str());
  return {ok, reason};
}

GdsProbe probe_gds(const std::string& directory) {
  GdsProbe p;
  auto fail = [&](std::string step, int code, std::string why) {
    p.step = std::move(step);
    p.error_code = code;
    p.reason = std::move(why);
    return p;
  };
  const auto& a = cufile::api();
  if (!a.loaded) return fail("dlopen", 0, "libcufile not loadable: " + a.load_error + "; POSIX path used");
  p.library_loaded = true;
  if (cuda::device_count() == 0) {
    return fail("cuda", 0, "no usable GPU (" + cuda::unavailable_reason() + "); POSIX path used");
  }
  cufile::Error e = cufile::driver_open_once();
  if (e.err != 0) {
    return fail("cuFileDriverOpen", e.err,
                fmt::format("cuFileDriverOpen failed with cuFile error {} (CUDA {}); POSIX path used", e.err, e.cu_err));
  }
  p.driver_opened = true;
  std::string path = directory + "/.teraio-gds-probe-" + std::to_string(getpid());
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return fail("open", errno, fmt::format("open(O_DIRECT) of {} failed: {}; POSIX path used", path, std::strerror(errno)));
  }
  ::unlink(path.c_str());  // the fd keeps the file alive; nothing to clean up later
  cufile::Descr d{};
  d.type = cufile::kHandleTypeOpaqueFd;
  d.handle.fd = fd;
  cufile::Handle h = nullptr;
  e = a.handle_register(&h, &d);
  if (e.err != 0) {
    ::close(fd);
    return fail("cuFileHandleRegister", e.err,
                fmt::format("cuFileHandleRegister on {} failed with cuFile error {} (CUDA {}){}; POSIX path used",
                            directory, e.err, e.cu_err,
                            e.err == 5027 ? " (unable to get volume attributes: no GDS support for this filesystem)" : ""));
  }
  p.handle_registered = true;
  try {
    Buffer dev = Buffer::allocate(4096, MemoryKind::kDevice, 0);
    std::vector<unsigned char> pattern(4096), back(4096, 0);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7 + 1);
    cuda::memcpy_sync(dev.data(), pattern.data(), 4096);
    ssize_t w = a.write(h, dev.data(), 4096, 0, 0);
    if (w != 4096) {
      a.handle_deregister(h);
      ::close(fd);
      return fail("cuFileWrite", static_cast<int>(w), fmt::format("cuFileWrite returned {}; POSIX path used", w));
    }
    cuda::memcpy_sync(dev.data(), back.data(), 4096);  // clear
    ssize_t r = a.read(h, dev.data(), 4096, 0, 0);
    cuda::memcpy_sync(back.data(), dev.data(), 4096);
    if (r != 4096 || back != pattern) {
      a.handle_deregister(h);
      ::close(fd);
      return fail("cuFileRead", static_cast<int>(r),
                  fmt::format("cuFileRead returned {}{}; POSIX path used", r, r == 4096 ? " with wrong data" : ""));
    }
  } catch (const std::exception& ex) {
    a.handle_deregister(h);
    ::close(fd);
    return fail("cuda", 0, std::string(ex.what()) + "; POSIX path used");
  }
  a.handle_deregister(h);
  ::close(fd);
  p.io_ok = true;
  p.usable = true;
  p.reason = "cuFile usable on " + directory + " (handle registered, 4 KiB write/read verified)";
  return p;
}

}  // namespace teraio::storage
