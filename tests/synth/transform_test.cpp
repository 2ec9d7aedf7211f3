// move_optimizer_into_backward (include/teraio/transform.h): the rewritten trace of a loop is the
// trace synth writes for the same loop with --step-in-backward (kernel for kernel, tied embeddings,
// autocast, foreach kernels split by parameter), also when the gradients have no names (as the
// Session records them when zero_grad frees them inside the step); recompute is withdrawn where an
// update now writes a producer's input before the tensor's last use; misuse is an error.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "teraio/error.h"
#include "teraio/synth.h"
#include "teraio/transform.h"
#include "one_micro_batch.h"

namespace teraio {
namespace {

// Each kernel as its name and the sorted names of its tensors: tensor ids differ between the two
// traces (synth makes an update's temporaries when it runs it), names do not.
std::vector<std::string> kernels_by_name(const Trace& trace) {
  std::vector<std::string> out;
  for (KernelIndex k = 0; k < trace.num_kernels(); ++k) {
    std::vector<std::string> names;
    for (TensorId t : trace.kernel_tensors(k)) names.push_back(trace.tensors[t].name);
    std::sort(names.begin(), names.end());
    out.push_back(fmt::format("{}({})", trace.kernel_name(k), fmt::join(names, ",")));
  }
  return out;
}

TEST(StepInBackward, RewriteIsWhatSynthWritesForThatLoop) {
  for (const char* model : {"tiny", "llama-1b"}) {  // llama-1b ties its embeddings
    for (bool foreach : {false, true}) {
      for (SynthDtype dtype : {SynthDtype::fp32, SynthDtype::amp}) {
        SCOPED_TRACE(fmt::format("{} foreach={} amp={}", model, foreach, dtype == SynthDtype::amp));
        SynthOptions o = one_micro_batch(model, foreach, dtype);
        const Trace after = synthesize(o);
        o.step_in_backward = true;
        const Trace want = synthesize(o);
        StepInBackwardInfo info;
        const Trace got = move_optimizer_into_backward(after, &info);
        EXPECT_EQ(kernels_by_name(got), kernels_by_name(want));
        EXPECT_EQ(got.meta_value("step_in_backward"), "true");
        const size_t params = std::string(model) == "tiny" ? 2 * 9 + 3 : 2 * 9 + 2;
        EXPECT_EQ(info.parameters, params);
        EXPECT_EQ(info.kept_after, 0u);
        EXPECT_EQ(info.split_kernels, foreach ? 8u : 0u);
        // Splitting shares a kernel's time: the total stays.
        EXPECT_NEAR(got.total_time_us(), after.total_time_us(), 1e-6 * after.total_time_us());
        got.validate();
      }
    }
  }
}

TEST(StepInBackward, UnnamedGradientsBelongToTheUpdateThatReadsThem) {
  Trace after = synthesize(one_micro_batch("tiny", false, SynthDtype::fp32));
  const Trace want = move_optimizer_into_backward(after);
  for (TensorId t = 0; t < after.num_tensors(); ++t) {
    if (after.tensors[t].kind == TensorKind::gradient) after.tensors[t].name = fmt::format("op{}.out0", t);
  }
  StepInBackwardInfo info;
  const Trace got = move_optimizer_into_backward(after, &info);
  EXPECT_EQ(info.parameters, 2u * 9 + 3);
  ASSERT_EQ(got.num_kernels(), want.num_kernels());
  for (KernelIndex k = 0; k < got.num_kernels(); ++k) {
    EXPECT_EQ(got.kernel_name(k), want.kernel_name(k)) << k;
    EXPECT_EQ(got.kernel_tensors(k).size(), want.kernel_tensors(k).size()) << k;
  }
}

// PyTorch's default optimizer on CUDA is foreach: its _foreach_sqrt returns one unnamed tensor per
// parameter, in the order of its inputs, and the rewrite gives each to its parameter by position.
TEST(StepInBackward, UnnamedForeachTemporariesGoToTheirParameterByPosition) {
  for (SynthDtype dtype : {SynthDtype::fp32, SynthDtype::amp}) {
    SynthOptions o = one_micro_batch("llama-1b", true, dtype);
    Trace after = synthesize(o);
    const Trace want = move_optimizer_into_backward(after);
    size_t renamed = 0;
    for (TensorId t = 0; t < after.num_tensors(); ++t) {
      if (after.tensors[t].name.ends_with(".denom")) {
        after.tensors[t].name = fmt::format("op{}.out{}", t, t % 7);
        ++renamed;
      }
    }
    ASSERT_EQ(renamed, 2u * 9 + 2);
    StepInBackwardInfo info;
    const Trace got = move_optimizer_into_backward(after, &info);
    EXPECT_EQ(info.split_kernels, 8u);
    ASSERT_EQ(got.num_kernels(), want.num_kernels());
    for (KernelIndex k = 0; k < got.num_kernels(); ++k) {
      ASSERT_EQ(got.kernel_name(k), want.kernel_name(k)) << k;
      const auto a = got.kernel_tensors(k), b = want.kernel_tensors(k);
      EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << k;
    }
    // Sizes that do not match the parameters in order cannot be given: an error, not a guess.
    Trace wrong = after;
    for (TensorId t = 0; t < wrong.num_tensors(); ++t) {
      if (wrong.tensors[t].name.starts_with("op") && wrong.tensors[t].bytes > 4096) {
        wrong.tensors[t].bytes += 4;
        break;
      }
    }
    EXPECT_THROW(move_optimizer_into_backward(wrong), Error);
  }
}

// A hand-made iteration: W makes A in the forward, W's gradient G is made from A at kernel 1, A is
// used again after that (kernel 2), then AdamW: weight decay, lerp_ on M with G, the update of W.
Trace hand_made(bool use_w_late) {
  Trace t;
  t.writes_recorded = true;
  t.tensors.resize(4);
  auto set = [&](TensorId id, const char* name, TensorKind kind, bool persistent) {
    t.tensors[id].name = name;
    t.tensors[id].kind = kind;
    t.tensors[id].persistent = persistent;
    t.tensors[id].bytes = 1024;
  };
  set(0, "w", TensorKind::parameter, true);
  set(1, "a", TensorKind::activation, false);
  set(2, "op7.out0", TensorKind::gradient, false);
  set(3, "w.exp_avg", TensorKind::optimizer_state, true);
  t.add_kernel("fwd", 10, std::vector<TensorId>{0, 1});
  t.add_kernel("grad", 10, std::vector<TensorId>{2, 1});  // G from A (and the output's gradient)
  t.add_kernel("late", 10, use_w_late ? std::vector<TensorId>{1, 0} : std::vector<TensorId>{1});
  t.add_kernel("aten::mul_", 1, std::vector<TensorId>{0});
  t.add_kernel("aten::lerp_", 1, std::vector<TensorId>{3, 2});
  t.add_kernel("aten::addcdiv_", 1, std::vector<TensorId>{0, 3});
  t.tensors[1].producer = 0;
  t.tensors[1].recomputable = true;
  t.tensors[2].producer = 1;
  t.tensors[0].written_at = {3, 5};
  t.tensors[3].written_at = {4};
  t.validate();
  return t;
}

TEST(StepInBackward, RecomputeIsWithdrawnWhereAnInputIsNowWrittenEarlier) {
  StepInBackwardInfo info;
  const Trace got = move_optimizer_into_backward(hand_made(false), &info);
  ASSERT_EQ(got.num_kernels(), 6u);
  EXPECT_EQ(got.kernel_name(2), "aten::mul_");  // right after the gradient
  EXPECT_EQ(got.kernel_name(5), "late");
  EXPECT_EQ(got.tensors[0].written_at, (std::vector<KernelIndex>{2, 4}));
  EXPECT_EQ(got.tensors[3].written_at, (std::vector<KernelIndex>{3}));
  // A, made from W and used after W's update, could not be made again from the same W.
  EXPECT_FALSE(got.tensors[1].recomputable);
  EXPECT_EQ(info.recompute_cleared, 1u);
  EXPECT_EQ(got.tensors[1].producer, 0u);
}

// A parameter whose gradient only zero_grad touched (zero_ at the step's start, no gradient from
// this backward) gets no hook call: its update stays after the backward.
TEST(StepInBackward, AParameterWithoutAGradientThisStepKeepsItsUpdateAfter) {
  Trace t;
  t.tensors.resize(7);
  const char* names[] = {"w", "a", "op2.out0", "w.exp_avg", "v", "v.grad", "v.exp_avg"};
  const TensorKind kinds[] = {TensorKind::parameter,       TensorKind::activation,
                              TensorKind::gradient,        TensorKind::optimizer_state,
                              TensorKind::parameter,       TensorKind::gradient,
                              TensorKind::optimizer_state};
  for (TensorId i = 0; i < 7; ++i) {
    t.tensors[i].name = names[i];
    t.tensors[i].kind = kinds[i];
    t.tensors[i].persistent = i != 1 && i != 2;
    t.tensors[i].bytes = 1024;
  }
  t.add_kernel("aten::zero_", 1, std::vector<TensorId>{5});
  t.add_kernel("fwd", 10, std::vector<TensorId>{0, 1});
  t.add_kernel("grad", 10, std::vector<TensorId>{2, 1});
  t.add_kernel("aten::mul_", 1, std::vector<TensorId>{0});
  t.add_kernel("aten::lerp_", 1, std::vector<TensorId>{3, 2});
  t.add_kernel("aten::mul_", 1, std::vector<TensorId>{4});
  t.add_kernel("aten::lerp_", 1, std::vector<TensorId>{6, 5});
  t.validate();
  StepInBackwardInfo info;
  const Trace got = move_optimizer_into_backward(t, &info);
  EXPECT_EQ(info.parameters, 1u);
  EXPECT_EQ(info.kept_after, 1u);
  ASSERT_EQ(got.num_kernels(), 7u);
  EXPECT_EQ(got.kernel_name(2), "grad");
  EXPECT_EQ(got.kernel_name(3), "aten::mul_");  // w's weight decay right after its gradient
  EXPECT_EQ(got.kernel_tensors(3)[0], 0u);
  EXPECT_EQ(got.kernel_tensors(5)[0], 4u);  // v's update still last, after w's
}

TEST(StepInBackward, MisuseIsAnErrorNamingTheCause) {
  auto message = [](const Trace& t) {
    try {
      move_optimizer_into_backward(t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // W is read after its gradient is complete: updating it there would change that read.
  EXPECT_NE(message(hand_made(true)).find("'w' is used at kernel 2 (late) after the gradient"),
            std::string::npos);
  // Applied twice.
  EXPECT_NE(message(move_optimizer_into_backward(hand_made(false))).find("already"),
            std::string::npos);
  // No optimizer states: nothing to say where the step is.
  Trace none = hand_made(false);
  none.tensors[3].kind = TensorKind::other;
  EXPECT_NE(message(none).find("Session.watch(model, optimizer)"), std::string::npos);
}

}  // namespace
}  // namespace teraio
