// Subcommand registry of the `teraio` command: each tools/cmd_*.cpp registers itself with a
// static Registration, so adding a command touches no other file.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace teraio::cli {

struct CommandSpec {
  std::string name;
  std::string summary;
  int order = 100;  // position in --help
  // Adds options to `sub` and returns the function that runs the command (exit status).
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<CommandSpec>& registry();

struct Registration {
  explicit Registration(CommandSpec spec) { registry().push_back(std::move(spec)); }
};

// Standard output failed (a full disk, a closed pipe); main() reports it and exits with status 1.
struct StdoutError {
  int error = 0;  // errno
};

// Flushes standard output now (progress a person is watching); throws StdoutError on failure.
inline void flush_stdout() {
  if (std::fflush(stdout) != 0) throw StdoutError{errno};
}

}  // namespace teraio::cli
