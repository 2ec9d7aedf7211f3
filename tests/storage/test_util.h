// Helpers of the storage tests: a private temporary directory per test and byte patterns.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "teraio/storage.h"

namespace teraio::storage::test {

class TempDir {
 public:
  explicit TempDir(const std::string& root = "/tmp") {
    std::string tmpl = root + "/teraio-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* p = mkdtemp(buf.data());
    if (p != nullptr) path_ = p;
  }
  ~TempDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }
  bool ok() const { return !path_.empty(); }
  // Regular files anywhere below the directory.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (auto& e : std::filesystem::recursive_directory_iterator(path_)) {
      if (e.is_regular_file()) out.push_back(e.path().string());
    }
    return out;
  }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] auto& e : std::filesystem::recursive_directory_iterator(path_)) ++n;
    return n;
  }

 private:
  std::string path_;
};

// A small file tier on one directory (4 MiB, 64 KiB stripes, queue depth 2).
inline FileTierOptions small_file(const std::string& dir) {
  FileTierOptions o;
  o.paths = {dir};
  o.capacity_bytes = 4 << 20;
  o.stripe_bytes = 64 * 1024;
  o.queue_depth = 2;
  return o;
}

inline std::vector<unsigned char> pattern(uint64_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  return v;
}

}  // namespace teraio::storage::test
