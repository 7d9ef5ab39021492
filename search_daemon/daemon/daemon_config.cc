#include "search_daemon/daemon/daemon_config.h"

#include <toml++/toml.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "runtime/daemon_endpoint.h"

namespace kforge::daemon {

namespace {

// Note [Config keys]
// One table describes every key: its section, name, what it accepts, its meaning, and how a value
// (from TOML or from a flag's text) is checked and stored. load/parse, the reference text and the
// start-up log all come from it, so they cannot disagree.
enum class Kind { kString, kBool, kUint, kDouble, kStringList };

struct Key {
  const char* section;
  const char* name;
  Kind kind;
  const char* help;
  // Stores the value or returns why not ("expected one of mcts, greedy, random").
  std::function<std::string(DaemonConfig&, const std::string& s, bool b, uint64_t u, double d,
                            const std::vector<std::string>& list)> set;
  std::function<std::string(const DaemonConfig&)> show;
};

std::string qualified(const Key& k) { return std::string(k.section) + "." + k.name; }

std::string quote(const std::string& s) { return "\"" + s + "\""; }

std::string join(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + quote(v[i]);
  return s + "]";
}

std::string num(double d) {
  std::ostringstream o;
  o << d;
  return o.str();
}

std::string endpoint_error(const std::string& e) {
  const bool ipc = e.rfind("ipc://", 0) == 0 && e.size() > 6;
  const bool tcp = e.rfind("tcp://", 0) == 0 && e.size() > 6;
  return ipc || tcp ? "" : "expected an ipc:// or tcp:// endpoint";
}

std::string device_error(const std::string& d) {
  if (d == "cpu" || d == "auto") return "";
  if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() < 10 &&
      d.find_first_not_of("0123456789", 5) == std::string::npos) {
    return "";
  }
  return "expected cpu, cuda:<N> or auto, got " + quote(d);
}

template <class T>
std::string in_range(T v, T lo, T hi) {
  if (v < lo || v > hi) return "expected a value in [" + num(static_cast<double>(lo)) + ", " + num(static_cast<double>(hi)) + "]";
  return "";
}

#define KEY_STRING(sec, nm, member, help, check)                                                          \
  Key{sec, nm, Kind::kString, help,                                                                        \
      [](DaemonConfig& c, const std::string& s, bool, uint64_t, double, const std::vector<std::string>&) { \
        const std::string why = check(s);                                                                  \
        if (why.empty()) c.member = s;                                                                     \
        return why;                                                                                        \
      },                                                                                                   \
      [](const DaemonConfig& c) { return quote(c.member); }}
#define KEY_BOOL(sec, nm, member, help)                                                                     \
  Key{sec, nm, Kind::kBool, help,                                                                          \
      [](DaemonConfig& c, const std::string&, bool b, uint64_t, double, const std::vector<std::string>&) { \
        c.member = b;                                                                                      \
        return std::string();                                                                              \
      },                                                                                                   \
      [](const DaemonConfig& c) { return std::string(c.member ? "true" : "false"); }}
#define KEY_UINT(sec, nm, member, lo, hi, help)                                                             \
  Key{sec, nm, Kind::kUint, help,                                                                          \
      [](DaemonConfig& c, const std::string&, bool, uint64_t u, double, const std::vector<std::string>&) { \
        const std::string why = in_range<uint64_t>(u, lo, hi);                                             \
        if (why.empty()) c.member = static_cast<decltype(c.member)>(u);                                    \
        return why;                                                                                        \
      },                                                                                                   \
      [](const DaemonConfig& c) { return std::to_string(c.member); }}
#define KEY_DOUBLE(sec, nm, member, lo, hi, help)                                                           \
  Key{sec, nm, Kind::kDouble, help,                                                                        \
      [](DaemonConfig& c, const std::string&, bool, uint64_t, double d, const std::vector<std::string>&) { \
        const std::string why = std::isfinite(d) ? in_range<double>(d, lo, hi) : "expected a finite number"; \
        if (why.empty()) c.member = d;                                                                     \
        return why;                                                                                        \
      },                                                                                                   \
      [](const DaemonConfig& c) { return num(c.member); }}

std::string any_string(const std::string&) { return ""; }
std::string http_error(const std::string& s) {
  if (s.empty()) return "";
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 >= s.size() ||
      s.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
    return "expected HOST:PORT (\"127.0.0.1:7878\") or \"\" for off";
  }
  const std::string host = s.substr(0, colon);
  if (host != "127.0.0.1" && host != "localhost" && host != "::1") {
    return "the HTTP endpoint serves the GUI and metrics without authentication: only 127.0.0.1, ::1 or localhost";
  }
  const long port = std::strtol(s.c_str() + colon + 1, nullptr, 10);
  return port >= 0 && port <= 65535 ? "" : "port out of range";
}
std::string strategy_error(const std::string& s) {
  return s == "mcts" || s == "greedy" || s == "random" ? "" : "expected one of mcts, greedy, random";
}
std::string log_format_error(const std::string& s) { return s == "text" || s == "json" ? "" : "expected text or json"; }
std::string api_error(const std::string& s) { return s == "openai" || s == "anthropic" ? "" : "expected openai or anthropic"; }
std::string env_name_error(const std::string& s) {
  if (s.empty()) return "";
  if (s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos ||
      (s[0] >= '0' && s[0] <= '9')) {
    return "expected the NAME of an environment variable (the key itself never goes in the configuration)";
  }
  return "";
}

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      KEY_STRING("daemon", "endpoint", endpoint, "ROUTER endpoint for hooks and the CLI (default: the hooks' default, or $KFORGE_DAEMON_ENDPOINT)", endpoint_error),
      KEY_STRING("daemon", "events_endpoint", events_endpoint, "PUB endpoint for notifications (default: events.sock beside an ipc endpoint)", endpoint_error),
      KEY_STRING("daemon", "http", http, "127.0.0.1:PORT for /metrics (Prometheus), the JSON API and the GUI (/gui/); \"\" = off", http_error),
      KEY_STRING("daemon", "gui_dir", gui_dir, "the GUI's files (index.html, app.js, style.css); \"\": beside kforged, ../share/kforge/gui", any_string),
      KEY_STRING("daemon", "cache_dir", cache_dir, "the kernel cache (default: $KFORGE_CACHE_DIR, $XDG_CACHE_HOME/kforge, ~/.cache/kforge)", any_string),
      KEY_STRING("daemon", "state_dir", state_dir, "search journals (default: $XDG_STATE_HOME/kforge, ~/.local/state/kforge)", any_string),
      KEY_STRING("daemon", "curve_secret_key_file", curve_secret_key_file, "CURVE server secret key (z85, 40 chars); required for tcp:// endpoints", any_string),
      KEY_STRING("daemon", "log_format", log_format, "text or json (one JSON object per line)", log_format_error),
      KEY_UINT("daemon", "max_processes", max_processes, 16, 1000000, "process records kept (one per connection, attached or gone); past it the longest gone, else the least recently heard from, is dropped"),
      KEY_UINT("daemon", "max_signatures", max_signatures, 64, 10000000, "signatures kept; past it the coldest (least total time) that no search runs for are dropped"),
      KEY_UINT("daemon", "max_signatures_per_process", max_signatures_per_process, 16, 10000000, "signatures one process may bring in; more are refused and counted"),
      KEY_UINT("daemon", "process_timeout_s", process_timeout_s, 15, 86400, "a process that sends nothing this long is taken for gone (hooks send a report at least every 10 s)"),
      Key{"workers", "devices", Kind::kStringList, "devices to evaluate on: \"cpu\", \"cuda:N\", or \"auto\" (every visible GPU, and cpu)",
          [](DaemonConfig& c, const std::string&, bool, uint64_t, double, const std::vector<std::string>& list) {
            if (list.empty()) return std::string("expected at least one device");
            for (const std::string& d : list) {
              if (std::string why = device_error(d); !why.empty()) return why;
            }
            c.devices = list;
            return std::string();
          },
          [](const DaemonConfig& c) { return join(c.devices); }},
      KEY_UINT("workers", "cpu_slots", cpu_slots, 0, 256, "CPU workers (0: none, CPU signatures are not searched)"),
      KEY_UINT("workers", "cpu_threads", cpu_threads, 0, 4096, "torch threads per CPU worker, for PyTorch's kernels and the candidates alike (0: half the daemon's cores divided among the CPU slots, all of them with workers.priority = normal)"),
      KEY_UINT("workers", "prebuild_threads", prebuild_threads, 0, 256, "daemon threads (at idle priority) that compile a search's next CUDA template candidates into the workers' build cache while the GPU worker verifies and times others (0: none)"),
      KEY_STRING("workers", "program", worker_program, "the kforge-worker launcher (default: beside kforged)", any_string),
      KEY_STRING("workers", "python", worker_python, "python3 with torch for the workers (default: python3 on PATH)", any_string),
      Key{"workers", "priority", Kind::kString,
          "idle: workers, and the compilers they start, run at SCHED_IDLE (else nice 19) and never slow the serving "
          "processes; normal: the daemon's own priority, for a host that only searches",
          [](DaemonConfig& c, const std::string& s, bool, uint64_t, double, const std::vector<std::string>&) {
            const std::optional<eval::WorkerPriority> p = eval::parse_worker_priority(s);
            if (!p) return std::string("expected idle or normal");
            c.worker_priority = *p;
            return std::string();
          },
          [](const DaemonConfig& c) { return quote(std::string(eval::worker_priority_name(c.worker_priority))); }},
      KEY_UINT("workers", "compile_budget_ms", compile_budget_ms, 100, 3600000, "a build's watchdog"),
      KEY_UINT("workers", "run_budget_ms", run_budget_ms, 100, 3600000, "the watchdog of each of verify and measure"),
      KEY_STRING("search", "strategy", strategy, "mcts, greedy or random", strategy_error),
      KEY_UINT("search", "max_evaluations_per_signature", max_evaluations_per_signature, 1, 1000000, "evaluations one signature's search may spend"),
      KEY_UINT("search", "max_evaluations_total", max_evaluations_total, 1, 1000000000, "evaluations the daemon may spend in all"),
      KEY_UINT("search", "max_seconds_per_signature", max_seconds_per_signature, 1, 604800, "wall time one signature's search may take"),
      KEY_UINT("search", "concurrent_searches", concurrent_searches, 1, 64, "signatures searched at once"),
      KEY_UINT("search", "yield_after_evaluations", yield_after_evaluations, 0, 1000000, "evaluations after which a search with a win gives its place to a signature not yet searched (0: never)"),
      KEY_UINT("search", "min_calls", min_calls, 1, 1000000000000ull, "calls a signature needs before it is searched"),
      KEY_DOUBLE("search", "min_time_share", min_time_share, 0.0, 1.0, "share of a process's intercepted time a signature needs before it is searched"),
      KEY_UINT("search", "seed", seed, 0, std::numeric_limits<uint64_t>::max(), "the searches' random seed"),
      KEY_UINT("search", "measure_runs", measure_runs, 30, 100000, "timed pairs per measured candidate (at least 30)"),
      KEY_DOUBLE("search", "max_baseline_model_ratio", max_baseline_model_ratio, 0.0, 1e6, "a PyTorch time over this many times the cost model's (bytes at the measured bandwidth + the smallest call) is re-measured, and never published if it stays so (0: no check)"),
      KEY_DOUBLE("search", "max_baseline_observed_ratio", max_baseline_observed_ratio, 0.0, 1e6, "a PyTorch time in the worker over this many times what the serving processes observe is never published (0: no check)"),
      KEY_DOUBLE("search", "c_puct", c_puct, 0.0, 100.0, "MCTS exploration weight"),
      KEY_DOUBLE("search", "widening_c", widening_c, 0.1, 100.0, "progressive widening: children <= c * visits^alpha"),
      KEY_DOUBLE("search", "widening_alpha", widening_alpha, 0.0, 1.0, "progressive widening exponent"),
      KEY_BOOL("proposers", "templates", templates, "the template library proposes candidates"),
      KEY_BOOL("llm", "enabled", llm.enabled, "a language model proposes candidates and repairs"),
      KEY_STRING("llm", "api", llm.api, "openai (chat completions: OpenAI, vLLM, llama.cpp, Ollama) or anthropic", api_error),
      KEY_STRING("llm", "base_url", llm.base_url, "the API's base URL, its root or the /v1 form (\"https://api.openai.com/v1\", \"http://127.0.0.1:8000\")", any_string),
      KEY_STRING("llm", "model", llm.model, "the model name the API expects", any_string),
      KEY_STRING("llm", "api_key_env", llm.api_key_env, "the NAME of the environment variable that holds the API key", env_name_error),
      KEY_UINT("llm", "max_tokens", llm.max_tokens, 64, 1000000, "tokens per answer"),
      KEY_DOUBLE("llm", "temperature", llm.temperature, 0.0, 2.0, "sampling temperature"),
      KEY_UINT("llm", "timeout_ms", llm.timeout_ms, 1000, 3600000, "one request's timeout"),
      KEY_BOOL("llm", "stream", llm.stream, "ask for the answer as server-sent events (a server that answers in one body is read as such)"),
      KEY_UINT("llm", "stream_idle_timeout_ms", llm.stream_idle_timeout_ms, 1000, 3600000, "a streamed answer that sends nothing for this long is retried"),
      KEY_UINT("llm", "concurrent_requests", llm.concurrent_requests, 0, 256, "model requests in flight at once while the workers evaluate (0: each search waits for every answer)"),
      KEY_UINT("llm", "requests_per_search", llm.requests_per_search, 1, 64, "model requests in flight for one signature's search"),
      KEY_UINT("llm", "max_retries", llm.max_retries, 0, 20, "retries on 429, 5xx and timeouts (exponential backoff)"),
      KEY_UINT("llm", "max_total_tokens", llm.max_total_tokens, 0, 1000000000000ull, "the daemon's whole LLM token budget"),
      KEY_DOUBLE("llm", "max_cost_usd", llm.max_cost_usd, 0.0, 1e6, "the daemon's whole LLM cost budget"),
      KEY_DOUBLE("llm", "price_input_per_mtok", llm.price_input_per_mtok, 0.0, 1e4, "USD per million input tokens"),
      KEY_DOUBLE("llm", "price_output_per_mtok", llm.price_output_per_mtok, 0.0, 1e4, "USD per million output tokens"),
  };
  return k;
}

