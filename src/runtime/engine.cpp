// The migration engine (see engine.h): a state machine per logical tensor
// (unbound -> resident <-> offloading -> offloaded <-> prefetching -> resident), driven by the
// plan's per-operator moves, by operators that need their inputs, and by the budget.
// Bytes moved always go through a storage::Tier; memory is reached only through runtime::Memory.
#include "engine.h"

#include <algorithm>
#include <chrono>

#include "teraio/error.h"

namespace teraio::runtime {

namespace {
double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
bool counts_as_resident(Location l) {
  return l == Location::kResident || l == Location::kOffloading || l == Location::kPrefetching;
}
}  // namespace

std::string_view to_string(Location location) {
  switch (location) {
    case Location::kUnbound:
      return "unbound";
    case Location::kResident:
      return "resident";
    case Location::kOffloading:
      return "offloading";
    case Location::kOffloaded:
      return "offloaded";
    case Location::kPrefetching:
      return "prefetching";
  }
  return "?";
}

struct Engine::Entry {
  LogicalId id = 0;
  std::unique_ptr<Memory> memory;
  Location loc = Location::kUnbound;
  uint64_t bytes = 0;
  uint32_t tier = 0;
  bool has_extent = false;
  storage::Extent extent;
  storage::Completion pending;  // the write (offloading) or read (prefetching / just prefetched)
  int pins = 0;
  bool permanent = false;  // pin_permanently(): never offloaded again
  // Offloaded, its memory freed in stream order while `pending` (the write) may still be running
  // (EngineOptions::stream_ordered_offloads).
  bool write_in_flight = false;
  uint64_t last_use = 0;
};

Engine::Engine(EngineOptions options, std::vector<EngineTier> tiers)
    : options_(options), tiers_(std::move(tiers)) {
  for (const EngineTier& t : tiers_) {
    TERAIO_CHECK(t.tier != nullptr, "engine tier '{}' has no storage tier", t.name);
    TERAIO_CHECK(t.capacity_bytes > 0, "engine tier '{}' has no capacity", t.name);
    extents_.push_back(std::make_unique<storage::ExtentAllocator>(t.capacity_bytes));
  }
}

Engine::~Engine() {
  std::lock_guard lock(mutex_);
  for (auto& e : entries_) {
    if (e && e->pending.valid()) e->pending.wait();
  }
}

Engine::Entry* Engine::find(LogicalId id) {
  return id < entries_.size() ? entries_[id].get() : nullptr;
}
const Engine::Entry* Engine::find(LogicalId id) const {
  return id < entries_.size() ? entries_[id].get() : nullptr;
}

void Engine::note_resident_locked() {
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
  stats_.step_peak_resident_bytes =
      std::max(stats_.step_peak_resident_bytes, stats_.resident_bytes);
}

void Engine::bind(LogicalId id, std::unique_ptr<Memory> memory) {
  TERAIO_CHECK(memory != nullptr, "bind({}): no memory", id);
  std::lock_guard lock(mutex_);
  if (id >= entries_.size()) entries_.resize(id + 1);
  if (!entries_[id]) {
    entries_[id] = std::make_unique<Entry>();
    entries_[id]->id = id;
  }
  Entry& e = *entries_[id];
  if (e.loc != Location::kUnbound) forget_locked(e);
  e.memory = std::move(memory);
  e.bytes = e.memory->bytes();
  e.loc = Location::kResident;
  e.pins = 0;
  e.permanent = false;  // a new tensor: the pin was the previous one's
  e.last_use = ++clock_;
  stats_.resident_bytes += e.bytes;
  note_resident_locked();
}

// Brings the tensor back if it is alive (so that nothing is ever left without its bytes), then
// releases every resource the entry holds.
void Engine::forget_locked(Entry& e) {
  if (e.loc == Location::kUnbound) return;
  if (e.memory->alive()) {
    make_usable_locked(e);
  } else if (e.loc == Location::kOffloading || e.loc == Location::kPrefetching) {
    e.pending.wait();  // the held bytes must outlive the transfer
    e.memory->drop();
  }
  if (e.pending.valid()) e.pending.wait();
  e.pending = {};
  e.write_in_flight = false;
  if (e.has_extent) {
    extents_[e.tier]->free(e.extent);
    e.has_extent = false;
  }
  if (counts_as_resident(e.loc)) stats_.resident_bytes -= e.bytes;
  if (e.permanent) stats_.pinned_bytes -= e.bytes;
  e.permanent = false;
  e.loc = Location::kUnbound;
  e.memory.reset();
}

void Engine::unbind(LogicalId id) {
  std::lock_guard lock(mutex_);
  if (Entry* e = find(id)) forget_locked(*e);
}

bool Engine::bound(LogicalId id) const {
  std::lock_guard lock(mutex_);
  const Entry* e = find(id);
  return e && e->loc != Location::kUnbound;
}

Location Engine::location(LogicalId id) const {
  std::lock_guard lock(mutex_);
  const Entry* e = find(id);
  return e ? e->loc : Location::kUnbound;
}

// Waits for the entry's transfer (the wait counts as stall), forgets it, and returns its result.
storage::IoResult Engine::take_pending_locked(Entry& e) {
  double t0 = e.pending.ready() ? 0 : now_us();
  storage::IoResult r = e.pending.wait();  // a copy: resetting `pending` frees the state
  if (t0 != 0) stats_.stall_us += now_us() - t0;
  e.pending = {};
  return r;
}

// With stream_ordered_offloads, for a write still running from a tensor that has a stream: makes
// the stream wait for the tier's device-to-host copy (the CPU only until it is enqueued). True when
// the memory may now be freed in stream order, with the write still in flight; false when the write
// has finished (or failed) meanwhile, or the tier publishes no event: wait for it as usual.
bool Engine::release_in_stream_order_locked(Entry& e) {
  if (!options_.stream_ordered_offloads || e.pending.ready()) return false;
  storage::CudaStream s = e.memory->stream();
  if (s == nullptr) return false;
  double t0 = now_us();
  try {
    e.pending.stream_wait(s);  // returns once the copy is enqueued, or when the write is done
  } catch (const Error&) {
    // failed already (so ready: false below): the bytes are still ours, the caller gives them back
  }
  stats_.stall_us += now_us() - t0;
  return !e.pending.ready();
}

void Engine::complete_offload_locked(Entry& e, bool wait) {
  if (e.loc != Location::kOffloading) return;
  if (!wait && !e.pending.ready()) return;
  if (wait && release_in_stream_order_locked(e)) {
    // The stream's later work (and the allocator's reuse of this block on it) runs after the copy;
    // the write itself is checked when the tensor is read back or forgotten (finish_write_locked).
    e.write_in_flight = true;
    stats_.stream_ordered++;
  } else if (const storage::IoResult r = take_pending_locked(e); !r.ok) {
    // the bytes are still ours: give them back
    e.memory->attach();
    extents_[e.tier]->free(e.extent);
    e.has_extent = false;
    e.loc = Location::kResident;
    throw Error(fmt::format("offload of tensor {} to tier '{}' failed: {}", e.id,
                            tiers_[e.tier].name, r.error));
  }
  e.memory->drop();
  e.loc = Location::kOffloaded;
  stats_.resident_bytes -= e.bytes;
  stats_.bytes_offloaded += e.bytes;
}

void Engine::complete_prefetch_locked(Entry& e) {
  if (e.loc != Location::kPrefetching) return;
  double t0 = e.pending.ready() ? 0 : now_us();
  if (storage::CudaStream s = e.memory->stream()) {
    e.pending.stream_wait(s);  // the GPU waits, the CPU only until the copy is enqueued
  } else {
    e.pending.get();
  }
  if (t0 != 0) stats_.stall_us += now_us() - t0;
  e.memory->attach();
  e.loc = Location::kResident;
  stats_.bytes_prefetched += e.bytes;
  // The tier space is released once the read has really completed (poll or the next move).
}

void Engine::make_usable_locked(Entry& e) {
  switch (e.loc) {
    case Location::kUnbound:
    case Location::kResident:
      return;
    case Location::kOffloading: {  // used again before its memory went away: keep it
      take_pending_locked(e);
      e.memory->attach();
      extents_[e.tier]->free(e.extent);
      e.has_extent = false;
      e.loc = Location::kResident;
      stats_.cancelled_offloads++;
      event("cancelled-offload", e);
      return;
    }
    case Location::kOffloaded:
      stats_.urgent_fetches++;
      event("urgent-fetch", e);
      prefetch_locked(e, /*urgent=*/true);
      [[fallthrough]];
    case Location::kPrefetching:
      complete_prefetch_locked(e);
      return;
  }
}

bool Engine::offload_locked(Entry& e, uint32_t tier, bool urgent) {
  if (e.loc != Location::kResident || !e.memory->alive())
    return e.loc == Location::kOffloading || e.loc == Location::kOffloaded;
  if (e.permanent) return false;  // every offload path ends here: a pinned tensor never leaves
  TERAIO_CHECK(tier < tiers_.size(), "offload of tensor {}: tier {} does not exist", e.id, tier);
  if (e.has_extent) release_read_extent_locked(e);  // space of the previous read
  std::optional<storage::Extent> ext = extents_[tier]->try_allocate(e.bytes);
  if (!ext && reclaim_extents_locked(tier)) ext = extents_[tier]->try_allocate(e.bytes);
  if (!ext) return false;
  storage::IoRequest req;
  req.direction = storage::Direction::kWrite;
  req.buffer = e.memory->detach();
  req.offset_bytes = ext->offset_bytes;
  req.priority = urgent ? storage::Priority::kUrgent : storage::Priority::kNormal;
  req.ready_stream = e.memory->stream();
  try {
    e.pending = tiers_[tier].tier->submit(req);
  } catch (...) {
    e.memory->attach();
    extents_[tier]->free(*ext);
    throw;
  }
  e.tier = tier;
  e.extent = *ext;
  e.has_extent = true;
  e.loc = Location::kOffloading;
  stats_.offloads++;
  return true;
}

// An offload whose memory was freed in stream order: the read must not start before the write has
// landed (the tier does not order them), and a write that failed after its memory went has lost
// the tensor's contents: that is an error, never a silent read of stale bytes.
void Engine::finish_write_locked(Entry& e) {
  if (!e.write_in_flight) return;
  const storage::IoResult r = take_pending_locked(e);
  e.write_in_flight = false;
  if (!r.ok)
    throw Error(fmt::format("offload of tensor {} to tier '{}' failed after its device memory was "
                            "released, its contents are lost: {}",
                            e.id, tiers_[e.tier].name, r.error));
}

// A resident tensor keeps the tier space it was read from until the read is known to be complete;
// this waits for that read and gives the space back.
void Engine::release_read_extent_locked(Entry& e) {
  e.pending.wait();
  e.pending = {};
  extents_[e.tier]->free(e.extent);
  e.has_extent = false;
}

// Tier space is released lazily: a prefetched tensor keeps its extent until the read is known to
// be complete, a dead tensor until it is swept. When `tier` is full, release all of that now.
bool Engine::reclaim_extents_locked(uint32_t tier) {
  bool freed = false;
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound || !p->has_extent || p->tier != tier) continue;
    Entry& e = *p;
    if (e.loc == Location::kResident) {
      release_read_extent_locked(e);
      freed = true;
    } else if (e.pins == 0 && !e.memory->alive()) {
      forget_locked(e);
      freed = true;
    }
  }
  return freed;
}

