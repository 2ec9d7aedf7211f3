// teraio::Session (include/teraio/session.h): the only C++ that touches PyTorch internals besides
// the Python binding. A global at::RecordFunction callback sees every top-level operator on every
// thread; tensors are identified by StorageImpl (held weakly) and given logical ids that repeat
// every iteration (first appearance: operator ordinal + slot). Bytes move by swapping the storage's
// DataPtr (views stay valid); an absent storage has a null DataPtr, so a kernel reaching it through
// an unobserved path fails loudly instead of reading garbage. What does not need torch (the trace,
// modes, drift, plans, the budget policy, the step's errors) is src/offload's Controller, called
// here at step and operator boundaries with logical ids (docs/architecture.md).
#include "teraio/session.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>
#ifdef TERAIO_TORCH_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "controller.h"
#include "engine.h"
#include "kernel_timer.h"
#include "recorder.h"
#include "step_marks.h"
#include "teraio/error.h"
#include "teraio/storage.h"
#include "teraio/units.h"

namespace teraio {

namespace {

using runtime::LogicalId;


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
  // Installs bytes made by a recompute (Note [Recompute in the engine]): like attach(), with bytes
  // that were never held here.
  void install(at::DataPtr bytes) {
    held_ = std::move(bytes);
    attach();
  }
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
  // Note [Lent bytes]: a writeback (Note [Writebacks in the engine]) copies the storage's bytes
  // while the tensor keeps using them. The copy reads them on the tier's side (a copy stream, an
  // I/O thread) until the engine calls end_view(), so the storage is held by a strong reference
  // until then: if the tensor dies meanwhile (user code, drift, a reactive step) its DataPtr is not
  // freed, so the CUDA caching allocator cannot hand the block to another tensor while the copy
  // reads it, and on CPU the copy never reads freed memory. While lent, alive() stays true (the
  // engine waits for the copy before it forgets the tensor); it turns false at end_view() when the
  // tensor died meanwhile, and an offload, drop or discard that waited for the copy checks it again
  // (settle_writeback_alive_locked), so that it never detaches a dead storage. An offload that takes
  // the running copy over (Note [An offload takes over its writeback's copy] in engine.cpp) detaches
  // first and ends the view after: held_ then keeps the bytes until the write has ended, and a
  // storage only the view kept alive is detached harmlessly (its DataPtr moves to held_). A write while the
  // copy runs is reported by note_writes at the end of its operator, before the tensor is unpinned
  // (an offload needs it unpinned): a copy still in flight is then stale, and one already settled
  // as clean loses that (release_clean_copy_locked), before anything could take it as clean.
  // Taking and dropping lent_ moves the refcount as weak_.lock() in alive() does (with a Python
  // storage object alive, PyTorch increfs and decrefs it then). An owner that frees the bytes
  // themselves from Python (FSDP2's untyped_storage().resize_(0)) waits for the copy first (Note
  // [Storages their owner resizes]); one that does it in C++ behind the dispatcher frees them under
  // the copy (the storage then counts as replaced and the copy is discarded, but it read freed
  // memory).
  std::optional<storage::BufferView> view() override {
    TERAIO_INTERNAL_ASSERT(!lent_, "a second view() before end_view()");
    auto s = weak_.lock();
    if (!s || replaced(*s) || held_) return std::nullopt;
    void* p = s->_mutable_data_ptr_no_checks().get();
    if (p == nullptr) return std::nullopt;
    lent_ = std::move(s);
    return view(p);
  }
  void end_view() override { lent_.reset(); }

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
  // The storage while a writeback's copy reads its bytes (Note [Lent bytes]).
  c10::intrusive_ptr<c10::StorageImpl> lent_;
};

struct Binding {
  Binding(c10::StorageImpl* s, LogicalId i)
      : weak(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s)), id(i) {}
  c10::weak_intrusive_ptr<c10::StorageImpl> weak;
  LogicalId id = 0;
};

struct Capture;  // Note [Recipes from the dispatcher]

// Note [Operators that draw random numbers]: the recorder rules out rerunning an operator whose
// name says it draws random numbers (Note [Rerunnable operators] in recorder.cpp), but a composite
// may draw them inside without any nested operator saying so: scaled_dot_product_attention with
// dropout_p > 0 runs its dropout inside the CPU flash kernel. Rerun, it would make a new mask, and
// the step would silently differ from the run without teraio. So in recorded steps the default
// generators' positions are taken at each operator's start and compared at its end: the CPU
// generator's (its Mersenne twister's counters and two state words, which every draw or refill
// moves) and, on CUDA, the device's (its Philox offset). Whatever an operator made while one moved
// is not recomputable. A generator passed explicitly is an argument of an operator whose name
// already rules it out (rand*, normal, bernoulli, ...).
struct RngMark {
  int cpu_left = 0;
  uint32_t cpu_next = 0, cpu_first = 0, cpu_last = 0;
  uint64_t cuda_offset = 0;
  bool operator==(const RngMark&) const = default;
};

RngMark rng_mark(const std::optional<c10::Device>& device) {
  RngMark m;
  {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(cpu.mutex());
    const at::mt19937_data_pod d = cpu.get<at::CPUGeneratorImpl>()->engine().data();
    m.cpu_left = d.left_;
    m.cpu_next = d.next_;
    m.cpu_first = d.state_.front();
    m.cpu_last = d.state_.back();
  }
#ifdef TERAIO_TORCH_CUDA
  if (device && device->is_cuda()) {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device->index());
    std::lock_guard lock(gen.mutex());
    m.cuda_offset = gen.get_offset();
  }
#else
  (void)device;
#endif
  return m;
}

