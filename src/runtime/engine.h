// The migration engine: a location table from logical tensor id to where its bytes are (resident,
// on their way out, in a tier, on their way back), the moves of a plan indexed by operator, urgent
// fetches for inputs that are not resident, budget-driven eviction (reactive mode) and statistics.
// It knows nothing of PyTorch: a tensor's memory is reached through the Memory interface, so the
// same engine runs over PyTorch storages (src/torch) and over plain buffers (tests/runtime).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "budget.h"
#include "teraio/plan.h"
#include "teraio/storage.h"

namespace teraio::runtime {

using LogicalId = uint32_t;

// One tensor's memory as the binding layer owns it. The engine calls these under its own lock,
// never concurrently for one Memory.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual uint64_t bytes() const = 0;
  // Takes the bytes out of the tensor: from now on the tensor has no memory (a use would fail
  // loudly) and the Memory holds them. Returns a view of the held bytes for the write.
  virtual storage::BufferView detach() = 0;
  // Puts the held bytes back into the tensor (the bytes are the tensor's again).
  virtual void attach() = 0;
  // Frees the held bytes (after they were written to a tier).
  virtual void drop() = 0;
  // Allocates bytes to hold the tensor's contents, not yet visible to the tensor; attach() installs
  // them.
  virtual storage::BufferView allocate() = 0;
  // False once the tensor is gone (its memory no longer needs to come back).
  virtual bool alive() const = 0;
  // The tensor's bytes, lent for a writeback (Note [Writebacks in the engine]) while the tensor
  // keeps them: a copy to a tier that leaves the tensor usable. nullopt (the default): this binding
  // cannot lend them, and the engine skips writebacks of its tensors.
  virtual std::optional<storage::BufferView> view() { return std::nullopt; }
  // The copy of the bytes view() lent has ended (completed, failed, or waited for), or detach()
  // has just taken the lent bytes over for an offload that makes the running copy its write (Note
  // [An offload takes over its writeback's copy]; detach() then keeps them until drop() or
  // attach()): the binding may let its hold on them go. The engine calls it exactly once per view()
  // that returned bytes, before anything else it does with the Memory but that detach(); a binding
  // keeps the bytes alive until then even if the tensor dies meanwhile (the copy still reads them).
  virtual void end_view() {}
  // The stream on which the tensor's producers/consumers run (a cudaStream_t), nullptr on CPU.
  virtual storage::CudaStream stream() const { return nullptr; }
  // The tensor's bytes are gone for good (Note [Lost bytes]; the tensor has no memory now): from
  // here on every access to it must fail with `why`, never read garbage or crash.
  virtual void lose(const std::string& why) { (void)why; }
  // The tensor's bytes could not be brought back for now (it has no memory): until the next
  // attach(), every access to it must fail with `why`. False when the binding cannot undo that
  // later; the engine then treats the tensor as lost.
  virtual bool refuse(const std::string& why) {
    (void)why;
    return true;
  }
};

// Note [Recompute in the engine]: a tensor the plan recomputes is *dropped* once operator `start`
// has run (its bytes are freed, nothing is written anywhere: Location::kDropped) and made again
// before operator `deadline` by its Recipe: the binding's capture of the operator that produced it
// (src/torch: the dispatcher operator, its arguments and the dispatch state; tests: a pattern).
// The engine makes the recipe's inputs usable and keeps them pinned while it runs (an input that is
// itself dropped is recomputed first: chains), makes room for the tensor within the budget, and
// asks the recipe whether its result would still be the tensor's bytes (stale(): an input or the
// tensor written in place since the capture). A tensor is dropped only when that holds and it has a
// recipe; else the move is skipped (the tensor stays resident). A recompute that cannot run, or
// whose recipe has become stale while the tensor was dropped, loses the tensor (Note [Lost bytes]):
// its bytes are gone and are never replaced by different ones. A use of a dropped tensor before its
// planned recompute (drift, a reactive step) recomputes it at once (urgent_recomputes).
class Recipe {
 public:
  virtual ~Recipe() = default;
  // The tracked tensors the producer reads.
  virtual std::span<const LogicalId> inputs() const = 0;
  // "" while rerunning the producer gives the tensor's bytes; else why it would not.
  virtual std::string stale() const = 0;
  // Runs the producer again and installs the bytes it made into `memory`'s tensor (the tensor is
  // then resident, as after Memory::attach). "" on success, else what went wrong (nothing
  // installed).
  virtual std::string run(Memory& memory) = 0;
};

