// GPU tests (label gpu): device buffers through every tier, stream ordering of reads into device
// memory and writes after a producer stream. Skipped (GTEST_SKIP) where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "cuda_rt.h"
#include "teraio/storage.h"
#include "test_util.h"

namespace teraio::storage {
namespace {

using test::pattern;
using test::TempDir;

class Gpu : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
    FileTierOptions o;
    o.paths = {dir_.path()};
    o.capacity_bytes = 64 << 20;
    o.stripe_bytes = 1 << 20;
    o.checksums = true;
    switch (GetParam()) {
      case 0:
        tier_ = make_sync_file_tier(o);
        break;
      case 1:
        tier_ = make_file_tier(o);
        break;
      case 2:
        o.engine = FileEngine::kThreads;
        tier_ = make_file_tier(o);
        break;
      case 3:
        o.gds = GdsMode::kAuto;
        tier_ = make_file_tier(o);
        break;
      default: {
        HostTierOptions h;
        h.capacity_bytes = 64 << 20;
        tier_ = make_host_tier(h);
      }
    }
  }
  TempDir dir_;
  std::unique_ptr<Tier> tier_;
};

TEST_P(Gpu, DeviceRoundTripThroughPinnedBounce) {
  for (uint64_t size : {uint64_t{1}, uint64_t{4097}, uint64_t{5 << 20} + 3}) {
    auto data = pattern(size, size);
    Buffer dev = Buffer::allocate(size, MemoryKind::kDevice, 0);
    copy_buffer(dev.view(), BufferView::host(data.data(), size));
    tier_->write(dev.view(), 12345);
    Buffer dev2 = Buffer::allocate(size, MemoryKind::kDevice, 0);
    auto c = tier_->submit({Direction::kRead, dev2.view(), 12345});
    c.stream_wait(nullptr);
    std::vector<unsigned char> back(size);
    copy_buffer(BufferView::host(back.data(), size), dev2.view());  // legacy stream: after the wait
    EXPECT_TRUE(c.wait().ok) << c.wait().error;
    EXPECT_EQ(back, data) << "size " << size;
  }
}

// A read into a device block that queued work on another stream still writes (a kernel of the
// tensor the block belonged to) must land after that work: ready_stream orders it on the GPU.
TEST_P(Gpu, ReadIntoDeviceWaitsForReadyStream) {
  const uint64_t size = 64 << 20;
  auto data = pattern(size, 7);
  Buffer src = Buffer::allocate(size, MemoryKind::kDevice, 0);
  copy_buffer(src.view(), BufferView::host(data.data(), size));
  tier_->write(src.view(), 0);
  Buffer stale = Buffer::allocate(size, MemoryKind::kHostPinned, 0);
  std::memset(stale.data(), 0xab, size);
  Buffer dev = Buffer::allocate(size, MemoryKind::kDevice, 0);
  void* busy = cuda::stream_create(0);
  for (int i = 0; i < 8; ++i)
    cuda::memcpy_async(dev.data(), stale.data(), size, busy);  // ~10 ms queued
  IoRequest r{Direction::kRead, dev.view(), 0};
  r.ready_stream = busy;
  auto c = tier_->submit(r);
  c.stream_wait(busy);
  cuda::stream_sync(busy);
  std::vector<unsigned char> back(size);
  copy_buffer(BufferView::host(back.data(), size), dev.view());
  cuda::stream_destroy(busy);
  EXPECT_TRUE(c.wait().ok) << c.wait().error;
  EXPECT_TRUE(back == data) << "the read landed before the work queued on its ready stream";
}

// A write from a device buffer: after stream_wait(s), work queued on `s` may reuse the buffer (the
// engine frees an offloaded tensor's block in stream order) without changing what the tier holds.
TEST_P(Gpu, WriteFromDeviceStreamWaitThenReuseKeepsTheWrittenBytes) {
  const uint64_t size = 32 << 20;  // at offset 4096: within the 64 MiB tier
  auto data = pattern(size, 9);
  Buffer src = Buffer::allocate(size, MemoryKind::kDevice, 0);
  copy_buffer(src.view(), BufferView::host(data.data(), size));
  Buffer stale = Buffer::allocate(size, MemoryKind::kHostPinned, 0);
  std::memset(stale.data(), 0xcd, size);
  void* s = cuda::stream_create(0);
  auto c = tier_->submit({Direction::kWrite, src.view(), 4096});
  c.stream_wait(s);
  cuda::memcpy_async(src.data(), stale.data(), size, s);  // the block's next user, in stream order
  cuda::stream_sync(s);
  cuda::stream_destroy(s);
  ASSERT_TRUE(c.wait().ok) << c.wait().error;
  std::vector<unsigned char> back(size);
  Buffer dev = Buffer::allocate(size, MemoryKind::kDevice, 0);
  tier_->read(dev.view(), 4096);
  copy_buffer(BufferView::host(back.data(), size), dev.view());
  EXPECT_TRUE(back == data) << "the buffer's next user overwrote it before the write had read it";
}

