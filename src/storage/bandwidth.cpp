// Bandwidth of a tier measured through its own submit() path: the pass loop shared by
// `teraio iobench` and the short probe a Session runs for tiers whose bandwidth was not given
// (docs/storage.md, "Bandwidth probe"). Only the caller's range of the tier and its scratch buffer
// are written; the probe's time is capped.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "teraio/error.h"
#include "teraio/storage.h"
#include "teraio/units.h"

namespace teraio::storage {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Spread spread(std::vector<double> values) {
  Spread s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  s.median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  s.min = values.front();
  s.max = values.back();
  const double at = 0.75 * static_cast<double>(n - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, n - 1);
  s.upper = values[lo] + (values[hi] - values[lo]) * (at - static_cast<double>(lo));
  return s;
}

PassResult run_pass(Tier& tier, Direction direction, BufferView scratch, const PassOptions& o) {
  TERAIO_CHECK(o.request_bytes > 0 && o.window >= 1,
               "run_pass: request_bytes must be > 0 and window >= 1 (got {} and {})",
               o.request_bytes, o.window);
  const uint64_t n = (o.size_bytes + o.request_bytes - 1) / o.request_bytes;
  const size_t window = static_cast<size_t>(
      std::min<uint64_t>(static_cast<uint64_t>(o.window), std::max<uint64_t>(n, 1)));
  TERAIO_CHECK(n <= 1 ? scratch.size_bytes() >= o.size_bytes
                      : scratch.size_bytes() / o.request_bytes >= window,
               "run_pass: a scratch buffer of {} bytes holds fewer than {} requests of {} bytes",
               scratch.size_bytes(), window, o.request_bytes);
  std::vector<Completion> inflight(window);
  std::vector<uint64_t> at(window, 0);
  std::string first_error;
  auto slot_view = [&](size_t slot, uint64_t tier_offset) {
    const uint64_t len = std::min(o.request_bytes, o.offset_bytes + o.size_bytes - tier_offset);
    return scratch.subview(slot * o.request_bytes, len);
  };
  auto finish = [&](size_t slot) {
    if (!inflight[slot].valid()) return;
    const IoResult r = inflight[slot].wait();
    inflight[slot] = Completion();
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
    } else if (direction == Direction::kRead && o.after_read) {
      o.after_read(slot_view(slot, at[slot]), at[slot]);
    }
  };
  // The buffers stay in use until every submitted request is done, also when a hook throws.
  auto drain = [&]() noexcept {
    for (Completion& c : inflight)
      if (c.valid()) c.wait();
  };
  PassResult res;
  const auto t0 = Clock::now();
  try {
    for (uint64_t i = 0; i < n; ++i) {
      if (i > 0 && o.deadline && Clock::now() >= *o.deadline) {
        res.cut = true;
        break;
      }
      const size_t slot = static_cast<size_t>(i % window);
      finish(slot);
      if (!first_error.empty()) break;
      const uint64_t off = o.offset_bytes + i * o.request_bytes;
      const BufferView v = slot_view(slot, off);
      if (direction == Direction::kWrite && o.before_write) o.before_write(v, off);
      at[slot] = off;
      inflight[slot] = tier.submit({direction, v, off, Priority::kNormal, o.ready_stream});
      res.bytes += v.size_bytes();
    }
    for (size_t s = 0; s < window; ++s) finish(s);
  } catch (...) {
    drain();
    throw;
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!first_error.empty()) throw Error(first_error);
  return res;
}

