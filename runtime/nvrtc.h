// Nvrtc: NVIDIA's run-time CUDA C++ compiler, loaded with dlopen, turning a candidate's device
// code into a CUBIN (or PTX) image that CudaModule::load accepts.
//
//   StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
//   if (!nvrtc.ok()) return nvrtc.status();                 // kUnavailable: no NVRTC on this host
//   std::vector<std::string> options = {"--std=c++17"};
//   StatusOr<CompiledKernel> k = (*nvrtc)->compile(source, "softmax.cu", options, 9, 0);
//   if (!k.ok()) return k.status();                         // kInvalidArgument: log in message
//   StatusOr<CudaModule> m = CudaModule::load(cu, k->image.data());
//
// Promises:
// - No link-time dependency on libnvrtc. The search prefers an NVRTC the process already has
//   (PyTorch's, from its NVIDIA wheels), so a compile matches what torch itself would use:
//   $KFORGE_LIBNVRTC if set (then nothing else), an already-loaded libnvrtc.so.{13,12,},
//   the loader's search for those names, $CUDA_HOME/lib64, /usr/local/cuda/lib64, and the NVIDIA
//   wheels next to an already-loaded libtorch_cuda.so.
// - load() loads once per process, is thread-safe, and never unloads. compile() may be called
//   from several threads at once.
// - A compile error is an ordinary result: kInvalidArgument with NVRTC's full log in the message.
// - Nothing here throws.
#pragma once

#include <nvrtc.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace kforge {

enum class ImageKind {
  kCubin,  // machine code for exactly one GPU architecture
  kPtx,    // virtual ISA, compiled by the driver at module load (NUL-terminated text)
};
std::string_view image_kind_name(ImageKind kind) noexcept;  // "cubin", "ptx"

struct CompiledKernel {
  // Ready for CudaModule::load(driver, image.data()). PTX keeps its terminating NUL.
  std::vector<std::byte> image;
  ImageKind kind = ImageKind::kCubin;
  std::string arch;  // the --gpu-architecture it was built for: "sm_90" or "compute_90"
  std::string log;   // NVRTC's log (warnings), possibly empty
};

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
};

#define KFORGE_NVRTC_REQUIRED(X) \
  X(nvrtcVersion)                \
  X(nvrtcGetErrorString)         \
  X(nvrtcCreateProgram)          \
  X(nvrtcDestroyProgram)         \
  X(nvrtcCompileProgram)         \
  X(nvrtcGetProgramLogSize)      \
  X(nvrtcGetProgramLog)          \
  X(nvrtcGetPTXSize)             \
  X(nvrtcGetPTX)

// CUBIN output appeared in NVRTC 11.1; without it compile() emits PTX.
#define KFORGE_NVRTC_OPTIONAL(X) \
  X(nvrtcGetCUBINSize)           \
  X(nvrtcGetCUBIN)

class Nvrtc {
 public:
  // The process-wide NVRTC: the first call searches (order in the header comment) and loads,
  // later calls return the same result.
  static StatusOr<const Nvrtc*> load();
  // Same search, no process-wide cache. For tests and diagnostics.
  static StatusOr<std::unique_ptr<Nvrtc>> load_uncached();
  // Loads exactly `path` (file path or soname), no cache.
  static StatusOr<std::unique_ptr<Nvrtc>> load_from(const std::string& path);
  // The candidates load() would try now, in order; "already loaded: <soname>" marks the ones used
  // only if the process has them.
  static std::vector<std::string> search_paths();

  Nvrtc(const Nvrtc&) = delete;
  Nvrtc& operator=(const Nvrtc&) = delete;
  ~Nvrtc() = default;  // never dlcloses: see CudaDriver

  // The file the loader mapped, absolute where it could tell; for `kforge env` and reports.
  const std::string& library_path() const noexcept { return library_path_; }
  NvrtcVersion version() const noexcept { return version_; }
  bool emits_cubin() const noexcept {
    return nvrtcGetCUBIN != nullptr && nvrtcGetCUBINSize != nullptr;
  }

  // Compiles `source` (program name `name`, which NVRTC uses in its diagnostics) for compute
  // capability sm_major.sm_minor: CUBIN for sm_XY when this NVRTC can emit it, else PTX for
  // compute_XY. `options` are passed through; the architecture is chosen here, so an option that
  // sets it is rejected (kInvalidArgument).
  StatusOr<CompiledKernel> compile(std::string_view source, std::string_view name,
                                   std::span<const std::string> options, int sm_major,
                                   int sm_minor) const;

#define KFORGE_NVRTC_DECLARE_MEMBER(name) decltype(&::name) name = nullptr;
  KFORGE_NVRTC_REQUIRED(KFORGE_NVRTC_DECLARE_MEMBER)
  KFORGE_NVRTC_OPTIONAL(KFORGE_NVRTC_DECLARE_MEMBER)
#undef KFORGE_NVRTC_DECLARE_MEMBER

 private:
  Nvrtc() = default;
  static StatusOr<std::unique_ptr<Nvrtc>> from_handle(void* handle, const std::string& path);

  void* handle_ = nullptr;
  std::string library_path_;
  NvrtcVersion version_;
};

}  // namespace kforge
