// The trace of one training iteration (format teraio.trace v2, docs/formats.md; v1 is still read):
// the tensors, with the operator that produced each and whether rerunning it recreates the same
// bytes, and, for every operator ("kernel") in order, its device time and the tensors it touches;
// optionally (writes_recorded) which kernels write each tensor in place.
// A Trace is a plain value: not thread-safe to mutate, safe to share read-only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace teraio {

using TensorId = uint32_t;
using KernelIndex = uint32_t;

enum class TensorKind : uint8_t { parameter, gradient, optimizer_state, activation, temporary, other };
constexpr int kNumTensorKinds = 6;

std::string_view to_string(TensorKind kind);
// Returns false if `name` is not one of the six kinds.
bool parse_tensor_kind(std::string_view name, TensorKind* kind);

struct TensorInfo {
  uint64_t bytes = 0;
  TensorKind kind = TensorKind::other;
  // Exists before the iteration starts and after it ends: its unused gap wraps around.
  bool persistent = false;
  std::string name;
  // Non-persistent tensors only: the last kernel through which the tensor's memory stays allocated
  // although no kernel after its last use touches it (held by a Python variable, or a gradient
  // freed at zero_grad). Not a use. Unset means its last use; when set, it is >= the last use.
  std::optional<KernelIndex> alive_until;
  // Non-persistent tensors only (format v2): the kernel that produced the tensor, which is its first
  // use. Unset: unknown, or made outside the traced operators (a v1 trace sets none).
  std::optional<KernelIndex> producer;
  // Rerunning `producer` on the same inputs recreates these bytes exactly (deterministic, no random
  // numbers unless their generator state is saved, no aliasing output, its inputs not mutated
  // since, the tensor not mutated in place after production), so the tensor may be freed and
  // recomputed (docs/formats.md, "Recompute"). Requires `producer`. Its cost is the producer's
  // kernel time.
  bool recomputable = false;
  // Only with recomputable (format v2): the tensor is made by an operator nested in its producer
  // (autocast's cast of a weight inside aten::linear), and a recompute reruns that operator alone:
  // it reads only these of the producer's inputs (tensors the producer lists that exist before it
  // runs) and takes recompute_us (at most the producer's time). Unset: the producer is rerun whole,
  // reading all its inputs, for its kernel time. recompute_reads() and recompute_time_us() give
  // either.
  std::optional<std::vector<TensorId>> recompute_inputs;
  std::optional<double> recompute_us;
  // Only when the trace's writes_recorded: the kernels at which the tensor is written in place,
  // sorted and distinct, each one listing the tensor (a write seen between a kernel's predecessor
  // use and it is the kernel's). Empty: not written in place in the iteration (a non-persistent
  // tensor's producer making it is not a write in place). Note [Clean offloads] in plan_check.cpp.
  std::vector<KernelIndex> written_at;
};

// Bounds every trace keeps (docs/formats.md, "Bounds"), checked by the reader and by validate():
// the bytes of all tensors together are at most 2^53 (8 PiB; exact as a double, and any sum the
// analysis, planner or simulator makes stays far below 2^63), and the kernel times together at most
// 1e15 us (about 31.7 years; finite however many iterations are simulated). So no sum of bytes or
// times overflows or becomes inf anywhere, and none needs checked arithmetic.
constexpr uint64_t kMaxTraceBytes = 1ull << 53;
constexpr double kMaxTraceTimeUs = 1e15;

class Trace {
 public:
  // Free-form metadata ("model", "device", ...) as (key, raw JSON value) pairs in file order.
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<TensorInfo> tensors;
  // Whoever made the trace knows every write in place (each tensor's written_at). False: writes
  // are unknown and every use may write (a tensor read back is never known to be unchanged).
  bool writes_recorded = false;

  size_t num_kernels() const { return kernel_time_us_.size(); }
  size_t num_tensors() const { return tensors.size(); }

