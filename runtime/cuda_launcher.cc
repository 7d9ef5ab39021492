#include "runtime/cuda_launcher.h"

#include <algorithm>

#include "runtime/launch_args.h"

namespace kforge {

namespace {

constexpr uint32_t kDefaultDynamicSmem = 48 * 1024;

// Note [Non-portable clusters]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A kernel compiled with __cluster_dims__ of more than 8 blocks (the portable size every sm_90
// part schedules) launches only once its function allows non-portable sizes: sm_90 parts take 16.
// The opt-in is per function and sticky, so it is made where the function is loaded, from the
// cluster size the image itself declares; a kernel without clusters, or with 8 or fewer blocks,
// is left as compiled. A device that cannot schedule the size fails the launch with
// CUDA_ERROR_CLUSTER_OUT_OF_RESOURCES (a candidate the worker rejects, a fallback in the hook),
// never a hang: a cluster's blocks are scheduled together or not at all.
constexpr int kMaxPortableCluster = 8;

Status allow_large_clusters(const CudaDriver& cu, CUfunction fn, const std::string& name) {
  int dims[3] = {0, 0, 0};
  const CUfunction_attribute which[3] = {CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
                                         CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH};
  for (int i = 0; i < 3; ++i) {
    // A driver that cannot say has no clusters to allow.
    if (cu.cuFuncGetAttribute(&dims[i], which[i], fn) != CUDA_SUCCESS) return Status();
  }
  if (dims[0] * std::max(dims[1], 1) * std::max(dims[2], 1) <= kMaxPortableCluster) return Status();
  const CUresult r = cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
  if (r == CUDA_SUCCESS) return Status();
  Status e = cu.error(r, "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)", __FILE__, __LINE__);
  return Status(e.code(), name + ": clusters of " + std::to_string(dims[0]) + "x" + std::to_string(dims[1]) + "x" +
                              std::to_string(dims[2]) + " blocks: " + e.message());
}


}  // namespace

StatusOr<CudaKernel> CudaKernel::load(const CudaDriver& driver, const void* image, const KernelSpec& spec) {
  if (spec.backend != Backend::kCuda) return invalid_argument("CudaKernel::load: the spec is not a CUDA kernel");
  KFORGE_ASSIGN_OR_RETURN(CudaModule module, CudaModule::load(driver, image));
  CudaKernel k;
  k.driver_ = &driver;
  for (const std::string& name : spec.entry_points) {
    KFORGE_ASSIGN_OR_RETURN(CUfunction fn, module.function(name));
    KFORGE_RETURN_IF_ERROR(allow_large_clusters(driver, fn, name));   // Note [Non-portable clusters]
    k.names_.push_back(name);
    k.functions_.push_back(fn);
  }
  k.module_ = module.release();
  k.smem_enabled_ = std::make_shared<std::vector<std::atomic<uint32_t>>>(k.functions_.size());
  return k;
}

Status CudaKernel::unload() {
  if (module_ == nullptr) return Status();
  const CUmodule m = module_;
  module_ = nullptr;
  functions_.clear();
  KFORGE_CU_RETURN_IF_ERROR(*driver_, driver_->cuModuleUnload(m));
  return Status();
}

Status CudaKernel::launch(const ResolvedLaunchPlan& plan, const CudaBuffers& buffers, CUstream stream) const {
  const CudaDriver& cu = *driver_;
  if (buffers.outputs.size() < plan.outputs.size()) {
    return invalid_argument("plan has " + std::to_string(plan.outputs.size()) + " outputs but " +
                            std::to_string(buffers.outputs.size()) + " output buffers were given");
  }
  if (buffers.scratch.size() < plan.scratch.size()) {
    return invalid_argument("plan has " + std::to_string(plan.scratch.size()) + " scratch buffers but " +
                            std::to_string(buffers.scratch.size()) + " were given");
  }
  // Reused per thread: after a thread's first launches, launching allocates nothing (the hook
  // launches from user threads, where a heap allocation per call is overhead it must not add).
  // cuLaunchKernel copies the values before it returns, and launch() never calls itself.
  thread_local std::vector<ParamSlot> slots;
  thread_local std::vector<void*> params;
  for (size_t li = 0; li < plan.launches.size(); ++li) {
    const ResolvedLaunch& l = plan.launches[li];
    if (l.entry_index >= functions_.size()) {
      return invalid_argument("launch " + std::to_string(li) + ": entry index out of range");
    }
    // Built only for an error message: the launch path itself allocates nothing.
    auto where = [&] { return "launch " + std::to_string(li) + " (" + names_[l.entry_index] + ")"; };
    slots.assign(l.args.size(), ParamSlot{});
    params.assign(l.args.size(), nullptr);
    KFORGE_RETURN_IF_ERROR(bind_launch_args(
        l, slots, params,
        [&](ArgBinding::Kind kind, uint32_t i) -> uint64_t {
          const auto& list = kind == ArgBinding::Kind::kInput    ? buffers.inputs
                             : kind == ArgBinding::Kind::kOutput ? buffers.outputs
                                                                 : buffers.scratch;
          return i < list.size() ? static_cast<uint64_t>(list[i]) : 0;
        },
        where, [&](uint32_t i) { return i < buffers.scratch.size() && i < plan.scratch.size() && plan.scratch[i].bytes <= 0; },
        [](ArgBinding::Kind kind) {
          return kind == ArgBinding::Kind::kInput    ? "no device pointer for input"
                 : kind == ArgBinding::Kind::kOutput ? "no device pointer for output"
                                                     : "no device pointer for scratch";
        }));
    CUfunction fn = functions_[l.entry_index];
    if (l.shared_mem_bytes > kDefaultDynamicSmem) {
      // Opting in is per function and sticky; doing it once per size keeps launches cheap.
      std::atomic<uint32_t>& enabled = (*smem_enabled_)[l.entry_index];
      if (enabled.load(std::memory_order_acquire) < l.shared_mem_bytes) {
        CUresult r = cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           static_cast<int>(l.shared_mem_bytes));
        if (r != CUDA_SUCCESS) {
          Status e = cu.error(r, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", __FILE__, __LINE__);
          return Status(e.code(), where() + ": " + std::to_string(l.shared_mem_bytes) +
                                      " bytes of dynamic shared memory: " + e.message());
        }
        enabled.store(l.shared_mem_bytes, std::memory_order_release);
      }
    }
    CUresult r = cu.cuLaunchKernel(fn, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
                                   l.shared_mem_bytes, stream, params.data(), nullptr);
    if (r != CUDA_SUCCESS) {
      Status e = cu.error(r, "cuLaunchKernel", __FILE__, __LINE__);
      return Status(e.code(), where() + ": " + e.message());
    }
  }
  return Status();
}

}  // namespace kforge
