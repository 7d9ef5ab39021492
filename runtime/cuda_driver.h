// CudaDriver: the CUDA driver API, loaded at run time with dlopen, plus RAII owners for the
// driver handles kforge uses (retained primary context, current-context guard, stream-capture
// mode guard, module, device memory).
//
//   StatusOr<const CudaDriver*> drv = CudaDriver::load();
//   if (!drv.ok()) return drv.status();          // kUnavailable on hosts without a GPU driver
//   const CudaDriver& cu = **drv;
//   int count = 0;
//   KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuDeviceGetCount(&count));
//
// Promises:
// - No link-time dependency on libcuda: the same binary runs, and reports kUnavailable, on hosts
//   without a driver or with only the toolkit's link stub.
// - Each entry point is resolved for the exact ABI version of the prototype cuda.h declares
//   (through cuGetProcAddress where the driver has it, else dlsym of the versioned symbol), so
//   `cu.cuMemAlloc(...)` calls what a program linked against libcuda would call (cuMemAlloc_v2).
// - load() loads once per process, is thread-safe, and never unloads the library.
// - Nothing here throws; errors are Status values that name the call, file, line and CUresult.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace kforge {

// The driver entry points kforge uses, each with the ABI version (the CUDA release that introduced
// that signature) that matches the prototype cuda.h declares for the name: cuGetProcAddress is
// asked for exactly that version. Asking for CUDA_VERSION instead would be wrong: CUDA 13 added
// cuCtxGetDevice_v2(CUdevice*, CUcontext) and cuCtxSynchronize_v2(CUcontext) as the 13.0
// versions, while cuda.h still declares the old one-argument prototypes under the plain names.
// A static_assert in cuda_driver.cc checks every pair against cudaTypedefs.h. Names are written as
// in the CUDA documentation; cuda.h's macros turn some (cuMemAlloc) into the versioned symbol
// (cuMemAlloc_v2), and both the member and every call site see the same expansion.
#define KFORGE_CUDA_DRIVER_REQUIRED(X) \
  X(cuInit, 2000)                      \
  X(cuDriverGetVersion, 2020)          \
  X(cuGetErrorName, 6000)              \
  X(cuGetErrorString, 6000)            \
  X(cuDeviceGetCount, 2000)            \
  X(cuDeviceGet, 2000)                 \
  X(cuDeviceGetName, 2000)             \
  X(cuDeviceGetAttribute, 2000)        \
  X(cuDevicePrimaryCtxRetain, 7000)    \
  X(cuDevicePrimaryCtxRelease, 11000)  \
  X(cuDevicePrimaryCtxGetState, 7000)  \
  X(cuCtxGetCurrent, 4000)             \
  X(cuCtxSetCurrent, 4000)             \
  X(cuCtxPushCurrent, 4000)            \
  X(cuCtxPopCurrent, 4000)             \
  X(cuCtxGetDevice, 2000)              \
  X(cuCtxSynchronize, 2000)            \
  X(cuModuleLoadData, 2000)            \
  X(cuModuleGetFunction, 2000)         \
  X(cuModuleUnload, 2000)              \
  X(cuLaunchKernel, 4000)              \
  X(cuFuncSetAttribute, 9000)          \
  X(cuFuncGetAttribute, 2020)          \
  X(cuMemAlloc, 3020)                  \
  X(cuMemFree, 3020)                   \
  X(cuMemcpyHtoD, 3020)                \
  X(cuMemcpyDtoH, 3020)                \
  X(cuStreamSynchronize, 2000)         \
  X(cuStreamIsCapturing, 10000)        \
  X(cuEventCreate, 2000)               \
  X(cuEventRecord, 2000)               \
  X(cuEventQuery, 2000)                \
  X(cuEventElapsedTime, 2000)          \
  X(cuEventSynchronize, 2000)          \
  X(cuEventDestroy, 4000)              \
  X(cuThreadExchangeStreamCaptureMode, 10010)

// Entry points that may be missing; their members are null when the driver lacks them.
// cuDeviceGetUuid is cuda.h's cuDeviceGetUuid_v2 (11.4+: a MIG instance's own UUID); a driver
// without it gets the plain cuDeviceGetUuid (9.2+, the same prototype) in the same member.
#define KFORGE_CUDA_DRIVER_OPTIONAL(X) \
  X(cuModuleLoadDataEx, 2010)          \
  X(cuDeviceGetUuid, 11040)

