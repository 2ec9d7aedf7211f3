// The migration engine (see engine.h): a state machine per logical tensor
// (unbound -> resident <-> offloading -> offloaded <-> prefetching -> resident), driven by the
// plan's per-operator moves, by operators that need their inputs, and by the budget.
// Bytes moved always go through a storage::Tier; memory is reached only through runtime::Memory.
#include "engine.h"

#include <algorithm>
#include <cerrno>
#include <unordered_map>

#include "teraio/error.h"
#include "teraio/units.h"

namespace teraio::runtime {

namespace {
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
    case Location::kLost:
      return "lost";
    case Location::kDropped:
      return "dropped";
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
  // kPrefetching or kResident: the stream-ordered write this read back was ordered after, still
  // running when the read was submitted (Note [Reads after their write] in
  // src/storage/host_tier.cpp); its result is checked once it has ended (settle_read_after_locked).
  storage::Completion read_after;
  uint64_t last_use = 0;
  uint64_t write_seq = 0;  // the order its offload was started in (make_room_locked)
  std::string lost_message;  // kLost: the fault that lost the bytes, reported at every use
  // kLost by a discard (Note [Dead tensors]): its bytes were dropped on purpose, the profile saw it
  // die unread; a use reports it, but fetch_all (checkpoints, close) does not count it as a failure.
  bool discarded = false;
  std::unique_ptr<Recipe> recipe;  // Note [Recompute in the engine]
  bool recomputing = false;        // its recipe is running (a chain must not loop back to it)
  // Resident, and `extent` of `tier` still holds its bytes: read back from there and not written
  // in place since (Note [Clean offloads]). `pending` is then that read.
  bool clean = false;
  // A writeback copy is in flight (`pending` is its write into `extent` of `tier`); `stale` once
  // the tensor was reported written meanwhile (Note [Writebacks in the engine]).
  bool writing_back = false;
  bool writeback_stale = false;
  // kOffloading on a writeback's copy that its offload took over (Note [An offload takes over its
  // writeback's copy]): the bytes are counted in writeback_bytes, not again in bytes_offloaded.
  bool took_over_writeback = false;
};

Engine::Engine(EngineOptions options, std::vector<EngineTier> tiers)
    : options_(options),
      tiers_(std::move(tiers)),
      schedule_(std::make_shared<const Schedule>()) {
  budget_.budget_bytes = options_.budget_bytes;
  stats_.tiers.resize(tiers_.size());
  for (const EngineTier& t : tiers_) {
    TERAIO_CHECK(t.tier != nullptr, "engine tier '{}' has no storage tier", t.name);
    TERAIO_CHECK(t.capacity_bytes > 0, "engine tier '{}' has no capacity", t.name);
    extents_.push_back(std::make_unique<storage::ExtentAllocator>(t.capacity_bytes));
  }
}

Engine::~Engine() {
  std::lock_guard lock(mutex_);
  for (Deferred& d : deferred_) d.read.wait();
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
  e.discarded = false;
  e.recipe.reset();     // and the recipe
  e.last_use = ++clock_;
  stats_.resident_bytes += e.bytes;
  note_resident_locked();
}

// Brings the tensor back if it is alive (so that nothing is ever left without its bytes), then
// releases every resource the entry holds.
void Engine::forget_locked(Entry& e) {
  if (e.loc == Location::kUnbound) return;
  if (e.loc == Location::kLost) {
    // nothing to bring back; the Memory already refuses every access
  } else if (e.memory->alive()) {
    make_usable_locked(e);  // on failure the tensor is offloaded or lost: still forgotten below
  } else if (e.loc == Location::kOffloading || e.loc == Location::kPrefetching) {
    // the held bytes must outlive the transfer
    wait_locked(e.pending, e.loc == Location::kOffloading ? Wait::kWrite : Wait::kRead, e.tier);
    e.memory->drop();
  }
  settle_writeback_locked(e, /*wait=*/true);  // a failed copy is reported even for a dead tensor
  // A read back may still be running on a GPU (its use waited for it on the stream, not the CPU):
  // its tier space is released once it has ended, as fresh_extent_locked does, instead of the CPU
  // waiting for the GPU to reach the copy (Note [Where the CPU waits]; on the H200 most of the
  // CPU's read waits were these). A write freed in stream order is still waited for.
  if (e.pending.valid() && !e.write_in_flight && e.has_extent && !e.pending.ready()) {
    deferred_.push_back({e.pending, e.tier, e.extent});
    e.has_extent = false;
  } else if (e.pending.valid()) {
    wait_locked(e.pending, e.write_in_flight ? Wait::kWrite : Wait::kRead, e.tier);
  }
  e.pending = {};
  e.write_in_flight = false;
  e.read_after = {};  // its read, which follows the write, keeps the tier space until it ends
  e.took_over_writeback = false;
  e.clean = false;
  if (e.has_extent) {
    extents_[e.tier]->free(e.extent);
    e.has_extent = false;
  }
  if (counts_as_resident(e.loc)) stats_.resident_bytes -= e.bytes;
  if (e.loc == Location::kOffloaded && e.memory->alive())
    e.memory->lose(fmt::format("teraio: {} was forgotten while its bytes were only in tier '{}'",
                               name_locked(e), tiers_[e.tier].name));
  if (e.permanent) stats_.pinned_bytes -= e.bytes;
  e.permanent = false;
  e.loc = Location::kUnbound;
  e.recipe.reset();
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

// Note [Where the CPU waits]: every wait of the engine for a transfer counts in stall_us, and in
// one of three parts: reads (those of a use also in stall_read_use_us), writes due (their planned
// deadline, or the write a read back was ordered after, waited for before the tensor's bytes are
// relied on: settle_read_after_locked), and room (make_room_locked: writes
// completed, or evictions, to stay within the budget). That includes the waits no plan asks for:
// forgetting a tensor that died with a transfer still running (its bytes must outlive the copy;
// a read back's tier space alone is released later instead, forget_locked), giving back a read's
// tier space (wait_locked). Uncounted, they were taken for the Session's own host work (Note [The
// runner's host time] in src/offload/controller.cpp). A wait is the CPU's: for a stream-ordered
// write or a read on CUDA it lasts until the copy is on a copy stream, not until it ends. The CPU
// then launches nothing, so the GPU runs out of queued work if the wait outlasts the CPU's lead:
// room waits beyond what the plan needed are what make_room_locked avoids by completing the oldest
// writes first, and only as many as it must.
void Engine::add_stall_locked(Wait what, double since_us, uint32_t tier) {
  const double dt = steady_us() - since_us;
  stats_.stall_us += dt;
  if (making_room_)
    stats_.stall_room_us += dt;
  else if (what == Wait::kRead || what == Wait::kReadUse)
    stats_.stall_read_us += dt;
  else
    stats_.stall_write_us += dt;
  if (!making_room_) {
    if (what == Wait::kReadUse) stats_.stall_read_use_us += dt;
    if (what == Wait::kWriteDue) stats_.stall_write_due_us += dt;
    if (what == Wait::kWriteReadBack) stats_.stall_write_readback_us += dt;
    if (what == Wait::kWriteback) stats_.stall_writeback_us += dt;
  }
  EngineStats::Tier& t = stats_.tiers.at(tier);
  (what == Wait::kRead || what == Wait::kReadUse ? t.stall_read_us : t.stall_write_us) += dt;
}

storage::IoResult Engine::wait_locked(const storage::Completion& c, Wait what, uint32_t tier) {
  if (c.ready()) return c.wait();
  const double t0 = steady_us();
  storage::IoResult r = c.wait();
  add_stall_locked(what, t0, tier);
  return r;
}

// Waits for the entry's transfer (the wait counts as stall), forgets it, and returns its result.
storage::IoResult Engine::take_pending_locked(Entry& e, Wait write) {
  // a copy: resetting `pending` frees the state
  storage::IoResult r = wait_locked(e.pending, e.loc == Location::kPrefetching ? Wait::kRead : write, e.tier);
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
  double t0 = steady_us();
  try {
    e.pending.stream_wait(s);  // returns once the copy is enqueued, or when the write is done
  } catch (const Error&) {
    // failed already (so ready: false below): the bytes are still ours, the caller gives them back
  }
  add_stall_locked(Wait::kWriteDue, t0, e.tier);
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
  } else if (const storage::IoResult r = take_pending_locked(e, Wait::kWriteDue); !r.ok) {
    // the bytes are still ours: give them back
    e.took_over_writeback = false;
    e.memory->attach();
    extents_[e.tier]->free(e.extent);
    e.has_extent = false;
    e.loc = Location::kResident;
    fault_locked(e, r,
                 fmt::format("offload of {} to tier '{}' failed (it stays on the device)",
                             name_locked(e), tiers_[e.tier].name),
                 /*lost=*/false);
    return;
  }
  e.memory->drop();
  e.loc = Location::kOffloaded;
  stats_.resident_bytes -= e.bytes;
  if (!e.took_over_writeback) stats_.bytes_offloaded += e.bytes;
  e.took_over_writeback = false;
  stats_.tiers[e.tier].bytes_written += e.bytes;
}

bool Engine::complete_prefetch_locked(Entry& e) {
  if (e.loc != Location::kPrefetching) return e.loc == Location::kResident;
  double t0 = e.pending.ready() ? 0 : steady_us();
  bool ok = true;
  for (int attempt = 0;; ++attempt) {
    if (storage::CudaStream s = e.memory->stream()) {
      try {
        e.pending.stream_wait(s);  // the GPU waits, the CPU only until the copy is enqueued
        ok = true;
      } catch (const Error&) {
        ok = false;  // the read failed (and no copy into the memory is in flight: storage.h)
      }
    } else {
      ok = e.pending.wait().ok;
    }
    // Note [Read retries]: a read that failed without losing the bytes (EIO, a short read) is tried
    // again at once, up to kReadRetries times, into fresh memory: a passing fault then costs the
    // retries, not the step. Each retry is counted (retried_reads).
    if (ok || attempt == kReadRetries || storage::lost(e.pending.wait())) break;
    stats_.retried_reads++;
    e.memory->drop();
    storage::IoRequest req;
    req.direction = storage::Direction::kRead;
    req.buffer = e.memory->allocate();
    req.offset_bytes = e.extent.offset_bytes;
    req.ready_stream = e.memory->stream();
    req.priority = storage::Priority::kUrgent;
    req.after = e.read_after;
    e.pending = submit_locked(e.tier, req);
  }
  if (t0 != 0) add_stall_locked(Wait::kReadUse, t0, e.tier);
  // The write this read followed (prefetch_locked): checked if it has ended, else later.
  if (!settle_read_after_locked(e, /*wait=*/false)) return false;
  if (!ok) {
    const storage::IoResult r = e.pending.wait();
    e.pending = {};
    e.memory->drop();
    e.loc = Location::kOffloaded;  // the bytes are still in the tier, unless lost (fault_locked)
    stats_.resident_bytes -= e.bytes;
    // Note [Refused tensors]: the operator about to run must not see a null pointer (PyTorch's
    // untyped data() does not check it: kernels would crash); the tensor refuses every access with
    // the fault's message until it is read back. A binding that cannot undo that loses it.
    const std::string what = fmt::format("{} could not be read back from tier '{}'", name_locked(e),
                                         tiers_[e.tier].name);
    bool lost = storage::lost(r);
    if (!lost) {
      const std::string msg = fmt::format(
          "teraio: {} after {} attempts (it stays there; the next use reads it again): {}", what,
          kReadRetries + 1, r.error);
      lost = !e.memory->refuse(msg);
      if (!lost) {
        stats_.failed_transfers++;
        faults_.push_back(Fault{e.id, false, true, r.error_code, msg});
        return false;
      }
    }
    fault_locked(e, r, what, /*lost=*/true);
    faults_.back().read = true;
    return false;
  }
  e.memory->attach();
  e.loc = Location::kResident;
  e.clean = options_.clean_offloads;
  stats_.bytes_prefetched += e.bytes;
  stats_.tiers[e.tier].bytes_read += e.bytes;
  // The tier space is released once the read has really completed (poll or the next move), unless
  // it stays as the tensor's clean copy (Note [Clean offloads]).
  return true;
}

std::string Engine::name_locked(const Entry& e) const {
  std::string name = namer_ ? namer_(e.id) : std::string();
  if (name.empty()) name = std::to_string(e.id);
  return fmt::format("tensor '{}' ({} bytes)", name, e.bytes);
}

// Records a failed transfer of `e` (Note [Faults in the engine]). A read whose bytes are lost, or a
// stream-ordered write that failed after its memory was released, makes the tensor kLost: its tier
// space is freed and its Memory refuses every access with the message from now on.
void Engine::fault_locked(Entry& e, const storage::IoResult& r, std::string what, bool lost) {
  stats_.failed_transfers++;
  Fault f;
  f.id = e.id;
  f.error_code = r.error_code;
  f.lost = lost;
  if (lost) {
    if (e.has_extent) {
      extents_[e.tier]->free(e.extent);
      e.has_extent = false;
    }
    if (e.loc != Location::kLost) stats_.lost_tensors++;
    e.loc = Location::kLost;
    f.message = fmt::format("teraio: {}: {}. Its contents are lost: restore the model and optimizer "
                            "from a checkpoint",
                            what, r.error);
    e.lost_message = f.message;
    e.memory->lose(f.message);
  } else {
    f.message = fmt::format("teraio: {}: {}", what, r.error);
  }
  faults_.push_back(std::move(f));
}

bool Engine::make_usable_locked(Entry& e, std::span<const LogicalId> spare) {
  switch (e.loc) {
    case Location::kUnbound:
    case Location::kResident:
      return true;
    case Location::kLost:
      faults_.push_back(Fault{e.id, true, true, EBADMSG, e.lost_message});
      return false;
    case Location::kOffloading: {  // used again before its memory went away: keep it
      take_pending_locked(e);
      e.took_over_writeback = false;
      e.memory->attach();
      extents_[e.tier]->free(e.extent);
      e.has_extent = false;
      e.loc = Location::kResident;
      stats_.cancelled_offloads++;
      event("cancelled-offload", e);
      return true;
    }
    case Location::kOffloaded:
      stats_.urgent_fetches++;
      event("urgent-fetch", e);
      if (!prefetch_locked(e, /*urgent=*/true, Room::kRequired, spare)) return false;
      [[fallthrough]];
    case Location::kPrefetching:
      return complete_prefetch_locked(e);
    case Location::kDropped:
      return recompute_locked(e, /*urgent=*/true, spare);
  }
  return false;
}

std::string Engine::unfreeable_locked(const Entry& e) const {
  if (e.loc != Location::kResident) return std::string(to_string(e.loc));
  if (e.pins > 0) return "in use";
  if (e.permanent) return "pinned";
  return {};
}

bool Engine::drop_locked(Entry& e, std::string* why) {
  *why = unfreeable_locked(e);
  if (why->empty()) {
    if (!e.memory->alive()) {
      *why = "dead";
    } else if (!e.recipe) {
      *why = "no recipe";
    } else {
      *why = e.recipe->stale();
    }
  }
  if (!why->empty()) return false;
  if (!settle_writeback_alive_locked(e)) {
    *why = "dead";
    return false;
  }
  e.memory->detach();
  e.memory->drop();
  e.clean = false;
  e.loc = Location::kDropped;
  stats_.resident_bytes -= e.bytes;
  return true;
}

// Note [Dead tensors] (engine.h).
bool Engine::discard_locked(Entry& e, std::string* why) {
  *why = unfreeable_locked(e);
  if (!why->empty()) return false;
  if (!settle_writeback_alive_locked(e)) {
    *why = "dead";
    return false;
  }
  release_clean_copy_locked(e);
  e.memory->detach();
  e.memory->drop();
  e.lost_message = fmt::format(
      "teraio: {} was discarded after its last use: in the profiled steps nothing used it again "
      "before it was freed, so its bytes were freed instead of written out, and this step uses it "
      "after all. Free it after its last use as those steps did (e.g. call optimizer.zero_grad() "
      "right after optimizer.step() every step), or create the Session with discard_dead=False "
      "(docs/pytorch.md, \"Dead tensors\")",
      name_locked(e));
  e.memory->lose(e.lost_message);
  e.loc = Location::kLost;
  e.discarded = true;
  stats_.resident_bytes -= e.bytes;
  stats_.discards++;
  stats_.discarded_bytes += e.bytes;
  event("discard", e);
  return true;
}

bool Engine::recompute_locked(Entry& e, bool urgent, std::span<const LogicalId> spare) {
  if (e.loc != Location::kDropped) return make_usable_locked(e, spare);
  auto fail = [&](const std::string& why) {
    if (e.loc != Location::kLost) stats_.lost_tensors++;
    e.loc = Location::kLost;
    e.lost_message = fmt::format(
        "teraio: {} was freed to be recomputed, and recomputing it failed: {}. Its contents are "
        "lost: restore the model and optimizer from a checkpoint, and report this (run with "
        "recompute=False to avoid it)",
        name_locked(e), why);
    e.recipe.reset();
    e.memory->lose(e.lost_message);
    faults_.push_back(Fault{e.id, true, true, EBADMSG, e.lost_message});
    event("recompute-failed", e);
    return false;
  };
  if (!e.recipe) return fail("it has no recipe");
  if (e.recomputing) return fail("its producer reads it (a cycle)");
  if (urgent) {
    stats_.urgent_recomputes++;
    event("urgent-recompute", e);
  }
  e.recomputing = true;
  // The inputs first: usable (a dropped one recomputed, an offloaded one read back) and pinned
  // while the producer runs, spared by the room made for the tensor.
  const std::span<const LogicalId> ins = e.recipe->inputs();
  std::vector<LogicalId> keep(spare.begin(), spare.end());
  keep.insert(keep.end(), ins.begin(), ins.end());
  std::vector<Entry*> pinned;
  std::string why;
  const Entry* unread = nullptr;  // an input that could not be read back for now
  for (LogicalId id : ins) {
    Entry* in = find(id);
    if (!in || in->loc == Location::kUnbound) continue;  // not tracked: held by the recipe itself
    if (!make_usable_locked(*in, keep)) {
      why = fmt::format("its input {} could not be made usable", name_locked(*in));
      if (in->loc != Location::kLost) unread = in;
      break;
    }
    in->pins++;
    pinned.push_back(in);
  }
  if (unread) {
    // Note [Recomputes that wait for a read]: the input's read failed for now (its bytes are still
    // in the tier and its next use reads it again; the step raises that fault). The tensor is not
    // lost: it stays dropped with its recipe, refusing every access with this message until a
    // recompute succeeds (Note [Refused tensors]). Losing it for a passing fault would turn a
    // read error into a reported loss, at the next use or at close, where nothing was lost.
    const std::string msg = fmt::format(
        "teraio: {} could not be recomputed for now: its input {} could not be read back (the next "
        "use tries again)",
        name_locked(e), name_locked(*unread));
    if (e.memory->refuse(msg)) {  // else (a binding that cannot undo it) the tensor is lost below
      for (Entry* in : pinned) in->pins--;
      e.recomputing = false;
      faults_.push_back(Fault{e.id, false, true, EIO, msg});
      event("recompute-deferred", e);
      return false;
    }
  }
  if (why.empty()) why = e.recipe->stale();
  if (why.empty()) {
    make_room_locked(e.bytes, keep);  // a shortfall is reported by the next budget check
    const double t0 = steady_us();
    try {
      why = e.recipe->run(*e.memory);
    } catch (const std::exception& ex) {
      why = ex.what();
    }
    stats_.recompute_us += steady_us() - t0;
  }
  for (Entry* in : pinned) in->pins--;
  e.recomputing = false;
  if (!why.empty()) return fail(why);
  e.loc = Location::kResident;
  stats_.resident_bytes += e.bytes;
  stats_.recomputes++;
  note_resident_locked();
  return true;
}

void Engine::set_recipe(LogicalId id, std::unique_ptr<Recipe> recipe) {
  std::lock_guard lock(mutex_);
  Entry* e = find(id);
  if (e && e->loc != Location::kUnbound) e->recipe = std::move(recipe);
}

bool Engine::has_recipe(LogicalId id) const {
  std::lock_guard lock(mutex_);
  const Entry* e = find(id);
  return e && e->recipe != nullptr;
}

void Engine::release_recipes() {
  std::lock_guard lock(mutex_);
  for (auto& p : entries_)
    if (p && p->recipe && p->loc != Location::kDropped) p->recipe.reset();
}

bool Engine::offload_locked(Entry& e, uint32_t tier, bool urgent) {
  if (e.loc != Location::kResident || !e.memory->alive())
    return e.loc == Location::kOffloading || e.loc == Location::kOffloaded;
  if (e.permanent) return false;  // every offload path ends here: a pinned tensor never leaves
  TERAIO_CHECK(tier < tiers_.size(), "offload of tensor {}: tier {} does not exist", e.id, tier);
  if (e.writing_back && !e.writeback_stale && e.tier == tier && !e.pending.ready() &&
      e.memory->alive()) {  // alive: not replaced by its owner (while lent it cannot have died)
    // Note [An offload takes over its writeback's copy]: the copy running is this offload's write.
    // The bytes go to the engine before the lent view ends, so they outlive the copy even if the
    // tensor died meanwhile (it is then forgotten once the write has ended, like any offload's).
    e.memory->detach();
    e.memory->end_view();
    e.writing_back = false;
    e.took_over_writeback = true;
    e.loc = Location::kOffloading;
    e.write_seq = ++write_clock_;
    stats_.offloads++;
    stats_.writebacks_taken_over++;
    return true;
  }
  if (!settle_writeback_alive_locked(e)) return false;  // the offload relies on the copy
  if (!settle_read_after_locked(e, /*wait=*/true)) return false;  // and on these bytes
  if (e.clean && e.has_extent && e.tier == tier) {
    // Note [Clean offloads]: the tier already holds these bytes; only the memory goes. `pending`
    // (the read that brought them) stays until the next read waits for it.
    e.memory->detach();
    e.memory->drop();
    e.clean = false;
    e.loc = Location::kOffloaded;
    stats_.resident_bytes -= e.bytes;
    stats_.clean_offloads++;
    stats_.clean_bytes += e.bytes;
    stats_.tiers[tier].bytes_clean += e.bytes;
    return true;
  }
  const std::optional<storage::Extent> ext = fresh_extent_locked(e, tier);
  if (!ext) return false;
  storage::IoRequest req;
  req.direction = storage::Direction::kWrite;
  req.buffer = e.memory->detach();
  req.offset_bytes = ext->offset_bytes;
  req.priority = urgent ? storage::Priority::kUrgent : storage::Priority::kNormal;
  req.ready_stream = e.memory->stream();
  try {
    e.pending = submit_locked(tier, req);
  } catch (...) {
    e.memory->attach();
    extents_[tier]->free(*ext);
    throw;
  }
  e.tier = tier;
  e.extent = *ext;
  e.has_extent = true;
  e.loc = Location::kOffloading;
  e.write_seq = ++write_clock_;
  stats_.offloads++;
  return true;
}

// Note [Writebacks in the engine]
// A writeback move (docs/formats.md, "Writebacks") copies a resident tensor to its tier while the
// tensor stays usable: the binding lends its bytes (Memory::view) and the write is ordered after
// the work queued on the tensor's stream, like an offload's. When the copy has completed and no
// write of the tensor was reported since it started (note_written marks it stale), the tensor is
// clean (Note [Clean offloads]): its next offload to that tier frees the memory without a write.
// An offload that finds the copy still running takes it over as its own write (Note [An offload
// takes over its writeback's copy]); a stale or failed copy is discarded and that offload writes as
// usual. The plan forbids writes between a writeback and its offload; a
// write anyway (drift, a reactive step) only costs the write the writeback meant to save. On the
// CPU a use of the tensor (begin_use: any operator may write it) waits for a copy still in flight,
// so no write runs while the copy reads the bytes (that would be a data race). On a GPU it does not:
// the copy runs on a copy stream and the use's kernels on the compute stream, a write among them
// is reported at the end of its operator like any other and makes the copy stale, and a waiting
// CPU would launch nothing meanwhile. What a binding must add: the lent bytes
// must outlive the copy even if the tensor dies: the engine calls Memory::end_view once the copy
// has ended (settle_writeback_locked, release_read_extent_locked, forget_locked, or at once when
// the copy could not start), and the Session's binding holds the storage until then (Note [Lent
// bytes] in src/torch/session.cpp). A binding's tensor may thus die at end_view(): whatever frees
// or moves the memory after waiting for a copy checks alive() again (settle_writeback_alive_locked).
// Note [An offload takes over its writeback's copy]
// A plan's writeback is background work on the write link (docs/simulator.md, "Writebacks"): it
// may still be running when its tensor's offload comes, which the plan allows as long as it ends
// by the offload's deadline. The offload used to wait for it on the CPU, which then launched
// nothing: on an H100 (llama-1b autocast at 1/4, 194 writebacks a step) the CPU waited 144 ms a
// step for writes, the replay of its plan puts 96 of those copies past their offload's start, and
// the step ran 445 ms against 363 predicted (docs/benchmarks.md, "Offloads that wait for their
// writeback"). Instead the offload takes the copy over as its write: the tensor gives up its bytes
// to the engine (Memory::detach, then end_view, so that they outlive the copy whatever happens to
// the tensor) and is offloading, with the copy as its pending write. From there it is an offload
// like any other: complete when the write has ended, waited for at its deadline (in stream order
// on a GPU), and if the write fails the bytes go back to the tensor and the fault is reported as an
// offload's. Counted in writebacks_taken_over and offloads; the bytes only in writeback_bytes.
bool Engine::writeback(LogicalId id, uint32_t tier) {
  std::lock_guard lock(mutex_);
  Entry* e = find(id);
  return e && writeback_locked(*e, tier);
}

bool Engine::writeback_locked(Entry& e, uint32_t tier) {
  TERAIO_CHECK(tier < tiers_.size(), "writeback of tensor {}: tier {} does not exist", e.id, tier);
  // A writeback's copy is only worth its write as a clean copy (EngineOptions::clean_offloads).
  if (!options_.clean_offloads || e.loc != Location::kResident || !e.memory->alive() || e.permanent || e.pins > 0)
    return false;
  if (e.writing_back) settle_writeback_locked(e, /*wait=*/true);
  if (!settle_read_after_locked(e, /*wait=*/true)) return false;
  if (e.clean && e.has_extent && e.tier == tier) return true;  // the tier holds these bytes
  const std::optional<storage::BufferView> bytes = e.memory->view();
  if (!bytes) return false;
  const std::optional<storage::Extent> ext = fresh_extent_locked(e, tier);
  if (!ext) {
    e.memory->end_view();  // no copy: the lent bytes go back at once
    return false;
  }
  storage::IoRequest req;
  req.direction = storage::Direction::kWrite;
  req.buffer = *bytes;
  req.offset_bytes = ext->offset_bytes;
  req.priority = storage::Priority::kNormal;
  req.ready_stream = e.memory->stream();
  try {
    e.pending = submit_locked(tier, req);
  } catch (...) {
    extents_[tier]->free(*ext);
    e.memory->end_view();
    throw;
  }
  e.tier = tier;
  e.extent = *ext;
  e.has_extent = true;
  e.writing_back = true;
  e.writeback_stale = false;
  stats_.writebacks++;
  stats_.writeback_bytes += e.bytes;
  return true;
}

bool Engine::settle_writeback_alive_locked(Entry& e) {
  if (!e.writing_back) return true;
  settle_writeback_locked(e, /*wait=*/true);
  // end_view() may have let the last reference to the bytes go (the tensor died during the copy):
  // nothing to free or move then; the entry is forgotten by the next sweep.
  return e.memory->alive();
}

void Engine::settle_writeback_locked(Entry& e, bool wait) {
  if (!e.writing_back || (!wait && !e.pending.ready())) return;
  const storage::IoResult r = wait_locked(e.pending, Wait::kWriteback, e.tier);
  e.writing_back = false;
  e.memory->end_view();  // the copy no longer reads the lent bytes
  if (r.ok && !e.writeback_stale && e.loc == Location::kResident) {
    // Clean, as after a read-back: `pending` (the finished write here) stays with the copy.
    e.clean = true;
    stats_.tiers[e.tier].bytes_written += e.bytes;
  } else {
    if (r.ok) {
      stats_.stale_writebacks++;
    } else {
      // A fault like an offload's failed write (Note [Faults in the engine]): reported with the
      // tensor's name and the tier's message (path, offset); nothing is lost, the tensor is still
      // resident and its offload writes it again.
      event("failed-writeback", e);
      fault_locked(e, r,
                   fmt::format("writeback of {} to tier '{}' failed (nothing was lost: its bytes stay on "
                               "the device, and its offload writes them again)",
                               name_locked(e), tiers_[e.tier].name),
                   /*lost=*/false);
    }
    e.pending = {};
    extents_[e.tier]->free(e.extent);
    e.has_extent = false;
  }
  e.writeback_stale = false;
}

// Space on `tier` for a new write of e (an offload or a writeback), which makes e no longer clean:
// the space of its previous read or copy is freed once that has ended (Note [Where the CPU waits]:
// not waited for here, the CPU may be far ahead of it), then a fresh extent, reclaiming deferred
// ones if the tier is full. nullopt when the tier has no room.
std::optional<storage::Extent> Engine::fresh_extent_locked(Entry& e, uint32_t tier) {
  e.clean = false;
  if (e.has_extent) {
    if (e.pending.ready()) {
      release_read_extent_locked(e);
    } else {
      deferred_.push_back({e.pending, e.tier, e.extent});
      e.pending = {};
      e.has_extent = false;
    }
  }
  release_deferred_locked(tier, /*wait=*/false);
  std::optional<storage::Extent> ext = extents_[tier]->try_allocate(e.bytes);
  if (!ext && reclaim_extents_locked(tier)) ext = extents_[tier]->try_allocate(e.bytes);
  return ext;
}

// Note [Reads after their write] in the engine: a tensor read back while its stream-ordered write
// still ran (prefetch_locked) holds that write in `read_after` until its result is known. Its use
// does not wait for it: on a GPU the use's kernels wait for the read, which waits for the write, on
// the device (on the H100 the CPU waited 5-28 ms a step of llama-1b in autocast when the use waited
// for it, docs/benchmarks.md). It is checked once ended (poll, the read's completion), and waited
// for (wait) before anything relies on the tensor's bytes on the device or in the tier: an offload
// or a writeback (a clean offload would keep the tier's copy), bringing everything back. A write
// that failed left nothing to read: the tensor is lost (false), reported with its name. On the host
// tier a write freed in stream order fails only with the device (a CUDA error).
bool Engine::settle_read_after_locked(Entry& e, bool wait) {
  if (!e.read_after.valid() || (!wait && !e.read_after.ready())) return true;
  const storage::IoResult w = wait_locked(e.read_after, Wait::kWriteReadBack, e.tier);
  e.read_after = {};
  if (w.ok) return true;
  lose_to_failed_write_locked(e, w);
  return false;
}

// A stream-ordered write that failed after the tensor's device memory was released: the tensor's
// contents are lost (fault_locked), also the bytes a read back since brought (dropped here).
void Engine::lose_to_failed_write_locked(Entry& e, const storage::IoResult& w) {
  if (e.loc == Location::kPrefetching || e.loc == Location::kResident) {
    if (e.pending.valid()) wait_locked(e.pending, Wait::kRead, e.tier);  // no copy into it still runs
    e.pending = {};
    e.memory->drop();
    e.loc = Location::kOffloaded;
    e.clean = false;
    stats_.resident_bytes -= e.bytes;
  }
  fault_locked(e, w,
               fmt::format("offload of {} to tier '{}' failed after its device memory was released",
                           name_locked(e), tiers_[e.tier].name),
               /*lost=*/true);
}

// An offload whose memory was freed in stream order, its write ended: a write that failed after its
// memory went has lost the tensor's contents, an error, never a silent read of stale bytes. (A read
// back while the write still runs is ordered after it by the tier instead: prefetch_locked.)
bool Engine::finish_write_locked(Entry& e) {
  if (!e.write_in_flight) return true;
  const storage::IoResult r = take_pending_locked(e, Wait::kWriteReadBack);
  e.write_in_flight = false;
  if (r.ok) return true;
  lose_to_failed_write_locked(e, r);
  return false;
}

// A resident tensor keeps the tier space it was read from until the read is known to be complete;
// this waits for that read and gives the space back.
void Engine::release_read_extent_locked(Entry& e) {
  settle_writeback_locked(e, /*wait=*/true);  // a writeback's copy goes with its space (ended now)
  if (!e.has_extent) return;                  // it failed: its space is free already
  wait_locked(e.pending, Wait::kRead, e.tier);
  e.pending = {};
  extents_[e.tier]->free(e.extent);
  e.has_extent = false;
}

// Frees the read extents left behind by tensors offloaded again before their read was known to
// have ended: those whose read has ended, or (wait) all of them, waiting. True when any was freed.
bool Engine::release_deferred_locked(uint32_t tier, bool wait) {
  bool freed = false;
  for (size_t i = 0; i < deferred_.size();) {
    Deferred& d = deferred_[i];
    if (d.tier == tier && (wait || d.read.ready())) {
      wait_locked(d.read, Wait::kRead, d.tier);
      extents_[d.tier]->free(d.extent);
      deferred_[i] = std::move(deferred_.back());
      deferred_.pop_back();
      freed = true;
    } else {
      ++i;
    }
  }
  return freed;
}

// Tier space is released lazily: a prefetched tensor keeps its extent until the read is known to
// be complete, a dead tensor until it is swept. When `tier` is full, release all of that now.
bool Engine::reclaim_extents_locked(uint32_t tier) {
  bool freed = release_deferred_locked(tier, /*wait=*/true);
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound || !p->has_extent || p->tier != tier) continue;
    Entry& e = *p;
    if (e.loc == Location::kResident) {
      release_read_extent_locked(e);  // a clean copy too: the tier needs the room
      e.clean = false;
      freed = true;
    } else if (e.pins == 0 && !e.memory->alive()) {
      forget_locked(e);
      freed = true;
    }
  }
  return freed;
}

