// The CUDA backend's launcher: a KernelSpec's entry points loaded in one context, and its resolved
// launch plan run on a stream.
//
//   StatusOr<CudaKernel> k = CudaKernel::load(driver, compiled.image.data(), spec);   // once
//   StatusOr<ResolvedLaunchPlan> plan = spec.resolve(sig);                            // per shape
//   CudaBuffers io{.inputs = {x_ptr}, .outputs = {y_ptr}, .scratch = {tmp_ptr}};
//   Status s = k->launch(*plan, io, stream);     // asynchronous, like any kernel launch
//
// Promises:
// - load() must run in the context the kernels will run in, outside any stream capture (module
//   loading is not allowed while capturing). The module is never unloaded: a CUDA graph captured
//   with these kernels may replay them for the life of the process.
// - launch() only enqueues work (cuLaunchKernel per launch, in order, on `stream`): it allocates no
//   device memory, never synchronizes, and is therefore safe inside stream capture. A successful
//   launch allocates no host memory either once its thread has launched as many arguments before
//   (per-thread reused parameter arrays). Buffers are the caller's (the hook allocates outputs and
//   scratch through PyTorch's caching allocator).
// - Dynamic shared memory above the 48 KiB default is enabled per function before the first launch
//   that needs it (cuFuncSetAttribute); more than the device allows is a launch error, not a crash.
// - A kernel compiled for clusters of more than 8 blocks is allowed them when it is loaded (Note
//   [Non-portable clusters] in cuda_launcher.cc).
// - Errors name the launch, the entry point and the CUresult. Nothing throws.
#pragma once

#include <cuda.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/kernel_spec.h"
#include "runtime/status.h"

namespace kforge {

struct CudaBuffers {
  std::vector<CUdeviceptr> inputs;    // by signature argument (0 for non-tensor arguments)
  std::vector<CUdeviceptr> outputs;   // by plan output
  std::vector<CUdeviceptr> scratch;   // by plan scratch buffer
};

class CudaKernel {
 public:
  // Loads `image` (CUBIN or NUL-terminated PTX) into the current context and resolves every entry
  // point of `spec`.
  static StatusOr<CudaKernel> load(const CudaDriver& driver, const void* image, const KernelSpec& spec);

  Status launch(const ResolvedLaunchPlan& plan, const CudaBuffers& buffers, CUstream stream) const;

  const std::vector<std::string>& entry_points() const noexcept { return names_; }

  // Unloads the module (in the current context, which must be the one it was loaded into). For the
  // evaluation worker only, which loads a module per candidate and must not accumulate them: a
  // serving process never unloads (see above). Afterwards the kernel cannot be launched.
  Status unload();

 private:
  CudaKernel() = default;
  const CudaDriver* driver_ = nullptr;
  CUmodule module_ = nullptr;                          // never unloaded
  std::vector<std::string> names_;
  std::vector<CUfunction> functions_;
  // Largest dynamic shared memory enabled so far per function (0 = default 48 KiB).
  std::shared_ptr<std::vector<std::atomic<uint32_t>>> smem_enabled_;
};

}  // namespace kforge
