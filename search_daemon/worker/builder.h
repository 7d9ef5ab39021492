// CandidateBuilder: turns a KernelSpec's source into the binary the backends load, through a
// build cache keyed by content, so that re-evaluating a known candidate costs no compile.
//
//   StatusOr<CandidateBuilder> b = CandidateBuilder::for_cpu(build_cache_dir, CpuCompiler::detect("c++"));
//   StatusOr<BuildOutput> out = b->build(spec, /*budget_ms=*/60000);
//   if (!out.ok()) ...                       // the builder itself failed (cache dir unusable, ...)
//   else if (!out->compiled) ...             // an ordinary result: the compiler refused the source;
//                                            // out->log says why
//   else load(out->artifact)                 // "so" (CPU) / "cubin" or "ptx" (CUDA)
//
// Promises:
// - CPU: the system C++ compiler ($KFORGE_CXX, else c++) builds a shared object with fixed flags
//   (-std=c++17 -O2 -fPIC -shared, the directory holding runtime/cpu_kernel_abi.h on the include
//   path) plus the spec's compile options, each of which must be on an allow-list (optimization
//   levels, -march/-mtune, -f feature switches other than plugins, -D/-U macros, -std=): anything
//   else (an output path, an include directory, a response file, a linker flag) is a compile
//   error naming the option, never passed to the compiler. The compiler runs in a fresh temporary
//   directory with stdin from /dev/null, is killed when it outlives `budget_ms` (a compile error
//   saying so), and its combined output becomes the log.
// - A built CPU object is then checked by cpu_symbol_policy.h: one that imports anything outside
//   the allowed set (threads, I/O, memory allocation, process control) is refused (compiled=false,
//   the log names the symbols).
// - CUDA: NVRTC for exactly the device's compute capability (Nvrtc::compile), cubin when NVRTC
//   emits it, else PTX.
// - Cache key: SHA-256 over the backend, the target (CPU compiler identity, or sm_XY plus NVRTC
//   version), the ABI version, the source, the entry points and the compile options. Entries are
//   files under the cache directory, written to a temporary name, fsync'ed and renamed into place,
//   so concurrent builders and killed builders never leave a half-written artifact behind. A
//   cached artifact is read back and its SHA-256 checked; a damaged one is rebuilt. Compile
//   errors are cached too (same key), so a candidate that does not compile costs one compile.
// - Nothing throws.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/kernel_spec.h"
#include "runtime/status.h"

namespace kforge {

class Nvrtc;

struct CpuCompiler {
  std::string command;    // what is run: "c++", or $KFORGE_CXX
  std::string identity;   // first line of `command --version` ("c++ (Debian 12.2.0-14) 12.2.0")
  // Finds the compiler ($KFORGE_CXX, else c++ on PATH) and asks it its version.
  // `command` (the worker's KFORGE_CXX; "": c++) and its --version line.
  static StatusOr<CpuCompiler> detect(const std::string& command);
};

struct BuildOutput {
  bool compiled = false;        // false: a compile error (or refused object); see log
  std::string artifact_name;    // "so", "cubin", "ptx" (empty when !compiled)
  std::string artifact;         // the bytes
  std::string log;              // compiler output / refusal reason (may be empty on success)
  bool cached = false;          // served from the build cache, no compiler ran
  double build_ms = 0;          // wall time of this call
  std::string key;              // the cache key, 64 hex digits
};

class CandidateBuilder {
 public:
  // `cache_dir` is created (0700) if missing.
  static StatusOr<CandidateBuilder> for_cpu(std::string cache_dir, CpuCompiler compiler);
  static StatusOr<CandidateBuilder> for_cuda(std::string cache_dir, const Nvrtc* nvrtc, int sm_major, int sm_minor);

  StatusOr<BuildOutput> build(const KernelSpec& spec, uint32_t budget_ms) const;

  // What the cache key covers besides the spec: "cpu c++ (Debian 12.2.0-14) 12.2.0" or
  // "cuda sm_90 nvrtc 13.0". The worker puts the CPU compiler into its Environment.
  const std::string& target_identity() const noexcept { return identity_; }

 private:
  CandidateBuilder() = default;
  std::string cache_dir_;
  std::string identity_;
  CpuCompiler cpu_;
  const Nvrtc* nvrtc_ = nullptr;
  int sm_major_ = 0;
  int sm_minor_ = 0;
  bool cuda_ = false;
};

}  // namespace kforge
