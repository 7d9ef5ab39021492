#include "search_daemon/worker/op_cost.h"

#include <algorithm>
#include <string>

namespace kforge {

namespace {

double tensor_bytes(const TensorMeta& t) {
  return static_cast<double>(t.numel()) * dtype_size_bytes(t.dtype);
}

// Note [Op cost model]
// FLOPs per element of the op's main input, counting exp/erf/rsqrt as one operation each (the
// roofline here is about memory, and every catalog op is far below the FLOP ceiling):
//   add.Tensor           2 (multiply by alpha, add)
//   silu                 4 (negate, exp, add, divide)
//   gelu                 8 (erf form: scale, erf, add, two multiplies; tanh form about the same)
//   _softmax, _log_softmax   5 (max, subtract, exp, sum, divide or log)
//   native_layer_norm    8 (mean, centre, square, sum, rsqrt, scale, weight, bias)
//   native_group_norm    8
// The element count is the largest tensor input's.
double flops_per_element(std::string_view op) {
  if (op == "aten::add") return 2;
  if (op == "aten::silu") return 4;
  if (op == "aten::gelu") return 8;
  if (op == "aten::_softmax" || op == "aten::_log_softmax") return 5;
  if (op == "aten::native_layer_norm" || op == "aten::native_group_norm") return 8;
  return 0;
}

}  // namespace

OpCost op_cost(const OpSignature& sig, std::span<const ResolvedOutput> outputs) {
  OpCost c;
  double largest = 0;
  for (const Arg& a : sig.args) {
    if (const auto* t = std::get_if<TensorMeta>(&a.value)) {
      c.bytes += tensor_bytes(*t);
      largest = std::max(largest, static_cast<double>(t->numel()));
    } else if (const auto* ts = std::get_if<std::vector<TensorMeta>>(&a.value)) {
      for (const TensorMeta& item : *ts) {
        c.bytes += tensor_bytes(item);
        largest = std::max(largest, static_cast<double>(item.numel()));
      }
    }
  }
  for (const ResolvedOutput& o : outputs) {
    double n = 1;
    for (int64_t s : o.sizes) n *= static_cast<double>(s);
    c.bytes += n * dtype_size_bytes(o.dtype);
  }
  c.flops = flops_per_element(sig.op) * largest;
  return c;
}

}  // namespace kforge