bool Engine::prefetch_locked(Entry& e, bool urgent) {
  if (e.loc != Location::kOffloaded) return e.loc != Location::kUnbound;
  if (!e.memory->alive()) {  // died out there (a gradient freed by zero_grad): nothing to read
    forget_locked(e);
    return false;
  }
  finish_write_locked(e);
  storage::IoRequest req;
  req.direction = storage::Direction::kRead;
  req.buffer = e.memory->allocate();
  req.offset_bytes = e.extent.offset_bytes;
  req.ready_stream = e.memory->stream();  // the new block may still be read by queued kernels
  req.priority = urgent ? storage::Priority::kUrgent : storage::Priority::kNormal;
  try {
    e.pending = tiers_[e.tier].tier->submit(req);
  } catch (...) {
    e.memory->drop();
    throw;
  }
  e.loc = Location::kPrefetching;
  stats_.resident_bytes += e.bytes;
  stats_.prefetches++;
  note_resident_locked();
  return true;
}

bool Engine::offload(LogicalId id, uint32_t tier, bool urgent) {
  std::lock_guard lock(mutex_);
  Entry* e = find(id);
  return e && offload_locked(*e, tier, urgent);
}

bool Engine::prefetch(LogicalId id, bool urgent) {
  std::lock_guard lock(mutex_);
  Entry* e = find(id);
  return e && prefetch_locked(*e, urgent);
}

