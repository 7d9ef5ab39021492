#include "runtime/cpu_backend.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/launch_args.h"
#include "runtime/shared_library.h"

namespace kforge {

namespace {

struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<void, FreeDeleter>;

AlignedBuffer aligned_buffer(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  return AlignedBuffer(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
}


}  // namespace

StatusOr<CpuModule> CpuModule::load_image(std::string_view image, std::string_view name) {
  std::string label = "cpu module '" + std::string(name) + "'";
  if (image.size() < 4 || image.substr(0, 4) != std::string_view("\x7f" "ELF", 4)) {
    return invalid_argument(label + ": image is not an ELF shared object");
  }
  // An anonymous file keeps kernels off the file system: nothing to clean up, nothing another
  // process could swap between our write and our dlopen.
  int fd = ::memfd_create(std::string(name).c_str(), MFD_CLOEXEC);
  if (fd < 0) return unavailable(label + ": memfd_create failed: " + std::strerror(errno));
  size_t written = 0;
  while (written < image.size()) {
    ssize_t n = ::write(fd, image.data() + written, image.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      return unavailable(label + ": writing the image failed: " + std::strerror(err));
    }
    written += static_cast<size_t>(n);
  }
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  dlerror();
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    ::close(fd);
    return invalid_argument(label + ": dlopen failed: " + dl_error_text());
  }
  // The fd stays open for as long as the module lives (forever): glibc finds already-loaded
  // objects by path name, so if the number were reused for the next image, dlopen of the same
  // "/proc/self/fd/N" would silently return this module instead of loading the new one.
  return CpuModule(handle, std::string(name), fd);
}

void CpuModule::unload() {
  if (handle_ != nullptr) ::dlclose(handle_);
  handle_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

StatusOr<CpuModule> CpuModule::load_file(const std::string& path) {
  dlerror();
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return invalid_argument("cpu module " + path + ": dlopen failed: " + dl_error_text());
  return CpuModule(handle, path);
}

StatusOr<kforge_cpu_entry> CpuModule::entry(const std::string& symbol) const {
  dlerror();
  void* sym = ::dlsym(handle_, symbol.c_str());
  if (sym == nullptr) {
    return not_found("cpu module '" + name_ + "' has no entry point '" + symbol + "' (is it extern \"C\"?)");
  }
  kforge_cpu_entry fn;
  static_assert(sizeof fn == sizeof sym);
  std::memcpy(&fn, &sym, sizeof fn);
  return fn;
}

Status run_cpu_plan(const CpuModule& module, const KernelSpec& spec, const ResolvedLaunchPlan& plan,
                    const CpuBuffers& buffers, const CpuRunOptions& options) {
  if (buffers.outputs.size() != plan.outputs.size()) {
    return invalid_argument("plan has " + std::to_string(plan.outputs.size()) + " outputs but " +
                            std::to_string(buffers.outputs.size()) + " output buffers were given");
  }
  if (!buffers.scratch.empty() && buffers.scratch.size() != plan.scratch.size()) {
    return invalid_argument("plan has " + std::to_string(plan.scratch.size()) + " scratch buffers but " +
                            std::to_string(buffers.scratch.size()) + " were given");
  }
  for (size_t li = 0; li < plan.launches.size(); ++li) {
    if (plan.launches[li].shared_mem_bytes > kCpuMaxSharedMemBytes) {
      return invalid_argument("launch " + std::to_string(li) + " asks for " +
                              std::to_string(plan.launches[li].shared_mem_bytes) +
                              " bytes of shared memory; the CPU backend allows " +
                              std::to_string(kCpuMaxSharedMemBytes) + " per block");
    }
  }
  std::vector<AlignedBuffer> owned;
  std::vector<void*> scratch = buffers.scratch;
  if (scratch.empty()) {
    owned.reserve(plan.scratch.size());
    for (size_t i = 0; i < plan.scratch.size(); ++i) {
      owned.push_back(aligned_buffer(static_cast<size_t>(plan.scratch[i].bytes)));
      if (!owned.back()) return unavailable("cannot allocate " + std::to_string(plan.scratch[i].bytes) + " bytes for scratch " + std::to_string(i));
      scratch.push_back(owned.back().get());
    }
  }

  for (size_t li = 0; li < plan.launches.size(); ++li) {
    const ResolvedLaunch& launch = plan.launches[li];
    const std::string where = "launch " + std::to_string(li);
    if (launch.entry_index >= spec.entry_points.size()) return invalid_argument(where + ": entry index out of range");
    KFORGE_ASSIGN_OR_RETURN(kforge_cpu_entry fn, module.entry(spec.entry_points[launch.entry_index]));

    std::vector<ParamSlot> slots(launch.args.size());
    std::vector<void*> params(launch.args.size());
    KFORGE_RETURN_IF_ERROR(bind_launch_args(
        launch, slots, params,
        [&](ArgBinding::Kind kind, uint32_t i) -> uint64_t {
          const auto& list = kind == ArgBinding::Kind::kInput    ? buffers.inputs
                             : kind == ArgBinding::Kind::kOutput ? buffers.outputs
                                                                 : scratch;
          return i < list.size() ? reinterpret_cast<uint64_t>(list[i]) : 0;
        },
        // As before: a scratch buffer that exists may be null (0 bytes).
        [&] { return where; }, [&](uint32_t i) { return i < scratch.size(); },
        [](ArgBinding::Kind kind) {
          return kind == ArgBinding::Kind::kInput    ? "no tensor for input"
                 : kind == ArgBinding::Kind::kOutput ? "no buffer for output"
                                                     : "no scratch buffer";
        }));

    const uint64_t gx = launch.grid[0], gy = launch.grid[1], gz = launch.grid[2];
    const uint64_t blocks = gx * gy * gz;
    const uint32_t shared = launch.shared_mem_bytes;
    // CpuRunOptions::block_order_seed: a Fisher-Yates shuffle of the block indices.
    std::vector<uint64_t> order;
    if (options.block_order_seed != 0 && blocks > 1) {
      order.resize(blocks);
      for (uint64_t i = 0; i < blocks; ++i) order[i] = i;
      std::mt19937_64 rng(options.block_order_seed + li);
      for (uint64_t i = blocks - 1; i > 0; --i) std::swap(order[i], order[std::uniform_int_distribution<uint64_t>(0, i)(rng)]);
    }
    // Each task gets its own shared-memory buffer, reused for the blocks it runs (blocks of one
    // task run one after another, like blocks that share an SM).
    struct Task {
      const ResolvedLaunch* launch;
      const std::vector<uint64_t>* order;
      const CpuRunOptions* options;
      kforge_cpu_entry fn;
      void* const* params;
      uint64_t gx, gy;
      uint32_t shared;
    } task{&launch, &order, &options, fn, params.data(), gx, gy, shared};
    auto body = [](void* ctx, uint64_t begin, uint64_t end) {
      const Task& t = *static_cast<const Task*>(ctx);
      AlignedBuffer smem = t.shared > 0 ? aligned_buffer(t.shared) : AlignedBuffer();
      kforge_cpu_block b{};
      b.abi_version = KFORGE_CPU_ABI_VERSION;
      for (int d = 0; d < 3; ++d) {
        b.grid_dim[d] = t.launch->grid[d];
        b.block_dim[d] = t.launch->block[d];
      }
      b.shared_mem_bytes = t.shared;
      b.shared_mem = smem.get();
      for (uint64_t pos = begin; pos != end; ++pos) {
        const uint64_t i = t.order->empty() ? pos : (*t.order)[pos];
        if (t.options->shared_mem_poison >= 0 && t.shared > 0) std::memset(smem.get(), t.options->shared_mem_poison, t.shared);
        b.block_idx[0] = static_cast<uint32_t>(i % t.gx);
        b.block_idx[1] = static_cast<uint32_t>((i / t.gx) % t.gy);
        b.block_idx[2] = static_cast<uint32_t>(i / (t.gx * t.gy));
        t.fn(&b, t.params);
      }
    };
    if (options.parallel_for != nullptr) {
      options.parallel_for(blocks, &task, body);
    } else {
      tbb::parallel_for(tbb::blocked_range<uint64_t>(0, blocks),
                        [&](const tbb::blocked_range<uint64_t>& r) { body(&task, r.begin(), r.end()); });
    }
  }
  return Status();
}

}  // namespace kforge
