#include "search_daemon/worker/candidate.h"

#include <ATen/Parallel.h>

#include <utility>

namespace kforge::eval {

namespace {

// CPU candidates run on torch's thread pool, as PyTorch's baseline kernel does (CpuParallelFor).
void torch_parallel_for(uint64_t n, void* ctx, void (*body)(void*, uint64_t, uint64_t)) {
  at::parallel_for(0, static_cast<int64_t>(n), 1, [&](int64_t begin, int64_t end) {
    body(ctx, static_cast<uint64_t>(begin), static_cast<uint64_t>(end));
  });
}

}  // namespace

StatusOr<LoadedCandidate> LoadedCandidate::load(EvalDevice& device, const KernelSpec& spec,
                                                const std::string& artifact_name, const std::string& artifact) {
  LoadedCandidate c;
  c.device_ = &device;
  c.spec_ = &spec;
  if (!device.is_cuda()) {
    if (artifact_name != "so") return invalid_argument("a CPU worker cannot load a '" + artifact_name + "' artifact");
    KFORGE_ASSIGN_OR_RETURN(CpuModule m, CpuModule::load_image(artifact, "candidate"));
    for (const std::string& e : spec.entry_points) {
      StatusOr<kforge_cpu_entry> fn = m.entry(e);
      if (!fn.ok()) {
        m.unload();
        return fn.status();
      }
    }
    c.cpu_.emplace(std::move(m));
    return c;
  }
  if (artifact_name != "cubin" && artifact_name != "ptx") {
    return invalid_argument("a CUDA worker cannot load a '" + artifact_name + "' artifact");
  }
  // PTX is loaded as a NUL-terminated string.
  std::string image = artifact;
  if (artifact_name == "ptx" && (image.empty() || image.back() != '\0')) image.push_back('\0');
  const CudaDriver& cu = *device.driver();
  StatusOr<ScopedCurrentContext> ctx = ScopedCurrentContext::make_current(cu, device.context());
  if (!ctx.ok()) return ctx.status();
  KFORGE_ASSIGN_OR_RETURN(CudaKernel k, CudaKernel::load(cu, image.data(), spec));
  c.cuda_.emplace(std::move(k));
  return c;
}

LoadedCandidate::LoadedCandidate(LoadedCandidate&& o) noexcept
    : device_(o.device_), spec_(o.spec_), cpu_(std::move(o.cpu_)), cuda_(std::move(o.cuda_)) {
  o.cpu_.reset();
  o.cuda_.reset();
}

LoadedCandidate::~LoadedCandidate() {
  if (cpu_) cpu_->unload();
  // A context lost to a candidate's fault cannot unload anything; the worker exits anyway.
  if (cuda_ && device_ != nullptr && !device_->context_lost()) (void)cuda_->unload();
}

Status LoadedCandidate::launch(const ResolvedLaunchPlan& plan, const std::vector<void*>& inputs,
                               const std::vector<void*>& outputs, const std::vector<void*>& scratch,
                               const CpuRunOptions& cpu_options) const {
  if (cpu_) {
    CpuBuffers io{inputs, outputs, scratch};
    CpuRunOptions o = cpu_options;
    o.parallel_for = &torch_parallel_for;
    return run_cpu_plan(*cpu_, *spec_, plan, io, o);
  }
  CudaBuffers io;
  for (void* p : inputs) io.inputs.push_back(reinterpret_cast<CUdeviceptr>(p));
  for (void* p : outputs) io.outputs.push_back(reinterpret_cast<CUdeviceptr>(p));
  for (void* p : scratch) io.scratch.push_back(reinterpret_cast<CUdeviceptr>(p));
  return cuda_->launch(plan, io, device_->cuda_stream());
}

}  // namespace kforge::eval