bool Engine::prefetch_locked(Entry& e, bool urgent, Room room, std::span<const LogicalId> spare,
                             uint64_t also_free) {
  if (e.loc != Location::kOffloaded)
    return e.loc != Location::kUnbound && e.loc != Location::kLost && e.loc != Location::kDropped;
  if (!e.memory->alive()) {  // died out there (a gradient freed by zero_grad): nothing to read
    forget_locked(e);
    return false;
  }
  // A write freed in stream order that has ended is checked now; one still running is not waited
  // for: the read is ordered after it in the tier (Note [Reads after their write]).
  if (e.write_in_flight && e.pending.ready() && !finish_write_locked(e)) return false;
  if (!e.write_in_flight && e.pending.valid()) {
    // the read before a clean offload (Note [Clean offloads]): long done
    wait_locked(e.pending, Wait::kRead, e.tier);
    e.pending = {};
  }
  // The memory is taken now: room first, so that the budget holds. When none can be made, a read
  // that can wait is not issued (the first use fetches it), one needed now goes ahead
  // (enforce_budget reports the shortfall).
  if (room != Room::kNone && !make_room_locked(e.bytes + also_free, spare) && room == Room::kTry)
    return false;
  storage::IoRequest req;
  req.direction = storage::Direction::kRead;
  req.buffer = e.memory->allocate();
  req.offset_bytes = e.extent.offset_bytes;
  req.ready_stream = e.memory->stream();  // the new block may still be read by queued kernels
  req.priority = urgent ? storage::Priority::kUrgent : storage::Priority::kNormal;
  if (e.write_in_flight) req.after = e.pending;
  try {
    storage::Completion read = submit_locked(e.tier, req);
    if (e.write_in_flight) {
      e.read_after = std::move(e.pending);
      e.write_in_flight = false;
      stats_.reads_after_writes++;
    }
    e.pending = std::move(read);
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
  for (uint32_t t = 0; t < tiers_.size(); ++t) release_deferred_locked(t, /*wait=*/false);
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound) continue;
    Entry& e = *p;
    if (e.loc == Location::kOffloading && e.pending.ready()) complete_offload_locked(e, false);
    // A read that finished with nobody waiting (its step ended early): the tensor is resident and
    // may be evicted again, instead of counting as arriving.
    if (e.loc == Location::kPrefetching && e.pending.ready() && e.pins == 0 && e.memory->alive())
      complete_prefetch_locked(e);
    // a finished write is settled here (one that failed loses the tensor: reported now)
    if (e.write_in_flight && e.pending.ready()) finish_write_locked(e);
    if (e.read_after.valid() && e.read_after.ready()) settle_read_after_locked(e, /*wait=*/false);
    if (e.writing_back && e.pending.ready()) settle_writeback_locked(e, /*wait=*/false);
    if (e.loc == Location::kResident && e.has_extent && !e.clean && !e.writing_back && e.pending.ready())
      release_read_extent_locked(e);
    if (!e.memory->alive() && e.pins == 0) forget_locked(e);
  }
}

