// Note [Kernel times from CUPTI] (kernel_timer.h). libcupti is found at run time (dlopen): the
// PyTorch CUDA libraries link it already, so it is normally loaded; a build without it, or a
// process where it cannot be found, falls back to events, said in the Session's stats.
#include "kernel_timer.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#if defined(TERAIO_TORCH_CUDA) && __has_include(<cupti.h>)
#define TERAIO_HAVE_CUPTI 1
#include <cupti.h>
#include <dlfcn.h>
#endif

namespace teraio {

#ifdef TERAIO_HAVE_CUPTI
namespace {

// teraio's kind of external correlation: CUSTOM0 and CUSTOM1 are the ones Kineto uses.
constexpr CUpti_ExternalCorrelationKind kOurKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;
constexpr size_t kBufferBytes = 8u << 20;

struct Api {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) dropped = nullptr;
  decltype(&cuptiActivityPushExternalCorrelationId) push = nullptr;
  decltype(&cuptiActivityPopExternalCorrelationId) pop = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  std::string error;  // why it could not be loaded
};

const Api& api() {
  static const Api a = [] {
    Api r;
    void* h = nullptr;
    for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
      h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);  // loaded with libtorch already: no search
      if (!h) h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (h) break;
    }
    if (!h) {
      r.error = "libcupti.so.13 was not found";
      return r;
    }
    auto get = [&](auto& fn, const char* sym) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, sym));
      if (!fn && r.error.empty()) r.error = fmt::format("libcupti lacks {}", sym);
    };
    get(r.register_callbacks, "cuptiActivityRegisterCallbacks");
    get(r.enable, "cuptiActivityEnable");
    get(r.disable, "cuptiActivityDisable");
    get(r.flush_all, "cuptiActivityFlushAll");
    get(r.next_record, "cuptiActivityGetNextRecord");
    get(r.dropped, "cuptiActivityGetNumDroppedRecords");
    get(r.push, "cuptiActivityPushExternalCorrelationId");
    get(r.pop, "cuptiActivityPopExternalCorrelationId");
    get(r.result_string, "cuptiGetResultString");
    return r;
  }();
  return a;
}

std::string describe(CUptiResult r) {
  const char* s = nullptr;
  if (api().result_string) api().result_string(r, &s);
  return fmt::format("CUPTI error {} ({})", static_cast<int>(r), s ? s : "unknown");
}

// What the buffer callbacks collect (process-wide, like CUPTI's callbacks themselves).
struct Collected {
  std::mutex mu;
  std::unordered_map<uint32_t, uint64_t> token;  // CUDA call's correlation id -> our token
  std::unordered_map<uint32_t, uint64_t> ns;     // correlation id -> nanoseconds of GPU work
  size_t dropped = 0;
};
Collected& collected() {
  static Collected c;
  return c;
}
std::atomic<bool> g_busy{false};

// External correlation records are made for API records only (runtime and driver calls: cuBLAS and
// Triton launch through the driver), so both are enabled though their records are not read.
const CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,               CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,               CUPTI_ACTIVITY_KIND_MEMSET};

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI on_buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t,
                                  size_t valid) {
  Collected& c = collected();
  {
    std::lock_guard lock(c.mu);
    CUpti_Activity* rec = nullptr;
    while (valid > 0 && api().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          auto* r = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(rec);
          if (r->externalKind == kOurKind) c.token[r->correlationId] = r->externalId;
          break;
        }
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          auto* r = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
          if (r->end > r->start) c.ns[r->correlationId] += r->end - r->start;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          auto* r = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
          if (r->end > r->start) c.ns[r->correlationId] += r->end - r->start;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          auto* r = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
          if (r->end > r->start) c.ns[r->correlationId] += r->end - r->start;
          break;
        }
        default:
          break;
      }
    }
    size_t dropped = 0;
    if (api().dropped && api().dropped(context, stream, &dropped) == CUPTI_SUCCESS)
      c.dropped += dropped;
  }
  std::free(buffer);
}

void disable_all() {
  for (CUpti_ActivityKind k : kKinds) api().disable(k);
}

}  // namespace

std::unique_ptr<KernelTimer> KernelTimer::start(std::string* why) {
  const Api& a = api();
  if (!a.error.empty()) {
    *why = a.error;
    return nullptr;
  }
  if (g_busy.exchange(true)) {
    *why = "another Session in this process is timing its operators with CUPTI";
    return nullptr;
  }
  {
    Collected& c = collected();
    std::lock_guard lock(c.mu);
    c.token.clear();
    c.ns.clear();
    c.dropped = 0;
  }
  CUptiResult r = a.register_callbacks(&on_buffer_requested, &on_buffer_completed);
  for (size_t i = 0; r == CUPTI_SUCCESS && i < std::size(kKinds); ++i) r = a.enable(kKinds[i]);
  if (r != CUPTI_SUCCESS) {
    disable_all();
    g_busy.store(false);
    *why = describe(r);
    return nullptr;
  }
  return std::unique_ptr<KernelTimer>(new KernelTimer());
}

KernelTimer::~KernelTimer() {
  if (finished_) return;
  disable_all();
  api().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_busy.store(false);
}

void KernelTimer::enter(uint64_t token) { api().push(kOurKind, token); }

void KernelTimer::leave() {
  uint64_t last = 0;
  api().pop(kOurKind, &last);
}

std::optional<std::unordered_map<uint64_t, double>> KernelTimer::finish(std::string* why) {
  finished_ = true;
  disable_all();
  CUptiResult r = api().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_busy.store(false);
  Collected& c = collected();
  std::lock_guard lock(c.mu);
  if (r != CUPTI_SUCCESS) {
    *why = describe(r);
    return std::nullopt;
  }
  if (c.dropped > 0) {
    *why = fmt::format("CUPTI dropped {} activity records", c.dropped);
    return std::nullopt;
  }
  std::unordered_map<uint64_t, double> us;
  for (const auto& [corr, ns] : c.ns) {
    auto it = c.token.find(corr);
    if (it != c.token.end()) us[it->second] += static_cast<double>(ns) / 1000.0;
  }
  const size_t work = c.ns.size(), correlated = c.token.size();
  c.token.clear();
  c.ns.clear();
  if (us.empty()) {  // never silently zero: a CUPTI that attributes nothing is not used
    *why = fmt::format("CUPTI attributed none of {} GPU activities to an operator ({} correlations)",
                       work, correlated);
    return std::nullopt;
  }
  return us;
}

#else  // no CUPTI in this build

std::unique_ptr<KernelTimer> KernelTimer::start(std::string* why) {
  *why = "this build of teraio has no CUPTI (a CPU build, or no cupti.h at build time)";
  return nullptr;
}
KernelTimer::~KernelTimer() = default;
void KernelTimer::enter(uint64_t) {}
void KernelTimer::leave() {}
std::optional<std::unordered_map<uint64_t, double>> KernelTimer::finish(std::string* why) {
  finished_ = true;
  *why = "no CUPTI";
  return std::nullopt;
}

#endif

}  // namespace teraio
