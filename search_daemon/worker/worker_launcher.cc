// kforge-worker: starts the evaluation worker inside a python3 that has imported torch.
//
// The worker's verification calls PyTorch's own kernels, so it must run against exactly the torch
// the serving processes use. Like the preload shim with the hook, this launcher does not link
// torch: it execs `$KFORGE_PYTHON` (else python3), which imports torch and loads
// libkforge_worker-torch<major>.<minor>.so for that torch from the library directory
// ($KFORGE_WORKER_LIB_DIR, else ../lib beside this program, else this program's directory), then
// calls its kforge_worker_main with the arguments given here. With no torch, or no worker built for
// that torch, it prints one line and exits with status 3. With $KFORGE_WORKER_CPUS ("0,1": the
// cores the pool gave this CPU worker, Note [Pinned CPU workers] in evaluator_pool.h) it pins
// itself to them first, so python, torch's thread pool and every compiler it starts stay there.
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

constexpr const char* kBootstrap = R"py(
import ctypes, os, sys
libdir = sys.argv[1]
try:
    import torch
except Exception as e:
    sys.stderr.write("kforge-worker: cannot import torch in %s: %s\n" % (sys.executable, e))
    sys.exit(3)
mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
path = os.path.join(libdir, "libkforge_worker-torch%s.so" % mm)
if not os.path.exists(path):
    sys.stderr.write("kforge-worker: no worker for torch %s: %s does not exist\n" % (torch.__version__, path))
    sys.exit(3)
lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
args = [a.encode() for a in ["kforge-worker", "--torch-version", torch.__version__] + sys.argv[2:]]
argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
lib.kforge_worker_main.restype = ctypes.c_int
rc = lib.kforge_worker_main(len(args), argv)
sys.stdout.flush()
sys.stderr.flush()
os._exit(rc)
)py";

bool has_worker_library(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("libkforge_worker-torch", 0) == 0) return true;
  }
  return false;
}

std::string library_dir() {
  if (const char* d = std::getenv("KFORGE_WORKER_LIB_DIR"); d != nullptr && *d != '\0') return d;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  const std::filesystem::path bundle_lib = self.parent_path().parent_path() / "lib";
  if (has_worker_library(bundle_lib)) return bundle_lib.string();
  return self.parent_path().string();
}

}  // namespace

// Pins this process to the comma-separated cores in `list`; false (with `why`) for a malformed
// list or a refusal.
bool pin_to(const char* list, std::string& why) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string item;
  const std::string text = list;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ',') {
      item += text[i];
      continue;
    }
    char* end = nullptr;
    const long c = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || end == nullptr || *end != '\0' || c < 0 || c >= CPU_SETSIZE) {
      why = "KFORGE_WORKER_CPUS='" + text + "' is not a list of core numbers";
      return false;
    }
    CPU_SET(static_cast<int>(c), &set);
    item.clear();
  }
  if (::sched_setaffinity(0, sizeof set, &set) != 0) {
    why = "cannot pin to cores " + text + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

int main(int argc, char** argv) {
  if (const char* cpus = std::getenv("KFORGE_WORKER_CPUS"); cpus != nullptr && *cpus != '\0') {
    std::string why;
    if (!pin_to(cpus, why)) {
      std::fprintf(stderr, "kforge-worker: %s\n", why.c_str());
      return 3;
    }
  }
  const char* python = std::getenv("KFORGE_PYTHON");
  if (python == nullptr || *python == '\0') python = "python3";
  const std::string libdir = library_dir();
  std::vector<std::string> args = {python, "-c", kBootstrap, libdir};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  ::execvp(python, cargv.data());
  std::fprintf(stderr, "kforge-worker: cannot run %s: %s (set KFORGE_PYTHON to a python3 with torch)\n", python,
               std::strerror(errno));
  return 3;
}
