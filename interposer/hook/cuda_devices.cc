#include "interposer/hook/cuda_devices.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <array>
#include <mutex>

#include "interposer/hook/log.h"
#include "runtime/cuda_environment.h"
#include "runtime/cuda_launcher.h"
#include "runtime/wire.h"

namespace kforge::hook {

const CudaDriver* CudaDevices::driver() {
  if (tried_) return driver_;
  tried_ = true;
  StatusOr<const CudaDriver*> d = CudaDriver::load();
  if (!d.ok()) {
    error_ = d.status().message();
    return nullptr;
  }
  int count = 0;
  if (const CUresult r = (*d)->cuDeviceGetCount(&count); r != CUDA_SUCCESS) {
    error_ = (*d)->error(r, "cuDeviceGetCount", __FILE__, __LINE__).message();
    return nullptr;
  }
  driver_ = *d;
  count_ = std::clamp(count, 0, CudaModules::kMaxDevices);
  devices_.resize(static_cast<size_t>(count_));
  return driver_;
}

int CudaDevices::count() { return driver() != nullptr ? count_ : 0; }

bool CudaDevices::valid(int ordinal) { return ordinal >= 0 && ordinal < count(); }

const StatusOr<Environment>& CudaDevices::environment(int ordinal) {
  static const StatusOr<Environment> kNoDevice(invalid_argument("no such CUDA device"));
  if (!valid(ordinal)) return kNoDevice;
  Device& dev = devices_[static_cast<size_t>(ordinal)];
  if (!dev.environment) {
    dev.environment.emplace(cuda_device_environment(*driver_, ordinal, torch_version_, 0));
    if (!dev.environment->ok()) {
      log_line("cannot read the environment of CUDA device " + std::to_string(ordinal) + " (" +
               dev.environment->status().message() + "); no cache entry is loaded on it");
    }
  }
  return *dev.environment;
}

StatusOr<bool> CudaDevices::primary_context_active(int ordinal) {
  if (!valid(ordinal)) return invalid_argument("CUDA device " + std::to_string(ordinal) + " does not exist");
  const CudaDriver& cu = *driver_;
  CUdevice device = 0;
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGet(&device, ordinal));
  unsigned int flags = 0;
  int active = 0;
  KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDevicePrimaryCtxGetState(device, &flags, &active));
  return active != 0;
}

StatusOr<const CudaDeviceModule*> CudaDevices::load(int ordinal, const std::string& image, const KernelSpec& spec) {
  KFORGE_ASSIGN_OR_RETURN(const bool active, primary_context_active(ordinal));
  const std::string device = "CUDA device " + std::to_string(ordinal);
  if (!active) {
    return unavailable(device + ": its primary context is not active (torch has not used the device), and kforge "
                                "never creates one");
  }
  const CudaDriver& cu = *driver_;
  Device& dev = devices_[static_cast<size_t>(ordinal)];
  if (!dev.primary) {
    CUdevice handle = 0;
    KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGet(&handle, ordinal));
    StatusOr<PrimaryContext> retained = PrimaryContext::retain(cu, handle);
    if (!retained.ok()) return Status(retained.status().code(), device + ": " + retained.status().message());
    dev.primary.emplace(std::move(*retained));
  }
  const CUcontext context = dev.primary->get();
  // Order matters: the mode guard outlives the context guard, so the pop happens in relaxed mode
  // too, and this thread leaves with both restored.
  const ScopedCaptureMode relaxed(cu, CU_STREAM_CAPTURE_MODE_RELAXED);
  StatusOr<ScopedCurrentContext> current = ScopedCurrentContext::make_current(cu, context);
  if (!current.ok()) return Status(current.status().code(), device + ": " + current.status().message());
  StatusOr<CudaKernel> kernel = CudaKernel::load(cu, image.data(), spec);
  if (!kernel.ok()) return Status(kernel.status().code(), device + ": " + kernel.status().message());
  // Never freed: calling threads (and captured graphs) may launch these kernels until the end.
  auto* loaded = new CudaKernel(std::move(*kernel));
  return new CudaDeviceModule{loaded, context};
}

namespace {

// Every ActiveGpus that installed its fork handler (the hook has one; tests may add a few). Never
// shrinks: instances are never destroyed.
constexpr size_t kMaxActiveGpus = 8;
std::array<std::atomic<ActiveGpus*>, kMaxActiveGpus> g_active_gpus{};
std::atomic<size_t> g_active_gpus_count{0};

}  // namespace