void Engine::begin_use(std::span<const LogicalId> ids) {
  std::lock_guard lock(mutex_);
  for (LogicalId id : ids) {
    Entry* e = find(id);
    if (!e || e->loc == Location::kUnbound) continue;
    // A use may write: on the CPU it waits for a writeback copy still reading the bytes (Note
    // [Writebacks in the engine]), as a write during it would be a data race. On a GPU it does not
    // wait: a write during the copy is reported at the end of its operator and makes the copy stale
    // (note_written), which its offload then does not use.
    if (e->writing_back && e->memory->stream() == nullptr) settle_writeback_locked(*e, /*wait=*/true);
    make_usable_locked(*e, ids);  // a failure is a Fault; the pin is taken all the same
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

// Note [Clean offloads]: a tensor read back from a tier and not written in place since has the same
// bytes as its copy there, so the engine keeps that copy (its extent) while the tensor is resident,
// and an offload to the same tier writes nothing: the memory is freed at once (clean_offloads,
// clean_bytes). Parameters are the common case: read back for the forward, offloaded again after
// it unchanged, read back for the backward; only the optimizer writes them. The engine cannot see
// writes: the binding reports every one it cannot rule out (note_written; src/torch watches each
// operator's inputs through their version counters, which every in-place operator bumps, and
// counts an input without one as written), and a written tensor's copy is released. Kept copies
// take tier space while their tensors are resident; a full tier reclaims them first
// (reclaim_extents_locked), so they never make an offload fail.
void Engine::release_clean_copy_locked(Entry& e) {
  if (e.writing_back) e.writeback_stale = true;  // the copy in flight may miss the write
  if (!e.clean) return;
  e.clean = false;
  if (e.loc == Location::kResident && e.has_extent && e.pending.ready())
    release_read_extent_locked(e);
}

void Engine::note_written(std::span<const LogicalId> ids) {
  std::lock_guard lock(mutex_);
  for (LogicalId id : ids)
    if (Entry* e = find(id)) release_clean_copy_locked(*e);
}

void Engine::discard_clean_copies() {
  std::lock_guard lock(mutex_);
  for (auto& p : entries_)
    if (p) release_clean_copy_locked(*p);
}

void Engine::touch(std::span<const LogicalId> ids) {
  std::lock_guard lock(mutex_);
  for (LogicalId id : ids)
    if (Entry* e = find(id)) e->last_use = ++clock_;
  sweep_dead_locked(kSweepPerCall);
}

// A transfer handed to its tier, its host time counted (EngineStats::submit_us).
storage::Completion Engine::submit_locked(size_t tier, const storage::IoRequest& req) {
  AddElapsedUs timed(stats_.submit_us);
  return tiers_[tier].tier->submit(req);
}

// Forgets up to `max_entries` dead tensors (all when 0), resuming where the last sweep stopped, so
// that freed tensors stop counting as resident soon after they die at O(1) cost per operator.
// Note [Sweeps where they matter]: a full sweep asks every bound tensor's storage whether it
// still lives (a weak reference locked and released each), so one per operator that reads costs
// O(tracked tensors): on llama-1b (2,600 tracked tensors, 930 reads a step) that was a large part
// of the host time the callbacks take in planned steps (docs/benchmarks.md, "Host time in planned
// steps"). A dead tensor counted as resident only overstates the resident bytes, so the full
// sweeps run where that could matter: before memory is taken past the target (make_room_locked,
// and before_operator's reads when they would cross it) and when the device's untracked bytes are
// measured (forget_dead). Elsewhere touch() sweeps a few entries per call.
void Engine::sweep_dead_locked(size_t max_entries) {
  const size_t n = entries_.size();
  if (n == 0) return;
  const size_t count = max_entries == 0 ? n : std::min(max_entries, n);
  if (count == n) stats_.full_sweeps++;
  for (size_t i = 0; i < count; ++i) {
    sweep_cursor_ = (sweep_cursor_ + 1) % n;
    Entry* e = entries_[sweep_cursor_].get();
    if (e && e->loc != Location::kUnbound && e->pins == 0 && !e->memory->alive()) forget_locked(*e);
  }
}

void Engine::set_reserve(uint64_t reserve_bytes) {
  std::lock_guard lock(mutex_);
  budget_.untracked_bytes = reserve_bytes;
}

BudgetPolicy Engine::budget_policy() const {
  std::lock_guard lock(mutex_);
  return budget_;
}

bool Engine::enforce_budget(uint64_t extra_bytes) {
  std::lock_guard lock(mutex_);
  shortfall_.clear();
  if (!budget_.limited()) return true;
  return make_room_locked(extra_bytes, {});
}

// Brings resident bytes to budget - reserve - `bytes` (room for `bytes` more): forgets the dead,
// completes offloads in flight, then evicts unpinned tensors least recently used first (never one of
// `spare`), and waits until their memory is freed. On failure shortfall_ says why.
bool Engine::make_room_locked(uint64_t bytes, std::span<const LogicalId> spare) {
  if (!budget_.limited()) return true;
  const uint64_t target = budget_.resident_target_bytes(bytes);
  if (stats_.resident_bytes <= target) return true;
  sweep_dead_locked(0);  // tensors that died still count until forgotten
  if (stats_.resident_bytes <= target) return true;
  // Offloads already in flight free their memory first: those done, then the oldest (on a link
  // that writes in order, the first to end), only as many as the target needs (Note [Where the CPU
  // waits]). Reads that finished while nobody waited for them become resident tensors that may
  // leave again.
  struct Guard {
    bool& flag;
    explicit Guard(bool& f) : flag(f) { flag = true; }
    ~Guard() { flag = false; }
  } guard(making_room_);
  std::vector<Entry*> writing;
  for (auto& p : entries_) {
    if (!p) continue;
    if (p->loc == Location::kOffloading) {
      complete_offload_locked(*p, /*wait=*/false);
      if (p->loc == Location::kOffloading) writing.push_back(p.get());
    } else if (p->loc == Location::kPrefetching && p->pins == 0 && p->pending.ready() &&
               p->memory->alive()) {
      complete_prefetch_locked(*p);
    }
  }
  std::sort(writing.begin(), writing.end(),
            [](const Entry* a, const Entry* b) { return a->write_seq < b->write_seq; });
  for (Entry* e : writing) {
    if (stats_.resident_bytes <= target) return true;
    complete_offload_locked(*e, /*wait=*/true);
  }
  if (stats_.resident_bytes <= target) return true;
  auto spared = [&](LogicalId id) { return std::find(spare.begin(), spare.end(), id) != spare.end(); };
  std::vector<Entry*> victims;
  uint64_t busy = 0;  // resident bytes no eviction may take: in use, pinned, spared, arriving
  for (auto& p : entries_) {
    if (!p || !counts_as_resident(p->loc)) continue;
    if (p->loc == Location::kResident && p->pins == 0 && !p->permanent && !spared(p->id) &&
        p->memory->alive())
      victims.push_back(p.get());
    else
      busy += p->bytes;
  }
  std::sort(victims.begin(), victims.end(),
            [](const Entry* a, const Entry* b) { return a->last_use < b->last_use; });
  uint64_t outgoing = 0, homeless = 0;
  std::vector<Entry*> started;
  for (Entry* e : victims) {
    if (stats_.resident_bytes - outgoing <= target) break;
    bool placed = false;
    for (uint32_t t = 0; t < tiers_.size() && !placed; ++t) {
      if (offload_locked(*e, t, /*urgent=*/true)) {
        placed = true;
        if (e->loc == Location::kOffloading) outgoing += e->bytes;  // a clean one is gone already
        started.push_back(e);
        stats_.evictions++;
        event("eviction", *e);
      }
    }
    if (!placed) homeless += e->bytes;
  }
  for (Entry* e : started) complete_offload_locked(*e, /*wait=*/true);
  if (stats_.resident_bytes <= target) return true;
  std::string tiers;
  for (size_t t = 0; t < tiers_.size(); ++t)
    tiers += fmt::format("{}{} {} of {} free", t ? ", " : "", tiers_[t].name,
                         format_bytes(double(extents_[t]->free_bytes())),
                         format_bytes(double(tiers_[t].capacity_bytes)));
  shortfall_ = fmt::format(
      "{} resident for a target of {} (budget {} less {} reserved{}): {} are in use by running "
      "operators, pinned or arriving{}; tiers: {}",
      format_bytes(double(stats_.resident_bytes)), format_bytes(double(target)),
      format_bytes(double(budget_.budget_bytes)), format_bytes(double(budget_.untracked_bytes)),
      bytes ? fmt::format(" and {} needed next", format_bytes(double(bytes))) : "",
      format_bytes(double(busy)),
      homeless ? fmt::format(", and {} could not be offloaded because no tier has room left "
                             "(give the tiers more capacity)",
                             format_bytes(double(homeless)))
               : "",
      tiers);
  return false;
}

std::string Engine::budget_shortfall() const {
  std::lock_guard lock(mutex_);
  return shortfall_;
}

std::vector<Fault> Engine::take_faults() {
  std::lock_guard lock(mutex_);
  std::vector<Fault> out;
  out.swap(faults_);
  return out;
}

void Engine::set_namer(std::function<std::string(LogicalId)> namer) {
  std::lock_guard lock(mutex_);
  namer_ = std::move(namer);
}

void Engine::fetch_all() {
  std::lock_guard lock(mutex_);
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound || !p->memory->alive()) continue;
    if (p->loc == Location::kOffloaded) prefetch_locked(*p, /*urgent=*/true);
  }
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound || !p->memory->alive()) continue;
    // A discarded tensor kept alive past its profiled death (a variable the loop holds) is no
    // model or optimizer state (those persist): it stays without bytes, and any access to it
    // still raises its message, but bringing everything back does not fail on it.
    if (p->loc == Location::kLost && p->discarded) continue;
    make_usable_locked(*p);  // failures are Faults; the others still come back
    settle_read_after_locked(*p, /*wait=*/true);
  }
  note_resident_locked();
}

