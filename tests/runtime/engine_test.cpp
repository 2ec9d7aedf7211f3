// Tests of the migration engine over plain host buffers and real storage tiers (host arena and
// synchronous file tier): bytes survive round trips, the budget holds, plans execute at the right
// operators, absent inputs are fetched urgently, dead tensors release their tier space.
#include <gtest/gtest.h>

#include <cstring>
#include <chrono>
#include <filesystem>
#include <thread>
#include <map>
#include <numeric>
#include <optional>

#include "../common/fake_memory.h"
#include "engine.h"
#include "internal.h"  // storage's completion states: GateTier below
#include "teraio/error.h"

namespace teraio::runtime {
namespace {

using test::FakeMemory;
using test::FakeTensor;
using test::has_pattern;
using test::make_tensor;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("teraio_engine_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    storage::HostTierOptions h;
    h.capacity_bytes = 1 << 20;
    h.pin = false;
    host_ = storage::make_host_tier(h);
    storage::FileTierOptions f;
    f.paths = {dir_.string()};
    f.capacity_bytes = 4 << 20;
    file_ = storage::make_sync_file_tier(f);
  }
  void TearDown() override {
    host_.reset();
    file_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<Engine> make(uint64_t budget) {
    return std::make_unique<Engine>(
        EngineOptions{budget},
        std::vector<EngineTier>{{"host", host_.get(), 1 << 20}, {"file", file_.get(), 4 << 20}});
  }
  std::filesystem::path dir_;
  std::unique_ptr<storage::Tier> host_, file_;
};

TEST_F(EngineTest, OffloadAndPrefetchRoundTripKeepsBytes) {
  auto e = make(0);
  auto a = make_tensor(10000, 1), b = make_tensor(8192, 2);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  ASSERT_TRUE(e->offload(0, 0));
  ASSERT_TRUE(e->offload(1, 1));
  e->finish_offload(0);
  e->finish_offload(1);
  EXPECT_TRUE(a->data.empty());
  EXPECT_TRUE(b->data.empty());
  EXPECT_EQ(e->location(0), Location::kOffloaded);
  EXPECT_EQ(e->stats().resident_bytes, 0u);
  EXPECT_EQ(e->stats().bytes_offloaded, 18192u);
  ASSERT_TRUE(e->prefetch(0));
  LogicalId ids[] = {0, 1};
  e->begin_use(ids);  // 0 is arriving, 1 is absent: urgent fetch
  EXPECT_TRUE(has_pattern(*a, 1));
  EXPECT_TRUE(has_pattern(*b, 2));
  EXPECT_EQ(e->stats().urgent_fetches, 1u);
  EXPECT_EQ(e->stats().resident_bytes, 18192u);
  e->end_use(ids);
}

// A memory that names a stream (as a CUDA tensor does) over host bytes: no tier publishes an event
// for host buffers, so stream-ordered offloads fall back to waiting on the CPU.
class StreamMemory : public FakeMemory {
 public:
  using FakeMemory::FakeMemory;
  storage::CudaStream stream() const override { return reinterpret_cast<storage::CudaStream>(0x1); }
};

TEST_F(EngineTest, StreamOrderedOffloadsKeepBytesWhenTheTierPublishesNoEvent) {
  Engine e(EngineOptions{0, /*stream_ordered_offloads=*/true, /*clean_offloads=*/false},
           std::vector<EngineTier>{{"host", host_.get(), 1 << 20}, {"file", file_.get(), 4 << 20}});
  auto a = make_tensor(10000, 3), b = make_tensor(8192, 4);
  e.bind(0, std::make_unique<StreamMemory>(a));
  e.bind(1, std::make_unique<StreamMemory>(b));
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(e.offload(0, 0));
    ASSERT_TRUE(e.offload(1, 1));
    e.finish_offload(0);
    e.finish_offload(1);
    EXPECT_TRUE(a->data.empty());
    EXPECT_EQ(e.stats().resident_bytes, 0u);
    LogicalId ids[] = {0, 1};
    e.begin_use(ids);
    EXPECT_TRUE(has_pattern(*a, 3));
    EXPECT_TRUE(has_pattern(*b, 4));
    e.end_use(ids);
  }
  EXPECT_EQ(e.stats().bytes_offloaded, 3u * 18192u);
  EXPECT_EQ(e.stats().stream_ordered, 0u);  // no event published: nothing was freed before its write
}

// Note [Clean offloads]: read back and not written since, a tensor goes out again to the same tier
// without a write (its copy there is kept); bytes stay exact through every round.
TEST_F(EngineTest, CleanOffloadWritesNothingAndBringsBackTheSameBytes) {
  auto e = make(0);
  auto a = make_tensor(10000, 5);
  e->bind(0, std::make_unique<FakeMemory>(a));
  const LogicalId ids[] = {0};
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  for (int round = 0; round < 3; ++round) {
    e->begin_use(ids);  // read back (urgent)
    EXPECT_TRUE(has_pattern(*a, 5)) << round;
    e->end_use(ids);
    e->poll();  // the read has ended: its tier space is kept as the clean copy
    ASSERT_TRUE(e->offload(0, 0));
    EXPECT_EQ(e->location(0), Location::kOffloaded) << "a clean offload is complete at once";
    EXPECT_TRUE(a->data.empty());
  }
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 5));
  e->end_use(ids);
  const EngineStats st = e->stats();
  EXPECT_EQ(st.bytes_offloaded, 10000u) << "only the first offload wrote";
  EXPECT_EQ(st.clean_offloads, 3u);
  EXPECT_EQ(st.clean_bytes, 30000u);
  EXPECT_EQ(st.tiers[0].bytes_clean, 30000u);
  EXPECT_EQ(st.bytes_prefetched, 40000u);
}

// Note [Writebacks in the engine]: a copy made while the tensor stays resident makes the next
// offload to that tier clean; the bytes come back exact.
TEST_F(EngineTest, WritebackMakesTheNextOffloadClean) {
  auto e = make(0);
  auto a = make_tensor(10000, 11);
  e->bind(0, std::make_unique<FakeMemory>(a));
  const LogicalId ids[] = {0};
  ASSERT_TRUE(e->writeback(0, 0));
  EXPECT_EQ(e->location(0), Location::kResident);
  EXPECT_TRUE(has_pattern(*a, 11)) << "the tensor keeps its bytes";
  e->poll();
  ASSERT_TRUE(e->writeback(0, 0)) << "already clean: nothing to do";
  ASSERT_TRUE(e->offload(0, 0));
  EXPECT_EQ(e->location(0), Location::kOffloaded) << "clean: complete at once";
  EXPECT_TRUE(a->data.empty());
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 11));
  e->end_use(ids);
  const EngineStats st = e->stats();
  EXPECT_EQ(st.writebacks, 1u);
  EXPECT_EQ(st.writeback_bytes, 10000u);
  EXPECT_EQ(st.bytes_offloaded, 0u);
  EXPECT_EQ(st.clean_offloads, 1u);
  EXPECT_EQ(st.tiers[0].bytes_written, 10000u);
  // Without a poll the offload waits for the copy; to the other tier it writes.
  auto b = make_tensor(8192, 12);
  e->bind(1, std::make_unique<FakeMemory>(b));
  ASSERT_TRUE(e->writeback(1, 1));
  ASSERT_TRUE(e->offload(1, 1));
  EXPECT_EQ(e->location(1), Location::kOffloaded);
  EXPECT_EQ(e->stats().clean_offloads, 2u);
  auto c = make_tensor(4096, 13);
  e->bind(2, std::make_unique<FakeMemory>(c));
  ASSERT_TRUE(e->writeback(2, 0));
  ASSERT_TRUE(e->offload(2, 1));
  e->finish_offload(2);
  EXPECT_EQ(e->stats().bytes_offloaded, 4096u);
  const LogicalId all[] = {1, 2};
  e->begin_use(all);
  EXPECT_TRUE(has_pattern(*b, 12));
  EXPECT_TRUE(has_pattern(*c, 13));
  e->end_use(all);
}

