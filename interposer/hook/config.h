// HookConfig: every KFORGE_* setting the hook reads, parsed once when the hook loads.
//
//   HookConfig config = parse_config(process_env());
//   for (const std::string& w : config.warnings) log_line(w);   // one line per bad value
//   if (config.log) log_line("config: " + config.to_string());
//
// Variables (a bad value gives one warning naming the variable and the value, and the default):
//   KFORGE_DAEMON_ENDPOINT      ipc://... or tcp://...; default ipc://$XDG_RUNTIME_DIR/kforge/
//                               daemon.sock, else ipc:///tmp/kforge-<uid>/daemon.sock; "none": no
//                               daemon (the cache only; counters stay in the process, nothing is
//                               reported or dropped: `kforge run --no-daemon`). daemon_endpoint is
//                               then empty
//   KFORGE_DAEMON_SERVER_KEY    with a tcp:// endpoint (required there, refused with ipc://): the
//                               daemon's CURVE public key, 40 z85 characters (kforged
//                               --curve-keygen prints it). A tcp:// endpoint without a valid key
//                               falls back to the default endpoint, with one warning
//   KFORGE_CACHE_DIR            recorded as given (the cache library resolves the default); set but
//                               empty is a bad value (one warning, the default)
//   KFORGE_MODE                 observe (default) | shadow | active.
//                               observe: nothing is ever loaded. shadow: cache entries are loaded
//                               and run beside PyTorch's kernel on every call, PyTorch's result is
//                               returned. active: after KFORGE_SHADOW_CALLS clean shadow calls the
//                               entry replaces PyTorch's kernel.
//   KFORGE_SHADOW_CALLS         clean shadow calls before an entry's trial passes (1..1000000,
//                               default 20)
//   KFORGE_CONFIRM_WIN          0/1 (same spellings as below); default on. On: an entry whose trial
//                               passed goes active only if it was faster than PyTorch's kernel on
//                               the trial's calls in this process (Note [In-process win] in
//                               swapper.h); else it stays out ("no_win"). Off: correct is enough
//   KFORGE_SAMPLE_RATE          per thread and signature, time the first call and then one in N
//                               (1..1000000, default 64)
//   KFORGE_REPORT_INTERVAL_MS   how often counters go to the daemon (10..3600000, default 1000)
//   KFORGE_OPS                  comma-separated allow list ("aten::add.Tensor", "add", "_softmax");
//                               empty or unset: every catalog operator. Names that are not catalog
//                               operators get one warning; a list of nothing but such names is a
//                               bad value (one warning, every catalog operator)
//   KFORGE_DENY_OPS             comma-separated deny list, same spellings; wins over KFORGE_OPS
//   KFORGE_CAPTURE_INPUTS       0/1 (also off/on, false/true, no/yes); default off. On: the inputs
//                               of a few calls per signature go to the daemon (input_sampler.h);
//                               they are user data
//   KFORGE_LOG                  0/1 (same spellings): log the configuration and registrations.
//                               Off (the default), a process prints nothing unless something is
//                               wrong (a bad value, a failure)
//   KFORGE_SUMMARY_DIR          an existing, writable directory: at a normal exit each process
//                               (each forked or spawned child too) writes kforge-summary-<pid>.json
//                               there (Note [Exit summary] in hook_main.cc). Unset or empty: none.
//                               A directory that is missing, not a directory or not writable gets
//                               one line at start (resolve_summary_dir) and no file
//   KFORGE_AB_WINDOW_MS         0 (default, off) or 50..60000: `kforge warm`'s end-to-end check
//                               (Note [End-to-end A/B] in ab_driver.h): the reporter alternates,
//                               window by window, among the replacement tables with all, none and
//                               all but one of the active entries and counts calls in each; sets
//                               the report interval to the window and KFORGE_OBSERVE_EVERY to 1.
//                               Never in production (each switch publishes a table never freed)
//   KFORGE_BENCH_TOGGLE         0/1 (same spellings); default off. For benchmarks only: lets
//                               kforge_hook_bench_set_interceptors() take the interceptors out of
//                               the dispatcher and put them back (Note [Bench toggle] in
//                               interceptor.cc); never set it in production
//
// Parsing is a pure function of the lookup, so tests pass a table instead of the environment.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cache/cache_dir.h"   // EnvLookup, process_env()
#include "runtime/daemon_endpoint.h"

namespace kforge::hook {

enum class HookMode : uint8_t { kObserve, kShadow, kActive };
std::string_view hook_mode_name(HookMode m) noexcept;

struct HookConfig {
  std::string daemon_endpoint;
  std::string daemon_server_key;         // KFORGE_DAEMON_SERVER_KEY: empty unless the endpoint is tcp://
  std::string cache_dir;                 // KFORGE_CACHE_DIR as given; empty if unset
  HookMode requested_mode = HookMode::kObserve;
  HookMode mode = HookMode::kObserve;    // what runs (= requested_mode)
  uint32_t sample_rate = 64;
  // KFORGE_OBSERVE_EVERY: of an operator with no replacement loaded, about one call in this many
  // (per thread) is observed (Note [Observed calls] in interceptor.cc); 1: every call.
  uint32_t observe_every = 16;
  uint32_t shadow_calls = 20;
  bool confirm_win = true;               // KFORGE_CONFIRM_WIN
  // KFORGE_TIMING_PAIRS: a CPU entry's trial ends with this many pairs of calls served alternately
  // by PyTorch's kernel and the entry, each timed alone (Note [Timing phase] in swapper.h); 0: the
  // win is judged on the shadow calls' times instead.
  uint32_t timing_pairs = 20;
  uint32_t report_interval_ms = 1000;
  uint32_t ab_window_ms = 0;              // KFORGE_AB_WINDOW_MS (kforge warm's last run); 0: off
  // KFORGE_OPS named catalog operators: only allow_ops are intercepted.
  bool ops_restricted = false;
  std::vector<std::string> allow_ops;    // as written, trimmed
  std::vector<std::string> deny_ops;
  bool capture_inputs = false;
  bool log = false;
  bool bench_toggle = false;             // KFORGE_BENCH_TOGGLE
  std::string summary_dir;               // KFORGE_SUMMARY_DIR as given; empty: no exit summary
  // Lines to log once at start, whatever KFORGE_LOG says: bad values, unknown operator names,
  // modes that are not implemented yet.
  std::vector<std::string> warnings;

  // Whether the catalog operator `name` (+ `overload`) is to be intercepted under
  // KFORGE_OPS / KFORGE_DENY_OPS.
  bool op_selected(std::string_view name, std::string_view overload) const;
  // One line: mode=observe endpoint=ipc://... sample_rate=64 ...
  std::string to_string() const;
};

HookConfig parse_config(const EnvLookup& env);

// KFORGE_SUMMARY_DIR checked against the file system (so not in parse_config, which stays a pure
// function of the lookup): `path` is the directory as an absolute path, or empty with `problem`
// the one line to log, naming the variable and the value:
//   "KFORGE_SUMMARY_DIR='/x' does not exist; no summary will be written"
struct SummaryDir {
  std::string path;
  std::string problem;
};
SummaryDir resolve_summary_dir(const std::string& value);

// Shared with the daemon and the CLI (runtime/daemon_endpoint.h).
using kforge::default_daemon_endpoint;
using kforge::secure_ipc_directory;

// Whether a KFORGE_OPS entry names the operator: "aten::add.Tensor", "add.Tensor", "aten::add"
// and "add" all name aten::add.Tensor; the namespace is optional, the overload too.
bool op_name_matches(std::string_view entry, std::string_view name, std::string_view overload);

}  // namespace kforge::hook