// Note [Dead tensors]: a transient tensor whose last use in the profiled iteration has passed, and
// which the profile saw freed later in the iteration (a gradient after the optimizer read it, until
// zero_grad), holds memory nothing reads. When the plan takes such a tensor away (a tail: an offload
// no prefetch follows), writing it out would move bytes nobody reads back, so the engine *discards*
// it instead: frees its memory without writing it anywhere (Schedule::Operator::discard_after;
// stats discards, discarded_bytes). The tensor then has no bytes for good: it becomes kLost with a
// message that says so (Memory::lose: every access raises it, through the dispatcher or not), so a
// step that uses it after all (a run off the profile: grads logged after the optimizer every N
// steps) fails loudly and never reads garbage. A tensor that is pinned, in use, pinned permanently,
// or not resident is left alone (skipped_moves).
//
// kLost: the tensor's bytes could not be brought back and never will (Note [Lost bytes]); it stays
// unusable, and every use reports the fault again, until it dies. kDropped: freed, to be made again
// by its Recipe (Note [Recompute in the engine]).
enum class Location : uint8_t {
  kUnbound,
  kResident,
  kOffloading,
  kOffloaded,
  kPrefetching,
  kLost,
  kDropped
};
std::string_view to_string(Location location);

struct EngineTier {
  std::string name;               // as named in the plan ("host", "file", ...)
  storage::Tier* tier = nullptr;  // not owned; outlives the engine
  uint64_t capacity_bytes = 0;    // bytes of the tier the engine may use
};

struct EngineOptions {
  uint64_t budget_bytes = 0;  // resident tracked bytes allowed (0: no limit)
  // When an offload must be complete (its deadline, the budget) and the tensor has a stream: the
  // stream waits on the GPU for the end of the device-to-host copy and the memory is freed at once,
  // in stream order, instead of the CPU waiting for the write (tiers that publish a write's event:
  // the host tier; others are waited for on the CPU as before). The write's result is checked
  // before the tensor is read back or forgotten.
  bool stream_ordered_offloads = false;
  // Note [Clean offloads]: a tensor read back from a tier keeps its copy there while it is not
  // written in place (note_written); offloading it again to that tier then writes nothing and only
  // frees its memory. Off: every offload writes.
  bool clean_offloads = true;
};

