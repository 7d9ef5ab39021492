// Registration of kforge's interceptors with PyTorch's dispatcher, once, at load.
//
//   RegistrationSummary r = register_catalog(config, recorder, arch);
//   for (const std::string& s : r.registered) log_line("intercepting " + s);   // "aten::gelu@CPU"
//
// For each catalog operator selected by the configuration, and each of DispatchKey::CPU and
// DispatchKey::CUDA where the operator has a kernel of its own or a CompositeExplicitAutograd one
// (which serves every backend: aten::embedding), the original kernel is captured with
// OperatorHandle::getComputedKernelForDispatchKey and then a boxed interceptor is registered
// at that key through a torch::Library that is never destroyed: registrations race with
// dispatching threads, so kforge never deregisters (later swaps happen in ReplacementTable).
//
// The interceptor (Note [Interceptor fast path] in interceptor.cc) computes the call's signature
// id without heap allocation, looks it up in ReplacementTable, counts the call in the Recorder and,
// on a miss, calls the original kernel with the same stack and dispatch key set. On a hit (CPU
// only; published by the Swapper, swapper.h) it runs the entry in shadow (original first, its
// result returned, then the entry compared against a float64 reference: Note [Shadow comparison])
// or active (the entry alone, falling back to the original on any error) state. An error in kforge's code
// disables that operator (one log line) and it falls through from then on; an exception from the
// original kernel reaches the caller unchanged, as it would without kforge.
// This header is torch-free; interceptor.cc is where torch's dispatcher headers are included.
#pragma once

#include <string>
#include <vector>

#include "interposer/hook/config.h"
#include "interposer/hook/recorder.h"
#include "interposer/hook/target_arch.h"

namespace kforge::hook {

struct RegistrationSummary {
  std::vector<std::string> registered;   // "aten::_softmax@CPU"
  std::vector<std::string> how;          // per registered: "typed", or "boxed" with why (Note [Typed interceptors])
  std::vector<std::string> skipped;      // "aten::_softmax@CUDA: no kernel at this key"
};

// Never throws: a failure skips the operator (or, if the libraries cannot be made, everything)
// with the reason in `skipped`.
// `sampler` (may be null) gets each thread's first call of each signature (input_sampler.h);
// `timer` (may be null: CUDA calls are then not timed) times sampled CUDA calls (cuda_timer.h).
class InputSampler;
class CudaTimer;
RegistrationSummary register_catalog(const HookConfig& config, Recorder& recorder, TargetArch& arch,
                                     InputSampler* sampler, CudaTimer* timer) noexcept;

// For benchmarks only (Note [Bench toggle] in interceptor.cc): with KFORGE_BENCH_TOGGLE=1 at load,
// takes every registered interceptor out of the dispatcher (on = false) or puts it back (on = true).
// Returns "" on success, else why not ("refused: ..." without the variable). The caller guarantees
// that no other thread calls the catalog's operators meanwhile.
std::string set_interceptors_registered(bool on) noexcept;

}  // namespace kforge::hook
