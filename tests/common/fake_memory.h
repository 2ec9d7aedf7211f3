// A fake tensor for the engine's and the controller's tests: host bytes that the engine can take
// away (detach) and give back (attach), like a PyTorch storage, with a known byte pattern and the
// fault hooks of runtime::Memory recorded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine.h"

namespace teraio::test {

struct FakeTensor {
  std::vector<std::byte> data;  // empty while absent
  uint64_t size = 0;
  bool alive = true;
  int seed = 0;         // the pattern's seed (make_tensor)
  std::string lost;     // Memory::lose's message
  std::string refused;  // Memory::refuse's message, until the bytes are attached again
  int lent = 0;         // view()s not yet ended by end_view()
  bool check_detach = false;  // a detach() of the tensor once dead is a test failure
};

// Byte i of the pattern of `seed`.
inline std::byte pattern_byte(uint64_t i, int seed) {
  return std::byte(static_cast<uint8_t>(i * 31 + seed));
}
// Fills the tensor with the pattern of its seed (present from then on).
inline void fill_pattern(FakeTensor& t) {
  t.data.resize(t.size);
  for (uint64_t i = 0; i < t.size; ++i) t.data[i] = pattern_byte(i, t.seed);
}

class FakeMemory : public runtime::Memory {
 public:
  explicit FakeMemory(std::shared_ptr<FakeTensor> t) : t_(std::move(t)) {}
  uint64_t bytes() const override { return t_->size; }
  storage::BufferView detach() override {
    if (t_->check_detach) {
      EXPECT_TRUE(alive()) << "detach of a dead tensor";
    }
    held_ = std::move(t_->data);
    t_->data.clear();
    return storage::BufferView::host(held_.data(), held_.size());
  }
  void attach() override {
    t_->data = std::move(held_);
    t_->refused.clear();
    held_.clear();
  }
  void drop() override {
    held_.clear();
    held_.shrink_to_fit();
  }
  storage::BufferView allocate() override {
    held_.assign(t_->size, std::byte{0});
    return storage::BufferView::host(held_.data(), held_.size());
  }
  // A lent tensor keeps its bytes until end_view(), as the Session's binding does (Note [Lent bytes]).
  bool alive() const override { return t_->alive || t_->lent > 0; }
  // Lends the present bytes for a writeback (the tensor keeps them).
  std::optional<storage::BufferView> view() override {
    if (t_->data.empty()) return std::nullopt;
    t_->lent++;
    return storage::BufferView::host(t_->data.data(), t_->data.size());
  }
  void end_view() override { t_->lent--; }
  // What a recompute installs: the tensor's pattern, made again.
  void remake() {
    fill_pattern(*t_);
    t_->refused.clear();
  }
  void lose(const std::string& why) override { t_->lost = why; }
  bool refuse(const std::string& why) override {
    t_->refused = why;
    return true;
  }

 private:
  std::shared_ptr<FakeTensor> t_;
  std::vector<std::byte> held_;
};

// A present tensor of `size` bytes holding the pattern of `seed`.
inline std::shared_ptr<FakeTensor> make_tensor(uint64_t size, int seed) {
  auto t = std::make_shared<FakeTensor>();
  t->size = size;
  t->seed = seed;
  fill_pattern(*t);
  return t;
}

// The tensor is present and holds the pattern of `seed`.
inline bool has_pattern(const FakeTensor& t, int seed) {
  if (t.data.size() != t.size) return false;
  for (uint64_t i = 0; i < t.size; ++i)
    if (t.data[i] != pattern_byte(i, seed)) return false;
  return true;
}
// The tensor is present and holds the pattern it was made with.
inline bool intact(const FakeTensor& t) { return has_pattern(t, t.seed); }

// A recipe (Note [Recompute in the engine]) that makes a FakeMemory's pattern again, reading
// `inputs`: it fails when one of them is not present and intact (the engine must make them usable
// first), counts its runs, and is stale while `state->stale` says so.
struct RecipeState {
  int runs = 0;
  std::string stale;  // what stale() returns
  std::string fail;   // what run() returns (without installing anything)
};
class FakeRecipe : public runtime::Recipe {
 public:
  FakeRecipe(std::vector<runtime::LogicalId> ids, std::vector<std::shared_ptr<FakeTensor>> inputs,
             std::shared_ptr<RecipeState> state = std::make_shared<RecipeState>())
      : ids_(std::move(ids)), inputs_(std::move(inputs)), state_(std::move(state)) {}
  std::span<const runtime::LogicalId> inputs() const override { return ids_; }
  std::string stale() const override { return state_->stale; }
  std::string run(runtime::Memory& memory) override {
    state_->runs++;
    if (!state_->fail.empty()) return state_->fail;
    for (const auto& in : inputs_) {
      if (in->data.size() != in->size) return "an input is absent";
      if (!intact(*in)) return "an input is damaged";
    }
    static_cast<FakeMemory&>(memory).remake();
    return {};
  }

 private:
  std::vector<runtime::LogicalId> ids_;
  std::vector<std::shared_ptr<FakeTensor>> inputs_;
  std::shared_ptr<RecipeState> state_;
};

}  // namespace teraio::test
