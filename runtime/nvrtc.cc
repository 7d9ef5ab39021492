#include "runtime/nvrtc.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <utility>

#include "runtime/shared_library.h"

namespace kforge {
namespace {

// Newest first: a process that has both prefers the compiler that matches a newer driver.
constexpr const char* kSonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};

struct Candidate {
  std::string path;
  bool only_if_loaded = false;  // RTLD_NOLOAD: use it only if the process already has it
};

// PyTorch's wheels ship NVRTC in sibling NVIDIA wheels and load it through RUNPATH entries of
// their own libraries, so neither the loader's default path nor CUDA_HOME finds it. Torch lives at
// <site-packages>/torch/lib/; the NVIDIA wheels at <site-packages>/nvidia/.
std::string torch_site_packages() {
  for (const char* lib : {"libtorch_cuda.so", "libtorch.so"}) {
    void* handle = dlopen(lib, RTLD_NOLOAD | RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) continue;
    const std::string path = loaded_library_path(handle, "");
    // Only drops the reference RTLD_NOLOAD just took; torch keeps its own.
    dlclose(handle);
    if (path.empty() || path.front() != '/') continue;
    // lexically_normal: the loader may report ".../torch/lib/../lib/libtorch_cuda.so".
    return std::filesystem::path(path)
        .lexically_normal()
        .parent_path()
        .parent_path()
        .parent_path()
        .string();
  }
  return {};
}

std::vector<Candidate> search_candidates() {
  // An explicit override is the only candidate, as for KFORGE_LIBCUDA.
  if (const char* env = std::getenv("KFORGE_LIBNVRTC"); env != nullptr && env[0] != '\0') {
    return {Candidate{env, false}};
  }
  std::vector<Candidate> out;
  auto add = [&out](std::string path, bool only_if_loaded) {
    for (const Candidate& c : out) {
      if (c.path == path && c.only_if_loaded == only_if_loaded) return;
    }
    out.push_back(Candidate{std::move(path), only_if_loaded});
  };
  for (const char* name : kSonames) add(name, true);
  for (const char* name : kSonames) add(name, false);
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && home[0] != '\0') {
    for (const char* name : kSonames) add(std::string(home) + "/lib64/" + name, false);
  }
  for (const char* name : kSonames) add(std::string("/usr/local/cuda/lib64/") + name, false);
  if (const std::string site = torch_site_packages(); !site.empty()) {
    add(site + "/nvidia/cu13/lib/libnvrtc.so.13", false);
    add(site + "/nvidia/cuda_nvrtc/lib/libnvrtc.so.12", false);
  }
  return out;
}

template <typename Fn>
void assign_entry_point(Fn& member, void* address) {
  member = reinterpret_cast<Fn>(address);
}

// nvrtcDestroyProgram on every path out of compile().
class Program {
 public:
  Program(const Nvrtc& nvrtc, nvrtcProgram program) : nvrtc_(nvrtc), program_(program) {}
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  ~Program() { (void)nvrtc_.nvrtcDestroyProgram(&program_); }
  nvrtcProgram get() const { return program_; }

 private:
  const Nvrtc& nvrtc_;
  nvrtcProgram program_;
};