void Engine::finish_offload(LogicalId id) {
  std::lock_guard lock(mutex_);
  if (Entry* e = find(id)) complete_offload_locked(*e, /*wait=*/true);
}

void Engine::forget_dead(std::span<const LogicalId> ids) {
  if (ids.empty()) return;
  std::lock_guard lock(mutex_);
  for (LogicalId id : ids) {
    Entry* e = find(id);
    if (e && e->loc != Location::kUnbound && e->pins == 0 && !e->memory->alive()) forget_locked(*e);
  }
}

void Engine::forget_dead() {
  std::lock_guard lock(mutex_);
  sweep_dead_locked(0);
}

void Engine::poll() {
  std::lock_guard lock(mutex_);
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound) continue;
    Entry& e = *p;
    if (e.loc == Location::kOffloading && e.pending.ready()) complete_offload_locked(e, false);
    // a finished write is settled here; a failed one is left for the read-back to report
    if (e.write_in_flight && e.pending.ready() && e.pending.wait().ok) finish_write_locked(e);
    if (e.loc == Location::kResident && e.has_extent && e.pending.ready()) release_read_extent_locked(e);
    if (!e.memory->alive() && e.pins == 0) forget_locked(e);
  }
}

void Engine::begin_use(std::span<const LogicalId> ids) {
  std::lock_guard lock(mutex_);
  for (LogicalId id : ids) {
    Entry* e = find(id);
    if (!e || e->loc == Location::kUnbound) continue;
    make_usable_locked(*e);
    e->pins++;
    e->last_use = ++clock_;
  }
  note_resident_locked();
}

