// teraio::Session (include/teraio/session.h): the only C++ that touches PyTorch internals besides
// the Python binding. A global at::RecordFunction callback sees every top-level operator on every
// thread; tensors are identified by StorageImpl (held weakly) and given logical ids that repeat
// every iteration (first appearance: operator ordinal + slot). Bytes move by swapping the storage's
// DataPtr (views stay valid); an absent storage has a null DataPtr, so a kernel reaching it through
// an unobserved path fails loudly instead of reading garbage.
#include "teraio/session.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#ifdef TERAIO_TORCH_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "engine.h"
#include "kernel_timer.h"
#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/json_text.h"
#include "teraio/planner.h"
#include "teraio/storage.h"
#include "teraio/sweep.h"
#include "teraio/trace.h"
#include "teraio/units.h"

namespace teraio {

namespace {

using runtime::LogicalId;

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Note [Refused tensors]: an offloaded storage has a null DataPtr, and PyTorch's untyped
// TensorImpl::data() does not check for null (only the typed data_ptr<T>() does), so a kernel that
// runs on a tensor whose bytes could not be brought back would read or write address 0 + offset and
// crash the process. StorageImpl's access error (release_data_and_set_meta_custom_data_ptr_error_msg_,
// PyTorch's mechanism for storages that must not be touched) makes every data access throw a
// c10::Error with our message instead. PyTorch offers no way to lift it, so the flag is reached
// here directly (a member pointer obtained through an explicit template instantiation, which the
// language exempts from access checks) and cleared when the bytes come back; refusal_reversible()
// checks once that this works on the PyTorch in use, and without it a refused tensor is lost.
struct ThrowOnDataPtrTag {
  using type = bool c10::StorageImpl::*;
  friend type member_of(ThrowOnDataPtrTag);
};
template <class Tag, typename Tag::type M>
struct PrivateMember {
  friend typename Tag::type member_of(Tag) { return M; }
};
template struct PrivateMember<ThrowOnDataPtrTag, &c10::StorageImpl::throw_on_immutable_data_ptr_>;

void clear_access_error(c10::StorageImpl& s) {
  s.*member_of(ThrowOnDataPtrTag{}) = false;  // the DataPtr installed next refreshes the checks
}

bool refusal_reversible() {
  static const bool reversible = [] {
    try {
      c10::Allocator* a = c10::GetCPUAllocator();
      auto s = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 64,
                                                     a->allocate(64), a, false);
      s->release_data_and_set_meta_custom_data_ptr_error_msg_(std::string("teraio probe"));
      try {
        (void)s->data();
        return false;  // the error does not work as expected: never rely on it
      } catch (const c10::Error&) {
      }
      clear_access_error(*s);
      s->set_data_ptr_noswap(a->allocate(64));
      (void)s->data();
      (void)s->mutable_data();
      return true;
    } catch (...) {
      return false;
    }
  }();
  return reversible;
}

// The stream on which PyTorch's operators run on `device`, as the storage engine names it
// (nullptr on CPU).
storage::CudaStream current_stream(c10::Device device) {
#ifdef TERAIO_TORCH_CUDA
  if (device.is_cuda()) {
    // PyTorch's default stream is the legacy default stream, whose cudaStream_t is nullptr. For
    // the storage engine a null ready_stream means "no stream: the bytes are final at submit",
    // so an offload's device-to-host copy (on the tier's non-blocking stream) would not wait
    // for the kernels still queued that produce or update the tensor, and a prefetch would not
    // make the compute stream wait on the GPU. Name the legacy stream explicitly instead.
    cudaStream_t s = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    return s != nullptr ? s : cudaStreamLegacy;
  }
#endif
  (void)device;
  return nullptr;
}

// A PyTorch storage as the engine sees it.
class StorageMemory final : public runtime::Memory {
 public:
  StorageMemory(c10::StorageImpl* s, c10::Device device)
      : weak_(c10::weak_intrusive_ptr<c10::StorageImpl>(
            c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s))),
        allocator_(s->allocator()),
        bytes_(s->nbytes()),
        device_(device),
        expected_(s->_mutable_data_ptr_no_checks().get()) {}

  uint64_t bytes() const override { return bytes_; }
  storage::BufferView detach() override {
    auto s = weak_.lock();
    TERAIO_INTERNAL_ASSERT(s && !replaced(*s), "detach of a dead storage");
    held_ = s->set_data_ptr(at::DataPtr(nullptr, device_));
    expected_ = nullptr;
    return view(held_.get());
  }
  void attach() override {
    auto s = weak_.lock();
    if (s && !replaced(*s)) {
      expected_ = held_.get();
      if (refused_) clear_access_error(*s);  // Note [Refused tensors]
      refused_ = false;
      s->set_data_ptr_noswap(std::move(held_));
    }
    held_ = at::DataPtr();  // dead or replaced by its owner: these bytes are obsolete
  }
  void drop() override { held_ = at::DataPtr(); }
  storage::BufferView allocate() override {
    // On CUDA the block may have been freed by kernels still queued on the compute stream; the
    // engine passes stream() as the read's ready_stream, so the tier's copy waits for them on the
    // GPU.
    held_ = allocator_->allocate(bytes_);
    return view(held_.get());
  }
  // A storage whose owner resized or re-allocated it behind the dispatcher counts as dead: FSDP2
  // frees its unsharded parameters with untyped_storage().resize_(0) after using them and
  // re-allocates them with resize_(n) before the next all-gather. The bytes teraio holds or would
  // read back are then obsolete and must never be installed over the owner's, and there is nothing
  // to offload. The engine then drops the tensor (its tier space too) and leaves the storage alone.
  bool alive() const override {
    auto s = weak_.lock();
    return s && !replaced(*s);
  }
  // Note [Lost tensors]: PyTorch's own mechanism for storages whose data must not be touched: every
  // access to the data pointer (any kernel, clone, print, numpy, state_dict, torch.save) then raises
  // a RuntimeError with this message instead of reading a null pointer. It cannot be undone: the
  // tensor is lost for good, as its bytes are.
  void lose(const std::string& why) override {
    held_ = at::DataPtr();
    refused_ = false;  // for good now
    auto s = weak_.lock();
    if (s && !replaced(*s)) s->release_data_and_set_meta_custom_data_ptr_error_msg_(why);
  }
  bool refuse(const std::string& why) override {
    if (!refusal_reversible()) return false;
    auto s = weak_.lock();
    if (s && !replaced(*s)) {
      s->release_data_and_set_meta_custom_data_ptr_error_msg_(why);
      refused_ = true;
    }
    return true;
  }
  storage::CudaStream stream() const override { return current_stream(device_); }

 private:
  storage::BufferView view(void* p) const {
    if (device_.is_cuda())
      return storage::BufferView(p, bytes_, storage::MemoryKind::kDevice, device_.index());
    return storage::BufferView::host(p, bytes_);
  }
  c10::weak_intrusive_ptr<c10::StorageImpl> weak_;
  // Size or data differ from what teraio left there: resident, the data it was bound with or last
  // attached; detached, none.
  bool replaced(const c10::StorageImpl& s) const {
    // Without the access checks: a lost storage (Note [Lost tensors]) throws on data_ptr().
    return s.nbytes() != bytes_ ||
           const_cast<c10::StorageImpl&>(s)._mutable_data_ptr_no_checks().get() != expected_;
  }
  at::Allocator* allocator_;
  uint64_t bytes_;
  c10::Device device_;
  const void* expected_;
  at::DataPtr held_;
  bool refused_ = false;  // the storage's access error is set (Note [Refused tensors])
};

enum class Mode { kProfiling, kPlanned, kReactive };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kProfiling:
      return "profiling";
    case Mode::kPlanned:
      return "planned";
    case Mode::kReactive:
      return "reactive";
  }
  return "?";
}

// Where a logical tensor first appears in an iteration: operator ordinal, slot, input or output.
uint64_t make_key(uint32_t k, uint32_t slot, bool out) {
  return (uint64_t(k) << 32) | (uint64_t(slot) << 1) | (out ? 1 : 0);
}

struct Binding {
  Binding(c10::StorageImpl* s, LogicalId i)
      : weak(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s)), id(i) {}
  c10::weak_intrusive_ptr<c10::StorageImpl> weak;
  LogicalId id = 0;
};

struct TensorMeta {
  uint64_t bytes = 0;
  uint64_t key = 0;
  uint64_t first_iter = 0;
  std::string name;
  std::optional<TensorKind> named_kind;
  bool is_param = false;
  bool produced_in_forward = false;
  bool produced_in_backward = false;
  bool used_in_backward = false;
  bool used_after_backward = false;  // produced in backward, used outside it (optimizer)
  // While recording: the last operator at which the tensor was still alive. Python keeps
  // temporaries past their last use (a variable until it is reassigned), so memory is taken
  // longer than the uses say; the trace extends the lifetime to here.
  int64_t last_alive_op = -1;
  uint64_t live_mark = 0;  // 1 + the iteration in which it joined `rec_live`