const Key* find_key(std::string_view section, std::string_view name) {
  for (const Key& k : keys()) {
    if (section == k.section && name == k.name) return &k;
  }
  return nullptr;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kString: return "a string";
    case Kind::kBool: return "true or false";
    case Kind::kUint: return "a non-negative integer";
    case Kind::kDouble: return "a number";
    case Kind::kStringList: return "an array of strings";
  }
  return "?";
}

// Sets a key from a TOML node; the error names origin, key and value.
std::string set_from_node(DaemonConfig& c, const Key& k, const toml::node& n) {
  std::string s;
  bool b = false;
  uint64_t u = 0;
  double d = 0;
  std::vector<std::string> list;
  switch (k.kind) {
    case Kind::kString:
      if (!n.is_string()) return std::string("expected ") + kind_name(k.kind);
      s = *n.value<std::string>();
      break;
    case Kind::kBool:
      if (!n.is_boolean()) return std::string("expected ") + kind_name(k.kind);
      b = *n.value<bool>();
      break;
    case Kind::kUint:
      if (!n.is_integer() || *n.value<int64_t>() < 0) return std::string("expected ") + kind_name(k.kind);
      u = static_cast<uint64_t>(*n.value<int64_t>());
      break;
    case Kind::kDouble:
      if (!n.is_number()) return std::string("expected ") + kind_name(k.kind);
      d = *n.value<double>();
      break;
    case Kind::kStringList:
      if (!n.is_array()) return std::string("expected ") + kind_name(k.kind);
      for (const toml::node& e : *n.as_array()) {
        if (!e.is_string()) return std::string("expected ") + kind_name(k.kind);
        list.push_back(*e.value<std::string>());
      }
      break;
  }
  return k.set(c, s, b, u, d, list);
}

