// `kforge doctor` (doctor_command.h).
#include "tools/doctor_command.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "cache/cache_dir.h"
#include "runtime/control_message.h"
#include "runtime/cuda_driver.h"
#include "runtime/daemon_endpoint.h"
#include "runtime/nvrtc.h"
#include "runtime/transport.h"
#include "runtime/unique_fd.h"
#include "runtime/version.h"
#include "tools/install_layout.h"

extern char** environ;

namespace kforge {

namespace {

using json = nlohmann::json;

enum class Verdict { kOk, kWarn, kFail };

struct Check {
  std::string name;
  Verdict verdict = Verdict::kOk;
  std::string detail;
  std::string fix;   // empty for ok
};

// Below this much free space the cache directory is a warning: a day of searching writes a few
// hundred MiB of entries and build artifacts.
constexpr uint64_t kLowFreeBytes = uint64_t{1} << 30;
// A python that has not imported torch in this long is broken, not slow.
constexpr int kPythonTimeoutMs = 120000;
constexpr int kDaemonTimeoutMs = 2000;

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1u << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(b) / (1u << 20));
  }
  return buf;
}

std::string getenv_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// What a child program printed and how it ended.
struct ChildRun {
  bool started = false;
  std::string start_error;   // why it could not be started
  bool timed_out = false;
  bool exited = false;
  int exit_code = 0;
  int signal = 0;
  std::string output;        // stdout and stderr together, at most 1 MiB
};

// Runs argv (PATH search) with `env_extra` added to this environment, stdin from /dev/null, for at
// most timeout_ms; the child is killed and reaped on every path.
ChildRun run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env_extra, int timeout_ms) {
  ChildRun r;
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view key = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const std::string& x : env_extra) replaced = replaced || x.substr(0, x.find('=')) == key;
    if (!replaced) env_strings.emplace_back(kv);
  }
  env_strings.insert(env_strings.end(), env_extra.begin(), env_extra.end());
  std::vector<char*> envp, args;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    r.start_error = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&fa, write_end.get(), 1);
  ::posix_spawn_file_actions_adddup2(&fa, write_end.get(), 2);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    r.start_error = std::strerror(rc);
    return r;
  }
  r.started = true;
  write_end.reset();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::array<char, 65536> buf;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd p{read_end.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    const ssize_t got = ::read(read_end.get(), buf.data(), buf.size());
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) break;   // EOF: the child (and anything it started) closed its output
    if (r.output.size() < (size_t{1} << 20)) r.output.append(buf.data(), static_cast<size_t>(got));
  }
  if (r.timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    r.exited = true;
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  return r;
}

// The last non-empty line of a program's output (python's exception line), at most 300 characters.
std::string last_line(const std::string& text) {
  size_t end = text.size();
  while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == '\r' || text[end - 1] == ' ')) --end;
  const size_t start = text.rfind('\n', end == 0 ? 0 : end - 1);
  std::string line = text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1));
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

// The one JSON object line a probe printed (it prints nothing else on stdout; torch or the hook
// may log on stderr, which shares the pipe).
std::optional<json> probe_result(const std::string& output) {
  const std::string marker = "KFORGE_DOCTOR ";
  const size_t at = output.rfind(marker);
  if (at == std::string::npos) return std::nullopt;
  const size_t end = output.find('\n', at);
  json j = json::parse(output.substr(at + marker.size(), end == std::string::npos ? std::string::npos : end - at - marker.size()),
                       nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

std::string describe_end(const ChildRun& r) {
  if (r.timed_out) return "did not finish within " + std::to_string(kPythonTimeoutMs / 1000) + " s";
  if (!r.exited) {
    const char* abbrev = sigabbrev_np(r.signal);
    return std::string("died of ") + (abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(r.signal));
  }
  return "exited with status " + std::to_string(r.exit_code);
}

// Imports torch and says what the worker would find: torch's version, and libcupti the way
// search_daemon/worker/cupti_timer.cc looks for it (already in the process, else on the loader's path).
constexpr const char* kTorchProbe = R"py(
import ctypes, json, os, sys
out = {"executable": sys.executable}
try:
    import torch
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
    print("KFORGE_DOCTOR " + json.dumps(out)); sys.exit(0)
out["torch"] = torch.__version__
out["mm"] = ".".join(torch.__version__.split("+")[0].split(".")[:2])
cupti = None
for mode in (os.RTLD_NOLOAD | os.RTLD_LAZY, os.RTLD_LAZY):
    for name in ("libcupti.so.13", "libcupti.so.12", "libcupti.so"):
        try:
            ctypes.CDLL(name, mode=mode); cupti = name; break
        except OSError:
            pass
    if cupti: break
out["cupti"] = cupti
print("KFORGE_DOCTOR " + json.dumps(out))
)py";

// Run with the shim preloaded, as `kforge run` runs a program: after import torch the hook must be
// in the process; then the worker library loads as the kforge-worker launcher loads it.
constexpr const char* kHookProbe = R"py(
import ctypes, json, sys
import torch
hook, worker = sys.argv[1], sys.argv[2]
out = {"hook_loaded": any(hook in line for line in open("/proc/self/maps"))}
if worker:
    try:
        ctypes.CDLL(worker, mode=ctypes.RTLD_GLOBAL); out["worker"] = "ok"
    except OSError as e:
        out["worker"] = str(e)
print("KFORGE_DOCTOR " + json.dumps(out))
)py";