size_t Engine::abandon(const std::string& why) {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (auto& p : entries_) {
    if (!p || p->loc == Location::kUnbound || p->loc == Location::kLost) continue;
    Entry& e = *p;
    if (e.pending.valid()) e.pending.wait();  // nothing may still write into the memory
    if (e.loc == Location::kPrefetching) complete_prefetch_locked(e);
    if (e.loc != Location::kOffloaded && e.loc != Location::kOffloading) continue;
    if (!e.memory->alive()) continue;
    if (e.loc == Location::kOffloading) {  // finished (waited above): take it as done or undone
      complete_offload_locked(e, /*wait=*/true);
      if (e.loc != Location::kOffloaded) continue;
    }
    e.lost_message = fmt::format("teraio: {} {}", name_locked(e), why);
    e.memory->lose(e.lost_message);
    e.loc = Location::kLost;
    stats_.lost_tensors++;
    n++;
  }
  return n;
}

size_t Engine::align(std::span<const Move> out, std::span<const LogicalId> in, uint64_t also_free) {
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
    // Room is not made by evicting what the plan also starts with (a read of the list that has
    // landed would otherwise be the first victim).
    if (prefetch_locked(*e, /*urgent=*/true, Room::kTry, in, also_free)) moved++;
  }
  stats_.aligned += moved;
  note_resident_locked();
  return moved;
}