// Sets a key from a flag's text.
std::string set_from_text(DaemonConfig& c, const Key& k, const std::string& text) {
  std::string s;
  bool b = false;
  uint64_t u = 0;
  double d = 0;
  std::vector<std::string> list;
  switch (k.kind) {
    case Kind::kString: s = text; break;
    case Kind::kBool:
      if (text == "true" || text == "on" || text == "1" || text == "yes") b = true;
      else if (text == "false" || text == "off" || text == "0" || text == "no") b = false;
      else return "expected true or false";
      break;
    case Kind::kUint: {
      if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 19) {
        return std::string("expected ") + kind_name(k.kind);
      }
      u = std::stoull(text);
      break;
    }
    case Kind::kDouble: {
      char* end = nullptr;
      d = std::strtod(text.c_str(), &end);
      if (text.empty() || end == nullptr || *end != '\0') return std::string("expected ") + kind_name(k.kind);
      break;
    }
    case Kind::kStringList: {
      std::stringstream ss(text);
      std::string item;
      while (std::getline(ss, item, ',')) {
        if (!item.empty()) list.push_back(item);
      }
      break;
    }
  }
  return k.set(c, s, b, u, d, list);
}

DaemonConfig defaults(const EnvLookup& env) {
  DaemonConfig c;
  const std::string xdg = env("XDG_RUNTIME_DIR").value_or("");
  c.endpoint = default_daemon_endpoint(xdg, static_cast<unsigned>(::getuid()));
  if (std::optional<std::string> e = env("KFORGE_DAEMON_ENDPOINT"); e && endpoint_error(*e).empty()) c.endpoint = *e;
  c.cache_dir = env("KFORGE_CACHE_DIR").value_or("");
  if (std::optional<std::string> s = env("XDG_STATE_HOME"); s && !s->empty() && (*s)[0] == '/') {
    c.state_dir = *s + "/kforge";
  } else if (std::optional<std::string> h = env("HOME"); h && !h->empty()) {
    c.state_dir = *h + "/.local/state/kforge";
  }
  c.devices = {"auto"};
  return c;
}