// Every path that ends a writeback's copy gives the lent bytes back (Memory::end_view), exactly once:
// settled by a poll, waited for by an offload, the tensor dying during the copy, no tier space.
TEST_F(EngineTest, EveryEndOfAWritebackEndsItsView) {
  auto e = make(0);
  // poll() settles a copy once it has completed (the host tier copies on its own thread).
  auto poll_until_ended = [&](const FakeTensor& t) {
    for (int i = 0; i < 2000 && t.lent > 0; ++i) {
      e->poll();
      if (t.lent > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  auto a = make_tensor(10000, 21);
  e->bind(0, std::make_unique<FakeMemory>(a));
  ASSERT_TRUE(e->writeback(0, 0));
  EXPECT_LE(a->lent, 1);
  poll_until_ended(*a);
  EXPECT_EQ(a->lent, 0) << "settled";
  auto b = make_tensor(8192, 22);
  e->bind(1, std::make_unique<FakeMemory>(b));
  ASSERT_TRUE(e->writeback(1, 0));
  ASSERT_TRUE(e->offload(1, 0));
  EXPECT_EQ(b->lent, 0) << "the offload waited for the copy";
  auto c = make_tensor(4096, 23);
  e->bind(2, std::make_unique<FakeMemory>(c));
  ASSERT_TRUE(e->writeback(2, 0));
  c->alive = false;  // the tensor dies while its copy may still run: kept until the copy ends
  poll_until_ended(*c);
  EXPECT_EQ(c->lent, 0) << "forgotten after its copy ended";
  EXPECT_EQ(e->location(2), Location::kUnbound);
  auto d = make_tensor(4096, 24);
  e->bind(3, std::make_unique<FakeMemory>(d));
  ASSERT_TRUE(e->writeback(3, 1));
  e->unbind(3);
  EXPECT_EQ(d->lent, 0) << "unbound";
  auto f = make_tensor(4096, 25);
  e->bind(4, std::make_unique<FakeMemory>(f));
  ASSERT_TRUE(e->writeback(4, 1));
  ASSERT_TRUE(e->writeback(4, 0)) << "to another tier: the first copy is settled first";
  EXPECT_LE(f->lent, 1);
  poll_until_ended(*f);
  EXPECT_EQ(f->lent, 0);
  auto g = make_tensor(2 << 20, 26);  // larger than the host tier
  e->bind(5, std::make_unique<FakeMemory>(g));
  EXPECT_FALSE(e->writeback(5, 0));
  EXPECT_EQ(g->lent, 0) << "no room: given back at once";
  // A tensor that dies during its copy: the offload, drop or discard that waits for the copy finds
  // it dead once its bytes are given back, and neither moves nor frees them.
  for (int how = 0; how < 2; ++how) {
    const LogicalId id = 6 + how;
    auto h = make_tensor(4096, 27 + how);
    h->check_detach = true;
    e->bind(id, std::make_unique<FakeMemory>(h));
    ASSERT_TRUE(e->writeback(id, 0));
    h->alive = false;
    if (how == 0) {
      // Its copy may still run (the offload takes it over as its write, and the tensor is forgotten
      // once it has ended) or have ended (the offload finds the tensor dead).
      e->offload(id, 0);
      e->finish_offload(id);
    } else {
      e->finish_offload(id);  // nothing in flight: a no-op
      EXPECT_FALSE(e->offload(id, 1));
    }
    EXPECT_EQ(h->lent, 0);
    e->poll();
    EXPECT_EQ(e->location(id), Location::kUnbound);
  }
  EXPECT_GE(e->stats().writebacks, 5u);
}

// A write reported after a writeback makes its copy stale: the offload writes the new bytes, and
// they come back; a binding that cannot lend its bytes gets no writeback.
TEST_F(EngineTest, AWriteAfterAWritebackIsWrittenAtTheOffload) {
  auto e = make(0);
  auto a = make_tensor(10000, 14);
  e->bind(0, std::make_unique<FakeMemory>(a));
  const LogicalId ids[] = {0};
  ASSERT_TRUE(e->writeback(0, 0));
  e->begin_use(ids);
  a->seed = 15;  // an in-place write, during or after the copy
  fill_pattern(*a);
  e->note_written(ids);
  e->end_use(ids);
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  EXPECT_EQ(e->stats().bytes_offloaded, 10000u);
  EXPECT_EQ(e->stats().clean_offloads, 0u);
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 15)) << "the written bytes, not the stale copy";
  e->end_use(ids);

  class NoView : public FakeMemory {
   public:
    using FakeMemory::FakeMemory;
    std::optional<storage::BufferView> view() override { return std::nullopt; }
  };
  auto b = make_tensor(4096, 16);
  e->bind(1, std::make_unique<NoView>(b));
  EXPECT_FALSE(e->writeback(1, 0));
  EXPECT_EQ(e->stats().writebacks, 1u);
}

// A writeback move of a bare plan runs after its operator (Schedule::from_plan).
TEST_F(EngineTest, PlannedWritebackRunsAfterItsOperator) {
  Plan plan;
  plan.tiers = {{"host", 1 << 20, 1, 1}};
  plan.moves = {{0, MoveOp::writeback, 0, 1, 2}, {0, MoveOp::offload, 0, 2, 2}, {0, MoveOp::prefetch, 0, 3, 0}};
  const Schedule s = Schedule::from_plan(plan, 4);
  ASSERT_EQ(s.operators[1].writeback_at.size(), 1u);
  auto e = make(0);
  auto a = make_tensor(10000, 17);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->set_plan(plan, 4);
  e->after_operator(0);
  EXPECT_EQ(e->stats().writebacks, 0u);
  e->after_operator(1);
  EXPECT_EQ(e->stats().writebacks, 1u);
  e->after_operator(2);
  EXPECT_EQ(e->location(0), Location::kOffloaded);
  // clean if the copy had ended, else the offload took it over: written once either way
  EXPECT_EQ(e->stats().clean_offloads + e->stats().writebacks_taken_over, 1u);
  EXPECT_EQ(e->stats().bytes_offloaded, 0u);
}

// A write reported by the binding makes the kept copy stale: the next offload writes the new bytes,
// and they are what comes back. Another tier, or clean offloads turned off, always writes.
TEST_F(EngineTest, WrittenTensorsAndOtherTiersAreWrittenAgain) {
  auto e = make(0);
  auto a = make_tensor(10000, 6);
  e->bind(0, std::make_unique<FakeMemory>(a));
  const LogicalId ids[] = {0};
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  e->begin_use(ids);
  a->seed = 7;  // an in-place write
  fill_pattern(*a);
  e->note_written(ids);
  e->end_use(ids);
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  EXPECT_EQ(e->stats().bytes_offloaded, 20000u);
  EXPECT_EQ(e->stats().clean_offloads, 0u);
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 7)) << "the written bytes, not the stale copy";
  e->end_use(ids);
  ASSERT_TRUE(e->offload(0, 1));  // read back from host, out to the file tier: written
  e->finish_offload(0);
  EXPECT_EQ(e->stats().bytes_offloaded, 30000u);
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 7));
  e->end_use(ids);

  Engine off(EngineOptions{0, false, /*clean_offloads=*/false},
             std::vector<EngineTier>{{"host", host_.get(), 1 << 20}});
  auto b = make_tensor(4096, 8);
  off.bind(0, std::make_unique<FakeMemory>(b));
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(off.offload(0, 0));
    off.finish_offload(0);
    off.begin_use(ids);
    off.end_use(ids);
  }
  EXPECT_EQ(off.stats().bytes_offloaded, 8192u);
  EXPECT_EQ(off.stats().clean_offloads, 0u);
  EXPECT_TRUE(has_pattern(*b, 8));
  // A writeback only makes a clean copy: none without clean offloads, and the offload writes.
  EXPECT_FALSE(off.writeback(0, 0));
  EXPECT_EQ(b->lent, 0);
  ASSERT_TRUE(off.offload(0, 0));
  off.finish_offload(0);
  EXPECT_EQ(off.stats().writebacks, 0u);
  EXPECT_EQ(off.stats().bytes_offloaded, 3u * 4096u);
}

// Kept copies never make a tier full: an offload that needs their space reclaims them, and the
// tensor whose copy went is written in full next time.
TEST_F(EngineTest, KeptCopiesGiveWayWhenTheTierIsFull) {
  auto e = make(0);
  auto a = make_tensor(600 << 10, 1), b = make_tensor(600 << 10, 2);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  const LogicalId ids[] = {0};
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  e->begin_use(ids);
  e->end_use(ids);
  e->poll();
  ASSERT_TRUE(e->offload(1, 0)) << "the 1 MiB host tier must reclaim a's kept 600 KiB copy";
  e->finish_offload(1);
  e->fetch_all();
  ASSERT_TRUE(e->offload(0, 1));  // b holds the host tier: a goes to the file tier, written
  e->finish_offload(0);
  EXPECT_EQ(e->stats().clean_offloads, 0u);
  EXPECT_EQ(e->stats().bytes_offloaded, 3u * (600 << 10));
  e->fetch_all();
  EXPECT_TRUE(has_pattern(*a, 1));
  EXPECT_TRUE(has_pattern(*b, 2));
}

