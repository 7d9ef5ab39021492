// The CPU backend: loads a candidate's shared object and runs its launch plan on the host.
//
//   StatusOr<CpuModule> m = CpuModule::load_image(so_bytes, "softmax_rows");   // from a cache blob
//   StatusOr<ResolvedLaunchPlan> plan = spec.resolve(sig);
//   CpuBuffers io{.inputs = {x.data_ptr()}, .outputs = {y.data_ptr()}};     // by signature arg / plan output
//   Status s = run_cpu_plan(*m, spec, *plan, io);
//
// Promises:
// - load_image() never touches the file system: the image is written to an anonymous memfd and
//   dlopen'ed from /proc/self/fd. A module is never unloaded (a kernel may still be running, and
//   code the process has called must stay mapped), and its memfd stays open with it (one fd per
//   module), so load each image once.
// - run_cpu_plan() runs the launches in order; each launch calls the entry point once per block of
//   its grid, spread over threads (TBB), and returns after every block finished. Scratch buffers and
//   shared memory are allocated here, 64-byte aligned; outputs are the caller's (the hook allocates
//   them through torch). A plan that references a missing buffer is an error, not a crash.
// - Nothing throws. A kernel that crashes the process cannot be caught here: only verified entries
//   reach this code in a serving process (DESIGN.md, Worker).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/cpu_kernel_abi.h"
#include "runtime/kernel_spec.h"
#include "runtime/status.h"

namespace kforge {

class CpuModule {
 public:
  // Loads a shared object from its bytes. `name` is used in messages and for the memfd's name.
  static StatusOr<CpuModule> load_image(std::string_view image, std::string_view name);
  // Loads a shared object from a file (the worker's build output).
  static StatusOr<CpuModule> load_file(const std::string& path);

  StatusOr<kforge_cpu_entry> entry(const std::string& symbol) const;
  const std::string& name() const noexcept { return name_; }

 private:
  CpuModule(void* handle, std::string name) : handle_(handle), name_(std::move(name)) {}
  void* handle_ = nullptr;   // never dlclosed (see above)
  std::string name_;
};

struct CpuBuffers {
  std::vector<void*> inputs;    // indexed by signature argument; nullptr for non-tensor arguments
  std::vector<void*> outputs;   // indexed by plan output
  // Optional, indexed by plan scratch buffer: the caller's buffers (the worker poisons and guards
  // them). Empty: run_cpu_plan allocates them, uninitialized.
  std::vector<void*> scratch;
};

// The most dynamic shared memory one CPU block may ask for (the CPU backend's "device limit",
// like a GPU's opt-in maximum per block): run_cpu_plan refuses a launch that asks for more.
inline constexpr int64_t kCpuMaxSharedMemBytes = int64_t{1} << 20;

Status run_cpu_plan(const CpuModule& module, const KernelSpec& spec, const ResolvedLaunchPlan& plan,
                    const CpuBuffers& buffers);

}  // namespace kforge