class CudaDriver {
 public:
  // The process-wide driver: the first call searches and loads, later calls return the same
  // result (success or failure). Search order: $KFORGE_LIBCUDA if set (and then nothing else:
  // an explicit choice that fails is reported, not silently replaced), else libcuda.so.1, else
  // libcuda.so. Also calls cuInit(0): a driver that loads but has no usable device (or is the
  // toolkit's stub) is kUnavailable.
  static StatusOr<const CudaDriver*> load();

  // load()'s driver, or null where it failed. For callers that cannot report why (destructors, the
  // hook's noexcept paths): they fall back, and whoever needs the reason calls load().
  static const CudaDriver* loaded() noexcept;

  // Same search as load(), without the process-wide cache. For tests and diagnostics.
  static StatusOr<std::unique_ptr<CudaDriver>> load_uncached();

  // Loads exactly `path` (a file path or a soname for the dynamic loader), without caching.
  static StatusOr<std::unique_ptr<CudaDriver>> load_from(const std::string& path);

  // The paths load() would try, in order.
  static std::vector<std::string> search_paths();

  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;
  // Does not dlclose: modules, contexts and function pointers obtained through this driver may
  // outlive it, and unloading libcuda from a process that uses CUDA elsewhere is never safe.
  ~CudaDriver() = default;

  // The loaded file as the dynamic loader resolved it (absolute where it could tell).
  const std::string& library_path() const noexcept { return library_path_; }
  // cuDriverGetVersion: 1000 * major + 10 * minor (13000 is CUDA 13.0).
  int version() const noexcept { return version_; }
  // "CUDA_ERROR_OUT_OF_MEMORY"; "CUresult 123" when the driver does not know the code.
  std::string error_name(CUresult result) const;

  // The Status for a failed call: the statement text, where it was made and the CUresult's name
  // and description. CUDA_SUCCESS gives an ok Status.
  Status error(CUresult result, std::string_view statement, const char* file, int line) const;

#define KFORGE_CU_DECLARE_MEMBER(name, abi_version) PFN_##name##_v##abi_version name = nullptr;
  KFORGE_CUDA_DRIVER_REQUIRED(KFORGE_CU_DECLARE_MEMBER)
  KFORGE_CUDA_DRIVER_OPTIONAL(KFORGE_CU_DECLARE_MEMBER)
#undef KFORGE_CU_DECLARE_MEMBER

 private:
  CudaDriver() = default;
  static StatusOr<std::unique_ptr<CudaDriver>> from_handle(void* handle, const std::string& path);
  Status resolve_entry_points();

  void* handle_ = nullptr;
  std::string library_path_;
  int version_ = 0;
};

// A device's UUID as nvidia-smi prints it and CUDA_VISIBLE_DEVICES accepts it:
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lowercase hex, the 16 bytes in order. The one name
// of a GPU that every process agrees on (ordinals depend on each process's CUDA_VISIBLE_DEVICES).
// A MIG instance's UUID is printed with the same "GPU-" prefix (nvidia-smi writes "MIG-").
std::string gpu_uuid_string(const CUuuid& uuid);
// gpu_uuid_string of `device` (cuDeviceGetUuid); kUnavailable when the driver lacks the call.
StatusOr<std::string> device_uuid(const CudaDriver& driver, CUdevice device);

// Builds the Status for a failed driver call. Separate from CudaDriver so the mapping from
// CUresult to StatusCode is testable without a driver: no device, no driver, out of memory ->
// kUnavailable; bad images and PTX -> kInvalidArgument; missing symbol -> kNotFound; anything
// else -> kInternal.
Status cu_error_status(CUresult result, std::string_view error_name, std::string_view description,
                       std::string_view statement, const char* file, int line);

}  // namespace kforge