TEST_F(EngineTest, BudgetEvictsLeastRecentlyUsedAndSkipsPinned) {
  auto e = make(20000);
  std::vector<std::shared_ptr<FakeTensor>> ts;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(make_tensor(8000, i));
    e->bind(i, std::make_unique<FakeMemory>(ts.back()));
  }
  LogicalId pinned[] = {0};
  e->begin_use(pinned);  // most recently used and pinned
  EXPECT_TRUE(e->enforce_budget());
  EXPECT_LE(e->stats().resident_bytes, 20000u);
  EXPECT_EQ(e->location(0), Location::kResident);
  EXPECT_EQ(e->location(1), Location::kOffloaded);  // least recently used
  EXPECT_EQ(e->location(2), Location::kOffloaded);
  EXPECT_EQ(e->location(3), Location::kResident);
  EXPECT_EQ(e->stats().evictions, 2u);
  e->end_use(pinned);
  e->fetch_all();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(has_pattern(*ts[i], i)) << i;
  EXPECT_EQ(e->stats().peak_resident_bytes, 32000u);
}

TEST_F(EngineTest, BudgetThatCannotBeMetReportsFalse) {
  auto e = make(1000);
  auto a = make_tensor(8000, 3);
  e->bind(0, std::make_unique<FakeMemory>(a));
  LogicalId ids[] = {0};
  e->begin_use(ids);
  EXPECT_FALSE(e->enforce_budget());
  EXPECT_TRUE(has_pattern(*a, 3));
  e->end_use(ids);
}

TEST_F(EngineTest, PlanMovesRunAtTheirOperators) {
  auto e = make(0);
  auto a = make_tensor(4096 * 3, 7);
  e->bind(5, std::make_unique<FakeMemory>(a));
  Plan plan;
  plan.tiers = {{"host", 1 << 20, 10, 10}, {"file", 4 << 20, 1, 1}};
  plan.moves = {{5, MoveOp::offload, 1, 1, 2}, {5, MoveOp::prefetch, 1, 3, 4}};
  e->set_plan(plan, 5);
  for (uint32_t k = 0; k < 5; ++k) {
    e->before_operator(k);
    if (k == 3) {
      EXPECT_NE(e->location(5), Location::kOffloaded) << "prefetch starts before kernel 3";
    }
    if (k == 4 || k == 0) {
      LogicalId ids[] = {5};
      e->begin_use(ids);
      EXPECT_TRUE(has_pattern(*a, 7));
      e->end_use(ids);
    }
    e->after_operator(k);
    if (k == 1) {
      EXPECT_NE(e->location(5), Location::kResident) << "offload issued after kernel 1";
    }
    if (k == 2) {
      EXPECT_EQ(e->location(5), Location::kOffloaded) << "due at the end of kernel 2";
    }
  }
  EXPECT_EQ(e->stats().plan_moves, 2u);
  EXPECT_EQ(e->stats().urgent_fetches, 0u);
  EXPECT_EQ(e->stats().bytes_offloaded, 4096u * 3);
}

// Note [Dead tensors]: a discard frees the tensor after its operator without writing it anywhere;
// the tensor then refuses every access with a message that names what to do, and a use reports it.
TEST_F(EngineTest, DiscardFreesADeadTensorWithoutAWriteAndAUseAfterItFailsLoudly) {
  auto e = make(0);
  auto a = make_tensor(4096, 7), b = make_tensor(8192, 8);
  e->bind(4, std::make_unique<FakeMemory>(a));
  e->bind(5, std::make_unique<FakeMemory>(b));
  auto s = std::make_shared<Schedule>();
  s->operators.resize(3);
  s->add_discard(4, 1);
  e->set_schedule(s);
  for (uint32_t k = 0; k < 3; ++k) {
    e->before_operator(k);
    e->after_operator(k);
    if (k == 0) {
      EXPECT_EQ(e->location(4), Location::kResident) << "discarded after kernel 1, not before";
    }
  }
  EXPECT_EQ(e->location(4), Location::kLost);
  EXPECT_TRUE(a->data.empty());
  EXPECT_NE(a->lost.find("was discarded after its last use"), std::string::npos) << a->lost;
  EXPECT_NE(a->lost.find("discard_dead=False"), std::string::npos) << a->lost;
  EXPECT_EQ(e->location(5), Location::kResident);
  EXPECT_TRUE(has_pattern(*b, 8));
  const EngineStats st = e->stats();
  EXPECT_EQ(st.discards, 1u);
  EXPECT_EQ(st.discarded_bytes, 4096u);
  EXPECT_EQ(st.bytes_offloaded, 0u);
  EXPECT_EQ(st.offloads, 0u);
  EXPECT_EQ(st.resident_bytes, 8192u);
  EXPECT_EQ(st.lost_tensors, 0u) << "a discard is not a fault";
  EXPECT_TRUE(e->take_faults().empty());
  // A use the profile did not foresee: reported, never the tensor with other bytes.
  const LogicalId ids[] = {4};
  e->begin_use(ids);
  e->end_use(ids);
  const std::vector<Fault> faults = e->take_faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].id, 4u);
  EXPECT_NE(faults[0].message.find("was discarded after its last use"), std::string::npos);
  EXPECT_TRUE(a->data.empty());
  // Bringing everything back (a checkpoint) leaves it without bytes and does not fail on it.
  e->fetch_all();
  EXPECT_TRUE(e->take_faults().empty());
  EXPECT_EQ(e->location(4), Location::kLost);
  // It dies as the profile said: forgotten, nothing left behind.
  a->alive = false;
  e->forget_dead();
  EXPECT_EQ(e->location(4), Location::kUnbound);
}

// A tensor in use where its discard is due (a run off the profile) is left alone.
TEST_F(EngineTest, DiscardOfATensorInUseIsSkipped) {
  auto e = make(0);
  auto a = make_tensor(4096, 9);
  e->bind(1, std::make_unique<FakeMemory>(a));
  auto s = std::make_shared<Schedule>();
  s->operators.resize(2);
  s->add_discard(1, 0);
  e->set_schedule(s);
  const LogicalId ids[] = {1};
  e->before_operator(0);
  e->begin_use(ids);
  e->after_operator(0);
  e->end_use(ids);
  EXPECT_EQ(e->location(1), Location::kResident);
  EXPECT_TRUE(has_pattern(*a, 9));
  EXPECT_EQ(e->stats().discards, 0u);
  EXPECT_EQ(e->stats().skipped_moves, 1u);
  EXPECT_THROW(s->add_discard(1, 2), Error) << "past the iteration";
}

TEST_F(EngineTest, UseDuringOffloadCancelsIt) {
  auto e = make(0);
  auto a = make_tensor(5000, 9);
  e->bind(0, std::make_unique<FakeMemory>(a));
  ASSERT_TRUE(e->offload(0, 1));
  LogicalId ids[] = {0};
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 9));
  EXPECT_EQ(e->location(0), Location::kResident);
  e->end_use(ids);
  EXPECT_EQ(e->stats().cancelled_offloads, 1u);
}

TEST_F(EngineTest, DeadTensorsReleaseTierSpaceAndRebindRestoresTheOldOne) {
  auto e = make(0);
  auto a = make_tensor(600 << 10, 1);
  e->bind(0, std::make_unique<FakeMemory>(a));
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  auto b = make_tensor(600 << 10, 2);
  e->bind(1, std::make_unique<FakeMemory>(b));
  EXPECT_FALSE(e->offload(1, 0)) << "host tier holds only 1 MiB";
  a->alive = false;
  e->poll();
  EXPECT_EQ(e->location(0), Location::kUnbound);
  EXPECT_TRUE(e->offload(1, 0));
  e->finish_offload(1);
  // Binding id 1 to a new tensor first brings the old (still alive) one back.
  auto c = make_tensor(100, 3);
  e->bind(1, std::make_unique<FakeMemory>(c));
  EXPECT_TRUE(has_pattern(*b, 2));
}

TEST_F(EngineTest, DeadTensorsStopCountingBeforeEvictions) {
  auto e = make(10000);
  auto a = make_tensor(8000, 1), b = make_tensor(8000, 2);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  a->alive = false;  // freed by its owner: nothing needs to be evicted
  EXPECT_TRUE(e->enforce_budget());
  EXPECT_EQ(e->stats().evictions, 0u);
  EXPECT_EQ(e->stats().resident_bytes, 8000u);
  EXPECT_EQ(e->location(1), Location::kResident);
}

TEST_F(EngineTest, AlignPutsTensorsWhereThePlanStarts) {
  auto e = make(0);
  auto a = make_tensor(9000, 1), b = make_tensor(7000, 2);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  ASSERT_TRUE(e->offload(1, 1));  // left out by an eviction, say
  e->finish_offload(1);
  const Move out[] = {{0, MoveOp::prefetch, 1, 3, 4}};
  const LogicalId in[] = {1};
  EXPECT_EQ(e->align(out, in), 2u);
  EXPECT_EQ(e->location(0), Location::kOffloaded) << "offloads complete before align returns";
  EXPECT_NE(e->location(1), Location::kOffloaded);
  const LogicalId use[] = {1};
  e->begin_use(use);
  EXPECT_TRUE(has_pattern(*b, 2));
  e->end_use(use);
  EXPECT_EQ(e->stats().urgent_fetches, 0u);
  EXPECT_EQ(e->align(out, in), 0u) << "already in place";
  EXPECT_EQ(e->stats().aligned, 2u);
}

