// One conformance suite run against every storage backend: the synchronous reference, the
// io_uring file tier, the thread-pool file tier, a 3-path striped tier, a tier on tmpfs (O_DIRECT
// refused), the host arena, and the fault wrapper in pass-through mode. The sync tier is the oracle.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "internal.h"  // a completion finished by hand: the write a read is ordered after
#include "teraio/error.h"
#include "teraio/storage.h"
#include "test_util.h"

namespace teraio::storage {
namespace {

using test::pattern;
using test::TempDir;

constexpr uint64_t kStripe = 64 * 1024;  // small, so "larger than a bounce buffer" is cheap
constexpr uint64_t kCapacity = 16ull << 20;

struct Backend {
  std::string name;
  bool is_file = false;
  bool queued = true;  // false for the synchronous tier (no queue, so no priorities)
  std::unique_ptr<Tier> (*make)(const std::vector<std::string>& dirs);
  int ndirs = 1;
  bool shm = false;
};

FileTierOptions file_options(const std::vector<std::string>& dirs) {
  FileTierOptions o;
  o.paths = dirs;
  o.capacity_bytes = kCapacity;
  o.stripe_bytes = kStripe;
  o.queue_depth = 2;
  o.checksums = true;
  return o;
}

const std::vector<Backend>& backends() {
  static const std::vector<Backend> list = {
      {"sync", true, false, [](const std::vector<std::string>& d) { return make_sync_file_tier(file_options(d)); }},
      {"uring", true, true,
       [](const std::vector<std::string>& d) {
         auto o = file_options(d);
         o.engine = FileEngine::kAuto;
         return make_file_tier(o);
       }},
      {"threads", true, true,
       [](const std::vector<std::string>& d) {
         auto o = file_options(d);
         o.engine = FileEngine::kThreads;
         return make_file_tier(o);
       }},
      {"striped3", true, true, [](const std::vector<std::string>& d) { return make_file_tier(file_options(d)); }, 3},
      {"shm", true, true, [](const std::vector<std::string>& d) { return make_file_tier(file_options(d)); }, 1, true},
      {"host", false, true,
       [](const std::vector<std::string>&) {
         HostTierOptions o;
         o.capacity_bytes = kCapacity;
         o.worker_threads = 1;
         o.checksums = true;
         return make_host_tier(o);
       }},
      {"fault_passthrough", true, true,
       [](const std::vector<std::string>& d) -> std::unique_ptr<Tier> { return make_fault_tier(make_file_tier(file_options(d)), {}); }},
  };
  return list;
}

class Conformance : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    const Backend& b = backends()[GetParam()];
    for (int i = 0; i < b.ndirs; ++i) dirs_.push_back(std::make_unique<TempDir>(b.shm ? "/dev/shm" : "/tmp"));
    std::vector<std::string> paths;
    for (auto& d : dirs_) {
      ASSERT_TRUE(d->ok());
      paths.push_back(d->path());
    }
    tier_ = b.make(paths);
    oracle_dir_ = std::make_unique<TempDir>();
    oracle_ = make_sync_file_tier(file_options({oracle_dir_->path()}));
  }
  void TearDown() override {
    tier_.reset();
    oracle_.reset();
  }
  const Backend& backend() const { return backends()[GetParam()]; }

  std::vector<std::unique_ptr<TempDir>> dirs_;
  std::unique_ptr<TempDir> oracle_dir_;
  std::unique_ptr<Tier> tier_;
  std::unique_ptr<Tier> oracle_;
};

TEST_P(Conformance, RoundTripEdgeSizesAndOffsets) {
  const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, 3 * kStripe + 123};
  const uint64_t offsets[] = {0, 1, 4095, 8192 + 17, kStripe - 5};
  uint64_t seed = 1;
  for (uint64_t size : sizes) {
    for (uint64_t off : offsets) {
      auto data = pattern(size, ++seed);
      tier_->write(BufferView::host(data.data(), size), off);
      std::vector<unsigned char> back(size + 1, 0xEE);
      tier_->read(BufferView::host(back.data(), size), off);
      back.pop_back();
      ASSERT_EQ(back, data) << "size " << size << " offset " << off;
    }
  }
}

