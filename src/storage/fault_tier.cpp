// A fault-injecting wrapper around any tier (LevelDB EnvWrapper style), for tests and for rehearsing
// recovery: chosen requests fail with an errno, move only half their bytes and report a short
// transfer, or complete late. Rules can be added while the tier runs. Everything else passes
// through unchanged.
#include <cerrno>
#include <cstring>
#include <optional>
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

struct ActiveRule {
  FaultRule rule;
  uint64_t seen = 0;  // requests of its direction submitted since it was added
};

class FaultTierImpl final : public FaultTier {
 public:
  FaultTierImpl(std::unique_ptr<Tier> inner, FaultOptions o) : inner_(std::move(inner)) {
    TERAIO_CHECK(inner_ != nullptr, "fault tier: no inner tier");
    for (const FaultRule& r : o.rules) inject(r);
    delayer_ = std::thread([this] { delay_loop(); });
  }
  ~FaultTierImpl() override { shutdown(ShutdownMode::kDrain); }

  void inject(const FaultRule& rule) override {
    TERAIO_CHECK(rule.kind != FaultKind::kError || rule.error_code > 0,
                 "fault tier: a kError rule needs a positive error_code");
    std::lock_guard lock(rules_mu_);
    rules_.push_back({rule, 0});
  }
  void clear_faults() override {
    std::lock_guard lock(rules_mu_);
    rules_.clear();
  }

  Completion submit(const IoRequest& r) override {
    std::optional<FaultRule> rule;
    {
      std::lock_guard lock(rules_mu_);
      for (ActiveRule& a : rules_) {
        if (a.rule.direction && *a.rule.direction != r.direction) continue;
        const uint64_t n = a.seen++;
        if (a.rule.kind != FaultKind::kNone && n >= a.rule.nth_request &&
            n - a.rule.nth_request < a.rule.count)
          rule = a.rule;
      }
    }
    if (!rule) return inner_->submit(r);
    const TierInfo inner = inner_->info();
    std::string where = fmt::format("fault({}): {} of {} bytes at offset {}", inner.name,
                                    to_string(r.direction), r.buffer.size_bytes(), r.offset_bytes);
    for (size_t i = 0; i < inner.files.size(); ++i) where += (i == 0 ? " of " : ", ") + inner.files[i];
    auto state = std::make_shared<detail::CompletionState>();
    switch (rule->kind) {
      case FaultKind::kEio:
      case FaultKind::kEnospc:
      case FaultKind::kError: {
        TERAIO_CHECK(!closed_.load(), "fault tier: submit after shutdown");
        int e = rule->kind == FaultKind::kEio      ? EIO
                : rule->kind == FaultKind::kEnospc ? ENOSPC
                                                   : rule->error_code;
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

  TransferTimes transfer_times() const override { return inner_->transfer_times(); }
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
  std::mutex rules_mu_;
  std::vector<ActiveRule> rules_;
  std::atomic<bool> closed_{false};
  PriorityQueue<Delayed> queue_;
  std::thread delayer_;
  std::mutex shutdown_mu_;
};

}  // namespace

std::unique_ptr<FaultTier> make_fault_tier(std::unique_ptr<Tier> inner, FaultOptions options) {
  return std::make_unique<FaultTierImpl>(std::move(inner), std::move(options));
}

}  // namespace teraio::storage