struct EngineStats {
  uint64_t peak_resident_bytes = 0;
  uint64_t step_peak_resident_bytes = 0;  // since reset_step_peak()
  uint64_t resident_bytes = 0;
  uint64_t pinned_bytes = 0;      // bytes of live tensors pinned permanently (pin_permanently)
  uint64_t bytes_offloaded = 0;   // written to tiers (completed)
  uint64_t bytes_prefetched = 0;  // read back (completed)
  uint64_t offloads = 0;
  uint64_t prefetches = 0;
  uint64_t urgent_fetches = 0;      // inputs that were neither resident nor arriving
  uint64_t evictions = 0;           // offloads chosen by the budget (reactive mode / safety net)
  uint64_t cancelled_offloads = 0;  // offloads undone because the tensor was used again
  uint64_t plan_moves = 0;          // planned moves issued
  uint64_t skipped_moves = 0;  // planned moves whose tensor was not bound or not in the right place
  uint64_t full_sweeps = 0;    // scans of every bound tensor for dead ones (Note [Sweeps where they matter])
  uint64_t spilled_moves = 0;     // planned offloads sent to another tier (the planned one was full)
  uint64_t stream_ordered = 0;    // offloads whose memory was freed in stream order (not CPU-waited)
  // reads back submitted while their stream-ordered write still ran, ordered after it by the tier
  // (Note [Reads after their write] in src/storage/host_tier.cpp) instead of the CPU waiting
  uint64_t reads_after_writes = 0;
  uint64_t clean_offloads = 0;    // offloads that wrote nothing: the tier's copy was still valid
  uint64_t clean_bytes = 0;       // their bytes (not in bytes_offloaded: they were not written)
  uint64_t writebacks = 0;        // writeback copies started (Note [Writebacks in the engine])
  uint64_t writeback_bytes = 0;   // their bytes
  uint64_t stale_writebacks = 0;  // copies discarded: written during the copy (a failed one is a fault)
  // offloads that took over their writeback's copy still running as their write (Note [An
  // offload takes over its writeback's copy]); counted in offloads, their bytes in writeback_bytes
  uint64_t writebacks_taken_over = 0;
  uint64_t aligned = 0;        // moves made to put tensors where the plan starts (align)
  uint64_t failed_transfers = 0;  // writes and reads that failed (each is also a Fault)
  uint64_t retried_reads = 0;     // reads tried again after a failure (Note [Read retries])
  uint64_t lost_tensors = 0;      // tensors whose bytes could not be brought back (kLost)
  uint64_t discards = 0;          // dead tensors freed without a write (Note [Dead tensors])
  uint64_t discarded_bytes = 0;   // their bytes
  uint64_t recomputes = 0;         // tensors made again by their recipe (planned and urgent)
  uint64_t urgent_recomputes = 0;  // of which before a use the plan did not expect
  double recompute_us = 0;         // host time spent running recipes (on CUDA: launching them)
  // Host time inside the tiers' submit(): on CUDA the calls that queue each copy and its events.
  double submit_us = 0;
  double stall_us = 0;  // time spent waiting for data (urgent fetches, late prefetches, evictions)
  // stall_us by what was waited for (Note [Where the CPU waits]): reads (a prefetch not yet
  // arrived, or not yet on a copy stream), writes due at their planned deadline (or before the
  // tensor is read back), and writes completed or started to make room within the budget.
  double stall_read_us = 0;
  double stall_write_us = 0;
  double stall_room_us = 0;
  // Parts of stall_write_us: writes due (an offload waited for at its deadline, on a GPU until
  // its copy is queued), writes a read back had to follow, writeback copies (an offload of another
  // tier, a drop or a discard, or on the CPU a use, waiting for one). The rest: tensors forgotten
  // or used again while their write ran.
  double stall_write_due_us = 0;
  double stall_write_readback_us = 0;
  double stall_writeback_us = 0;
  // Part of stall_read_us: reads an operator about to use the tensor waited for (on a GPU until the
  // copy is queued; a retried read until it is). The rest: a read's tier space wanted back (a full
  // tier, a clean copy dropped), or a tensor forgotten while its read ran.
  double stall_read_use_us = 0;
  // The same per tier (engine tier order): which tier's transfers were waited for, and the bytes
  // each moved (completed). A room wait counts as the writing tier's write wait. The per-tier stalls
  // add up to stall_us, the bytes to bytes_offloaded and bytes_prefetched.
  struct Tier {
    double stall_read_us = 0;
    double stall_write_us = 0;
    uint64_t bytes_written = 0;
    uint64_t bytes_read = 0;
    uint64_t bytes_clean = 0;  // offloaded without writing (Note [Clean offloads])
    // What the tier's copies took (storage::Tier::transfer_times, read by stats()).
    storage::TransferTimes transfer;
  };
  std::vector<Tier> tiers;
};

// A failed transfer (Note [Faults in the engine]).
struct Fault {
  LogicalId id = 0;
  bool lost = false;   // the tensor's bytes are gone (Location::kLost); else the move was undone
  bool read = false;   // a read failed (an operator may have run without the tensor)
  int error_code = 0;  // the tier's errno value
  std::string message;  // names the tensor, the tier and the tier's own message (path, offset)
};