class Doctor {
 public:
  Doctor(std::string python, std::string python_source, std::string endpoint)
      : python_(std::move(python)), python_source_(std::move(python_source)), endpoint_(std::move(endpoint)) {}

  std::vector<Check> run() {
    check_install();
    check_python();
    check_cuda();
    check_cache_dir();
    check_daemon();
    return std::move(checks_);
  }

 private:
  void add(std::string name, Verdict v, std::string detail, std::string fix = "") {
    checks_.push_back(Check{std::move(name), v, std::move(detail), std::move(fix)});
  }

  void check_file(const std::string& name, const std::string& path, bool executable, bool shared_object) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      add("install: " + name, Verdict::kFail, path + " is missing",
          layout_->bundle ? "unpack the kforge bundle again (its bin/ and lib/ belong together)"
                          : "build it: scripts/build.sh (or cmake --build " + layout_->root + ")");
      return;
    }
    if (executable && ::access(path.c_str(), X_OK) != 0) {
      add("install: " + name, Verdict::kFail, path + " is not executable", "chmod 755 " + path);
      return;
    }
    if (shared_object) {
      // An ELF shared object for this machine: what the dynamic loader would take.
      UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      unsigned char h[20] = {};
      const bool elf = fd.valid() && ::read(fd.get(), h, sizeof h) == static_cast<ssize_t>(sizeof h) &&
                       std::memcmp(h, "\x7f" "ELF", 4) == 0 && h[16] == 3 /* ET_DYN */;
      if (!elf) {
        add("install: " + name, Verdict::kFail, path + " is not an ELF shared object", "reinstall kforge: the file is damaged");
        return;
      }
    }
    add("install: " + name, Verdict::kOk, path);
  }

  void check_install() {
    StatusOr<InstallLayout> l = find_install_layout();
    if (!l.ok()) {
      add("install", Verdict::kFail, l.status().message(),
          "run the kforge of a bundle (<bundle>/bin/kforge) or of a build tree (<build>/tools/kforge)");
      return;
    }
    layout_ = *l;
    check_file("kforged", layout_->kforged, true, false);
    check_file("kforge-worker", layout_->worker, true, false);
    check_file("preload shim", layout_->preload, false, true);
    const std::vector<std::string> versions = layout_->hook_torch_versions();
    if (versions.empty()) {
      add("install: hooks", Verdict::kFail, "no libkforge_hook-torch<version>.so in " + layout_->hook_dir,
          "build kforge against the torch the serving processes use (scripts/build.sh finds it through the venv's python)");
    } else {
      add("install: hooks", Verdict::kOk, "for torch " + joined(versions) + " in " + layout_->hook_dir);
    }
  }

  static std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }

  // Where the worker library for `mm` is: the launcher's rule (worker_launcher.cc): $KFORGE_WORKER_LIB_DIR,
  // else ../lib beside kforge-worker when it holds a worker library, else kforge-worker's directory.
  std::string worker_library(const std::string& mm) const {
    const std::string name = "libkforge_worker-torch" + mm + ".so";
    if (const char* d = std::getenv("KFORGE_WORKER_LIB_DIR"); d != nullptr && *d != '\0') return std::string(d) + "/" + name;
    const std::string dir = layout_->worker.substr(0, layout_->worker.rfind('/'));
    const std::string bundle_lib = dir.substr(0, dir.rfind('/')) + "/lib";
    struct stat st {};
    if (::stat((bundle_lib + "/" + name).c_str(), &st) == 0) return bundle_lib + "/" + name;
    return dir + "/" + name;
  }

  void check_python() {
    const std::string fix_python = "pass --python /path/to/python3 (one that imports torch), and give the daemon the same: "
                                   "workers.python in its configuration (kforged --worker-python), or KFORGE_PYTHON";
    const ChildRun r = run_child({python_, "-c", kTorchProbe}, {}, kPythonTimeoutMs);
    if (!r.started) {
      add("python", Verdict::kFail, "cannot run " + python_ + " (" + python_source_ + "): " + r.start_error, fix_python);
      return;
    }
    const std::optional<json> probe = probe_result(r.output);
    if (!probe) {
      add("python", Verdict::kFail, python_ + " " + describe_end(r) + ": " + last_line(r.output), fix_python);
      return;
    }
    const std::string exe = probe->value("executable", python_);
    if (probe->contains("torch_error")) {
      add("python", Verdict::kFail, exe + " cannot import torch: " + probe->value("torch_error", ""),
          "install torch into it (" + exe + " -m pip install torch), or " + fix_python);
      return;
    }
    const std::string torch = probe->value("torch", "");
    const std::string mm = probe->value("mm", "");
    add("python", Verdict::kOk, exe + " (" + python_source_ + "), torch " + torch);
    cupti_ = probe->contains("cupti") && (*probe)["cupti"].is_string() ? (*probe)["cupti"].get<std::string>() : "";
    python_ok_ = true;
    if (!layout_) return;
    const std::string hook = layout_->hook_for(mm);
    const std::string worker = worker_library(mm);
    struct stat st {};
    const bool have_hook = ::stat(hook.c_str(), &st) == 0;
    const bool have_worker = ::stat(worker.c_str(), &st) == 0;
    const std::vector<std::string> versions = layout_->hook_torch_versions();
    if (!have_hook) {
      add("torch hook", Verdict::kFail,
          "no hook for torch " + mm + " (" + hook + " is missing); this kforge has hooks for torch " +
              (versions.empty() ? std::string("(none)") : joined(versions)),
          "use a python whose torch is " + (versions.empty() ? std::string("one kforge was built for") : joined(versions)) +
              " (--python, workers.python), or build kforge against torch " + mm);
    }
    if (!have_worker) {
      add("worker", Verdict::kFail, "no worker library for torch " + mm + ": " + worker + " is missing",
          "build kforge against torch " + mm + " (the worker and the hook are built together), or use a python with the "
          "torch kforge was built for");
    }
    if (!have_hook && !have_worker) return;
    // The real thing: the shim preloaded into that python, as `kforge run` does, with no daemon
    // and nothing swapped (observe mode, no endpoint), then the worker library as the launcher loads it.
    const ChildRun h = run_child({python_, "-c", kHookProbe, hook, have_worker ? worker : ""},
                                 {"LD_PRELOAD=" + layout_->preload, "KFORGE_HOOK_DIR=" + layout_->hook_dir,
                                  "KFORGE_DAEMON_ENDPOINT=none", "KFORGE_MODE=observe"},
                                 kPythonTimeoutMs);
    const std::optional<json> loaded = probe_result(h.output);
    if (!loaded) {
      add(have_hook ? "torch hook" : "worker", Verdict::kFail,
          python_ + " with " + layout_->preload + " preloaded " + describe_end(h) + ": " + last_line(h.output),
          "run the same with KFORGE_LOG=1 to see what the hook says; rebuild kforge against torch " + torch);
      return;
    }
    if (have_hook) {
      if (loaded->value("hook_loaded", false)) {
        add("torch hook", Verdict::kOk, hook + " loads into torch " + torch + " through the preload shim");
      } else {
        add("torch hook", Verdict::kFail, "the preload shim did not load " + hook + " into torch " + torch + ": " + last_line(h.output),
            "check that " + layout_->preload + " and " + layout_->hook_dir + " come from the same kforge build");
      }
    }
    if (have_worker) {
      const std::string w = loaded->value("worker", "");
      if (w == "ok") {
        add("worker", Verdict::kOk, worker + " loads into torch " + torch);
      } else {
        add("worker", Verdict::kFail, worker + " does not load into torch " + torch + ": " + w,
            "rebuild kforge against this torch (scripts/build.sh), or use the python it was built with");
      }
    }
  }

  void check_cuda() {
    StatusOr<const CudaDriver*> drv = CudaDriver::load();
    if (!drv.ok()) {
      add("cuda", Verdict::kWarn, "no CUDA driver (" + drv.status().message() + "): CPU backend only",
          "nothing to do for CPU serving; for GPUs install the NVIDIA driver (libcuda.so.1)");
      return;
    }
    const CudaDriver& cu = **drv;
    const int v = cu.version();
    add("cuda", Verdict::kOk,
        "driver " + std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10) + " from " + cu.library_path());
    int count = 0;
    if (cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      add("gpu", Verdict::kWarn, "the CUDA driver shows no GPU (CUDA_VISIBLE_DEVICES?): CPU backend only",
          "nothing to do for CPU serving; check nvidia-smi and CUDA_VISIBLE_DEVICES for GPUs");
      return;
    }
    for (int i = 0; i < count; ++i) {
      CUdevice dev;
      if (cu.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
      char name[256] = {};
      int major = 0, minor = 0;
      (void)cu.cuDeviceGetName(name, sizeof name, dev);
      (void)cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
      (void)cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
      add("gpu " + std::to_string(i), Verdict::kOk, std::string(name) + " (sm_" + std::to_string(major) + std::to_string(minor) + ")");
    }
    // With a GPU, NVRTC is required: a CUDA worker compiles every candidate with it.
    StatusOr<const Nvrtc*> nv = Nvrtc::load();
    if (!nv.ok()) {
      add("nvrtc", Verdict::kFail, "cannot load NVRTC: " + nv.status().message(),
          "install the CUDA toolkit's NVRTC (libnvrtc.so) or pip install nvidia-cuda-nvrtc; REFERENCE.md, "
          "\"GPU hosts\", gives the search order");
    } else {
      add("nvrtc", Verdict::kOk,
          std::to_string((*nv)->version().major) + "." + std::to_string((*nv)->version().minor) + " from " +
              (*nv)->library_path() + ((*nv)->emits_cubin() ? "" : " (PTX only)"));
    }
    if (!python_ok_) return;   // CUPTI is looked for in the torch process; the python line says why there is none
    if (cupti_.empty()) {
      add("cupti", Verdict::kWarn, "no libcupti in the torch process or on the loader's path: GPU timings use CUDA events",
          "pip install nvidia-cuda-cupti (or add CUDA's extras/CUPTI/lib64 to LD_LIBRARY_PATH) for kernel-only timings");
    } else {
      add("cupti", Verdict::kOk, cupti_ + " (the worker times kernels with it)");
    }
  }

  void check_cache_dir() {
    StatusOr<CacheDir::Resolved> r = CacheDir::resolve_path(process_env());
    if (!r.ok()) {
      add("cache dir", Verdict::kFail, r.status().message(), "pass --cache-dir DIR or set KFORGE_CACHE_DIR to an absolute path");
      return;
    }
    const std::string& p = r->path;
    cache_dir_ = p;
    const std::string from = " (from " + r->source + ")";
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno != ENOENT) {
        add("cache dir", Verdict::kFail, "cannot stat " + p + from + ": " + std::strerror(errno), "check the permissions of its parents");
        return;
      }
      // Not there yet: the first kforge process creates it, if the nearest existing parent lets it.
      std::string parent = p;
      while (parent.size() > 1) {
        parent = parent.substr(0, std::max<size_t>(parent.rfind('/'), 1));
        if (::stat(parent.c_str(), &st) == 0) break;
      }
      if (::access(parent.c_str(), W_OK | X_OK) == 0) {
        add("cache dir", Verdict::kOk, p + from + " does not exist yet; it will be created (0700) in " + parent);
      } else {
        add("cache dir", Verdict::kFail, p + from + " does not exist and " + parent + " is not writable",
            "mkdir -p -m 700 " + p + " as a user who may, or pass --cache-dir DIR / set KFORGE_CACHE_DIR elsewhere");
      }
      return;
    }
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    if (S_ISLNK(st.st_mode)) {
      add("cache dir", Verdict::kFail, p + from + " is a symbolic link: kforge refuses to load code through one",
          "rm " + p + " (the link only) and let kforge create the directory, or pass --cache-dir with the real directory");
      return;
    }
    if (!S_ISDIR(st.st_mode)) {
      add("cache dir", Verdict::kFail, p + from + " is not a directory", "move it away, or pass --cache-dir DIR");
      return;
    }
    if (st.st_uid != ::geteuid()) {
      add("cache dir", Verdict::kFail,
          p + from + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(::geteuid()) + ")",
          "use a cache directory of your own: --cache-dir DIR or KFORGE_CACHE_DIR (kernels in it run inside your processes)");
      return;
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      add("cache dir", Verdict::kFail,
          p + from + " is writable by group or others (mode " + mode + "): anyone who can write there could plant kernels",
          "chmod 700 " + p);
      return;
    }
    // The library's own verdict (the same rules the hook applies), now that the directory exists.
    if (StatusOr<CacheDir> opened = CacheDir::open(p); !opened.ok()) {
      add("cache dir", Verdict::kFail, opened.status().message(), "chmod 700 " + p + ", or pass --cache-dir DIR");
      return;
    }
    std::string tmpl = p + "/.kforge-doctor-XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) {
      add("cache dir", Verdict::kFail, "cannot create a file in " + p + from + ": " + std::strerror(errno),
          "check the file system (read-only? full?) and that " + p + " is writable by you (chmod 700 " + p + ")");
      return;
    }
    ::close(fd);
    ::unlink(tmpl.c_str());
    struct statvfs fs {};
    uint64_t free_bytes = 0;
    if (::statvfs(p.c_str(), &fs) == 0) free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    const std::string detail = p + from + ", mode " + mode + ", writable, " + human_bytes(free_bytes) + " free";
    if (free_bytes < kLowFreeBytes) {
      add("cache dir", Verdict::kWarn, detail, "free space on that file system, or move the cache: --cache-dir DIR");
    } else if ((st.st_mode & 077) != 0) {
      add("cache dir", Verdict::kWarn, detail + " (others may read the kernels and their signatures)", "chmod 700 " + p);
    } else {
      add("cache dir", Verdict::kOk, detail);
    }
  }

  void check_daemon() {
    std::string endpoint = endpoint_;
    if (endpoint == "none") {
      add("daemon", Verdict::kWarn, "the daemon endpoint is \"none\" (KFORGE_DAEMON_ENDPOINT): hooks report to no daemon, nothing is searched",
          "unset KFORGE_DAEMON_ENDPOINT (or set it to the daemon's endpoint) where programs should be searched for");
      return;
    }
    if (endpoint.empty()) {
      const char* xdg = std::getenv("XDG_RUNTIME_DIR");
      endpoint = default_daemon_endpoint(xdg != nullptr ? xdg : "", static_cast<unsigned>(::getuid()));
    }
    const std::string start_fix = "start it with `kforged` (or let `kforge run` start one)";
    StatusOr<std::string> key = client_server_key(endpoint, getenv_or("KFORGE_DAEMON_SERVER_KEY", ""), "KFORGE_DAEMON_SERVER_KEY");
    if (!key.ok()) {
      add("daemon", Verdict::kFail, endpoint + ": " + key.status().message(),
          "set KFORGE_DAEMON_SERVER_KEY to the daemon's CURVE public key (kforged --curve-keygen prints it)");
      return;
    }
    // An ipc:// socket's directory that does not exist holds no daemon; secure_ipc_directory would
    // create it, and the doctor changes nothing.
    if (endpoint.rfind("ipc://", 0) == 0) {
      const std::string socket = endpoint.substr(6);
      const std::string dir = socket.substr(0, socket.rfind('/'));
      struct stat st {};
      if (!dir.empty() && ::lstat(dir.c_str(), &st) != 0 && errno == ENOENT) {
        add("daemon", Verdict::kWarn, "no kforged at " + endpoint + " (" + dir + " does not exist): kernels are served from the cache, nothing is searched",
            start_fix);
        return;
      }
    }
    if (Status s = secure_ipc_directory(endpoint); !s.ok()) {
      add("daemon", Verdict::kFail, s.message(), "fix the socket directory as the message says, or pick another endpoint");
      return;
    }
    std::string why;
    const std::optional<std::string> reply = transport::request_reply(
        endpoint, *key, control::encode_request(control::ControlRequest{control::Request::kStatus, 0}), kDaemonTimeoutMs, why);
    if (!reply) {
      add("daemon", Verdict::kWarn, "no kforged answers at " + endpoint + " (" + why + "): kernels are served from the cache, nothing is searched",
          start_fix);
      return;
    }
    StatusOr<std::string> doc = control::decode_status_reply(*reply);
    const json st = doc.ok() ? json::parse(*doc, nullptr, false) : json();
    if (!doc.ok() || !st.is_object() || !st.contains("daemon") || !st["daemon"].is_object()) {
      add("daemon", Verdict::kFail,
          "the daemon at " + endpoint + " answered, but not with a status: " + (doc.ok() ? std::string("not a status document") : doc.status().message()),
          "restart it with this kforge's kforged (" + (layout_ ? layout_->kforged : std::string("kforged")) + ")");
      return;
    }
    const json& d = st["daemon"];
    const std::string version = d.value("version", "?");
    const std::string pid = std::to_string(d.value("pid", 0));
    if (version != KFORGE_VERSION_STRING) {
      add("daemon", Verdict::kFail,
          "kforged " + version + " (pid " + pid + ") answers at " + endpoint + ", but this kforge is " + KFORGE_VERSION_STRING,
          "stop it (kill " + pid + ") and start this kforge's kforged" + (layout_ ? " (" + layout_->kforged + ")" : std::string()));
      return;
    }
    add("daemon", Verdict::kOk, "kforged " + version + " (pid " + pid + ") answers at " + endpoint);
    const std::string daemon_cache = d.value("cache_dir", "");
    if (cache_dir_.empty()) return;
    std::error_code ec;
    const bool same = !daemon_cache.empty() && (daemon_cache == cache_dir_ || std::filesystem::equivalent(daemon_cache, cache_dir_, ec));
    if (same) {
      add("daemon cache", Verdict::kOk, "the daemon publishes into " + daemon_cache + ", the hook's cache directory");
    } else {
      add("daemon cache", Verdict::kFail,
          "the daemon publishes into " + (daemon_cache.empty() ? std::string("(none)") : daemon_cache) +
              ", but the hook would load from " + cache_dir_ + ": no kernel it finds would be used",
          "restart kforged with --cache-dir " + cache_dir_ + " (or run both with the same KFORGE_CACHE_DIR)");
    }
  }

  std::string python_;
  std::string python_source_;
  std::string endpoint_;
  std::optional<InstallLayout> layout_;
  bool python_ok_ = false;
  std::string cupti_;
  std::string cache_dir_;
  std::vector<Check> checks_;
};