size_t Engine::align() {
  std::shared_ptr<const Schedule> s;
  {
    std::lock_guard lock(mutex_);
    s = schedule_;
  }
  // Note [Room for the first operator]: the first planned step starts where the profiling steps
  // left the tensors, which the plan does not know (the last profiled step's gradients, alive
  // until zero_grad); reads that filled the budget there took the first operator's new tensors
  // (the batch, seen at its first use) past it. The plan has room for them at its start.
  const uint64_t first = s->operators.empty() ? 0 : s->operators.front().created_bytes;
  return align(s->start_out, s->start_in, first);
}

void Schedule::add_move(const Move& m) {
  const size_t n = operators.size();
  TERAIO_CHECK(m.start < n && m.deadline < n,
               "plan move of tensor {} names kernel {} but the iteration has {}", m.tensor,
               std::max(m.start, m.deadline), n);
  switch (m.op) {
    case MoveOp::offload:
      operators[m.start].offload_at.push_back(m);
      operators[m.deadline].offload_due.push_back(m.tensor);
      break;
    case MoveOp::prefetch:
      operators[m.start].prefetch_at.push_back(m);
      break;
    case MoveOp::recompute:
      TERAIO_CHECK(m.start + 1 < m.deadline,
                   "plan move of tensor {}: a recompute made again before kernel {} cannot free it "
                   "after kernel {} (it must end at least two kernels after it starts, no wrap)",
                   m.tensor, m.deadline, m.start);
      operators[m.start].drop_after.push_back(m.tensor);
      operators[m.deadline].recompute_before.push_back({m.tensor, true});
      break;
    case MoveOp::writeback:  // Note [Writebacks in the engine]
      operators[m.start].writeback_at.push_back(m);
      break;
  }
  moves++;
}