// One iteration's schedule, by operator index: made once per plan and shared, so that installing a
// plan again (a plan cache hit) costs nothing. offload::compile_schedule makes one from a profiled
// trace and its plan (src/offload/schedule.h); from_plan from a bare plan. The engine runs the
// moves and deaths (before_operator, after_operator) and the start placement (align); the
// signatures and created bytes are read by the controller that installed it.
struct Schedule {
  struct Remake {  // a recompute due before an operator
    LogicalId id = 0;
    bool last = true;  // the tensor's last of the iteration: its recipe is released after it
  };
  struct Operator {
    std::vector<Move> prefetch_at;       // prefetches that start before operator k
    std::vector<Move> offload_at;        // offloads that start after operator k
    std::vector<LogicalId> offload_due;  // offloads that must be complete after operator k
    std::vector<Move> writeback_at;      // writebacks that start after operator k
    // Recompute moves (Note [Recompute in the engine]): tensors dropped after operator k, and made
    // again before it (in the order of their producers, so that a chain reads what was made just
    // before; `last`: the tensor's last recompute of the iteration, after which its recipe is
    // released). `capture`: outputs of operator k that a recompute makes again later: the binding
    // gives each a Recipe when k runs (Engine::set_recipe).
    std::vector<LogicalId> drop_after;
    std::vector<Remake> recompute_before;
    // Note [Dead tensors]: transient tensors past their last use that the plan takes away after
    // operator k until they die: their memory is freed without writing them anywhere (discarded).
    std::vector<LogicalId> discard_after;
    std::vector<LogicalId> capture;
    // Transient tensors that died just before operator k in the profile: forgotten there, so that
    // resident bytes are the live ones without sweeping every tensor.
    std::vector<LogicalId> deaths;
    // Bytes of the tensors operator k creates in the profile (transient ones, and persistent ones
    // made anew each iteration, such as gradients set to None): the budget is enforced at
    // its start with room for them, so that a run off the plan (a skipped move, an urgent fetch)
    // cannot take its outputs past the budget.
    uint64_t created_bytes = 0;
    uint64_t signature = 0;  // the profiled operator's name and input shapes (a hash)
  };
  std::vector<Operator> operators;  // one per operator of the iteration
  // Where persistent tensors are when an iteration starts (align()): offloaded, with the move whose
  // tier they are read back from, or resident.
  std::vector<Move> start_out;
  std::vector<LogicalId> start_in;
  size_t moves = 0;  // planned moves in `operators`

  // Adds `m` (naming a logical id) at its operators (a recompute: dropped after `start`, made again
  // before `deadline`, after the recomputes added there before it). Throws teraio::Error for a move
  // that names an operator past the iteration, or a recompute that does not end after it starts.
  void add_move(const Move& m);
  // Frees dead tensor `id` after operator `after` without writing it (Note [Dead tensors]). Throws
  // teraio::Error for an operator past the iteration.
  void add_discard(LogicalId id, KernelIndex after);
  // The moves of `plan` (whose moves name logical ids) over an iteration of `num_operators`
  // operators (no signatures, deaths or start placement).
  static Schedule from_plan(const Plan& plan, size_t num_operators);
  // Marks each tensor's last recompute of the iteration (Remake::last); after the moves are added.
  void mark_last_recomputes();
};

// Note [Faults in the engine]: a transfer that fails never throws out of the engine and never leaves
// a tensor half-moved. A failed write gives the bytes back (the tensor stays resident, over budget
// if need be). A failed read frees the memory it was reading into and leaves the tensor where it
// was (offloaded: the next use retries), unless the bytes are lost (storage::lost(): damaged,
// truncated, or a stream-ordered write that failed after its memory was released): then the tensor
// becomes kLost, its Memory is told (Memory::lose) so that every access fails with the message, and
// every later use reports the fault again. Each failure is recorded as a Fault; the binding takes
// them with take_faults() and reports them to the user.
//
// The location table plus the schedule. Thread-safe: every public method takes one mutex.
class Engine {
 public:
  Engine(EngineOptions options, std::vector<EngineTier> tiers);
  ~Engine();  // waits for transfers in flight; tensors keep whatever memory they hold
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  uint64_t budget_bytes() const { return options_.budget_bytes; }
  const std::vector<EngineTier>& tiers() const { return tiers_; }

  // --- location table -------------------------------------------------------------------------
  // Binds logical id `id` to a resident tensor. If the id was bound to another tensor, that one is
  // first made whole again (its bytes brought back if it is still alive) and forgotten.
  void bind(LogicalId id, std::unique_ptr<Memory> memory);
  // Brings the tensor back if needed and forgets it.
  void unbind(LogicalId id);
  bool bound(LogicalId id) const;
  Location location(LogicalId id) const;
  // Forgets tensors that died (freeing their tier space) and finishes completed transfers.
  void poll();
  // Forgets those of the listed tensors that died (a cheap, targeted poll); without a list, every
  // dead one (one pass over all tensors).
  void forget_dead(std::span<const LogicalId> ids);
  void forget_dead();