  // The name given with name_tensor, else where the tensor first appeared ("op12.out0").
  std::string display_name() const {
    if (!name.empty()) return name;
    return fmt::format("op{}.{}{}", key >> 32, (key & 1) ? "out" : "in", (key >> 1) & 0x7fffffff);
  }
  // A new output: produced by the backward pass, or by the forward pass with grad enabled.
  void note_producer(bool in_backward) {
    if (in_backward)
      produced_in_backward = true;
    else if (at::GradMode::is_enabled())
      produced_in_forward = true;
  }
};

struct OpRecord {
  std::string name;
  double time_us = 0;
  uint64_t timer_token = 0;  // the operator's token for the KernelTimer (0: none)
  std::vector<LogicalId> ids;
};

struct CachedPlan {
  Plan plan;                        // moves name logical ids
  std::vector<Move> start_out;      // persistent tensors offloaded when an iteration starts
  std::vector<LogicalId> start_in;  // persistent tensors resident when an iteration starts
  // Per operator: transient tensors that died just before it in the profile. The engine forgets
  // them there, so that resident bytes are the live ones without sweeping every tensor.
  std::vector<std::vector<LogicalId>> deaths;
  // Per operator: bytes of the transient tensors it creates in the profile. The budget is enforced
  // at an operator's start with room for them, so that a run off the plan (a skipped move, an
  // urgent fetch) cannot take the operator's outputs past the budget.
  std::vector<uint64_t> created;
  std::vector<uint64_t> signatures;  // per operator: name + input shapes
  std::vector<OpRecord> ops;         // the profiled operators (times final), to splice on drift
};

struct OpCtx final : at::ObserverContext {
  uint32_t k = 0;
  bool in_step = false;
  // Outputs of operators nested in this one (a composite's internals): tensors autograd saves
  // from inside, such as the attention probabilities of SDPA's math path, exist from here on but
  // no top-level operator names them before the backward pass. They are tracked from their birth.
  uint32_t nested = 0;
  std::vector<LogicalId> nested_outs;
  std::vector<LogicalId> ids;  // pinned inputs
  double t0_us = 0;
  uint64_t timer_token = 0;  // nonzero while the KernelTimer attributes this thread's work to it
  bool violation = false;  // the budget could not be met at this operator (reported once)
#ifdef TERAIO_TORCH_CUDA
  std::shared_ptr<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>> events;
#endif
};

#ifdef TERAIO_TORCH_CUDA
// The caching allocator's bytes in use on `device`: now, and the most since the last reset.
std::pair<uint64_t, uint64_t> device_allocated(c10::DeviceIndex device) {
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto& a =
      s.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return {static_cast<uint64_t>(std::max<int64_t>(a.current, 0)),
          static_cast<uint64_t>(std::max<int64_t>(a.peak, 0))};
}
#endif

thread_local int tl_depth = 0;     // nesting of observed operators on this thread
thread_local OpCtx* tl_top = nullptr;  // the running top-level step operator on this thread
thread_local int tl_backward = 0;  // inside an autograd node on this thread
// The thread that began the step. Operators of the step are those of this thread and of autograd
// nodes (backward on autograd's device threads); other threads (a DataLoader's pin-memory thread)
// are treated as outside the step, so they neither shift operator indices nor get tracked.
thread_local bool tl_step_thread = false;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

// Collective communication operators (torch.distributed through the dispatcher: c10d::allreduce_,
// c10d::broadcast_, c10d::_allgather_base_, ..., and the functional collectives). They are
// asynchronous: the operator returns while gloo's worker thread or NCCL's stream still reads and
// writes the tensors, until the Work completes (DDP waits for it at the end of backward), so the
// tensors they are given are pinned for the rest of the Session (see `pin_collective`).
bool is_collective(const char* name) {
  return std::strncmp(name, "c10d::", 6) == 0 ||
         std::strncmp(name, "_c10d_functional::", 18) == 0 ||
         std::strncmp(name, "c10d_functional::", 17) == 0;
}

// For an operator that touches a whole parameter group at once: what to do instead. Python's
// Session.step() recognises these sentences and adjusts them when the optimizer is watched or the
// gradient norm is teraio's (python/teraio/__init__.py, Session._refine_error).
std::string group_hint(std::string_view op) {
  if (op.find("_foreach_norm") != std::string_view::npos)
    return ". The gradient norm (torch.nn.utils.clip_grad_norm_) takes every gradient in one "
           "operator: call teraio.clip_grad_norm_ instead, which computes the same norm in parts "
           "that fit the budget (docs/pytorch.md, \"Optimizers\")";
  if (op.find("_foreach_zero_") != std::string_view::npos)
    return ". optimizer.zero_grad(set_to_none=False) zeroes every gradient in one operator: use "
           "zero_grad() (set_to_none=True, the default)";
  // _foreach_mul_ alone: clip_grad_norm_'s scaling, after its _foreach_norm over the same gradients
  // (an optimizer's own _foreach_mul_ comes with larger foreach operators, which give the advice).
  if (op.find("_foreach_mul_") != std::string_view::npos ||
      (op.find("_foreach_") == std::string_view::npos && op.find("_fused_") == std::string_view::npos))
    return "";
  return ". A foreach or fused optimizer step touches every parameter of a group at once (foreach "
         "is PyTorch's default on CUDA): call session.watch(optimizer=optimizer) so that teraio "
         "runs each step in parts that fit the budget, or create the optimizer with foreach=False "
         "(and fused=False) (docs/pytorch.md, \"Optimizers\")";
}

// A RecordFunction of scope FUNCTION that is not a dispatcher operator is a labelled range around
// operators: autograd's "autograd::engine::evaluate_function: ...", DDP's
// "torch::distributed::reducer::mul_out" and "torch.distributed.ddp.reducer::copy_bucket_to_grad".
// Its input list is informative, not complete (DDP's mul_out lists the bucket view but not the
// gradient that its aten::mul reads; copy_bucket_to_grad lists the parameter, neither the bucket
// nor the gradient its aten::copy_ reads and writes), so a range is transparent: the operators in
// it are the top-level ones, each with all its inputs made resident.
bool is_range(const at::RecordFunction& fn) {
  const char* n = fn.name();
  if (std::strncmp(n, "aten::", 6) == 0) return false;  // the common case, without a lookup
  if (std::strncmp(n, "autograd::", 10) == 0) return true;
  return !fn.operator_name().has_value();
}

// autograd runs a node's hooks (AccumulateGrad's post hooks: DDP copies the gradient into its
// bucket and launches the allreduce there) and reduces gradients to their input's shape inside
// this range but outside the node's own BACKWARD_FUNCTION range; on CUDA that is on autograd's
// device thread, so it must count as backward for those operators to belong to the step.
bool is_backward_range(const char* name) {
  return std::strncmp(name, "autograd::engine::evaluate_function", 35) == 0;
}

template <class F>
void visit_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) visit_tensors(e, f);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) visit_tensors(e, f);
  }
}

// An operator on a tensor subclass that dispatches in Python (__torch_dispatch__: DTensor, so
// FSDP2's sharded parameters, their gradients and optimizer states) holds no memory of its own:
// its subclass implementation runs operators on the inner tensors, nested in it, and those read and
// write the real storages. It is transparent too, so that those operators are the top-level ones
// and their inputs are made resident. Decided at its start (the inputs are only valid then: at its
// end they refer to a stack that now holds its outputs); its end knows it by its context.
struct SubclassCtx final : at::ObserverContext {};
bool on_subclass(const at::RecordFunction& fn) {
  bool found = false;
  for (const c10::IValue& v : fn.inputs()) {
    visit_tensors(v, [&](const at::Tensor& t) {
      found = found || (t.defined() && t.unsafeGetTensorImpl()->is_python_dispatch());
    });
    if (found) return true;
  }
  return false;
}

}  // namespace

struct Session::Impl {
  SessionOptions options;
  std::vector<std::unique_ptr<storage::Tier>> tiers;
  std::vector<storage::FaultTier*> fault_tiers;  // with options.fault_injection: tiers[i]'s wrapper
  std::unique_ptr<runtime::Engine> engine;
  std::vector<TierSpec> tier_specs;

