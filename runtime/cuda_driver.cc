#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>
#include <utility>

#include "runtime/shared_library.h"

namespace kforge {
namespace {

#define KFORGE_CU_STRINGIFY_EXPANDED(x) #x
// Expands cuda.h's renaming macros first: KFORGE_CU_STRINGIFY(cuMemAlloc) is "cuMemAlloc_v2".
#define KFORGE_CU_STRINGIFY(x) KFORGE_CU_STRINGIFY_EXPANDED(x)

// The ABI version named in the entry-point list must be the one whose signature cuda.h declares
// under that name: then the pointer cuGetProcAddress returns, the dlsym fallback (the symbol
// cuda.h maps the name to) and every call site agree. A CUDA release that remaps a name to a new
// version fails here instead of crashing at run time.
#define KFORGE_CU_CHECK_ABI(name, abi_version)                                  \
  static_assert(std::is_same_v<decltype(&::name), PFN_##name##_v##abi_version>, \
                "cuda.h declares " #name                                        \
                " with a different signature than ABI version " #abi_version);
KFORGE_CUDA_DRIVER_REQUIRED(KFORGE_CU_CHECK_ABI)
KFORGE_CUDA_DRIVER_OPTIONAL(KFORGE_CU_CHECK_ABI)
#undef KFORGE_CU_CHECK_ABI

template <typename Fn>
void assign_entry_point(Fn& member, void* address) {
  member = reinterpret_cast<Fn>(address);
}

// Cleanup in destructors must run in the owning context (cuMemFree and cuModuleUnload act on the
// current one), but must not leave a different context current for the caller. Errors are
// ignored: a destructor has nowhere to report them, and after a sticky error nothing can be freed.
template <typename Fn>
void in_context(const CudaDriver& driver, CUcontext context, Fn&& fn) noexcept {
  CUcontext current = nullptr;
  bool pushed = false;
  if (context != nullptr && driver.cuCtxGetCurrent(&current) == CUDA_SUCCESS &&
      current != context) {
    pushed = driver.cuCtxPushCurrent(context) == CUDA_SUCCESS;
  }
  fn();
  if (pushed) {
    CUcontext popped = nullptr;
    (void)driver.cuCtxPopCurrent(&popped);
  }
}

}  // namespace

Status cu_error_status(CUresult result, std::string_view error_name, std::string_view description,
                       std::string_view statement, const char* file, int line) {
  if (result == CUDA_SUCCESS) return Status();
  std::string message(statement);
  message += " failed at ";
  message += file != nullptr ? file : "?";
  message += ':';
  message += std::to_string(line);
  message += ": ";
  message += error_name;
  if (!description.empty()) {
    message += " (";
    message += description;
    message += ')';
  }
  StatusCode code = StatusCode::kInternal;
  switch (result) {
    // The host lacks something: a device, a working driver, free memory, permission.
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_NOT_PERMITTED:
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND: code = StatusCode::kUnavailable; break;
    // The image handed to the driver is unusable here: a candidate's problem, not kforge's.
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_INVALID_SOURCE: code = StatusCode::kInvalidArgument; break;
    case CUDA_ERROR_NOT_FOUND: code = StatusCode::kNotFound; break;
    default: break;
  }
  return Status(code, std::move(message));
}

std::vector<std::string> CudaDriver::search_paths() {
  // An explicit override is the only candidate: silently falling back to another driver would
  // hide a misconfiguration behind a different driver version.
  if (const char* env = std::getenv("KFORGE_LIBCUDA"); env != nullptr && env[0] != '\0') {
    return {env};
  }
  return {"libcuda.so.1", "libcuda.so"};
}

StatusOr<const CudaDriver*> CudaDriver::load() {
  // Leaked on purpose: libcuda stays loaded and callable until the process is gone, including
  // from other libraries' static destructors that run after ours.
  static const StatusOr<const CudaDriver*>* const loaded = [] {
    StatusOr<std::unique_ptr<CudaDriver>> driver = load_uncached();
    if (!driver.ok()) return new StatusOr<const CudaDriver*>(driver.status());
    return new StatusOr<const CudaDriver*>(driver->release());
  }();
  return *loaded;
}

const CudaDriver* CudaDriver::loaded() noexcept {
  StatusOr<const CudaDriver*> d = load();
  return d.ok() ? *d : nullptr;
}

StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::load_uncached() {
  std::string tried;
  for (const std::string& path : search_paths()) {
    // RTLD_LOCAL: we call through our own pointers and must not inject libcuda's symbols into the
    // global namespace of a process that did not ask for them. If the process already has libcuda
    // (PyTorch's runtime loads it), this returns that same copy.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    // A driver that opens but cannot serve (stub, no device) ends the search: the next name would
    // resolve to the same installation, and its reason is the one worth reporting.
    if (handle != nullptr) return from_handle(handle, path);
    if (!tried.empty()) tried += "; ";
    tried += dl_failure(path);
  }
  const char* env = std::getenv("KFORGE_LIBCUDA");
  return unavailable(std::string("no CUDA driver found") +
                     (env != nullptr && env[0] != '\0' ? " (from KFORGE_LIBCUDA)" : "") +
                     "; tried " + tried);
}

StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::load_from(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return unavailable("no CUDA driver found; tried " + dl_failure(path));
  }
  return from_handle(handle, path);
}

// The handle is never closed, also on failure: cuInit may have run, and a driver that started
// threads must not be unmapped under them.
StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::from_handle(void* handle,
                                                              const std::string& path) {
  std::unique_ptr<CudaDriver> driver(new CudaDriver());
  driver->handle_ = handle;
  driver->library_path_ = loaded_library_path(handle, path);
  KFORGE_RETURN_IF_ERROR(driver->resolve_entry_points());

  // The toolkit's link stub (lib64/stubs/libcuda.so, often on LD_LIBRARY_PATH of build hosts)
  // exports every symbol and fails every call; say so rather than show a bare error number.
  const CUresult version = driver->cuDriverGetVersion(&driver->version_);
  if (version == CUDA_ERROR_STUB_LIBRARY) {
    return unavailable("CUDA driver at " + driver->library_path_ +
                       " is the toolkit's link stub, not a driver (no GPU driver on this host)");
  }
  if (version != CUDA_SUCCESS) {
    Status s = driver->error(version, "cuDriverGetVersion(&version)", __FILE__, __LINE__);
    return unavailable("CUDA driver at " + driver->library_path_ + " is unusable: " + s.message());
  }
  const CUresult init = driver->cuInit(0);
  if (init != CUDA_SUCCESS) {
    Status s = driver->error(init, "cuInit(0)", __FILE__, __LINE__);
    return unavailable("CUDA driver at " + driver->library_path_ +
                       " has no usable device: " + s.message());
  }
  return driver;
}

Status CudaDriver::resolve_entry_points() {
  PFN_cuGetProcAddress_v12000 get_proc_v2 = nullptr;
  PFN_cuGetProcAddress_v11030 get_proc_v1 = nullptr;
  // cuGetProcAddress_v2 is CUDA 12.0+, cuGetProcAddress (v1) 11.3+. Older drivers only have the
  // exported versioned symbols, which dlsym finds.
  if (void* p = dlsym(handle_, "cuGetProcAddress_v2"); p != nullptr) {
    assign_entry_point(get_proc_v2, p);
  } else if (void* p1 = dlsym(handle_, "cuGetProcAddress"); p1 != nullptr) {
    assign_entry_point(get_proc_v1, p1);
  }

  // The legacy-stream flag matches the default-stream semantics cuda.h gives without
  // CUDA_API_PER_THREAD_DEFAULT_STREAM (and that PyTorch uses).
  auto lookup = [&](const char* base_name, int abi_version, const char* versioned_name) -> void* {
    void* fn = nullptr;
    if (get_proc_v2 != nullptr) {
      CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      if (get_proc_v2(base_name, &fn, abi_version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found) ==
              CUDA_SUCCESS &&
          found == CU_GET_PROC_ADDRESS_SUCCESS && fn != nullptr) {
        return fn;
      }
    } else if (get_proc_v1 != nullptr) {
      if (get_proc_v1(base_name, &fn, abi_version, CU_GET_PROC_ADDRESS_LEGACY_STREAM) ==
              CUDA_SUCCESS &&
          fn != nullptr) {
        return fn;
      }
    }
    return dlsym(handle_, versioned_name);
  };

  std::string missing;
#define KFORGE_CU_RESOLVE_REQUIRED(name, abi_version)                                  \
  if (void* p = lookup(#name, abi_version, KFORGE_CU_STRINGIFY(name)); p != nullptr) { \
    assign_entry_point(name, p);                                                       \
  } else {                                                                             \
    missing += missing.empty() ? "" : ", ";                                            \
    missing += KFORGE_CU_STRINGIFY(name);                                              \
  }
#define KFORGE_CU_RESOLVE_OPTIONAL(name, abi_version)                                  \
  if (void* p = lookup(#name, abi_version, KFORGE_CU_STRINGIFY(name)); p != nullptr) { \
    assign_entry_point(name, p);                                                       \
  }
  KFORGE_CUDA_DRIVER_REQUIRED(KFORGE_CU_RESOLVE_REQUIRED)
  KFORGE_CUDA_DRIVER_OPTIONAL(KFORGE_CU_RESOLVE_OPTIONAL)
#undef KFORGE_CU_RESOLVE_REQUIRED
#undef KFORGE_CU_RESOLVE_OPTIONAL
  // Drivers before 11.4 have only the first cuDeviceGetUuid, whose prototype is the same.
  static_assert(std::is_same_v<PFN_cuDeviceGetUuid_v9020, PFN_cuDeviceGetUuid_v11040>);
  if (cuDeviceGetUuid == nullptr) {
    if (void* p = lookup("cuDeviceGetUuid", 9020, "cuDeviceGetUuid"); p != nullptr) {
      assign_entry_point(cuDeviceGetUuid, p);
    }
  }

  if (!missing.empty()) {
    return unavailable("CUDA driver at " + library_path_ + " lacks " + missing +
                       " (driver too old for kforge)");
  }
  return Status();
}

std::string CudaDriver::error_name(CUresult result) const {
  const char* name = nullptr;
  if (cuGetErrorName != nullptr && cuGetErrorName(result, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  return "CUresult " + std::to_string(static_cast<int>(result));
}

Status CudaDriver::error(CUresult result, std::string_view statement, const char* file,
                         int line) const {
  if (result == CUDA_SUCCESS) return Status();
  const char* description = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(result, &description) != CUDA_SUCCESS) {
    description = nullptr;
  }
  Status status = cu_error_status(result, error_name(result),
                                  description != nullptr ? description : "", statement, file, line);
  // Which device failed matters on multi-GPU hosts; ask only when a context is current, so the
  // query cannot itself create or change one.
  CUcontext current = nullptr;
  CUdevice device = 0;
  if (cuCtxGetCurrent != nullptr && cuCtxGetCurrent(&current) == CUDA_SUCCESS &&
      current != nullptr && cuCtxGetDevice(&device) == CUDA_SUCCESS) {
    return Status(status.code(), status.message() + " [device " + std::to_string(device) + "]");
  }
  return status;
}

std::string gpu_uuid_string(const CUuuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (size_t i = 0; i < sizeof uuid.bytes; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto b = static_cast<unsigned char>(uuid.bytes[i]);
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

StatusOr<std::string> device_uuid(const CudaDriver& driver, CUdevice device) {
  if (driver.cuDeviceGetUuid == nullptr) {
    return unavailable("CUDA driver at " + driver.library_path() + " has no cuDeviceGetUuid");
  }
  CUuuid uuid{};
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuDeviceGetUuid(&uuid, device));
  return gpu_uuid_string(uuid);
}

// ---- PrimaryContext ----------------------------------------------------------------------------

StatusOr<PrimaryContext> PrimaryContext::retain(const CudaDriver& driver, CUdevice device) {
  CUcontext context = nullptr;
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuDevicePrimaryCtxRetain(&context, device));
  return PrimaryContext(&driver, device, context);
}

PrimaryContext::PrimaryContext(PrimaryContext&& other) noexcept
    : driver_(std::exchange(other.driver_, nullptr)),
      device_(other.device_),
      context_(std::exchange(other.context_, nullptr)) {}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& other) noexcept {
  if (this != &other) {
    reset();
    driver_ = std::exchange(other.driver_, nullptr);
    device_ = other.device_;
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

PrimaryContext::~PrimaryContext() { reset(); }

void PrimaryContext::reset() noexcept {
  if (context_ != nullptr && driver_ != nullptr) {
    (void)driver_->cuDevicePrimaryCtxRelease(device_);
  }
  context_ = nullptr;
  driver_ = nullptr;
}

// ---- ScopedCurrentContext ----------------------------------------------------------------------

StatusOr<ScopedCurrentContext> ScopedCurrentContext::make_current(const CudaDriver& driver,
                                                                  CUcontext context) {
  if (context == nullptr) return invalid_argument("make_current: null context");
  CUcontext current = nullptr;
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuCtxGetCurrent(&current));
  if (current == context) return ScopedCurrentContext(nullptr);
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuCtxPushCurrent(context));
  return ScopedCurrentContext(&driver);
}

ScopedCurrentContext::ScopedCurrentContext(ScopedCurrentContext&& other) noexcept
    : driver_(std::exchange(other.driver_, nullptr)) {}

ScopedCurrentContext::~ScopedCurrentContext() {
  if (driver_ != nullptr) {
    CUcontext popped = nullptr;
    (void)driver_->cuCtxPopCurrent(&popped);
  }
}

// ---- ScopedCaptureMode -------------------------------------------------------------------------

ScopedCaptureMode::ScopedCaptureMode(const CudaDriver& driver, CUstreamCaptureMode mode) noexcept {
  // The call swaps: `mode` in, the thread's previous mode out.
  CUstreamCaptureMode exchanged = mode;
  if (driver.cuThreadExchangeStreamCaptureMode(&exchanged) == CUDA_SUCCESS) {
    driver_ = &driver;
    previous_ = exchanged;
  }
}

ScopedCaptureMode::~ScopedCaptureMode() {
  if (driver_ != nullptr) {
    CUstreamCaptureMode restore = previous_;
    (void)driver_->cuThreadExchangeStreamCaptureMode(&restore);
  }
}

// ---- CudaModule --------------------------------------------------------------------------------

StatusOr<CudaModule> CudaModule::load(const CudaDriver& driver, const void* image) {
  if (image == nullptr) return invalid_argument("CudaModule::load: null image");
  CUcontext context = nullptr;
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuCtxGetCurrent(&context));
  if (context == nullptr) return internal_error("CudaModule::load: no CUDA context is current");
  CUmodule module = nullptr;
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuModuleLoadData(&module, image));
  return CudaModule(&driver, context, module);
}

CudaModule::CudaModule(CudaModule&& other) noexcept
    : driver_(std::exchange(other.driver_, nullptr)),
      context_(std::exchange(other.context_, nullptr)),
      module_(std::exchange(other.module_, nullptr)) {}

CudaModule& CudaModule::operator=(CudaModule&& other) noexcept {
  if (this != &other) {
    reset();
    driver_ = std::exchange(other.driver_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
    module_ = std::exchange(other.module_, nullptr);
  }
  return *this;
}

CudaModule::~CudaModule() { reset(); }

void CudaModule::reset() noexcept {
  if (module_ != nullptr && driver_ != nullptr) {
    const CudaDriver& driver = *driver_;
    CUmodule module = module_;
    in_context(driver, context_, [&] { (void)driver.cuModuleUnload(module); });
  }
  driver_ = nullptr;
  context_ = nullptr;
  module_ = nullptr;
}

StatusOr<CUfunction> CudaModule::function(const std::string& name) const {
  if (module_ == nullptr) return internal_error("CudaModule::function on an empty module");
  CUfunction fn = nullptr;
  KFORGE_CU_RETURN_IF_ERROR(*driver_, driver_->cuModuleGetFunction(&fn, module_, name.c_str()));
  return fn;
}

CUmodule CudaModule::release() noexcept {
  driver_ = nullptr;
  context_ = nullptr;
  return std::exchange(module_, nullptr);
}

// ---- DeviceBuffer ------------------------------------------------------------------------------

StatusOr<DeviceBuffer> DeviceBuffer::allocate(const CudaDriver& driver, std::size_t bytes) {
  if (bytes == 0) return invalid_argument("DeviceBuffer::allocate: zero bytes");
  CUcontext context = nullptr;
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuCtxGetCurrent(&context));
  if (context == nullptr)
    return internal_error("DeviceBuffer::allocate: no CUDA context is current");
  CUdeviceptr ptr = 0;
  KFORGE_CU_RETURN_IF_ERROR(driver, driver.cuMemAlloc(&ptr, bytes));
  return DeviceBuffer(&driver, context, ptr, bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : driver_(std::exchange(other.driver_, nullptr)),
      context_(std::exchange(other.context_, nullptr)),
      ptr_(std::exchange(other.ptr_, 0)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    driver_ = std::exchange(other.driver_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() noexcept {
  if (ptr_ != 0 && driver_ != nullptr) {
    const CudaDriver& driver = *driver_;
    CUdeviceptr ptr = ptr_;
    in_context(driver, context_, [&] { (void)driver.cuMemFree(ptr); });
  }
  driver_ = nullptr;
  context_ = nullptr;
  ptr_ = 0;
  bytes_ = 0;
}

}  // namespace kforge
