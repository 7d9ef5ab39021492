// The work an operator call must do, from its signature alone: the fewest bytes it must move
// (every tensor input read once, every output written once) and an estimate of its floating-point
// operations. The worker divides them by the measured time to report achieved bandwidth and FLOP
// rate (DESIGN.md, Worker/Measure), and the daemon's scheduler will use them for the roofline
// floor. Torch-free.
//
//   OpCost c = op_cost(sig, plan.outputs);
//   double gbps = c.bytes / seconds / 1e9;     // c.flops == 0: no FLOP model for this operator
//
// Promises: bytes counts each input tensor's elements (numel x element size; a tensor list's
// elements all count) plus each output's; flops is per-element arithmetic of the op family
// (Note [Op cost model] in op_cost.cc) for the catalog operators, 0 for anything else.
#pragma once

#include <span>
#include <string_view>

#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"

namespace kforge {

struct OpCost {
  double bytes = 0;
  double flops = 0;
};

OpCost op_cost(const OpSignature& sig, std::span<const ResolvedOutput> outputs);

}  // namespace kforge