// Whatever depends on several keys, once all are known.
Status finish(DaemonConfig& c, std::string_view origin) {
  auto bad = [&](const std::string& key, const std::string& why) {
    return invalid_argument(std::string(origin) + ": " + key + ": " + why);
  };
  if (c.events_endpoint.empty()) {
    if (c.endpoint.rfind("ipc://", 0) == 0) {
      const size_t slash = c.endpoint.rfind('/');
      c.events_endpoint = c.endpoint.substr(0, slash + 1) + "events.sock";
    } else {
      return bad("daemon.events_endpoint", "required when daemon.endpoint is not ipc://");
    }
  }
  for (const std::string& e : {c.endpoint, c.events_endpoint}) {
    if (e.rfind("tcp://", 0) == 0 && c.curve_secret_key_file.empty()) {
      return bad("daemon.curve_secret_key_file",
                 "a tcp:// endpoint (" + e + ") needs CURVE keys: reports carry user data and KernelReady makes processes load code");
    }
  }
  if (c.state_dir.empty()) return bad("daemon.state_dir", "no default: set it, or XDG_STATE_HOME or HOME");
  if (c.llm.enabled) {
    if (c.llm.base_url.empty()) return bad("llm.base_url", "required when llm.enabled");
    if (c.llm.model.empty()) return bad("llm.model", "required when llm.enabled");
  }
  if (!c.templates && !c.llm.enabled) return bad("proposers.templates", "no proposer is enabled (templates off and llm off)");
  return Status();
}

}  // namespace

