// Tests of stale tier directories (docs/storage.md, "Stale tier directories"): a job killed with
// SIGKILL leaves its directory, which the next file tier on that path (or clean_tier_dirs) removes;
// a live tier's directory, foreign files, other jobs' directories and symbolic links are never
// touched; creators and cleaners racing never lose a live directory.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "teraio/error.h"
#include "teraio/storage.h"
#include "test_util.h"

namespace teraio::storage {
namespace {

namespace fs = std::filesystem;
using test::small_file;
using test::TempDir;

std::vector<std::string> tier_dirs_in(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void touch(const fs::path& p, const std::string& text = "") {
  std::ofstream(p) << text;
}

// The child half of the tests below: holds a file tier on TERAIO_TEST_HOLD_DIR, says so on the
// pipe TERAIO_TEST_READY_FD, then waits to be killed. Runs in a freshly exec'd process (see
// Cleanup.SigtermRemovesTierFilesAndReRaises for why not a plain fork).
TEST(HoldTierChild, HoldUntilKilled) {
  const char* dir = std::getenv("TERAIO_TEST_HOLD_DIR");
  const char* fd = std::getenv("TERAIO_TEST_READY_FD");
  if (dir == nullptr || fd == nullptr)
    GTEST_SKIP() << "runs only as a child of StaleTierDirs tests";
  auto tier = make_file_tier(small_file(dir));
  const char ready = 'r';
  if (::write(std::atoi(fd), &ready, 1) != 1) _exit(5);
  for (;;) ::pause();
}

// A process holding a file tier on `dir` until kill().
class Holder {
 public:
  explicit Holder(const std::string& dir) {
    int p[2];
    if (::pipe(p) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(p[0]);
      setenv("TERAIO_TEST_HOLD_DIR", dir.c_str(), 1);
      setenv("TERAIO_TEST_READY_FD", std::to_string(p[1]).c_str(), 1);
      execl("/proc/self/exe", "storage_tier_dirs_test", "--gtest_filter=HoldTierChild.*",
            static_cast<char*>(nullptr));
      _exit(4);
    }
    ::close(p[1]);
    char c = 0;
    ready_ = ::read(p[0], &c, 1) == 1;
    ::close(p[0]);
  }
  ~Holder() { kill(); }
  bool ready() const { return ready_; }
  pid_t pid() const { return pid_; }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
};

bool has_note(const TierInfo& info, const std::string& text) {
  for (const std::string& n : info.notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(StaleTierDirs, AKilledJobsDirectoryIsRemovedByTheNextTierAndALiveOneNever) {
  TempDir root;
  Holder holder(root.path());
  ASSERT_TRUE(holder.ready());
  const std::string child_dir = fmt::format("{}/teraio-{}-0", root.path(), holder.pid());
  ASSERT_TRUE(fs::exists(child_dir + "/stripe.dat"));

  {  // Alive: a new tier and the cleaner leave it alone.
    auto tier = make_file_tier(small_file(root.path()));
    EXPECT_FALSE(has_note(tier->info(), "stale"))
        << fmt::format("{}", fmt::join(tier->info().notes, "; "));
    const auto reports = clean_tier_dirs(root.path(), {});
    ASSERT_EQ(reports.size(), 2u);  // the child's and ours
    for (const TierDirReport& r : reports) EXPECT_EQ(r.state, TierDirState::kInUse) << r.path;
  }
  EXPECT_TRUE(fs::exists(child_dir + "/stripe.dat"));

  holder.kill();  // SIGKILL: no handler runs, the directory stays with its reservation
  ASSERT_TRUE(fs::exists(child_dir + "/stripe.dat"));
  auto tier = make_file_tier(small_file(root.path()));
  EXPECT_TRUE(has_note(tier->info(), "removed stale tier directory " + child_dir))
      << fmt::format("{}", fmt::join(tier->info().notes, "; "));
  EXPECT_FALSE(fs::exists(child_dir));
  EXPECT_EQ(tier_dirs_in(root.path()).size(), 1u);  // only the new tier's
  tier.reset();
  EXPECT_EQ(root.entries(), 0u);
}

TEST(StaleTierDirs, CleanRemovesOnlyTeraiosOwnFilesAndFollowsNoLinks) {
  TempDir root, outside;
  const fs::path r = root.path();
  // Stale (lock free) with 1 MiB reserved: removed, its bytes counted.
  fs::create_directory(r / "teraio-999999999-0");
  touch(r / "teraio-999999999-0" / "lock");
  {
    const int fd =
        ::open((r / "teraio-999999999-0" / "stripe.dat").c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fallocate(fd, 0, 0, 1 << 20) == 0 || ::ftruncate(fd, 1 << 20) == 0, true);
    ::close(fd);
  }
  // Stale, but holding a file teraio did not put there: kept, file intact.
  fs::create_directory(r / "teraio-999999999-1");
  touch(r / "teraio-999999999-1" / "stripe.dat");
  touch(r / "teraio-999999999-1" / "notes.txt", "mine");
  // No lock file (an older teraio), process gone: removed. Our own pid: in use.
  fs::create_directory(r / "teraio-999999999-2");
  touch(r / "teraio-999999999-2" / "stripe.dat");
  touch(r / "teraio-999999999-2" / ".teraio-odirect-probe-999999999");
  const std::string own = fmt::format("teraio-{}-77", ::getpid());
  fs::create_directory(r / own);
  touch(r / own / "stripe.dat");
  // A symbolic link with a tier name, to a stale-looking directory elsewhere: never followed.
  fs::create_directory(fs::path(outside.path()) / "victim");
  touch(fs::path(outside.path()) / "victim" / "stripe.dat", "keep");
  touch(fs::path(outside.path()) / "victim" / "lock");
  fs::create_symlink(fs::path(outside.path()) / "victim", r / "teraio-999999999-3");
  // Another job's directory, an empty one and a user's file with a matching name.
  fs::create_directory(r / "iobench-999999999-0");
  touch(r / "iobench-999999999-0" / "stripe.dat");
  fs::create_directory(r / "backup-2024-01");
  touch(r / "data-1-2", "user");

  // Dry run: nothing removed.
  auto reports = clean_tier_dirs(root.path(), {"teraio", true});
  ASSERT_EQ(reports.size(), 4u);
  EXPECT_EQ(reports[0].path, root.path() + "/" + own);
  EXPECT_EQ(reports[0].state, TierDirState::kInUse);
  EXPECT_EQ(reports[1].state, TierDirState::kStale);
  EXPECT_GE(reports[1].bytes, 1u << 20);
  EXPECT_EQ(reports[2].state, TierDirState::kKept);
  EXPECT_NE(reports[2].reason.find("notes.txt"), std::string::npos) << reports[2].reason;
  EXPECT_EQ(reports[3].state, TierDirState::kStale);
  EXPECT_EQ(tier_dirs_in(root.path()).size(), 8u);

  reports = clean_tier_dirs(root.path(), {"teraio", false});
  ASSERT_EQ(reports.size(), 4u);
  EXPECT_EQ(reports[1].state, TierDirState::kRemoved);
  EXPECT_EQ(reports[3].state, TierDirState::kRemoved);
  EXPECT_EQ(tier_dirs_in(root.path()),
            (std::vector<std::string>{"backup-2024-01", "data-1-2", "iobench-999999999-0", own,
                                      "teraio-999999999-1", "teraio-999999999-3"}));
  EXPECT_TRUE(fs::exists(r / "teraio-999999999-1" / "notes.txt"));
  EXPECT_TRUE(fs::exists(r / "teraio-999999999-1" / "stripe.dat"));
  EXPECT_TRUE(fs::exists(fs::path(outside.path()) / "victim" / "stripe.dat"));
  EXPECT_TRUE(fs::exists(fs::path(outside.path()) / "victim" / "lock"));

  // Without a job name every job's directories are looked at.
  reports = clean_tier_dirs(root.path(), {});
  bool iobench_removed = false;
  for (const auto& x : reports)
    iobench_removed |= x.path.ends_with("iobench-999999999-0") && x.state == TierDirState::kRemoved;
  EXPECT_TRUE(iobench_removed);
  EXPECT_TRUE(fs::exists(r / "backup-2024-01"));
  EXPECT_TRUE(fs::exists(r / "data-1-2"));
}

TEST(StaleTierDirs, BadRootIsAClearError) {
  try {
    clean_tier_dirs("/nonexistent/teraio", {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/teraio: No such file or directory"),
              std::string::npos)
        << e.what();
  }
}

TEST(StaleTierDirs, CreatorsRacingCleanersNeverLoseALiveDirectory) {
  TempDir root;
  std::atomic<bool> stop{false};
  std::thread cleaner([&] {
    while (!stop.load()) clean_tier_dirs(root.path(), {});
  });
  std::vector<unsigned char> data(4096, 7), back(4096);
  for (int i = 0; i < 200; ++i) {
    auto tier = make_sync_file_tier(small_file(root.path()));
    const std::string stripe = tier->info().files[0];
    tier->write(BufferView::host(data.data(), data.size()), 0);
    ASSERT_TRUE(fs::exists(stripe)) << "a cleaner removed a live tier's file, round " << i;
    ASSERT_TRUE(fs::exists(stripe.substr(0, stripe.rfind('/')) + "/lock")) << i;
    tier->read(BufferView::host(back.data(), back.size()), 0);
    ASSERT_EQ(back, data);
  }
  stop.store(true);
  cleaner.join();
  EXPECT_EQ(root.entries(), 0u);
}

}  // namespace
}  // namespace teraio::storage