void Engine::end_use(std::span<const LogicalId> ids) {
  std::lock_guard lock(mutex_);
  for (LogicalId id : ids) {
    Entry* e = find(id);
    if (e && e->pins > 0) e->pins--;
  }
}

void Engine::pin_permanently(LogicalId id) {
  std::lock_guard lock(mutex_);
  Entry* e = find(id);
  if (!e || e->loc == Location::kUnbound || e->permanent) return;
  make_usable_locked(*e);
  e->permanent = true;
  stats_.pinned_bytes += e->bytes;
  note_resident_locked();
}

bool Engine::pinned_permanently(LogicalId id) const {
  std::lock_guard lock(mutex_);
  const Entry* e = find(id);
  return e && e->permanent;
}

void Engine::touch(std::span<const LogicalId> ids) {
  std::lock_guard lock(mutex_);
  for (LogicalId id : ids)
    if (Entry* e = find(id)) e->last_use = ++clock_;
  sweep_dead_locked(kSweepPerCall);
}

// Forgets up to `max_entries` dead tensors (all when 0), resuming where the last sweep stopped, so
// that freed tensors stop counting as resident soon after they die at O(1) cost per operator.
void Engine::sweep_dead_locked(size_t max_entries) {
  const size_t n = entries_.size();
  if (n == 0) return;
  const size_t count = max_entries == 0 ? n : std::min(max_entries, n);
  for (size_t i = 0; i < count; ++i) {
    sweep_cursor_ = (sweep_cursor_ + 1) % n;
    Entry* e = entries_[sweep_cursor_].get();
    if (e && e->loc != Location::kUnbound && e->pins == 0 && !e->memory->alive()) forget_locked(*e);
  }
}

