// CudaDevices: the process's CUDA devices as the hook's loader sees them, and loading a CUDA cache
// entry's machine code onto one of them (Note [Environment rule] in swapper.h). ActiveGpus: which
// GPUs the process uses, for the daemon (HotReport.gpus_in_use).
//
//   CudaDevices& devs = *new CudaDevices("2.11.0+cu130");    // reporter thread only, never freed
//   if (devs.driver() == nullptr) log(devs.error());
//   for (int d = 0; d < devs.count(); ++d) {
//     const StatusOr<Environment>& env = devs.environment(d);   // computed once per device
//     StatusOr<bool> ready = devs.primary_context_active(d);    // has torch initialized it?
//     if (env.ok() && entry_environment_matches(*env, entry.environment) && ready.ok() && *ready) {
//       StatusOr<const CudaDeviceModule*> m = devs.load(d, image, spec);
//     }
//   }
//
// Promises:
// - Used by the reporter thread only (no locks). Nothing throws; errors are Status values naming
//   the device and the driver call.
// - The driver is loaded on first use only (CudaDriver::load()), so a process that reports no
//   CUDA signature never loads it here. By then torch has initialized CUDA; cuInit is a no-op.
// - A device's environment is cuda_device_environment(driver, d, torch version, 0): the hook has
//   no NVRTC, and the environment rule ignores nvrtc_version.
// - Never creates a context: load() refuses a device whose primary context is not active, and
//   retains the primary context (torch's) once per device, never releasing it. During a load that
//   context is current on this thread and this thread's stream-capture mode is relaxed (so the load
//   neither fails nor disturbs a graph another thread captures in global mode); both are restored.
// - Loaded modules and their CudaDeviceModule are never freed or unloaded.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/entry.h"
#include "interposer/hook/replacement_table.h"
#include "runtime/cuda_driver.h"
#include "runtime/environment.h"
#include "runtime/kernel_spec.h"
#include "runtime/status.h"

namespace kforge::hook {

class CudaDevices {
 public:
  explicit CudaDevices(std::string torch_version) : torch_version_(std::move(torch_version)) {}
  CudaDevices(const CudaDevices&) = delete;
  CudaDevices& operator=(const CudaDevices&) = delete;

  // The process-wide driver, or null (error() says why).
  const CudaDriver* driver();
  const std::string& error() const noexcept { return error_; }
  // The visible devices, at most CudaModules::kMaxDevices; 0 without a driver.
  int count();
  // Device `ordinal`'s cache environment, computed on first use and kept (success or failure).
  const StatusOr<Environment>& environment(int ordinal);
  // Whether the device's primary context is active (torch has initialized the device).
  StatusOr<bool> primary_context_active(int ordinal);
  // Loads `image` (a CUBIN, or NUL-terminated PTX) and every entry point of `spec` into device
  // `ordinal`'s primary context, which must be active.
  StatusOr<const CudaDeviceModule*> load(int ordinal, const std::string& image, const KernelSpec& spec);

 private:
  struct Device {
    std::optional<StatusOr<Environment>> environment;
    std::optional<PrimaryContext> primary;   // retained on first load; never released
  };
  bool valid(int ordinal);

  const std::string torch_version_;
  bool tried_ = false;
  const CudaDriver* driver_ = nullptr;
  std::string error_;
  int count_ = 0;
  std::vector<Device> devices_;
};

// ActiveGpus: the UUIDs of the GPUs on which this process has an active primary context, i.e. the
// devices torch has initialized: what the daemon needs to know to flag timings on a GPU that a
// serving process uses (HotReport.gpus_in_use).
//
//   ActiveGpus& gpus = *new ActiveGpus();     // at load; never freed
//   gpus.install_fork_handler();              // after the Recorder's (see below)
//   report.gpus_in_use = gpus.current();      // reporter thread, every round
//
// Promises:
// - Never initializes CUDA in a process that has not: the driver is used only once `libcuda`
//   ("libcuda.so.1") is already in the process (dlopen RTLD_NOLOAD; torch loads it when it first
//   uses CUDA; Hello's devices follow the same rule through may_use_driver()), and never creates
//   or retains a context
//   (cuDevicePrimaryCtxGetState only).
// - Never calls the driver in a process forked from one that had libcuda loaded, nor in that
//   process's own forks: CUDA is undefined there (and torch refuses such a child CUDA). A child
//   forked before the parent loaded libcuda (a server's workers forked from a master that only
//   imported torch) uses its own CUDA, and reports it. The fork handler decides this in the forking
//   thread: one dlopen RTLD_NOLOAD per fork until libcuda has been seen, nothing after.
// - current() runs on the reporter thread only (no locks); nothing throws; a device whose state or
//   UUID the driver cannot give is left out. UUIDs are read once per ordinal. Sorted.
// - Never destroyed (the fork handler refers to it).
class ActiveGpus {
 public:
  explicit ActiveGpus(std::string libcuda = "libcuda.so.1") : libcuda_(std::move(libcuda)) {}
  ActiveGpus(const ActiveGpus&) = delete;
  ActiveGpus& operator=(const ActiveGpus&) = delete;
  ~ActiveGpus() = delete;

  // Registers the fork handler, once. Call it after the Recorder has registered its own: prepare
  // handlers run in reverse order, so this one's dlopen (the loader's lock) runs before the
  // Recorder takes its mutex, which a thread inside dlopen may be waiting for.
  void install_fork_handler();
  // The UUIDs (gpu_uuid_string) of the devices whose primary context is active now; empty without
  // CUDA in the process, or where may_use_driver() is false.
  std::vector<std::string> current();
  // libcuda is in the process, and was not inherited through fork.
  bool may_use_driver();

 private:
  static void before_fork() noexcept;
  static void in_child() noexcept;
  bool libcuda_loaded() const noexcept;

  const std::string libcuda_;
  std::atomic<bool> seen_{false};              // libcuda was in the process (it is never unloaded)
  std::atomic<bool> loaded_at_fork_{false};    // ... when the last fork began
  std::atomic<bool> inherited_{false};         // this process is a fork of one that had it
  std::vector<std::optional<std::string>> uuids_;   // per ordinal, read once ("" failed)
};

// The machine code of a CUDA entry, ready for CudaDevices::load: the blob named "cubin", else the
// one named "ptx" (a NUL is appended when the PTX text lacks one, so the driver never reads past
// it). `read` reads a blob (Store::read_blob). Errors name the entry's blobs.
StatusOr<std::string> cuda_entry_image(const std::vector<BlobRef>& blobs,
                                       const std::function<StatusOr<std::string>(const BlobRef&)>& read);

}  // namespace kforge::hook
