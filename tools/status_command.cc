#include "tools/status_command.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "runtime/control_message.h"
#include "runtime/human_units.h"
#include "runtime/transport.h"
#include "runtime/unique_fd.h"

namespace kforge {

namespace {

using json = nlohmann::json;

// Signatures the table shows unless --limit says otherwise.
constexpr uint32_t kTableLimit = 50;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// When an ipc:// daemon did not answer: whether one holds the endpoint's lock (kforged keeps an
// flock on <socket>.lock while it runs), and its pid. 0: none runs there.
int32_t daemon_holding_lock(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) != 0) return 0;
  const std::string lock_path = endpoint.substr(6) + ".lock";
  UniqueFd fd(::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return 0;
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return 0;   // nobody holds it: no daemon
  if (errno != EWOULDBLOCK) return 0;
  char buf[32] = {};
  const ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
  int32_t pid = -1;
  if (n > 0) (void)std::from_chars(buf, buf + n, pid);
  return pid > 0 ? pid : -1;
}

// "123, 456" from a JSON array of pids.
std::string pid_list(const json& pids) {
  std::string out;
  for (const json& p : pids) out += (out.empty() ? "" : ", ") + p.dump();
  return out;
}

void print_table(const json& st, std::ostream& out) {
  const json& d = st["daemon"];
  out << "kforged " << d.value("version", "?") << " pid " << d.value("pid", 0) << ", up "
      << fixed(d.value("uptime_s", 0.0), 0) << " s, strategy " << d.value("strategy", "?") << "\n";
  const json& b = st["budgets"];
  out << "evaluations: " << b.value("evaluations_total", 0) << " of " << b.value("max_evaluations_total", 0)
      << " (at most " << b.value("max_evaluations_per_signature", 0) << " per signature)\n";
  out << "\nslots:\n";
  for (const json& s : st["slots"]) {
    out << "  " << s.value("device", "?") << "  " << s.value("state", "?") << "  " << s.value("model", "") << " "
        << s.value("arch", "") << "  jobs " << s.value("jobs", 0) << ", restarts " << s.value("restarts", 0);
    // Timings there share the GPU with these serving processes (the daemon flags them).
    if (const json pids = s.value("serving_pids", json::array()); pids.is_array() && !pids.empty()) {
      out << "  serving pid(s) " << pid_list(pids);
    }
    out << "\n";
  }
  out << "\nprocesses:\n";
  if (st["processes"].empty()) out << "  (none attached)\n";
  for (const json& p : st["processes"]) {
    out << "  pid " << p.value("pid", 0) << "  torch " << p.value("torch", "") << "  " << (p.value("attached", false) ? "attached" : "gone")
        << "  reports " << p.value("reports", 0) << " (" << p.value("reports_dropped", 0) << " dropped by the hook)\n";
    // What it runs from the cache, as its reports say (Note [Time saved] in daemon_status.cc).
    if (const json k = p.value("kernels", json::object()); k.is_object() && !k.empty()) {
      std::string states;
      for (const auto& [state, n] : k.items()) {
        states += (states.empty() ? "" : ", ") + std::to_string(n.is_number_unsigned() ? n.get<uint64_t>() : 0) + " " + state;
      }
      const double saved = p.value("saved_ns", 0.0);
      out << "      kernels: " << states << "; estimated time saved "
          << (saved > 0 ? human_duration_ns(saved) : std::string("none yet")) << "\n";
    }
    if (!p.value("shares_cache", true)) {
      const std::string dir = p.value("cache_dir", "");
      out << "      its cache " << (dir.empty() ? std::string("(none)") : dir)
          << " is not the daemon's: it will not load the kernels found here\n";
    }
  }
  const size_t total = st.value("signatures_total", st["signatures"].size());
  out << "\nsignatures";
  if (total > st["signatures"].size()) out << " (the " << st["signatures"].size() << " largest shares of " << total << ")";
  out << ":\n";
  if (st["signatures"].empty()) {
    out << "  (none reported)\n";
    return;
  }
  char line[512];
  std::snprintf(line, sizeof line, "  %-11s %10s %10s %7s %6s %8s  %s\n", "state", "calls", "mean", "share", "evals",
                "best", "signature");
  out << line;
  for (const json& s : st["signatures"]) {
    const double best = s.value("best_speedup", 0.0);
    std::snprintf(line, sizeof line, "  %-11s %10llu %10s %6.1f%% %6llu %8s  %s\n", s.value("state", "?").c_str(),
                  static_cast<unsigned long long>(s.value("calls", 0ull)), human_duration_ns(s.value("mean_ns", 0.0)).c_str(),
                  100.0 * s.value("time_share", 0.0), static_cast<unsigned long long>(s.value("evaluations", 0ull)),
                  best > 0 ? (fixed(best, 2) + "x").c_str() : "-", s.value("signature", "?").c_str());
    out << line;
    if (!s.value("note", "").empty()) out << "               " << s.value("note", "") << "\n";
    for (const json& w : s.value("in_process", json::array())) {
      out << "               pid " << w.value("pid", 0) << ": entry " << w.value("entry", "").substr(0, 12) << " "
          << (w.value("state", "") == "no_win" ? std::string("no win in this process") : w.value("state", ""));
      if (const double e = w.value("entry_median_ns", 0.0), t = w.value("pytorch_median_ns", 0.0); e > 0 && t > 0) {
        out << " (" << human_duration_ns(e) << " vs PyTorch " << human_duration_ns(t) << " there)";
      }
      out << "\n";
    }
    if (const uint64_t shared = s.value("shared_gpu_timings", 0ull); shared > 0) {
      out << "               " << shared << (shared == 1 ? " timing" : " timings")
          << " shared the GPU with a serving process: speedups may be noisier\n";
    }
  }
}

}  // namespace

