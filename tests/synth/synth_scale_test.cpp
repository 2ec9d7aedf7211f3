// The paper-scale trace: Llama3-70B at its defaults lands near 250k kernels and builds quickly
// (the planner benchmark relies on both).
#include <gtest/gtest.h>

#include <chrono>

#include "teraio/analysis.h"
#include "teraio/synth.h"

namespace teraio {
namespace {

TEST(SynthScale, Llama70bDefaultsNear250kKernelsInSeconds) {
  SynthOptions o;
  o.model = "llama3-70b";
  auto t0 = std::chrono::steady_clock::now();
  Trace trace = synthesize(o);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(trace.num_kernels(), 225000u);
  EXPECT_LT(trace.num_kernels(), 275000u);
  EXPECT_LT(seconds, 10.0);
  trace.validate();
  // fp32 AdamW: 16 bytes per parameter are persistent.
  const Lifetimes lifetimes(trace);
  uint64_t persistent = 0;
  for (const TensorInfo& t : trace.tensors) persistent += t.persistent ? t.bytes : 0;
  EXPECT_GE(persistent, 16 * parameter_count(model_shape("llama3-70b")));
  const auto curve = memory_curve(trace, lifetimes);
  ASSERT_EQ(curve.size(), trace.num_kernels());
}

}  // namespace
}  // namespace teraio