TEST_P(Conformance, UnalignedHostBufferAddress) {
  std::vector<unsigned char> raw(3 * kStripe + 64);
  auto data = pattern(3 * kStripe, 7);
  std::copy(data.begin(), data.end(), raw.begin() + 3);  // address misaligned by 3
  tier_->write(BufferView::host(raw.data() + 3, data.size()), 4096);
  std::vector<unsigned char> back_raw(3 * kStripe + 64, 0);
  tier_->read(BufferView::host(back_raw.data() + 5, data.size()), 4096);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), back_raw.begin() + 5));
}

TEST_P(Conformance, RandomWritesMatchTheSyncOracle) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 25; ++i) {
    uint64_t size = rng() % (2 * kStripe + 1);
    uint64_t off = rng() % (kCapacity / 4);
    auto data = pattern(size, rng());
    tier_->write(BufferView::host(data.data(), size), off);
    oracle_->write(BufferView::host(data.data(), size), off);
  }
  for (int i = 0; i < 25; ++i) {
    uint64_t size = rng() % (2 * kStripe + 1);
    uint64_t off = rng() % (kCapacity / 4);
    std::vector<unsigned char> a(size), b(size);
    tier_->read(BufferView::host(a.data(), size), off);
    oracle_->read(BufferView::host(b.data(), size), off);
    ASSERT_EQ(a, b) << "read of " << size << " bytes at " << off;
  }
}

TEST_P(Conformance, ManyConcurrentRequestsFromSeveralThreads) {
  constexpr int kThreads = 4, kPerThread = 10;
  constexpr uint64_t kSlot = 40000;  // unaligned sizes and slots
  std::vector<std::vector<unsigned char>> data(kThreads * kPerThread);
  for (size_t i = 0; i < data.size(); ++i) data[i] = pattern(kSlot - i * 13, i + 100);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Completion> cs;
      for (int j = 0; j < kPerThread; ++j) {
        size_t i = static_cast<size_t>(t * kPerThread + j);
        cs.push_back(tier_->submit({Direction::kWrite, BufferView::host(data[i].data(), data[i].size()), i * kSlot}));
      }
      for (auto& c : cs) c.get();
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::vector<unsigned char>> back(data.size());
  std::vector<Completion> cs;
  for (size_t i = 0; i < data.size(); ++i) {
    back[i].resize(data[i].size());
    cs.push_back(tier_->submit({Direction::kRead, BufferView::host(back[i].data(), back[i].size()), i * kSlot}));
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    const IoResult& r = cs[i].wait();
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.bytes, data[i].size());
    EXPECT_EQ(back[i], data[i]) << "request " << i;
  }
}