  // --- operators ------------------------------------------------------------------------------
  // Makes every listed tensor resident and usable by an operator about to run: waits for arriving
  // data (on the GPU when the tensor has a stream), fetches absent ones at once (urgent, after making
  // room for them within the budget, never by evicting one of `ids`) and undoes offloads in flight.
  // Pins them until end_use(). A tensor that cannot be made usable is recorded as a Fault.
  void begin_use(std::span<const LogicalId> ids);
  void end_use(std::span<const LogicalId> ids);
  // Makes the tensor resident (like begin_use) and keeps it there until it dies or its id is bound
  // to another tensor: it is never offloaded again (no eviction, planned offload, align or explicit
  // offload() moves it). For memory that something outside the engine may read or write at any
  // time, asynchronously: buffers handed to a collective (NCCL, gloo), whose transfer outlives the
  // operator that started it. Idempotent. Its bytes keep counting as resident (pinned_bytes).
  void pin_permanently(LogicalId id);
  bool pinned_permanently(LogicalId id) const;
  // Device memory the budget leaves to what the engine does not track (the binding measures it):
  // the policy's untracked_bytes. Every budget check aims at budget_policy().resident_target_bytes.
  void set_reserve(uint64_t reserve_bytes);
  BudgetPolicy budget_policy() const;
  // Offloads unpinned tensors, least recently used first, until resident bytes <= budget - reserve -
  // extra_bytes; waits until their memory is really freed. Returns false when it could not get
  // there; budget_shortfall() then says why.
  bool enforce_budget(uint64_t extra_bytes = 0);
  // Why the last enforce_budget() fell short ("" when it did not): how far over, how much is in use
  // by running operators or pinned, and whether the tiers are full.
  std::string budget_shortfall() const;
  // --- recompute (Note [Recompute in the engine]) ----------------------------------------------
  // Gives tensor `id` the recipe that makes it again (replacing any; null removes it). Ignored for
  // an id that is not bound.
  void set_recipe(LogicalId id, std::unique_ptr<Recipe> recipe);
  bool has_recipe(LogicalId id) const;
  // Releases the recipes of the tensors that are not dropped (a recipe holds its inputs: they must
  // not outlive the step because of it). A dropped tensor keeps its recipe until it is made again
  // or dies.
  void release_recipes();

  // The failed transfers since the last call (Note [Faults in the engine]).
  std::vector<Fault> take_faults();
  // Names a tensor in fault messages (called under the engine's lock; must not call back).
  void set_namer(std::function<std::string(LogicalId)> namer);
  // Marks the tensors as used now (for the least-recently-used order).
  void touch(std::span<const LogicalId> ids);
  // The tensors were (or may have been) written in place: a copy kept in a tier since they were
  // read back no longer holds their bytes (Note [Clean offloads]). The binding must call this for
  // every write it cannot rule out, before the tensor's next offload.
  void note_written(std::span<const LogicalId> ids);
  // note_written for every tensor: for stretches where the binding watches no writes.
  void discard_clean_copies();

  // Explicit moves (the plan's, or a user's). Both are no-ops when the tensor is already where it
  // is going (or on its way); false when it is not bound or has no room in the tier.
  bool offload(LogicalId id, uint32_t tier, bool urgent = false);
  // Copies resident tensor `id` to `tier` while it stays resident (Note [Writebacks in the engine]);
  // when the copy completes and nothing wrote the tensor meanwhile, the next offload to that tier
  // is clean. False when it cannot start (not resident and idle, pinned, no tier space, or the
  // binding cannot lend the bytes); true also when the tier already holds a valid copy.
  bool writeback(LogicalId id, uint32_t tier);
  bool prefetch(LogicalId id, bool urgent = false);
  // Waits until an offload in flight has completed and its memory is freed.
  void finish_offload(LogicalId id);
  // Brings every bound tensor back (checkpoints, end of training), whatever the budget. Tensors
  // that cannot come back are recorded as Faults; discarded ones (Note [Dead tensors]) are not:
  // they stay without bytes.
  void fetch_all();
  // For the end of the engine's tiers: every live tensor whose bytes are still only in a tier is
  // lost (Memory::lose with `why` and the tensor's name). Returns how many.
  size_t abandon(const std::string& why);