struct OpCtx final : at::ObserverContext {
  uint32_t k = 0;
  bool in_step = false;
  // Outputs of operators nested in this one (a composite's internals): tensors autograd saves
  // from inside, such as the attention probabilities of SDPA's math path, exist from here on but
  // no top-level operator names them before the backward pass. They are tracked from their birth.
  uint32_t nested = 0;
  std::vector<LogicalId> nested_outs;
  std::vector<LogicalId> ids;  // pinned inputs
  // Recording: the inputs' version counters and their versions at the start (Note [Recomputable
  // tensors] in recorder.cpp), and whether an input could not be watched (untracked).
  std::vector<std::tuple<LogicalId, c10::VariableVersion, uint32_t>> versions;
  // Every operator: its tracked inputs' version counters at the start, and those that cannot be
  // watched (no counter): the writes the engine must hear of (Note [Clean offloads] in engine.cpp).
  std::vector<std::tuple<LogicalId, c10::VariableVersion, uint32_t>> watched;
  std::vector<LogicalId> unwatched;
  bool untracked_input = false;
  double t0_us = 0;
  // Note [Host times of a recording]: the host time before this operator's callback since the
  // previous operator's ended, and the nested callbacks' time at its start (tl_nested_hook_us).
  double gap_us = 0;
  double nested_hook_us0 = 0;
  int64_t allocator_syncs0 = -1;  // allocator_syncs() at its start (CUDA recordings)
  // Recording on CUDA: it reads a value of a device tensor back to the host (waits_for_device,
  // with an input on the device), which queues behind the device-to-host copies issued before it.
  bool reads_back = false;
  uint64_t timer_token = 0;  // nonzero while the KernelTimer attributes this thread's work to it
  bool violation = false;  // the budget could not be met at this operator (reported once)
  // A planned step's capture for the outputs a recompute makes again (Note [Recipes from the
  // dispatcher]); null when none of its outputs is.
  std::shared_ptr<const Capture> capture;
  std::vector<LogicalId> captures;
  bool recording = false;  // its step is recorded
  std::optional<RngMark> rng;  // recording: the generators at its start (Note [Operators that draw random numbers])
  // Note [Nested producers] (recorder.cpp): per tensor made inside this operator, the operator
  // nested in it that made it, while recording or when a recompute needs it.
  struct Nested {
    LogicalId id = 0;
    std::string op;
    std::vector<LogicalId> inputs;  // tracked, made before this operator
    bool usable = false;            // false: an input not so, or written after it was made
    std::shared_ptr<const Capture> capture;  // planned steps: rerunning the nested operator
    uint32_t slot = 0;                       // the tensor's place among its results
    at::Tensor tensor;
  };
  std::vector<Nested> nested_made;
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

// Note [Host times of a recording]: the caching allocator's calls that wait for the device. A
// cudaMalloc that fails makes it free its cached blocks and retry (num_alloc_retries); freeing a
// cached block is a cudaFree, which waits for all the device's work (num_device_free); it also
// synchronises every stream's pending frees (num_sync_all_streams). Their sum only grows.
int64_t allocator_syncs(c10::DeviceIndex device) {
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  return s.num_alloc_retries + s.num_device_free + s.num_sync_all_streams;
}
#endif

thread_local int tl_depth = 0;     // nesting of observed operators on this thread
thread_local OpCtx* tl_top = nullptr;  // the running top-level step operator on this thread
thread_local int tl_backward = 0;  // inside an autograd node on this thread
// Host time this thread spent in the callbacks of nested operators (Note [Host times of a
// recording]): not the operator's own host time.
thread_local double tl_nested_hook_us = 0;
// The thread that began the step. Operators of the step are those of this thread and of autograd
// nodes (backward on autograd's device threads); other threads (a DataLoader's pin-memory thread)
// are treated as outside the step, so they neither shift operator indices nor get tracked.
thread_local bool tl_step_thread = false;

// Operators whose host side waits for the device to finish what it has queued (Note [Host times of
// a recording]): a value read back to the host, or an output whose size depends on the data.
bool waits_for_device(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero",
      "aten::masked_select", "aten::equal", "aten::allclose", "aten::unique", "aten::_unique",
      "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim"};
  for (std::string_view n : kNames)
    if (name == n) return true;
  return false;
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

// Note [Recipes from the dispatcher]: the torch side of Note [Recompute in the engine]. When a
// planned step runs an operator whose output a later recompute makes again (Controller::captures),
// its start captures what rerunning it needs: the dispatcher operator, a copy of its boxed
// arguments (references to the input tensors, which the plan keeps alive until the recompute:
// docs/formats.md, rule 12), the thread's dispatch key state (autocast on or off, a Python mode)
// and autocast's dtypes, and the version counters of its input tensors. Its end gives each such
// output a recipe naming the output's place among the results, its version and its geometry. A run
// calls the operator through the dispatcher from the top, with that dispatch state, without
// autograd (grad mode off: nothing records a graph), without autocast's weight cache (the cast is
// made again and freed, instead of landing in a cache that this thread would never clear), and with
// RecordFunction off (the Session's own callbacks must not see it, and it is not the step's
// operator). The same kernel on the same inputs with the same dispatch state makes the same bytes;
// the output's storage then gives its DataPtr to the tensor's storage, so views and autograd's saved
// tensors see them without a copy. Checked, else the run fails (the engine loses the tensor, loudly):
// the output exists, its geometry and byte count are those captured. stale() compares the version
// counters: any in-place write to an input or to the tensor since the capture (views share their
// base's counter) means a rerun would not give the tensor's bytes.
struct Capture {
  explicit Capture(c10::OperatorHandle handle)
      : op(std::move(handle)), keys(c10::impl::tls_local_dispatch_key_set()) {}
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
  std::vector<LogicalId> inputs;  // the tracked ones (the operator's pinned inputs)
  c10::impl::LocalDispatchKeySet keys;
  at::ScalarType autocast_cuda = at::kHalf, autocast_cpu = at::kBFloat16;
  std::vector<std::pair<c10::VariableVersion, uint32_t>> versions;  // inputs', at the start
};

class TorchRecipe final : public runtime::Recipe {
 public:
  TorchRecipe(std::shared_ptr<const Capture> capture, uint32_t slot, const at::Tensor& out)
      : capture_(std::move(capture)),
        slot_(slot),
        version_(out.unsafeGetTensorImpl()->version_counter()),
        at_version_(version_.current_version()),
        sizes_(out.sizes().vec()),
        strides_(out.strides().vec()),
        offset_(out.storage_offset()),
        dtype_(out.scalar_type()) {}

  std::span<const LogicalId> inputs() const override { return capture_->inputs; }

  std::string stale() const override {
    for (const auto& [vc, v] : capture_->versions)
      if (vc.current_version() != v)
        return fmt::format("an input of its producer ({}) was written in place since it ran",
                           capture_->op.operator_name().name);
    if (version_.current_version() != at_version_) return "it was written in place since it was made";
    return {};
  }

  std::string run(runtime::Memory& memory) override {
    at::DisableRecordFunctionGuard no_callbacks;
    c10::impl::ForceDispatchKeyGuard keys(capture_->keys);
    at::NoGradGuard no_grad;
    const at::ScalarType cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    const at::ScalarType cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_dtype(at::kCUDA, capture_->autocast_cuda);
    at::autocast::set_autocast_dtype(at::kCPU, capture_->autocast_cpu);
    at::autocast::set_autocast_cache_enabled(false);
    struct Restore {
      at::ScalarType cuda, cpu;
      bool cache;
      ~Restore() {
        at::autocast::set_autocast_dtype(at::kCUDA, cuda);
        at::autocast::set_autocast_dtype(at::kCPU, cpu);
        at::autocast::set_autocast_cache_enabled(cache);
      }
    } restore{cuda_dtype, cpu_dtype, cache};
    std::vector<c10::IValue> stack(capture_->args.begin(), capture_->args.end());
    capture_->op.callBoxed(stack);
    at::Tensor out;
    uint32_t slot = 0;
    for (const c10::IValue& v : stack)
      visit_tensors(v, [&](const at::Tensor& t) {
        if (slot++ == slot_) out = t;
      });
    const std::string op = capture_->op.operator_name().name;
    if (!out.defined() || !out.has_storage())
      return fmt::format("rerunning {} did not return output {}", op, slot_);
    c10::StorageImpl* si = out.storage().unsafeGetStorageImpl();
    if (si->nbytes() != memory.bytes() || out.sizes() != at::IntArrayRef(sizes_) ||
        out.strides() != at::IntArrayRef(strides_) || out.storage_offset() != offset_ ||
        out.scalar_type() != dtype_)
      return fmt::format(
          "rerunning {} returned output {} with another shape, layout or size ({} bytes, {}) than "
          "it had ({} bytes, {})",
          op, slot_, si->nbytes(), fmt::join(out.sizes(), "x"), memory.bytes(),
          fmt::join(sizes_, "x"));
    static_cast<StorageMemory&>(memory).install(si->set_data_ptr(at::DataPtr(nullptr, si->device())));
    return {};
  }

 private:
  std::shared_ptr<const Capture> capture_;
  uint32_t slot_;
  c10::VariableVersion version_;
  uint32_t at_version_;
  std::vector<int64_t> sizes_, strides_;
  int64_t offset_;
  at::ScalarType dtype_;
};

// An operator on a tensor subclass that dispatches in Python (__torch_dispatch__: DTensor, so
// FSDP2's sharded parameters, their gradients and optimizer states) holds no memory of its own:
// its subclass implementation runs operators on the inner tensors, nested in it, and those read and
// write the real storages. It is transparent too, so that those operators are the top-level ones
// and their inputs are made resident. Decided at its start (the inputs are only valid then: at its
// end they refer to a stack that now holds its outputs); its end knows it by its context.
struct SubclassCtx final : at::ObserverContext {};

// An operator nested in a top-level step operator, while the Session notes which nested operator
// makes each tensor made inside the top-level one (Note [Nested producers] in
// src/offload/recorder.cpp). Taken at its start: a RecordFunction's inputs are gone at its end.
struct NestedCtx final : at::ObserverContext {
  // Note [Tensors nested operators read]: tracked tensors it reads that were made resident and
  // pinned for it alone (released at its end); with a top-level operator, they are the latter's.
  std::vector<LogicalId> pinned;
  bool producers = false;  // the fields below are filled (Note [Nested producers])
  std::vector<c10::StorageImpl*> input_storages;  // of every tensor input
  std::vector<LogicalId> inputs;                  // the tracked ones
  bool usable = true;  // every tensor input tracked, watchable, on the device, made before the top
  std::vector<c10::StorageImpl*> written;         // arguments its schema writes
  std::shared_ptr<const Capture> capture;         // planned steps: what rerunning it needs
};
// Whether a storage's bytes are away (offloaded, or freed for a recompute): it keeps its size
// with a null DataPtr. Read without the checks an offloaded storage makes throw (Note [Refused
// tensors]).
bool bytes_away(c10::StorageImpl& s) {
  return s.nbytes() > 0 && s._mutable_data_ptr_no_checks().get() == nullptr;
}

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

// The binding of one Session to PyTorch: storages to logical ids, operator callbacks, CUDA timing
// and allocator statistics, tier bandwidth probes. The policy (modes, drift, plans, budget, the
// step's errors) is the controller's (src/offload/controller.h), the trace the recorder's.
struct Session::Impl final : offload::StepBinding {
  SessionOptions options;
  std::vector<std::unique_ptr<storage::Tier>> tiers;
  std::vector<storage::FaultTier*> fault_tiers;  // with options.fault_injection: tiers[i]'s wrapper
  std::unique_ptr<runtime::Engine> engine;
  // Lives as long as the Impl; after close() (engine gone) only its state is read (stats).
  std::unique_ptr<offload::Controller> ctl;

