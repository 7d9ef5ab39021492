#include "tools/warm_command.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "tools/ab_analysis.h"
#include "tools/cache_commands.h"
#include "tools/daemon_launch.h"
#include "tools/install_layout.h"
#include "tools/png_chart.h"
#include "tools/run_command.h"

namespace kforge {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char kWarmUsage[] =
    "usage: kforge [--cache-dir DIR] warm [options] [--] CMD [ARGS...]\n"
    "\n"
    "For staging: runs CMD under kforge again and again (active mode, with the host's search\n"
    "daemon, started if none runs) until the budget is spent or the daemon has nothing left to\n"
    "search, showing progress as it goes. Then writes a report (markdown, and a PNG chart of the\n"
    "best speedup over time per signature) and leaves the cache ready for\n"
    "`kforge cache export FILE --sign KEY`.\n"
    "CMD should be a representative, finite workload (a few hundred steps of the real model).\n"
    "\n"
    "options:\n"
    "  --minutes M             time budget (default 30); a run in progress is not interrupted\n"
    "  --max-evaluations N     stop after the daemon made N evaluations since warm started\n"
    "  --max-runs N            stop after N runs of CMD\n"
    "  --report DIR            where the report goes (default ./kforge-warm-report)\n"
    "  --no-e2e                skip the end-to-end check (below)\n"
    "  --window-ms N           its windows (default 250)\n"
    "  --endpoint E, --server-key K, --daemon-arg ARG   as for `kforge run`\n"
    "  -h, --help              this text\n"
    "\n"
    "It stops early when a whole run of CMD passed with no search running and no evaluation made:\n"
    "every signature CMD reports has been searched (or cannot be).\n"
    "End-to-end check: then CMD runs once more on the cache alone, and inside that one process\n"
    "the hook switches window by window among all active kernels, none, and all but one, counting\n"
    "the catalog operators' calls: with a workload that repeats one step, the call rate is the\n"
    "step rate. A kernel whose step rate with it is not above the rate without it is disabled in\n"
    "the cache (\"no end-to-end gain\"), so production never runs it.\n"
    "exit status: 0 done; 1 CMD failed (its exit status is reported; warm stops); 2 usage error;\n"
    "125 kforge failed (no daemon, no install, ...); 126/127 CMD could not be run.\n";

struct Sample {
  double t_s;
  uint64_t evaluations;
  std::map<std::string, double> best;   // signature -> best speedup so far
  std::set<std::string> seen;           // every signature the daemon lists
  int searching = 0;
};

// Note [Search speed]
// ~~~~~~~~~~~~~~~~~~~
// From the daemon's status, polled every 2 s: for each signature, when it was first listed (its
// first report reached the daemon) and when its best verified speedup first passed 1 (a faster
// kernel verified and timed: a win); both to the poll's resolution. With the evaluations counted
// over the warm, these are the search's speed: time to the first win, and evaluations per minute.
struct SearchSpeed {
  std::map<std::string, double> first_seen_s, first_win_s;
};
SearchSpeed search_speed(const std::vector<Sample>& history) {
  SearchSpeed sp;
  for (const Sample& s : history) {
    for (const std::string& sig : s.seen) sp.first_seen_s.emplace(sig, s.t_s);
    for (const auto& [sig, b] : s.best) {
      if (b > 1.0) sp.first_win_s.emplace(sig, s.t_s);
    }
  }
  return sp;
}

// Polls the daemon while CMD runs: progress, and the history the chart draws.
class Monitor {
 public:
  Monitor(std::string endpoint, std::string key, Clock::time_point t0) : endpoint_(std::move(endpoint)), key_(std::move(key)), t0_(t0) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Monitor() {
    stop_.store(true);
    thread_.join();
  }
  std::vector<Sample> history() {
    std::lock_guard<std::mutex> l(mu_);
    return history_;
  }
  json last_status() {
    std::lock_guard<std::mutex> l(mu_);
    return last_;
  }
  Sample poll_now() {
    Sample s = sample();
    return s;
  }