bool Engine::enforce_budget(uint64_t reserve_bytes) {
  std::lock_guard lock(mutex_);
  if (options_.budget_bytes == 0) return true;
  uint64_t target =
      options_.budget_bytes > reserve_bytes ? options_.budget_bytes - reserve_bytes : 0;
  if (stats_.resident_bytes <= target) return true;
  sweep_dead_locked(0);  // tensors that died still count until forgotten
  if (stats_.resident_bytes <= target) return true;
  // Offloads already in flight free their memory first.
  for (auto& p : entries_)
    if (p && p->loc == Location::kOffloading) complete_offload_locked(*p, /*wait=*/true);
  if (stats_.resident_bytes <= target) return true;
  std::vector<Entry*> victims;
  for (auto& p : entries_)
    if (p && p->loc == Location::kResident && p->pins == 0 && !p->permanent && p->memory->alive())
      victims.push_back(p.get());
  std::sort(victims.begin(), victims.end(),
            [](const Entry* a, const Entry* b) { return a->last_use < b->last_use; });
  uint64_t outgoing = 0;
  std::vector<Entry*> started;
  for (Entry* e : victims) {
    if (stats_.resident_bytes - outgoing <= target) break;
    for (uint32_t t = 0; t < tiers_.size(); ++t) {
      if (offload_locked(*e, t, /*urgent=*/true)) {
        outgoing += e->bytes;
        started.push_back(e);
        stats_.evictions++;
        event("eviction", *e);
        break;
      }
    }
  }
  for (Entry* e : started) complete_offload_locked(*e, /*wait=*/true);
  return stats_.resident_bytes <= target;
}

void Engine::fetch_all() {
  std::lock_guard lock(mutex_);
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound || !p->memory->alive()) continue;
    if (p->loc == Location::kOffloaded) prefetch_locked(*p, /*urgent=*/true);
  }
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound || !p->memory->alive()) continue;
    make_usable_locked(*p);
  }
  note_resident_locked();
}

size_t Engine::align(std::span<const Move> out, std::span<const LogicalId> in) {
  std::lock_guard lock(mutex_);
  size_t moved = 0;
  std::vector<Entry*> started;
  for (const Move& m : out) {
    Entry* e = find(m.tensor);
    if (!e || e->loc != Location::kResident || e->pins > 0 || e->permanent || !e->memory->alive())
      continue;
    if (offload_locked(*e, m.tier, /*urgent=*/true)) {
      started.push_back(e);
      event("align-offload", *e);
    }
  }
  for (Entry* e : started) complete_offload_locked(*e, /*wait=*/true);
  moved += started.size();
  for (LogicalId id : in) {  // reads only start here; the first use waits for them
    Entry* e = find(id);
    if (!e || e->loc != Location::kOffloaded || !e->memory->alive()) continue;
    event("align-fetch", *e);
    if (prefetch_locked(*e, /*urgent=*/true)) moved++;
  }
  stats_.aligned += moved;
  note_resident_locked();
  return moved;
}