  // ---- Tier bandwidth (docs/pytorch.md, "Tier bandwidth") ----
  // What the planner uses per tier (the controller's tier specs) and where it comes from. Tiers
  // without a given bandwidth are measured once, by measure_tiers, when the first step's first
  // operator names the device: nothing is bound to the engine yet, so the first bytes of every tier
  // are free for the probe, and the plan (made after profiling) uses the numbers.
  std::vector<SessionTierStats> tier_stats;
  bool tiers_measured = false;
  // The probe sets the figures the controller plans with (ctl->tier(i)) and says where they came
  // from in tier_stats; stats() reads the figures from the controller, which may correct them
  // later (Note [Plans for the link in use]).
  void measure_tiers(at::Allocator* allocator) {
    if (tiers_measured) return;
    tiers_measured = true;
    std::vector<size_t> todo;
    for (size_t i = 0; i < tier_stats.size(); ++i)
      if (tier_stats[i].read_source != "given" || tier_stats[i].write_source != "given")
        todo.push_back(i);
    // What was not given may be corrected from the rates in use (Note [Plans for the link in use]).
    for (size_t i = 0; i < tier_stats.size(); ++i)
      ctl->set_link_measured(i, tier_stats[i].read_source != "given",
                             tier_stats[i].write_source != "given",
                             tier_stats[i].duplex_source != "given");
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
      TierSpec& spec = ctl->tier(i);
      storage::BandwidthProbeOptions po = storage::quick_probe_options(tiers[i]->info());
      po.ready_stream = current_stream(*device);
      try {
        const storage::BandwidthProbe p = storage::probe_bandwidth(
            *tiers[i], view, 0, std::min(storage::kQuickProbeTierBytes, spec.capacity_bytes), po);
        const storage::TierInfo info = tiers[i]->info();
        if (ts.read_source != "given") {
          spec.read_gbps = storage::planned_gbps(p.read_gbps, info);
          ts.read_source = "measured";
        }
        if (ts.write_source != "given") {
          spec.write_gbps = storage::planned_gbps(p.write_gbps, info);
          ts.write_source = "measured";
        }
        if (ts.duplex_source != "given") {  // measured both ways, else the default fraction
          const double both_gbps = storage::planned_gbps(p.both_gbps, info);
          const bool both = p.both_passes > 0 && both_gbps > 0;
          spec.duplex_gbps =
              both ? both_gbps : default_duplex_gbps(spec.read_gbps, spec.write_gbps);
          ts.duplex_source = both ? "measured" : "default";
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
        ctl->note_error(fmt::format(
            "{}; the {} tier cannot move bytes. Fix the tier (its path, space, permissions), or "
            "give its read_gbps and write_gbps to skip the probe",
            e.what(), ts.name));
      }
    }
  }

  mutable std::mutex mu;
  std::optional<c10::Device> device;

  std::unordered_map<c10::StorageImpl*, Binding> storages;
  std::vector<c10::StorageImpl*> id_storage;  // by logical id (null: none bound now)

#ifdef TERAIO_TORCH_CUDA
  // Per recorded operator: events around it on its stream (its device time).
  std::vector<std::shared_ptr<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>>> op_events;
#endif
  // Note [Kernel times from CUPTI] (kernel_timer.h): while recording on CUDA, each operator's GPU
  // time comes from CUPTI (by the operator's token); the events stay as the fallback and as the
  // measure of what they overcount.
  std::unique_ptr<KernelTimer> timer;
  uint64_t timer_tokens = 0;
  std::vector<uint64_t> op_tokens;  // per recorded operator (0: none)
  std::string timing = "host clock";  // how the last recording's operators were timed
  // The last recording's device times, resolved once when it ends (finish_timer): per recorded
  // operator CUPTI's time, else its events' (negative: none, the host clock's time stands).
  std::vector<double> op_device_us;
  double event_us_sum = 0;  // the last recording's operators timed with events (CUDA)
  // Operators of the recording under way / of the last one whose body waited for the device in the
  // caching allocator (Note [Host times of a recording]): stats()["profiled_allocator_waits"].
  uint64_t allocator_wait_ops = 0, profiled_allocator_waits = 0;
  std::atomic<double> hook_us{0};  // host time inside the operator callbacks (stats()["hook_us"])
  // The part of it inside the controller's begin_operator / end_operator (stats()["controller_us"]).
  std::atomic<double> controller_us{0};
  double runner_host_us() const override {
    return hook_us.load(std::memory_order_relaxed);
  }
  // When the last step operator's callbacks ended, or the step began (Note [Host times of a
  // recording]).
  std::atomic<double> last_op_exit_us{0};

  // Begins timing operators with CUPTI at a recording's first operator on CUDA; when it cannot,
  // `timing` says why and events time them.
  void start_timer() {
#ifdef TERAIO_TORCH_CUDA
    if (timer || !measuring_device()) return;
    std::string why;
    if (torch::autograd::profiler::isProfilerEnabledInMainThread())
      why = "torch.profiler is running (it holds CUPTI)";
    else
      timer = KernelTimer::start(&why);
    if (!timer) timing = "CUDA events (" + why + ")";
#endif
  }

  // Ends a recording's timing (before its trace is built): waits for the device, takes CUPTI's
  // times and the events', and resolves each recorded operator's device time (op_device_us).
  void finish_timer() {
    op_device_us.clear();
#ifdef TERAIO_TORCH_CUDA
    std::optional<std::unordered_map<uint64_t, double>> cupti;
    if (timer) {
      std::string why;
      try {
        c10::cuda::device_synchronize();
        cupti = timer->finish(&why);
      } catch (const std::exception& e) {
        why = e.what();
      }
      timer.reset();
      timing = cupti ? "CUPTI" : "CUDA events (" + why + ")";
    }
    op_device_us.assign(op_events.size(), -1.0);
    event_us_sum = 0;
    profiled_allocator_waits = allocator_wait_ops;
    allocator_wait_ops = 0;
    for (size_t k = 0; k < op_events.size(); ++k) {
      if (!op_events[k]) continue;  // spliced from an earlier profile: its time is final
      op_events[k]->second.synchronize();
      const double events_us = 1000.0 * op_events[k]->first.elapsed_time(op_events[k]->second);
      event_us_sum += events_us;
      op_device_us[k] = events_us;
      if (cupti) {
        auto it = cupti->find(k < op_tokens.size() ? op_tokens[k] : 0);
        op_device_us[k] = it != cupti->end() ? it->second : 0.0;  // no GPU work: it launched none
      }
    }
#endif
  }

  bool measuring_device() const {
#ifdef TERAIO_TORCH_CUDA
    return device && device->is_cuda();
#else
    return false;
#endif
  }
  bool closed = false;
  uint64_t owner_resizes = 0;         // Note [Storages their owner resizes]
  runtime::EngineStats closed_stats;  // the engine's last stats, after close()

  // Two registrations of the same callbacks: `handle` sees inputs and outputs (profiling, plans
  // with moves, reactive steps); `lean_handle` sees inputs only, for planned steps with an empty
  // plan, where only the drift check runs (PyTorch then does not box every operator's outputs).
  // Exactly one is enabled; the controller switches them at step start and on drift.
  at::CallbackHandle handle = 0;
  at::CallbackHandle lean_handle = 0;
  bool lean_active = false;
  void use_lean_hooks(bool lean) override {
    if (lean == lean_active) return;
    // The new one first: an operator may see both (nesting makes the second a no-op), none never.
    at::reenableCallback(lean ? lean_handle : handle);
    at::disableCallback(lean ? handle : lean_handle);
    lean_active = lean;
  }

