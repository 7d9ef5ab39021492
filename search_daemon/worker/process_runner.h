// Runs one external program (the CPU compiler, or its --version) under a wall-clock budget and
// collects what it printed.
//
//   StatusOr<ProcessResult> r = run_process({"c++", "-c", "kernel.cc"}, scratch_dir, /*budget_ms=*/60000);
//   if (!r.ok()) ...                  // could not run it at all (no such program, no pipe, ...)
//   else if (r->timed_out) ...        // killed at the budget
//   else if (r->exited && r->exit_code == 0) ...
//
// Promises: argv[0] is found on PATH and run with stdin from /dev/null, stdout and stderr into one
// pipe, default signal dispositions and an empty signal mask, in its own process group. When the
// budget runs out the whole group is killed (the driver and every tool it started), and after a
// normal exit any tool the driver left behind is killed too; the leader is always reaped, on every
// path, so no compiler keeps running and no zombie is left. The output is capped at
// kMaxProcessOutputBytes (the program is still drained past the cap). Nothing throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace kforge {

// The most of a program's output kept in ProcessResult::output (1 MiB).
inline constexpr size_t kMaxProcessOutputBytes = size_t{1} << 20;

struct ProcessResult {
  bool timed_out = false;
  bool exited = false;     // exited normally (else: killed by a signal)
  int exit_code = 0;
  int signal = 0;
  std::string output;      // stdout and stderr, interleaved, at most kMaxProcessOutputBytes
  bool output_truncated = false;
};

// Runs argv[0] (PATH search) in `dir` (if not empty), stdin from /dev/null, stdout and stderr into
// one pipe, in its own process group so the watchdog can kill the driver and every tool it started.
// The wait is a poll on the pipe and on a pidfd with the remaining budget as its timeout: no
// sleeping, and a compile that finishes early returns at once.
StatusOr<ProcessResult> run_process(const std::vector<std::string>& args, const std::string& dir, uint32_t budget_ms);

}  // namespace kforge