// Note [Room for the first operator]: the reads that put tensors where the plan starts leave room
// for what the first operator creates (the batch, seen at its first use), so the first planned
// step does not go past the budget there; a read that does not fit so waits for its first use,
// and none evicts another tensor the plan starts with.
TEST_F(EngineTest, AlignLeavesRoomForTheFirstOperatorsNewTensors) {
  for (const bool room_for_first : {false, true}) {
    auto e = make(20000);
    auto a = make_tensor(4000, 1), b = make_tensor(7000, 2), c = make_tensor(6000, 3);
    e->bind(0, std::make_unique<FakeMemory>(a));
    e->bind(1, std::make_unique<FakeMemory>(b));
    e->bind(2, std::make_unique<FakeMemory>(c));
    for (LogicalId id : {1, 2}) {  // to the synchronous file tier: each read has landed at once
      ASSERT_TRUE(e->offload(id, 1));
      e->finish_offload(id);
    }
    auto s = std::make_shared<Schedule>();
    s->operators.resize(2);
    s->operators[0].created_bytes = room_for_first ? 5000 : 0;
    s->start_in = {1, 2};
    e->set_schedule(s);
    const LogicalId held[] = {0};
    e->begin_use(held);  // in use: no eviction makes room
    e->align();
    // b is not evicted to make room for c: the plan starts with both
    EXPECT_NE(e->location(1), Location::kOffloaded) << room_for_first;
    EXPECT_EQ(e->stats().evictions, 0u) << room_for_first;
    // 4000 + 7000 + 6000 fit in 20000, but not with 5000 more for the first operator
    EXPECT_EQ(e->location(2) == Location::kOffloaded, room_for_first);
    EXPECT_LE(e->stats().resident_bytes + s->operators[0].created_bytes, 20000u);
    e->end_use(held);
    const LogicalId all[] = {1, 2};
    e->begin_use(all);
    EXPECT_TRUE(has_pattern(*b, 2) && has_pattern(*c, 3));
    e->end_use(all);
  }
}

TEST_F(EngineTest, FullTierReclaimsSpaceOfCompletedReads) {
  auto e = make(0);
  auto a = make_tensor(700 << 10, 1), b = make_tensor(700 << 10, 2);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  const LogicalId ids[] = {0};
  e->begin_use(ids);  // back, but the read's tier space is released lazily
  e->end_use(ids);
  EXPECT_TRUE(e->offload(1, 0)) << "the 1 MiB host tier must reclaim the finished read's 700 KiB";
  e->finish_offload(1);
  EXPECT_EQ(e->location(1), Location::kOffloaded);
}

TEST_F(EngineTest, PlannedReadOfATensorThatDiedOutThereIsDropped) {
  auto e = make(0);
  auto a = make_tensor(4096, 5);
  e->bind(3, std::make_unique<FakeMemory>(a));
  Plan plan;
  plan.tiers = {{"host", 1 << 20, 10, 10}, {"file", 4 << 20, 1, 1}};
  plan.moves = {{3, MoveOp::offload, 0, 0, 0}, {3, MoveOp::prefetch, 0, 1, 1}};
  e->set_plan(plan, 2);
  e->before_operator(0);
  e->after_operator(0);
  EXPECT_EQ(e->location(3), Location::kOffloaded);
  a->alive = false;  // a gradient freed by zero_grad while out
  e->before_operator(1);
  EXPECT_EQ(e->location(3), Location::kUnbound);
  EXPECT_EQ(e->stats().prefetches, 0u);
  EXPECT_EQ(e->stats().skipped_moves, 0u);
}

// A planned offload of a tensor that died before it (a gradient freed by zero_grad, not yet swept):
// nothing to move, its memory is free; neither an offload nor a skipped move.
TEST_F(EngineTest, PlannedOffloadOfATensorThatDiedIsForgotten) {
  auto e = make(0);
  auto a = make_tensor(4096, 6);
  e->bind(2, std::make_unique<FakeMemory>(a));
  Plan plan;
  plan.tiers = {{"host", 1 << 20, 10, 10}, {"file", 4 << 20, 1, 1}};
  plan.moves = {{2, MoveOp::offload, 0, 1, 2}};
  e->set_plan(plan, 3);
  a->alive = false;
  e->before_operator(0);
  e->after_operator(0);
  e->before_operator(1);
  e->after_operator(1);
  EXPECT_EQ(e->location(2), Location::kUnbound);
  EXPECT_EQ(e->stats().offloads, 0u);
  EXPECT_EQ(e->stats().skipped_moves, 0u);
  EXPECT_EQ(e->stats().resident_bytes, 0u);
}

TEST_F(EngineTest, ForgetDeadDropsOnlyDeadUnpinnedOnes) {
  auto e = make(0);
  auto a = make_tensor(1000, 1), b = make_tensor(1000, 2);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  a->alive = false;
  const LogicalId ids[] = {0, 1};
  e->forget_dead(ids);
  EXPECT_EQ(e->location(0), Location::kUnbound);
  EXPECT_EQ(e->location(1), Location::kResident);
  EXPECT_EQ(e->stats().resident_bytes, 1000u);
}

TEST_F(EngineTest, PinnedPermanentlyIsNeverOffloadedUntilItDiesOrIsRebound) {
  // A collective's buffer: fetched back if it was out, then resident whatever the budget, the plan,
  // align or an explicit offload ask, without any begin_use/end_use around it.
  auto e = make(10000);
  auto a = make_tensor(8000, 1), b = make_tensor(8000, 2);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  ASSERT_TRUE(e->offload(0, 1));
  e->finish_offload(0);
  e->pin_permanently(0);
  e->pin_permanently(0);  // idempotent
  EXPECT_TRUE(e->pinned_permanently(0));
  EXPECT_FALSE(e->pinned_permanently(1));
  EXPECT_EQ(e->location(0), Location::kResident);
  EXPECT_TRUE(has_pattern(*a, 1));
  EXPECT_EQ(e->stats().pinned_bytes, 8000u);
  LogicalId ids[] = {0};
  e->begin_use(ids);
  e->end_use(ids);  // a use ends: the permanent pin stays
  e->touch(ids);    // 1 is now the least recently used: evicted, 0 stays
  EXPECT_TRUE(e->enforce_budget());
  EXPECT_EQ(e->location(0), Location::kResident);
  EXPECT_EQ(e->location(1), Location::kOffloaded);
  EXPECT_FALSE(e->enforce_budget(4000)) << "the pinned bytes alone exceed budget - reserve";
  EXPECT_EQ(e->location(0), Location::kResident);
  EXPECT_FALSE(e->offload(0, 0));
  Move out{0, MoveOp::offload, 0, 0, 0};
  EXPECT_EQ(e->align(std::span<const Move>(&out, 1), {}), 0u);
  Plan plan;
  plan.tiers = {{"host", 1 << 20, 10, 10}, {"file", 4 << 20, 1, 1}};
  plan.moves = {{0, MoveOp::offload, 1, 0, 1}};
  e->set_plan(plan, 2);
  e->before_operator(0);
  e->after_operator(0);
  e->before_operator(1);
  e->after_operator(1);
  EXPECT_EQ(e->location(0), Location::kResident);
  EXPECT_EQ(e->stats().skipped_moves, 1u);
  EXPECT_TRUE(has_pattern(*a, 1));
  // Another tensor bound to the id is not pinned; a dead pinned tensor stops counting.
  auto c = make_tensor(4000, 3);
  e->bind(0, std::make_unique<FakeMemory>(c));
  EXPECT_FALSE(e->pinned_permanently(0));
  EXPECT_EQ(e->stats().pinned_bytes, 0u);
  EXPECT_TRUE(e->offload(0, 0));
  e->fetch_all();
  e->pin_permanently(0);
  EXPECT_EQ(e->stats().pinned_bytes, 4000u);
  c->alive = false;
  e->forget_dead();
  EXPECT_EQ(e->stats().pinned_bytes, 0u);
  EXPECT_EQ(e->location(0), Location::kUnbound);
}

TEST_F(EngineTest, PlanWithUnknownTierIsRejected) {
  auto e = make(0);
  Plan plan;
  plan.moves = {{0, MoveOp::offload, 7, 0, 1}};
  EXPECT_THROW(e->set_plan(plan, 2), Error);
}

// --- recompute (Note [Recompute in the engine]) -------------------------------------------------