  // ---- Tier bandwidth (docs/pytorch.md, "Tier bandwidth") ----
  // What the planner uses per tier (tier_specs' gbps) and where it comes from. Tiers without a
  // given bandwidth are measured once, by measure_tiers, when the first step's first operator
  // names the device: nothing is bound to the engine yet, so the first bytes of every tier are free
  // for the probe, and the plan (made after profiling) uses the numbers.
  std::vector<SessionTierStats> tier_stats;
  bool tiers_measured = false;
  void measure_tiers(at::Allocator* allocator) {
    if (tiers_measured) return;
    tiers_measured = true;
    std::vector<size_t> todo;
    for (size_t i = 0; i < tier_stats.size(); ++i)
      if (tier_stats[i].read_source != "given" || tier_stats[i].write_source != "given")
        todo.push_back(i);
    if (todo.empty()) return;
    // Scratch in the memory tensors live in, from their own allocator, freed after the probe:
    // budget / 4 within [4 MiB, 64 MiB] (the probe's requests are a quarter of it, at most 16 MiB).
    const uint64_t scratch_bytes =
        std::clamp<uint64_t>(options.budget_bytes / 4 / 4096 * 4096, 4ull << 20,
                             storage::kQuickProbeScratchBytes);
    at::DataPtr scratch;
    try {
#ifdef TERAIO_TORCH_CUDA
      // The caching allocator allocates on the current device: make it the tensors' one.
      std::optional<c10::cuda::CUDAGuard> guard;
      if (device->is_cuda()) guard.emplace(device->index());
#endif
      scratch = (allocator != nullptr ? allocator : c10::GetAllocator(device->type()))
                    ->allocate(scratch_bytes);
    } catch (const std::exception& e) {
      for (size_t i : todo)
        tier_stats[i].notes.push_back(fmt::format(
            "bandwidth not measured: no {} of scratch memory on {}: {}",
            format_bytes(double(scratch_bytes)), device->str(), e.what()));
      return;
    }
    const storage::BufferView view =
        device->is_cuda() ? storage::BufferView(scratch.get(), scratch_bytes,
                                                storage::MemoryKind::kDevice, device->index())
                          : storage::BufferView::host(scratch.get(), scratch_bytes);
    for (size_t i : todo) {
      SessionTierStats& ts = tier_stats[i];
      TierSpec& spec = tier_specs[i];
      storage::BandwidthProbeOptions po = storage::quick_probe_options(tiers[i]->info());
      po.ready_stream = current_stream(*device);
      try {
        const storage::BandwidthProbe p = storage::probe_bandwidth(
            *tiers[i], view, 0, std::min(storage::kQuickProbeTierBytes, spec.capacity_bytes), po);
        if (ts.read_source != "given") {
          spec.read_gbps = ts.read_gbps = p.read_gbps.median;
          ts.read_source = "measured";
        }
        if (ts.write_source != "given") {
          spec.write_gbps = ts.write_gbps = p.write_gbps.median;
          ts.write_source = "measured";
        }
        ts.read_gbps_min = p.read_gbps.min;
        ts.read_gbps_max = p.read_gbps.max;
        ts.write_gbps_min = p.write_gbps.min;
        ts.write_gbps_max = p.write_gbps.max;
        ts.probe_s = p.elapsed_s;
        ts.probe_memory = p.memory;
        ts.notes.insert(ts.notes.end(), p.notes.begin(), p.notes.end());
      } catch (const std::exception& e) {
        ts.notes.push_back(std::string("bandwidth not measured: ") + e.what());
        note_error(fmt::format(
            "{}; the {} tier cannot move bytes. Fix the tier (its path, space, permissions), or "
            "give its read_gbps and write_gbps to skip the probe",
            e.what(), ts.name));
      }
    }
  }

  mutable std::mutex mu;
  Mode mode = Mode::kProfiling;
  bool iteration_reactive = false;  // drift switched this iteration to reactive
  int profiled = 0;                 // profiled iterations since the last (re)start
  uint64_t iteration = 0;
  std::atomic<bool> in_step{false};
  // Planned with an empty plan and no drift yet: operators only advance the index and check the
  // signature, without taking the lock (the hooks must cost < 1% of a step).
  std::atomic<bool> fast{false};
  std::atomic<uint64_t> iter_sig{0};  // running hash of this iteration's operator signatures
  std::optional<c10::Device> device;

  std::unordered_map<c10::StorageImpl*, Binding> storages;
  std::vector<c10::StorageImpl*> id_storage;
  std::unordered_map<uint64_t, LogicalId> key_ids;
  std::vector<TensorMeta> metas;

  std::atomic<uint32_t> op_counter{0};
  std::vector<uint64_t> signatures;  // this iteration's, while recording
  std::vector<OpRecord> ops;         // this iteration, when profiling
  std::vector<LogicalId> rec_live;   // tensors of this recording still alive (see last_alive_op)
#ifdef TERAIO_TORCH_CUDA
  std::vector<std::shared_ptr<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>>> op_events;
#endif
  // Note [Kernel times from CUPTI] (kernel_timer.h): while recording on CUDA, each operator's GPU
  // time comes from CUPTI; events stay as the fallback and as the measure of what they overcount.
  std::unique_ptr<KernelTimer> timer;
  uint64_t timer_tokens = 0;
  std::optional<std::unordered_map<uint64_t, double>> timer_us;  // the last recording's, by token
  std::string kernel_timing = "host clock";  // how the last profile's operators were timed
  double profiled_kernel_us = 0;  // the last profile's operator times, summed (what was planned)
  double profiled_event_us = 0;   // the same operators timed with CUDA events (CUDA only)
  std::unordered_map<uint64_t, CachedPlan> plan_cache;
  const CachedPlan* active = nullptr;

  uint64_t drift_events = 0;
  uint64_t budget_violations = 0;
  // Device memory the budget must leave to what is not tracked: operator workspaces and
  // temporaries inside composite operators, tensors under min_tensor_bytes, library workspaces.
  // On CUDA it is measured while recording (the allocator's peak during each operator minus the
  // tracked resident bytes, the most over the iteration); 0 on CPU, where the budget counts
  // tracked bytes only.
  uint64_t untracked_bytes = 0;
  uint64_t plan_budget_bytes = 0;  // the budget the last plan was made for
  std::string plan_variant;        // which of the planner's variants the last plan is
  double predicted_iteration_us = 0;  // the simulator's replay of the last plan (with search)

  bool measuring_device() const {
#ifdef TERAIO_TORCH_CUDA
    return device && device->is_cuda();
#else
    return false;
#endif
  }
  uint64_t last_operators = 0;
  std::string last_error;
  std::string pending_error;  // the first error of this step (raised by end_step as teraio::Error)
  std::string pending_fault;  // the first failed transfer of this step (raised as teraio::IoError)
  uint64_t step_faults = 0;   // failed transfers this step
  // The largest operator of this step whose own tensors exceed the budget, and what to say of it.
  uint64_t step_need_bytes = 0;
  std::string step_need_error, step_need_hint;
  uint64_t step_read_faults = 0;  // of which reads (or lost bytes): the step's results may be partial
  bool closed = false;
  runtime::EngineStats closed_stats;  // the engine's last stats, after close()

  // Two registrations of the same callbacks: `handle` sees inputs and outputs (profiling, plans
  // with moves, reactive steps); `lean_handle` sees inputs only, for planned steps with an empty
  // plan, where only the drift check runs (PyTorch then does not box every operator's outputs).
  // Exactly one is enabled; they are switched at step start and on drift.
  at::CallbackHandle handle = 0;
  at::CallbackHandle lean_handle = 0;
  bool lean_active = false;
  void select_callbacks(bool lean) {
    if (lean == lean_active) return;
    // The new one first: an operator may see both (nesting makes the second a no-op), none never.
    at::reenableCallback(lean ? lean_handle : handle);
    at::disableCallback(lean ? handle : lean_handle);
    lean_active = lean;
  }

  // Begins timing operators with CUPTI for a recording on CUDA (Note [Kernel times from CUPTI]);
  // when it cannot, kernel_timing says why and events time them.
  void start_timer() {
#ifdef TERAIO_TORCH_CUDA
    if (!measuring_device() || timer) return;
    std::string why;
    if (torch::autograd::profiler::isProfilerEnabledInMainThread())
      why = "torch.profiler is running (it holds CUPTI)";
    else
      timer = KernelTimer::start(&why);
    if (!timer) kernel_timing = "CUDA events (" + why + ")";
#endif
  }

  // Ends a recording's timing: waits for the device, then takes CUPTI's times (timer_us).
  void finish_timer() {
#ifdef TERAIO_TORCH_CUDA
    timer_us.reset();
    if (!timer) return;
    std::string why;
    try {
      c10::cuda::device_synchronize();
      timer_us = timer->finish(&why);
    } catch (const std::exception& e) {
      why = e.what();
    }
    timer.reset();
    kernel_timing = timer_us ? "CUPTI" : "CUDA events (" + why + ")";
#endif
  }

  // Operators are recorded while profiling and, after a drift, for the rest of the iteration (the
  // operators before the drift are the plan's own, spliced in from its profile).
  bool recording() const {
    return in_step && (mode == Mode::kProfiling || iteration_reactive);
  }
  bool planned_now() const {
    return in_step && mode == Mode::kPlanned && !iteration_reactive;
  }