  // Puts persistent tensors where the plan expects them when an iteration starts: `out` (with the
  // tier each is read back from) offloaded, `in` resident. Reactive steps, evictions and drift
  // leave tensors elsewhere; without this a plan would start from the wrong place every iteration.
  // Offloads go first (their memory is freed before anything is read back). A read is started
  // only where it leaves `also_free` bytes within the budget (the first operator's new tensors);
  // one that does not is left to the first use. Returns the moves made.
  size_t align(std::span<const Move> out, std::span<const LogicalId> in, uint64_t also_free = 0);
  // The same for the installed schedule's start_out and start_in (none: nothing moves), leaving
  // room for what its first operator creates.
  size_t align();

  // --- schedule -------------------------------------------------------------------------------
  // Installs a schedule (tier indices of its moves must be engine tier indices; moves name logical
  // ids); null clears it. Throws teraio::Error, keeping the installed one, for a bad tier index.
  void set_schedule(std::shared_ptr<const Schedule> schedule);
  // set_schedule(Schedule::from_plan(plan, num_kernels)); an empty plan clears it.
  void set_plan(const Plan& plan, size_t num_kernels);
  bool has_plan() const;
  // Called when operator `k` of the iteration is about to run / has run: forgets the tensors that
  // died before it in the profile (if they are dead), issues the moves that start there
  // (prefetches before the operator, offloads after it) and completes offloads whose deadline it
  // is. A prefetch takes its memory within the budget: offloads in flight are completed and, if
  // need be, tensors evicted first (never one of `in_use`, the operator's own tensors).
  void before_operator(uint32_t k, std::span<const LogicalId> in_use = {});
  void after_operator(uint32_t k);

  EngineStats stats() const;
  void reset_peak();
  void reset_step_peak();

  // Called (under the engine's lock: it must not call back into the engine) for events that cost
  // time outside the plan or fix its starting point: "urgent-fetch", "eviction",
  // "cancelled-offload", "skipped-prefetch(<location>)", "skipped-offload(<why>)", "spilled-offload", "align-offload",
  // "align-fetch", "urgent-recompute", "skipped-drop(<why>)", "recompute-failed".
  using EventHook = std::function<void(std::string_view what, LogicalId id, uint64_t bytes)>;
  void set_event_hook(EventHook hook);

 private:
  struct Entry;

