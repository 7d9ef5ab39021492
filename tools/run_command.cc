#include "tools/run_command.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "cache/cache_dir.h"
#include "tools/daemon_launch.h"
#include "tools/install_layout.h"

namespace kforge {

namespace {

constexpr const char kRunUsage[] =
    "usage: kforge [--cache-dir DIR] run [options] [--] CMD [ARGS...]\n"
    "\n"
    "Runs CMD with kforge's hook preloaded: the hook reports CMD's hot operators to the host's\n"
    "search daemon (started if none runs), loads the kernels the cache has for them, checks each\n"
    "against PyTorch's kernel in this process (outputs and time) and, in active mode, swaps in\n"
    "those that are correct and faster. On exit it prints a summary to stderr and exits with\n"
    "CMD's exit status (or dies by CMD's signal).\n"
    "\n"
    "options:\n"
    "  --mode observe|shadow|active  observe: only watch and report; shadow: run cache entries\n"
    "                                beside PyTorch's kernels and compare, keep PyTorch's results;\n"
    "                                active (default): swap in entries that pass their trial\n"
    "  --no-daemon                   production: use the cache only; no daemon, no search, no reports\n"
    "  --endpoint E                  the daemon's endpoint (default: $KFORGE_DAEMON_ENDPOINT, else\n"
    "                                the per-user ipc socket); a tcp:// one needs --server-key K\n"
    "  --daemon-arg ARG              pass ARG to a kforged started here (repeatable), e.g.\n"
    "                                --daemon-arg=--devices --daemon-arg=cpu\n"
    "  --quiet                       no summary\n"
    "  --summary-json FILE           also write the summary as JSON to FILE\n"
    "  -h, --help                    this text\n"
    "\n"
    "exit status: CMD's; 125 kforge failed before CMD ran (the message says why), 126 CMD\n"
    "could not be executed, 127 CMD was not found, 2 usage error.\n";

std::string make_summary_dir(const std::string& who, std::ostream& err) {
  std::string tmpl = (std::getenv("TMPDIR") != nullptr && *std::getenv("TMPDIR") != '\0' ? std::string(std::getenv("TMPDIR"))
                                                                                           : std::string("/tmp")) +
                     "/kforge-run-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    err << who << ": cannot create a directory for the run's summary (" << tmpl << "): " << std::strerror(errno) << "\n";
    return "";
  }
  return tmpl;
}

}  // namespace

