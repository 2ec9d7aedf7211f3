// The in-memory trace: kernels stored column-wise (CSR for their tensor lists) with interned names,
// so a 250k-kernel trace takes a few tens of MB and scans stay cache-friendly.
#include "teraio/trace.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "teraio/error.h"

namespace teraio {

namespace {
constexpr std::string_view kKindNames[kNumTensorKinds] = {
    "parameter", "gradient", "optimizer_state", "activation", "temporary", "other"};
}  // namespace

std::string_view to_string(TensorKind kind) { return kKindNames[static_cast<int>(kind)]; }

bool parse_tensor_kind(std::string_view name, TensorKind* kind) {
  for (int i = 0; i < kNumTensorKinds; ++i) {
    if (kKindNames[i] == name) {
      *kind = static_cast<TensorKind>(i);
      return true;
    }
  }
  return false;
}

uint32_t Trace::intern(std::string_view name) {
  auto it = std::lower_bound(name_index_.begin(), name_index_.end(), name,
                             [](const auto& e, std::string_view n) { return e.first < n; });
  if (it != name_index_.end() && it->first == name) return it->second;
  const auto id = static_cast<uint32_t>(names_.size());
  names_.emplace_back(name);
  name_index_.insert(it, {std::string(name), id});
  return id;
}

void Trace::add_kernel(std::string_view name, double time_us, std::span<const TensorId> ids) {
  kernel_name_id_.push_back(intern(name));
  kernel_time_us_.push_back(time_us);
  if (!kernel_host_us_.empty()) kernel_host_us_.push_back(0.0);
  if (!kernel_reads_back_.empty()) kernel_reads_back_.push_back(0);
  const size_t begin = tensor_ids_.size();
  for (TensorId t : ids) {
    // Collapse duplicates: a kernel touching a tensor twice uses it once.
    if (std::find(tensor_ids_.begin() + static_cast<std::ptrdiff_t>(begin), tensor_ids_.end(), t) ==
        tensor_ids_.end())
      tensor_ids_.push_back(t);
  }
  offsets_.push_back(tensor_ids_.size());
}

void Trace::set_kernel_reads_back(KernelIndex k, bool reads_back) {
  TERAIO_CHECK(k < num_kernels(), "set_kernel_reads_back: kernel {} is out of range ({} kernels)",
               k, num_kernels());
  if (kernel_reads_back_.empty()) {
    if (!reads_back) return;
    kernel_reads_back_.assign(num_kernels(), 0);
  }
  kernel_reads_back_[k] = reads_back ? 1 : 0;
}

void Trace::set_kernel_host_us(KernelIndex k, double host_us) {
  TERAIO_CHECK(k < num_kernels(), "set_kernel_host_us: kernel {} is out of range ({} kernels)", k,
               num_kernels());
  if (kernel_host_us_.empty()) kernel_host_us_.assign(num_kernels(), 0.0);
  kernel_host_us_[k] = host_us;
}

void Trace::reserve_kernels(size_t kernels, size_t uses) {
  kernel_name_id_.reserve(kernels);
  kernel_time_us_.reserve(kernels);
  offsets_.reserve(kernels + 1);
  tensor_ids_.reserve(uses);
}

std::string Trace::meta_value(std::string_view key) const {
  for (const auto& [k, v] : meta) {
    if (k == key) return v;
  }
  return {};
}

void Trace::set_meta(std::string key, std::string raw_json_value) {
  for (auto& [k, v] : meta) {
    if (k == key) {
      v = std::move(raw_json_value);
      return;
    }
  }
  meta.emplace_back(std::move(key), std::move(raw_json_value));
}

double Trace::total_time_us() const {
  double total = 0;
  for (double t : kernel_time_us_) total += t;
  return total;
}

std::string Trace::bytes_bound_message(uint64_t bytes) {
  return fmt::format("the tensors' bytes add up to more than 2^53 (8 PiB) with this tensor's {}; "
                     "no trace may hold more (docs/formats.md, \"Bounds\")",
                     bytes);
}

std::string Trace::time_bound_message(double time_us) {
  return fmt::format("the kernels' times add up to more than 1e15 us (31.7 years) with this "
                     "kernel's {} us; no trace may take longer (docs/formats.md, \"Bounds\")",
                     time_us);
}

void Trace::validate() const {
  const size_t n = tensors.size();
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t b = tensors[i].bytes;
    TERAIO_CHECK(b <= kMaxTraceBytes && total_bytes + b <= kMaxTraceBytes, "tensors[{}].bytes: {}", i,
                 bytes_bound_message(b));
    total_bytes += b;
  }
  double total_us = 0;
  double total_host_us = 0;
  for (size_t k = 0; k < num_kernels(); ++k) {
    const double t = kernel_time_us_[k];
    TERAIO_CHECK(std::isfinite(t) && t >= 0, "kernels[{}].time_us: must be a finite number >= 0, got {}",
                 k, t);
    total_us += t;
    TERAIO_CHECK(total_us <= kMaxTraceTimeUs, "kernels[{}].time_us: {}", k, time_bound_message(t));
    if (!kernel_host_us_.empty()) {
      const double h = kernel_host_us_[k];
      TERAIO_CHECK(std::isfinite(h) && h >= 0,
                   "kernels[{}].host_us: must be a finite number >= 0, got {}", k, h);
      total_host_us += h;
      TERAIO_CHECK(total_host_us <= kMaxTraceTimeUs, "kernels[{}].host_us: {}", k,
                   time_bound_message(h));
    }
    for (TensorId id : kernel_tensors(static_cast<KernelIndex>(k))) {
      TERAIO_CHECK(id < n, "kernels[{}].tensors: tensor id {} is out of range (the trace has {} tensors)",
                   k, id, n);
    }
  }
  validate_per_tensor_kernels();
  validate_writes();
}

