// Entry point of the `teraio` command: builds the CLI from the registered subcommands and turns
// every teraio::Error into a one-line message and exit status 1 (2 for usage errors).
#include <algorithm>
#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include "command.h"
#include "teraio/error.h"

namespace teraio::cli {
std::vector<CommandSpec>& registry() {
  static std::vector<CommandSpec> commands;
  return commands;
}
}  // namespace teraio::cli

int main(int argc, char** argv) {
  using namespace teraio;
  CLI::App app{"teraio: lifetime-aware tensor offloading to host memory and SSDs", "teraio"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "teraio 0.1.0");
  auto& commands = cli::registry();
  std::stable_sort(commands.begin(), commands.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  std::function<int()> run;
  std::vector<std::pair<CLI::App*, std::function<int()>>> runners;
  for (auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.summary);
    runners.emplace_back(sub, c.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (auto& [sub, fn] : runners) {
      if (sub->parsed()) return fn();
    }
    return 2;
  } catch (const teraio::Error& e) {
    fmt::print(stderr, "teraio: error: {}\n", e.what());
    return 1;
  } catch (const teraio::InternalError& e) {
    fmt::print(stderr, "teraio: {}\n", e.what());
    return 70;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "teraio: error: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "teraio: error: {}\n", e.what());
    return 1;
  }
}