std::string DaemonConfig::to_string() const {
  std::string out;
  for (const Key& k : keys()) out += (out.empty() ? "" : " ") + qualified(k) + "=" + k.show(*this);
  return out;
}

namespace {

// What a TOML syntax error's line is about, for its message: "search.min_calls" for a key's line
// (the [section] above it, and the name before its '='), "[search]" for a section header; "" when
// the line says neither. toml++ names only the line and column.
std::string key_at_line(std::string_view text, size_t line) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
  };
  std::string section;
  size_t n = 1;
  size_t pos = 0;
  while (pos <= text.size() && n <= line) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view l = trim(text.substr(pos, end - pos));
    const bool header = !l.empty() && l.front() == '[';
    if (n == line) {
      if (header) return std::string(l.substr(0, std::min<size_t>(l.size(), 64)));
      const size_t eq = l.find('=');
      if (eq == std::string_view::npos || l.empty() || l.front() == '#') return "";
      const std::string name(trim(l.substr(0, eq)).substr(0, 64));
      if (name.empty()) return "";
      return section.empty() ? name : section + "." + name;
    }
    if (header) {
      const size_t close = l.find(']');
      section = std::string(trim(l.substr(1, close == std::string_view::npos ? std::string_view::npos : close - 1)).substr(0, 64));
    }
    pos = end + 1;
    ++n;
  }
  return "";
}

