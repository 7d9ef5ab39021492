#include "tools/demo_command.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tools/daemon_launch.h"
#include "tools/install_layout.h"
#include "tools/run_command.h"

namespace kforge {

namespace {

using json = nlohmann::json;

constexpr const char kDemoUsage[] =
    "usage: kforge demo [--device cpu|cuda] [--minutes M] [--fresh] [--keep-daemon] [--python P]\n"
    "\n"
    "Runs a small model built in code (convolutions, group norm + SiLU residual blocks, windowed\n"
    "attention with layer norm, softmax and a GELU MLP; share/kforge/demo.py) under kforge, on the\n"
    "GPU when there is one and on the CPU otherwise, with a daemon of its own:\n"
    "  1. search: the model runs while the daemon searches kernels for its hot operators; each\n"
    "     one it publishes is checked in the model's process (outputs and time) and swapped in\n"
    "  2. measure: step time with kforge's interceptors out of the dispatcher (PyTorch alone) and\n"
    "     in, alternated in the same process: the ratio is measured, not estimated\n"
    "  3. check: the model's output with and without kforge against a float64 reference, judged\n"
    "     by kforge's accuracy criterion\n"
    "The demo's daemon, cache and journals live in <state dir>/demo (not your kernel cache); a\n"
    "second run reuses what the first found, --fresh starts over.\n"
    "\n"
    "options:\n"
    "  --device cpu|cuda   default: cuda if torch sees a GPU, else cpu\n"
    "  --minutes M         the search's time budget (default 4 on the CPU, 3 on a GPU)\n"
    "  --fresh             forget what earlier demos found (their cache and journals)\n"
    "  --keep-daemon       leave the demo's daemon running afterwards (`kforge status\n"
    "                      --endpoint ipc://<state dir>/demo/daemon.sock`)\n"
    "  --python P          the python3 with torch (default: python3 on PATH)\n"
    "  --json              print the result as JSON\n"
    "\n"
    "exit status: 0 when the outputs are within the criterion, 1 when they are not, 2 usage,\n"
    "125 kforge could not run the demo (the message says why).\n";

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Watches the demo's daemon: a progress line now and then, and the control file once no search
// runs (Note in demo.py: the model then settles and is measured).
class SearchWatch {
 public:
  SearchWatch(std::string endpoint, std::string control, std::ostream& out) : endpoint_(std::move(endpoint)), control_(std::move(control)), out_(out) {
    thread_ = std::thread([this] { loop(); });
  }
  ~SearchWatch() {
    stop_.store(true);
    thread_.join();
  }
  json last() {
    std::lock_guard<std::mutex> l(mu_);
    return last_;
  }