// Reads [read_offset, +bytes) and writes [write_offset, +bytes) of the tier at once: slot s of the
// window (even, >= 2) serves reads when s is even, writes when odd, and the slots are visited in
// turn, so the two directions keep the same number of requests in flight. Returns GB/s per
// direction: the bytes of both over two, over the wall time.
double both_ways_pass(Tier& tier, BufferView scratch, uint64_t read_offset, uint64_t write_offset,
                      uint64_t bytes, uint64_t request, size_t window, CudaStream ready_stream,
                      std::chrono::steady_clock::time_point deadline, bool* cut) {
  const uint64_t n = (bytes + request - 1) / request;  // requests per direction
  std::vector<Completion> inflight(window);
  std::string first_error;
  auto finish = [&](size_t slot) {
    if (!inflight[slot].valid()) return;
    const IoResult r = inflight[slot].wait();
    inflight[slot] = Completion();
    if (!r.ok && first_error.empty()) first_error = r.error;
  };
  uint64_t next[2] = {0, 0};  // [0] reads, [1] writes submitted
  uint64_t moved = 0;
  const auto t0 = Clock::now();
  try {
    for (size_t i = 0; next[0] < n || next[1] < n; ++i) {
      const size_t slot = i % window;
      const int d = static_cast<int>(slot % 2);
      if (next[d] >= n) continue;
      finish(slot);
      if (!first_error.empty()) break;
      if (Clock::now() >= deadline && next[0] > 0 && next[1] > 0) {
        *cut = true;
        break;
      }
      const uint64_t off = next[d] * request;
      const uint64_t len = std::min(request, bytes - off);
      const BufferView v = scratch.subview(slot * request, len);
      inflight[slot] = tier.submit({d == 0 ? Direction::kRead : Direction::kWrite, v,
                                    (d == 0 ? read_offset : write_offset) + off,
                                    Priority::kNormal, ready_stream});
      ++next[d];
      moved += len;
    }
    for (size_t s = 0; s < window; ++s) finish(s);
  } catch (...) {
    for (Completion& c : inflight)
      if (c.valid()) c.wait();
    throw;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!first_error.empty()) throw Error(first_error);
  return seconds > 0 ? static_cast<double>(moved) / 2 / seconds / 1e9 : 0;
}

BandwidthProbe probe_bandwidth(Tier& tier, BufferView scratch, uint64_t offset_bytes,
                               uint64_t size_bytes, const BandwidthProbeOptions& o) {
  const TierInfo info = tier.info();
  TERAIO_CHECK(size_bytes > 0 && offset_bytes <= info.capacity_bytes &&
                   size_bytes <= info.capacity_bytes - offset_bytes,
               "bandwidth probe of the {} tier: range [{}, +{}) is outside its {} bytes", info.name,
               offset_bytes, size_bytes, info.capacity_bytes);
  TERAIO_CHECK(scratch.size_bytes() >= 4096,
               "bandwidth probe of the {} tier: the scratch buffer of {} bytes is under 4 KiB",
               info.name, scratch.size_bytes());
  TERAIO_CHECK(
      o.request_bytes > 0 && o.queue_depth >= 1 && o.repetitions >= 1 && o.time_limit_s > 0,
      "bandwidth probe: request_bytes, queue_depth, repetitions and time_limit_s must "
      "be positive");
  // Requests of request_bytes, fewer or smaller when the scratch cannot hold queue_depth of them.
  const uint64_t per_slot =
      scratch.size_bytes() / static_cast<uint64_t>(o.queue_depth) / 4096 * 4096;
  const uint64_t request =
      std::min({o.request_bytes, size_bytes, std::max<uint64_t>(per_slot, 4096)});
  const int window = static_cast<int>(std::clamp<uint64_t>(scratch.size_bytes() / request, 1,
                                                           static_cast<uint64_t>(o.queue_depth)));
  // Touch host scratch pages once, outside the timing (a fresh allocation faults on first write).
  if (!scratch.is_device()) std::memset(scratch.data(), 0, scratch.size_bytes());

  BandwidthProbe p;
  p.tier = info.name;
  p.engine = info.engine;
  p.memory = std::string(to_string(scratch.kind()));
  p.request_bytes = request;
  p.queue_depth = window;
  p.page_cache = info.buffered_io;

  const auto start = Clock::now();
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.time_limit_s));
  const auto warm_until = start + limit / 4;
  const auto writes_until = start + limit / 2;
  const auto reads_until = o.both_ways ? start + limit * 3 / 4 : start + limit;
  const auto both_until = start + limit;
  PassOptions po;
  po.offset_bytes = offset_bytes;
  po.request_bytes = request;
  po.window = window;
  po.ready_stream = o.ready_stream;
  auto pass = [&](Direction d, uint64_t bytes, Clock::time_point until) {
    po.size_bytes = bytes;
    po.deadline = until;
    try {
      return run_pass(tier, d, scratch, po);
    } catch (const Error& e) {
      throw Error(fmt::format("bandwidth probe of the {} tier ({}) failed: {}", info.name,
                              info.engine, e.what()));
    }
  };
  // Passes of a direction until `repetitions`, or until the last one says the next would end past
  // `until`; one pass always runs.
  auto timed = [&](Direction d, uint64_t bytes, Clock::time_point until, double last_s,
                   std::vector<double>* gbps) {
    while (gbps->size() < static_cast<size_t>(o.repetitions)) {
      const auto expected =
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(last_s));
      if (!gbps->empty() && Clock::now() + expected > until) {
        p.cut = true;
        return;
      }
      const PassResult r = pass(d, bytes, until);
      gbps->push_back(r.gbps());
      last_s = r.seconds;
      if (r.cut) {
        p.cut = true;
        return;
      }
    }
  };

  // The warm-up touches the range (first writes fault pages in, allocate file blocks) and is not
  // a sample; when it is cut, the timed passes cover what it wrote.
  std::vector<double> w, r;
  const PassResult warm = pass(Direction::kWrite, size_bytes, warm_until);
  p.pass_bytes = warm.bytes;
  p.cut = warm.cut;
  timed(Direction::kWrite, p.pass_bytes, writes_until, warm.seconds, &w);
  timed(Direction::kRead, p.pass_bytes, reads_until, 0, &r);
  // Both ways: the first half of what the write passes covered is read while the second half is
  // written, each request of `request` bytes (so at least two of them must fit the scratch).
  const size_t both_window = static_cast<size_t>(window) / 2 * 2;
  const uint64_t half = p.pass_bytes / 2 / request * request;
  std::vector<double> b;
  if (o.both_ways && both_window >= 2 && half > 0) {
    double last_s = 0;
    while (b.size() < static_cast<size_t>(o.repetitions)) {
      const auto expected =
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(last_s));
      if (!b.empty() && Clock::now() + expected > both_until) {
        p.cut = true;
        break;
      }
      bool cut = false;
      const auto t0 = Clock::now();
      try {
        b.push_back(both_ways_pass(tier, scratch, offset_bytes, offset_bytes + half, half, request,
                                   both_window, o.ready_stream, both_until, &cut));
      } catch (const Error& e) {
        throw Error(fmt::format("bandwidth probe of the {} tier ({}) failed both ways: {}",
                                info.name, info.engine, e.what()));
      }
      last_s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (cut) {
        p.cut = true;
        break;
      }
    }
  }
  p.both_gbps = spread(b);
  p.both_passes = static_cast<int>(b.size());
  p.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  p.write_gbps = spread(w);
  p.read_gbps = spread(r);
  p.write_passes = static_cast<int>(w.size());
  p.read_passes = static_cast<int>(r.size());
  if (p.page_cache)
    p.notes.push_back("buffered I/O (no O_DIRECT): these are page-cache numbers, not the disk's");
  if (p.cut)
    p.notes.push_back(fmt::format(
        "time limit of {:.2f} s reached: {} write, {} read and {} both-ways pass(es) of up to {}",
        o.time_limit_s, p.write_passes, p.read_passes, p.both_passes,
        format_bytes(static_cast<double>(p.pass_bytes))));
  return p;
}