void Schedule::add_discard(LogicalId id, KernelIndex after) {
  TERAIO_CHECK(after < operators.size(), "plan discard of tensor {} names kernel {} but the iteration has {}", id,
               after, operators.size());
  operators[after].discard_after.push_back(id);
  moves++;
}

Schedule Schedule::from_plan(const Plan& plan, size_t num_operators) {
  Schedule s;
  s.operators.resize(num_operators);
  for (const Move& m : plan.moves) s.add_move(m);
  s.mark_last_recomputes();
  return s;
}

void Schedule::mark_last_recomputes() {
  std::unordered_map<LogicalId, Remake*> last;
  for (Operator& op : operators)
    for (Remake& r : op.recompute_before) {
      auto [it, fresh] = last.try_emplace(r.id, &r);
      if (!fresh) {
        it->second->last = false;
        it->second = &r;
      }
      r.last = true;
    }
}

void Engine::set_schedule(std::shared_ptr<const Schedule> schedule) {
  if (!schedule) schedule = std::make_shared<const Schedule>();
  auto check = [&](const Move& m) {
    TERAIO_CHECK(m.tier < tiers_.size(),
                 "plan move of tensor {} names tier {} but the engine has {}", m.tensor, m.tier,
                 tiers_.size());
  };
  for (const Schedule::Operator& op : schedule->operators) {
    for (const Move& m : op.prefetch_at) check(m);
    for (const Move& m : op.offload_at) check(m);
    for (const Move& m : op.writeback_at) check(m);
  }
  for (const Move& m : schedule->start_out) check(m);
  std::lock_guard lock(mutex_);
  schedule_ = std::move(schedule);
}