void ActiveGpus::install_fork_handler() {
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(&ActiveGpus::before_fork, nullptr, &ActiveGpus::in_child); });
  const size_t i = g_active_gpus_count.fetch_add(1);
  if (i < kMaxActiveGpus) {
    g_active_gpus[i].store(this, std::memory_order_release);
  } else {
    // No handler watches this instance: it must assume the worst after any fork.
    g_active_gpus_count.fetch_sub(1);
    log_line("internal error: too many ActiveGpus; GPU use is not reported");
    inherited_.store(true);
  }
}

bool ActiveGpus::libcuda_loaded() const noexcept {
  void* handle = ::dlopen(libcuda_.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  ::dlclose(handle);   // drops the reference NOLOAD took; the library stays loaded
  return true;
}

void ActiveGpus::before_fork() noexcept {
  const size_t n = std::min(g_active_gpus_count.load(), kMaxActiveGpus);
  for (size_t i = 0; i < n; ++i) {
    ActiveGpus* g = g_active_gpus[i].load(std::memory_order_acquire);
    if (g == nullptr) continue;
    // Once seen, libcuda stays: no dlopen (and no loader lock) in later forks.
    if (!g->seen_.load() && g->libcuda_loaded()) g->seen_.store(true);
    g->loaded_at_fork_.store(g->seen_.load());
  }
}

void ActiveGpus::in_child() noexcept {
  const size_t n = std::min(g_active_gpus_count.load(), kMaxActiveGpus);
  for (size_t i = 0; i < n; ++i) {
    ActiveGpus* g = g_active_gpus[i].load(std::memory_order_acquire);
    if (g != nullptr && g->loaded_at_fork_.load()) g->inherited_.store(true);
  }
}

bool ActiveGpus::may_use_driver() {
  if (inherited_.load()) return false;
  if (!seen_.load()) {
    if (!libcuda_loaded()) return false;
    seen_.store(true);
  }
  return true;
}

std::vector<std::string> ActiveGpus::current() {
  std::vector<std::string> out;
  if (!may_use_driver()) return out;
  StatusOr<const CudaDriver*> driver = CudaDriver::load();
  if (!driver.ok()) return out;
  const CudaDriver& cu = **driver;
  int count = 0;
  if (cu.cuDeviceGetCount(&count) != CUDA_SUCCESS) return out;
  count = std::clamp(count, 0, static_cast<int>(wire::kMaxDevices));
  if (uuids_.size() < static_cast<size_t>(count)) uuids_.resize(static_cast<size_t>(count));
  for (int d = 0; d < count; ++d) {
    CUdevice device = 0;
    unsigned int flags = 0;
    int active = 0;
    if (cu.cuDeviceGet(&device, d) != CUDA_SUCCESS ||
        cu.cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || active == 0) {
      continue;
    }
    std::optional<std::string>& uuid = uuids_[static_cast<size_t>(d)];
    if (!uuid) {
      StatusOr<std::string> u = device_uuid(cu, device);
      uuid = u.ok() ? *u : std::string();
    }
    if (!uuid->empty()) out.push_back(*uuid);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

StatusOr<std::string> cuda_entry_image(const std::vector<BlobRef>& blobs,
                                       const std::function<StatusOr<std::string>(const BlobRef&)>& read) {
  const BlobRef* cubin = nullptr;
  const BlobRef* ptx = nullptr;
  std::string names;
  for (const BlobRef& b : blobs) {
    if (b.name == "cubin" && cubin == nullptr) cubin = &b;
    if (b.name == "ptx" && ptx == nullptr) ptx = &b;
    names += (names.empty() ? "\"" : ", \"") + b.name + "\"";
  }
  const BlobRef* chosen = cubin != nullptr ? cubin : ptx;
  if (chosen == nullptr) {
    return not_found("it has no blob named \"cubin\" or \"ptx\" (its blobs: " +
                     (names.empty() ? std::string("none") : names) + ")");
  }
  StatusOr<std::string> bytes = read(*chosen);
  if (!bytes.ok()) {
    return Status(bytes.status().code(), "blob \"" + chosen->name + "\": " + bytes.status().message());
  }
  if (bytes->empty()) return invalid_argument("blob \"" + chosen->name + "\" is empty");
  if (chosen == ptx && bytes->back() != '\0') bytes->push_back('\0');
  return bytes;
}

}  // namespace kforge::hook