  // The iteration left the plan at operator k: finish it safely in reactive mode, recording from
  // here on; the operators before k are the plan's own (same signatures), spliced in from its
  // profile so that the iteration can become the profile of its shape.
  void note_drift(uint32_t k) {
    iteration_reactive = true;
    start_timer();
    fast.store(false, std::memory_order_relaxed);
    select_callbacks(false);
    drift_events++;
    size_t n = std::min<size_t>(k, active->ops.size());
    ops.assign(active->ops.begin(), active->ops.begin() + n);
    signatures.assign(active->signatures.begin(), active->signatures.begin() + n);
  }

  // Returns true when the operator was fully handled by the fast path.
  bool fast_path(const at::RecordFunction& fn) {
    uint64_t sig = std::hash<std::string_view>()(fn.name());
    for (const c10::IValue& v : fn.inputs())
      visit_tensors(v, [&](const at::Tensor& t) {
        if (t.defined())
          for (int64_t d : t.sizes()) sig = mix(sig, static_cast<uint64_t>(d));
      });
    uint32_t k = op_counter.load(std::memory_order_relaxed);
    const auto& planned = active->signatures;
    if (k < planned.size() && planned[k] == sig) {
      op_counter.store(k + 1, std::memory_order_relaxed);
      iter_sig.store(mix(iter_sig.load(std::memory_order_relaxed), sig), std::memory_order_relaxed);
      return true;
    }
    std::lock_guard lock(mu);
    if (fast.load(std::memory_order_relaxed)) note_drift(k);
    return false;  // the full path handles this operator (and the rest of the iteration)
  }

  void note_error(const std::string& what) {
    last_error = what;
    if (pending_error.empty()) pending_error = what;
  }

  // Takes the engine's failed transfers (Note [Faults in the engine]) into the step's faults. Outside
  // a step they only set last_error: the operator that needed the tensor fails on its own (a lost
  // tensor's storage raises the fault's message; see Note [Lost tensors]).
  void collect_faults() { collect_faults(in_step); }
  void collect_faults(bool of_the_step) {
    for (runtime::Fault& f : engine->take_faults()) {
      last_error = f.message;
      if (!of_the_step) continue;
      if (f.lost || f.read) step_read_faults++;
      if (pending_fault.empty()) pending_fault = std::move(f.message);
      step_faults++;
    }
  }

  // The budget could not be met at operator k (engine->budget_shortfall() says why): an error of the
  // step, once per operator.
  void note_shortfall(uint32_t k, const char* op, bool* noted) {
    if (*noted) return;
    *noted = true;
    budget_violations++;
    note_error(fmt::format("budget {} could not be met at operator {} ({}): {}",
                           format_bytes(double(options.budget_bytes)), k, op,
                           engine->budget_shortfall()));
  }

  // Tensors given to a collective stay resident for the rest of the Session: the engine never
  // offloads them again (Engine::pin_permanently; the storage keeps its DataPtr, so the address
  // gloo or NCCL was given stays valid until the Work completes, whenever that is). The trace lists
  // them at every operator where they are pinned (build_trace), so plans neither move them nor
  // count on their memory there. Untracked tensors (too small, another device, or seen outside a
  // step before ever being tracked) are never moved anyway. Pinning for the rest of the Session
  // rather than until the Work completes keeps this simple and safe whatever waits for the Work;
  // the cost is that those tensors (DDP's gradient buckets) are never offloaded.
  void pin_collective(std::span<const LogicalId> ids) {
    for (LogicalId id : ids) engine->pin_permanently(id);
  }
  // The same for an operator whose tensors were not bound by on_start/on_end (fast path, nested).
  template <class Values>
  void pin_collective_values(const Values& values) {
    for (const c10::IValue& v : values)
      visit_tensors(v, [&](const at::Tensor& t) {
        if (!t.defined() || !t.has_storage()) return;
        auto it = storages.find(t.storage().unsafeGetStorageImpl());
        if (it != storages.end()) engine->pin_permanently(it->second.id);
      });
  }

  // The logical id of a storage, binding it when new (only inside a step).
  std::optional<LogicalId> lookup_or_bind(const at::Tensor& t, c10::StorageImpl* si, uint64_t key,
                                          bool bind) {
    auto it = storages.find(si);
    if (it != storages.end()) return it->second.id;
    if (!bind || si->allocator() == nullptr || si->nbytes() < options.min_tensor_bytes)
      return std::nullopt;
    LogicalId id;
    auto kit = key_ids.find(key);
    if (kit != key_ids.end() &&
        (id_storage[kit->second] == nullptr || !storages.count(id_storage[kit->second]) ||
         storages.at(id_storage[kit->second]).weak.expired())) {
      id = kit->second;
      if (c10::StorageImpl* old = id_storage[id]) storages.erase(old);
    } else {
      id = static_cast<LogicalId>(metas.size());
      metas.emplace_back();
      id_storage.push_back(nullptr);
      key_ids[key] = id;
    }
    engine->bind(id, std::make_unique<StorageMemory>(si, *device));
    storages.emplace(si, Binding(si, id));
    id_storage[id] = si;
    TensorMeta& m = metas[id];
    if (m.key != key || m.bytes == 0) {  // a new logical tensor; the same key keeps its labels
      m = TensorMeta{};
      m.key = key;
    }
    m.bytes = si->nbytes();
    m.first_iter = iteration;
    m.is_param = t.requires_grad() && !t.grad_fn();
    return id;
  }

