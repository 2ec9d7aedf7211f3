// Runs the built `teraio` binary for the command-line tests: through /bin/sh, so ARGS may hold
// redirections and a `ulimit`, with stdout and stderr together, and says how it ended.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace teraio::test {

struct CmdResult {
  int status = -1;  // exit status; -1 when killed by a signal
  int signal = 0;   // the signal that killed it, or 0
  std::string out;  // stdout and stderr
};

inline std::string teraio_binary() {
  return std::string(TERAIO_BINARY_DIR) + "/bin/teraio";
}

// `prefix` runs before teraio in the same shell (e.g. "ulimit -f 1;").
inline CmdResult run_teraio(const std::string& args, const std::string& prefix = "") {
  // ARGS' own redirections apply to teraio; what is left of stderr joins stdout in the pipe.
  const std::string cmd = "{ " + prefix + " " + teraio_binary() + " " + args + "; } 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t got = 0;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, got);
  const int st = pclose(p);
  if (WIFEXITED(st)) {
    r.status = WEXITSTATUS(st);
    // sh reports a child killed by signal N as 128 + N.
    if (r.status > 128 && r.status < 128 + 65) r.signal = r.status - 128;
  } else if (WIFSIGNALED(st)) {
    r.signal = WTERMSIG(st);
  }
  return r;
}

}  // namespace teraio::test
