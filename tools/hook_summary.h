// What a program did under kforge, from the files its hooked processes leave at exit
// (KFORGE_SUMMARY_DIR=<dir>: <dir>/kforge-summary-<pid>.json each, see hook_main.cc), for the
// summary `kforge run` prints and the numbers `kforge warm` and `kforge demo` report.
//
//   RunSummary s = read_run_summary(dir);
//   print_run_summary(s, err);            // one screen: operators, kernels, estimated time saved
//
// Note [Estimated time saved]
// Per signature with an active entry: its active calls times (PyTorch's median time - the entry's
// median time), both measured in that process during its shadow trial on the same inputs
// (Note [In-process check] in swapper.h). Operators' time: calls times the mean of the hook's
// sampled timings. Both are estimates of kernel time, not of the program's wall time: kernels on
// a GPU overlap with the host, and an end-to-end gain is only known by timing the whole step
// (`kforge warm` and `kforge demo` do).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/human_units.h"

namespace kforge {

struct RunSummary {
  struct Op {
    uint64_t calls = 0;
    double time_ns = 0;          // estimated: calls x mean sampled time
    uint32_t signatures = 0;
  };
  struct Kernel {
    std::string op, signature, entry, backend;
    std::map<std::string, uint32_t> states;   // state -> processes in it (active, shadow, no_win, disabled)
    std::string reason;                        // the last non-empty one
    uint64_t active_calls = 0;
    double pytorch_median_ns = 0, entry_median_ns = 0;   // the largest active-call process's
    double saved_ns = 0;
  };
  uint32_t processes = 0;
  double wall_s = 0;             // the longest process
  std::string mode;
  std::string cache_dir;
  std::map<std::string, Op> ops;           // by operator name ("aten::_softmax")
  std::vector<Kernel> kernels;             // every signature that had an entry in some process
  uint32_t signatures = 0;
  double op_time_ns = 0;
  double saved_ns = 0;
  std::vector<std::string> problems;       // unreadable or malformed files, named
  std::vector<nlohmann::json> ab;          // each process's "ab" object (KFORGE_AB_WINDOW_MS runs)
  uint32_t active() const;
};

RunSummary read_run_summary(const std::string& dir);
void print_run_summary(const RunSummary& s, std::ostream& out);
nlohmann::json run_summary_json(const RunSummary& s);

}  // namespace kforge