 private:
  void loop() {
    int idle_polls = 0;
    auto last_print = std::chrono::steady_clock::now() - std::chrono::seconds(60);
    while (!stop_.load()) {
      for (int i = 0; i < 30 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      StatusOr<json> st = query_daemon_status(endpoint_, "", 2000);
      if (!st.ok()) continue;
      {
        std::lock_guard<std::mutex> l(mu_);
        last_ = *st;
      }
      int searching = 0, published = 0;
      std::string best;
      for (const json& s : (*st)["signatures"]) {
        const std::string state = s.value("state", "");
        searching += state == "searching" ? 1 : 0;
        published += state == "published" ? 1 : 0;
      }
      const uint64_t evals = st->value("/budgets/evaluations_total"_json_pointer, 0ull);
      const auto now = std::chrono::steady_clock::now();
      if (now - last_print > std::chrono::seconds(15)) {
        out_ << "demo: daemon: " << (*st)["signatures"].size() << " signatures, " << searching << " searching, "
             << published << " with a faster kernel published, " << evals << " evaluations\n"
             << std::flush;
        last_print = now;
      }
      idle_polls = searching == 0 && evals > 0 ? idle_polls + 1 : 0;
      if (idle_polls >= 2 && !std::filesystem::exists(control_)) std::ofstream(control_) << "search over\n";
    }
  }
  std::string endpoint_, control_;
  std::ostream& out_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  json last_;
  std::thread thread_;
};

void stop_daemon(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGKILL);
  (void)::waitpid(pid, nullptr, 0);
}

bool torch_sees_cuda(const std::string& python) {
  const std::string cmd = python + " -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

void print_report(const json& r, const json& daemon_status, std::ostream& out) {
  const json& m = r["model"];
  out << "\nkforge demo: " << r.value("device", "?") << " (" << r.value("gpu", std::string("CPU, 1 torch thread")) << "), "
      << r.value("dtype", "?") << ", " << m.value("blocks", 0) << " residual + " << m.value("blocks", 0)
      << " window-attention blocks, input " << r["input"].dump() << "\n";
  out << "  operators observed:";
  for (const json& o : r["operators"]) out << " " << o.get<std::string>();
  out << "\n";
  uint64_t evals = daemon_status.value("/budgets/evaluations_total"_json_pointer, 0ull);
  int published = 0;
  for (const json& s : daemon_status.value("signatures", json::array())) published += s.value("state", "") == "published";
  out << "  search: " << fmt("%.0f", r.value("search_seconds", 0.0)) << " s, " << evals << " evaluations by the daemon, "
      << published << " signatures with a faster verified kernel\n";
  int active = 0;
  for (const json& k : r["kernels"]) active += k.value("state", "") == "active";
  out << "  kernels swapped in: " << active << " of " << r["kernels"].size() << " loaded\n";
  for (const json& k : r["kernels"]) {
    std::string speed;
    if (k["pytorch_median_ns"].is_number() && k["entry_median_ns"].is_number() && k["entry_median_ns"].get<double>() > 0) {
      speed = fmt("%.2fx in this process", k["pytorch_median_ns"].get<double>() / k["entry_median_ns"].get<double>());
    }
    const std::string state = k.value("state", "?");
    out << "    " << (state == "no_win" ? "no win" : state) << "  " << speed << "  " << k.value("signature", "") << "\n";
    if (!k.value("reason", "").empty()) out << "        " << k.value("reason", "") << "\n";
  }
  out << "  step time: before " << fmt("%.3f", r.value("before_median_ms", 0.0)) << " ms (PyTorch alone), after "
      << fmt("%.3f", r.value("after_median_ms", 0.0)) << " ms (with kforge): " << fmt("%.2fx", r.value("speedup", 0.0))
      << " (medians of " << r["before_ms"].size() << " alternated blocks of " << r.value("steps_per_block", 0)
      << " steps in one process; block ratios " << fmt("%.2f", r["speedup_range"][0].get<double>()) << "-"
      << fmt("%.2f", r["speedup_range"][1].get<double>()) << ")\n";
  if (active == 0) out << "             (no kernel was swapped in: before and after run the same kernels, any difference is noise)\n";
  const json& c = r["check"];
  out << "  outputs: " << (c.value("passed", false) ? "within the criterion" : "NOT within the criterion")
      << (c.value("identical", false) ? " (bitwise identical to PyTorch's)" : "") << ": max abs error "
      << fmt("%.3g", c["kforge"].value("max_abs", 0.0)) << " (bound " << fmt("%.3g", c.value("max_abs_bound", 0.0))
      << "; PyTorch's own " << fmt("%.3g", c["pytorch"].value("max_abs", 0.0)) << "), relative L2 "
      << fmt("%.3g", c["kforge"].value("rel_l2", 0.0)) << " (bound " << fmt("%.3g", c.value("rel_l2_bound", 0.0))
      << "), against a float64 run of the same model\n";
}

}  // namespace

int run_demo_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const std::string who = "kforge demo";
  std::string device, python = "python3";
  double minutes = 0;
  bool fresh = false, keep = false, as_json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto need = [&](std::string* v) {
      if (i + 1 >= args.size()) return false;
      *v = args[++i];
      return true;
    };
    std::string v;
    if (a == "-h" || a == "--help") {
      out << kDemoUsage;
      return 0;
    } else if (a == "--device") {
      if (!need(&device) || (device != "cpu" && device != "cuda")) {
        err << who << ": --device needs cpu or cuda\n";
        return 2;
      }
    } else if (a == "--minutes") {
      if (!need(&v) || (minutes = std::atof(v.c_str())) <= 0 || minutes > 600) {
        err << who << ": --minutes needs a number of minutes in (0, 600]\n";
        return 2;
      }
    } else if (a == "--python") {
      if (!need(&python)) {
        err << who << ": --python needs a program\n";
        return 2;
      }
    } else if (a == "--fresh") {
      fresh = true;
    } else if (a == "--keep-daemon") {
      keep = true;
    } else if (a == "--json") {
      as_json = true;
    } else {
      err << who << ": unknown option '" << a << "' (kforge demo --help)\n";
      return 2;
    }
  }
  StatusOr<InstallLayout> layout = find_install_layout();
  if (!layout.ok()) {
    err << who << ": " << layout.status().message() << "\n";
    return 125;
  }
  const std::string script = layout->share + "/demo.py";
  if (::access(script.c_str(), R_OK) != 0) {
    err << who << ": the demo model is missing: " << script << "; reinstall the bundle\n";
    return 125;
  }
  if (device.empty()) device = torch_sees_cuda(python) ? "cuda" : "cpu";
  if (minutes == 0) minutes = device == "cpu" ? 4 : 3;

