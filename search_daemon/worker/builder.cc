#include "search_daemon/worker/builder.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/file_io.h"
#include "runtime/nvrtc.h"
#include "search_daemon/worker/build_cache.h"
#include "search_daemon/worker/compile_options.h"
#include "search_daemon/worker/cpu_kernel_abi_text.h"
#include "search_daemon/worker/cpu_symbol_policy.h"
#include "search_daemon/worker/process_runner.h"

namespace kforge {

namespace {

using build_cache::CacheRecord;
using build_cache::ensure_private_dir;
using build_cache::kMaxArtifactFileBytes;
using file_io::io_error;

constexpr uint32_t kDetectBudgetMs = 10000;

// A fresh private directory under $TMPDIR (else /tmp), removed with everything in it.
class ScratchDir {
 public:
  static StatusOr<ScratchDir> create() {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string tmpl = (base / "kforge-build-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return io_error("cannot create a build directory in", base.string(), errno);
    return ScratchDir(std::move(tmpl));
  }
  ScratchDir(ScratchDir&& o) noexcept : path_(std::exchange(o.path_, std::string())) {}
  ScratchDir& operator=(ScratchDir&&) = delete;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const noexcept { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

// "refused: the object imports a, b and needs libx.so.1 (...)".
std::string refusal_text(const std::vector<std::string>& bad) {
  std::vector<std::string> imports, needs;
  for (const std::string& b : bad) {
    if (b.substr(0, 6) == "needs ") {
      needs.push_back(b.substr(6));
    } else {
      imports.push_back(b);
    }
  }
  std::string out = "refused: the object";
  if (!imports.empty()) out += " imports " + join(imports);
  if (!needs.empty()) out += std::string(imports.empty() ? "" : " and") + " needs " + join(needs);
  return out + " (CPU kernels may call only the math library and memcpy/memmove/memset)";
}

}  // namespace

// ---- CpuCompiler -----------------------------------------------------------------------------------

StatusOr<CpuCompiler> CpuCompiler::detect(const std::string& command) {
  CpuCompiler c;
  c.command = command.empty() ? "c++" : command;
  StatusOr<ProcessResult> r = run_process({c.command, "--version"}, "", kDetectBudgetMs);
  if (!r.ok()) return unavailable("no C++ compiler: " + r.status().message());
  const std::string first_line = r->output.substr(0, r->output.find('\n'));
  if (r->timed_out) return unavailable("no C++ compiler: '" + c.command + " --version' did not finish in 10 s");
  if (!r->exited || r->exit_code != 0) {
    return unavailable("no C++ compiler: '" + c.command + " --version' failed (" +
                       (r->exited ? "exit status " + std::to_string(r->exit_code) : "signal " + std::to_string(r->signal)) +
                       "): " + first_line);
  }
  if (first_line.empty()) return unavailable("no C++ compiler: '" + c.command + " --version' printed nothing");
  c.identity = first_line;
  return c;
}

// ---- CandidateBuilder -------------------------------------------------------------------------------

StatusOr<CandidateBuilder> CandidateBuilder::for_cpu(std::string cache_dir, CpuCompiler compiler) {
  if (compiler.command.empty() || compiler.identity.empty()) {
    return invalid_argument("CPU builder: the compiler needs a command and an identity (CpuCompiler::detect)");
  }
  KFORGE_RETURN_IF_ERROR(build_cache::prepare_cache_dir(cache_dir));
  CandidateBuilder b;
  b.cache_dir_ = std::move(cache_dir);
  b.identity_ = "cpu " + compiler.identity;
  b.cpu_ = std::move(compiler);
  return b;
}

StatusOr<CandidateBuilder> CandidateBuilder::for_cuda(std::string cache_dir, const Nvrtc* nvrtc, int sm_major, int sm_minor) {
  if (nvrtc == nullptr) return invalid_argument("CUDA builder: no NVRTC");
  if (sm_major <= 0 || sm_minor < 0 || sm_minor > 9) {
    return invalid_argument("CUDA builder: bad compute capability " + std::to_string(sm_major) + "." + std::to_string(sm_minor));
  }
  KFORGE_RETURN_IF_ERROR(build_cache::prepare_cache_dir(cache_dir));
  CandidateBuilder b;
  b.cache_dir_ = std::move(cache_dir);
  b.identity_ = "cuda sm_" + std::to_string(sm_major * 10 + sm_minor) + " nvrtc " +
                std::to_string(nvrtc->version().major) + "." + std::to_string(nvrtc->version().minor);
  b.nvrtc_ = nvrtc;
  b.sm_major_ = sm_major;
  b.sm_minor_ = sm_minor;
  b.cuda_ = true;
  return b;
}

StatusOr<BuildOutput> CandidateBuilder::build(const KernelSpec& spec, uint32_t budget_ms) const {
  const auto t0 = std::chrono::steady_clock::now();
  const Backend want = cuda_ ? Backend::kCuda : Backend::kCpu;
  if (spec.backend != want) {
    return invalid_argument("a " + std::string(backend_name(want)) + " builder cannot build a " +
                            std::string(backend_name(spec.backend)) + " kernel");
  }
  BuildOutput out;
  out.key = build_cache::cache_key(spec, identity_);
  auto finish = [&](BuildOutput o) {
    o.build_ms = ms_since(t0);
    return o;
  };

  // Refused options are decided before anything touches the disk (Note [Build cache files] in
  // build_cache.cc).
  for (const std::string& option : spec.compile_options) {
    std::optional<std::string> why = cuda_ ? refuse_cuda_option(option) : refuse_cpu_option(option);
    if (why) {
      out.log = "compile option '" + option + "' is not allowed: " + *why;
      return finish(std::move(out));
    }
  }

  // A miss, or a damaged entry: build, and let write_entry below replace it.
  KFORGE_ASSIGN_OR_RETURN(std::optional<CacheRecord> hit, build_cache::read_entry(cache_dir_, out.key));
  if (hit) {
    out.compiled = hit->compiled;
    out.artifact_name = std::move(hit->artifact_name);
    out.artifact = std::move(hit->artifact);
    out.log = std::move(hit->log);
    out.cached = true;
    return finish(std::move(out));
  }

  CacheRecord rec;
  bool cacheable = true;
  if (cuda_) {
    // NVRTC compiles inside this process and cannot be interrupted, so budget_ms does not apply
    // here: the worker's supervisor (WorkerProcess) kills the whole worker when a phase overruns.
    StatusOr<CompiledKernel> k = nvrtc_->compile(spec.source, "kernel.cu", spec.compile_options, sm_major_, sm_minor_);
    if (k.ok()) {
      rec.compiled = true;
      rec.artifact_name = std::string(image_kind_name(k->kind));
      rec.artifact.assign(reinterpret_cast<const char*>(k->image.data()), k->image.size());
      rec.log = std::move(k->log);
    } else if (k.status().code() == StatusCode::kInvalidArgument) {
      rec.log = k.status().message();
    } else {
      return k.status();  // NVRTC itself failed (out of memory, internal error): not the source's fault
    }
  } else {
    KFORGE_ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::create());
    KFORGE_RETURN_IF_ERROR(ensure_private_dir(dir.path() + "/runtime"));
    KFORGE_RETURN_IF_ERROR(file_io::write_new_file(dir.path() + "/runtime/cpu_kernel_abi.h", kCpuKernelAbiHeaderText));
    KFORGE_RETURN_IF_ERROR(file_io::write_new_file(dir.path() + "/kernel.cc", spec.source));
    std::vector<std::string> args = {cpu_.command};
    args.insert(args.end(), kFixedCpuFlags.begin(), kFixedCpuFlags.end());
    args.push_back("-I" + dir.path());
    args.insert(args.end(), spec.compile_options.begin(), spec.compile_options.end());
    args.insert(args.end(), {"kernel.cc", "-o", "kernel.so"});
    StatusOr<ProcessResult> run = run_process(args, dir.path(), budget_ms);
    if (!run.ok()) return unavailable("CPU build: " + run.status().message());
    rec.log = std::move(run->output);
    if (run->timed_out) {
      rec.log += std::string(rec.log.empty() || rec.log.back() == '\n' ? "" : "\n") +
                 "kforge: the compiler was killed: it outlived its budget of " + std::to_string(budget_ms) + " ms";
      cacheable = false;
    } else if (!run->exited) {
      rec.log += std::string(rec.log.empty() || rec.log.back() == '\n' ? "" : "\n") +
                 "kforge: the compiler was killed by signal " + std::to_string(run->signal);
      cacheable = false;
    } else if (run->exit_code == 0) {
      StatusOr<std::string> so = file_io::read_file(dir.path() + "/kernel.so", kMaxArtifactFileBytes);
      if (!so.ok()) {
        rec.log += "\nkforge: the compiler exited 0 but left no usable kernel.so: " + so.status().message();
      } else if (StatusOr<std::vector<std::string>> bad = forbidden_imports(*so); !bad.ok()) {
        rec.log += std::string(rec.log.empty() ? "" : "\n") + "refused: " + bad.status().message();
      } else if (!bad->empty()) {
        rec.log += std::string(rec.log.empty() ? "" : "\n") + refusal_text(*bad);
      } else {
        rec.compiled = true;
        rec.artifact_name = "so";
        rec.artifact = std::move(*so);
      }
    }
  }

  // Deterministic outcomes only (Note [Build cache files] in build_cache.cc).
  if (cacheable) KFORGE_RETURN_IF_ERROR(build_cache::write_entry(cache_dir_, out.key, rec));

  out.compiled = rec.compiled;
  out.artifact_name = std::move(rec.artifact_name);
  out.artifact = std::move(rec.artifact);
  out.log = std::move(rec.log);
  return finish(std::move(out));
}

}  // namespace kforge