// Evaluates a driver call once; on failure returns a Status naming the statement, file, line and
// the CUresult. Use in functions that return Status or StatusOr<T>.
//   KFORGE_CU_RETURN_IF_ERROR(cu, cu.cuMemAlloc(&ptr, bytes));
#define KFORGE_CU_RETURN_IF_ERROR(driver, call)                            \
  do {                                                                     \
    const CUresult kforge_cu_result_ = (call);                             \
    if (kforge_cu_result_ != CUDA_SUCCESS) {                               \
      return (driver).error(kforge_cu_result_, #call, __FILE__, __LINE__); \
    }                                                                      \
  } while (0)

namespace kforge {

// A reference on a device's primary context: the context the CUDA runtime, and so PyTorch, uses
// on that device. Retaining it shares torch's context instead of creating a second one.
// The destructor releases the reference; the context lives on while anyone else holds one.
class PrimaryContext {
 public:
  static StatusOr<PrimaryContext> retain(const CudaDriver& driver, CUdevice device);

  PrimaryContext(PrimaryContext&& other) noexcept;
  PrimaryContext& operator=(PrimaryContext&& other) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  ~PrimaryContext();

  CUcontext get() const noexcept { return context_; }
  CUdevice device() const noexcept { return device_; }

 private:
  PrimaryContext(const CudaDriver* driver, CUdevice device, CUcontext context)
      : driver_(driver), device_(device), context_(context) {}
  void reset() noexcept;

  const CudaDriver* driver_ = nullptr;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

// Makes a context current on this thread for the guard's lifetime and then restores whatever was
// current before (push/pop on the thread's context stack). If the context is already current the
// guard does nothing.
class ScopedCurrentContext {
 public:
  static StatusOr<ScopedCurrentContext> make_current(const CudaDriver& driver, CUcontext context);

  ScopedCurrentContext(ScopedCurrentContext&& other) noexcept;
  ScopedCurrentContext& operator=(ScopedCurrentContext&&) = delete;
  ScopedCurrentContext(const ScopedCurrentContext&) = delete;
  ScopedCurrentContext& operator=(const ScopedCurrentContext&) = delete;
  ~ScopedCurrentContext();

  // True when this guard pushed the context (false: it was already current).
  bool pushed() const noexcept { return driver_ != nullptr; }

 private:
  explicit ScopedCurrentContext(const CudaDriver* driver) : driver_(driver) {}

  const CudaDriver* driver_ = nullptr;  // non-null while a pop is owed
};

// Sets this thread's stream-capture interaction mode (cuThreadExchangeStreamCaptureMode) for the
// guard's lifetime, then restores the previous one. The hook runs its own work that is no part of
// any capture (module loads, shadow comparisons) in CU_STREAM_CAPTURE_MODE_RELAXED: in the default
// global mode, a call the driver deems potentially unsafe while another thread captures a graph in
// global mode fails (and may spoil that capture). If the mode cannot be set the guard does nothing
// (ok() false).
class ScopedCaptureMode {
 public:
  ScopedCaptureMode(const CudaDriver& driver, CUstreamCaptureMode mode) noexcept;
  ScopedCaptureMode(const ScopedCaptureMode&) = delete;
  ScopedCaptureMode& operator=(const ScopedCaptureMode&) = delete;
  ~ScopedCaptureMode();

  bool ok() const noexcept { return driver_ != nullptr; }

 private:
  const CudaDriver* driver_ = nullptr;   // non-null while a restore is owed
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_GLOBAL;
};

// A loaded CUmodule. The destructor unloads it in the context it was loaded in. In the serving
// process modules are never unloaded (a captured CUDA graph may still launch their kernels): call
// release() there and keep the raw handle for the life of the process.
class CudaModule {
 public:
  // Loads a CUBIN, fatbin or NUL-terminated PTX image into the current context.
  static StatusOr<CudaModule> load(const CudaDriver& driver, const void* image);

  CudaModule(CudaModule&& other) noexcept;
  CudaModule& operator=(CudaModule&& other) noexcept;
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;
  ~CudaModule();

  CUmodule get() const noexcept { return module_; }
  // kNotFound when the module has no such entry point.
  StatusOr<CUfunction> function(const std::string& name) const;
  // Gives up ownership without unloading: the module stays loaded for the life of the process.
  CUmodule release() noexcept;

 private:
  CudaModule(const CudaDriver* driver, CUcontext context, CUmodule module)
      : driver_(driver), context_(context), module_(module) {}
  void reset() noexcept;

  const CudaDriver* driver_ = nullptr;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
};

// Device memory from cuMemAlloc in the current context, freed (in that context) by the destructor.
// For the worker and self-tests: in the serving process tensors come from PyTorch's allocator.
class DeviceBuffer {
 public:
  static StatusOr<DeviceBuffer> allocate(const CudaDriver& driver, std::size_t bytes);

  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  CUdeviceptr get() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  DeviceBuffer(const CudaDriver* driver, CUcontext context, CUdeviceptr ptr, std::size_t bytes)
      : driver_(driver), context_(context), ptr_(ptr), bytes_(bytes) {}
  void reset() noexcept;

  const CudaDriver* driver_ = nullptr;
  CUcontext context_ = nullptr;
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace kforge
