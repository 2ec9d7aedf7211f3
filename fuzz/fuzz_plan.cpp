// libFuzzer target: the plan reader either parses (and the plan round-trips and can be checked
// against a small fixed trace without crashing) or raises teraio::Error. Never a crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "teraio/error.h"
#include "teraio/plan.h"
#include "teraio/plan_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const teraio::Trace trace = [] {
    teraio::Trace t;
    t.add_tensor({100, teraio::TensorKind::parameter, true, "w"});
    teraio::TensorInfo a{50, teraio::TensorKind::activation, false, "a"};
    a.alive_until = 7;  // a tail over kernels 7..7
    t.add_tensor(a);
    t.add_tensor({30, teraio::TensorKind::parameter, true, "idle"});  // no kernel uses it
    teraio::TensorInfo r{40, teraio::TensorKind::activation, false, "r"};
    r.producer = 2;  // made from w at kernel 2, used again at 5: a recompute can free it over 3..4
    r.recomputable = true;
    t.add_tensor(r);
    for (teraio::KernelIndex k = 0; k < 8; ++k) {
      std::vector<teraio::TensorId> ids;
      if (k % 3 == 0 || k == 2) ids.push_back(0);
      if (k == 1 || k == 6) ids.push_back(1);
      if (k == 2 || k == 5) ids.push_back(3);
      t.add_kernel("k", 1.0 + k, ids);
    }
    return t;
  }();
  static const teraio::Lifetimes lifetimes(trace);
  const std::string text(reinterpret_cast<const char*>(data), size);
  teraio::Plan plan;
  try {
    plan = teraio::parse_plan(text, "fuzz");
  } catch (const teraio::Error&) {
    return 0;
  }
  (void)teraio::check_plan(trace, lifetimes, plan);
  const std::string json = teraio::plan_to_json(plan);
  if (teraio::plan_to_json(teraio::parse_plan(json, "roundtrip")) != json) __builtin_trap();
  return 0;
}