  const std::string home = default_state_dir() + "/demo";
  std::error_code ec;
  if (fresh) {
    std::filesystem::remove_all(home + "/cache", ec);
    std::filesystem::remove_all(home + "/state", ec);
  }
  std::filesystem::create_directories(home, ec);
  ::chmod(home.c_str(), 0700);
  DaemonRequest req;
  req.endpoint = "ipc://" + home + "/daemon.sock";
  req.cache_dir = home + "/cache";
  req.state_dir = home + "/state";
  // A small search: a few evaluations per signature, started after a few calls. On the CPU the
  // daemon's one worker takes one core and the model the other (demo.py runs one torch thread).
  req.extra_args = {"--devices", device == "cpu" ? "cpu" : "auto", "--max-evaluations", device == "cpu" ? "8" : "16",
                    "--min-calls", "20"};
  // Progress goes to stderr (the model's lines too, demo.py): stdout is the report, or with --json
  // one JSON document.
  err << "demo: " << device << ", search budget " << minutes << " min; the demo's daemon, cache and journals are in "
      << home << "\n" << std::flush;
  StatusOr<DaemonHandle> d = ensure_daemon(*layout, req, err);
  if (!d.ok()) {
    err << who << ": " << d.status().message() << "\n";
    return 125;
  }
  const std::string result_path = home + "/result.json", control = home + "/search-over";
  std::filesystem::remove(result_path, ec);
  std::filesystem::remove(control, ec);
  HookedRun how;
  how.mode = "active";
  how.cache_dir = req.cache_dir;
  how.endpoint = d->endpoint;
  how.extra_env["KFORGE_BENCH_TOGGLE"] = "1";   // demo.py's before/after in one process
  // On the CPU, kforge's templates beat PyTorch on short softmax rows and narrow layer norms,
  // not on the model's group norms and activations (docs/BENCHMARKS.md): searching only those
  // two fits a few minutes of a 2-core machine. On a GPU every operator is searched.
  if (device == "cpu") how.extra_env["KFORGE_OPS"] = "_softmax,native_layer_norm";
  HookedResult r;
  json daemon_status;
  {
    SearchWatch watch(d->endpoint, control, err);
    r = run_hooked(how,
                   {python, script, "--device", device, "--search-seconds", std::to_string(minutes * 60), "--control",
                    control, "--result", result_path},
                   who, err);
    daemon_status = watch.last();
  }
  // The watcher's last poll can predate the last winners: ask once more before stopping it.
  if (StatusOr<json> st = query_daemon_status(d->endpoint, "", 3000); st.ok()) daemon_status = *st;
  if (d->started_here && !keep) stop_daemon(d->pid);
  if (!r.program.started) return r.program.exit_code;
  if (r.program.exit_code != 0) {
    err << who << ": the demo model " << describe_result(r.program) << "\n";
    return 125;
  }
  std::ifstream in(result_path);
  json res = json::parse(in, nullptr, false);
  if (res.is_discarded() || !res.is_object() || !res.contains("check")) {
    err << who << ": the demo model wrote no result to " << result_path << "\n";
    return 125;
  }
  if (as_json) {
    res["daemon"] = daemon_status;
    out << res.dump(2) << "\n";
  } else {
    print_report(res, daemon_status, out);
  }
  return res["check"].value("passed", false) ? 0 : 1;
}

}  // namespace kforge
