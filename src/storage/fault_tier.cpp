// A fault-injecting wrapper around any tier (LevelDB EnvWrapper style), for tests: chosen requests
// fail with EIO or ENOSPC, move only half their bytes and report a short transfer, or complete
// late. Everything else passes through unchanged.
#include <cerrno>
#include <cstring>
#include <thread>

#include "internal.h"
#include "teraio/error.h"

namespace teraio::storage {
namespace {

struct Delayed {
  Completion inner;
  std::shared_ptr<detail::CompletionState> outer;
  uint64_t delay_us = 0;
  IoResult override_result;
  bool override_set = false;
};

class FaultTier final : public Tier {
 public:
  FaultTier(std::unique_ptr<Tier> inner, FaultOptions o) : inner_(std::move(inner)), o_(std::move(o)) {
    TERAIO_CHECK(inner_ != nullptr, "fault tier: no inner tier");
    delayer_ = std::thread([this] { delay_loop(); });
  }
  ~FaultTier() override { shutdown(ShutdownMode::kDrain); }

  Completion submit(const IoRequest& r) override {
    uint64_t n = counter_.fetch_add(1);
    const FaultRule* rule = nullptr;
    for (const auto& f : o_.rules) {
      if (f.kind != FaultKind::kNone && n >= f.nth_request && n - f.nth_request < f.count) rule = &f;
    }
    if (rule == nullptr) return inner_->submit(r);
    std::string where = fmt::format("fault({}): {} of {} bytes at offset {}", inner_->info().name,
                                    to_string(r.direction), r.buffer.size_bytes(), r.offset_bytes);
    auto state = std::make_shared<detail::CompletionState>();
    switch (rule->kind) {
      case FaultKind::kEio:
      case FaultKind::kEnospc: {
        TERAIO_CHECK(!closed_.load(), "fault tier: submit after shutdown");
        int e = rule->kind == FaultKind::kEio ? EIO : ENOSPC;
        state->finish(failure(e, fmt::format("{} failed: {} (injected)", where, std::strerror(e))));
        return Completion(state);
      }
      case FaultKind::kShortRead:
      case FaultKind::kShortWrite: {
        IoRequest half = r;
        uint64_t moved = r.buffer.size_bytes() / 2;
        half.buffer = r.buffer.subview(0, moved);
        Delayed d{inner_->submit(half), state, 0, {}, true};
        d.override_result = failure(EIO, fmt::format("{} failed: short {}: {} of {} bytes (injected)", where,
                                                     to_string(r.direction), moved, r.buffer.size_bytes()));
        d.override_result.bytes = moved;
        enqueue(std::move(d), r.priority);
        return Completion(state);
      }
      case FaultKind::kSlow:
        enqueue(Delayed{inner_->submit(r), state, rule->delay_us, {}, false}, r.priority);
        return Completion(state);
      case FaultKind::kNone:
        break;
    }
    return inner_->submit(r);
  }

  void shutdown(ShutdownMode mode) override {
    std::lock_guard lock(shutdown_mu_);
    closed_.store(true);
    inner_->shutdown(mode);
    queue_.close();
    if (delayer_.joinable()) delayer_.join();
  }

  TierInfo info() const override {
    TierInfo i = inner_->info();
    i.name = "fault(" + i.name + ")";
    return i;
  }

 private:
  void enqueue(Delayed d, Priority p) {
    if (!queue_.push(std::move(d), p)) throw teraio::Error("fault tier: submit after shutdown");
  }
  void delay_loop() {
    while (auto d = queue_.pop_wait()) {
      IoResult r = d->inner.wait();
      if (d->delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(d->delay_us));
      if (d->override_set && r.ok) r = d->override_result;
      d->outer->finish(std::move(r));
    }
  }

  std::unique_ptr<Tier> inner_;
  FaultOptions o_;
  std::atomic<uint64_t> counter_{0};
  std::atomic<bool> closed_{false};
  PriorityQueue<Delayed> queue_;
  std::thread delayer_;
  std::mutex shutdown_mu_;
};

}  // namespace

std::unique_ptr<Tier> make_fault_tier(std::unique_ptr<Tier> inner, FaultOptions options) {
  return std::make_unique<FaultTier>(std::move(inner), std::move(options));
}

}  // namespace teraio::storage