 private:
  Sample sample() {
    Sample s;
    s.t_s = std::chrono::duration<double>(Clock::now() - t0_).count();
    StatusOr<json> st = query_daemon_status(endpoint_, key_, 3000);
    if (!st.ok()) {
      s.searching = -1;
      return s;
    }
    s.evaluations = st->value("/budgets/evaluations_total"_json_pointer, 0ull);
    for (const json& sig : (*st)["signatures"]) {
      const double b = sig.value("best_speedup", 0.0);
      s.seen.insert(sig.value("signature", "?"));
      if (b > 0) s.best[sig.value("signature", "?")] = b;
      s.searching += sig.value("state", "") == "searching" ? 1 : 0;
    }
    std::lock_guard<std::mutex> l(mu_);
    last_ = *st;
    history_.push_back(s);
    return s;
  }
  void loop() {
    while (!stop_.load()) {
      sample();
      for (int i = 0; i < 20 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::string endpoint_, key_;
  Clock::time_point t0_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Sample> history_;
  json last_;
  std::thread thread_;
};

std::string mmss(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%d:%02d", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return b;
}

std::string fixed(double v, int d) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", d, v);
  return b;
}

std::string short_sig(const std::string& s) { return s.size() > 70 ? s.substr(0, 67) + "..." : s; }

}  // namespace

int run_warm_command(const std::vector<std::string>& args, const std::string& cache_dir_flag, std::ostream& out,
                     std::ostream& err) {
  const std::string who = "kforge warm";
  double minutes = 30;
  uint64_t max_evals = 0, max_runs = 0;
  std::string report_dir = "kforge-warm-report";
  bool no_e2e = false;
  uint32_t ab_window_ms = 250;
  DaemonRequest daemon;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      out << kWarmUsage;
      return 0;
    }
    if (a.empty() || a[0] != '-') break;
    if (a == "--no-e2e") {
      no_e2e = true;
      continue;
    }
    // --name=value or --name value
    std::string v;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      v = a.substr(eq + 1);
      a.resize(eq);
    } else if (i + 1 < args.size()) {
      v = args[++i];
    } else {
      err << who << ": " << a << (a.rfind("--", 0) == 0 ? " needs a value or is unknown" : ": unknown option") << " (kforge warm --help)\n";
      return 2;
    }
    char* end = nullptr;
    if (a == "--minutes") {
      minutes = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(minutes > 0)) {
        err << who << ": --minutes needs a positive number, got '" << v << "'\n";
        return 2;
      }
    } else if (a == "--max-evaluations" || a == "--max-runs") {
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (*end != '\0' || n == 0) {
        err << who << ": " << a << " needs a positive integer, got '" << v << "'\n";
        return 2;
      }
      (a == "--max-runs" ? max_runs : max_evals) = n;
    } else if (a == "--window-ms") {
      const unsigned long n = std::strtoul(v.c_str(), &end, 10);
      if (*end != '\0' || n < 50 || n > 60000) {
        err << who << ": --window-ms needs milliseconds in 50..60000, got '" << v << "'\n";
        return 2;
      }
      ab_window_ms = static_cast<uint32_t>(n);
    } else if (a == "--report") {
      report_dir = v;
    } else if (a == "--endpoint") {
      daemon.endpoint = v;
    } else if (a == "--server-key") {
      daemon.server_key = v;
    } else if (a == "--daemon-arg") {
      daemon.extra_args.push_back(v);
    } else {
      err << who << ": unknown option '" << a << "' (kforge warm --help)\n";
      return 2;
    }
  }
  const std::vector<std::string> argv(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())), args.end());
  if (argv.empty()) {
    err << who << ": no command given (usage: kforge warm [options] -- CMD ARGS...)\n";
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(report_dir, ec);
  if (ec || ::access(report_dir.c_str(), W_OK) != 0) {
    err << who << ": cannot write the report to " << report_dir << ": " << (ec ? ec.message() : std::strerror(errno)) << "\n";
    return 125;
  }
  HookedRun how;
  how.cache_dir = resolve_cache_dir(cache_dir_flag, who, err);
  if (how.cache_dir.empty()) return 125;
  StatusOr<InstallLayout> layout = find_install_layout();
  if (!layout.ok()) {
    err << who << ": " << layout.status().message() << "\n";
    return 125;
  }
  daemon.cache_dir = how.cache_dir;
  StatusOr<DaemonHandle> d = ensure_daemon(*layout, daemon, err);
  if (!d.ok()) {
    err << who << ": " << d.status().message() << "\n";
    return 125;
  }
  how.endpoint = d->endpoint;
  if (!daemon.server_key.empty()) how.extra_env["KFORGE_DAEMON_SERVER_KEY"] = daemon.server_key;
  const std::string their_cache = d->status.value("/daemon/cache_dir"_json_pointer, std::string());
  if (!their_cache.empty() && !std::filesystem::equivalent(their_cache, how.cache_dir, ec)) {
    err << who << ": kforged (pid " << d->pid << ") writes its kernels to " << their_cache << ", not to "
        << how.cache_dir << ": warming would fill another cache (use --cache-dir " << their_cache << ")\n";
    return 125;
  }
  const uint64_t evals0 = d->status.value("/budgets/evaluations_total"_json_pointer, 0ull);
  const auto t0 = Clock::now();
  const double budget_s = minutes * 60;
  out << "warm: " << argv[0] << " under kforge until " << fixed(minutes, minutes < 10 ? 1 : 0) << " min"
      << (max_evals ? ", " + std::to_string(max_evals) + " evaluations" : std::string())
      << " or nothing is left to search; daemon pid " << d->pid << ", cache " << how.cache_dir << "\n" << std::flush;

  struct RunRecord {
    double start_s, wall_s;
    std::string result;
    RunSummary summary;
  };
  std::vector<RunRecord> runs;
  std::vector<Sample> history;
  json last_status = d->status;
  std::string stop_reason;
  int rc = 0;
  Monitor monitor(d->endpoint, daemon.server_key, t0);
  while (true) {
    const double start_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const uint64_t evals_before = monitor.poll_now().evaluations;
    // Progress while CMD runs: one line every 10 s.
    std::atomic<bool> running{true};
    std::thread progress([&] {
      int ticks = 0;
      while (running.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (++ticks % 50 != 0) continue;
        const std::vector<Sample> h = monitor.history();
        if (h.empty() || h.back().searching < 0) continue;
        const Sample& s = h.back();
        std::string best;
        std::vector<std::pair<double, std::string>> b;
        for (const auto& [sig, v] : s.best) b.push_back({v, sig.substr(0, sig.find('('))});
        std::sort(b.rbegin(), b.rend());
        for (size_t k = 0; k < b.size() && k < 3; ++k) best += (k ? ", " : "") + b[k].second + " " + fixed(b[k].first, 2) + "x";
        const size_t sigs = monitor.last_status().value("signatures", json::array()).size();
        out << "warm: " << mmss(s.t_s) << " of " << mmss(budget_s) << ", run " << runs.size() + 1 << ", " << sigs
            << " signatures (" << s.searching << " searching), " << s.evaluations - evals0 << " evaluations"
            << (best.empty() ? std::string() : ", best " + best);
        if (!runs.empty() && runs.back().summary.saved_ns > 0 && runs.back().wall_s > 0) {
          out << ", estimated gain " << fixed(100.0 * runs.back().summary.saved_ns / (runs.back().wall_s * 1e9), 1) << "%";
        }
        out << "\n" << std::flush;
      }
    });
    HookedResult r = run_hooked(how, argv, who, err);
    running.store(false);
    progress.join();
    runs.push_back({start_s, r.program.wall_s, describe_result(r.program), r.summary});
    if (!r.program.started) {
      rc = r.program.exit_code;
      stop_reason = "CMD could not be run";
      break;
    }
    if (r.program.exit_code != 0) {
      err << who << ": " << argv[0] << " " << describe_result(r.program) << " on run " << runs.size() << "; stopping\n";
      rc = 1;
      stop_reason = "CMD failed (" + describe_result(r.program) + ")";
      break;
    }
    const Sample after = monitor.poll_now();
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    out << "warm: run " << runs.size() << " done in " << fixed(r.program.wall_s, 1) << " s: "
        << r.summary.active() << " kernels active";
    if (r.summary.saved_ns > 0) out << ", estimated kernel time saved " << human_duration_ns(r.summary.saved_ns);
    out << "\n" << std::flush;
    if (after.searching < 0) {
      err << who << ": the daemon stopped answering; stopping\n";
      rc = 125;
      stop_reason = "the daemon stopped answering";
      break;
    }
    if (now >= budget_s) {
      stop_reason = "time budget spent";
      break;
    }
    if (max_evals && after.evaluations - evals0 >= max_evals) {
      stop_reason = "evaluation budget spent";
      break;
    }
    if (max_runs && runs.size() >= max_runs) {
      stop_reason = "--max-runs reached";
      break;
    }
    if (runs.size() >= 2 && after.searching == 0 && after.evaluations == evals_before) {
      stop_reason = "nothing left to search (a whole run with no search and no evaluation)";
      break;
    }
  }
  history = monitor.history();
  last_status = monitor.last_status();

  // The end-to-end check (Note [End-to-end A/B]): one more run, the cache only, the hook
  // alternating its tables window by window; entries that do not pay are disabled in the cache.
  std::string ab_text;
  std::vector<std::string> left_out;
  if (rc == 0 && !runs.empty() && runs.back().summary.active() > 0 && !no_e2e) {
    out << "warm: end-to-end check: one more run, kforge's kernels in and out in " << ab_window_ms
        << " ms windows\n" << std::flush;
    HookedRun ab = how;
    ab.no_daemon = true;
    ab.extra_env["KFORGE_AB_WINDOW_MS"] = std::to_string(ab_window_ms);
    HookedResult r = run_hooked(ab, argv, who, err);
    const AbResult res = analyse_ab(r.summary.ab);
    std::ostringstream t;
    const auto none = res.by_label.find("none");
    if (!r.program.started || r.program.exit_code != 0) {
      t << "The end-to-end run failed (" << describe_result(r.program) << "); nothing was left out.\n";
    } else if (none == res.by_label.end() || none->second.pairs < 3) {
      t << "Not measured: the run gave " << (none == res.by_label.end() ? 0 : none->second.pairs)
        << " window pairs (at least 3 are needed; the entries finish their trials first, then each window is "
        << ab_window_ms << " ms): make the workload longer.\n";
    } else {
      t << "Step rate with every kernel in, against PyTorch's kernels alone, in one process ("
        << fixed(res.seconds, 1) << " s of " << ab_window_ms << " ms windows"
        << (res.idle_windows > 0 ? ", " + std::to_string(res.idle_windows) + " of them without a call and not paired" : "")
        << "): **" << fixed(none->second.median, 3)
        << "x** (median of " << none->second.pairs << " adjacent window pairs; quartiles " << fixed(none->second.low, 3)
        << "-" << fixed(none->second.high, 3) << ").\n\n| entry | with it / without it | pairs | verdict |\n| --- | --- | --- | --- |\n";
      for (const auto& [label, q] : res.by_label) {
        if (label == "none") continue;
        const std::string key = res.entry_of.count(label) ? res.entry_of.at(label) : label;
        // Leave out what does not pay: with it, the step is not faster than without it.
        const bool pays = q.pairs >= 3 && q.median > 1.0;
        t << "| `" << key << "` | " << fixed(q.median, 3) << " (" << fixed(q.low, 3) << "-" << fixed(q.high, 3) << ") | "
          << q.pairs << " | " << (pays ? "kept" : q.pairs < 3 ? "kept (too few windows to judge)" : "**left out**") << " |\n";
        if (!pays && q.pairs >= 3) {
          std::ostringstream o, e;
          const int drc = run_cache_command({"disable", key, "--reason", "kforge warm: no end-to-end gain (with it / without it " +
                                                                           fixed(q.median, 3) + ")"},
                                            how.cache_dir, o, e);
          if (drc == 0) {
            left_out.push_back(key);
          } else {
            err << who << ": could not disable " << key << ": " << e.str();
          }
        }
      }
      out << "warm: end to end, every kernel in vs none: " << fixed(none->second.median, 3) << "x ("
          << none->second.pairs << " window pairs); " << left_out.size() << " entries left out\n";
    }
    ab_text = t.str();
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // The chart: best speedup over time per signature, numbered as in the report's table.
  std::vector<std::string> order;
  for (const Sample& s : history) {
    for (const auto& [sig, v] : s.best) {
      if (std::find(order.begin(), order.end(), sig) == order.end()) order.push_back(sig);
    }
  }
  std::vector<ChartSeries> series;
  for (size_t k = 0; k < order.size(); ++k) {
    ChartSeries cs{std::to_string(k + 1), {}};
    double last = 0;
    for (const Sample& s : history) {
      const auto it = s.best.find(order[k]);
      if (it == s.best.end() || it->second == last) continue;
      last = it->second;
      cs.points.push_back({s.t_s / 60, last});
    }
    if (!cs.points.empty()) cs.points.push_back({total_s / 60, last});
    series.push_back(std::move(cs));
  }
  const std::string chart = report_dir + "/best-speedup.png", md = report_dir + "/report.md";
  const Status chart_ok = write_step_chart_png(chart, series, "min", "x");
  if (!chart_ok.ok()) err << who << ": " << chart_ok.message() << "\n";

  std::ofstream r(md + ".tmp");
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::string cmdline;
  for (const std::string& a : argv) cmdline += (cmdline.empty() ? "" : " ") + a;
  const uint64_t evals_end = last_status.value("/budgets/evaluations_total"_json_pointer, evals0);
  r << "# kforge warm report\n\n"
    << "- when: " << date << "\n- command: `" << cmdline << "`\n- cache: `" << how.cache_dir << "`\n"
    << "- daemon: pid " << d->pid << " at `" << d->endpoint << "`\n"
    << "- budget: " << fixed(minutes, 1) << " min" << (max_evals ? ", " + std::to_string(max_evals) + " evaluations" : std::string())
    << "; used " << fixed(total_s / 60, 1) << " min, " << evals_end - evals0 << " evaluations, " << runs.size()
    << " runs\n- stopped: " << stop_reason << "\n\n"
    << "## Signatures\n\nThe daemon's view at the end (best verified speedup over PyTorch in its worker; `-`: nothing "
       "faster found). The number is the series in the chart.\n\n"
    << "| # | state | calls | evaluations | best | signature |\n| --- | --- | --- | --- | --- | --- |\n";
  for (const json& s : last_status.value("signatures", json::array())) {
    const std::string sig = s.value("signature", "?");
    const auto pos = std::find(order.begin(), order.end(), sig);
    const double best = s.value("best_speedup", 0.0);
    r << "| " << (pos == order.end() ? std::string("") : std::to_string(pos - order.begin() + 1)) << " | "
      << s.value("state", "?") << " | " << s.value("calls", 0ull) << " | " << s.value("evaluations", 0ull) << " | "
      << (best > 0 ? fixed(best, 2) + "x" : std::string("-")) << " | `" << sig << "` |\n";
  }
  r << "\n![best speedup over time per signature](best-speedup.png)\n\n"
    << "Best verified speedup (y) against minutes since warm started (x), per signature numbered as above; "
       "the black line is PyTorch's own speed (1x).\n\n";
  // Note [Search speed]
  const SearchSpeed speed = search_speed(history);
  const double evals_per_min = total_s > 0 ? static_cast<double>(evals_end - evals0) / (total_s / 60) : 0;
  r << "## Search speed\n\n" << evals_end - evals0 << " evaluations in " << fixed(total_s / 60, 1) << " min: **"
    << fixed(evals_per_min, 1) << " per minute** (the daemon's workers, every signature together). Per signature, seconds "
       "from its first listing by the daemon to its first verified win (best speedup above 1), to the 2 s of the "
       "status polls:\n\n| # | first listed | first win | to the first win | signature |\n| --- | --- | --- | --- | --- |\n";
  for (const auto& [sig, seen] : speed.first_seen_s) {
    const auto pos = std::find(order.begin(), order.end(), sig);
    const auto win = speed.first_win_s.find(sig);
    r << "| " << (pos == order.end() ? std::string("") : std::to_string(pos - order.begin() + 1)) << " | " << fixed(seen, 0)
      << " s | " << (win == speed.first_win_s.end() ? std::string("-") : fixed(win->second, 0) + " s") << " | "
      << (win == speed.first_win_s.end() ? std::string("no win") : "**" + fixed(win->second - seen, 0) + " s**") << " | `"
      << sig << "` |\n";
  }
  {
    // Where the workers' build time went, over this warm (the daemon's counters are since its start).
    auto delta = [&](const char* name) {
      const json::json_pointer at(std::string("/counters/") + name);
      const uint64_t a = d->status.value(at, 0ull), b = last_status.value(at, a);
      return b >= a ? b - a : 0ull;
    };
    const uint64_t compiled = delta("worker_builds_compiled"), cached = delta("worker_builds_cached");
    r << "\nWorkers' builds: " << compiled << " compiled (" << fixed(static_cast<double>(delta("worker_build_ms")) / 1000, 1)
      << " s of compiling), " << cached << " from the build cache. Builds ahead on the daemon's threads "
         "(`workers.prebuild_threads`, Note [Builds ahead]): "
      << delta("prebuilds_built") << " built, " << delta("prebuilds_already_cached") << " already cached, "
      << delta("prebuilds_failed") << " failed, " << delta("prebuilds_dropped") << " dropped.\n";
  }
  r << "\n## Runs\n\n| run | started | wall | result | kernels active | "
       "estimated kernel time saved |\n| --- | --- | --- | --- | --- | --- |\n";
  for (size_t k = 0; k < runs.size(); ++k) {
    r << "| " << k + 1 << " | " << mmss(runs[k].start_s) << " | " << fixed(runs[k].wall_s, 1) << " s | " << runs[k].result << " | "
      << runs[k].summary.active() << " | "
      << (runs[k].summary.saved_ns > 0 ? human_duration_ns(runs[k].summary.saved_ns) : std::string("-")) << " |\n";
  }
  if (!runs.empty()) {
    // The worker's best beside the process's own ratio: a worker that timed while CMD ran on the
    // same GPU can report far more than the process then gets (stop 41 on an H100: softmax over
    // dim 1 of [64, 4096, 512] at 25.9x in the worker beside the workload, 15.4x in bench_search
    // alone, 13.8x in the process). The process's number is what users get.
    std::map<std::string, double> worker_best;
    for (const json& s : last_status.value("signatures", json::array())) {
      worker_best[s.value("signature", "")] = s.value("best_speedup", 0.0);
    }
    r << "\n## Kernels in the last run\n\nPer signature with a cache entry: its state in CMD's processes "
         "(active: swapped in; no_win: correct but not faster in the process itself, PyTorch's kernel runs), "
         "the in-process times of its trial and their ratio, which is what CMD gets, beside the worker's best. "
         "The worker times beside CMD when CMD uses the same GPU, and its ratio can then be far above the "
         "process's (the daemon's log names the publications timed so).\n\n"
         "| state | PyTorch | kforge | in process | worker's best | signature |\n| --- | --- | --- | --- | --- | --- |\n";
    for (const RunSummary::Kernel& k : runs.back().summary.kernels) {
      std::string states;
      for (const auto& [st, n] : k.states) states += (states.empty() ? "" : "/") + st;
      const auto wb = worker_best.find(k.signature);
      r << "| " << states << " | " << (k.pytorch_median_ns > 0 ? human_duration_ns(k.pytorch_median_ns) : "-") << " | "
        << (k.entry_median_ns > 0 ? human_duration_ns(k.entry_median_ns) : "-") << " | "
        << (k.pytorch_median_ns > 0 && k.entry_median_ns > 0 ? fixed(k.pytorch_median_ns / k.entry_median_ns, 2) + "x" : "-")
        << " | " << (wb != worker_best.end() && wb->second > 0 ? fixed(wb->second, 2) + "x" : "-") << " | `" << k.signature
        << "` |\n";
    }
  }
  r << "\n## End to end\n\n"
    << (ab_text.empty() ? std::string("Not measured (no kernel was active in the last run, or --no-e2e).\n") : ab_text);
  if (!left_out.empty()) {
    r << "\nLeft out (disabled in the cache: `kforge cache enable KEY` takes one back):";
    for (const std::string& k : left_out) r << " `" << k << "`";
    r << "\n";
  }
  r << "\n## Next\n\n```sh\nkforge --cache-dir " << how.cache_dir
    << " cache export kernels.kfb --sign staging.key   # ship it\nkforge cache import kernels.kfb --trusted-key staging.pub   # in production\n"
    << "kforge run --no-daemon -- " << cmdline << "   # production: the cache only\n```\n";
  r.close();
  std::filesystem::rename(md + ".tmp", md, ec);
  out << "warm: " << stop_reason << " after " << fixed(total_s / 60, 1) << " min, " << runs.size() << " runs, "
      << evals_end - evals0 << " evaluations; report " << md << (chart_ok.ok() ? " and " + chart : std::string()) << "\n";
  out << "warm: " << fixed(evals_per_min, 1) << " evaluations per minute\n";
  for (const json& s : last_status.value("signatures", json::array())) {
    const double best = s.value("best_speedup", 0.0);
    const std::string sig = s.value("signature", "");
    const auto seen = speed.first_seen_s.find(sig);
    const auto win = speed.first_win_s.find(sig);
    std::string first;
    if (seen != speed.first_seen_s.end() && win != speed.first_win_s.end()) {
      first = "  (first win " + fixed(win->second - seen->second, 0) + " s after it was listed)";
    }
    if (best > 0) out << "  " << fixed(best, 2) << "x  " << short_sig(sig) << first << "\n";
  }
  return rc;
}

}  // namespace kforge
