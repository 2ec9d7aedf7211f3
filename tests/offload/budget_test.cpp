// The budget policy (src/runtime/budget.h, Note [Budget policy]): the numbers every budget check
// uses, and the engine's eviction target following the same policy.
#include <gtest/gtest.h>

#include "budget.h"
#include "engine.h"

namespace teraio::runtime {
namespace {

TEST(BudgetPolicy, OperatorViolationCountsUntrackedMemory) {
  BudgetPolicy p;
  p.budget_bytes = 1000;
  EXPECT_FALSE(p.violated_by(1000)) << "own tensors exactly the budget fit";
  EXPECT_TRUE(p.violated_by(1001));
  p.untracked_bytes = 300;
  EXPECT_EQ(p.operator_need_bytes(700), 1000u);
  EXPECT_FALSE(p.violated_by(700));
  EXPECT_TRUE(p.violated_by(701));
  BudgetPolicy unlimited;
  EXPECT_FALSE(unlimited.violated_by(uint64_t(1) << 60)) << "a zero budget is no limit";
}

TEST(BudgetPolicy, ResidentTargetLeavesRoomAndNeverUnderflows) {
  BudgetPolicy p;
  p.budget_bytes = 1000;
  EXPECT_EQ(p.resident_target_bytes(), 1000u);
  p.untracked_bytes = 200;
  EXPECT_EQ(p.resident_target_bytes(), 800u);
  EXPECT_EQ(p.resident_target_bytes(300), 500u) << "room for what the operator creates";
  EXPECT_EQ(p.resident_target_bytes(800), 0u);
  EXPECT_EQ(p.resident_target_bytes(5000), 0u);
}

TEST(BudgetPolicy, PlannerBudgetKeepsAMarginOnDevicesOnly) {
  BudgetPolicy p;
  p.budget_bytes = 32000;
  p.untracked_bytes = 1000;
  EXPECT_EQ(p.planner_reserve_bytes(), 1000u) << "CPU: no margin";
  EXPECT_EQ(p.planner_budget_bytes(), 31000u);
  p.device_margin = true;
  EXPECT_EQ(p.planner_reserve_bytes(), 2000u) << "CUDA: budget / 32 more";
  EXPECT_EQ(p.planner_budget_bytes(), 30000u);
  EXPECT_TRUE(p.can_plan());
  p.untracked_bytes = 31000;
  EXPECT_FALSE(p.can_plan()) << "untracked + margin == budget leaves nothing";
}

// A tensor the engine can evict: host bytes taken away and given back.
class BytesMemory : public Memory {
 public:
  explicit BytesMemory(uint64_t n) : size_(n), data_(n, std::byte{1}) {}
  uint64_t bytes() const override { return size_; }
  storage::BufferView detach() override {
    held_ = std::move(data_);
    data_.clear();
    return storage::BufferView::host(held_.data(), held_.size());
  }
  void attach() override {
    data_ = std::move(held_);
    held_.clear();
  }
  void drop() override { held_ = {}; }
  storage::BufferView allocate() override {
    held_.assign(size_, std::byte{0});
    return storage::BufferView::host(held_.data(), held_.size());
  }
  bool alive() const override { return true; }

 private:
  uint64_t size_;
  std::vector<std::byte> data_, held_;
};

TEST(BudgetPolicy, EngineEvictsDownToThePolicysTarget) {
  storage::HostTierOptions h;
  h.capacity_bytes = 1 << 20;
  h.pin = false;
  auto host = storage::make_host_tier(h);
  Engine e(EngineOptions{40000}, {{"host", host.get(), 1 << 20}});
  for (LogicalId id = 0; id < 4; ++id) e.bind(id, std::make_unique<BytesMemory>(10000));
  e.set_reserve(15000);
  EXPECT_EQ(e.budget_policy().resident_target_bytes(), 25000u);
  ASSERT_TRUE(e.enforce_budget());
  EXPECT_LE(e.stats().resident_bytes, 25000u);
  ASSERT_TRUE(e.enforce_budget(10000));
  EXPECT_LE(e.stats().resident_bytes, e.budget_policy().resident_target_bytes(10000));
  EXPECT_EQ(e.stats().resident_bytes, 10000u);
}

}  // namespace
}  // namespace teraio::runtime
