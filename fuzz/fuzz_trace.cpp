// libFuzzer target: any byte string given to the trace reader either parses into a trace that
// survives analysis and a write/read round trip unchanged, or raises teraio::Error. Never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "teraio/analysis.h"
#include "teraio/error.h"
#include "teraio/plan_check.h"
#include "teraio/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  teraio::Trace trace;
  try {
    trace = teraio::parse_trace(text, "fuzz");
  } catch (const teraio::Error&) {
    return 0;
  }
  trace.validate();
  const teraio::Lifetimes lifetimes(trace);
  (void)teraio::inactive_periods(trace, lifetimes);
  (void)teraio::active_bytes(trace);
  teraio::Plan empty;
  empty.budget_bytes = ~0ull;
  if (!teraio::check_plan(trace, lifetimes, empty).valid && trace.num_kernels() > 0) __builtin_trap();
  const std::string json = teraio::trace_to_json(trace);
  if (teraio::trace_to_json(teraio::parse_trace(json, "roundtrip")) != json) __builtin_trap();
  return 0;
}