bool sets_architecture(std::string_view option) {
  for (std::string_view prefix : {"--gpu-architecture", "-arch", "--gpu-name"}) {
    if (option.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

}  // namespace

std::string_view image_kind_name(ImageKind kind) noexcept {
  switch (kind) {
    case ImageKind::kCubin: return "cubin";
    case ImageKind::kPtx: return "ptx";
  }
  return "unknown";
}

std::vector<std::string> Nvrtc::search_paths() {
  std::vector<std::string> out;
  for (const Candidate& c : search_candidates()) {
    out.push_back(c.only_if_loaded ? "already loaded: " + c.path : c.path);
  }
  return out;
}

StatusOr<const Nvrtc*> Nvrtc::load() {
  // Leaked on purpose, like CudaDriver::load(): compiled images and callers may use it until exit.
  static const StatusOr<const Nvrtc*>* const loaded = [] {
    StatusOr<std::unique_ptr<Nvrtc>> nvrtc = load_uncached();
    if (!nvrtc.ok()) return new StatusOr<const Nvrtc*>(nvrtc.status());
    return new StatusOr<const Nvrtc*>(nvrtc->release());
  }();
  return *loaded;
}

StatusOr<std::unique_ptr<Nvrtc>> Nvrtc::load_uncached() {
  const char* env = std::getenv("KFORGE_LIBNVRTC");
  const bool from_env = env != nullptr && env[0] != '\0';
  std::string tried;
  for (const Candidate& c : search_candidates()) {
    void* handle =
        dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL | (c.only_if_loaded ? RTLD_NOLOAD : 0));
    if (handle != nullptr) {
      StatusOr<std::unique_ptr<Nvrtc>> nvrtc = from_handle(handle, c.path);
      // A library that opens but is unusable (too old) does not end the search: another copy
      // further down the list may be fine.
      if (nvrtc.ok()) return nvrtc;
      if (!tried.empty()) tried += "; ";
      tried += nvrtc.status().message();
      continue;
    }
    if (c.only_if_loaded) {
      (void)dlerror();  // "not loaded" is expected and says nothing worth reporting
      continue;
    }
    if (!tried.empty()) tried += "; ";
    tried += dl_failure(c.path);
  }
  return unavailable(std::string("no NVRTC found") +
                     (from_env ? " (from KFORGE_LIBNVRTC)" : ": none already loaded") + "; tried " +
                     tried);
}

StatusOr<std::unique_ptr<Nvrtc>> Nvrtc::load_from(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return unavailable("no NVRTC found; tried " + dl_failure(path));
  }
  return from_handle(handle, path);
}