// Note [A probe caught in a slow moment]: on an H100, one Session's quick probe of the host tier
// read at 24.2, 26.4 and 47.0 GB/s in its three passes (and 27.0 both ways) where every other run
// on that machine read at 50-54.6; the plan was made for a 26.4 GB/s read link, predicted 0.681 s a
// step and ran 0.396 s (docs/benchmarks.md, "Issue 15's peers at their memory, and plans made
// again for the host, on an H100"). A host
// link's passes take 5 ms each there, so three of them fit in a moment of interference (the host's
// memory busy elsewhere) and the probe ended in 0.06 s of its 0.5 s. The quick probe of a host tier
// now repeats its passes until each phase's share of the time limit is spent (at most 15), and the
// Session plans with their upper quartile (Spread::upper): interference only ever slows a copy
// between pinned memory and the GPU, so the faster passes are the link's. File tiers keep three
// passes and the median: a disk's bursts (a write cache) can outrun what it sustains.
namespace {
// Copies between memories (the host tier's engine, also under a fault tier that wraps it).
bool memory_copies(const TierInfo& info) { return info.engine == "memcpy"; }
}  // namespace

BandwidthProbeOptions quick_probe_options(const TierInfo& info) {
  BandwidthProbeOptions o;
  o.time_limit_s = memory_copies(info) ? 0.5 : 1.5;  // a host tier (under fault injection too)
  if (memory_copies(info)) o.repetitions = kQuickProbeHostPasses;
  return o;
}

double planned_gbps(const Spread& passes, const TierInfo& info) {
  return memory_copies(info) ? passes.upper : passes.median;
}

std::string_view planned_statistic(const TierInfo& info) {
  return memory_copies(info) ? "upper quartile" : "median";
}

}  // namespace teraio::storage
