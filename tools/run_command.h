// `kforge run [options] [--] CMD ARGS...`: runs a program under kforge (see kRunUsage in
// run_command.cc, and docs/REFERENCE.md "kforge run").
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "tools/hook_summary.h"
#include "tools/program_runner.h"

namespace kforge {

// What `run`, `warm` and `demo` share: how a program is started under the hook.
struct HookedRun {
  std::string mode = "active";          // observe | shadow | active
  bool no_daemon = false;
  std::string cache_dir;                // resolved, absolute; empty: the hook's default rules
  std::string endpoint;                 // the daemon's (empty with no_daemon)
  std::map<std::string, std::string> extra_env;   // more variables for the program
};

struct HookedResult {
  ProgramResult program;
  RunSummary summary;
};

// Runs argv under the hook as `run` would (the daemon must already be running, or no_daemon).
// `who` prefixes error lines ("kforge run").
HookedResult run_hooked(const HookedRun& how, const std::vector<std::string>& argv, const std::string& who,
                        std::ostream& err);

// The cache directory kforge uses: --cache-dir, else KFORGE_CACHE_DIR, else the XDG rule; made
// absolute. Empty with an error line when it cannot be resolved.
std::string resolve_cache_dir(const std::string& given, const std::string& who, std::ostream& err);

int run_run_command(const std::vector<std::string>& args, const std::string& cache_dir, std::ostream& out,
                    std::ostream& err);

}  // namespace kforge