void Engine::set_plan(const Plan& plan, size_t num_kernels) {
  std::lock_guard lock(mutex_);
  schedule_.clear();
  if (plan.moves.empty()) return;
  schedule_.resize(num_kernels);
  for (const Move& m : plan.moves) {
    TERAIO_CHECK(m.start < num_kernels && m.deadline < num_kernels,
                 "plan move of tensor {} names kernel {} but the iteration has {}", m.tensor,
                 std::max(m.start, m.deadline), num_kernels);
    TERAIO_CHECK(m.tier < tiers_.size(),
                 "plan move of tensor {} names tier {} but the engine has {}", m.tensor, m.tier,
                 tiers_.size());
    if (m.op == MoveOp::offload) {
      schedule_[m.start].offload_at.push_back(m);
      schedule_[m.deadline].offload_due.push_back(m.tensor);
    } else {
      schedule_[m.start].prefetch_at.push_back(m);
    }
  }
}

void Engine::before_operator(uint32_t k) {
  std::lock_guard lock(mutex_);
  if (k >= schedule_.size()) return;
  // Tensors that died since the last sweep still count as resident; forget them before taking
  // memory, so that the resident bytes (and their peak) are the live ones.
  if (!schedule_[k].prefetch_at.empty()) sweep_dead_locked(0);
  for (const Move& m : schedule_[k].prefetch_at) {
    Entry* e = find(m.tensor);
    if (!e || e->loc == Location::kUnbound) continue;  // died (swept): nothing to bring back
    if (e->loc == Location::kOffloaded && !e->memory->alive()) {
      forget_locked(*e);  // freed while out (a gradient at zero_grad): the plan expected that
      continue;
    }
    if (e->loc == Location::kOffloaded && prefetch_locked(*e, false)) {
      stats_.plan_moves++;
    } else {
      stats_.skipped_moves++;
      event(fmt::format("skipped-prefetch({})", to_string(e->loc)), *e);
    }
  }
  note_resident_locked();
}

void Engine::after_operator(uint32_t k) {
  std::lock_guard lock(mutex_);
  if (k >= schedule_.size()) return;
  for (const Move& m : schedule_[k].offload_at) {
    Entry* e = find(m.tensor);
    if (!e || e->loc == Location::kUnbound) continue;  // died before its offload: nothing to do
    const bool movable =
        e->loc == Location::kResident && e->pins == 0 && !e->permanent && e->memory->alive();
    bool done = movable && offload_locked(*e, m.tier, false);
    // The planned tier can be full of what evictions and drift put there; the bytes then go to
    // another tier (the read comes back from wherever they are) rather than stay over budget.
    for (uint32_t t = 0; movable && !done && t < tiers_.size(); ++t) {
      if (t == m.tier || !offload_locked(*e, t, false)) continue;
      done = true;
      stats_.spilled_moves++;
      event("spilled-offload", *e);
    }
    if (done) {
      stats_.plan_moves++;
    } else {
      stats_.skipped_moves++;
      event(fmt::format("skipped-offload({}{}{}{}{})", to_string(e->loc), e->pins ? ", in use" : "",
                        e->permanent ? ", pinned" : "", e->memory->alive() ? "" : ", dead",
                        movable ? ", no tier space" : ""),
            *e);
    }
  }
  for (LogicalId id : schedule_[k].offload_due)
    if (Entry* e = find(id)) complete_offload_locked(*e, /*wait=*/true);
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Engine::set_event_hook(EventHook hook) {
  std::lock_guard lock(mutex_);
  hook_ = std::move(hook);
}

void Engine::event(std::string_view what, const Entry& e) const {
  if (hook_) hook_(what, e.id, e.bytes);
}

void Engine::reset_step_peak() {
  std::lock_guard lock(mutex_);
  stats_.step_peak_resident_bytes = stats_.resident_bytes;
}

void Engine::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_resident_bytes = stats_.resident_bytes;
}

}  // namespace teraio::runtime
