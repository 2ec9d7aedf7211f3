// Trace rewrites (include/teraio/transform.h, docs/transform.md).
#include "teraio/transform.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "teraio/analysis.h"
#include "teraio/error.h"

namespace teraio {
namespace {

constexpr int64_t kNone = -1;
constexpr KernelIndex kNoKernel = std::numeric_limits<KernelIndex>::max();

// The optimizer part: from the first kernel touching an optimizer state, moved back over the
// kernels right before it that touch only parameters (AdamW's weight decay); docs/report.md.
KernelIndex optimizer_begin(const Trace& trace) {
  const auto n = static_cast<KernelIndex>(trace.num_kernels());
  KernelIndex first = n;
  for (KernelIndex k = 0; k < n && first == n; ++k) {
    for (TensorId t : trace.kernel_tensors(k)) {
      if (trace.tensors[t].kind == TensorKind::optimizer_state) {
        first = k;
        break;
      }
    }
  }
  TERAIO_CHECK(first < n,
               "the trace has no optimizer state tensors (kind \"optimizer_state\"), so its "
               "optimizer step cannot be found: profile the step with the optimizer watched "
               "(Session.watch(model, optimizer)), which names parameters, gradients and states");
  auto only_parameters = [&](KernelIndex k) {
    const auto ts = trace.kernel_tensors(k);
    return !ts.empty() && std::all_of(ts.begin(), ts.end(), [&](TensorId t) {
      return trace.tensors[t].kind == TensorKind::parameter;
    });
  };
  while (first > 0 && only_parameters(first - 1)) --first;
  return first;
}

// One kernel of the rewritten trace: old kernel `old`, whole (owner kNone) or the part of a split
// kernel that touches parameter `owner`'s tensors.
struct Part {
  KernelIndex old = 0;
  int64_t owner = kNone;
};

}  // namespace

Trace move_optimizer_into_backward(const Trace& trace, StepInBackwardInfo* info) {
  TERAIO_CHECK(trace.meta_value("step_in_backward") != "true",
               "the trace already runs each parameter's update in the backward "
               "(meta step_in_backward)");
  const auto n = static_cast<KernelIndex>(trace.num_kernels());
  const size_t nt = trace.tensors.size();
  const KernelIndex opt = optimizer_begin(trace);

  // Owners by name: a parameter owns itself; "w.grad", "w.exp_avg", "w.denom" belong to "w".
  std::unordered_map<std::string_view, TensorId> params;
  for (TensorId t = 0; t < nt; ++t) {
    if (trace.tensors[t].kind == TensorKind::parameter) params.emplace(trace.tensors[t].name, t);
  }
  std::vector<int64_t> owner(nt, kNone);
  for (TensorId t = 0; t < nt; ++t) {
    const TensorInfo& info_t = trace.tensors[t];
    if (info_t.kind == TensorKind::parameter) {
      owner[t] = t;
      continue;
    }
    if (info_t.kind == TensorKind::activation) continue;
    const size_t dot = info_t.name.rfind('.');
    if (dot == std::string::npos) continue;
    const auto it = params.find(std::string_view(info_t.name).substr(0, dot));
    if (it != params.end()) owner[t] = it->second;
  }

  // First and last use of every tensor in the original order.
  // made_before: used before the optimizer by a kernel with other tensors (a gradient's kernel
  // in backward, not zero_grad's zero_ at the step's start, which touches gradients alone).
  std::vector<KernelIndex> first(nt, kNoKernel), last_before(nt, kNoKernel);
  std::vector<uint8_t> made_before(nt, 0);
  for (KernelIndex k = 0; k < n; ++k) {
    const auto ts = trace.kernel_tensors(k);
    for (TensorId t : ts) {
      if (first[t] == kNoKernel) first[t] = k;
      if (k < opt) {
        last_before[t] = k;
        made_before[t] |= ts.size() > 1;
      }
    }
  }

  // A gradient the trace could not name (freed before the step ended, as zero_grad after
  // optimizer.step() frees it) belongs to the parameter whose update reads it: the one optimizer
  // kernel that touches it together with that parameter's tensors.
  for (KernelIndex k = opt; k < n; ++k) {
    int64_t one = kNone;
    bool several = false;
    for (TensorId t : trace.kernel_tensors(k)) {
      if (owner[t] < 0) continue;
      several |= one != kNone && one != owner[t];
      one = owner[t];
    }
    if (one == kNone || several) continue;
    for (TensorId t : trace.kernel_tensors(k)) {
      if (owner[t] == kNone && trace.tensors[t].kind == TensorKind::gradient) owner[t] = one;
    }
  }

  // Each optimizer kernel's owners: one parameter, several (split), or none (stays at the end). A
  // temporary the optimizer makes belongs to the parameter of the kernel that made it.
  std::vector<std::vector<int64_t>> kernel_owners(n);
  for (KernelIndex k = opt; k < n; ++k) {
    std::vector<int64_t>& owners = kernel_owners[k];
    for (TensorId t : trace.kernel_tensors(k)) {
      if (owner[t] >= 0 && std::find(owners.begin(), owners.end(), owner[t]) == owners.end()) {
        owners.push_back(owner[t]);
      }
    }
    if (owners.empty()) continue;
    std::vector<TensorId> made;
    for (TensorId t : trace.kernel_tensors(k)) {
      if (owner[t] == kNone && !trace.tensors[t].persistent && first[t] == k) made.push_back(t);
    }
    if (owners.size() == 1) {
      for (TensorId t : made) owner[t] = owners[0];
      continue;
    }
    // A foreach operator over several parameters returns one tensor per list entry, in the
    // order of its inputs (_foreach_sqrt of the second moments): the j-th tensor it makes belongs
    // to the j-th parameter it touches, if their sizes agree.
    bool one_each = made.empty() || made.size() == owners.size();
    for (size_t j = 0; one_each && j < made.size(); ++j)
      one_each = trace.tensors[made[j]].bytes == trace.tensors[static_cast<size_t>(owners[j])].bytes;
    TERAIO_CHECK(one_each,
                 "kernel {} ({}) updates {} parameters at once and makes {} tensors that cannot be "
                 "given to them (by name, or one of a parameter's size per parameter in order), "
                 "such as tensor {} ('{}'); such a trace cannot be rewritten",
                 k, trace.kernel_name(k), owners.size(), made.size(), made.front(),
                 trace.tensors[made.front()].name);
    for (size_t j = 0; j < made.size(); ++j) owner[made[j]] = owners[j];
  }

  // Where each parameter's update goes: after the last kernel before the optimizer that touches
  // its gradient, if backward made one (a parameter whose gradient only zero_grad touched got none
  // this step: no hook runs for it, optimizer.step() updates it). Nothing else of the parameter
  // may be used between there and the optimizer.
  std::vector<KernelIndex> insert_after(nt, kNoKernel);
  for (TensorId t = 0; t < nt; ++t) {
    if (trace.tensors[t].kind != TensorKind::gradient || owner[t] < 0 || !made_before[t]) continue;
    const auto p = static_cast<TensorId>(owner[t]);
    if (last_before[t] != kNoKernel &&
        (insert_after[p] == kNoKernel || last_before[t] > insert_after[p])) {
      insert_after[p] = last_before[t];
    }
  }
  for (TensorId t = 0; t < nt; ++t) {
    if (owner[t] < 0 || trace.tensors[t].kind == TensorKind::gradient) continue;
    const KernelIndex at = insert_after[static_cast<size_t>(owner[t])];
    if (at == kNoKernel || last_before[t] == kNoKernel || last_before[t] <= at) continue;
    const auto p = static_cast<size_t>(owner[t]);
    throw Error(fmt::format(
        "'{}' is used at kernel {} ({}) after the gradient of '{}' is complete (kernel {}): "
        "updating that parameter in the backward would change what the kernel reads",
        trace.tensors[t].name, last_before[t], trace.kernel_name(last_before[t]),
        trace.tensors[p].name, at));
  }

  // The new order: the kernels before the optimizer, each followed by the updates that go after
  // it (in their order), then what stays at the end.
  std::vector<std::vector<Part>> after(opt);
  std::vector<Part> tail;
  StepInBackwardInfo out_info;
  std::vector<uint8_t> moved_param(nt, 0), kept_param(nt, 0);
  for (KernelIndex k = opt; k < n; ++k) {
    if (kernel_owners[k].empty()) {
      tail.push_back({k, kNone});
      continue;
    }
    const bool split = kernel_owners[k].size() > 1;
    out_info.split_kernels += split;
    bool moved = false;
    for (int64_t q : kernel_owners[k]) {
      const KernelIndex at = insert_after[static_cast<size_t>(q)];
      const Part part{k, split ? q : kNone};
      if (at == kNoKernel) {
        tail.push_back(part);
        kept_param[static_cast<size_t>(q)] = 1;
      } else {
        after[at].push_back(part);
        moved_param[static_cast<size_t>(q)] = 1;
        moved = true;
      }
    }
    out_info.moved_kernels += moved;
  }
  std::vector<Part> order;
  order.reserve(n + out_info.split_kernels * 4);
  for (KernelIndex k = 0; k < opt; ++k) {
    order.push_back({k, kNone});
    for (const Part& p : after[k]) order.push_back(p);
  }
  for (const Part& p : tail) order.push_back(p);
  for (size_t p = 0; p < nt; ++p) {
    out_info.parameters += moved_param[p];
    out_info.kept_after += kept_param[p] && !moved_param[p];
  }

  // The rewritten trace: the same tensors, the kernels in the new order (a split kernel's part
  // lists its parameter's tensors and those of no parameter, its time shared by bytes).
  Trace out;
  out.meta = trace.meta;
  out.tensors = trace.tensors;
  for (TensorInfo& ti : out.tensors) ti.alive_until.reset();  // remapped below, once uses are known
  out.writes_recorded = trace.writes_recorded;
  out.set_meta("step_in_backward", "true");
  size_t uses = 0;
  for (const Part& part : order) uses += trace.kernel_tensors(part.old).size();
  out.reserve_kernels(order.size(), uses);
  // new_at[old kernel] = its new indices (several for a split kernel).
  std::vector<std::vector<KernelIndex>> new_at(n);
  std::vector<TensorId> ids;
  for (const Part& part : order) {
    const auto tensors = trace.kernel_tensors(part.old);
    double time_us = trace.kernel_time_us(part.old);
    double host_us = trace.kernel_host_us(part.old);
    if (part.owner == kNone) {
      ids.assign(tensors.begin(), tensors.end());
    } else {
      ids.clear();
      double mine = 0, all = 0;
      for (TensorId t : tensors) {
        const auto bytes = static_cast<double>(trace.tensors[t].bytes);
        if (owner[t] >= 0) all += bytes;
        if (owner[t] == part.owner) mine += bytes;
        if (owner[t] == part.owner || owner[t] == kNone) ids.push_back(t);
      }
      time_us = all > 0 ? time_us * mine / all : 0;
      host_us = all > 0 ? host_us * mine / all : 0;
    }
    new_at[part.old].push_back(static_cast<KernelIndex>(out.num_kernels()));
    out.add_kernel(trace.kernel_name(part.old), time_us, ids);
    if (trace.has_host_times())
      out.set_kernel_host_us(static_cast<KernelIndex>(out.num_kernels() - 1), host_us);
    if (trace.kernel_reads_back(part.old))  // each part of a split one: it read back once, somewhere
      out.set_kernel_reads_back(static_cast<KernelIndex>(out.num_kernels() - 1), true);
  }

  // Kernel indices of the tensors follow their kernels: for a split kernel, the part that lists
  // the tensor (the last part when none does: an alive_until there).
  auto remap = [&](KernelIndex k, TensorId t) {
    const std::vector<KernelIndex>& at = new_at[k];
    if (at.size() == 1) return at[0];
    for (KernelIndex m : at) {
      const auto ts = out.kernel_tensors(m);
      if (std::find(ts.begin(), ts.end(), t) != ts.end()) return m;
    }
    return at.back();
  };
  const Lifetimes life(out);  // uses only: alive_until is not set yet
  for (TensorId t = 0; t < nt; ++t) {
    TensorInfo& ti = out.tensors[t];
    for (KernelIndex& w : ti.written_at) w = remap(w, t);
    std::sort(ti.written_at.begin(), ti.written_at.end());
    ti.written_at.erase(std::unique(ti.written_at.begin(), ti.written_at.end()),
                        ti.written_at.end());
    // A tensor with alive_until or a producer is used (the input trace is valid).
    if (const auto until = trace.tensors[t].alive_until)
      ti.alive_until = std::max(remap(*until, t), life.last_use(t));
    if (ti.producer) {
      ti.producer = remap(*ti.producer, t);
      if (*ti.producer != life.first_use(t)) {  // no longer made first: unknown
        ti.producer.reset();
        ti.recomputable = false;
        ti.recompute_inputs.reset();
        ti.recompute_us.reset();
      }
    }
  }

  // A recompute of a nested operator (recompute_inputs) stays one only while its inputs are still
  // inputs of its producer's kernel (a split kernel lists its own parameter's tensors), and costs
  // at most that kernel's time.
  for (TensorId t = 0; t < nt; ++t) {
    TensorInfo& ti = out.tensors[t];
    if (!ti.recomputable) continue;
    if (ti.recompute_us) ti.recompute_us = std::min(*ti.recompute_us, out.kernel_time_us(*ti.producer));
    if (!ti.recompute_inputs) continue;
    const std::vector<TensorId> inputs = kernel_inputs(out, life, *ti.producer);
    for (TensorId x : *ti.recompute_inputs) {
      if (std::find(inputs.begin(), inputs.end(), x) != inputs.end()) continue;
      ti.recomputable = false;
      ti.recompute_inputs.reset();
      ti.recompute_us.reset();
      ++out_info.recompute_cleared;
      break;
    }
  }
  // A recomputable tensor stays so only if no input of its recompute is written between the
  // production and the tensor's last use in the new order (the updates now run earlier). Without
  // recorded writes, a moved update kernel is taken to write every tensor it touches.
  std::vector<std::vector<KernelIndex>> written(nt);
  for (TensorId t = 0; t < nt; ++t) written[t] = out.tensors[t].written_at;
  if (!out.writes_recorded) {
    for (KernelIndex k = opt; k < n; ++k) {
      if (kernel_owners[k].empty()) continue;
      for (KernelIndex m : new_at[k]) {
        for (TensorId t : out.kernel_tensors(m)) written[t].push_back(m);
      }
    }
  }
  for (TensorId t = 0; t < nt; ++t) {
    TensorInfo& ti = out.tensors[t];
    if (!ti.recomputable) continue;
    const KernelIndex made = *ti.producer;
    const KernelIndex until = life.last_use(t);
    bool stale = false;
    for (TensorId x : recompute_reads(out, life, t)) {
      for (KernelIndex w : written[x]) stale |= w > made && w <= until;
    }
    if (stale) {
      ti.recomputable = false;
      ti.recompute_inputs.reset();
      ti.recompute_us.reset();
      ++out_info.recompute_cleared;
    }
  }
  out.validate();
  if (info != nullptr) *info = out_info;
  return out;
}

}  // namespace teraio
