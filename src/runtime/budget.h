// The budget policy: every number derived from a Session's budget comes from here, so that the
// check that an operator fits, the target the engine evicts down to and the budget the planner is
// given cannot disagree. Plain value type, no I/O; the engine (src/runtime) and the controller
// (src/offload) each hold one, the controller pushing its untracked bytes to the engine.
#pragma once

#include <cstdint>

namespace teraio::runtime {

// Note [Budget policy]: the budget counts resident tracked bytes. On CUDA the device also holds
// memory that is not tracked (operator workspaces, temporaries inside composite operators, tensors
// under min_tensor_bytes, library workspaces): the controller measures it while recording
// (untracked_bytes) and every budget number leaves room for it.
//   - An operator's own tensors must fit: own + untracked <= budget, else it is a violation (the
//     step reports the largest such operator and the budget it would need).
//   - The engine evicts down to budget - untracked - extra (never below 0), where extra is the
//     room kept for what comes next: the bytes an operator creates in the plan's profile at its
//     start, or a read about to take memory.
//   - The planner plans for budget - untracked - margin, the margin (budget / 32, on CUDA only)
//     covering what the measurement missed; when nothing is left the plan cannot be made.
// A budget of 0 means no limit (engine tests); a Session's budget is always positive.
struct BudgetPolicy {
  uint64_t budget_bytes = 0;     // resident tracked bytes allowed (0: no limit)
  uint64_t untracked_bytes = 0;  // device memory used besides tracked tensors (measured on CUDA)
  bool device_margin = false;    // the tensors live on a device whose memory is measured (CUDA)

  bool limited() const { return budget_bytes > 0; }
  // What an operator needs at once: its own tensors and the untracked memory.
  uint64_t operator_need_bytes(uint64_t own_bytes) const { return own_bytes + untracked_bytes; }
  // The operator's own tensors alone do not fit in the budget.
  bool violated_by(uint64_t own_bytes) const {
    return limited() && operator_need_bytes(own_bytes) > budget_bytes;
  }
  // Resident bytes the engine evicts down to, keeping room for `extra_bytes` more.
  uint64_t resident_target_bytes(uint64_t extra_bytes = 0) const {
    const uint64_t keep = untracked_bytes + extra_bytes;
    return budget_bytes > keep ? budget_bytes - keep : 0;
  }
  // What the planner's budget leaves out: the untracked bytes and, on CUDA, a margin of 1/32.
  uint64_t planner_reserve_bytes() const {
    return untracked_bytes + (device_margin ? budget_bytes / 32 : 0);
  }
  // The planner's budget exists (something is left for tensors).
  bool can_plan() const { return planner_reserve_bytes() < budget_bytes; }
  // budget - reserve; call only when can_plan().
  uint64_t planner_budget_bytes() const { return budget_bytes - planner_reserve_bytes(); }
};

}  // namespace teraio::runtime
