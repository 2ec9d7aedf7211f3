// Our own declarations of the few cuFile (GPUDirect Storage) types and entry points teraio uses,
// written from the public cuFile API reference, and a loader that dlopens libcufile at run time so
// that teraio builds and runs where libcufile is absent. Not NVIDIA's header.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace teraio::storage::cufile {

struct Error {     // CUfileError_t: {CUfileOpError err; CUresult cu_err;}
  int err;         // 0 == success; cuFile codes are 5000 and up
  int cu_err;
};
using Handle = void*;  // CUfileHandle_t
constexpr int kHandleTypeOpaqueFd = 1;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD
struct Descr {     // CUfileDescr_t
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

struct Api {
  bool loaded = false;
  std::string load_error;  // dlerror() when not loaded
  Error (*driver_open)() = nullptr;
  Error (*driver_close)() = nullptr;
  Error (*handle_register)(Handle*, Descr*) = nullptr;
  void (*handle_deregister)(Handle) = nullptr;
  Error (*buf_register)(const void*, size_t, int) = nullptr;
  Error (*buf_deregister)(const void*) = nullptr;
  ssize_t (*read)(Handle, void*, size_t, off_t, off_t) = nullptr;
  ssize_t (*write)(Handle, const void*, size_t, off_t, off_t) = nullptr;
};

// Loads libcufile.so.0 (then libcufile.so) once; never throws.
const Api& api();

// Opens the driver once per process (cuFile keeps it open until exit); returns the error.
Error driver_open_once();

}  // namespace teraio::storage::cufile
