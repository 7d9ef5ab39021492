// DaemonConfig: everything kforged can be told, from a TOML file and command-line flags (flags win),
// validated once at start-up: a bad value stops the daemon with one line naming the key, the value
// and what is allowed. The resolved configuration is logged at start (no secrets in it: the LLM key
// is only ever named by its environment variable).
//
//   StatusOr<DaemonConfig> c = load_daemon_config(argc, argv, process_env());
//   if (!c.ok()) { fprintf(stderr, "kforged: %s\n", c.status().message().c_str()); return 2; }
//
// The keys, their defaults and meaning: daemon_config_reference() (also `kforged --help-config`, and
// docs/ARCHITECTURE.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/cache_dir.h"
#include "runtime/status.h"
#include "search_daemon/evaluator/worker_process.h"

namespace kforge::daemon {

struct LlmSettings {
  bool enabled = false;
  std::string api = "openai";          // "openai" (chat completions; vLLM, llama.cpp, Ollama) or "anthropic"
  std::string base_url;                // required when enabled
  std::string model;                   // required when enabled
  std::string api_key_env;             // the NAME of the variable holding the key; empty: no key
  uint32_t max_tokens = 4096;          // per answer
  double temperature = 0.2;
  uint32_t timeout_ms = 900000;         // one request: real models take minutes for a kernel
  bool stream = true;                  // Note [Streamed answers] (llm_client.cc)
  uint32_t stream_idle_timeout_ms = 300000;
  uint32_t max_retries = 4;
  // Note [LLM requests in the background] (llm_proposer.cc): conversations at once while the
  // workers evaluate (0: a search waits for each answer), and per search.
  uint32_t concurrent_requests = 4;
  uint32_t requests_per_search = 2;
  uint64_t max_total_tokens = 2000000; // the daemon's whole LLM budget
  double max_cost_usd = 20.0;
  double price_input_per_mtok = 0;     // USD per million input tokens (0: free / local)
  double price_output_per_mtok = 0;
};

struct DaemonConfig {
  std::string config_file;             // the file read, if any
  // [daemon]
  std::string endpoint;                // ROUTER for hooks and the CLI (default: the hook's default)
  std::string events_endpoint;         // PUB for notifications (default: beside endpoint, events.sock)
  std::string http;                    // "127.0.0.1:PORT" for /metrics, the JSON API and the GUI; "" = off
  std::string gui_dir;                 // the GUI's files; "": <kforged's directory>/../share/kforge/gui
  std::string cache_dir;               // the kernel cache (cache_dir.h rules when empty)
  std::string state_dir;               // journals; default <cache_dir>/../kforge-state? see .cc
  std::string curve_secret_key_file;   // required for tcp:// endpoints (CURVE server key, z85)
  std::string log_format = "text";     // "text" or "json"
  // Note [Bounded state] in hot_signatures.h: what any client can make the daemon keep.
  uint32_t max_processes = 1024;       // process records (a record per connection), attached or gone
  uint32_t max_signatures = 16384;     // signatures in the registry; the coldest are evicted past it
  uint32_t max_signatures_per_process = 8192;
  uint32_t process_timeout_s = 60;     // a process that sends nothing this long is gone (hooks report every <= 10 s)
  // [workers]
  std::vector<std::string> devices;    // "cpu", "cuda:N", or "auto" (every visible GPU, plus cpu)
  uint32_t cpu_slots = 1;              // CPU workers
  uint32_t cpu_threads = 0;            // torch threads of a CPU worker (0: torch's default)
  uint32_t prebuild_threads = 4;       // Note [Builds ahead] (prebuilder.h); 0: none
  std::string worker_program;          // kforge-worker; default beside kforged
  std::string worker_python;           // KFORGE_PYTHON for workers; default: theirs (python3)
  // Note [Idle workers] in evaluator/worker_process.h: "idle" unless a staging host says "normal".
  eval::WorkerPriority worker_priority = eval::WorkerPriority::kIdle;
  uint32_t compile_budget_ms = 60000;
  uint32_t run_budget_ms = 30000;
  // [search]
  std::string strategy = "mcts";       // "mcts", "greedy", "random"
  uint32_t max_evaluations_per_signature = 64;
  uint64_t max_evaluations_total = 100000;
  uint32_t max_seconds_per_signature = 1800;
  // Note [First wins]: searches in flight share the slots evaluation by evaluation (each keeps
  // one job per idle slot, the pool's queue is first come, first served), so eight at once give
  // every hot signature its first, prior-ranked candidates within seconds of being listed. With 2,
  // on an H100 through kforged (4 softmax signatures, 64 evaluations each), the third and fourth
  // signatures waited for the first two to spend their budgets: first wins 112-120 s after they
  // were listed, against 0-4 s for the first two (bench/results/2026-12-07-h100-prebuild-ab-5936214.md).
  // The price: the hottest signature's deep search advances at its share of the slots.
  uint32_t concurrent_searches = 8;
  // Note [Yielding searches]: with every search slot taken and a hot signature that no search has
  // evaluated yet waiting, a search that has published a win and spent at least this many
  // evaluations stops (its in-flight evaluations finish, its journal keeps the tree) and gives its
  // place to that signature; it resumes from its journal once no unsearched signature waits (Note
  // [Search priority] in hot_signatures.h). One search yields at a time: the next only once the
  // last has stopped and its place has been taken.
  // With 8 searches of 24 evaluations on an H100, the ninth signature of a per-op warm had its
  // first win 141 s after it was listed (bench/results/2026-12-07-h100-per-op-new-kernels-5ffbe2e-warm.md):
  // it waited for one of the eight to spend its whole budget. 0: searches never yield.
  uint32_t yield_after_evaluations = 8;
  uint64_t min_calls = 50;             // a signature is a search candidate after this many calls
  double min_time_share = 0.0;         // ... and this share of the process's intercepted time
  uint64_t seed = 0;
  uint32_t measure_runs = 30;
  // Note [Plausible timing] in worker/measurer.h: a baseline over this many times the cost model's
  // expectation, or the serving processes' observed time, is re-measured and never published.
  double max_baseline_model_ratio = 250;
  double max_baseline_observed_ratio = 20;
  double c_puct = 1.0;
  double widening_c = 2.0;
  double widening_alpha = 0.5;
  // [proposers]
  bool templates = true;
  LlmSettings llm;

  // One line per key, for the start-up log.
  std::string to_string() const;
};

// Parses `--config FILE` (else $KFORGE_DAEMON_CONFIG, else no file) and the flags. `env` gives the
// defaults that depend on the environment (XDG directories, uid).
StatusOr<DaemonConfig> load_daemon_config(const std::vector<std::string>& args, const EnvLookup& env);

// The same, from TOML text (tests; `origin` names it in errors).
StatusOr<DaemonConfig> parse_daemon_config(std::string_view toml, std::string_view origin, const EnvLookup& env);

// Every key with its default and meaning, as a commented TOML file.
std::string daemon_config_reference();

}  // namespace kforge::daemon