int run_status_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  bool as_json = false;
  int timeout_ms = 2000;
  std::optional<uint32_t> limit;
  std::string endpoint;
  std::string server_key;
  if (const char* e = std::getenv("KFORGE_DAEMON_ENDPOINT"); e != nullptr && *e != '\0') endpoint = e;
  if (const char* k = std::getenv("KFORGE_DAEMON_SERVER_KEY"); k != nullptr) server_key = k;
  const char* key_what = "KFORGE_DAEMON_SERVER_KEY";
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-h" || args[i] == "--help") {
      out << "usage: kforge status [--json] [--limit N] [--endpoint E] [--server-key K] [--timeout-ms N]\n\n"
             "What the running kforged does: slots, processes, signatures (largest time share first),\n"
             "searches, budgets, best speedups. Exit 0; 3 no daemon answers at the endpoint; 4 a daemon\n"
             "holds it but did not answer in time (busy); 2 usage.\n";
      return 0;
    }
    if (args[i] == "--json") {
      as_json = true;
    } else if (args[i] == "--endpoint" && i + 1 < args.size()) {
      endpoint = args[++i];
    } else if (args[i] == "--server-key" && i + 1 < args.size()) {
      server_key = args[++i];
      key_what = "--server-key";
    } else if (args[i] == "--limit" && i + 1 < args.size()) {
      const std::string& v = args[++i];
      uint32_t n = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size() || n > control::kMaxLimit) {
        err << "kforge status: --limit needs a number of signatures in 0.." << control::kMaxLimit << ", got '" << v << "'\n";
        return 2;
      }
      limit = n;
    } else if (args[i] == "--timeout-ms" && i + 1 < args.size()) {
      timeout_ms = std::atoi(args[++i].c_str());
      if (timeout_ms <= 0) {
        err << "kforge status: --timeout-ms needs a positive number\n";
        return 2;
      }
    } else {
      err << "kforge status: unknown option '" << args[i] << "' (usage: kforge status [--json] [--limit N] [--endpoint E] [--server-key K] [--timeout-ms N])\n";
      return 2;
    }
  }
  if (endpoint.empty()) {
    const char* xdg = std::getenv("XDG_RUNTIME_DIR");
    endpoint = default_daemon_endpoint(xdg != nullptr ? xdg : "", static_cast<unsigned>(::getuid()));
  }
  // Only into a private directory of our own: the reply is trusted for display only, but a
  // stranger's socket must not learn that we asked.
  if (Status s = secure_ipc_directory(endpoint); !s.ok()) {
    err << "kforge status: " << s.message() << "\n";
    return 3;
  }
  StatusOr<std::string> key = client_server_key(endpoint, server_key, key_what);
  if (!key.ok()) {
    err << "kforge status: " << key.status().message() << "\n";
    return 2;
  }
  // The table shows the largest shares; --json everything unless --limit says otherwise.
  if (!limit && !as_json) limit = kTableLimit;
  std::string why;
  std::optional<std::string> reply =
      transport::request_reply(endpoint, *key, control::encode_request(control::ControlRequest{control::Request::kStatus, limit}),
                               timeout_ms, why);
  if (!reply) {
    // Busy is not absent: a daemon flooded with messages holds its lock but answers late.
    if (const int32_t pid = daemon_holding_lock(endpoint); pid != 0) {
      err << "kforge status: kforged" << (pid > 0 ? " (pid " + std::to_string(pid) + ")" : std::string()) << " runs at "
          << endpoint << " but did not answer within " << timeout_ms << " ms: it is busy (try again, or --timeout-ms)\n";
      return 4;
    }
    err << "kforge status: no kforged at " << endpoint << " (" << why << "); start one with `kforged`\n";
    return 3;
  }
  StatusOr<std::string> status = control::decode_status_reply(*reply);
  if (!status.ok()) {
    err << "kforge status: the daemon at " << endpoint << " answered: " << status.status().message() << "\n";
    return 1;
  }
  const json r{{"status", json::parse(*status, nullptr, false)}};
  if (as_json) {
    out << r["status"].dump(2) << "\n";
  } else {
    print_table(r["status"], out);
  }
  return 0;
}

}  // namespace kforge