  Entry* find(LogicalId id);
  const Entry* find(LogicalId id) const;
  bool offload_locked(Entry& e, uint32_t tier, bool urgent);
  bool writeback_locked(Entry& e, uint32_t tier);
  // Settles e's writeback once it has ended (or waits for it): a valid copy makes e clean.
  void settle_writeback_locked(Entry& e, bool wait);
  // Before the memory is freed or moved: waits for e's copy in flight and settles it; false when
  // the tensor turned out dead once the copy gave its bytes back (Memory::end_view).
  bool settle_writeback_alive_locked(Entry& e);
  // Space on `tier` for a new write of e (an offload or a writeback); e is no longer clean.
  std::optional<storage::Extent> fresh_extent_locked(Entry& e, uint32_t tier);
  // Whether a read first makes room within the budget (make_room_locked, sparing `spare`): kNone
  // (fetch_all), kRequired (the tensor is needed now: read even when no room can be made), kTry (a
  // read that can wait: skipped when no room can be made; its first use fetches it).
  enum class Room { kNone, kRequired, kTry };
  // With a room other than kNone, the room made is for its bytes plus `also_free` (bytes that
  // must still fit after it).
  bool prefetch_locked(Entry& e, bool urgent, Room room = Room::kNone,
                       std::span<const LogicalId> spare = {}, uint64_t also_free = 0);
  bool make_room_locked(uint64_t bytes, std::span<const LogicalId> spare);
  bool reclaim_extents_locked(uint32_t tier);
  bool release_deferred_locked(uint32_t tier, bool wait);
  void release_read_extent_locked(Entry& e);
  // Forgets the entry's kept copy (Note [Clean offloads]); its tier space goes now if the read that
  // made it has ended, else when poll or the next move finds it ended.
  void release_clean_copy_locked(Entry& e);
  // Any state -> resident and attached; false (a Fault recorded) when the bytes cannot come back.
  bool make_usable_locked(Entry& e, std::span<const LogicalId> spare = {});
  // Dropped -> resident by the tensor's recipe; false (a Fault recorded, the tensor lost) when it
  // cannot be made. `urgent`: a use the plan did not expect.
  bool recompute_locked(Entry& e, bool urgent, std::span<const LogicalId> spare = {});
  // Why a tensor cannot be freed now ("" when it can): not resident, in use, or pinned.
  std::string unfreeable_locked(const Entry& e) const;
  bool drop_locked(Entry& e, std::string* why);
  // Frees a dead tensor without writing it (Note [Dead tensors]); false with `why` when it is not
  // resident, in use or pinned.
  bool discard_locked(Entry& e, std::string* why);
  void free_after_locked(std::span<const LogicalId> ids, bool (Engine::*free)(Entry&, std::string*),
                         std::string_view skipped);
  // What a wait was for: a read, or a write — due (an offload completed: its deadline, a step's
  // start), before its tensor is read back (finish_write_locked), a writeback's copy
  // (settle_writeback_locked), or another (a tensor forgotten or used again while offloading).
  enum class Wait { kRead, kReadUse, kWrite, kWriteDue, kWriteReadBack, kWriteback };
  // Counts now - since_us as stall, of what and of that tier.
  void add_stall_locked(Wait what, double since_us, uint32_t tier);
  // Waits for a transfer of that tier, counting the wait (if any) as stall of `what`.
  storage::IoResult wait_locked(const storage::Completion& c, Wait what, uint32_t tier);
  storage::IoResult take_pending_locked(Entry& e, Wait write = Wait::kWrite);
  bool release_in_stream_order_locked(Entry& e);
  void complete_offload_locked(Entry& e, bool wait);
  bool complete_prefetch_locked(Entry& e);
  bool finish_write_locked(Entry& e);  // false: the write failed and the tensor is lost
  bool settle_read_after_locked(Entry& e, bool wait);  // false: the same
  void lose_to_failed_write_locked(Entry& e, const storage::IoResult& write);
  void fault_locked(Entry& e, const storage::IoResult& r, std::string what, bool lost);
  std::string name_locked(const Entry& e) const;
  void forget_locked(Entry& e);
  void note_resident_locked();
  void sweep_dead_locked(size_t max_entries);
  storage::Completion submit_locked(size_t tier, const storage::IoRequest& req);
  static constexpr size_t kSweepPerCall = 8;
  static constexpr int kReadRetries = 2;  // Note [Read retries]
  size_t sweep_cursor_ = 0;

  EngineOptions options_;
  std::vector<EngineTier> tiers_;
  std::vector<std::unique_ptr<storage::ExtentAllocator>> extents_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Entry>> entries_;  // indexed by LogicalId
  // Tier space of reads not known to have ended, whose tensor was offloaded again meanwhile.
  struct Deferred {
    storage::Completion read;
    uint32_t tier = 0;
    storage::Extent extent;
  };
  std::vector<Deferred> deferred_;
  std::shared_ptr<const Schedule> schedule_;  // never null (an empty one when cleared)
  uint64_t clock_ = 0;  // use counter for LRU
  uint64_t write_clock_ = 0;  // offloads started, numbered (Entry::write_seq)
  bool making_room_ = false;  // inside make_room_locked: its waits are stall_room_us
  EngineStats stats_;
  BudgetPolicy budget_;  // budget_bytes from the options, untracked_bytes from set_reserve
  std::string shortfall_;
  std::vector<Fault> faults_;
  std::function<std::string(LogicalId)> namer_;
  EventHook hook_;
  void event(std::string_view what, const Entry& e) const;
};

}  // namespace teraio::runtime
