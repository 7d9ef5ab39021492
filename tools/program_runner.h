// Runs a user's program as a child of `kforge run`/`warm`/`demo`: with extra environment
// variables, signals forwarded, and its exit status returned so the caller can pass it on.
//
//   ProgramResult r = run_program({"python3", "serve.py"}, {{"KFORGE_MODE", "active"}}, err);
//   if (!r.started) return r.exit_code;           // 126 or 127, with one line on err
//   ... summary ...
//   return exit_like(r);                          // the child's code, or dies by its signal
//
// Note [Signal forwarding]
// The child stays in kforge's process group, so a terminal's Ctrl-C / Ctrl-\ / hangup reaches it
// directly, like any foreground program's; kforge does not forward those (the child would get two).
// A signal another process sends to kforge alone (kill PID, a supervisor's SIGTERM; si_code <= 0)
// is forwarded to the child, and kforge keeps waiting: the child decides when to exit. When the
// child dies by a signal, exit_like() re-raises it on kforge (default action), so the parent shell
// or supervisor sees exactly what it would have seen without kforge (128 + n, or a core dump).
// Exit codes of kforge's own failures follow env(1): 125 kforge failed before the program ran, 126 the
// program was found but could not be run, 127 it was not found.
#pragma once

#include <sys/types.h>

#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace kforge {

constexpr int kExitKforgeFailed = 125;
constexpr int kExitCannotRun = 126;
constexpr int kExitNotFound = 127;

struct ProgramResult {
  bool started = false;
  int exit_code = 0;    // the child's exit code; or 125/126/127 when it did not start
  int signal = 0;       // non-zero: the child died by this signal
  bool core = false;
  double wall_s = 0;
};

// Runs argv (argv[0] looked up on PATH) with the environment of this process plus `set` (each
// value replaces the variable's) and without the variables in `unset`. Blocks until it exits.
ProgramResult run_program(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
                          const std::vector<std::string>& unset, const std::string& who, std::ostream& err);

// What `kforge run` exits with: the child's exit code, or its signal re-raised on this process
// (it returns 128 + n only if the signal does not end this process).
int exit_like(const ProgramResult& r);

// "killed by SIGTERM", "exit code 3", for summaries.
std::string describe_result(const ProgramResult& r);

}  // namespace kforge