  // ---- offload::TensorSource ----
  bool alive(LogicalId id) const override {
    c10::StorageImpl* si = id < id_storage.size() ? id_storage[id] : nullptr;
    if (si == nullptr) return false;
    auto it = storages.find(si);
    return it != storages.end() && !it->second.weak.expired();
  }
  std::vector<LogicalId> live_tensors() const override {
    std::vector<LogicalId> out;
    for (const auto& [si, b] : storages)
      if (!b.weak.expired()) out.push_back(b.id);
    return out;
  }
#ifdef TERAIO_TORCH_CUDA
  // Note [Steps timed on the device] (controller.cpp): the steps' end marks not yet paired.
  offload::StepMarks<at::cuda::CUDAEvent> step_marks;
#endif
  bool mark_step_end(uint64_t label, std::vector<std::pair<uint64_t, double>>* periods) override {
#ifdef TERAIO_TORCH_CUDA
    if (!measuring_device()) return false;
    try {
      at::cuda::CUDAEvent e(cudaEventDefault);  // timing enabled
      e.record(c10::cuda::getCurrentCUDAStream(device->index()));
      step_marks.add(
          label, std::move(e), [](const at::cuda::CUDAEvent& m) { return m.query(); },
          [](const at::cuda::CUDAEvent& a, const at::cuda::CUDAEvent& b) { return 1e3 * a.elapsed_time(b); },
          periods);
    } catch (const std::exception&) {
      step_marks.clear();  // CUDA could not say: no period this time, the next marks start afresh
    }
    return true;
#else
    (void)label;
    (void)periods;
    return false;
#endif
  }
  bool host_times() const override { return measuring_device(); }
  double operator_time_us(size_t k, double host_us) const override {
    return k < op_device_us.size() && op_device_us[k] >= 0 ? op_device_us[k] : host_us;
  }
  std::string kernel_timing() const override {
    return measuring_device() ? timing : std::string("host clock");
  }
  std::string device_name() const override { return device ? device->str() : std::string("cpu"); }

  // Returns true when the operator was fully handled by the fast path.
  bool fast_path(const at::RecordFunction& fn) {
    uint64_t sig = std::hash<std::string_view>()(fn.name());
    for (const c10::IValue& v : fn.inputs())
      visit_tensors(v, [&](const at::Tensor& t) {
        if (t.defined())
          for (int64_t d : t.sizes()) sig = offload::mix(sig, static_cast<uint64_t>(d));
      });
    uint32_t k = 0;
    if (ctl->try_fast(sig, &k)) return true;
    ShapeOf shape(fn);
    std::lock_guard lock(mu);
    // false: the full path handles this operator (and the rest of the iteration)
    return ctl->drift_at(k, sig, shape.shape(), *this);
  }

  // An operator's shape (offload::OperatorShape: Note [Smaller shapes on a larger shape's plan] in
  // src/offload/controller.cpp): its name and each defined input tensor's rank and dtype hashed,
  // and their sizes, in the order the signature takes them.
  struct ShapeOf {
    explicit ShapeOf(const at::RecordFunction& fn) : form(std::hash<std::string_view>()(fn.name())) {
      for (const c10::IValue& v : fn.inputs())
        visit_tensors(v, [&](const at::Tensor& t) { add(t); });
    }
    explicit ShapeOf(std::string_view name) : form(std::hash<std::string_view>()(name)) {}
    void add(const at::Tensor& t) {
      if (!t.defined()) return;
      form = offload::mix(form, static_cast<uint64_t>(t.dim()) << 8 | static_cast<uint64_t>(t.scalar_type()));
      for (int64_t d : t.sizes()) dims.push_back(d);
    }
    offload::OperatorShape shape() const { return {form, dims}; }
    uint64_t form;
    c10::SmallVector<int64_t, 16> dims;
  };

  // Tensors given to a collective stay resident for the rest of the Session: the engine never
  // offloads them again (Engine::pin_permanently; the storage keeps its DataPtr, so the address
  // gloo or NCCL was given stays valid until the Work completes, whenever that is). The trace lists
  // them at every operator where they are pinned (Note [Trace of a recording]), so plans neither
  // move them nor count on their memory there. Untracked tensors (too small, another device, or
  // seen outside a step before ever being tracked) are never moved anyway. Pinning for the rest of
  // the Session rather than until the Work completes keeps this simple and safe whatever waits for
  // the Work; the cost is that those tensors (DDP's gradient buckets) are never offloaded.
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
    // A storage without bytes (one FSDP2 holds empty, one teraio lost or discarded whose owner
    // keeps the tensor) has nothing to move: binding it would detach a null pointer.
    if (!bind || si->allocator() == nullptr || si->nbytes() < options.min_tensor_bytes ||
        si->_mutable_data_ptr_no_checks().get() == nullptr)
      return std::nullopt;
    offload::Recorder& rec = ctl->recorder();
    const LogicalId id = rec.id_for_key(key, *this);
    if (id >= id_storage.size()) id_storage.resize(id + 1, nullptr);
    if (c10::StorageImpl* old = id_storage[id]) storages.erase(old);
    engine->bind(id, std::make_unique<StorageMemory>(si, *device));
    storages.emplace(si, Binding(si, id));
    id_storage[id] = si;
    rec.note_bound(id, key, si->nbytes(), t.requires_grad() && !t.grad_fn());
    return id;
  }

  // Note [Adopted tensors]: in the first step a tensor that exists already (a parameter) is bound
  // only at its first operator, and until then the device memory it takes is untracked: nothing
  // can move it, so a budget below the parameters' bytes failed at the first operator that needed
  // room ("... plus N of device memory used outside tracked tensors"), although a plan that streams
  // the parameters would fit. The Python Session adopts what its watched models and optimizers hold
  // at the start of the first step after watch() (parameters, their gradients, and optimizer
  // states that exist already, as after loading a checkpoint): they are bound here, resident and
  // unused, under keys of a pseudo-operator
  // past every real one (kAdopted, the slot the tensor's place in the list), so that the reactive
  // step can offload them before their first use, least recently bound first. A tensor no
  // operator uses in an iteration is already a persistent tensor no kernel uses in the trace (Note
  // [Trace of a recording]). The first adopted parameter names the device, as the first step's
  // first parameter input does otherwise (on_start).
  // The Session's device is the first step's first parameter's (a leaf that requires grad):
  // named once, when the step's first operator or adopt() meets one; the tiers are measured then.
  void name_device(const at::Tensor& t) {
    if (device || !t.requires_grad() || t.grad_fn()) return;
    device = t.device();
    ctl->set_device_margin(measuring_device());
    measure_tiers(t.storage().unsafeGetStorageImpl()->allocator());
  }
  static constexpr uint32_t kAdopted = std::numeric_limits<uint32_t>::max();
  uint32_t adopted_slots = 0;
  void adopt(const std::vector<at::Tensor>& tensors) {
    TERAIO_CHECK(ctl->in_step(), "Session.adopt: call it inside a step (after begin_step)");
    for (const at::Tensor& t : tensors) {
      // A tensor subclass (FSDP2's DTensor parameters) is watched through the plain tensors its
      // operators see, as on_subclass does; a storage without bytes (FSDP2 frees unsharded
      // parameters with resize_(0)) has nothing to move.
      if (!t.defined() || !t.has_storage() || t.unsafeGetTensorImpl()->is_python_dispatch()) continue;
      c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
      if (si->_mutable_data_ptr_no_checks().get() == nullptr) continue;
      name_device(t);
      if (!device || t.device() != *device) continue;
      if (storages.count(si)) continue;
      lookup_or_bind(t, si, offload::make_key(kAdopted, adopted_slots++, false), true);
    }
  }

  // Note [Recipes from the dispatcher]: what rerunning `fn` needs, taken at its start; null when it
  // cannot be rerun (not a dispatcher operator, or an input whose writes cannot be watched).
  static std::shared_ptr<const Capture> capture(const at::RecordFunction& fn,
                                                const std::vector<LogicalId>& ids) {
    const std::optional<c10::OperatorName> name = fn.operator_name();
    if (!name) return nullptr;
    std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findSchema(*name);
    if (!op) return nullptr;
    auto c = std::make_shared<Capture>(*op);
    c->args.assign(fn.inputs().begin(), fn.inputs().end());
    c->inputs = ids;
    c->autocast_cuda = at::autocast::get_autocast_dtype(at::kCUDA);
    c->autocast_cpu = at::autocast::get_autocast_dtype(at::kCPU);
    bool watched = true;
    for (const c10::IValue& v : c->args)
      visit_tensors(v, [&](const at::Tensor& t) {
        if (!t.defined()) return;
        const c10::VariableVersion& vc = t.unsafeGetTensorImpl()->version_counter();
        if (vc.enabled())
          c->versions.emplace_back(vc, vc.current_version());
        else
          watched = false;
      });
    return watched ? c : nullptr;
  }