// written_at (Note [Clean offloads] in plan_check.cpp): sorted, distinct, each kernel in range and
// listing the tensor; only in a trace that records writes.
void Trace::validate_writes() const {
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::vector<KernelIndex>& w = tensors[t].written_at;
    if (w.empty()) continue;
    TERAIO_CHECK(
        writes_recorded,
        "tensors[{}].written_at: the trace does not record writes (\"writes_recorded\" is not "
        "true), so no tensor may list them",
        t);
    for (size_t i = 0; i < w.size(); ++i) {
      const KernelIndex k = w[i];
      TERAIO_CHECK(
          i == 0 || w[i - 1] < k,
          "tensors[{}].written_at: kernel {} comes after kernel {}; the list must be sorted "
          "and distinct",
          t, k, w[i - 1]);
      TERAIO_CHECK(k < num_kernels(),
                   "tensors[{}].written_at: kernel {} is out of range (the trace has {} kernels)",
                   t, k, num_kernels());
      const auto listed = kernel_tensors(k);
      TERAIO_CHECK(
          std::find(listed.begin(), listed.end(), static_cast<TensorId>(t)) != listed.end(),
          "tensors[{}].written_at: kernel {} does not use the tensor (a kernel that writes "
          "a tensor lists it)",
          t, k);
    }
  }
}

bool has_recomputable(const Trace& trace) {
  return std::any_of(trace.tensors.begin(), trace.tensors.end(),
                     [](const TensorInfo& t) { return t.recomputable; });
}

