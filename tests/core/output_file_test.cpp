// Tests of write_file_atomically (Note [Atomic output files]): the new content replaces the old
// file whole; a failed write (injected ENOSPC, /dev/full, a missing directory) leaves the old file
// and no temporary file, and the error names the path and the reason.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "../common/files.h"
#include "teraio/error.h"
#include "teraio/output_file.h"

namespace teraio {
namespace {

namespace fs = std::filesystem;

using test::slurp;

class OutputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("teraio_output_file_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  fs::path dir_;
};

// Writes half of the first request, then fails every later one with ENOSPC.
ssize_t write_then_enospc(int fd, const void* data, size_t size) {
  static thread_local int calls = 0;
  if (calls++ % 2 == 0) return ::write(fd, data, size / 2 > 0 ? size / 2 : size);
  errno = ENOSPC;
  return -1;
}

ssize_t interrupted_then_short(int fd, const void* data, size_t size) {
  static thread_local int calls = 0;
  if (calls++ == 0) {
    errno = EINTR;
    return -1;
  }
  return ::write(fd, data, size > 3 ? 3 : size);
}

TEST_F(OutputFile, CreatesAndReplacesWholeFiles) {
  const fs::path p = dir_ / "out.json";
  write_file_atomically(p.string(), "first");
  EXPECT_EQ(slurp(p), "first");
  write_file_atomically(p.string(), "second, longer");
  EXPECT_EQ(slurp(p), "second, longer");
  write_file_atomically(p.string(), "");
  EXPECT_EQ(slurp(p), "");
  EXPECT_EQ(entries(), 1u) << "a temporary file was left";
}

TEST_F(OutputFile, FailedWriteLeavesTheOldFileAndNoTemporaryFile) {
  const fs::path p = dir_ / "report.html";
  write_file_atomically(p.string(), "old content");
  const std::string big(100000, 'x');
  try {
    detail::write_file_atomically(p.string(), big, &write_then_enospc);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(p.string()), std::string::npos) << what;
    EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
  }
  EXPECT_EQ(slurp(p), "old content");
  EXPECT_EQ(entries(), 1u) << "a temporary file was left";
}

TEST_F(OutputFile, RetriesInterruptedAndShortWrites) {
  const fs::path p = dir_ / "t.json";
  detail::write_file_atomically(p.string(), "0123456789", &interrupted_then_short);
  EXPECT_EQ(slurp(p), "0123456789");
}

TEST_F(OutputFile, KeepsTheModeOfTheFileItReplaces) {
  const fs::path p = dir_ / "plan.json";
  write_file_atomically(p.string(), "a");
  ASSERT_EQ(::chmod(p.c_str(), 0640), 0);
  write_file_atomically(p.string(), "b");
  struct stat st;
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
}

TEST_F(OutputFile, FollowsASymbolicLinkAndKeepsIt) {
  const fs::path target = dir_ / "real.json";
  const fs::path link = dir_ / "link.json";
  write_file_atomically(target.string(), "old");
  fs::create_symlink(target, link);
  write_file_atomically(link.string(), "new");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(target), "new");
}

TEST_F(OutputFile, MissingDirectoryAndDirectoryTargetAreClearErrors) {
  const std::string missing = (dir_ / "no" / "such" / "x.json").string();
  try {
    write_file_atomically(missing, "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
  try {
    write_file_atomically(dir_.string(), "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Is a directory"), std::string::npos) << e.what();
  }
}

TEST_F(OutputFile, DevicesAreWrittenInPlace) {
  write_file_atomically("/dev/null", "discarded");
  try {
    write_file_atomically("/dev/full", "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: No space left on device"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_character_file("/dev/full")) << "/dev/full was replaced";
}

}  // namespace
}  // namespace teraio
