// Unit tests of the storage pieces: extent allocator, CRC32C, checksum verification, fault
// injection, host cap, cleanup on SIGTERM, io_uring / O_DIRECT / cuFile probes and fallbacks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "file_engines.h"  // file::testing::fail_next_ring_wait
#include "teraio/error.h"
#include "teraio/storage.h"
#include "test_util.h"

namespace teraio::storage {
namespace {

using test::pattern;
using test::small_file;
using test::TempDir;

TEST(ExtentAllocator, AllocatesAlignedFirstFitAndCoalesces) {
  ExtentAllocator a(64 * 1024);
  Extent x = a.allocate(1);
  Extent y = a.allocate(5000);
  Extent z = a.allocate(4096);
  EXPECT_EQ(x.offset_bytes, 0u);
  EXPECT_EQ(x.size_bytes, 4096u);
  EXPECT_EQ(y.offset_bytes, 4096u);
  EXPECT_EQ(y.size_bytes, 8192u);
  EXPECT_EQ(z.offset_bytes, 12288u);
  a.free(y);
  EXPECT_EQ(a.allocate(8192).offset_bytes, 4096u);  // first fit reuses the hole
  a.free(Extent{4096, 8192});
  a.free(x);
  a.free(z);
  EXPECT_EQ(a.free_bytes(), 64u * 1024);
  EXPECT_EQ(a.largest_free_bytes(), 64u * 1024);  // fully coalesced
}

TEST(ExtentAllocator, FullAndDoubleFreeAreClearErrors) {
  ExtentAllocator a(16 * 1024);
  Extent x = a.allocate(16 * 1024);
  EXPECT_FALSE(a.try_allocate(1).has_value());
  try {
    a.allocate(4096);
    FAIL();
  } catch (const teraio::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tier full"), std::string::npos) << e.what();
  }
  a.free(x);
  EXPECT_THROW(a.free(x), teraio::Error);
}

TEST(Checksum, KnownVectorsAndSensitivity) {
  EXPECT_EQ(checksum("", 0), 0x2D06800538D394C2ull);  // XXH3-64 of no bytes (xxHash's test vector)
  auto d = pattern(100000, 1);
  const uint64_t whole = checksum(d.data(), d.size());
  EXPECT_EQ(checksum(d.data(), d.size()), whole);
  d[5000] ^= 1;
  EXPECT_NE(checksum(d.data(), d.size()), whole);
}

TEST(HostTier, CapExceededIsAClearErrorNotAnOom) {
  HostTierOptions o;
  o.capacity_bytes = 1 << 20;
  auto tier = make_host_tier(o);
  std::vector<unsigned char> data(4096);
  try {
    tier->write(BufferView::host(data.data(), data.size()), (1 << 20) - 100);
    FAIL() << "no error";
  } catch (const teraio::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cap"), std::string::npos) << e.what();
  }
  tier->write(BufferView::host(data.data(), data.size()), (1 << 20) - 4096);  // still usable
}

TEST(FileTier, ChecksumMismatchIsReportedOnRead) {
  TempDir dir;
  auto o = small_file(dir.path());
  o.checksums = true;
  auto tier = make_file_tier(o);
  auto data = pattern(20000, 5);
  tier->write(BufferView::host(data.data(), data.size()), 8192);
  std::vector<std::string> files;
  for (const std::string& f : dir.files()) {
    if (f.ends_with("/stripe.dat")) files.push_back(f);
  }
  ASSERT_EQ(files.size(), 1u);
  int fd = ::open(files[0].c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  unsigned char junk = static_cast<unsigned char>(data[100] ^ 0xFF);
  ASSERT_EQ(::pwrite(fd, &junk, 1, 8192 + 100), 1);
  ::fsync(fd);
  ::close(fd);
  std::vector<unsigned char> back(data.size());
  auto r = tier->submit({Direction::kRead, BufferView::host(back.data(), back.size()), 8192}).wait();
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("checksum mismatch"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find(files[0]), std::string::npos) << r.error;
}

TEST(FileTier, ThreadsEngineWhenAskedAndIoUringWhenAvailable) {
  TempDir dir;
  auto o = small_file(dir.path());
  o.engine = FileEngine::kThreads;
  EXPECT_EQ(make_file_tier(o)->info().engine, "threads");
  auto probe = probe_io_uring();
  o.engine = FileEngine::kAuto;
  auto tier = make_file_tier(o);
  if (probe.supported) {
    EXPECT_EQ(tier->info().engine, "io_uring");
  } else {
    EXPECT_EQ(tier->info().engine, "threads");
    ASSERT_FALSE(tier->info().notes.empty());
    EXPECT_NE(tier->info().notes.back().find("io_uring unavailable"), std::string::npos);
  }
}

// Note [io_uring engine]: when the ring itself fails, the pieces in flight fail with its error and
// every later request goes through blocking pread/pwrite on the same files, with the same bytes;
// info() says so.
TEST(FileTier, BrokenRingFailsWhatIsInFlightThenFallsBackToBlockingIo) {
  if (!probe_io_uring().supported) GTEST_SKIP() << "io_uring unavailable: " << probe_io_uring().reason;
  TempDir dir;
  auto o = small_file(dir.path());
  o.engine = FileEngine::kIoUring;
  o.checksums = true;
  auto tier = make_file_tier(o);
  ASSERT_EQ(tier->info().engine, "io_uring");
  auto a = pattern(200000, 1);
  tier->write(BufferView::host(a.data(), a.size()), 4096);  // through the ring
  file::testing::fail_next_ring_wait(EBADF);
  auto b = pattern(150000, 2);
  auto r = tier->submit({Direction::kWrite, BufferView::host(b.data(), b.size()), 1 << 20}).wait();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error_code, EBADF);
  EXPECT_NE(r.error.find("io_uring wait failed"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("stripe.dat"), std::string::npos) << r.error;

  tier->write(BufferView::host(b.data(), b.size()), 1 << 20);  // blocking from now on
  std::vector<unsigned char> back_a(a.size()), back_b(b.size());
  tier->read(BufferView::host(back_a.data(), back_a.size()), 4096);
  tier->read(BufferView::host(back_b.data(), back_b.size()), 1 << 20);
  EXPECT_EQ(back_a, a);
  EXPECT_EQ(back_b, b);
  bool noted = false;
  for (const std::string& n : tier->info().notes)
    noted = noted || n.find("blocking pread/pwrite used from then on") != std::string::npos;
  EXPECT_TRUE(noted) << "info().notes does not say the ring failed";
  tier->shutdown(ShutdownMode::kDrain);
}

TEST(FileTier, MissingDirectoryAndImpossibleReservationAreClearErrors) {
  FileTierOptions o = small_file("/nonexistent/teraio");
  EXPECT_THROW(make_file_tier(o), teraio::Error);
  TempDir dir;
  o = small_file(dir.path());
  o.capacity_bytes = 1ull << 60;  // no disk has an exabyte free
  try {
    make_file_tier(o);
    FAIL() << "no error";
  } catch (const teraio::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reserve"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dir.entries(), 0u) << "a failed tier must not leave files behind";
}

TEST(FileTier, GdsOnFailsClearlyWhenCuFileIsUnusableAndAutoFallsBack) {
  TempDir dir;
  GdsProbe p = probe_gds(dir.path());
  if (p.usable) GTEST_SKIP() << "cuFile works here";
  EXPECT_FALSE(p.reason.empty());
  EXPECT_FALSE(p.step.empty());
  auto o = small_file(dir.path());
  o.gds = GdsMode::kOn;
  EXPECT_THROW(make_file_tier(o), teraio::Error);
  o.gds = GdsMode::kAuto;
  auto tier = make_file_tier(o);
  bool noted = false;
  for (auto& n : tier->info().notes) noted |= n.find("GDS:") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(FaultTier, InjectedErrorsNameOffsetAndSizeAndLaterRequestsAreUnaffected) {
  TempDir dir;
  FaultOptions f;
  f.rules = {{FaultKind::kEio, 1}, {FaultKind::kEnospc, 2}, {FaultKind::kShortWrite, 3}, {FaultKind::kSlow, 4, 1, 20000}};
  auto tier = make_fault_tier(make_file_tier(small_file(dir.path())), f);
  auto data = pattern(10000, 8);
  auto w = [&](uint64_t off) { return tier->submit({Direction::kWrite, BufferView::host(data.data(), data.size()), off}); };
  auto c0 = w(0), c1 = w(12288), c2 = w(24576), c3 = w(36864);
  auto t_slow = std::chrono::steady_clock::now();
  auto c4 = w(49152);
  EXPECT_TRUE(c0.wait().ok);
  EXPECT_FALSE(c1.wait().ok);
  EXPECT_EQ(c1.wait().error_code, EIO);
  EXPECT_NE(c1.wait().error.find("12288"), std::string::npos) << c1.wait().error;
  EXPECT_NE(c1.wait().error.find("10000"), std::string::npos) << c1.wait().error;
  EXPECT_EQ(c2.wait().error_code, ENOSPC);
  EXPECT_FALSE(c3.wait().ok);
  EXPECT_EQ(c3.wait().bytes, 5000u);
  EXPECT_NE(c3.wait().error.find("short write"), std::string::npos) << c3.wait().error;
  EXPECT_TRUE(c4.wait().ok);
  EXPECT_GE(std::chrono::steady_clock::now() - t_slow, std::chrono::milliseconds(20));
  EXPECT_THROW(c1.get(), teraio::Error);
  // Later requests are unaffected and the successful ones are intact.
  std::vector<unsigned char> back(data.size());
  tier->read(BufferView::host(back.data(), back.size()), 0);
  EXPECT_EQ(back, data);
  tier->read(BufferView::host(back.data(), back.size()), 49152);
  EXPECT_EQ(back, data);
}

TEST(FaultTier, RulesAddedWhileRunningFilterByDirectionAndCanBeCleared) {
  TempDir dir;
  auto tier = make_fault_tier(make_file_tier(small_file(dir.path())), {});
  auto data = pattern(8192, 3);
  std::vector<unsigned char> back(data.size());
  auto host = [](auto& v) { return BufferView::host(v.data(), v.size()); };
  tier->write(host(data), 0);
  FaultRule read_fails;
  read_fails.kind = FaultKind::kError;
  read_fails.error_code = EPERM;
  read_fails.direction = Direction::kRead;
  read_fails.nth_request = 1;  // the second read from now
  tier->inject(read_fails);
  tier->write(host(data), 8192);  // writes are not counted by a read rule
  EXPECT_TRUE(tier->submit({Direction::kRead, host(back), 0}).wait().ok);
  const IoResult r = tier->submit({Direction::kRead, host(back), 8192}).wait();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error_code, EPERM);
  EXPECT_FALSE(lost(r));  // may be transient
  EXPECT_NE(r.error.find("stripe.dat"), std::string::npos) << r.error;  // names the file
  EXPECT_TRUE(tier->submit({Direction::kRead, host(back), 8192}).wait().ok);  // count was 1
  FaultRule always;
  always.kind = FaultKind::kEio;
  always.count = 1000;
  tier->inject(always);
  EXPECT_FALSE(tier->submit({Direction::kWrite, host(data), 0}).wait().ok);
  tier->clear_faults();
  EXPECT_TRUE(tier->submit({Direction::kWrite, host(data), 0}).wait().ok);
  FaultRule bad;
  bad.kind = FaultKind::kError;
  EXPECT_THROW(tier->inject(bad), teraio::Error);  // no error code
}

TEST(FileTier, DamagedAndTruncatedFilesAreLostBytesNotTransientErrors) {
  for (FileEngine engine : {FileEngine::kThreads, FileEngine::kAuto}) {
    TempDir dir;
    auto o = small_file(dir.path());
    o.checksums = true;
    o.engine = engine;
    auto tier = make_file_tier(o);
    auto data = pattern(3 * 65536 + 100, 9);  // several stripes
    tier->write(BufferView::host(data.data(), data.size()), 0);
    std::string file;
    for (const std::string& f : dir.files())
      if (f.ends_with("/stripe.dat")) file = f;
    ASSERT_FALSE(file.empty());
    int fd = ::open(file.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    unsigned char junk = static_cast<unsigned char>(data[70000] ^ 0x10);
    ASSERT_EQ(::pwrite(fd, &junk, 1, 70000), 1);
    std::vector<unsigned char> back(data.size());
    IoResult r = tier->submit({Direction::kRead, BufferView::host(back.data(), back.size()), 0}).wait();
    EXPECT_EQ(r.error_code, EBADMSG) << r.error;
    EXPECT_TRUE(lost(r));
    EXPECT_NE(r.error.find("checksum mismatch (written "), std::string::npos) << r.error;
    EXPECT_NE(r.error.find(file), std::string::npos) << r.error;
    ASSERT_EQ(::ftruncate(fd, 0), 0);
    ::close(fd);
    r = tier->submit({Direction::kRead, BufferView::host(back.data(), back.size()), 0}).wait();
    EXPECT_EQ(r.error_code, ENODATA) << r.error;
    EXPECT_TRUE(lost(r));
    EXPECT_NE(r.error.find("unexpected end of file"), std::string::npos) << r.error;
  }
}

// The child half of Cleanup.SigtermRemovesTierFilesAndReRaises. It runs in a freshly exec'd
// process (a forked child of a process that already initialized CUDA cannot use CUDA, and the file
// tier pins its bounce buffers when a GPU is present), so it does nothing unless the parent set
// TERAIO_TEST_SIGTERM_DIR.
TEST(CleanupChild, WriteThenSigterm) {
  const char* dir = std::getenv("TERAIO_TEST_SIGTERM_DIR");
  if (dir == nullptr) GTEST_SKIP() << "runs only as the child of Cleanup.SigtermRemovesTierFilesAndReRaises";
  auto tier = make_file_tier(small_file(dir));
  std::vector<unsigned char> d(4096, 1);
  tier->write(BufferView::host(d.data(), d.size()), 0);
  raise(SIGTERM);
  _exit(3);  // not reached: the handler re-raises with the default action
}

TEST(Cleanup, SigtermRemovesTierFilesAndReRaises) {
  TempDir dir;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("TERAIO_TEST_SIGTERM_DIR", dir.path().c_str(), 1);
    execl("/proc/self/exe", "storage_unit_test", "--gtest_filter=CleanupChild.WriteThenSigterm",
          static_cast<char*>(nullptr));
    _exit(4);  // exec failed
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  EXPECT_EQ(dir.entries(), 0u) << "files left behind after SIGTERM";
}

TEST(Probes, DirectIoOnTmpfsIsReportedEitherWay) {
  TempDir shm("/dev/shm");
  ASSERT_TRUE(shm.ok());
  auto p = probe_direct_io(shm.path());
  if (!p.supported) {
    EXPECT_NE(p.reason.find("O_DIRECT"), std::string::npos) << p.reason;
  }
  EXPECT_EQ(shm.entries(), 0u);
}

TEST(Buffer, DeviceAllocationWithoutGpuIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(cuda_unavailable_reason().empty());
  EXPECT_THROW(Buffer::allocate(4096, MemoryKind::kDevice, 0), teraio::Error);
  Buffer pinned = Buffer::allocate(4096, MemoryKind::kHostPinned);  // falls back to plain memory
  EXPECT_FALSE(pinned.pinned());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pinned.data()) % 4096, 0u);
}

TEST(BufferView, SubviewChecksRange) {
  unsigned char b[16];
  BufferView v = BufferView::host(b, 16);
  EXPECT_EQ(v.subview(4, 12).bytes(), reinterpret_cast<std::byte*>(b + 4));
  EXPECT_THROW(v.subview(4, 13), teraio::Error);
}

}  // namespace
}  // namespace teraio::storage