void Engine::set_plan(const Plan& plan, size_t num_kernels) {
  if (plan.moves.empty()) {
    set_schedule(nullptr);
    return;
  }
  set_schedule(std::make_shared<const Schedule>(Schedule::from_plan(plan, num_kernels)));
}

bool Engine::has_plan() const {
  std::lock_guard lock(mutex_);
  return schedule_->moves > 0;
}

void Engine::before_operator(uint32_t k, std::span<const LogicalId> in_use) {
  std::lock_guard lock(mutex_);
  if (k >= schedule_->operators.size()) return;
  const Schedule::Operator& op = schedule_->operators[k];
  for (LogicalId id : op.deaths) {
    Entry* e = find(id);
    if (e && e->loc != Location::kUnbound && e->pins == 0 && !e->memory->alive()) forget_locked(*e);
  }
  // Tensors that died since the last sweep still count as resident; forget them before taking
  // memory, so that the resident bytes (and their peak) are the live ones, where the reads could
  // take the resident bytes past the budget's target (Note [Sweeps where they matter]).
  if (!op.prefetch_at.empty() && budget_.limited()) {
    uint64_t incoming = 0;
    for (const Move& m : op.prefetch_at)
      if (const Entry* e = find(m.tensor); e && e->loc == Location::kOffloaded)
        incoming += e->memory->bytes();
    if (stats_.resident_bytes + incoming > budget_.resident_target_bytes()) sweep_dead_locked(0);
  }
  for (const Move& m : op.prefetch_at) {
    Entry* e = find(m.tensor);
    if (!e || e->loc == Location::kUnbound) continue;  // died (swept): nothing to bring back
    if (e->loc == Location::kOffloaded && !e->memory->alive()) {
      forget_locked(*e);  // freed while out (a gradient at zero_grad): the plan expected that
      continue;
    }
    const bool was_out = e->loc == Location::kOffloaded;
    if (was_out && prefetch_locked(*e, false, Room::kTry, in_use)) {
      stats_.plan_moves++;
    } else {
      stats_.skipped_moves++;
      event(fmt::format("skipped-prefetch({})",
                        was_out && e->loc == Location::kOffloaded ? "no room" : to_string(e->loc)),
            *e);
    }
  }
  // Recomputes run after the reads started here (their inputs may be among them) and in producer
  // order (a chain reads what the one before it made).
  for (const Schedule::Remake& r : op.recompute_before) {
    Entry* e = find(r.id);
    if (!e || e->loc == Location::kUnbound) continue;  // died: nothing needs it
    if (e->loc == Location::kDropped) {
      if (!e->memory->alive()) {
        forget_locked(*e);
        continue;
      }
      if (recompute_locked(*e, /*urgent=*/false, in_use)) stats_.plan_moves++;
    }
    if (r.last && e->loc != Location::kDropped) e->recipe.reset();  // its inputs may go now
  }
  note_resident_locked();
}

