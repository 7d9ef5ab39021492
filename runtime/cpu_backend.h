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

  // dlcloses the module and closes its memfd. For the evaluation worker only, which loads one
  // module per candidate and must not accumulate them (a serving process never unloads, see
  // above); no entry point of this module may run afterwards.
  void unload();

 private:
  CpuModule(void* handle, std::string name, int fd = -1) : handle_(handle), name_(std::move(name)), fd_(fd) {}
  void* handle_ = nullptr;   // never dlclosed (see above)
  std::string name_;
  int fd_ = -1;              // load_image's memfd, open for as long as the module is loaded
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

// How the blocks of a launch are run. The defaults are the serving path's; the worker sets both
// knobs to make kernels that depend on what they must not depend on give different results.
// Runs body(ctx, begin, end) over [0, n) split into ranges, in parallel, and returns when all are
// done. Callers in a torch process pass one that uses torch's own thread pool (at::parallel_for):
// a second pool (TBB's) beside torch's oversubscribes the cores, and each pool's spinning threads
// slow the other's work.
using CpuParallelFor = void (*)(uint64_t n, void* ctx, void (*body)(void* ctx, uint64_t begin, uint64_t end));

struct CpuRunOptions {
  // Nonzero: the blocks of each launch are started in a pseudo-random order drawn from this seed
  // (another seed, another order) instead of block index order, so a kernel whose result depends
  // on the order blocks run in (a race between blocks) changes its output from run to run.
  uint64_t block_order_seed = 0;
  // 0..255: every block's shared memory is filled with this byte before the block runs, so a
  // kernel that reads shared memory it did not write (or a previous block's) shows it.
  int shared_mem_poison = -1;
  // Null: TBB's parallel_for.
  CpuParallelFor parallel_for = nullptr;
};

Status run_cpu_plan(const CpuModule& module, const KernelSpec& spec, const ResolvedLaunchPlan& plan,
                    const CpuBuffers& buffers, const CpuRunOptions& options = {});

}  // namespace kforge