TEST_P(Conformance, UrgentRequestOvertakesQueuedOnes) {
  if (!backend().queued) GTEST_SKIP() << "the synchronous tier completes every request inside submit()";
  // Only the requests still unfinished when the urgent one was submitted can be overtaken: on a
  // busy machine a fast tier (host memory) may finish most of the queue while it is being filled,
  // so those are left out of the count, and a trial where too few were left is repeated.
  constexpr int kQueued = 200;
  constexpr int kEnoughPending = 40;
  constexpr uint64_t kSize = kStripe;  // one stripe each, spread over every path
  std::vector<unsigned char> data = pattern(kSize, 3);
  std::vector<unsigned char> urgent_data = pattern(kSize, 4);
  auto steady_ns = [] {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  };
  int pending = 0, before = 0;
  for (int trial = 0; trial < 10 && pending < kEnoughPending; ++trial) {
    std::vector<Completion> cs;
    for (int i = 0; i < kQueued; ++i) {
      cs.push_back(tier_->submit({Direction::kWrite, BufferView::host(data.data(), kSize), uint64_t(i) * kSize}));
    }
    uint64_t t_submit = steady_ns();
    Completion urgent = tier_->submit(
        {Direction::kWrite, BufferView::host(urgent_data.data(), kSize), uint64_t(kQueued) * kSize, Priority::kUrgent});
    ASSERT_TRUE(urgent.wait().ok) << urgent.wait().error;
    uint64_t t_urgent = urgent.wait().finish_ns;
    pending = before = 0;
    for (auto& c : cs) {
      ASSERT_TRUE(c.wait().ok) << c.wait().error;
      if (c.wait().finish_ns <= t_submit) continue;  // done before the urgent request existed
      ++pending;
      if (c.wait().finish_ns < t_urgent) ++before;
    }
  }
  RecordProperty("pending", pending);
  RecordProperty("overtaken_by", before);
  if (pending < kEnoughPending) GTEST_SKIP() << "the tier drained its queue before the urgent request in every trial";
  // Overtaking: finished no later than the middle of the queue it found (under AddressSanitizer on
  // 2 loaded cores a striped tier once finished it after exactly half: 57 of 114).
  EXPECT_LE(before, pending / 2) << "the urgent request finished after " << before << " of the " << pending
                                 << " requests still queued when it was submitted";
}

// Note [Reads after their write]: a read ordered after a write (IoRequest::after) moves its bytes only
// once that write has ended, whether the tier waits in submit() (file tiers) or in a worker (host
// buffers on the host tier). The "write" here is a completion the test finishes by hand after
// putting new bytes at the offset: a read that did not wait returns the old ones.
TEST_P(Conformance, ReadOrderedAfterAWriteSeesItsBytes) {
  constexpr uint64_t kSize = 3 * kStripe + 100;
  const uint64_t offset = 5 * kStripe;
  std::vector<unsigned char> before = pattern(kSize, 11), after = pattern(kSize, 12), back(kSize);
  tier_->write(BufferView::host(before.data(), kSize), offset);
  auto write = std::make_shared<detail::CompletionState>();
  IoRequest read{Direction::kRead, BufferView::host(back.data(), kSize), offset};
  read.after = Completion(write);
  Completion done;
  std::thread reader([&] { done = tier_->submit(read); });  // a file tier waits inside submit()
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  tier_->write(BufferView::host(after.data(), kSize), offset);  // the bytes "the write" put there
  write->finish(IoResult{true, kSize});
  reader.join();
  ASSERT_TRUE(done.wait().ok) << done.wait().error;
  EXPECT_TRUE(back == after) << "the read did not wait for the write it was ordered after";
}

// A read ordered after a write that failed fails too, as lost (ENODATA): what the tier holds there
// is not what was written.
TEST_P(Conformance, ReadOrderedAfterAFailedWriteFailsAsLost) {
  constexpr uint64_t kSize = kStripe;
  std::vector<unsigned char> data = pattern(kSize, 13), back(kSize);
  tier_->write(BufferView::host(data.data(), kSize), 0);
  auto write = std::make_shared<detail::CompletionState>();
  IoRequest read{Direction::kRead, BufferView::host(back.data(), kSize), 0};
  read.after = Completion(write);
  write->finish(IoResult{false, 0, EIO, "disk on fire (the write's message)"});
  const Completion c = tier_->submit(read);
  const IoResult& r = c.wait();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error_code, ENODATA);
  EXPECT_TRUE(lost(r));
  EXPECT_NE(r.error.find("of 65536 bytes at offset 0 follows a write of the same bytes that failed"),
            std::string::npos)
      << r.error;
  EXPECT_NE(r.error.find("disk on fire"), std::string::npos) << r.error;
}

TEST_P(Conformance, RequestBeyondCapacityIsAClearError) {
  std::vector<unsigned char> data(100);
  try {
    tier_->write(BufferView::host(data.data(), data.size()), kCapacity - 10);
    FAIL() << "no error";
  } catch (const teraio::Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(kCapacity - 10)), std::string::npos) << e.what();
  }
}