// x (id 0) is made from w (id 1); y (id 2) from x: a chain. The plan frees x after kernel 1 and y
// after kernel 2, and makes both again before kernel 5 (y's producer after x's).
class RecomputeTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    e_ = make(0);
    e_->bind(0, std::make_unique<FakeMemory>(x_));
    e_->bind(1, std::make_unique<FakeMemory>(w_));
    e_->bind(2, std::make_unique<FakeMemory>(y_));
    e_->set_recipe(0, std::make_unique<test::FakeRecipe>(std::vector<LogicalId>{1},
                                                         std::vector{w_}, xs_));
    e_->set_recipe(2, std::make_unique<test::FakeRecipe>(std::vector<LogicalId>{0},
                                                         std::vector{x_}, ys_));
    Plan plan;
    plan.moves = {{0, MoveOp::recompute, 0, 1, 5}, {2, MoveOp::recompute, 0, 2, 5}};
    e_->set_plan(plan, 7);
  }
  // Runs kernels [from, to): before, use of `uses[k]` (if any), after.
  void run(uint32_t from, uint32_t to, std::map<uint32_t, std::vector<LogicalId>> uses = {}) {
    for (uint32_t k = from; k < to; ++k) {
      e_->before_operator(k);
      if (uses.count(k)) {
        e_->begin_use(uses[k]);
        e_->end_use(uses[k]);
      }
      e_->after_operator(k);
    }
  }
  std::shared_ptr<FakeTensor> x_ = make_tensor(8192, 1), w_ = make_tensor(4096, 2),
                              y_ = make_tensor(8192, 3);
  std::shared_ptr<test::RecipeState> xs_ = std::make_shared<test::RecipeState>(),
                                     ys_ = std::make_shared<test::RecipeState>();
  std::unique_ptr<Engine> e_;
};

TEST_F(RecomputeTest, DroppedAfterStartAndMadeAgainBeforeDeadline) {
  run(0, 3);
  EXPECT_EQ(e_->location(0), Location::kDropped);
  EXPECT_EQ(e_->location(2), Location::kDropped);
  EXPECT_TRUE(x_->data.empty() && y_->data.empty()) << "freed: nothing written anywhere";
  EXPECT_EQ(e_->stats().resident_bytes, 4096u);
  EXPECT_EQ(e_->stats().bytes_offloaded, 0u);
  run(3, 5);
  EXPECT_EQ(xs_->runs, 0);
  run(5, 6, {{5, {0, 2}}});
  EXPECT_TRUE(test::intact(*x_) && test::intact(*y_));
  EXPECT_EQ(xs_->runs, 1);
  EXPECT_EQ(ys_->runs, 1) << "y's recipe found x made again just before it";
  const EngineStats s = e_->stats();
  EXPECT_EQ(s.recomputes, 2u);
  EXPECT_EQ(s.urgent_recomputes, 0u);
  EXPECT_EQ(s.plan_moves, 4u);
  EXPECT_EQ(s.resident_bytes, 8192u * 2 + 4096);
  EXPECT_FALSE(e_->has_recipe(0)) << "released after its last recompute (it holds the inputs)";
}

TEST_F(RecomputeTest, AnEarlyUseRecomputesTheChainAtOnce) {
  run(0, 3);
  run(3, 4, {{3, {2}}});  // y used before its recompute: x is made first (y's input), then y
  EXPECT_TRUE(test::intact(*x_) && test::intact(*y_));
  EXPECT_EQ(e_->stats().urgent_recomputes, 2u);
  EXPECT_EQ(e_->stats().recomputes, 2u);
  run(4, 7, {{5, {0, 2}}});
  EXPECT_EQ(xs_->runs, 1) << "resident by then: the planned recompute has nothing to do";
}

TEST_F(RecomputeTest, OffloadedInputIsReadBackFirst) {
  run(0, 2);
  ASSERT_TRUE(e_->offload(1, 0));
  e_->finish_offload(1);
  ASSERT_EQ(e_->location(1), Location::kOffloaded);
  run(2, 6, {{5, {0}}});
  EXPECT_TRUE(test::intact(*x_));
  EXPECT_EQ(e_->location(1), Location::kResident);
  EXPECT_EQ(e_->stats().urgent_fetches, 1u);
}

TEST_F(RecomputeTest, NoRecipeOrStaleKeepsTheTensor) {
  e_->set_recipe(0, nullptr);
  ys_->stale = "written in place";
  run(0, 3);
  EXPECT_EQ(e_->location(0), Location::kResident);
  EXPECT_EQ(e_->location(2), Location::kResident);
  EXPECT_EQ(e_->stats().skipped_moves, 2u);
  run(3, 7, {{5, {0, 2}}});
  EXPECT_TRUE(test::intact(*x_) && test::intact(*y_));
  EXPECT_EQ(e_->stats().recomputes, 0u);
}

TEST_F(RecomputeTest, StaleAfterTheDropLosesTheTensorLoudly) {
  run(0, 3);
  xs_->stale = "an input was written in place";
  run(3, 6, {{5, {0}}});
  EXPECT_EQ(e_->location(0), Location::kLost);
  EXPECT_NE(x_->lost.find("recomputing it failed: an input was written in place"),
            std::string::npos)
      << x_->lost;
  EXPECT_TRUE(x_->data.empty()) << "never other bytes";
  EXPECT_EQ(e_->location(2), Location::kLost) << "y's input is gone: y cannot be made either";
  const std::vector<Fault> f = e_->take_faults();
  ASSERT_FALSE(f.empty());
  EXPECT_TRUE(f[0].lost);
  EXPECT_EQ(e_->stats().lost_tensors, 2u);
}

TEST_F(RecomputeTest, ReleasingRecipesKeepsThoseOfDroppedTensors) {
  run(0, 2);  // x dropped, y resident
  e_->release_recipes();
  EXPECT_TRUE(e_->has_recipe(0));
  EXPECT_FALSE(e_->has_recipe(2));
  e_->fetch_all();
  EXPECT_TRUE(test::intact(*x_));
}

TEST_F(RecomputeTest, AMoveThatCannotFreeAnythingIsRefused) {
  Plan plan;
  plan.moves = {{0, MoveOp::recompute, 0, 3, 4}};
  EXPECT_THROW(e_->set_plan(plan, 7), Error);
}

// --- faults (Note [Faults in the engine]) ---------------------------------------------------------

class EngineFaultTest : public EngineTest {
 protected:
  // One tier: the synchronous file tier behind a fault injector.
  std::unique_ptr<Engine> make_faulty(uint64_t budget, uint64_t capacity = 4 << 20) {
    faulty_ = storage::make_fault_tier(std::move(file_), {});
    return std::make_unique<Engine>(EngineOptions{budget},
                                    std::vector<EngineTier>{{"file", faulty_.get(), capacity}});
  }
  void fail(storage::Direction direction, int error_code, uint64_t count = 1) {
    storage::FaultRule r;
    r.kind = storage::FaultKind::kError;
    r.direction = direction;
    r.error_code = error_code;
    r.count = count;
    faulty_->inject(r);
  }
  // The next `count` transfers (of `direction` alone, when given) complete delay_us late.
  void slow(uint64_t delay_us, uint64_t count,
            std::optional<storage::Direction> direction = std::nullopt) {
    storage::FaultRule r;
    r.kind = storage::FaultKind::kSlow;
    r.delay_us = delay_us;
    r.count = count;
    r.direction = direction;
    faulty_->inject(r);
  }
  std::unique_ptr<storage::FaultTier> faulty_;
};

// A read of a kept copy that fails is a read failure like any other: a passing one is retried and
// the bytes come back intact; one that keeps failing leaves the tensor out there, refused, and the
// next use reads it again (Note [Clean offloads], Note [Read retries]).
TEST_F(EngineFaultTest, ReadsOfKeptCopiesFailLoudlyAndRecover) {
  auto e = make_faulty(0);
  auto a = make_tensor(10000, 4);
  e->bind(0, std::make_unique<FakeMemory>(a));
  const LogicalId ids[] = {0};
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  e->begin_use(ids);
  e->end_use(ids);
  e->poll();
  ASSERT_TRUE(e->offload(0, 0));  // clean
  EXPECT_EQ(e->stats().clean_offloads, 1u);
  fail(storage::Direction::kRead, EIO);  // one failure: retried at once
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 4));
  e->end_use(ids);
  EXPECT_EQ(e->stats().retried_reads, 1u);
  e->poll();
  ASSERT_TRUE(e->offload(0, 0));  // the retried read's copy is as good: clean again
  EXPECT_EQ(e->stats().clean_offloads, 2u);
  fail(storage::Direction::kRead, EIO, 3);  // more failures than retries
  e->begin_use(ids);
  e->end_use(ids);
  const std::vector<Fault> f = e->take_faults();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(f[0].read);
  EXPECT_FALSE(f[0].lost);
  EXPECT_EQ(e->location(0), Location::kOffloaded);
  EXPECT_FALSE(a->refused.empty()) << "the tensor refuses access until it is read back";
  e->begin_use(ids);  // the fault has cleared
  EXPECT_TRUE(has_pattern(*a, 4));
  EXPECT_TRUE(a->refused.empty());
  e->end_use(ids);
  EXPECT_EQ(e->stats().bytes_offloaded, 10000u) << "written once, in all";
}