TEST_P(Gpu, PinnedHostBuffersRoundTrip) {
  Buffer pinned = Buffer::allocate(3 << 20, MemoryKind::kHostPinned, 0);
  EXPECT_TRUE(pinned.pinned());
  auto data = pattern(pinned.size_bytes(), 2);
  std::memcpy(pinned.data(), data.data(), data.size());
  tier_->write(pinned.view(), 0);
  std::memset(pinned.data(), 0, data.size());
  tier_->read(pinned.view(), 0);
  EXPECT_EQ(std::memcmp(pinned.data(), data.data(), data.size()), 0);
}

// The Session's probe with device scratch (the memory tensors live in): numbers from every tier,
// the tier's bytes outside the probed range unchanged, and the writes wait for the work queued on
// ready_stream (it fills the scratch with 0xab, so the probed range must hold 0xab afterwards).
TEST_P(Gpu, BandwidthProbeWithDeviceScratch) {
  const uint64_t tier = 64 << 20, from = 16 << 20, size = 32 << 20, scratch_bytes = 16 << 20;
  auto data = pattern(tier, 11);
  tier_->write(BufferView::host(data.data(), tier), 0);
  Buffer scratch = Buffer::allocate(scratch_bytes, MemoryKind::kDevice, 0);
  Buffer stale = Buffer::allocate(scratch_bytes, MemoryKind::kHostPinned, 0);
  std::memset(stale.data(), 0xab, scratch_bytes);
  void* busy = cuda::stream_create(0);
  for (int i = 0; i < 8; ++i) cuda::memcpy_async(scratch.data(), stale.data(), scratch_bytes, busy);
  BandwidthProbeOptions o = quick_probe_options(tier_->info());
  o.ready_stream = busy;
  const BandwidthProbe p = probe_bandwidth(*tier_, scratch.view(), from, size, o);
  cuda::stream_sync(busy);
  cuda::stream_destroy(busy);
  EXPECT_GT(p.write_gbps.median, 0);
  EXPECT_GT(p.read_gbps.median, 0);
  EXPECT_EQ(p.memory, "device");
  EXPECT_LT(p.elapsed_s, o.time_limit_s + 0.5);
  std::vector<unsigned char> back(tier);
  tier_->read(BufferView::host(back.data(), tier), 0);
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + from, data.begin()));
  EXPECT_TRUE(std::equal(back.begin() + from + size, back.end(), data.begin() + from + size));
  EXPECT_TRUE(std::all_of(back.begin() + from, back.begin() + from + p.pass_bytes,
                          [](unsigned char b) { return b == 0xab; }))
      << "a probe write read the scratch before the work queued on its ready stream";
  std::printf("[ probe    ] %s (%s): write %.2f GB/s [%.2f, %.2f], read %.2f GB/s [%.2f, %.2f], %.3f s\n",
              p.tier.c_str(), p.engine.c_str(), p.write_gbps.median, p.write_gbps.min,
              p.write_gbps.max, p.read_gbps.median, p.read_gbps.min, p.read_gbps.max, p.elapsed_s);
}

std::string tier_name(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[] = {"sync", "file", "threads", "gds_auto", "host"};
  return kNames[info.param];
}
INSTANTIATE_TEST_SUITE_P(Tiers, Gpu, ::testing::Range(0, 5), tier_name);

// Note [Copies queued on the GPU]: the host tier enqueues a device copy at submit, so the CPU waiting
// for a copy's event (stream_wait) never waits for the copies queued before it to end; the copies
// still run in order and keep their bytes.
class HostLanes : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
    HostTierOptions h;
    h.capacity_bytes = 320 << 20;
    tier_ = make_host_tier(h);
  }
  std::unique_ptr<Tier> tier_;
};