  std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    std::lock_guard lock(mu);
    auto ctx = std::make_unique<OpCtx>();
    const bool step_op = in_step && (tl_step_thread || tl_backward > 0);
    ctx->in_step = step_op;
    uint64_t sig = std::hash<std::string_view>()(fn.name());
    const uint32_t k = step_op ? op_counter++ : 0;
    ctx->k = k;
    uint32_t slot = 0;
    uint64_t op_bytes = 0;
    for (const c10::IValue& v : fn.inputs()) {
      visit_tensors(v, [&](const at::Tensor& t) {
        uint32_t my_slot = slot++;
        if (!t.defined()) return;
        if (step_op) {
          for (int64_t d : t.sizes()) sig = mix(sig, static_cast<uint64_t>(d));
        }
        if (!t.has_storage()) return;
        if (!device && step_op && t.requires_grad() && !t.grad_fn()) {
          device = t.device();
          measure_tiers(t.storage().unsafeGetStorageImpl()->allocator());
        }
        if (!device || t.device() != *device) return;
        c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
        std::optional<LogicalId> id = lookup_or_bind(t, si, make_key(k, my_slot, false), step_op);
        if (!id) return;
        if (std::find(ctx->ids.begin(), ctx->ids.end(), *id) == ctx->ids.end()) {
          ctx->ids.push_back(*id);
          op_bytes += si->nbytes();
        }
        if (recording()) {
          TensorMeta& m = metas[*id];
          if (tl_backward > 0)
            m.used_in_backward = true;
          else if (m.produced_in_backward)
            m.used_after_backward = true;
        }
      });
    }
    const bool collective = is_collective(fn.name());
    if (!step_op) {
      engine->begin_use(ctx->ids);
      if (collective) pin_collective(ctx->ids);
      return ctx;
    }
    iter_sig.store(mix(iter_sig.load(std::memory_order_relaxed), sig), std::memory_order_relaxed);
    if (mode == Mode::kPlanned && !iteration_reactive) {
      const auto& planned = active->signatures;
      if (k >= planned.size() || planned[k] != sig) {
        note_drift(k);
      } else {
        engine->forget_dead(active->deaths[k]);
        engine->before_operator(k, ctx->ids);
      }
    }
    if (recording()) signatures.push_back(sig);
    engine->begin_use(ctx->ids);
    collect_faults();
    if (collective) pin_collective(ctx->ids);
    if (options.budget_bytes && op_bytes + untracked_bytes > options.budget_bytes) {
      ctx->violation = true;
      budget_violations++;
      // The step reports its largest such operator: the budget that would work for all of them.
      const uint64_t need = op_bytes + untracked_bytes;
      if (need > step_need_bytes) {
        step_need_bytes = need;
        step_need_error = fmt::format(
            "budget {} is smaller than the tensors of operator {} ({}): {}{}; the step needs a budget "
            "of at least {} for that operator alone",
            format_bytes(double(options.budget_bytes)), k, fn.name(), format_bytes(double(op_bytes)),
            untracked_bytes ? fmt::format(" plus {} of device memory used outside tracked tensors",
                                          format_bytes(double(untracked_bytes)))
                            : "",
            format_bytes(double(need)));
        last_error = step_need_error;
      }
      // Each kind of whole-group operator that broke the budget adds its advice once (an
      // unwatched foreach optimizer and torch's gradient norm may both have).
      if (std::string hint = group_hint(fn.name());
          !hint.empty() && step_need_hint.find(hint) == std::string::npos)
        step_need_hint += hint;
    }
    // Room for what the operator creates (known from the plan's profile), so that its outputs too
    // stay within the budget in planned steps.
    const uint64_t created = planned_now() && k < active->created.size() ? active->created[k] : 0;
    if (!engine->enforce_budget(created)) note_shortfall(k, fn.name(), &ctx->violation);
    if (recording()) {
#ifdef TERAIO_TORCH_CUDA
      if (device && device->is_cuda()) {
        // Peak of this operator alone (reset here; read at its end). This resets what
        // torch.cuda.max_memory_allocated() reports, during recorded iterations only.
        c10::cuda::CUDACachingAllocator::resetPeakStats(device->index());
        ctx->events = std::make_shared<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>>(
            at::cuda::CUDAEvent(cudaEventDefault), at::cuda::CUDAEvent(cudaEventDefault));
        ctx->events->first.record(c10::cuda::getCurrentCUDAStream(device->index()));
        if (timer) {
          ctx->timer_token = ++timer_tokens;
          timer->enter(ctx->timer_token);
        }
      }
#endif
      ctx->t0_us = now_us();
    }
    return ctx;
  }

  void on_end(const at::RecordFunction& fn, OpCtx* ctx) {
    double t1 = now_us();
    std::lock_guard lock(mu);
    if (ctx->timer_token && timer) timer->leave();
    if (!ctx->in_step || !in_step) {
      engine->end_use(ctx->ids);
      return;
    }
    const uint32_t k = ctx->k;
    const bool rec = recording();
    std::vector<LogicalId> outs = std::move(ctx->nested_outs);
    uint32_t slot = 0;
    for (const c10::IValue& v : fn.outputs()) {
      visit_tensors(v, [&](const at::Tensor& t) {
        uint32_t my_slot = slot++;
        if (!t.defined() || !t.has_storage() || !device || t.device() != *device) return;
        c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
        bool fresh = !storages.count(si);
        std::optional<LogicalId> id = lookup_or_bind(t, si, make_key(k, my_slot, true), true);
        if (!id) return;
        outs.push_back(*id);
        if (rec && fresh) metas[*id].note_producer(tl_backward > 0);
      });
    }
    if (rec) {
      OpRecord r;
      r.name = fn.name();
      r.time_us = t1 - ctx->t0_us;
      r.timer_token = ctx->timer_token;
      r.ids = ctx->ids;
      for (LogicalId id : outs)
        if (std::find(r.ids.begin(), r.ids.end(), id) == r.ids.end()) r.ids.push_back(id);
      for (LogicalId id : r.ids) {
        TensorMeta& m = metas[id];
        if (m.live_mark != iteration + 1) {
          m.live_mark = iteration + 1;
          rec_live.push_back(id);
        }
      }
      ops.push_back(std::move(r));
      note_alive(static_cast<int64_t>(ops.size()) - 1);
#ifdef TERAIO_TORCH_CUDA
      if (ctx->events) {
        ctx->events->second.record(c10::cuda::getCurrentCUDAStream(device->index()));
        op_events.resize(ops.size());
        op_events.back() = ctx->events;
      }
#endif
    }
#ifdef TERAIO_TORCH_CUDA
    if (rec && measuring_device()) {
      const uint64_t peak = device_allocated(device->index()).second;
      engine->forget_dead();  // what died is no longer allocated: it must not count as tracked
      const uint64_t tracked = engine->stats().resident_bytes;
      if (peak > tracked && peak - tracked > untracked_bytes) {
        untracked_bytes = peak - tracked;
        engine->set_reserve(untracked_bytes);
      }
    }
#endif
    engine->end_use(ctx->ids);
    engine->touch(outs);
    if (is_collective(fn.name())) pin_collective(outs);  // a functional collective's result
    if (planned_now()) engine->after_operator(k);
    // The safety net in every mode (a plan keeps below it; see make_and_install_plan).
    if (!engine->enforce_budget()) note_shortfall(k, fn.name(), &ctx->violation);
    collect_faults();
  }

  bool storage_alive(LogicalId id) const {
    c10::StorageImpl* si = id_storage[id];
    if (si == nullptr) return false;
    auto it = storages.find(si);
    return it != storages.end() && !it->second.weak.expired();
  }

  // Marks the recorded tensors still alive after recorded operator k; forgets the dead ones.
  void note_alive(int64_t k) {
    for (size_t i = 0; i < rec_live.size();) {
      LogicalId id = rec_live[i];
      if (storage_alive(id)) {
        metas[id].last_alive_op = k;
        ++i;
      } else {
        rec_live[i] = rec_live.back();
        rec_live.pop_back();
      }
    }
  }

  // The end of an operator nested in the top-level one `top`: binds its new outputs.
  void on_nested_end(const at::RecordFunction& fn, OpCtx* top) {
    std::lock_guard lock(mu);
    if (!in_step || !device) return;
    const bool rec = recording();
    const bool collective = is_collective(fn.name());
    if (collective) pin_collective_values(fn.outputs());  // its inputs were pinned at its start
    for (const c10::IValue& v : fn.outputs()) {
      visit_tensors(v, [&](const at::Tensor& t) {
        if (!t.defined() || !t.has_storage() || t.device() != *device) return;
        c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
        if (storages.count(si)) return;  // a view, or an input: already known
        std::optional<LogicalId> id = lookup_or_bind(t, si, make_key(top->k, 0x4000 + top->nested++, true), true);
        if (!id) return;
        top->nested_outs.push_back(*id);
        if (collective) engine->pin_permanently(*id);
        if (rec) metas[*id].note_producer(tl_backward > 0);
      });
    }
  }

  Trace build_trace(std::vector<LogicalId>* trace_to_logical) {
    std::unordered_map<LogicalId, TensorId> to_trace;
    Trace trace;
    trace.set_meta("source", "\"teraio.Session\"");
    trace.set_meta("device", fmt::format("\"{}\"", device ? device->str() : std::string("cpu")));
    trace.set_meta("iteration", std::to_string(iteration));
    double kernel_us = 0, event_us = 0;
    // A transient tensor alive past its last use (Python holds it; a gradient until zero_grad)
    // gets that operator as its `alive_until`: its memory is taken until then, but it is not used
    // there, so it may leave after its last use (below). One alive at the end is persistent.
    std::unordered_map<LogicalId, size_t> last_use;
    for (size_t k = 0; k < ops.size(); ++k)
      for (LogicalId id : ops[k].ids) last_use[id] = k;
    // Tensors pinned by a collective (pin_collective) are listed at every operator where they are
    // pinned, so that the planner sees no inactive period there (no move) and counts their bytes:
    // a persistent one (DDP's gradient buckets) at every operator, since it is pinned when the
    // next iterations start; a transient one from its first collective until it dies.
    std::vector<std::vector<LogicalId>> pinned_at(ops.size());
    if (!ops.empty()) {
      std::unordered_map<LogicalId, size_t> first_collective;
      for (size_t k = 0; k < ops.size(); ++k)
        if (is_collective(ops[k].name.c_str()))
          for (LogicalId id : ops[k].ids) first_collective.emplace(id, k);
      std::vector<std::pair<LogicalId, size_t>> sorted(last_use.begin(), last_use.end());
      std::sort(sorted.begin(), sorted.end());  // a deterministic trace
      for (const auto& [id, last] : sorted) {
        const bool alive = storage_alive(id);
        auto it = first_collective.find(id);
        size_t from = 0, to = ops.size() - 1;
        if (alive && engine->pinned_permanently(id)) {
          // pinned from the first operator to the last
        } else if (it != first_collective.end()) {
          from = it->second;
          if (!alive)
            to = static_cast<size_t>(std::clamp<int64_t>(metas[id].last_alive_op,
                                                         static_cast<int64_t>(last), int64_t(to)));
        } else {
          continue;
        }
        for (size_t k = from; k <= to; ++k) pinned_at[k].push_back(id);
      }
    }
    std::vector<LogicalId> idle;  // tracked, alive and not used in this iteration
    for (const auto& [si, b] : storages)
      if (!last_use.count(b.id) && !b.weak.expired() && engine->bound(b.id) &&
          engine->location(b.id) != runtime::Location::kLost)
        idle.push_back(b.id);
    std::sort(idle.begin(), idle.end());  // a deterministic trace
    for (LogicalId id : idle)
      if (engine->pinned_permanently(id))
        for (auto& at : pinned_at) at.push_back(id);  // never moves: counted at every operator
    std::vector<TensorId> ids;
    std::vector<LogicalId> op_ids;
    for (size_t k = 0; k < ops.size(); ++k) {
      ids.clear();
      op_ids = ops[k].ids;
      op_ids.insert(op_ids.end(), pinned_at[k].begin(), pinned_at[k].end());
      for (LogicalId id : op_ids) {
        auto [it, inserted] = to_trace.emplace(id, static_cast<TensorId>(trace_to_logical->size()));
        if (inserted) {
          trace_to_logical->push_back(id);
          const TensorMeta& m = metas[id];
          bool alive = storage_alive(id);
          TensorInfo info;
          info.bytes = m.bytes;
          // Alive when the iteration ends: its memory stays taken into the next iteration (a
          // gradient until zero_grad, a batch the loop still holds), so the planner must count it
          // there. Modelled as persistent (its gap wraps around); when the next iteration frees it
          // before its first use, the runtime drops a prefetch of the dead tensor (no read).
          info.persistent = alive;
          const bool long_lived = alive && m.first_iter < iteration;
          if (m.named_kind) {
            info.kind = *m.named_kind;
          } else if (m.is_param) {
            info.kind = TensorKind::parameter;
          } else if (m.produced_in_backward) {
            info.kind =
                (alive || m.used_after_backward) ? TensorKind::gradient : TensorKind::temporary;
          } else if (long_lived) {
            info.kind = TensorKind::optimizer_state;
          } else if (m.produced_in_forward && m.used_in_backward) {
            info.kind = TensorKind::activation;
          } else if (m.produced_in_forward || (m.key & 1)) {
            info.kind = TensorKind::temporary;
          } else {
            info.kind = TensorKind::other;
          }
          info.name = m.display_name();
          trace.add_tensor(std::move(info));
        }
        ids.push_back(it->second);
      }
      double t = ops[k].time_us;
#ifdef TERAIO_TORCH_CUDA
      if (k < op_events.size() && op_events[k]) {
        op_events[k]->second.synchronize();
        t = 1000.0 * op_events[k]->first.elapsed_time(op_events[k]->second);
        event_us += t;
        if (timer_us) {
          auto it = timer_us->find(ops[k].timer_token);
          t = it != timer_us->end() ? it->second : 0.0;  // no GPU work: none launched
        }
      }
#endif
      kernel_us += std::max(0.0, t);
      trace.add_kernel(ops[k].name, std::max(0.0, t), ids);
    }
    profiled_kernel_us = kernel_us;
    profiled_event_us = event_us;
    if (!measuring_device()) kernel_timing = "host clock";
    trace.set_meta("kernel_timing", json_quote(kernel_timing));
    // alive_until, for transient tensors whose memory outlived their last listed use.
    std::vector<int64_t> last_listed(trace.num_tensors(), -1);
    for (size_t k = 0; k < trace.num_kernels(); ++k)
      for (TensorId t : trace.kernel_tensors(static_cast<KernelIndex>(k)))
        last_listed[t] = static_cast<int64_t>(k);
    for (TensorId t = 0; t < trace.num_tensors(); ++t) {
      const int64_t until = metas[trace_to_logical->at(t)].last_alive_op;
      if (!trace.tensors[t].persistent && until > last_listed[t] &&
          until < static_cast<int64_t>(ops.size()))
        trace.tensors[t].alive_until = static_cast<KernelIndex>(until);
    }
    // Tensors alive and tracked but not used in this iteration (an expert that got no token, the
    // states of parameters without a gradient this time): persistent, never used here, so the
    // planner may keep them out for the whole iteration (pinned ones were listed above).
    for (LogicalId id : idle) {
      if (to_trace.count(id)) continue;
      const TensorMeta& m = metas[id];
      TensorInfo info;
      info.bytes = m.bytes;
      info.persistent = true;
      info.kind = m.named_kind ? *m.named_kind
                  : m.is_param ? TensorKind::parameter
                               : TensorKind::optimizer_state;
      info.name = m.display_name();
      to_trace.emplace(id, static_cast<TensorId>(trace_to_logical->size()));
      trace_to_logical->push_back(id);
      trace.add_tensor(std::move(info));
    }
    trace.validate();
    return trace;
  }

  void make_and_install_plan(uint64_t iteration_signature, bool force) {
    std::vector<LogicalId> trace_to_logical;
    Trace trace = build_trace(&trace_to_logical);
    if (!options.trace_path.empty()) write_trace(trace, options.trace_path);
    if (!options.planning || (!force && profiled < options.profiling_iterations)) return;
    for (size_t k = 0; k < ops.size(); ++k)
      ops[k].time_us = trace.kernel_time_us(static_cast<KernelIndex>(k));
    PlannerOptions po;
    // On CUDA the plan keeps tracked tensors below the budget less what the iteration needs
    // besides them, and a margin of 1/32 for what the measurement missed.
    const uint64_t reserve = untracked_bytes + (measuring_device() ? options.budget_bytes / 32 : 0);
    if (reserve >= options.budget_bytes)
      throw Error(fmt::format(
          "budget {} leaves nothing for tensors: {} of device memory is used outside the "
          "tracked tensors (operator workspaces and temporaries, tensors under {}){}",
          format_bytes(double(options.budget_bytes)), format_bytes(double(untracked_bytes)),
          format_bytes(double(options.min_tensor_bytes)),
          measuring_device() ? ", plus a margin of 1/32" : ""));
    po.budget_bytes = options.budget_bytes - reserve;
    plan_budget_bytes = po.budget_bytes;
    po.tiers = tier_specs;
    po.min_tensor_bytes = options.min_tensor_bytes;
    Plan plan;
    try {
      if (options.plan_search) {
        BestPlan best = plan_best(trace, po);
        plan = std::move(best.plan);
        plan_variant = best.variant;
      } else {
        plan = make_plan(trace, po);
        plan_variant = "default";
      }
    } catch (const Error& e) {
      if (reserve == 0) throw;
      throw Error(fmt::format("{} (the planner's budget is the Session's {} less {} of device memory used "
                              "outside tracked tensors and a margin of 1/32)",
                              e.what(), format_bytes(double(options.budget_bytes)),
                              format_bytes(double(untracked_bytes))));
    }
    predicted_iteration_us = plan.predicted.iteration_us;
    if (!options.plan_path.empty()) write_plan(plan, options.plan_path);
    CachedPlan cp;
    cp.signatures = signatures;
    cp.plan = plan;
    // A tensor made anew each iteration and alive at its end (a gradient until zero_grad) is
    // persistent in the trace, so its memory is counted into the next iteration; the read that
    // would bring it back for its first use there is dropped: that use creates a new tensor.
    const Lifetimes lifetimes(trace);
    auto recreated = [&](TensorId t) {
      return trace.tensors[t].persistent && metas[trace_to_logical.at(t)].first_iter >= iteration;
    };
    std::erase_if(cp.plan.moves, [&](const Move& m) {
      return m.op == MoveOp::prefetch && recreated(m.tensor) &&
             lifetimes.used(m.tensor) && m.deadline == lifetimes.first_use(m.tensor);
    });
    // Where each other persistent tensor is when an iteration starts: offloaded if its first move
    // in the iteration is a prefetch (it went out at the end of the previous one), or if no operator
    // uses it and the plan moves it out (it stays out: docs/planner.md, "Tensors no kernel uses
    // again"), else resident.
    // At one kernel a prefetch starts before it runs and an offload after it: the prefetch is first.
    auto earlier = [](const Move& a, const Move& b) {
      return a.start != b.start ? a.start < b.start
                                : a.op == MoveOp::prefetch && b.op == MoveOp::offload;
    };
    std::vector<const Move*> first(trace.num_tensors(), nullptr);
    for (const Move& m : cp.plan.moves)
      if (!first[m.tensor] || earlier(m, *first[m.tensor])) first[m.tensor] = &m;
    for (TensorId t = 0; t < trace.num_tensors(); ++t) {
      if (!trace.tensors[t].persistent || recreated(t)) continue;
      if (first[t] && (first[t]->op == MoveOp::prefetch || !lifetimes.used(t))) {
        Move out = *first[t];
        out.tensor = trace_to_logical.at(t);
        cp.start_out.push_back(out);
      } else {
        cp.start_in.push_back(trace_to_logical.at(t));
      }
    }
    for (Move& m : cp.plan.moves) m.tensor = trace_to_logical.at(m.tensor);
    cp.created.assign(ops.size(), 0);
    cp.deaths.resize(ops.size());
    for (TensorId t = 0; t < trace.num_tensors(); ++t) {
      if (trace.tensors[t].persistent) continue;
      if (lifetimes.used(t) && lifetimes.first_use(t) < ops.size())
        cp.created[lifetimes.first_use(t)] += trace.tensors[t].bytes;
      const LogicalId id = trace_to_logical.at(t);
      const int64_t died_before = metas[id].last_alive_op + 1;
      if (died_before > 0 && died_before < static_cast<int64_t>(ops.size()))
        cp.deaths[died_before].push_back(id);
    }
    cp.ops = std::move(ops);
    ops.clear();
    auto& slot = plan_cache[iteration_signature];
    slot = std::move(cp);
    install(&slot);
  }

  void install(const CachedPlan* p) {
    active = p;
    engine->set_plan(p->plan, p->signatures.size());
    mode = Mode::kPlanned;
    if (p->plan.moves.empty()) {
      engine->fetch_all();  // nothing may stay out: the fast path fetches nothing
      fast.store(true, std::memory_order_relaxed);
    } else {
      fast.store(false, std::memory_order_relaxed);
    }
  }

  // Throws only for misuse, before changing anything; faults met here are the step's (end_step).
  void begin_step() {
    std::lock_guard lock(mu);
    TERAIO_CHECK(!closed, "Session.step(): the Session is closed");
    TERAIO_CHECK(!in_step, "Session.step(): a step is already running (end it first)");
    pending_error.clear();
    pending_fault.clear();
    step_faults = 0;
    step_read_faults = 0;
    step_need_bytes = 0;
    step_need_error.clear();
    step_need_hint.clear();
    collect_faults(false);  // faults met between steps were reported where they happened
    in_step = true;
    tl_step_thread = true;
    op_counter = 0;
    iter_sig = 0;
    signatures.clear();
    ops.clear();
    rec_live.clear();
#ifdef TERAIO_TORCH_CUDA
    op_events.clear();
#endif
    iteration_reactive = false;
    // Measured afresh in each profiled iteration: in the first, tensors not yet seen (parameters
    // before their first operator) are allocated but not tracked, which would count them twice.
    if (mode == Mode::kProfiling) {
      untracked_bytes = 0;
      engine->set_reserve(0);
      start_timer();
    }
    fast.store(mode == Mode::kPlanned && active && active->plan.moves.empty(),
               std::memory_order_relaxed);
    select_callbacks(fast.load(std::memory_order_relaxed));
    if (!fast.load(std::memory_order_relaxed)) {
      try {
        engine->poll();
        // Within the budget before the step begins (a failed transfer of the last step can have
        // left tensors resident), then the plan's starting point.
        engine->enforce_budget();
        engine->reset_step_peak();
        if (mode == Mode::kPlanned && active) engine->align(active->start_out, active->start_in);
      } catch (const std::exception& e) {
        note_error(e.what());  // reported by end_step; the step runs (reactively where need be)
      }
      collect_faults();
    } else {
      engine->reset_step_peak();
    }
  }

  void end_step() {
    std::unique_lock lock(mu);
    TERAIO_CHECK(in_step, "Session.step(): no step is running");
    collect_faults(true);
    in_step = false;
    tl_step_thread = false;
    last_operators = op_counter;
    fast.store(false, std::memory_order_relaxed);
    uint64_t sig = iter_sig.load();
    finish_timer();
    try {
      if (mode == Mode::kPlanned && !iteration_reactive &&
          op_counter != active->signatures.size()) {
        iteration_reactive = true;  // the iteration ended early or late: drift
        drift_events++;
      }
      if (mode == Mode::kProfiling) {
        profiled++;
        make_and_install_plan(sig, /*force=*/false);
      } else if (mode == Mode::kPlanned && iteration_reactive) {
        auto it = plan_cache.find(sig);
        if (it != plan_cache.end()) {
          install(&it->second);
        } else if (ops.size() == op_counter) {
          make_and_install_plan(sig, /*force=*/true);  // this iteration is the new shape's profile
        } else {
          engine->set_plan(Plan{}, 0);
          active = nullptr;
          mode = Mode::kProfiling;  // profile the next iteration, then plan it
          profiled = std::max(0, options.profiling_iterations - 1);
        }
      }
    } catch (const std::exception& e) {
      note_error(e.what());
      engine->set_plan(Plan{}, 0);
      active = nullptr;
      mode = Mode::kReactive;
    }
    // Forget storages that died.
    for (auto it = storages.begin(); it != storages.end();) {
      if (it->second.weak.expired()) {
        id_storage[it->second.id] = nullptr;
        it = storages.erase(it);
      } else {
        ++it;
      }
    }
    try {
      engine->poll();
    } catch (const std::exception& e) {
      note_error(e.what());
    }
    collect_faults(true);
    ops.clear();
#ifdef TERAIO_TORCH_CUDA
    op_events.clear();
#endif
    iteration++;
    std::string err = step_need_error.empty() ? std::move(pending_error)
                                              : std::move(step_need_error) + step_need_hint;
    std::string fault = std::move(pending_fault);
    const uint64_t faults = step_faults, read_faults = step_read_faults;
    pending_error.clear();
    pending_fault.clear();
    step_faults = step_read_faults = 0;
    lock.unlock();
    if (!fault.empty()) {
      if (faults > 1)
        fault += fmt::format(" (and {} more failed transfers in this step)", faults - 1);
      if (read_faults == 0)
        fault += ". Only writes failed: no data was lost and the step's results are intact (the "
                 "tensors stayed on the device)";
      throw IoError(fault, /*results_intact=*/read_faults == 0);
    }
    if (!err.empty()) throw Error(err);
  }
};