// Note [Recomputes that wait for a read]: a dropped tensor whose input cannot be read back for now
// is not lost: it refuses access with a message naming the input, the fault is a read (not a loss),
// and once the read succeeds the recompute makes the same bytes.
TEST_F(EngineFaultTest, ARecomputeWhoseInputCannotBeReadForNowIsNotLost) {
  auto e = make_faulty(0);
  auto x = make_tensor(8192, 1), w = make_tensor(4096, 2);
  e->bind(0, std::make_unique<FakeMemory>(x));
  e->bind(1, std::make_unique<FakeMemory>(w));
  auto xs = std::make_shared<test::RecipeState>();
  e->set_recipe(0, std::make_unique<test::FakeRecipe>(std::vector<LogicalId>{1}, std::vector{w}, xs));
  Plan plan;
  plan.tiers = {{"file", 4 << 20, 1, 1}};
  plan.moves = {{0, MoveOp::recompute, 0, 0, 3}};
  e->set_plan(plan, 4);
  e->before_operator(0);
  e->after_operator(0);
  ASSERT_EQ(e->location(0), Location::kDropped);
  ASSERT_TRUE(e->offload(1, 0));
  e->finish_offload(1);
  fail(storage::Direction::kRead, EIO, 100);  // more than the retries: w stays out for now
  const LogicalId ids[] = {0};
  e->begin_use(ids);  // x used early: its recompute needs w
  e->end_use(ids);
  EXPECT_EQ(e->location(0), Location::kDropped) << "not lost: w's bytes are still in the tier";
  EXPECT_TRUE(x->lost.empty()) << x->lost;
  EXPECT_NE(x->refused.find("could not be recomputed for now: its input"), std::string::npos) << x->refused;
  const std::vector<Fault> f = e->take_faults();
  ASSERT_FALSE(f.empty());
  for (const Fault& fault : f) EXPECT_FALSE(fault.lost) << fault.message;
  EXPECT_EQ(e->stats().lost_tensors, 0u);
  faulty_->clear_faults();
  e->begin_use(ids);  // the fault has cleared: w comes back, x is made again
  e->end_use(ids);
  EXPECT_TRUE(test::intact(*x));
  EXPECT_TRUE(x->refused.empty());
  EXPECT_EQ(xs->runs, 1);
  EXPECT_EQ(e->stats().lost_tensors, 0u);
  EXPECT_TRUE(e->take_faults().empty());
}

TEST_F(EngineFaultTest, AFailedWriteKeepsTheTensorResidentAndIsReportedWithItsName) {
  auto e = make_faulty(0);
  e->set_namer([](LogicalId id) { return id == 0 ? std::string("layers.0.weight") : std::string(); });
  auto a = make_tensor(10000, 1);
  e->bind(0, std::make_unique<FakeMemory>(a));
  fail(storage::Direction::kWrite, EIO);
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  EXPECT_EQ(e->location(0), Location::kResident);
  EXPECT_TRUE(has_pattern(*a, 1));
  auto faults = e->take_faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_FALSE(faults[0].lost);
  EXPECT_EQ(faults[0].error_code, EIO);
  for (const char* part : {"layers.0.weight", "10000 bytes", "tier 'file'", "stays on the device",
                           "Input/output error", "offset 0"})
    EXPECT_NE(faults[0].message.find(part), std::string::npos) << part << ": " << faults[0].message;
  EXPECT_TRUE(e->take_faults().empty());
  // The fault cleared: the same tensor goes out and comes back intact (its tier space was freed).
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  EXPECT_EQ(e->location(0), Location::kOffloaded);
  LogicalId ids[] = {0};
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 1));
  e->end_use(ids);
  EXPECT_EQ(e->stats().failed_transfers, 1u);
}

// A writeback whose write fails is a fault like an offload's (never silent): named, counted, the
// tensor still resident and intact, and its offload writes it again once the fault has cleared.
TEST_F(EngineFaultTest, AFailedWritebackIsReportedAndTheOffloadWritesAgain) {
  auto e = make_faulty(0);
  e->set_namer([](LogicalId id) { return id == 0 ? std::string("layers.3.weight") : std::string(); });
  auto a = make_tensor(10000, 8);
  e->bind(0, std::make_unique<FakeMemory>(a));
  fail(storage::Direction::kWrite, EIO);
  ASSERT_TRUE(e->writeback(0, 0));
  e->poll();
  EXPECT_EQ(a->lent, 0) << "the failed copy gave its bytes back";
  EXPECT_EQ(e->location(0), Location::kResident);
  EXPECT_TRUE(has_pattern(*a, 8));
  auto faults = e->take_faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_FALSE(faults[0].lost);
  EXPECT_FALSE(faults[0].read);
  for (const char* part : {"writeback of", "layers.3.weight", "10000 bytes", "tier 'file'", "nothing was lost",
                           "Input/output error", "offset 0"})
    EXPECT_NE(faults[0].message.find(part), std::string::npos) << part << ": " << faults[0].message;
  EXPECT_EQ(e->stats().failed_transfers, 1u);
  EXPECT_EQ(e->stats().stale_writebacks, 0u);
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  EXPECT_EQ(e->stats().clean_offloads, 0u) << "nothing was kept from the failed copy";
  EXPECT_EQ(e->stats().bytes_offloaded, 10000u);
  const LogicalId ids[] = {0};
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 8));
  e->end_use(ids);
  EXPECT_TRUE(e->take_faults().empty());
}

TEST_F(EngineFaultTest, ATransientReadFailureLeavesTheTensorOffloadedAndTheNextUseRetries) {
  auto e = make_faulty(0);
  auto a = make_tensor(10000, 2);
  e->bind(0, std::make_unique<FakeMemory>(a));
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  LogicalId ids[] = {0};
  fail(storage::Direction::kRead, EIO, 2);  // a passing fault: the retries absorb it
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 2));
  EXPECT_EQ(e->stats().retried_reads, 2u);
  EXPECT_TRUE(e->take_faults().empty());
  e->end_use(ids);
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  fail(storage::Direction::kRead, EIO, 3);  // outlasts the retries
  e->begin_use(ids);  // no throw: a Fault
  EXPECT_TRUE(a->data.empty()) << "no bytes may appear from a failed read";
  EXPECT_EQ(e->location(0), Location::kOffloaded);
  EXPECT_EQ(e->stats().resident_bytes, 0u);
  auto faults = e->take_faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_FALSE(faults[0].lost);
  EXPECT_NE(faults[0].message.find("after 3 attempts (it stays there; the next use reads it again)"),
            std::string::npos)
      << faults[0].message;
  EXPECT_TRUE(a->lost.empty());
  EXPECT_EQ(a->refused, faults[0].message) << "accesses fail with the fault until it is read back";
  e->end_use(ids);
  e->begin_use(ids);  // the fault cleared
  EXPECT_TRUE(has_pattern(*a, 2));
  EXPECT_TRUE(a->refused.empty());
  EXPECT_TRUE(e->take_faults().empty());
  e->end_use(ids);
}

TEST_F(EngineFaultTest, LostBytesMakeTheTensorLostAndEveryLaterUseReportsIt) {
  auto e = make_faulty(0, 64 * 1024);
  auto a = make_tensor(40000, 3);
  e->bind(0, std::make_unique<FakeMemory>(a));
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  fail(storage::Direction::kRead, EBADMSG);  // as a checksum mismatch reports it
  LogicalId ids[] = {0};
  e->begin_use(ids);
  e->end_use(ids);
  EXPECT_EQ(e->location(0), Location::kLost);
  auto faults = e->take_faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_TRUE(faults[0].lost);
  EXPECT_NE(faults[0].message.find("contents are lost"), std::string::npos) << faults[0].message;
  EXPECT_EQ(a->lost, faults[0].message) << "the Memory refuses access with the same message";
  EXPECT_EQ(e->stats().lost_tensors, 1u);
  e->begin_use(ids);  // every later use says so again
  e->end_use(ids);
  faults = e->take_faults();
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].message, a->lost);
  // Its tier space was given back: another tensor of the same size fits in the 64 KiB tier.
  auto b = make_tensor(40000, 4);
  e->bind(1, std::make_unique<FakeMemory>(b));
  EXPECT_TRUE(e->offload(1, 0));
  e->finish_offload(1);
  a->alive = false;  // a dead lost tensor is simply forgotten
  e->poll();
  EXPECT_EQ(e->location(0), Location::kUnbound);
  e->fetch_all();
  EXPECT_TRUE(has_pattern(*b, 4));
  EXPECT_TRUE(e->take_faults().empty());
}

