// Entry point of the `teraio` command: builds the CLI from the registered subcommands and turns
// every error into one line on stderr and an exit status: 1 for an error (a bad value, a bad input
// file, a failed write), 2 for a command line that does not parse, 70 for a bug (README.md and
// each docs/ page, "Exit status"). Standard output is checked at the end: output that did not
// arrive is an error.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "command.h"
#include "teraio/error.h"
#include "teraio/version.h"

namespace teraio::cli {
std::vector<CommandSpec>& registry() {
  static std::vector<CommandSpec> commands;
  return commands;
}
}  // namespace teraio::cli

namespace {

int stdout_failed(int error) {
  std::fprintf(stderr, "teraio: cannot write to standard output: %s\n", std::strerror(error));
  return 1;
}

// Flushes standard output (fmt::print's FILE* and CLI11's std::cout) and says whether every byte
// written to it arrived; a full disk or a closed pipe found only here would otherwise exit 0.
// `earlier_error`: errno right after output that may have failed and flushed (std::endl).
int finish_stdout(int status, int earlier_error = 0) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno != 0 ? errno : earlier_error;
  std::cout.flush();  // synced with stdio: nothing of its own is left, only its state to check
  if (!flushed || std::ferror(stdout) || !std::cout) {
    return status != 0 ? status : stdout_failed(error != 0 ? error : EIO);
  }
  return status;
}

// fmt::print throws std::system_error "cannot write to file" when a write to stdout fails.
bool is_stdout_write_error(const std::system_error& e) {
  return std::string_view(e.what()).starts_with("cannot write to file");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace teraio;
  CLI::App app{"teraio: lifetime-aware tensor offloading to host memory and SSDs", "teraio"};
  // One line per usage error, like every other error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("teraio: error: {} (see --help)\n", e.what());
  });
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("teraio ") + version());
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
  } catch (const CLI::ValidationError& e) {
    // A value out of its range (the options' checks): an error like any bad value, status 1.
    app.exit(e);
    return finish_stdout(1);
  } catch (const CLI::ParseError& e) {
    errno = 0;
    const int status = app.exit(e) == 0 ? 0 : 2;  // --help and --version print here
    return finish_stdout(status, errno);
  }
  // Errors go out with fprintf, which cannot throw: fmt::print would throw on a broken stderr.
  try {
    for (auto& [sub, fn] : runners) {
      if (sub->parsed()) return finish_stdout(fn());
    }
    return 2;
  } catch (const cli::StdoutError& e) {
    return stdout_failed(e.error);
  } catch (const teraio::Error& e) {
    std::fprintf(stderr, "teraio: error: %s\n", e.what());
    return 1;
  } catch (const teraio::InternalError& e) {
    std::fprintf(stderr, "teraio: %s\n", e.what());
    return 70;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "teraio: error: out of host memory\n");
    return 1;
  } catch (const std::system_error& e) {
    if (is_stdout_write_error(e)) return stdout_failed(e.code().value());
    std::fprintf(stderr, "teraio: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "teraio: error: %s\n", e.what());
    return 1;
  }
}