std::string resolve_cache_dir(const std::string& given, const std::string& who, std::ostream& err) {
  std::string path = given;
  if (path.empty()) {
    StatusOr<CacheDir::Resolved> r = CacheDir::resolve_path(process_env());
    if (!r.ok()) {
      err << who << ": no kernel cache directory: " << r.status().message() << " (use --cache-dir DIR)\n";
      return "";
    }
    path = r->path;
  }
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

HookedResult run_hooked(const HookedRun& how, const std::vector<std::string>& argv, const std::string& who,
                        std::ostream& err) {
  HookedResult out;
  StatusOr<InstallLayout> layout = find_install_layout();
  if (!layout.ok()) {
    err << who << ": " << layout.status().message() << "\n";
    out.program.exit_code = kExitKforgeFailed;
    return out;
  }
  if (::access(layout->preload.c_str(), R_OK) != 0) {
    err << who << ": kforge's preload library is missing: " << layout->preload << " (" << std::strerror(errno)
        << "); reinstall the bundle\n";
    out.program.exit_code = kExitKforgeFailed;
    return out;
  }
  const std::string summary_dir = make_summary_dir(who, err);
  if (summary_dir.empty()) {
    out.program.exit_code = kExitKforgeFailed;
    return out;
  }
  std::map<std::string, std::string> env = how.extra_env;
  std::string preload = layout->preload;
  if (const char* old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0') {
    // Ours first; the user's own preloads stay (a second copy of ours is harmless: the shim
    // loads the hook once).
    preload += std::string(":") + old;
  }
  env["LD_PRELOAD"] = preload;
  env["KFORGE_HOOK_DIR"] = layout->hook_dir;
  env["KFORGE_MODE"] = how.mode;
  env["KFORGE_SUMMARY_DIR"] = summary_dir;
  if (!how.cache_dir.empty()) env["KFORGE_CACHE_DIR"] = how.cache_dir;
  if (how.no_daemon) {
    env["KFORGE_DAEMON_ENDPOINT"] = "none";
  } else if (!how.endpoint.empty()) {
    env["KFORGE_DAEMON_ENDPOINT"] = how.endpoint;
  }
  out.program = run_program(argv, env, {"KFORGE_DISABLE", "KFORGE_HOOK"}, who, err);
  out.summary = read_run_summary(summary_dir);
  std::error_code ec;
  std::filesystem::remove_all(summary_dir, ec);
  return out;
}

int run_run_command(const std::vector<std::string>& args, const std::string& cache_dir_flag, std::ostream& out,
                    std::ostream& err) {
  const std::string who = "kforge run";
  HookedRun how;
  DaemonRequest daemon;
  bool quiet = false;
  std::string summary_json;
  size_t i = 0;
  auto value = [&](const std::string& a, std::string* v) -> bool {
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      *v = a.substr(eq + 1);
      return true;
    }
    if (i + 1 >= args.size()) return false;
    *v = args[++i];
    return true;
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string name = a.substr(0, a.find('='));
    std::string v;
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      out << kRunUsage;
      return 0;
    }
    if (a.empty() || a[0] != '-') break;
    if (name == "--mode") {
      if (!value(a, &v) || (v != "observe" && v != "shadow" && v != "active")) {
        err << who << ": --mode needs observe, shadow or active" << (v.empty() ? "" : ", got '" + v + "'") << "\n";
        return 2;
      }
      how.mode = v;
    } else if (a == "--no-daemon") {
      how.no_daemon = true;
    } else if (a == "--quiet") {
      quiet = true;
    } else if (name == "--endpoint" || name == "--server-key" || name == "--daemon-arg" || name == "--summary-json") {
      if (!value(a, &v)) {
        err << who << ": " << name << " needs a value\n";
        return 2;
      }
      if (name == "--endpoint") daemon.endpoint = v;
      if (name == "--server-key") daemon.server_key = v;
      if (name == "--daemon-arg") daemon.extra_args.push_back(v);
      if (name == "--summary-json") summary_json = v;
    } else {
      err << who << ": unknown option '" << a << "' (kforge run --help)\n";
      return 2;
    }
  }
  const std::vector<std::string> argv(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())), args.end());
  if (argv.empty()) {
    err << who << ": no command given (usage: kforge run [options] -- CMD ARGS...)\n";
    return 2;
  }
  how.cache_dir = resolve_cache_dir(cache_dir_flag, who, err);
  if (how.cache_dir.empty()) return kExitKforgeFailed;
  std::string daemon_line;
  if (!how.no_daemon) {
    StatusOr<InstallLayout> layout = find_install_layout();
    if (!layout.ok()) {
      err << who << ": " << layout.status().message() << "\n";
      return kExitKforgeFailed;
    }
    daemon.cache_dir = how.cache_dir;
    StatusOr<DaemonHandle> d = ensure_daemon(*layout, daemon, err);
    if (!d.ok()) {
      err << who << ": " << d.status().message() << "\n" << who << ": (or run with --no-daemon: the cache only)\n";
      return kExitKforgeFailed;
    }
    how.endpoint = d->endpoint;
    if (!daemon.server_key.empty()) how.extra_env["KFORGE_DAEMON_SERVER_KEY"] = daemon.server_key;
    const std::string their_cache = d->status.value("/daemon/cache_dir"_json_pointer, std::string());
    std::error_code ec;
    if (!their_cache.empty() && !std::filesystem::equivalent(their_cache, how.cache_dir, ec)) {
      err << who << ": warning: kforged (pid " << d->pid << ") writes its kernels to " << their_cache
          << ", not to " << how.cache_dir << ": this program will not load what it finds (use --cache-dir "
          << their_cache << ", or stop that daemon)\n";
    }
    daemon_line = "kforged pid " + std::to_string(d->pid) + (d->started_here ? " (started now; it keeps running, log " + d->log_path + ")" : "") +
                  " at " + d->endpoint;
  }
  HookedResult r = run_hooked(how, argv, who, err);
  if (!r.program.started) return r.program.exit_code;
  if (!summary_json.empty()) {
    nlohmann::json j = run_summary_json(r.summary);
    j["exit"] = {{"code", r.program.exit_code}, {"signal", r.program.signal}, {"wall_s", r.program.wall_s}};
    const std::string tmp = summary_json + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr || std::fputs((j.dump(2) + "\n").c_str(), f) < 0 || std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), summary_json.c_str()) != 0) {
      err << who << ": cannot write " << summary_json << ": " << std::strerror(errno) << "\n";
    }
  }
  if (!quiet) {
    err << "\nkforge: " << argv[0] << " ran " << (r.program.wall_s < 10 ? std::to_string(r.program.wall_s).substr(0, 4) : std::to_string(static_cast<long>(r.program.wall_s)))
        << " s under kforge (mode " << how.mode << ", cache " << how.cache_dir << "), " << describe_result(r.program) << "\n";
    print_run_summary(r.summary, err);
    if (!daemon_line.empty()) err << "  daemon: " << daemon_line << " (`kforge status` shows its searches)\n";
    if (how.no_daemon) err << "  no daemon (--no-daemon): nothing was searched\n";
  }
  return exit_like(r.program);
}

}  // namespace kforge