void Engine::after_operator(uint32_t k) {
  std::lock_guard lock(mutex_);
  if (k >= schedule_->operators.size()) return;
  const Schedule::Operator& op = schedule_->operators[k];
  for (const Move& m : op.offload_at) {
    Entry* e = find(m.tensor);
    if (!e || e->loc == Location::kUnbound) continue;  // died before its offload: nothing to do
    if (!e->memory->alive() && e->pins == 0) {  // died, not yet swept: its memory is free already
      forget_locked(*e);
      continue;
    }
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
  for (LogicalId id : op.offload_due)
    if (Entry* e = find(id)) complete_offload_locked(*e, /*wait=*/true);
  for (const Move& m : op.writeback_at) {  // Note [Writebacks in the engine]
    Entry* e = find(m.tensor);
    if (!e || e->loc == Location::kUnbound) continue;
    if (writeback_locked(*e, m.tier)) {
      stats_.plan_moves++;
    } else {
      stats_.skipped_moves++;
      event(fmt::format("skipped-writeback({})", to_string(e->loc)), *e);
    }
  }
  free_after_locked(op.drop_after, &Engine::drop_locked, "skipped-drop");
  free_after_locked(op.discard_after, &Engine::discard_locked, "skipped-discard");
}

// The planned frees after an operator (recompute drops, discards): a tensor that died before its
// free is forgotten; one that cannot be freed now is a skipped move, logged with why.
void Engine::free_after_locked(std::span<const LogicalId> ids, bool (Engine::*free)(Entry&, std::string*),
                               std::string_view skipped) {
  for (LogicalId id : ids) {
    Entry* e = find(id);
    if (!e || e->loc == Location::kUnbound) continue;  // died before it: nothing to free
    if (!e->memory->alive() && e->pins == 0) {
      forget_locked(*e);
      continue;
    }
    std::string why;
    if ((this->*free)(*e, &why)) {
      stats_.plan_moves++;
    } else {
      stats_.skipped_moves++;
      event(fmt::format("{}({})", skipped, why), *e);
    }
  }
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  EngineStats s = stats_;
  for (size_t i = 0; i < s.tiers.size() && i < tiers_.size(); ++i)
    if (tiers_[i].tier != nullptr) s.tiers[i].transfer = tiers_[i].tier->transfer_times();
  return s;
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
