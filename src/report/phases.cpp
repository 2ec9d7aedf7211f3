// Forward / backward / optimizer phases of a trace, inferred from kernel names and tensor kinds
// (nothing in trace v1 marks them). The heuristic and its limits are in docs/report.md, "Phases";
// the report draws the spans as bands behind its time and kernel-index charts.
#include <algorithm>
#include <cctype>
#include <string_view>
#include <vector>

#include "teraio/report.h"

namespace teraio {
namespace {

bool contains_backward(std::string_view name) {
  constexpr std::string_view kWord = "backward";
  if (name.size() < kWord.size()) return false;
  for (size_t i = 0; i + kWord.size() <= name.size(); ++i) {
    size_t j = 0;
    while (j < kWord.size() && std::tolower(static_cast<unsigned char>(name[i + j])) == kWord[j]) {
      ++j;
    }
    if (j == kWord.size()) return true;
  }
  return false;
}

}  // namespace

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::optimizer:
      return "optimizer";
  }
  return "forward";
}

std::vector<PhaseSpan> infer_phases(const Trace& trace) {
  const size_t n = trace.num_kernels();
  if (n == 0) return {};
  auto kind_of = [&](TensorId t) { return trace.tensors[t].kind; };

  // The optimizer starts at the first kernel touching an optimizer state, moved back over the
  // kernels just before it that touch parameters only (AdamW's decoupled weight decay).
  size_t opt_begin = n;
  for (size_t k = 0; k < n && opt_begin == n; ++k) {
    for (TensorId t : trace.kernel_tensors(static_cast<KernelIndex>(k))) {
      if (kind_of(t) == TensorKind::optimizer_state) {
        opt_begin = k;
        break;
      }
    }
  }
  while (opt_begin < n && opt_begin > 0) {
    const auto ids = trace.kernel_tensors(static_cast<KernelIndex>(opt_begin - 1));
    const bool params_only = !ids.empty() && std::all_of(ids.begin(), ids.end(), [&](TensorId t) {
      return kind_of(t) == TensorKind::parameter;
    });
    if (!params_only) break;
    --opt_begin;
  }

  // Before it: a kernel named "*backward*" or touching a gradient together with another tensor
  // switches to backward; a kernel creating an activation (its first use) switches to forward.
  std::vector<Phase> phase(n, Phase::optimizer);
  std::vector<bool> seen(trace.num_tensors(), false);
  Phase current = Phase::forward;
  for (size_t k = 0; k < opt_begin; ++k) {
    const auto kk = static_cast<KernelIndex>(k);
    bool backward = contains_backward(trace.kernel_name(kk));
    bool gradient = false, other = false, creates_activation = false;
    for (TensorId t : trace.kernel_tensors(kk)) {
      const TensorKind kind = kind_of(t);
      (kind == TensorKind::gradient ? gradient : other) = true;
      if (kind == TensorKind::activation && !seen[t]) creates_activation = true;
      seen[t] = true;
    }
    if (gradient && other) backward = true;
    if (backward) {
      current = Phase::backward;
    } else if (creates_activation) {
      current = Phase::forward;
    }
    phase[k] = current;
  }

  std::vector<PhaseSpan> raw;
  for (size_t k = 0; k < n; ++k) {
    if (raw.empty() || raw.back().phase != phase[k]) {
      raw.push_back({phase[k], static_cast<KernelIndex>(k), static_cast<KernelIndex>(k)});
    }
    raw.back().end = static_cast<KernelIndex>(k + 1);
  }
  // Merge short forward/backward spans into their predecessor (the optimizer is always kept).
  const size_t min_len = std::max<size_t>(1, n / 1000);
  std::vector<PhaseSpan> spans;
  for (const PhaseSpan& s : raw) {
    const bool short_span = s.end - s.begin < min_len && s.phase != Phase::optimizer;
    if (!spans.empty() &&
        (spans.back().phase == s.phase || (short_span && spans.back().phase != Phase::optimizer))) {
      spans.back().end = s.end;
    } else {
      spans.push_back(s);
    }
  }
  return spans;
}

}  // namespace teraio