TEST_F(HostLanes, StreamWaitDoesNotWaitForEarlierCopiesToEnd) {
  const uint64_t big = 256 << 20, small = 1 << 20;
  Buffer a = Buffer::allocate(big, MemoryKind::kDevice, 0);
  Buffer b = Buffer::allocate(small, MemoryKind::kDevice, 0);
  auto data = pattern(small, 3);
  copy_buffer(b.view(), BufferView::host(data.data(), small));
  void* s = cuda::stream_create(0);
  auto first = tier_->submit({Direction::kWrite, a.view(), 0});  // ~5 ms on a 55 GB/s link
  auto second = tier_->submit({Direction::kWrite, b.view(), big});
  second.stream_wait(s);
  EXPECT_FALSE(first.ready()) << "stream_wait waited for the copy queued before its own to end";
  cuda::stream_sync(s);
  cuda::stream_destroy(s);
  ASSERT_TRUE(first.wait().ok) << first.wait().error;
  ASSERT_TRUE(second.wait().ok) << second.wait().error;
  std::vector<unsigned char> back(small);
  Buffer dev = Buffer::allocate(small, MemoryKind::kDevice, 0);
  tier_->read(dev.view(), big);
  copy_buffer(BufferView::host(back.data(), small), dev.view());
  EXPECT_TRUE(back == data);
}

// Note [Reads after their write]: a read of bytes a lane write is still copying into the arena waits
// for that copy on the GPU: submit() returns before the write has ended, and the read brings back
// the new bytes, not those the arena held before.
TEST_F(HostLanes, ReadOrderedAfterARunningWriteWaitsOnTheGpu) {
  const uint64_t big = 256 << 20;  // ~5 ms each way on a 55 GB/s link
  auto old_bytes = pattern(big, 21), new_bytes = pattern(big, 22);
  Buffer src = Buffer::allocate(big, MemoryKind::kDevice, 0);
  Buffer dst = Buffer::allocate(big, MemoryKind::kDevice, 0);
  copy_buffer(src.view(), BufferView::host(old_bytes.data(), big));
  tier_->write(src.view(), 0);
  copy_buffer(src.view(), BufferView::host(new_bytes.data(), big));
  void* s = cuda::stream_create(0);
  Completion write = tier_->submit({Direction::kWrite, src.view(), 0});
  IoRequest r{Direction::kRead, dst.view(), 0};
  r.after = write;
  Completion read = tier_->submit(r);
  EXPECT_FALSE(write.ready()) << "submit() waited on the CPU for the write the read follows";
  read.stream_wait(s);
  cuda::stream_sync(s);
  cuda::stream_destroy(s);
  ASSERT_TRUE(write.wait().ok) << write.wait().error;
  ASSERT_TRUE(read.wait().ok) << read.wait().error;
  EXPECT_LE(write.wait().finish_ns, read.wait().finish_ns);
  std::vector<unsigned char> back(big);
  copy_buffer(BufferView::host(back.data(), big), dst.view());
  EXPECT_TRUE(back == new_bytes) << "the read copied the arena before the write had filled it";
}

TEST_F(HostLanes, ManyQueuedCopiesEachWay) {
  const int n = 48;
  const uint64_t size = (1 << 20) + 4096 * 3;
  std::vector<Buffer> src, dst;
  std::vector<Completion> writes, reads;
  void* s = cuda::stream_create(0);
  for (int i = 0; i < n; ++i) {
    src.push_back(Buffer::allocate(size, MemoryKind::kDevice, 0));
    auto data = pattern(size, 100 + i);
    copy_buffer(src.back().view(), BufferView::host(data.data(), size));
    writes.push_back(tier_->submit({Direction::kWrite, src.back().view(), i * size}));
  }
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(writes[i].wait().ok) << writes[i].wait().error;
    dst.push_back(Buffer::allocate(size, MemoryKind::kDevice, 0));
    IoRequest r{Direction::kRead, dst.back().view(), i * size};
    r.priority = i % 5 == 0 ? Priority::kUrgent : Priority::kNormal;  // both lanes
    reads.push_back(tier_->submit(r));
  }
  for (auto& c : reads) c.stream_wait(s);
  cuda::stream_sync(s);
  cuda::stream_destroy(s);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(reads[i].wait().ok) << reads[i].wait().error;
    std::vector<unsigned char> back(size);
    copy_buffer(BufferView::host(back.data(), size), dst[i].view());
    EXPECT_TRUE(back == pattern(size, 100 + i)) << i;
  }
}

}  // namespace
}  // namespace teraio::storage
