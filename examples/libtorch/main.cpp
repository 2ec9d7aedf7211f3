// A minimal libtorch program trained under teraio::Session (docs/pytorch.md): an MLP, the C++
// AdamW (it steps parameter by parameter, so teraio can keep the other parameters out), a budget
// below the training state, a host tier and a file tier. Prints the losses and the Session's
// stats. Usage: train_mlp [--device cpu|cuda] [--steps N] [--budget SIZE] [--tier-dir DIR]
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "teraio/error.h"
#include "teraio/session.h"
#include "teraio/units.h"

int main(int argc, char** argv) {
  std::string device_name = "cpu", budget_text, tier_dir;
  int steps = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr,
                   "usage: %s [--device cpu|cuda] [--steps N] [--budget SIZE] [--tier-dir DIR]\n",
                   argv[0]);
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--device")
      device_name = value;
    else if (arg == "--steps")
      steps = std::atoi(value.c_str());
    else if (arg == "--budget")
      budget_text = value;
    else if (arg == "--tier-dir")
      tier_dir = value;
    else {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  const bool own_dir = tier_dir.empty();
  try {
    if (own_dir) {  // a fresh directory for the file tier, removed at the end
      char tmpl[] = "/tmp/teraio-libtorch-example-XXXXXX";
      if (!mkdtemp(tmpl)) throw teraio::Error("cannot create a directory under /tmp");
      tier_dir = tmpl;
    }
    const torch::Device device(device_name);
    torch::manual_seed(0);
    // Several layers, none large: the budget must hold one operator's tensors (AdamW's step of the
    // largest weight touches it and its two states), and the rest can be out.
    torch::nn::Sequential model(torch::nn::Linear(256, 512), torch::nn::ReLU());
    for (int i = 0; i < 4; ++i) {
      model->push_back(torch::nn::Linear(512, 512));
      model->push_back(torch::nn::ReLU());
    }
    model->push_back(torch::nn::Linear(512, 10));
    model->to(device);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));

    // Parameters, gradients and two AdamW states: 4 times the parameters' bytes; half of that.
    uint64_t state_bytes = 0;
    for (const auto& p : model->parameters()) state_bytes += 4 * p.nbytes();
    teraio::SessionOptions options;
    options.budget_bytes =
        budget_text.empty() ? state_bytes / 2 : teraio::parse_size(budget_text, "--budget");
    // Tiers in order of preference for evictions: a little host memory, then files. Bandwidths
    // left at 0 are measured by the Session at the first step.
    teraio::SessionTier host;
    host.kind = teraio::SessionTier::Kind::kHost;
    host.capacity_bytes = 4 * teraio::kMiB;
    teraio::SessionTier file;
    file.kind = teraio::SessionTier::Kind::kFile;
    file.paths = {tier_dir};
    file.capacity_bytes = teraio::kGiB;
    options.tiers = {host, file};
    std::printf("MLP on %s: training state %s, budget %s, file tier in %s\n", device_name.c_str(),
                teraio::format_bytes(double(state_bytes)).c_str(),
                teraio::format_bytes(double(options.budget_bytes)).c_str(), tier_dir.c_str());
    teraio::Session session(options);

    auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
    for (int step = 0; step < steps; ++step) {
      const at::Tensor x = at::randn({64, 256}, gen).to(device);
      const at::Tensor y = at::randint(0, 10, {64}, gen).to(device);
      at::Tensor loss;
      {
        // One step: forward, backward, optimizer. The guard's destructor ends the step and throws
        // what the step met (teraio::IoError for a failed transfer, teraio::Error for a budget that
        // could not be met).
        auto guard = session.step();
        optimizer.zero_grad();
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        loss.backward();
        optimizer.step();
      }
      std::printf("step %d: loss %.4f  mode %s\n", step, loss.item<float>(),
                  session.stats().mode.c_str());
    }

    // torch::save reads memory directly: bring every offloaded tensor back first.
    session.fetch_all();
    std::ostringstream checkpoint;
    torch::save(model, checkpoint);
    std::printf("checkpoint: %zu bytes\n", checkpoint.str().size());

    const teraio::SessionStats st = session.stats();
    std::printf(
        "teraio: mode %s, %llu steps, peak resident %s, offloaded %s, prefetched %s, "
        "plan_moves %llu, urgent_fetches %llu, evictions %llu, drift_events %llu\n",
        st.mode.c_str(), (unsigned long long)st.iteration,
        teraio::format_bytes(double(st.peak_resident_bytes)).c_str(),
        teraio::format_bytes(double(st.bytes_offloaded)).c_str(),
        teraio::format_bytes(double(st.bytes_prefetched)).c_str(),
        (unsigned long long)st.plan_moves, (unsigned long long)st.urgent_fetches,
        (unsigned long long)st.evictions, (unsigned long long)st.drift_events);
    for (const auto& t : st.tiers)
      std::printf("  tier %s (%s): read %.2f GB/s (%s), write %.2f GB/s (%s)\n", t.name.c_str(),
                  t.engine.c_str(), t.read_gbps, t.read_source.c_str(), t.write_gbps,
                  t.write_source.c_str());
    session.close();                   // everything back, tier files removed
  } catch (const std::exception& e) {  // teraio::Error (and IoError), c10::Error
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::fprintf(stderr, "error: %s\n", c10_error ? c10_error->what_without_backtrace() : e.what());
    if (own_dir && !tier_dir.empty()) rmdir(tier_dir.c_str());  // the Session removed its files
    return 1;
  }
  if (own_dir) rmdir(tier_dir.c_str());
  return 0;
}