namespace {

std::atomic<Session::Impl*> g_session{nullptr};

std::unique_ptr<at::ObserverContext> on_start_cb(const at::RecordFunction& fn) {
  Session::Impl* s = g_session.load(std::memory_order_acquire);
  if (!s) return nullptr;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    tl_backward++;
    return nullptr;
  }
  if (is_range(fn)) {  // transparent (see is_range); the same test at its end
    if (is_backward_range(fn.name())) tl_backward++;
    return nullptr;
  }
  if (on_subclass(fn)) return std::make_unique<SubclassCtx>();  // transparent too
  if (tl_depth++ > 0) {
    if (is_collective(fn.name()) && s->in_step.load(std::memory_order_relaxed)) {
      std::lock_guard lock(s->mu);  // a collective nested in a top-level operator (rare)
      try {
        s->pin_collective_values(fn.inputs());
      } catch (const std::exception& e) {
        s->note_error(e.what());
      }
    }
    return nullptr;
  }
  try {
    if (s->fast.load(std::memory_order_relaxed) && s->in_step.load(std::memory_order_relaxed) &&
        (tl_step_thread || tl_backward > 0) && s->fast_path(fn)) {
      if (is_collective(fn.name())) {  // rare: pin what it was given, nothing else to do
        std::lock_guard lock(s->mu);
        s->pin_collective_values(fn.inputs());
      }
      return nullptr;
    }
    std::unique_ptr<at::ObserverContext> ctx = s->on_start(fn);
    auto* op = static_cast<OpCtx*>(ctx.get());
    tl_top = op != nullptr && op->in_step ? op : nullptr;
    return ctx;
  } catch (const std::exception& e) {
    std::lock_guard lock(s->mu);
    s->note_error(e.what());
    return nullptr;
  }
}