TEST_F(EngineFaultTest, FetchAllBringsBackWhatItCanAndAbandonLosesTheRest) {
  auto e = make_faulty(0);
  auto a = make_tensor(8192, 5), b = make_tensor(8192, 6);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  for (LogicalId id : {0u, 1u}) {
    ASSERT_TRUE(e->offload(id, 0));
    e->finish_offload(id);
  }
  fail(storage::Direction::kRead, EIO, 5);  // a's read and its 2 retries, b's read and 1 retry
  e->fetch_all();
  EXPECT_EQ(e->take_faults().size(), 1u);
  EXPECT_TRUE(has_pattern(*b, 6)) << "the other one came back";
  EXPECT_TRUE(a->data.empty());
  EXPECT_EQ(e->abandon("was offloaded when its tiers closed"), 1u);
  EXPECT_NE(a->lost.find("was offloaded when its tiers closed"), std::string::npos) << a->lost;
  EXPECT_EQ(e->location(0), Location::kLost);
}

TEST_F(EngineFaultTest, ReadsMakeRoomWithinTheBudgetBeforeTakingMemory) {
  auto e = make(20000);
  std::vector<std::shared_ptr<FakeTensor>> ts;
  for (int i = 0; i < 3; ++i) {
    ts.push_back(make_tensor(8000, i));
    e->bind(i, std::make_unique<FakeMemory>(ts.back()));
  }
  ASSERT_TRUE(e->offload(2, 1));
  e->finish_offload(2);
  e->reset_peak();
  LogicalId ids[] = {2};
  e->begin_use(ids);  // 2 x 8000 resident + 8000 arriving > 20000: one goes out first
  EXPECT_TRUE(has_pattern(*ts[2], 2));
  EXPECT_LE(e->stats().peak_resident_bytes, 20000u);
  EXPECT_EQ(e->stats().evictions, 1u);
  e->end_use(ids);
  // A planned prefetch never evicts the operator's own tensors to make its room.
  Plan plan;
  plan.tiers = {{"host", 1 << 20, 10, 10}, {"file", 4 << 20, 1, 1}};
  const LogicalId out = e->location(0) == Location::kOffloaded ? 0 : 1;
  const LogicalId other = out == 0 ? 1 : 0;
  plan.moves = {{out, MoveOp::prefetch, 1, 0, 1}};
  e->set_plan(plan, 2);
  e->reset_peak();
  LogicalId in_use[] = {other};
  e->before_operator(0, in_use);
  EXPECT_EQ(e->location(other), Location::kResident);
  EXPECT_EQ(e->location(2), Location::kOffloaded);
  EXPECT_LE(e->stats().peak_resident_bytes, 20000u);
  e->fetch_all();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(has_pattern(*ts[i], i)) << i;
}

// Note [Where the CPU waits]: room within the budget waits for the writes in flight in the order
// they started, and for no more of them than the room needs; the wait counts as stall_room_us.
TEST_F(EngineFaultTest, RoomWaitsOnlyForTheOldestWritesItNeeds) {
  auto e = make_faulty(30000);
  std::vector<std::shared_ptr<FakeTensor>> ts;
  for (int i = 0; i < 3; ++i) {
    ts.push_back(make_tensor(10000, i));
    e->bind(i, std::make_unique<FakeMemory>(ts.back()));
  }
  slow(20000, 3);
  for (LogicalId id : {2, 0, 1}) ASSERT_TRUE(e->offload(id, 0));
  EXPECT_TRUE(e->enforce_budget(10000));  // 30000 resident, room for 10000 more: one write must end
  EXPECT_EQ(e->location(2), Location::kOffloaded);
  EXPECT_EQ(e->location(0), Location::kOffloading);
  EXPECT_EQ(e->location(1), Location::kOffloading);
  const EngineStats st = e->stats();
  EXPECT_GT(st.stall_room_us, 0);
  EXPECT_EQ(st.stall_read_us + st.stall_write_us + st.stall_room_us, st.stall_us);
  EXPECT_EQ(st.evictions, 0u);
  e->fetch_all();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(has_pattern(*ts[i], i)) << i;
  EXPECT_GT(e->stats().stall_read_us + e->stats().stall_write_us, 0);
}

// Note [Where the CPU waits]: forgetting a tensor that died with its write still running waits for
// that write (its bytes must outlive the copy), and the wait counts as stall like every other: the
// Session's host time per operator is its callbacks' time less the stalls (Note [The runner's host
// time]), and an uncounted wait there was taken for host work.
TEST_F(EngineFaultTest, ForgettingADeadTensorWaitsForItsWriteAndCountsTheWait) {
  auto e = make_faulty(0);
  auto a = make_tensor(10000, 4);
  e->bind(0, std::make_unique<FakeMemory>(a));
  slow(20000, 1);
  ASSERT_TRUE(e->offload(0, 0));
  ASSERT_EQ(e->location(0), Location::kOffloading);
  a->alive = false;
  const LogicalId ids[] = {0};
  e->forget_dead(ids);
  EXPECT_EQ(e->location(0), Location::kUnbound);
  const EngineStats st = e->stats();
  EXPECT_GT(st.stall_write_us, 5000);
  EXPECT_EQ(st.stall_read_us + st.stall_write_us + st.stall_room_us, st.stall_us);
  EXPECT_EQ(st.resident_bytes, 0u);
}

// A tier whose writes behave as the host tier's copy lanes do on a GPU: submit() takes the bytes at
// once (the device-to-host copy) and publishes the write's event, so that the engine frees the
// tensor's memory in stream order, but the write lands in the inner tier and completes only when
// the test opens the gate (or fails it). Reads pass through, `after` included. Only on a machine
// without a GPU: the engine's stream wait on the published event is then refused by CUDA (and
// caught), where on a GPU it would meet the fake stream of StreamMemory.
class GateTier : public storage::Tier {
 public:
  explicit GateTier(storage::Tier* inner) : inner_(inner) {}
  storage::Completion submit(const storage::IoRequest& r) override {
    if (r.direction == storage::Direction::kRead) return inner_->submit(r);
    auto state = std::make_shared<storage::detail::CompletionState>();
    const auto* p = static_cast<const unsigned char*>(r.buffer.data());
    held_.push_back({std::vector<unsigned char>(p, p + r.buffer.size_bytes()), r.offset_bytes, state});
    state->publish_event();
    return storage::Completion(state);
  }
  // Lands every held write and completes it; with `error` set, fails them instead.
  void open(const char* error = nullptr) {
    for (Held& h : held_) {
      if (error != nullptr) {
        h.state->finish(storage::IoResult{false, 0, EIO, error});
        continue;
      }
      inner_->write(storage::BufferView::host(h.bytes.data(), h.bytes.size()), h.offset);
      h.state->finish(storage::IoResult{true, h.bytes.size()});
    }
    held_.clear();
  }
  void shutdown(storage::ShutdownMode) override { open("shut down"); }
  storage::TierInfo info() const override { return inner_->info(); }

 private:
  struct Held {
    std::vector<unsigned char> bytes;
    uint64_t offset;
    std::shared_ptr<storage::detail::CompletionState> state;
  };
  storage::Tier* inner_;
  std::vector<Held> held_;
};

// Note [Reads after their write]: a tensor read back while its stream-ordered write still runs is
// not waited for on the CPU: the read goes to the tier at once, ordered after the write, and brings
// back the written bytes; a write that fails meanwhile loses the tensor, reported with its name when
// the read completes.
TEST_F(EngineTest, AReadBackFollowsItsRunningWriteWithoutTheCpuWaiting) {
  if (storage::cuda_device_count() > 0) GTEST_SKIP() << "GateTier's fake stream is for machines without a GPU";
  for (const bool write_fails : {false, true}) {
    GateTier gate(host_.get());
    Engine e(EngineOptions{0, /*stream_ordered_offloads=*/true, /*clean_offloads=*/false},
             std::vector<EngineTier>{{"gate", &gate, 1 << 20}});
    auto a = make_tensor(10000, 6);
    e.bind(0, std::make_unique<StreamMemory>(a));
    ASSERT_TRUE(e.offload(0, 0));
    e.finish_offload(0);
    ASSERT_EQ(e.stats().stream_ordered, 1u) << "the memory was not freed in stream order";
    EXPECT_TRUE(a->data.empty());
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      gate.open(write_fails ? "disk on fire" : nullptr);
    });
    ASSERT_TRUE(e.prefetch(0));  // returns before the write has landed
    EXPECT_EQ(e.stats().reads_after_writes, 1u);
    EXPECT_EQ(e.stats().stall_write_readback_us, 0) << "the CPU waited for the write before the read";
    LogicalId ids[] = {0};
    e.begin_use(ids);
    e.end_use(ids);
    opener.join();
    auto faults = e.take_faults();
    if (!write_fails) {
      EXPECT_TRUE(faults.empty());
      EXPECT_TRUE(has_pattern(*a, 6)) << "the read did not wait for the write it followed";
      EXPECT_EQ(e.location(0), Location::kResident);
      continue;
    }
    EXPECT_EQ(e.location(0), Location::kLost);
    ASSERT_EQ(faults.size(), 1u);
    EXPECT_TRUE(faults[0].lost);
    EXPECT_NE(faults[0].message.find("offload of tensor '0' (10000 bytes) to tier 'gate' failed after its "
                                     "device memory was released"),
              std::string::npos)
        << faults[0].message;
    EXPECT_NE(faults[0].message.find("disk on fire"), std::string::npos) << faults[0].message;
    EXPECT_EQ(a->lost, faults[0].message) << "the tensor refuses access with the fault's message";
    EXPECT_EQ(e.stats().resident_bytes, 0u);
  }
}

