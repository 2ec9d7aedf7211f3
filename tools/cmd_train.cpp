// `teraio train` (docs/train.md): runs the libtorch trainer `teraio-train`, which lives next to the
// `teraio` binary and is built only with -DTERAIO_WITH_TORCH=ON. Every argument after `train`
// (--help included) is passed through unchanged, so the two share one documented interface.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "command.h"
#include "teraio/error.h"

namespace teraio::cli {
namespace {

std::filesystem::path trainer_path() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  TERAIO_CHECK(!ec, "train: cannot locate the teraio binary (/proc/self/exe): {}", ec.message());
  return self.parent_path() / "teraio-train";
}

int run_train(const std::vector<std::string>& args) {
  const std::filesystem::path trainer = trainer_path();
  TERAIO_CHECK(::access(trainer.c_str(), X_OK) == 0,
               "train: {} not found: this teraio was built without PyTorch (configure with "
               "-DTERAIO_WITH_TORCH=ON, then build the teraio-train target; docs/train.md)",
               trainer.string());
  std::vector<std::string> owned;
  owned.push_back(trainer.string());
  owned.insert(owned.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(trainer.c_str(), argv.data());
  throw Error(fmt::format("train: cannot run {}: {}", trainer.string(), std::strerror(errno)));
}

const Registration kTrain{{
    "train",
    "Train a Llama-architecture model under a teraio Session (runs teraio-train; needs PyTorch)",
    70,
    [](CLI::App& sub) -> std::function<int()> {
      // Everything after `train`, --help too, belongs to teraio-train.
      sub.set_help_flag();
      sub.prefix_command();
      sub.allow_extras();
      return [&sub]() { return run_train(sub.remaining()); };
    },
}};

}  // namespace
}  // namespace teraio::cli