TEST_P(Conformance, DeviceBufferWithoutGpuIsRefused) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  int dummy = 0;
  BufferView dev(&dummy, sizeof dummy, MemoryKind::kDevice, 0);
  EXPECT_THROW(tier_->write(dev, 0), teraio::Error);
}

TEST_P(Conformance, DrainShutdownCompletesEverythingAndRefusesMore) {
  auto data = pattern(kStripe, 9);
  std::vector<Completion> cs;
  for (int i = 0; i < 50; ++i) {
    cs.push_back(tier_->submit({Direction::kWrite, BufferView::host(data.data(), data.size()), uint64_t(i) * kStripe}));
  }
  tier_->shutdown(ShutdownMode::kDrain);
  for (auto& c : cs) EXPECT_TRUE(c.wait().ok) << c.wait().error;
  EXPECT_THROW(tier_->write(BufferView::host(data.data(), 1), 0), teraio::Error);
  tier_->shutdown(ShutdownMode::kDrain);  // idempotent
}

TEST_P(Conformance, CancelShutdownFailsQueuedRequestsWithEcanceled) {
  auto data = pattern(kStripe, 9);
  std::vector<Completion> cs;
  for (int i = 0; i < 200; ++i) {
    cs.push_back(tier_->submit({Direction::kWrite, BufferView::host(data.data(), data.size()), uint64_t(i) * kStripe}));
  }
  tier_->shutdown(ShutdownMode::kCancel);
  int cancelled = 0;
  for (auto& c : cs) {
    ASSERT_TRUE(c.wait_for(std::chrono::seconds(10))) << "a request was left pending";
    const IoResult& r = c.wait();
    if (!r.ok) {
      EXPECT_EQ(r.error_code, ECANCELED) << r.error;
      ++cancelled;
    }
  }
  if (backend().queued) {
    EXPECT_GT(cancelled, 0);
  }
}

TEST_P(Conformance, FilesArePrivateAndRemovedOnShutdown) {
  if (!backend().is_file) GTEST_SKIP() << "not a file tier";
  for (auto& d : dirs_) {
    auto files = d->files();  // stripe.dat and the directory's lock
    std::sort(files.begin(), files.end());
    ASSERT_EQ(files.size(), 2u) << d->path();
    EXPECT_TRUE(files[0].ends_with("/lock")) << files[0];
    EXPECT_TRUE(files[1].ends_with("/stripe.dat")) << files[1];
    struct stat st;
    for (const std::string& f : files) {
      ASSERT_EQ(::stat(f.c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
    }
    ASSERT_EQ(::stat(files[1].c_str(), &st), 0);
    EXPECT_GE(static_cast<uint64_t>(st.st_size), kCapacity / dirs_.size()) << "space not reserved";
    std::string dir = files[1].substr(0, files[1].rfind('/'));
    ASSERT_EQ(::stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << dir;
  }
  tier_.reset();
  for (auto& d : dirs_) EXPECT_EQ(d->entries(), 0u) << d->path();
}

TEST_P(Conformance, InfoNamesTheEngine) {
  TierInfo i = tier_->info();
  EXPECT_EQ(i.capacity_bytes, kCapacity);
  EXPECT_FALSE(i.engine.empty());
  if (backend().is_file && backend().name != "sync" && !probe_direct_io(dirs_[0]->path()).supported) {
    bool reported = std::any_of(i.notes.begin(), i.notes.end(),
                                [](const std::string& n) { return n.find("O_DIRECT") != std::string::npos; });
    EXPECT_TRUE(reported) << "O_DIRECT is refused here; the fallback must be reported";
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Conformance, ::testing::Range<size_t>(0, backends().size()),
                         [](const ::testing::TestParamInfo<size_t>& p) { return backends()[p.param].name; });

}  // namespace
}  // namespace teraio::storage
