#include "tools/cli.h"

#include <nlohmann/json.hpp>

#include <string_view>

#include "cache/cache_dir.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_selftest.h"
#include "runtime/environment.h"
#include "runtime/nvrtc.h"
#include "runtime/version.h"
#include "runtime/wire.h"
#include "tools/cache_commands.h"
#include "tools/demo_command.h"
#include "tools/doctor_command.h"
#include "tools/ops_command.h"
#include "tools/run_command.h"
#include "tools/status_command.h"
#include "tools/warm_command.h"

namespace kforge {

namespace {

using json = nlohmann::ordered_json;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnavailable = 3;

constexpr std::string_view kUsage =
    "usage: kforge [--cache-dir DIR] <command> [options]\n"
    "\n"
    "commands:\n"
    "  run [options] -- CMD ARGS...  run a program under kforge: start or attach the host's\n"
    "                                daemon, preload the hook, swap in verified faster kernels,\n"
    "                                print a summary ('kforge run --help')\n"
    "  doctor [--json] [--python P] [--endpoint E]  check this host: install, python and torch,\n"
    "                                hooks, CUDA, cache directory, daemon (exit 1: a check failed)\n"
    "  warm [options] -- CMD ARGS... staging: run CMD under kforge until the search budget is\n"
    "                                spent; report and chart; the cache is ready to export\n"
    "  demo [--device cpu|cuda]      a small model run under kforge: kernels found and swapped in,\n"
    "                                step time before/after in one process, outputs checked\n"
    "  cache <subcommand>            inspect and manage the kernel cache ('kforge cache help')\n"
    "  status [--json] [--limit N] [--endpoint E]  what the running kforged does: processes,\n"
    "                                signatures (the 50 largest shares; --limit N), searches,\n"
    "                                budgets, best speedups (exit 3: no daemon, 4: busy);\n"
    "                                a tcp:// endpoint needs --server-key K (the daemon's\n"
    "                                CURVE public key; or KFORGE_DAEMON_SERVER_KEY)\n"
    "  ops [--json]                  the operator catalog: per operator its backends, the hook's\n"
    "                                interceptor, template families, LLM semantics, variants\n"
    "  --version, version [--json]   print the kforge version and format versions\n"
    "  env [--json]                  what kforge sees on this host: CPU, CUDA driver, GPUs,\n"
    "                                NVRTC, cache directory\n"
    "  selftest cuda                 compile a kernel with NVRTC, launch it through the CUDA\n"
    "                                driver API on GPU 0, check every element (exit 3: no GPU)\n"
    "  help                          this text\n";

int usage_error(std::ostream& err, const std::string& what) {
  err << "kforge: " << what << "\n\n" << kUsage;
  return kExitUsage;
}

// Parses the flags of commands that only take --json.
bool parse_json_flag(const std::vector<std::string>& argv, size_t first, std::ostream& err, bool* as_json,
                     int* rc) {
  *as_json = false;
  for (size_t i = first; i < argv.size(); ++i) {
    if (argv[i] == "--json") {
      *as_json = true;
    } else {
      *rc = usage_error(err, "unknown option '" + argv[i] + "' for '" + argv[first - 1] + "'");
      return false;
    }
  }
  return true;
}

int cmd_version(bool as_json, std::ostream& out) {
  if (as_json) {
    json j{{"kforge_version", KFORGE_VERSION_STRING},
           {"wire_version", wire::kWireVersion},
           {"format_version", kFormatVersion}};
    out << j.dump(2) << "\n";
  } else {
    out << "kforge " << KFORGE_VERSION_STRING << " (wire protocol " << wire::kWireVersion << ", format "
        << kFormatVersion << ")\n";
  }
  return kExitOk;
}

json environment_json(const Environment& e) {
  return json{{"backend", std::string(backend_name(e.backend))},
              {"arch", e.arch},
              {"device_model", e.device_model},
              {"driver_version", e.driver_version},
              {"nvrtc_version", e.nvrtc_version},
              {"compiler", e.compiler},
              {"torch_version", e.torch_version},
              {"format_version", e.format_version},
              {"key", e.key().hex()}};
}

json cuda_json() {
  json j;
  auto drv = CudaDriver::load();
  if (!drv.ok()) {
    j["available"] = false;
    j["error"] = drv.status().message();
    return j;
  }
  const CudaDriver& cu = **drv;
  j["available"] = true;
  j["library"] = cu.library_path();
  j["driver_version"] = cu.version();
  json devices = json::array();
  int count = 0;
  if (cu.cuDeviceGetCount(&count) == CUDA_SUCCESS) {
    for (int i = 0; i < count; ++i) {
      CUdevice dev;
      if (cu.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
      char name[256] = {};
      int major = 0, minor = 0;
      (void)cu.cuDeviceGetName(name, sizeof name, dev);
      (void)cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
      (void)cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
      devices.push_back(json{{"index", i}, {"name", name},
                             {"arch", "sm_" + std::to_string(major) + std::to_string(minor)}});
    }
  }
  j["devices"] = devices;
  return j;
}

json nvrtc_json() {
  json j;
  auto nv = Nvrtc::load();
  if (!nv.ok()) {
    j["available"] = false;
    j["error"] = nv.status().message();
    return j;
  }
  j["available"] = true;
  j["library"] = (*nv)->library_path();
  j["version"] = std::to_string((*nv)->version().major) + "." + std::to_string((*nv)->version().minor);
  j["emits_cubin"] = (*nv)->emits_cubin();
  return j;
}

json cache_json() {
  json j;
  auto resolved = CacheDir::resolve_path(process_env());
  if (!resolved.ok()) {
    j["usable"] = false;
    j["error"] = resolved.status().message();
    return j;
  }
  j["path"] = resolved->path;
  j["source"] = resolved->source;
  if (!resolved->warning.empty()) j["warning"] = resolved->warning;
  auto opened = CacheDir::open(resolved->path);
  j["usable"] = opened.ok();
  if (!opened.ok()) j["error"] = opened.status().message();
  return j;
}

int cmd_env(bool as_json, std::ostream& out) {
  json j{{"kforge_version", KFORGE_VERSION_STRING},
         {"cpu_environment", environment_json(cpu_host_environment(""))},
         {"cuda_driver", cuda_json()},
         {"nvrtc", nvrtc_json()},
         {"cache_dir", cache_json()}};
  if (as_json) {
    out << j.dump(2) << "\n";
    return kExitOk;
  }
  const json& cpu = j["cpu_environment"];
  out << "kforge " << KFORGE_VERSION_STRING << "\n";
  out << "cpu:         " << cpu["arch"].get<std::string>();
  if (!cpu["device_model"].get<std::string>().empty()) out << " (" << cpu["device_model"].get<std::string>() << ")";
  out << "\n";
  const json& cu = j["cuda_driver"];
  if (cu["available"].get<bool>()) {
    int v = cu["driver_version"].get<int>();
    out << "cuda driver: " << v / 1000 << "." << (v % 1000) / 10 << " from " << cu["library"].get<std::string>()
        << "\n";
    for (const json& d : cu["devices"]) {
      out << "  gpu " << d["index"].get<int>() << ":     " << d["name"].get<std::string>() << " ("
          << d["arch"].get<std::string>() << ")\n";
    }
  } else {
    out << "cuda driver: unavailable: " << cu["error"].get<std::string>() << "\n";
  }
  const json& nv = j["nvrtc"];
  if (nv["available"].get<bool>()) {
    out << "nvrtc:       " << nv["version"].get<std::string>() << " from " << nv["library"].get<std::string>()
        << (nv["emits_cubin"].get<bool>() ? "" : " (PTX only)") << "\n";
  } else {
    out << "nvrtc:       unavailable: " << nv["error"].get<std::string>() << "\n";
  }
  const json& c = j["cache_dir"];
  if (c.contains("path")) {
    out << "cache:       " << c["path"].get<std::string>() << " (from " << c["source"].get<std::string>() << ")";
  } else {
    out << "cache:       none";
  }
  if (!c["usable"].get<bool>()) out << ": " << c["error"].get<std::string>();
  out << "\n";
  return kExitOk;
}

int cmd_selftest(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  if (argv.size() != 3 || argv[2] != "cuda") {
    return usage_error(err, argv.size() < 3 ? "selftest needs a backend: 'selftest cuda'"
                                            : "unknown selftest '" + argv[2] + "' (expected 'cuda')");
  }
  std::string report;
  Status s = run_cuda_selftest(&report);
  if (!report.empty()) out << report << (report.back() == '\n' ? "" : "\n");
  if (s.ok()) {
    out << "selftest cuda: PASS\n";
    return kExitOk;
  }
  err << "selftest cuda: " << (s.code() == StatusCode::kUnavailable ? "UNAVAILABLE: " : "FAIL: ") << s.message()
      << "\n";
  return s.code() == StatusCode::kUnavailable ? kExitUnavailable : kExitFailed;
}

}  // namespace

int run_cli(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  // The CLI is a separate process, but keep the same discipline: report, never crash.
  try {
    // Global options come before the command.
    std::string cache_dir;
    std::vector<std::string> args{argv.empty() ? std::string("kforge") : argv[0]};
    size_t i = 1;
    for (; i < argv.size() && argv[i].rfind("--cache-dir", 0) == 0; ++i) {
      if (argv[i] == "--cache-dir") {
        if (i + 1 >= argv.size()) return usage_error(err, "--cache-dir needs a directory");
        cache_dir = argv[++i];
      } else if (argv[i].rfind("--cache-dir=", 0) == 0) {
        cache_dir = argv[i].substr(12);
      } else {
        break;
      }
    }
    args.insert(args.end(), argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
    if (args.size() < 2) return usage_error(err, "no command given");
    const std::string& cmd = args[1];
    bool as_json = false;
    int rc = kExitOk;
    if (cmd == "--version" || cmd == "version") {
      if (!parse_json_flag(args, 2, err, &as_json, &rc)) return rc;
      return cmd_version(as_json, out);
    }
    if (cmd == "env") {
      if (!parse_json_flag(args, 2, err, &as_json, &rc)) return rc;
      return cmd_env(as_json, out);
    }
    if (cmd == "selftest") return cmd_selftest(args, out, err);
    if (cmd == "status") return run_status_command(std::vector<std::string>(args.begin() + 2, args.end()), out, err);
    if (cmd == "ops") return run_ops_command(std::vector<std::string>(args.begin() + 2, args.end()), out, err);
    if (cmd == "doctor") {
      // doctor_command.h: the global --cache-dir reaches it as the hook would see it.
      if (!cache_dir.empty()) ::setenv("KFORGE_CACHE_DIR", cache_dir.c_str(), 1);
      return run_doctor_command(std::vector<std::string>(args.begin() + 2, args.end()), out, err);
    }
    if (cmd == "warm") return run_warm_command(std::vector<std::string>(args.begin() + 2, args.end()), cache_dir, out, err);
    if (cmd == "demo") return run_demo_command(std::vector<std::string>(args.begin() + 2, args.end()), out, err);
    if (cmd == "run") return run_run_command(std::vector<std::string>(args.begin() + 2, args.end()), cache_dir, out, err);
    if (cmd == "cache") {
      return run_cache_command(std::vector<std::string>(args.begin() + 2, args.end()), cache_dir, out, err);
    }
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      out << kUsage;
      return kExitOk;
    }
    return usage_error(err, "unknown command '" + cmd + "'");
  } catch (const std::exception& e) {
    err << "kforge: internal error: " << e.what() << "\n";
    return kExitFailed;
  }
}

}  // namespace kforge
