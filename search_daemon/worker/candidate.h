// LoadedCandidate: a built candidate loaded on the worker's device, ready to launch on raw buffers.
// The verifier and the measurer run candidates only through this class.
//
//   StatusOr<LoadedCandidate> c = LoadedCandidate::load(device, spec, build.artifact_name, build.artifact);
//   Status s = c->launch(plan, inputs, outputs, scratch, cpu_options);   // CUDA: asynchronous
//
// Promises:
// - CPU: the shared object is loaded from memory (CpuModule) and run with run_cpu_plan, with the
//   verifier's block-order and shared-memory knobs. CUDA: the cubin/PTX is loaded into the device's
//   primary context (torch's) and launched on torch's current stream; launch() only enqueues.
// - A CUDA launch error is recorded on the device (EvalDevice::check), so an error that poisoned
//   the context is seen by the worker.
// - The module is unloaded when the object is destroyed: a worker evaluates thousands of
//   candidates and must not accumulate them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cpu_backend.h"
#include "runtime/cuda_launcher.h"
#include "runtime/kernel_spec.h"
#include "runtime/status.h"
#include "search_daemon/worker/eval_device.h"

namespace kforge::eval {

class LoadedCandidate {
 public:
  static StatusOr<LoadedCandidate> load(EvalDevice& device, const KernelSpec& spec, const std::string& artifact_name,
                                        const std::string& artifact);
  LoadedCandidate(LoadedCandidate&&) noexcept;
  LoadedCandidate& operator=(LoadedCandidate&&) = delete;
  LoadedCandidate(const LoadedCandidate&) = delete;
  LoadedCandidate& operator=(const LoadedCandidate&) = delete;
  ~LoadedCandidate();

  // Buffers are indexed like CpuBuffers/CudaBuffers: inputs by signature argument, outputs by plan
  // output, scratch by plan scratch buffer.
  Status launch(const ResolvedLaunchPlan& plan, const std::vector<void*>& inputs, const std::vector<void*>& outputs,
                const std::vector<void*>& scratch, const CpuRunOptions& cpu_options) const;

 private:
  LoadedCandidate() = default;
  EvalDevice* device_ = nullptr;
  const KernelSpec* spec_ = nullptr;
  std::optional<CpuModule> cpu_;
  std::optional<CudaKernel> cuda_;
};

}  // namespace kforge::eval
