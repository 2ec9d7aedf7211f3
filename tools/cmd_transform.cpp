// `teraio transform`: rewrites a profiled trace into the trace the same loop would record with one
// change (docs/transform.md), to plan and simulate that change before running it.
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "teraio/error.h"
#include "teraio/transform.h"
#include "teraio/units.h"

namespace teraio::cli {
namespace {

struct TransformArgs {
  std::string trace_path;
  std::string output;
  bool step_in_backward = false;
};

int run_transform(const TransformArgs& args) {
  TERAIO_CHECK(args.step_in_backward,
               "transform: say which change to make (--step-in-backward is the one there is)");
  const Trace trace = read_trace(args.trace_path);
  StepInBackwardInfo info;
  const Trace out = move_optimizer_into_backward(trace, &info);
  write_trace(out, args.output);
  fmt::print(
      "{}: {} kernels ({} before), the updates of {} parameters moved into the backward ({} kept "
      "after it), {} kernels moved, {} split by parameter, {} tensors no longer recomputable; "
      "kernel time {} (was {})\n",
      args.output, out.num_kernels(), trace.num_kernels(), info.parameters, info.kept_after,
      info.moved_kernels, info.split_kernels, info.recompute_cleared,
      format_us(out.total_time_us()), format_us(trace.total_time_us()));
  return 0;
}

const Registration kTransform{{
    "transform",
    "Rewrite a trace as the same loop would record it with a change (--step-in-backward)",
    25,
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<TransformArgs>();
      sub.add_option("trace", args->trace_path, "trace file (teraio.trace JSON)")->required();
      sub.add_flag("--step-in-backward", args->step_in_backward,
                   "each parameter's optimizer update runs in the backward right after its "
                   "gradient is complete, as Session.watch(..., step_in_backward=True) runs it");
      sub.add_option("-o,--output", args->output, "trace file to write (JSON)")->required();
      return [args] { return run_transform(*args); };
    },
}};

}  // namespace
}  // namespace teraio::cli