const char* verdict_text(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kWarn: return "warn";
    case Verdict::kFail: return "FAIL";
  }
  return "?";
}

const char* verdict_json(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kWarn: return "warn";
    case Verdict::kFail: return "fail";
  }
  return "?";
}

constexpr const char* kDoctorUsage = "usage: kforge [--cache-dir DIR] doctor [--json] [--python P] [--endpoint E]";

}  // namespace

int run_doctor_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  bool as_json = false;
  std::string python, endpoint;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--json") {
      as_json = true;
    } else if ((args[i] == "--python" || args[i] == "--endpoint") && i + 1 < args.size() && !args[i + 1].empty()) {
      (args[i] == "--python" ? python : endpoint) = args[i + 1];
      ++i;
    } else if (args[i] == "--help" || args[i] == "-h") {
      out << kDoctorUsage << "\n";
      return 0;
    } else {
      err << "kforge doctor: " << (args[i] == "--python" || args[i] == "--endpoint" ? args[i] + " needs a value" : "unknown option '" + args[i] + "'")
          << "\n" << kDoctorUsage << "\n";
      return 2;
    }
  }
  // The workers' own default: workers.python, else KFORGE_PYTHON, else python3 on PATH.
  std::string source = "--python";
  if (python.empty()) {
    python = getenv_or("KFORGE_PYTHON", "");
    source = "KFORGE_PYTHON";
  }
  if (python.empty()) {
    python = "python3";
    source = "python3 on PATH, the workers' default";
  }
  if (endpoint.empty()) endpoint = getenv_or("KFORGE_DAEMON_ENDPOINT", "");

  Doctor doctor(python, source, endpoint);
  const std::vector<Check> checks = doctor.run();
  bool failed = false;
  for (const Check& c : checks) failed = failed || c.verdict == Verdict::kFail;
  if (as_json) {
    json a = json::array();
    for (const Check& c : checks) {
      a.push_back(json{{"check", c.name}, {"status", verdict_json(c.verdict)}, {"detail", c.detail}, {"fix", c.fix}});
    }
    out << a.dump(2) << "\n";
  } else {
    for (const Check& c : checks) {
      char head[8];
      std::snprintf(head, sizeof head, "%-5s ", verdict_text(c.verdict));
      out << head << c.name << ": " << c.detail << "\n";
      if (c.verdict != Verdict::kOk && !c.fix.empty()) out << "      fix: " << c.fix << "\n";
    }
    out << (failed ? "kforge doctor: something FAILed; the fix lines say what to do\n" : "kforge doctor: nothing failed\n");
  }
  return failed ? 1 : 0;
}

}  // namespace kforge