Status parse_into(DaemonConfig& c, std::string_view text, std::string_view origin) {
  // The system's toml++ is built with exceptions: its parse errors arrive as toml::parse_error.
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const std::string key = key_at_line(text, e.source().begin.line);
    return invalid_argument(std::string(origin) + ":" + std::to_string(e.source().begin.line) + ":" +
                            std::to_string(e.source().begin.column) + (key.empty() ? "" : ": " + key) + ": " +
                            std::string(e.description()));
  }
  for (const auto& [section, node] : root) {
    const toml::table* t = node.as_table();
    if (t == nullptr) {
      return invalid_argument(std::string(origin) + ": " + std::string(section.str()) +
                              ": expected a [section] (daemon, workers, search, proposers, llm)");
    }
    for (const auto& [name, value] : *t) {
      const Key* k = find_key(section.str(), name.str());
      const std::string where = std::string(origin) + ":" + std::to_string(value.source().begin.line) + ": " +
                                std::string(section.str()) + "." + std::string(name.str());
      if (k == nullptr) return invalid_argument(where + ": unknown key (kforged --help-config lists them)");
      if (std::string why = set_from_node(c, *k, value); !why.empty()) return invalid_argument(where + ": " + why);
    }
  }
  return Status();
}

}  // namespace

StatusOr<DaemonConfig> parse_daemon_config(std::string_view text, std::string_view origin, const EnvLookup& env) {
  DaemonConfig c = defaults(env);
  KFORGE_RETURN_IF_ERROR(parse_into(c, text, origin));
  KFORGE_RETURN_IF_ERROR(finish(c, origin));
  return c;
}

StatusOr<DaemonConfig> load_daemon_config(const std::vector<std::string>& args, const EnvLookup& env) {
  std::string file;
  if (std::optional<std::string> f = env("KFORGE_DAEMON_CONFIG"); f && !f->empty()) file = *f;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--config") file = args[i + 1];
  }
  std::string text;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return not_found("cannot read the configuration file " + file);
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  // The file first (for its errors), then the flags over it, then what depends on several keys.
  DaemonConfig c = defaults(env);
  KFORGE_RETURN_IF_ERROR(parse_into(c, text, file.empty() ? "defaults" : file));
  c.config_file = file;
  static const std::pair<const char*, const char*> kShortcuts[] = {
      {"--endpoint", "daemon.endpoint"},   {"--events-endpoint", "daemon.events_endpoint"},
      {"--http", "daemon.http"},           {"--cache-dir", "daemon.cache_dir"},
      {"--state-dir", "daemon.state_dir"}, {"--log-format", "daemon.log_format"},
      {"--devices", "workers.devices"},    {"--cpu-slots", "workers.cpu_slots"},
      {"--cpu-threads", "workers.cpu_threads"},
      {"--worker", "workers.program"},     {"--worker-python", "workers.python"},
      {"--strategy", "search.strategy"},   {"--max-evaluations", "search.max_evaluations_per_signature"},
      {"--seed", "search.seed"},           {"--min-calls", "search.min_calls"},
      {"--templates", "proposers.templates"}, {"--llm", "llm.enabled"},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--config") {
      ++i;
      continue;
    }
    std::string key, value;
    if (a == "--set") {
      if (i + 1 >= args.size()) return invalid_argument("--set needs SECTION.KEY=VALUE");
      const std::string kv = args[++i];
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) return invalid_argument("--set " + kv + ": expected SECTION.KEY=VALUE");
      key = kv.substr(0, eq);
      value = kv.substr(eq + 1);
    } else {
      for (const auto& [flag, k] : kShortcuts) {
        if (a == flag) key = k;
      }
      if (key.empty()) return invalid_argument("unknown option " + a + " (kforged --help)");
      if (i + 1 >= args.size()) return invalid_argument(a + " needs a value");
      value = args[++i];
    }
    const size_t dot = key.find('.');
    const Key* k = dot == std::string::npos ? nullptr : find_key(key.substr(0, dot), key.substr(dot + 1));
    if (k == nullptr) return invalid_argument(a + " " + key + ": unknown key (kforged --help-config lists them)");
    if (std::string why = set_from_text(c, *k, value); !why.empty()) {
      return invalid_argument(a + " " + key + "=" + quote(value) + ": " + why);
    }
  }
  KFORGE_RETURN_IF_ERROR(finish(c, "the command line"));
  return c;
}

std::string daemon_config_reference() {
  const DaemonConfig d;
  std::string out = "# kforged configuration (TOML). Flags override the file: --set SECTION.KEY=VALUE.\n";
  std::string section;
  for (const Key& k : keys()) {
    if (section != k.section) {
      section = k.section;
      out += "\n[" + section + "]\n";
    }
    out += "# " + std::string(k.help) + " (" + kind_name(k.kind) + ")\n";
    out += "# " + std::string(k.name) + " = " + k.show(d) + "\n";
  }
  return out;
}

}  // namespace kforge::daemon