void on_end_cb(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    if (tl_backward > 0) tl_backward--;
    return;
  }
  if (is_range(fn)) {
    if (is_backward_range(fn.name()) && tl_backward > 0) tl_backward--;
    return;
  }
  if (ctx != nullptr && dynamic_cast<SubclassCtx*>(ctx) != nullptr) return;
  if (tl_depth > 0) tl_depth--;
  Session::Impl* s = g_session.load(std::memory_order_acquire);
  if (!s) return;
  try {
    if (ctx == nullptr) {
      if (tl_depth > 0 && tl_top != nullptr) s->on_nested_end(fn, tl_top);
      return;
    }
    if (ctx == tl_top) tl_top = nullptr;
    s->on_end(fn, static_cast<OpCtx*>(ctx));
  } catch (const std::exception& e) {
    std::lock_guard lock(s->mu);
    s->note_error(e.what());
  }
}

SessionTier::Kind tier_kind(const SessionTier& t) {
  return t.kind;
}

}  // namespace

Session::Session(SessionOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  TERAIO_CHECK(options.budget_bytes > 0, "Session: budget must be a positive size");
  TERAIO_CHECK(!options.tiers.empty(),
               "Session: at least one tier (HostTier or FileTier) is needed");
  TERAIO_CHECK(options.profiling_iterations >= 1,
               "Session: profiling_iterations must be >= 1, got {}", options.profiling_iterations);
  std::vector<runtime::EngineTier> engine_tiers;
  int host_count = 0, file_count = 0;
  for (const SessionTier& t : options.tiers) {
    TERAIO_CHECK(t.capacity_bytes > 0, "Session: a tier has no capacity");
    TierSpec spec;
    if (tier_kind(t) == SessionTier::Kind::kHost) {
      TERAIO_CHECK(host_count++ == 0, "Session: only one HostTier is supported");
      storage::HostTierOptions ho;
      ho.capacity_bytes = t.capacity_bytes;
      ho.pin = storage::cuda_device_count() > 0;
      s.tiers.push_back(storage::make_host_tier(ho));
      spec.name = "host";
      spec.read_gbps = t.read_gbps > 0 ? t.read_gbps : 20.0;
      spec.write_gbps = t.write_gbps > 0 ? t.write_gbps : 20.0;
    } else {
      TERAIO_CHECK(file_count++ == 0,
                   "Session: only one FileTier is supported (give it several paths)");
      TERAIO_CHECK(!t.paths.empty(), "Session: FileTier needs at least one directory");
      for (const std::string& p : t.paths) {
        std::error_code ec;
        TERAIO_CHECK(std::filesystem::is_directory(p, ec),
                     "Session: FileTier path '{}' is not a directory", p);
        std::string probe = p + "/.teraio-write-test-" + std::to_string(::getpid());
        {
          std::ofstream f(probe);
          TERAIO_CHECK(f.good() && (f << "x") && f.flush(),
                       "Session: FileTier path '{}' is not writable", p);
        }
        std::filesystem::remove(probe, ec);
      }
      storage::FileTierOptions fo;
      fo.paths = t.paths;
      fo.capacity_bytes = t.capacity_bytes;
      fo.checksums = options.verify;
      s.tiers.push_back(storage::make_file_tier(fo));
      spec.name = "file";
      spec.read_gbps = t.read_gbps > 0 ? t.read_gbps : 1.5;
      spec.write_gbps = t.write_gbps > 0 ? t.write_gbps : 1.5;
    }
    spec.capacity_bytes = t.capacity_bytes;
    if (options.fault_injection) {
      auto faulty = storage::make_fault_tier(std::move(s.tiers.back()), {});
      s.fault_tiers.push_back(faulty.get());
      s.tiers.back() = std::move(faulty);
    }
    engine_tiers.push_back({spec.name, s.tiers.back().get(), t.capacity_bytes});
    s.tier_specs.push_back(spec);
    const storage::TierInfo info = s.tiers.back()->info();
    SessionTierStats ts;
    ts.name = spec.name;
    ts.engine = info.engine;
    ts.read_gbps = spec.read_gbps;
    ts.write_gbps = spec.write_gbps;
    if (t.read_gbps > 0) ts.read_source = "given";
    if (t.write_gbps > 0) ts.write_source = "given";
    ts.notes = info.notes;
    s.tier_stats.push_back(std::move(ts));
  }
  s.options = std::move(options);
  s.engine = std::make_unique<runtime::Engine>(
      runtime::EngineOptions{s.options.budget_bytes, s.options.stream_ordered_offloads},
      std::move(engine_tiers));
  // Fault messages name tensors as the trace does (engine calls are made under the Session's lock).
  s.engine->set_namer([&s](runtime::LogicalId id) {
    return id < s.metas.size() ? s.metas[id].display_name() : std::string();
  });
  if (const char* log = std::getenv("TERAIO_LOG");
      log != nullptr && *log != '\0' && std::strcmp(log, "0") != 0) {
    // Every move outside the plan, with where it happened (docs/pytorch.md, "Diagnostics"). The
    // engine calls this under the Session's lock (every engine call is made holding it).
    s.engine->set_event_hook([&s](std::string_view what, runtime::LogicalId id, uint64_t bytes) {
      const TensorMeta* m = id < s.metas.size() ? &s.metas[id] : nullptr;
      const std::string name = m ? m->display_name() : std::to_string(id);
      std::fprintf(stderr, "teraio: iteration %llu op %u (%s): %.*s %s (%s)\n",
                   static_cast<unsigned long long>(s.iteration), s.op_counter.load() - 1,
                   mode_name(s.mode), static_cast<int>(what.size()), what.data(), name.c_str(),
                   format_bytes(double(bytes)).c_str());
    });
  }
  Impl* expected = nullptr;
  TERAIO_CHECK(g_session.compare_exchange_strong(expected, &s),
               "Session: another teraio.Session is active in this process; close it first");
  s.handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_start_cb, &on_end_cb)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  s.lean_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_start_cb, &on_end_cb)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  at::disableCallback(s.lean_handle);
}