StatusOr<std::unique_ptr<Nvrtc>> Nvrtc::from_handle(void* handle, const std::string& path) {
  std::unique_ptr<Nvrtc> nvrtc(new Nvrtc());
  nvrtc->handle_ = handle;
  nvrtc->library_path_ = loaded_library_path(handle, path);
  std::string missing;
#define KFORGE_NVRTC_RESOLVE_REQUIRED(name)           \
  if (void* p = dlsym(handle, #name); p != nullptr) { \
    assign_entry_point(nvrtc->name, p);               \
  } else {                                            \
    missing += missing.empty() ? "" : ", ";           \
    missing += #name;                                 \
  }
#define KFORGE_NVRTC_RESOLVE_OPTIONAL(name)           \
  if (void* p = dlsym(handle, #name); p != nullptr) { \
    assign_entry_point(nvrtc->name, p);               \
  }
  KFORGE_NVRTC_REQUIRED(KFORGE_NVRTC_RESOLVE_REQUIRED)
  KFORGE_NVRTC_OPTIONAL(KFORGE_NVRTC_RESOLVE_OPTIONAL)
#undef KFORGE_NVRTC_RESOLVE_REQUIRED
#undef KFORGE_NVRTC_RESOLVE_OPTIONAL
  if (!missing.empty()) {
    return unavailable("NVRTC at " + nvrtc->library_path_ + " lacks " + missing);
  }
  if (nvrtc->nvrtcVersion(&nvrtc->version_.major, &nvrtc->version_.minor) != NVRTC_SUCCESS) {
    return unavailable("NVRTC at " + nvrtc->library_path_ + " does not report its version");
  }
  return nvrtc;
}

StatusOr<CompiledKernel> Nvrtc::compile(std::string_view source, std::string_view name,
                                        std::span<const std::string> options, int sm_major,
                                        int sm_minor) const {
  if (sm_major <= 0 || sm_minor < 0 || sm_minor > 9) {
    return invalid_argument("nvrtc compile of " + std::string(name) + ": bad compute capability " +
                            std::to_string(sm_major) + "." + std::to_string(sm_minor));
  }
  for (const std::string& option : options) {
    if (sets_architecture(option)) {
      return invalid_argument(
          "nvrtc compile of " + std::string(name) + ": option '" + option +
          "' sets the architecture, which compile() chooses from sm_major/minor");
    }
  }
  CompiledKernel out;
  out.kind = emits_cubin() ? ImageKind::kCubin : ImageKind::kPtx;
  out.arch = (out.kind == ImageKind::kCubin ? "sm_" : "compute_") +
             std::to_string(sm_major * 10 + sm_minor);
  const std::string arch_option = "--gpu-architecture=" + out.arch;

  std::vector<const char*> argv;
  argv.reserve(options.size() + 1);
  argv.push_back(arch_option.c_str());
  for (const std::string& option : options) argv.push_back(option.c_str());

  auto nvrtc_error = [&](nvrtcResult r, std::string_view what) {
    std::string message = "nvrtc " + std::string(what) + " for " + std::string(name) + " (" +
                          out.arch + ") failed: " + nvrtcGetErrorString(r);
    return r == NVRTC_ERROR_OUT_OF_MEMORY ? unavailable(std::move(message))
                                          : internal_error(std::move(message));
  };

  // NVRTC reads the source as a NUL-terminated string.
  const std::string source_text(source);
  const std::string program_name(name);
  nvrtcProgram raw = nullptr;
  if (nvrtcResult r =
          nvrtcCreateProgram(&raw, source_text.c_str(), program_name.c_str(), 0, nullptr, nullptr);
      r != NVRTC_SUCCESS) {
    return nvrtc_error(r, "nvrtcCreateProgram");
  }
  Program program(*this, raw);

  const nvrtcResult compiled =
      nvrtcCompileProgram(program.get(), static_cast<int>(argv.size()), argv.data());
  std::size_t log_size = 0;
  if (nvrtcGetProgramLogSize(program.get(), &log_size) == NVRTC_SUCCESS && log_size > 1) {
    out.log.resize(log_size);
    if (nvrtcGetProgramLog(program.get(), out.log.data()) != NVRTC_SUCCESS) out.log.clear();
    while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n'))
      out.log.pop_back();
  }
  if (compiled == NVRTC_ERROR_COMPILATION || compiled == NVRTC_ERROR_INVALID_OPTION) {
    // A candidate that does not compile is an ordinary search result; the log is what a proposer
    // needs to repair it, so it goes into the message whole.
    return invalid_argument("nvrtc could not compile " + program_name + " for " + out.arch + " (" +
                            nvrtcGetErrorString(compiled) + "):\n" + out.log);
  }
  if (compiled != NVRTC_SUCCESS) return nvrtc_error(compiled, "nvrtcCompileProgram");

  std::size_t image_size = 0;
  if (out.kind == ImageKind::kCubin) {
    if (nvrtcResult r = nvrtcGetCUBINSize(program.get(), &image_size); r != NVRTC_SUCCESS) {
      return nvrtc_error(r, "nvrtcGetCUBINSize");
    }
    out.image.resize(image_size);
    if (nvrtcResult r = nvrtcGetCUBIN(program.get(), reinterpret_cast<char*>(out.image.data()));
        r != NVRTC_SUCCESS) {
      return nvrtc_error(r, "nvrtcGetCUBIN");
    }
  } else {
    // The size includes the terminating NUL, which cuModuleLoadData needs for PTX.
    if (nvrtcResult r = nvrtcGetPTXSize(program.get(), &image_size); r != NVRTC_SUCCESS) {
      return nvrtc_error(r, "nvrtcGetPTXSize");
    }
    out.image.resize(image_size);
    if (nvrtcResult r = nvrtcGetPTX(program.get(), reinterpret_cast<char*>(out.image.data()));
        r != NVRTC_SUCCESS) {
      return nvrtc_error(r, "nvrtcGetPTX");
    }
  }
  if (out.image.empty()) {
    return internal_error("nvrtc produced an empty " + std::string(image_kind_name(out.kind)) +
                          " for " + program_name);
  }
  return out;
}

}  // namespace kforge