// recompute_inputs and recompute_us: a part of the producer, rerun alone (TensorInfo).
void Trace::validate_nested_recompute(size_t t, const std::vector<KernelIndex>& first) const {
  const TensorInfo& info = tensors[t];
  TERAIO_CHECK(info.recomputable,
               "tensors[{}].{}: the tensor is not recomputable; only a recomputable tensor says what its "
               "recompute reads and costs",
               t, info.recompute_inputs ? "recompute_inputs" : "recompute_us");
  const KernelIndex p = *info.producer;
  if (info.recompute_us) {
    const double us = *info.recompute_us;
    TERAIO_CHECK(std::isfinite(us) && us >= 0 && us <= kernel_time_us(p),
                 "tensors[{}].recompute_us: must be a finite number from 0 to the producer's time ({} us, "
                 "kernel {}), got {}",
                 t, kernel_time_us(p), p, us);
  }
  if (!info.recompute_inputs) return;
  const auto listed = kernel_tensors(p);
  for (size_t j = 0; j < info.recompute_inputs->size(); ++j) {
    const TensorId i = (*info.recompute_inputs)[j];
    TERAIO_CHECK(i < tensors.size(), "tensors[{}].recompute_inputs[{}]: tensor {} is out of range (the trace has {} tensors)",
                 t, j, i, tensors.size());
    const bool input = std::find(listed.begin(), listed.end(), i) != listed.end() &&
                       (tensors[i].persistent || first[i] < p);
    TERAIO_CHECK(input,
                 "tensors[{}].recompute_inputs[{}]: tensor {} ({}) is not an input of the producer (kernel "
                 "{}, {}): a recompute reads only tensors its producer lists that exist before it runs",
                 t, j, i, tensors[i].name.empty() ? "unnamed" : tensors[i].name, p, kernel_name(p));
    TERAIO_CHECK(std::find(info.recompute_inputs->begin(), info.recompute_inputs->begin() + static_cast<std::ptrdiff_t>(j), i) ==
                     info.recompute_inputs->begin() + static_cast<std::ptrdiff_t>(j),
                 "tensors[{}].recompute_inputs[{}]: tensor {} is listed twice", t, j, i);
  }
}

// alive_until and producer: both need each tensor's first or last use.
void Trace::validate_per_tensor_kernels() const {
  if (std::none_of(tensors.begin(), tensors.end(), [](const TensorInfo& t) {
        return t.alive_until.has_value() || t.producer.has_value() || t.recomputable ||
               t.recompute_inputs.has_value() || t.recompute_us.has_value();
      })) {
    return;
  }
  constexpr KernelIndex kUnused = std::numeric_limits<KernelIndex>::max();
  std::vector<KernelIndex> first(tensors.size(), kUnused), last(tensors.size(), kUnused);
  for (size_t k = 0; k < num_kernels(); ++k) {
    for (TensorId id : kernel_tensors(static_cast<KernelIndex>(k))) {
      if (first[id] == kUnused) first[id] = static_cast<KernelIndex>(k);
      last[id] = static_cast<KernelIndex>(k);
    }
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorInfo& info = tensors[t];
    TERAIO_CHECK(!info.recomputable || info.producer,
                 "tensors[{}].recomputable: the tensor has no producer; only a tensor whose producing kernel "
                 "is known can be recomputed",
                 t);
    if (info.producer) {
      const KernelIndex p = *info.producer;
      TERAIO_CHECK(!info.persistent,
                   "tensors[{}].producer: the tensor is persistent (it exists before the iteration); only a "
                   "non-persistent tensor has a producer",
                   t);
      TERAIO_CHECK(p < num_kernels(), "tensors[{}].producer: kernel {} is out of range (the trace has {} kernels)",
                   t, p, num_kernels());
      TERAIO_CHECK(first[t] == p,
                   "tensors[{}].producer: kernel {} is not the tensor's first use ({}); the producing kernel must "
                   "list the tensor and come first",
                   t, p, first[t] == kUnused ? std::string("no kernel uses it") : fmt::format("kernel {}", first[t]));
    }
    if (info.recompute_inputs || info.recompute_us) validate_nested_recompute(t, first);
    if (!tensors[t].alive_until) continue;
    const KernelIndex until = *tensors[t].alive_until;
    TERAIO_CHECK(!tensors[t].persistent,
                 "tensors[{}].alive_until: the tensor is persistent (alive the whole iteration); only a "
                 "non-persistent tensor can have alive_until",
                 t);
    TERAIO_CHECK(until < num_kernels(),
                 "tensors[{}].alive_until: kernel {} is out of range (the trace has {} kernels)", t,
                 until, num_kernels());
    TERAIO_CHECK(last[t] != kUnused,
                 "tensors[{}].alive_until: no kernel uses the tensor, so it is never allocated and has no "
                 "life to extend",
                 t);
    TERAIO_CHECK(until >= last[t],
                 "tensors[{}].alive_until: kernel {} is before the tensor's last use (kernel {})", t,
                 until, last[t]);
  }
}

}  // namespace teraio
