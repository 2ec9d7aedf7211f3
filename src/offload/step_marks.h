// Note [Steps timed on the device] (controller.cpp): a binding's marks at the ends of steps (events
// on the device's stream), paired into the device's time per step once the device has passed them.
// Header-only and templated on the event so that the PyTorch binding pairs CUDA events with it and
// the tests pair fake ones through the same code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace teraio::offload {

template <class Event>
class StepMarks {
 public:
  // At most this many marks wait to be passed: a device further behind loses its oldest.
  static constexpr size_t kMaxWaiting = 8;

  // Adds the mark `e` (already recorded) with `label` (0: a step not to be timed), then appends to
  // *periods {label, microseconds} for each pair of consecutive marks whose later one the device
  // has passed (`passed(event)`, which never blocks), when both carry the same nonzero label; the
  // microseconds are `elapsed_us(earlier, later)`, and a pair it gives no positive time for (marks
  // on different streams) is dropped. Each pair is reported once, oldest first.
  template <class Passed, class Elapsed>
  void add(uint64_t label, Event e, Passed&& passed, Elapsed&& elapsed_us,
           std::vector<std::pair<uint64_t, double>>* periods) {
    marks_.emplace_back(label, std::move(e));
    while (marks_.size() >= 2 && passed(marks_[1].second)) {
      const uint64_t l0 = marks_[0].first;
      const uint64_t l1 = marks_[1].first;
      if (l0 != 0 && l0 == l1) {
        const double us = elapsed_us(marks_[0].second, marks_[1].second);
        if (us > 0) periods->emplace_back(l1, us);
      }
      marks_.pop_front();
    }
    while (marks_.size() > kMaxWaiting) marks_.pop_front();
  }
  void clear() { marks_.clear(); }
  size_t waiting() const { return marks_.size(); }

 private:
  std::deque<std::pair<uint64_t, Event>> marks_;
};

}  // namespace teraio::offload