  std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    const double enter_us = steady_us();
    std::lock_guard lock(mu);
    auto ctx = std::make_unique<OpCtx>();
    const bool step_op = ctl->in_step() && (tl_step_thread || tl_backward > 0);
    ctx->in_step = step_op;
    uint64_t sig = std::hash<std::string_view>()(fn.name());
    const uint32_t k = step_op ? ctl->next_operator() : 0;
    ctx->k = k;
    uint32_t slot = 0;
    uint64_t op_bytes = 0;
    ShapeOf shape(fn.name());
    // Writes are watched for the engine's kept copies and for the recording (Note [Writes the
    // Session sees]); the schema's written arguments are looked up at the first tracked input.
    const bool clean = options.clean_offloads;
    const std::vector<bool>* writes = nullptr;
    size_t arg = 0;
    for (const c10::IValue& v : fn.inputs()) {
      const size_t my_arg = arg++;
      visit_tensors(v, [&](const at::Tensor& t) {
        uint32_t my_slot = slot++;
        if (!t.defined()) return;
        if (step_op) {
          for (int64_t d : t.sizes()) sig = offload::mix(sig, static_cast<uint64_t>(d));
          shape.add(t);
        }
        const bool rec = step_op && ctl->recording();
        if (!t.has_storage()) {
          ctx->untracked_input = ctx->untracked_input || rec;  // its writes cannot be watched
          return;
        }
        if (step_op) name_device(t);
        if (!device || t.device() != *device) {
          if (rec && !t.unsafeGetTensorImpl()->is_wrapped_number()) ctx->untracked_input = true;
          return;
        }
        c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
        std::optional<LogicalId> id =
            lookup_or_bind(t, si, offload::make_key(k, my_slot, false), step_op);
        if (!id) {
          if (rec) ctx->untracked_input = true;
          return;
        }
        if (clean || rec) {
          if (!writes) writes = &written_arguments(fn);
          if (my_arg < writes->size() && (*writes)[my_arg]) {
            if (clean) ctx->unwatched.push_back(*id);
            if (rec) ctl->recorder().note_written(*id);
          }
          const c10::VariableVersion& vc = t.unsafeGetTensorImpl()->version_counter();
          if (vc.enabled()) {
            if (rec) {
              ctx->versions.emplace_back(*id, vc, vc.current_version());
              ctl->recorder().note_version(*id, vc.current_version());
            }
            if (clean) ctx->watched.emplace_back(*id, vc, vc.current_version());
          } else {
            if (rec) ctl->recorder().note_unversioned(*id);
            if (clean) ctx->unwatched.push_back(*id);
          }
        }
        if (std::find(ctx->ids.begin(), ctx->ids.end(), *id) == ctx->ids.end()) {
          ctx->ids.push_back(*id);
          op_bytes += si->nbytes();
        }
        if (ctl->recording()) ctl->recorder().note_input(*id, tl_backward > 0);
      });
    }
    const bool collective = offload::is_collective(fn.name());
    if (!step_op) {
      engine->begin_use(ctx->ids);
      if (collective) pin_collective(ctx->ids);
      return ctx;
    }
    {
      AddElapsedUs timed(controller_us);
      ctl->begin_operator(k, sig, shape.shape(), fn.name(), ctx->ids, op_bytes, collective,
                          &ctx->violation, *this);
    }
    if (const std::vector<LogicalId>* later = ctl->captures(k)) {
      ctx->capture = capture(fn, ctx->ids);  // null: its own outputs cannot be remade
      ctx->captures = *later;                // some may be made by a nested operator
    }
    ctx->recording = ctl->recording();
    if (ctx->recording) {
      ctx->rng = rng_mark(device);
#ifdef TERAIO_TORCH_CUDA
      if (device && device->is_cuda()) {
        // Peak of this operator alone (reset here; read at its end). This resets what
        // torch.cuda.max_memory_allocated() reports, during recorded iterations only.
        c10::cuda::CUDACachingAllocator::resetPeakStats(device->index());
        ctx->events = std::make_shared<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>>(
            at::cuda::CUDAEvent(cudaEventDefault), at::cuda::CUDAEvent(cudaEventDefault));
        ctx->events->first.record(c10::cuda::getCurrentCUDAStream(device->index()));
        ctx->allocator_syncs0 = allocator_syncs(device->index());
        if (waits_for_device(fn.name()))
          for (const c10::IValue& v : fn.inputs())
            visit_tensors(v, [&](const at::Tensor& t) {
              if (t.defined() && t.device() == *device) ctx->reads_back = true;
            });
        start_timer();
        if (timer) {
          ctx->timer_token = ++timer_tokens;
          timer->enter(ctx->timer_token);
        }
      }
#endif
      ctx->gap_us = std::max(0.0, enter_us - last_op_exit_us.load(std::memory_order_relaxed));
      ctx->nested_hook_us0 = tl_nested_hook_us;
      ctx->t0_us = steady_us();
    }
    return ctx;
  }

  void on_end(const at::RecordFunction& fn, OpCtx* ctx) {
    double t1 = steady_us();
    std::lock_guard lock(mu);
    if (ctx->timer_token && timer) timer->leave();
    note_writes(*ctx);  // before anything after this operator may offload them
    if (!ctx->in_step || !ctl->in_step()) {
      engine->end_use(ctx->ids);
      return;
    }
    const uint32_t k = ctx->k;
    const bool rec = ctl->recording();
    std::vector<LogicalId> outs = std::move(ctx->nested_outs);
    const size_t n_nested = outs.size();
    offload::ProductionFacts made;  // Note [Recomputable tensors] in recorder.cpp
    made.untracked_input = ctx->untracked_input;
    made.in_backward = tl_backward > 0;
    made.draws_random = ctx->rng && !(*ctx->rng == rng_mark(device));
    if (rec) {
      for (auto& [id, vc, v0] : ctx->versions) {
        const uint32_t v = vc.current_version();
        made.mutates_input |= v != v0;
        ctl->recorder().note_version(id, v);
      }
    }
    std::vector<LogicalId> top_outs;
    uint32_t slot = 0;
    for (const c10::IValue& v : fn.outputs()) {
      visit_tensors(v, [&](const at::Tensor& t) {
        uint32_t my_slot = slot++;
        if (!t.defined() || !t.has_storage() || !device || t.device() != *device) return;
        c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
        bool fresh = !storages.count(si);
        std::optional<LogicalId> id =
            lookup_or_bind(t, si, offload::make_key(k, my_slot, true), true);
        if (!id) return;
        // Made by this operator: new here, or by an operator nested in it (aten::linear's
        // output is aten::addmm's, bound when the nested one ended).
        const bool made_here = fresh || std::find(outs.begin(), outs.begin() + n_nested, *id) !=
                                            outs.begin() + n_nested;
        outs.push_back(*id);
        if (ctx->capture && made_here &&
            std::find(ctx->captures.begin(), ctx->captures.end(), *id) != ctx->captures.end())
          engine->set_recipe(*id, std::make_unique<TorchRecipe>(ctx->capture, my_slot, t));
        if (!rec) return;
        if (fresh) ctl->recorder().note_output(*id, tl_backward > 0, at::GradMode::is_enabled());
        offload::ProductionFacts f = made;
        f.aliases_input = !made_here;
        ctl->recorder().note_produced(*id, fn.name(), f);
        const c10::VariableVersion& vc = t.unsafeGetTensorImpl()->version_counter();
        if (vc.enabled())
          ctl->recorder().note_version(*id, vc.current_version());
        else
          ctl->recorder().note_unversioned(*id);
        top_outs.push_back(*id);
      });
    }
    // Made inside, not handed out: internals, remade only by the operator nested here that made
    // them (Note [Nested producers] in recorder.cpp).
    auto handed_out = [&](LogicalId id) {
      return std::find(outs.begin() + static_cast<std::ptrdiff_t>(n_nested), outs.end(), id) != outs.end();
    };
    auto nested_of = [&](LogicalId id) -> const OpCtx::Nested* {
      for (const OpCtx::Nested& n : ctx->nested_made)
        if (n.id == id) return n.usable ? &n : nullptr;
      return nullptr;
    };
    if (!ctx->captures.empty()) {
      for (const OpCtx::Nested& n : ctx->nested_made) {
        if (!n.usable || !n.capture || handed_out(n.id) ||
            std::find(ctx->captures.begin(), ctx->captures.end(), n.id) == ctx->captures.end())
          continue;
        engine->set_recipe(n.id, std::make_unique<TorchRecipe>(n.capture, n.slot, n.tensor));
      }
    }
    if (rec) {
      for (size_t i = 0; i < n_nested; ++i) {
        if (handed_out(outs[i])) continue;
        offload::ProductionFacts f = made;
        f.nested_only = true;
        if (const OpCtx::Nested* n = nested_of(outs[i]))
          ctl->recorder().note_nested(outs[i], n->op, n->inputs);
        ctl->recorder().note_produced(outs[i], fn.name(), f);
      }
      // Note [Host times of a recording]: the operator's body on the host (its dispatch and
      // launches, nested operators' callbacks excluded) is its host-clock time; with the host
      // time before its callback since the previous operator ended (the Python and autograd
      // engine work between them), its host time in the trace (kernels[k].host_us, CUDA only).
      // An operator that waits for the device (a scalar read back, nonzero's size) spends its body
      // waiting for what the GPU had queued, which is device time, not host time: its gap alone
      // counts. So does one in which the caching allocator waited for the device (a cudaMalloc
      // retried after freeing its cache, a cudaFree: allocator_syncs), whatever its name. The
      // Llama-3-8B shape's recording on the H200, 123 of 140 GiB reserved, had an aten::mul and an
      // aten::add_ of 38 ms host time each over 0.1 ms kernels, which the replay took for host
      // work (docs/benchmarks.md); stats()["profiled_allocator_waits"] says whether such are these.
      const double body_us = std::max(0.0, t1 - ctx->t0_us - (tl_nested_hook_us - ctx->nested_hook_us0));
      bool device_wait = waits_for_device(fn.name());
#ifdef TERAIO_TORCH_CUDA
      if (ctx->allocator_syncs0 >= 0 && allocator_syncs(device->index()) > ctx->allocator_syncs0) {
        device_wait = true;
        allocator_wait_ops++;
      }
#endif
      const double host_us = ctx->gap_us + (device_wait ? 0.0 : body_us);
      ctl->recorder().add_operator(fn.name(), body_us, ctx->ids, outs, *this, host_us,
                                   ctx->reads_back);
#ifdef TERAIO_TORCH_CUDA
      if (ctx->events) {
        ctx->events->second.record(c10::cuda::getCurrentCUDAStream(device->index()));
        op_events.resize(ctl->recorder().operators().size());
        op_events.back() = ctx->events;
        op_tokens.resize(op_events.size());
        op_tokens.back() = ctx->timer_token;
      }
#endif
    }
#ifdef TERAIO_TORCH_CUDA
    if (rec && measuring_device()) ctl->note_device_peak(device_allocated(device->index()).second);
#endif
    AddElapsedUs timed(controller_us);
    ctl->end_operator(k, fn.name(), ctx->ids, outs, offload::is_collective(fn.name()),
                      &ctx->violation);
  }

  // Note [Writes the Session sees]: an operator wrote a tracked input in place when its schema says
  // it writes that argument (`Tensor(a!)`: in-place and out= operators, also custom ones such as
  // FSDP2's copy-outs and the collectives, whose kernels may not bump version counters), when the
  // input's version counter moved across it (any in-place operator bumps it, through any view and
  // through the tensor `.data` makes), or when the input has no counter (inference tensors). The
  // engine hears of each (Note [Clean offloads] in src/runtime/engine.cpp).
  // Per operator schema: which arguments it writes (empty: none, or not a dispatcher operator).
  const std::vector<bool>& written_arguments(const at::RecordFunction& fn) {
    static const std::vector<bool> none;
    const std::optional<c10::OperatorName> name = fn.operator_name();
    if (!name) return none;
    auto it = schema_writes.find(*name);
    if (it == schema_writes.end()) {
      std::vector<bool> w;
      if (std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findSchema(*name)) {
        const std::vector<c10::Argument>& args = op->schema().arguments();
        w.resize(args.size());
        bool any = false;
        for (size_t i = 0; i < args.size(); ++i) {
          const c10::AliasInfo* a = args[i].alias_info();
          w[i] = a != nullptr && a->isWrite();
          any = any || w[i];
        }
        if (!any) w.clear();
      }
      it = schema_writes.emplace(*name, std::move(w)).first;
    }
    return it->second;
  }
  std::unordered_map<c10::OperatorName, std::vector<bool>> schema_writes;

  void note_writes(OpCtx& ctx) {
    for (auto& [id, vc, v0] : ctx.watched)
      if (vc.current_version() != v0) ctx.unwatched.push_back(id);
    if (!ctx.unwatched.empty()) engine->note_written(ctx.unwatched);
  }

  // Note [Tensors nested operators read]: an operator nested in a top-level one may read a tracked
  // tensor the top-level one was not given: autocast's cached bf16 copy of a weight used a second
  // time in one forward pass is handed to the nested aten::linear by autocast's cache, with no
  // operator of its own. The Session must see such a read, or the tensor may be away when it
  // happens. While recording, each tracked tensor a nested operator reads becomes an input of its
  // top-level operator (made resident, pinned until the top-level one ends, listed by its kernel in
  // the trace, so that plans keep it there); in any step, a nested operator that reads a tensor
  // whose storage has no bytes (offloaded or freed for a recompute) gets it back first (an urgent
  // fetch or recompute, like any use the plan did not expect) and keeps it pinned until it ends
  // (until the top-level one ends when there is one).
  static bool reads_absent(const at::RecordFunction& fn) {
    bool absent = false;
    for (const c10::IValue& v : fn.inputs())
      visit_tensors(v, [&](const at::Tensor& t) {
        if (absent || !t.defined() || !t.has_storage()) return;
        absent = bytes_away(*t.storage().unsafeGetStorageImpl());
      });
    return absent;
  }

  // The start of an operator nested in the top-level one `top` (null: a top-level operator the
  // fast path took), while recording, when a recompute of `top`'s kernel is planned (`producers`:
  // what Note [Nested producers] needs of its inputs) or when it reads an absent tensor.
  std::unique_ptr<at::ObserverContext> on_nested_start(const at::RecordFunction& fn, OpCtx* top,
                                                       bool producers) {
    std::lock_guard lock(mu);
    if (!ctl->in_step() || !device || offload::is_collective(fn.name())) return nullptr;
    auto n = std::make_unique<NestedCtx>();
    n->producers = producers;
    std::vector<LogicalId> reads;
    for (const c10::IValue& v : fn.inputs())
      visit_tensors(v, [&](const at::Tensor& in) {
        if (!in.defined()) return;
        if (!in.has_storage()) {
          n->usable = false;
          return;
        }
        c10::StorageImpl* si = in.storage().unsafeGetStorageImpl();
        n->input_storages.push_back(si);
        auto it = storages.find(si);
        const bool tracked = it != storages.end() && in.device() == *device;
        const bool inside = tracked && top != nullptr &&
                            std::find(top->nested_outs.begin(), top->nested_outs.end(),
                                      it->second.id) != top->nested_outs.end();
        if (tracked && !inside &&
            (top == nullptr || std::find(top->ids.begin(), top->ids.end(), it->second.id) == top->ids.end()) &&
            std::find(reads.begin(), reads.end(), it->second.id) == reads.end())
          reads.push_back(it->second.id);
        if (!tracked || !in.unsafeGetTensorImpl()->version_counter().enabled() || inside) {
          n->usable = false;  // untracked, unwatchable, or made inside `top` itself
          return;
        }
        n->inputs.push_back(it->second.id);
      });
    if (!reads.empty()) {
      engine->begin_use(reads);
      if (top != nullptr)
        top->ids.insert(top->ids.end(), reads.begin(), reads.end());  // its end releases them
      else
        n->pinned = std::move(reads);
    }
    if (!producers) return n;
    const std::vector<bool>& writes = written_arguments(fn);
    size_t arg = 0;
    for (const c10::IValue& v : fn.inputs()) {
      const size_t my_arg = arg++;
      if (my_arg < writes.size() && writes[my_arg])
        visit_tensors(v, [&](const at::Tensor& in) {
          if (in.defined() && in.has_storage()) n->written.push_back(in.storage().unsafeGetStorageImpl());
        });
    }
    if (n->usable && !top->captures.empty()) {
      n->capture = capture(fn, n->inputs);
      n->usable = n->capture != nullptr;
    }
    return n;
  }

  // The end of an operator nested in the top-level one `top`: binds its new outputs, and with
  // `nested` (on_nested_start's) notes which nested operator made each tensor made inside `top`.
  void on_nested_end(const at::RecordFunction& fn, OpCtx* top, const NestedCtx* nested) {
    std::lock_guard lock(mu);
    if (nested && !nested->pinned.empty()) engine->end_use(nested->pinned);
    if (nested && !nested->producers) nested = nullptr;
    if (!ctl->in_step() || !device || top == nullptr) return;
    const bool rec = ctl->recording();
    const bool collective = offload::is_collective(fn.name());
    if (collective) pin_collective_values(fn.outputs());  // its inputs were pinned at its start
    if (nested) forget_written_nested(*nested, top);
    uint32_t slot = 0;
    for (const c10::IValue& v : fn.outputs()) {
      visit_tensors(v, [&](const at::Tensor& t) {
        const uint32_t my_slot = slot++;
        if (!t.defined() || !t.has_storage() || t.device() != *device) return;
        c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
        if (auto it = storages.find(si); it != storages.end()) {  // a view, an input, or known
          const LogicalId known = it->second.id;
          if (nested && std::find(top->nested_outs.begin(), top->nested_outs.end(), known) !=
                            top->nested_outs.end())
            note_nested_producer(fn, *nested, top, known, my_slot, t, si);
          return;
        }
        std::optional<LogicalId> id = lookup_or_bind(
            t, si, offload::make_key(top->k, 0x4000 + top->nested++, true), true);
        if (!id) return;
        top->nested_outs.push_back(*id);
        if (collective) engine->pin_permanently(*id);
        if (rec) ctl->recorder().note_output(*id, tl_backward > 0, at::GradMode::is_enabled());
        if (nested) note_nested_producer(fn, *nested, top, *id, my_slot, t, si);
      });
    }
  }

  // Note [Nested producers]: nested operator `fn` returned tensor `id` (storage `si`), made inside
  // `top`. Unless fn took that storage as an input (a view, an in-place or out= result), fn is
  // the tensor's producer so far: an operator enclosing fn that returns it too replaces it.
  void note_nested_producer(const at::RecordFunction& fn, const NestedCtx& nested, OpCtx* top,
                            LogicalId id, uint32_t slot, const at::Tensor& t, c10::StorageImpl* si) {
    if (std::find(nested.input_storages.begin(), nested.input_storages.end(), si) !=
        nested.input_storages.end())
      return;
    OpCtx::Nested n;
    n.id = id;
    n.op = fn.name();
    n.inputs = nested.inputs;
    n.usable = nested.usable;
    if (n.usable && nested.capture &&
        std::find(top->captures.begin(), top->captures.end(), id) != top->captures.end()) {
      n.capture = nested.capture;
      n.slot = slot;
      n.tensor = t;
    }
    auto it = std::find_if(top->nested_made.begin(), top->nested_made.end(),
                           [&](const OpCtx::Nested& m) { return m.id == id; });
    if (it == top->nested_made.end())
      top->nested_made.push_back(std::move(n));
    else
      *it = std::move(n);
  }

  // A nested operator that writes into a tensor made inside `top` (its schema says so: copy_,
  // index_put_, an out= argument) leaves it no producer: rerunning the one that made it would not
  // redo the write. One enclosing both that returns the tensor becomes its producer again.
  void forget_written_nested(const NestedCtx& nested, OpCtx* top) {
    for (c10::StorageImpl* w : nested.written) {
      auto it = storages.find(w);
      if (it == storages.end()) continue;
      for (OpCtx::Nested& m : top->nested_made)
        if (m.id == it->second.id) {
          m.usable = false;
          m.capture.reset();
          m.tensor = at::Tensor();
        }
    }
  }

  // Throws only for misuse, before changing anything; faults met here are the step's (end_step).
  void begin_step() {
    std::lock_guard lock(mu);
    TERAIO_CHECK(!closed, "Session.step(): the Session is closed");
    ctl->begin_step(*this);
    tl_step_thread = true;
    op_device_us.clear();
    last_op_exit_us.store(steady_us(), std::memory_order_relaxed);
#ifdef TERAIO_TORCH_CUDA
    op_events.clear();
    op_tokens.clear();
#endif
  }

  void end_step() {
    std::unique_lock lock(mu);
    if (ctl->recording()) finish_timer();  // before the trace is built (ctl->end_step)
    const offload::StepErrors errors = ctl->end_step(*this);
    tl_step_thread = false;
    // Forget storages that died.
    for (auto it = storages.begin(); it != storages.end();) {
      if (it->second.weak.expired()) {
        id_storage[it->second.id] = nullptr;
        it = storages.erase(it);
      } else {
        ++it;
      }
    }
#ifdef TERAIO_TORCH_CUDA
    op_events.clear();
    op_tokens.clear();
#endif
    lock.unlock();
    offload::raise_step_errors(errors);
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
    if (offload::is_collective(fn.name()) && s->ctl->in_step()) {
      std::lock_guard lock(s->mu);  // a collective nested in a top-level operator (rare)
      try {
        s->pin_collective_values(fn.inputs());
      } catch (const std::exception& e) {
        s->ctl->note_error(e.what());
      }
      return nullptr;
    }
    // Notes [Nested producers] and [Tensors nested operators read]: inside an operator of a
    // recorded step, one whose kernel a planned recompute reruns, or reading an absent tensor (the
    // common case returns here, without the lock).
    OpCtx* top = tl_top;
    const bool producers =
        top != nullptr && tl_backward == 0 && (top->recording || !top->captures.empty());
    if (!producers && !(top != nullptr && top->recording) &&
        !(s->ctl->in_step() && (tl_step_thread || tl_backward > 0) && Session::Impl::reads_absent(fn)))
      return nullptr;
    try {
      const double t0 = steady_us();
      std::unique_ptr<at::ObserverContext> nested = s->on_nested_start(fn, top, producers);
      tl_nested_hook_us += steady_us() - t0;
      return nested;
    } catch (const std::exception& e) {
      std::lock_guard lock(s->mu);
      s->ctl->note_error(e.what());
      return nullptr;
    }
  }
  AddElapsedUs timed(s->hook_us);  // stats()["hook_us"]
  try {
    if (s->ctl->fast() && s->ctl->in_step() &&
        (tl_step_thread || tl_backward > 0) && s->fast_path(fn)) {
      if (offload::is_collective(fn.name())) {  // rare: pin what it was given, nothing else to do
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
    s->ctl->note_error(e.what());
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
  AddElapsedUs timed(s->hook_us);  // stats()["hook_us"]
  try {
    auto* nested = dynamic_cast<NestedCtx*>(ctx);
    if (ctx == nullptr || nested != nullptr) {
      if (tl_depth > 0 && (tl_top != nullptr || nested != nullptr)) {
        s->on_nested_end(fn, tl_top, nested);
        tl_nested_hook_us += steady_us() - timed.t0();
      }
      return;
    }
    if (ctx == tl_top) tl_top = nullptr;
    auto* op = static_cast<OpCtx*>(ctx);
    const bool in_step = op->in_step;
    s->on_end(fn, op);
    if (in_step) s->last_op_exit_us.store(steady_us(), std::memory_order_relaxed);
  } catch (const std::exception& e) {
    std::lock_guard lock(s->mu);
    s->ctl->note_error(e.what());
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
  std::vector<TierSpec> tier_specs;
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
    spec.duplex_gbps = t.duplex_gbps > 0
                           ? t.duplex_gbps
                           : default_duplex_gbps(spec.read_gbps, spec.write_gbps);
    if (options.fault_injection) {
      auto faulty = storage::make_fault_tier(std::move(s.tiers.back()), {});
      s.fault_tiers.push_back(faulty.get());
      s.tiers.back() = std::move(faulty);
    }
    engine_tiers.push_back({spec.name, s.tiers.back().get(), t.capacity_bytes});
    tier_specs.push_back(spec);
    const storage::TierInfo info = s.tiers.back()->info();
    SessionTierStats ts;
    ts.name = spec.name;
    ts.engine = info.engine;
    ts.read_gbps = spec.read_gbps;
    ts.write_gbps = spec.write_gbps;
    if (t.read_gbps > 0) ts.read_source = "given";
    if (t.write_gbps > 0) ts.write_source = "given";
    ts.duplex_gbps = spec.duplex_gbps;
    if (t.duplex_gbps > 0) ts.duplex_source = "given";
    ts.notes = info.notes;
    s.tier_stats.push_back(std::move(ts));
  }
  s.options = std::move(options);
  s.engine = std::make_unique<runtime::Engine>(
      runtime::EngineOptions{s.options.budget_bytes, s.options.stream_ordered_offloads,
                             s.options.clean_offloads},
      std::move(engine_tiers));
  offload::ControllerOptions co;
  co.budget_bytes = s.options.budget_bytes;
  co.profiling_iterations = s.options.profiling_iterations;
  co.planning = s.options.planning;
  co.plan_search = s.options.plan_search;
  co.min_tensor_bytes = s.options.min_tensor_bytes;
  co.trace_path = s.options.trace_path;
  co.plan_path = s.options.plan_path;
  co.recompute = s.options.recompute;
  co.discard_dead = s.options.discard_dead;
  // Writeback moves (docs/pytorch.md, "Writebacks") and deep recompute chains ("Recompute"): the
  // search may keep plans with them (only where the simulator finds them faster) unless
  // TERAIO_WRITEBACKS=0 / TERAIO_DEEP_RECOMPUTE=0. A writeback makes its offload clean: none with
  // clean_offloads=False.
  auto env_off = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && std::strcmp(v, "0") == 0;
  };
  co.writebacks = !env_off("TERAIO_WRITEBACKS") && s.options.clean_offloads;
  co.deep_recompute = !env_off("TERAIO_DEEP_RECOMPUTE");
  co.recompute_across_peak = !env_off("TERAIO_RECOMPUTE_ACROSS_PEAK");  // docs/pytorch.md, "Recompute"
  // Plans made again are searched while the steps go on (docs/pytorch.md, "Operator times").
  co.background_search = !env_off("TERAIO_BACKGROUND_SEARCH");
  co.tiers = std::move(tier_specs);
  s.ctl = std::make_unique<offload::Controller>(*s.engine, std::move(co));
  // Fault messages name tensors as the trace does (engine calls are made under the Session's lock).
  s.engine->set_namer([&s](runtime::LogicalId id) {
    const offload::Recorder& r = s.ctl->recorder();
    return id < r.num_tensors() ? r.tensor(id).display_name() : std::string();
  });
  if (const char* log = std::getenv("TERAIO_LOG");
      log != nullptr && *log != '\0' && std::strcmp(log, "0") != 0) {
    // Every move outside the plan, with where it happened (docs/pytorch.md, "Diagnostics"). The
    // engine calls this under the Session's lock (every engine call is made holding it).
    s.engine->set_event_hook([&s](std::string_view what, runtime::LogicalId id, uint64_t bytes) {
      const offload::Recorder& r = s.ctl->recorder();
      const std::string name =
          id < r.num_tensors() ? r.tensor(id).display_name() : std::to_string(id);
      std::fprintf(stderr, "teraio: iteration %llu op %u (%s): %.*s %s (%s)\n",
                   static_cast<unsigned long long>(s.ctl->iteration()),
                   s.ctl->operators_started() - 1, offload::mode_name(s.ctl->mode()), static_cast<int>(what.size()), what.data(), name.c_str(),
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
  s.ctl->abandon_step();
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
  if (!first.empty()) s.ctl->set_last_error(first);
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
    impl_->ctl->set_last_error(f.message);
    if (first.empty()) first = std::move(f.message);
    failed++;
  }
  lock.unlock();
  if (failed > 0)
    throw IoError(fmt::format("fetch_all: {} tensor(s) could not be brought back: {}", failed, first));
}

void Session::set_predict_step_in_backward(bool on) {
  std::lock_guard lock(impl_->mu);
  impl_->ctl->set_predict_step_in_backward(on);
}

void Session::adopt(const std::vector<at::Tensor>& tensors) {
  std::lock_guard lock(impl_->mu);
  impl_->adopt(tensors);
}

// Note [Storages their owner resizes]: FSDP2 frees its unsharded parameters after use with
// untyped_storage().resize_(0) and re-allocates them with resize_(n) before the next all-gather,
// behind the dispatcher. Two things went wrong when teraio only noticed afterwards (a storage whose
// size or data changed counts as replaced: StorageMemory::alive). An offloaded storage has a null
// DataPtr and keeps its size, which PyTorch's Python storage methods refuse ("Attempted to call
// resize_() on an invalid python storage", Note [Invalid Python Storages] in
// torch/csrc/Storage.cpp): FSDP2 under a budget that moved an unsharded parameter failed there.
// And a writeback's copy (Note [Lent bytes]) could still be reading a resident storage's bytes
// when the owner freed them. The Python Session therefore wraps torch.UntypedStorage.resize_ while
// it is open and calls this first, for any storage it tracks: the owner takes the storage over.
// Resized to 0, its bytes are freed, so teraio's copy (in a tier, or none when it was freed for a
// recompute) is obsolete: an absent storage's size is set to 0 first, which makes it replaced, so
// that it is forgotten without being brought back; resized to another size, the bytes are kept, so
// an absent storage gets them back first (a failure leaves it lost, Note [Lost tensors], and the
// resize raises that message). Either way the entry is forgotten now (Engine::unbind: a writeback
// in flight is waited for, tier space freed), before the owner's resize runs; the storage stays
// known (its Binding), unbound: the owner's from then on.
void Session::storage_resizing(uintptr_t storage, uint64_t new_bytes) {
  std::lock_guard lock(impl_->mu);
  if (impl_->closed) return;
  auto it = impl_->storages.find(reinterpret_cast<c10::StorageImpl*>(storage));
  if (it == impl_->storages.end()) return;
  c10::intrusive_ptr<c10::StorageImpl> s = it->second.weak.lock();
  const LogicalId id = it->second.id;
  if (!s || !impl_->engine->bound(id)) return;
  if (bytes_away(*s)) {
    impl_->owner_resizes++;
    if (new_bytes == 0) s->set_nbytes(0);  // and freed by its owner: nothing to bring back
  }
  impl_->engine->unbind(id);
}

void Session::name_tensor(const at::Tensor& t, const std::string& name, const std::string& kind) {
  TensorKind k;
  TERAIO_CHECK(parse_tensor_kind(kind, &k), "name_tensor: unknown kind '{}'", kind);
  if (!t.defined() || !t.has_storage()) return;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->storages.find(t.storage().unsafeGetStorageImpl());
  if (it == impl_->storages.end()) return;  // not (yet) tracked
  offload::TensorFacts& m = impl_->ctl->recorder().tensor(it->second.id);
  m.name = name;
  m.named_kind = k;
}

uint64_t Session::names_generation() const {
  std::lock_guard lock(impl_->mu);
  return impl_->ctl->recorder().facts_generation();
}

SessionStats Session::stats() const {
  std::lock_guard lock(impl_->mu);
  const Impl& s = *impl_;
  runtime::EngineStats e = s.engine ? s.engine->stats() : s.closed_stats;
  SessionStats r;
  s.ctl->fill_stats(e, &r);
  r.kernel_timing = s.kernel_timing();
  r.profiled_event_us = s.event_us_sum;
  r.profiled_allocator_waits = s.profiled_allocator_waits;
  r.tracked_tensors = s.storages.size();
  r.hook_us = s.hook_us.load(std::memory_order_relaxed);
  r.controller_us = s.controller_us.load(std::memory_order_relaxed);
  r.owner_resizes = s.owner_resizes;
  r.tiers = s.tier_stats;
  for (size_t i = 0; i < r.tiers.size(); ++i) {
    SessionTierStats& t = r.tiers[i];
    const TierSpec& spec = s.ctl->tier(i);  // the figures planned with now
    t.read_gbps = spec.read_gbps;
    t.write_gbps = spec.write_gbps;
    t.duplex_gbps = spec.duplex_gbps;
    if (s.ctl->read_from_use(i)) t.read_source = "in use";
    if (s.ctl->write_from_use(i)) t.write_source = "in use";
    if (i >= e.tiers.size()) continue;
    t.stall_read_us = e.tiers[i].stall_read_us;
    t.stall_write_us = e.tiers[i].stall_write_us;
    t.bytes_read = e.tiers[i].bytes_read;
    t.bytes_written = e.tiers[i].bytes_written;
    t.bytes_clean = e.tiers[i].bytes_clean;
    t.read_gbps_in_use = e.tiers[i].transfer.read_gbps();
    t.write_gbps_in_use = e.tiers[i].transfer.write_gbps();
  }
  return r;
}

const SessionOptions& Session::options() const {
  return impl_->options;
}

}  // namespace teraio