// Note [An offload takes over its writeback's copy]: an offload that comes while its writeback's
// copy still runs does not wait for it: the copy becomes its write, completed at its deadline like
// any offload's, and the bytes come back exact.
TEST_F(EngineFaultTest, AnOffloadTakesOverItsWritebacksRunningCopy) {
  auto e = make_faulty(0);
  auto a = make_tensor(10000, 31);
  e->bind(0, std::make_unique<FakeMemory>(a));
  slow(50000, 1, storage::Direction::kWrite);
  ASSERT_TRUE(e->writeback(0, 0));
  ASSERT_TRUE(e->offload(0, 0));
  EXPECT_EQ(e->location(0), Location::kOffloading) << "the copy still runs: it is the offload's write";
  EXPECT_TRUE(a->data.empty()) << "the tensor gave its bytes up";
  EXPECT_EQ(a->lent, 0) << "the view ended: the engine holds the bytes";
  EXPECT_EQ(e->stats().stall_us, 0) << "nothing waited";
  e->finish_offload(0);
  EXPECT_EQ(e->location(0), Location::kOffloaded);
  EngineStats st = e->stats();
  EXPECT_EQ(st.writebacks, 1u);
  EXPECT_EQ(st.writebacks_taken_over, 1u);
  EXPECT_EQ(st.offloads, 1u);
  EXPECT_EQ(st.writeback_bytes, 10000u);
  EXPECT_EQ(st.bytes_offloaded, 0u) << "written once, counted in writeback_bytes";
  EXPECT_EQ(st.tiers[0].bytes_written, 10000u);
  EXPECT_EQ(st.clean_offloads, 0u);
  const LogicalId ids[] = {0};
  e->begin_use(ids);
  EXPECT_TRUE(has_pattern(*a, 31));
  e->end_use(ids);

}

// stall_write_us in parts (Note [Where the CPU waits]): an offload waited for at its deadline is a
// write due, a use waiting for a writeback's copy (on the CPU) a writeback wait, and forgetting a
// tensor that died with its write running neither.
TEST_F(EngineFaultTest, WaitsForWritesAreCountedByWhatTheyWaitedFor) {
  auto e = make_faulty(0);
  auto a = make_tensor(10000, 41), b = make_tensor(10000, 42), c = make_tensor(10000, 43);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  e->bind(2, std::make_unique<FakeMemory>(c));
  slow(20000, 3, storage::Direction::kWrite);
  ASSERT_TRUE(e->offload(0, 0));
  e->finish_offload(0);
  EngineStats st = e->stats();
  EXPECT_GT(st.stall_write_due_us, 5000);
  EXPECT_EQ(st.stall_writeback_us, 0);
  ASSERT_TRUE(e->writeback(1, 0));
  const LogicalId ids[] = {1};
  e->begin_use(ids);  // on the CPU a use waits for the copy
  e->end_use(ids);
  st = e->stats();
  EXPECT_GT(st.stall_writeback_us, 5000);
  ASSERT_TRUE(e->offload(2, 0));
  c->alive = false;
  const LogicalId dead[] = {2};
  e->forget_dead(dead);
  st = e->stats();
  const double parts = st.stall_write_due_us + st.stall_write_readback_us + st.stall_writeback_us;
  EXPECT_GT(st.stall_write_us - parts, 5000) << "the forgotten tensor's write is none of the parts";
  EXPECT_EQ(st.stall_write_readback_us, 0) << "no stream: no write in flight behind a freed block";
  EXPECT_EQ(st.stall_read_us + st.stall_write_us + st.stall_room_us, st.stall_us);
}

// stall_read_us in part (Note [Where the CPU waits]): a use waiting for its tensor's read is
// stall_read_use_us; forgetting a tensor that died while its read ran is a read wait, not a use's.
TEST_F(EngineFaultTest, WaitsForReadsAreCountedByWhatTheyWaitedFor) {
  auto e = make_faulty(0);
  auto a = make_tensor(10000, 51), b = make_tensor(10000, 52);
  e->bind(0, std::make_unique<FakeMemory>(a));
  e->bind(1, std::make_unique<FakeMemory>(b));
  for (LogicalId id : {0u, 1u}) {
    ASSERT_TRUE(e->offload(id, 0));
    e->finish_offload(id);
  }
  slow(20000, 2, storage::Direction::kRead);
  ASSERT_TRUE(e->prefetch(0));
  const LogicalId ids[] = {0};
  e->begin_use(ids);  // waits for the read still running
  e->end_use(ids);
  EXPECT_TRUE(has_pattern(*a, 51));
  EngineStats st = e->stats();
  EXPECT_GT(st.stall_read_use_us, 5000);
  EXPECT_EQ(st.stall_read_use_us, st.stall_read_us);
  ASSERT_TRUE(e->prefetch(1));
  b->alive = false;  // died before its use, its read running
  const LogicalId dead[] = {1};
  e->forget_dead(dead);
  st = e->stats();
  EXPECT_GT(st.stall_read_us - st.stall_read_use_us, 5000) << "a forgotten tensor's read is not a use's";
  EXPECT_EQ(st.stall_read_us + st.stall_write_us + st.stall_room_us, st.stall_us);
}

// Per-tier counters: the waits for a slow tier are that tier's, and the per-tier stalls and bytes add
// up to the engine's totals (stats()["tiers"] says which tier a multi-tier run waited for).
TEST_F(EngineFaultTest, StallsAndBytesAreCountedPerTier) {
  faulty_ = storage::make_fault_tier(std::move(file_), {});
  Engine e(EngineOptions{0}, std::vector<EngineTier>{{"host", host_.get(), 1 << 20},
                                                     {"file", faulty_.get(), 4 << 20}});
  std::vector<std::shared_ptr<FakeTensor>> ts;
  for (int i = 0; i < 3; ++i) {
    ts.push_back(make_tensor(8192, i));
    e.bind(i, std::make_unique<FakeMemory>(ts.back()));
  }
  slow(20000, 4);
  ASSERT_TRUE(e.offload(0, 0));
  ASSERT_TRUE(e.offload(1, 1));
  ASSERT_TRUE(e.offload(2, 1));
  for (LogicalId id : {0, 1, 2}) e.finish_offload(id);  // the writes are waited for
  for (LogicalId id : {0, 1, 2}) EXPECT_EQ(e.location(id), Location::kOffloaded) << id;
  e.fetch_all();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(has_pattern(*ts[i], i)) << i;
  const EngineStats st = e.stats();
  ASSERT_EQ(st.tiers.size(), 2u);
  EXPECT_EQ(st.tiers[0].bytes_written, 8192u);
  EXPECT_EQ(st.tiers[0].bytes_read, 8192u);
  EXPECT_EQ(st.tiers[1].bytes_written, 2 * 8192u);
  EXPECT_EQ(st.tiers[1].bytes_read, 2 * 8192u);
  EXPECT_EQ(st.tiers[0].bytes_written + st.tiers[1].bytes_written, st.bytes_offloaded);
  EXPECT_EQ(st.tiers[0].bytes_read + st.tiers[1].bytes_read, st.bytes_prefetched);
  // Four slow transfers of 20 ms on the file tier: at least one was waited for, there.
  EXPECT_GT(st.tiers[1].stall_read_us + st.tiers[1].stall_write_us, 10000);
  double sum = 0;
  for (const EngineStats::Tier& t : st.tiers) sum += t.stall_read_us + t.stall_write_us;
  EXPECT_NEAR(sum, st.stall_us, 1e-9 * st.stall_us);
}

TEST_F(EngineFaultTest, FullTiersAreNamedWhenTheBudgetCannotBeMet) {
  auto e = make_faulty(10000, 16 * 1024);
  std::vector<std::shared_ptr<FakeTensor>> ts;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(make_tensor(8192, i));
    e->bind(i, std::make_unique<FakeMemory>(ts.back()));
  }
  EXPECT_FALSE(e->enforce_budget());
  const std::string why = e->budget_shortfall();
  EXPECT_NE(why.find("no tier has room"), std::string::npos) << why;
  EXPECT_NE(why.find("file 0 B of 16.0 KiB free"), std::string::npos) << why;
  e->set_reserve(0);
  EXPECT_TRUE(e->enforce_budget(0) == false);
  e->fetch_all();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(has_pattern(*ts[i], i)) << i;
}

}  // namespace
}  // namespace teraio::runtime