  std::string_view kernel_name(KernelIndex k) const { return names_[kernel_name_id_[k]]; }
  double kernel_time_us(KernelIndex k) const { return kernel_time_us_[k]; }
  std::span<const TensorId> kernel_tensors(KernelIndex k) const {
    return {tensor_ids_.data() + offsets_[k], tensor_ids_.data() + offsets_[k + 1]};
  }
  std::span<const double> kernel_times_us() const { return kernel_time_us_; }
  // Format v2, optional: the host's time to reach and launch kernel k (from the end of the
  // previous operator's launch to the end of this one's, callbacks of whoever recorded it
  // excluded; docs/formats.md). 0 where the trace records none: the simulator then takes the host
  // to keep ahead of the device (Note [The host lane] in simulator.cpp).
  double kernel_host_us(KernelIndex k) const {
    return kernel_host_us_.empty() ? 0.0 : kernel_host_us_[k];
  }
  bool has_host_times() const { return !kernel_host_us_.empty(); }
  // Sets kernel k's host time (the first call gives every other kernel 0).
  void set_kernel_host_us(KernelIndex k, double host_us);
  // Format v2, optional: kernel k's operator copies a value from the device to the host and the
  // host waits for it (a tensor's item(), nonzero's size; docs/formats.md): the copy queues behind
  // the device-to-host transfers issued before it (Note [Reads back behind the writes] in
  // simulator.cpp). False where the trace records none.
  bool kernel_reads_back(KernelIndex k) const {
    return !kernel_reads_back_.empty() && kernel_reads_back_[k] != 0;
  }
  bool has_reads_back() const { return !kernel_reads_back_.empty(); }
  void set_kernel_reads_back(KernelIndex k, bool reads_back);

  // Appends a kernel. Tensor ids must refer to tensors already added (checked by validate()).
  // Duplicate ids within one kernel are collapsed.
  void add_kernel(std::string_view name, double time_us, std::span<const TensorId> tensors);
  TensorId add_tensor(TensorInfo info) {
    tensors.push_back(std::move(info));
    return static_cast<TensorId>(tensors.size() - 1);
  }
  void set_kernel_time_us(KernelIndex k, double time_us) { kernel_time_us_[k] = time_us; }
  void reserve_kernels(size_t kernels, size_t uses);

  // Value of meta key `key` as raw JSON, or empty if absent.
  std::string meta_value(std::string_view key) const;
  void set_meta(std::string key, std::string raw_json_value);
  // Sum of all kernel times.
  double total_time_us() const;

  // Throws teraio::Error on ids out of range, negative or non-finite times (host times too), traces beyond the
  // bounds above, an alive_until that is out of range, before the tensor's last use, on a
  // persistent tensor or on an unused one, and a producer that is not the tensor's first use (or
  // is on a persistent tensor) or a recomputable tensor without a producer, recompute_inputs or
  // recompute_us on a tensor that is not recomputable, a recompute input that is not an input of
  // the producer, a recompute_us above the producer's time, and a written_at that
  // is not sorted and distinct, names a kernel out of range or one that does not use the tensor,
  // or is given while writes_recorded is false, naming the field ("tensors[3].bytes: ...").
  void validate() const;
  // The messages of the two bounds, shared by validate() and the reader.
  static std::string bytes_bound_message(uint64_t bytes);
  static std::string time_bound_message(double time_us);

 private:
  std::vector<std::string> names_;
  std::vector<uint32_t> kernel_name_id_;
  std::vector<double> kernel_time_us_;
  std::vector<double> kernel_host_us_;  // empty: none recorded
  std::vector<uint8_t> kernel_reads_back_;  // empty: none recorded
  std::vector<uint64_t> offsets_{0};
  std::vector<TensorId> tensor_ids_;
  std::vector<std::pair<std::string, uint32_t>> name_index_;  // sorted lookup for interning
  uint32_t intern(std::string_view name);
  void validate_per_tensor_kernels() const;
  void validate_nested_recompute(size_t t, const std::vector<KernelIndex>& first) const;
  void validate_writes() const;
};

// Whether some tensor of the trace is recomputable (the planner's default for recompute).
bool has_recomputable(const Trace& trace);

// Reads a teraio.trace v1 or v2 JSON file (v1 tensors have no producer: none is recomputable; a
// file without writes_recorded records no writes, whatever its version). Throws teraio::Error
// naming the file, the field and the position ("kernels[12].time_us: expected a number") on
// malformed input or an unknown version.
Trace read_trace(const std::string& path);
Trace parse_trace(std::string_view json, std::string_view source = "<trace>");
// Writes teraio.trace JSON (one kernel per line): v1 when no tensor has a producer, else v2;
// writes_recorded and written_at only when set. Throws teraio::Error if the file cannot be written.
void write_trace(const Trace& trace, const std::string& path);
std::string trace_to_json(const Trace& trace);

}  // namespace teraio
