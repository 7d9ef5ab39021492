// The replacement path: what an intercepted call does when ReplacementTable has an entry for its
// signature (Note [Swap states] in swapper.h), for CPU and CUDA entries alike. Shadow state runs
// PyTorch's kernel (whose outputs the caller gets) and the entry on the same inputs, times both
// (alternating which runs first; Note [In-process win] in swapper.h), checks that the entry left
// its inputs alone, and compares the outputs against a float64 reference (Note [Shadow
// comparison] in swap_call.cc); active
// state runs the entry alone and falls back to PyTorch's kernel on any error. A CUDA entry runs on
// its inputs' device, on torch's current stream there, with outputs from torch's caching allocator
// (Note [CUDA calls] in swap_call.cc); while that stream is capturing a CUDA graph an active entry
// is launched (and captured) as usual, and a shadow call runs PyTorch's kernel only, uncompared and
// uncounted, because the comparison synchronizes. Calling threads only: no I/O (beyond one log line
// the first time a CUDA call cannot enter its device), no lock but Swapper's on a state change.
//
//   if (r != nullptr) run_replacement(op, *r, handle, keys, stack);   // never inside HookWorkScope
//
// Everything it runs besides the entry (PyTorch's kernel, the reference, the comparison) runs in a
// HookWorkScope (Note [The hook's own tensor work] in hook_work.h).
#pragma once

#include <ATen/core/stack.h>

#include "interposer/hook/intercepted_op.h"
#include "interposer/hook/replacement_table.h"

namespace kforge::hook {

// `stack` holds the op's arguments on top, as the dispatcher passed them; on return it holds the
// op's outputs, as the original kernel would leave them. An exception from PyTorch's own kernel in
// shadow state reaches the caller, as without kforge; kforge's own failures never do.
// `given`: where the plan's outputs go in active state instead of fresh tensors, one per plan
// output (an out= call's tensors, already checked by run_out_replacement); null: fresh tensors.
void run_replacement(const InterceptedOp& op, const Replacement& r, const c10::OperatorHandle& handle,
                     c10::DispatchKeySet keys, torch::jit::Stack* stack, const at::Tensor* given = nullptr);

// An out= call of `functional`'s operator (Note [Out variants] in swap_call.cc) that hit entry r
// for its functional signature. `stack` holds the functional arguments (boxed by the caller),
// `outs` the caller's out tensors. Returns false where the entry cannot write `outs` (the caller
// then runs PyTorch's out kernel, as without kforge); true when `outs` hold the call's result.
bool run_out_replacement(const InterceptedOp& functional, const Replacement& r, c10::DispatchKeySet keys,
                         torch::jit::Stack& stack, c10::ArrayRef<at::Tensor> outs);

}  // namespace kforge::hook