Session::~Session() {
  if (!impl_) return;
  try {
    close();
  } catch (...) {  // reported to whoever called close(); a destructor cannot
  }
}

void Session::close() {
  Impl& s = *impl_;
  std::unique_lock lock(s.mu);
  if (s.closed) return;
  s.closed = true;
  at::removeCallback(s.handle);
  at::removeCallback(s.lean_handle);
  Impl* self = &s;
  g_session.compare_exchange_strong(self, nullptr, std::memory_order_acq_rel);
  s.in_step = false;
  s.fast.store(false, std::memory_order_relaxed);
  std::string first;
  size_t failed = 0;
  try {
    s.engine->fetch_all();  // nothing is left without its bytes ...
    for (runtime::Fault& f : s.engine->take_faults()) {
      if (first.empty()) first = std::move(f.message);
      failed++;
    }
    // ... and what could not come back is lost now, loudly: its tier goes away.
    s.engine->abandon("could not be read back before the Session closed and its tier files were "
                      "removed; its contents are lost");
  } catch (const std::exception& e) {
    if (first.empty()) first = e.what();
    failed++;
  }
  s.closed_stats = s.engine->stats();
  s.engine.reset();
  for (auto& t : s.tiers) t->shutdown(storage::ShutdownMode::kDrain);
  s.fault_tiers.clear();
  s.tiers.clear();  // removes the tier files
  if (!first.empty()) s.last_error = first;
  lock.unlock();
  if (failed > 0)
    throw IoError(fmt::format("Session.close(): {} tensor(s) could not be brought back: {}", failed,
                              first));
}

void Session::inject_fault(size_t tier, const storage::FaultRule& rule) {
  std::lock_guard lock(impl_->mu);
  TERAIO_CHECK(impl_->options.fault_injection,
               "inject_fault: the Session was made without fault_injection=True");
  TERAIO_CHECK(tier < impl_->fault_tiers.size(), "inject_fault: tier {} does not exist ({} tiers)",
               tier, impl_->fault_tiers.size());
  impl_->fault_tiers[tier]->inject(rule);
}

void Session::clear_faults() {
  std::lock_guard lock(impl_->mu);
  for (storage::FaultTier* t : impl_->fault_tiers) t->clear_faults();
}

void Session::begin_step() {
  impl_->begin_step();
}
void Session::end_step() {
  impl_->end_step();
}

void Session::fetch_all() {
  std::unique_lock lock(impl_->mu);
  TERAIO_CHECK(!impl_->closed, "Session.fetch_all(): the Session is closed");
  impl_->engine->fetch_all();
  std::string first;
  size_t failed = 0;
  for (runtime::Fault& f : impl_->engine->take_faults()) {
    impl_->last_error = f.message;
    if (first.empty()) first = std::move(f.message);
    failed++;
  }
  lock.unlock();
  if (failed > 0)
    throw IoError(fmt::format("fetch_all: {} tensor(s) could not be brought back: {}", failed, first));
}

void Session::name_tensor(const at::Tensor& t, const std::string& name, const std::string& kind) {
  TensorKind k;
  TERAIO_CHECK(parse_tensor_kind(kind, &k), "name_tensor: unknown kind '{}'", kind);
  if (!t.defined() || !t.has_storage()) return;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->storages.find(t.storage().unsafeGetStorageImpl());
  if (it == impl_->storages.end()) return;  // not (yet) tracked
  TensorMeta& m = impl_->metas[it->second.id];
  m.name = name;
  m.named_kind = k;
}

SessionStats Session::stats() const {
  std::lock_guard lock(impl_->mu);
  const Impl& s = *impl_;
  runtime::EngineStats e = s.engine ? s.engine->stats() : s.closed_stats;
  SessionStats r;
  r.mode = mode_name(!s.options.planning && s.mode == Mode::kProfiling ? Mode::kReactive : s.mode);
  r.iteration = s.iteration;
  r.budget_bytes = s.options.budget_bytes;
  r.peak_resident_bytes = e.peak_resident_bytes;
  r.step_peak_resident_bytes = e.step_peak_resident_bytes;
  r.untracked_bytes = s.untracked_bytes;
  r.plan_budget_bytes = s.plan_budget_bytes;
  r.plan_variant = s.plan_variant;
  r.predicted_iteration_us = s.predicted_iteration_us;
  r.kernel_timing = s.kernel_timing;
  r.profiled_kernel_us = s.profiled_kernel_us;
  r.profiled_event_us = s.profiled_event_us;
  r.resident_bytes = e.resident_bytes;
  r.pinned_bytes = e.pinned_bytes;
  r.bytes_offloaded = e.bytes_offloaded;
  r.bytes_prefetched = e.bytes_prefetched;
  r.stall_us = e.stall_us;
  r.plan_moves = e.plan_moves;
  r.skipped_moves = e.skipped_moves;
  r.aligned_moves = e.aligned;
  r.stream_ordered_offloads = e.stream_ordered;
  r.drift_events = s.drift_events;
  r.urgent_fetches = e.urgent_fetches;
  r.evictions = e.evictions;
  r.operators = s.last_operators;
  r.tracked_tensors = s.storages.size();
  r.plans_cached = s.plan_cache.size();
  r.budget_violations = s.budget_violations;
  r.failed_transfers = e.failed_transfers;
  r.retried_reads = e.retried_reads;
  r.lost_tensors = e.lost_tensors;
  r.last_error = s.last_error;
  r.tiers = s.tier_stats;
  return r;
}

const SessionOptions& Session::options() const {
  return impl_->options;
}

}  // namespace teraio
