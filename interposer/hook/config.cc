#include "interposer/hook/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <charconv>

#include "runtime/op_catalog.h"

namespace kforge::hook {

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view strip_namespace(std::string_view s) {
  if (s.starts_with("aten::")) s.remove_prefix(6);
  return s;
}

std::string bad_value(const char* var, const std::string& value, std::string_view expected,
                      std::string_view fallback) {
  return std::string(var) + "='" + value + "' is not " + std::string(expected) + "; using " +
         std::string(fallback);
}

// A positive integer in [lo, hi] or the default, with a warning for anything else.
uint32_t read_uint(const EnvLookup& env, const char* var, uint32_t lo, uint32_t hi, uint32_t def,
                   std::vector<std::string>& warnings) {
  std::optional<std::string> v = env(var);
  if (!v || v->empty()) return def;
  std::string_view s = trim(*v);
  uint64_t x = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (ec != std::errc() || end != s.data() + s.size() || x < lo || x > hi) {
    warnings.push_back(bad_value(var, *v,
                                 "an integer in " + std::to_string(lo) + ".." + std::to_string(hi),
                                 std::to_string(def)));
    return def;
  }
  return static_cast<uint32_t>(x);
}

bool read_flag(const EnvLookup& env, const char* var, bool def, std::vector<std::string>& warnings) {
  std::optional<std::string> v = env(var);
  if (!v || v->empty()) return def;
  std::string_view s = trim(*v);
  if (s == "1" || s == "on" || s == "true" || s == "yes") return true;
  if (s == "0" || s == "off" || s == "false" || s == "no") return false;
  warnings.push_back(bad_value(var, *v, "0/1 (off/on, false/true, no/yes)", def ? "1" : "0"));
  return def;
}

// A comma-separated list of catalog operator names: the known ones, and one warning naming the
// unknown ones. A list that names no catalog operator at all is a bad value: one warning, and the
// default (`fallback` says what that is).
std::vector<std::string> read_op_list(const EnvLookup& env, const char* var, std::string_view fallback,
                                      std::vector<std::string>& warnings) {
  std::vector<std::string> out, unknown;
  std::optional<std::string> v = env(var);
  if (!v) return out;
  std::string_view rest = *v;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    bool known = false;
    for (const catalog::OpEntry& op : catalog::operators()) known = known || op_name_matches(item, op.name, op.overload);
    (known ? out : unknown).emplace_back(item);
  }
  if (unknown.empty()) return out;
  std::string names;
  for (const catalog::OpEntry& op : catalog::operators()) names += (names.empty() ? "" : ", ") + op.qualified();
  std::string quoted;
  for (const std::string& u : unknown) quoted += (quoted.empty() ? "'" : ", '") + u + "'";
  if (out.empty()) {
    warnings.push_back(bad_value(var, *v, "a list of catalog operators (" + names + ")", fallback));
  } else {
    warnings.push_back(std::string(var) + ": " + quoted + (unknown.size() == 1 ? " is not a catalog operator" : " are not catalog operators") +
                       " (ignored; the catalog is " + names + ")");
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

std::string_view hook_mode_name(HookMode m) noexcept {
  switch (m) {
    case HookMode::kObserve: return "observe";
    case HookMode::kShadow: return "shadow";
    case HookMode::kActive: return "active";
  }
  return "observe";
}

bool op_name_matches(std::string_view entry, std::string_view name, std::string_view overload) {
  entry = strip_namespace(entry);
  name = strip_namespace(name);
  if (entry == name) return true;
  return !overload.empty() && entry.size() == name.size() + 1 + overload.size() &&
         entry.starts_with(name) && entry[name.size()] == '.' && entry.ends_with(overload);
}

bool HookConfig::op_selected(std::string_view name, std::string_view overload) const {
  for (const std::string& d : deny_ops) {
    if (op_name_matches(d, name, overload)) return false;
  }
  if (!ops_restricted) return true;
  for (const std::string& a : allow_ops) {
    if (op_name_matches(a, name, overload)) return true;
  }
  return false;
}

std::string HookConfig::to_string() const {
  std::string s = "mode=" + std::string(hook_mode_name(mode));
  if (requested_mode != mode) s += " (requested " + std::string(hook_mode_name(requested_mode)) + ")";
  s += " endpoint=" + (daemon_endpoint.empty() ? std::string("none") : daemon_endpoint);
  if (!daemon_server_key.empty()) s += " server_key=" + daemon_server_key;   // a public key
  s += " cache_dir=" + (cache_dir.empty() ? std::string("(default)") : cache_dir);
  s += " sample_rate=" + std::to_string(sample_rate);
  s += " observe_every=" + std::to_string(observe_every);
  if (mode != HookMode::kObserve) s += " shadow_calls=" + std::to_string(shadow_calls);
  if (mode != HookMode::kObserve) s += std::string(" confirm_win=") + (confirm_win ? "on" : "off");
  if (mode != HookMode::kObserve && confirm_win) s += " timing_pairs=" + std::to_string(timing_pairs);
  s += " report_interval_ms=" + std::to_string(report_interval_ms);
  if (ab_window_ms != 0) s += " ab_window_ms=" + std::to_string(ab_window_ms);
  s += " ops=" + (!ops_restricted ? std::string("(all)") : "[" + join(allow_ops) + "]");
  s += " deny_ops=" + (deny_ops.empty() ? std::string("(none)") : join(deny_ops));
  s += std::string(" capture_inputs=") + (capture_inputs ? "on" : "off");
  if (bench_toggle) s += " bench_toggle=on";
  if (!summary_dir.empty()) s += " summary_dir=" + summary_dir;
  return s;
}

HookConfig parse_config(const EnvLookup& env) {
  HookConfig c;
  std::vector<std::string>& w = c.warnings;

  const std::string xdg = env("XDG_RUNTIME_DIR").value_or("");
  c.daemon_endpoint = default_daemon_endpoint(xdg, static_cast<unsigned>(::getuid()));
  if (std::optional<std::string> e = env("KFORGE_DAEMON_ENDPOINT"); e && !e->empty()) {
    const bool ipc = e->starts_with("ipc://") && e->size() > 6;
    const bool tcp = e->starts_with("tcp://") && e->size() > 6;
    if (*e == "none") {
      c.daemon_endpoint.clear();   // `kforge run --no-daemon`: the cache only, nothing reported
    } else if (ipc || tcp) {
      c.daemon_endpoint = *e;
    } else {
      w.push_back(bad_value("KFORGE_DAEMON_ENDPOINT", *e, "an ipc:// or tcp:// endpoint",
                            c.daemon_endpoint));
    }
  }

  StatusOr<std::string> key = client_server_key(c.daemon_endpoint, env("KFORGE_DAEMON_SERVER_KEY").value_or(""),
                                                "KFORGE_DAEMON_SERVER_KEY");
  if (c.daemon_endpoint.empty()) {
    // No daemon: no key to check.
  } else if (!key.ok()) {
    if (c.daemon_endpoint.starts_with("tcp://")) {
      c.daemon_endpoint = default_daemon_endpoint(xdg, static_cast<unsigned>(::getuid()));
      w.push_back(key.status().message() + "; using " + c.daemon_endpoint);
    } else {
      w.push_back(key.status().message() + "; ignoring it");
    }
  } else {
    c.daemon_server_key = std::move(*key);
  }

  c.cache_dir = env("KFORGE_CACHE_DIR").value_or("");
  if (std::optional<std::string> d = env("KFORGE_CACHE_DIR"); d && trim(*d).empty()) {
    w.push_back(bad_value("KFORGE_CACHE_DIR", *d, "a directory", "the default ($XDG_CACHE_HOME/kforge, else ~/.cache/kforge)"));
    c.cache_dir.clear();
  }

  if (std::optional<std::string> m = env("KFORGE_MODE"); m && !m->empty()) {
    std::string_view s = trim(*m);
    if (s == "observe") {
      c.requested_mode = HookMode::kObserve;
    } else if (s == "shadow" || s == "active") {
      c.requested_mode = s == "shadow" ? HookMode::kShadow : HookMode::kActive;
    } else {
      w.push_back(bad_value("KFORGE_MODE", *m, "observe, shadow or active", "observe"));
    }
  }
  c.mode = c.requested_mode;

  c.sample_rate = read_uint(env, "KFORGE_SAMPLE_RATE", 1, 1000000, 64, w);
  c.observe_every = read_uint(env, "KFORGE_OBSERVE_EVERY", 1, 4096, 16, w);
  c.shadow_calls = read_uint(env, "KFORGE_SHADOW_CALLS", 1, 1000000, 20, w);
  c.confirm_win = read_flag(env, "KFORGE_CONFIRM_WIN", true, w);
  c.timing_pairs = read_uint(env, "KFORGE_TIMING_PAIRS", 0, 256, 20, w);   // SwapCounters::kTimedPairs
  c.report_interval_ms = read_uint(env, "KFORGE_REPORT_INTERVAL_MS", 10, 3600000, 1000, w);
  // Note [End-to-end A/B] (ab_driver.h): the windows are the reporter's rounds, and every call of
  // every window is observed alike.
  if (std::optional<std::string> ab = env("KFORGE_AB_WINDOW_MS"); ab && !ab->empty() && *ab != "0") {
    c.ab_window_ms = read_uint(env, "KFORGE_AB_WINDOW_MS", 50, 60000, 0, w);
    if (c.ab_window_ms != 0) {
      c.report_interval_ms = c.ab_window_ms;
      c.observe_every = 1;
    }
  }
  c.allow_ops = read_op_list(env, "KFORGE_OPS", "every catalog operator", w);
  c.ops_restricted = !c.allow_ops.empty();
  c.deny_ops = read_op_list(env, "KFORGE_DENY_OPS", "none denied", w);
  c.capture_inputs = read_flag(env, "KFORGE_CAPTURE_INPUTS", false, w);
  c.log = read_flag(env, "KFORGE_LOG", false, w);
  c.bench_toggle = read_flag(env, "KFORGE_BENCH_TOGGLE", false, w);
  // Empty is unset (no summary); blanks alone are a mistake worth a line.
  if (std::optional<std::string> d = env("KFORGE_SUMMARY_DIR"); d && !d->empty()) {
    if (trim(*d).empty()) {
      w.push_back(bad_value("KFORGE_SUMMARY_DIR", *d, "a directory", "no summary"));
    } else {
      c.summary_dir = *d;
    }
  }
  return c;
}

SummaryDir resolve_summary_dir(const std::string& value) {
  SummaryDir out;
  auto refuse = [&](const std::string& why) {
    out.problem = "KFORGE_SUMMARY_DIR='" + value + "' " + why + "; no summary will be written";
    return out;
  };
  struct stat st {};
  if (::stat(value.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return refuse("does not exist");
    return refuse(std::string("cannot be examined (") + std::strerror(errno) + ")");
  }
  if (!S_ISDIR(st.st_mode)) return refuse("is not a directory");
  // Writing a file into it needs write and search permission on the directory.
  if (::access(value.c_str(), W_OK | X_OK) != 0) {
    return refuse(std::string("is not writable (") + std::strerror(errno) + ")");
  }
  // Absolute now: the program may change its working directory before it exits.
  char resolved[PATH_MAX];
  if (::realpath(value.c_str(), resolved) == nullptr) {
    return refuse(std::string("cannot be resolved (") + std::strerror(errno) + ")");
  }
  out.path = resolved;
  return out;
}

}  // namespace kforge::hook
