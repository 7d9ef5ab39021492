// The kernel template library: parameterized kernels for the catalog operators, CUDA (compiled by
// NVRTC at run time) and CPU (C++ against runtime/cpu_kernel_abi.h). A template ("family") is a
// kernel source with knobs (block size, vector width, rows per block, algorithm variant, ...); a
// point of its knob space, a TemplateConfig, instantiates to a complete KernelSpec: the source, the
// knobs as -D compile options, and a launch plan written in the signature's named sizes.
//
//   const OpSignature& sig = ...;                                  // aten::_softmax, cuda, float16
//   for (const KernelTemplate* t : templates_for(sig)) {
//     for (const TemplateConfig& c : enumerate_space(sig, *t)) {    // every valid configuration
//       KernelSpec spec = t->instantiate(sig, c.values);           // validates and resolves for sig
//       std::string l = label(*t, c);    // "softmax.block_row algo=two_pass block=256 row_lanes=32 vec=8 cache=1"
//     }
//   }
//
// The families and their knobs (the source of each says what the knobs do):
//   softmax, log_softmax, layer_norm   map {block_row, warp_row} (a row per block, or per row_lanes
//                                      lanes), algo {two_pass, online | welford}, block {32..1024},
//                                      row_lanes {4, 8, 16, 32}, vec {1, 2, 4, 8}, cache {0, 1}
//   softmax_split, log_softmax_split   split {1..64} (blocks per row), block {128..1024}, vec {1, 2, 4, 8}
//                                      (up to 16 bytes, at any alignment), cache {0, 1} (shared memory)
//   cumsum_split                       block {64..512}, split {2..64} (segments per column), vec
//   group_norm                         algo {two_pass, welford}, block {64..1024}, vec
//   gelu, silu, add                    block {64..1024}, vec, items {1, 2, 4, 8} (vectors per thread)
//   cpu.softmax, cpu.log_softmax,      algo, rows {1..64} (rows per block), lanes {1, 4, 8, 16}
//   cpu.layer_norm, cpu.group_norm     (independent accumulators per reduction)
//   cpu.gelu, cpu.silu, cpu.add        chunk {1024..262144} (elements per block)
// CUDA: float32, float16, bfloat16; CPU: float32. gelu's approximate mode, weight and bias being
// present, the dtype and (CPU) the host's x86-64 level come from the signature, not from knobs.
//
// Promises:
// - Family names are unique in the library; CPU families start with "cpu.". A label names its family
//   and every knob, and parse_label(label(t, c)) == c.
// - enumerate_space() lists exactly the configurations valid for the signature (vector widths only
//   where every tensor's alignment and the sizes allow them, no threads or rows that would have no
//   work, register caches only where the row fits), in a fixed order. Each one instantiates to a
//   spec that passes KernelSpec::validate() and resolve(sig).
// - A spec computes exactly what PyTorch's kernel computes for the signature (outputs with PyTorch's
//   dtypes, sizes and strides), as accurately: statistics accumulate in float64 where PyTorch's
//   would be the limit (float32 rows, the float32 mean/rstd of layer_norm), 16-bit types in float.
// - The plan uses only the signature's named sizes, so a spec serves every signature of the same
//   operator, dtype, rank and argument kinds for which its configuration is valid; the kernels take
//   the row count and length as arguments and handle rows of any length.
// - Everything here is deterministic and torch-free; nothing throws.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"

namespace kforge::search::templates {

// One tunable dimension of a family.
struct Knob {
  std::string name;                 // "block", "vec", "algo"
  std::vector<int64_t> values;      // the knob's domain, in order (ordered knobs step along it)
  std::vector<std::string> names;   // categorical knobs: one name per value; empty for numbers

  bool categorical() const noexcept { return !names.empty(); }
  std::string value_text(int64_t v) const;   // "256", "online"
};

// A point of a family's knob space.
struct TemplateConfig {
  std::string family;              // KernelTemplate::family()
  std::vector<int64_t> values;     // one per knob, in knobs() order
  friend bool operator==(const TemplateConfig&, const TemplateConfig&) = default;
  friend auto operator<=>(const TemplateConfig&, const TemplateConfig&) = default;
};

class KernelTemplate {
 public:
  virtual ~KernelTemplate() = default;
  // Unique in the library: "softmax", "layer_norm", "gelu", ..., "cpu.softmax", ...
  virtual std::string_view family() const noexcept = 0;
  virtual Backend backend() const noexcept = 0;
  virtual const std::vector<Knob>& knobs() const noexcept = 0;
  // Whether the family handles this signature at all: operator, overload, backend, dtypes, layout,
  // scalar arguments.
  virtual bool applies(const OpSignature& sig) const = 0;
  // Whether `values` is a valid configuration for `sig` (given applies(sig)). Callers use
  // is_valid(), which also checks the domain and that the plan resolves.
  virtual bool valid(const OpSignature& sig, std::span<const int64_t> values) const = 0;
  // How good the configuration is expected to be for `sig`, in (0, 1]: the proposer's prior.
  virtual double prior(const OpSignature& sig, std::span<const int64_t> values) const = 0;
  // The kernel (precondition: is_valid(sig, values)).
  virtual KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> values) const = 0;
};

// Every family, CUDA and CPU, in a fixed order.
std::span<const KernelTemplate* const> template_library();
const KernelTemplate* find_template(std::string_view family);
// The families that apply to `sig` (usually one).
std::vector<const KernelTemplate*> templates_for(const OpSignature& sig);

// Every value in its knob's domain, valid() for `sig`, and the instantiated plan resolves for it.
bool is_valid(const KernelTemplate& t, const OpSignature& sig, std::span<const int64_t> values);

// The whole valid space of one family for `sig`, in lexicographic order of knob indices; empty
// when the family does not apply.
std::vector<TemplateConfig> enumerate_space(const OpSignature& sig, const KernelTemplate& t);
// The union over templates_for(sig), family by family.
std::vector<TemplateConfig> enumerate_space(const OpSignature& sig);

// The valid configurations one knob away from `c` (for an ordered knob: the nearest valid value on
// each side; for a categorical one: every other valid value), knob by knob.
std::vector<TemplateConfig> neighbours(const OpSignature& sig, const TemplateConfig& c);

// "softmax.block_row algo=two_pass block=256 row_lanes=32 vec=8 cache=1": the family, then the first knob's
// name after a dot when that knob is categorical, then every other knob as name=value.
std::string label(const KernelTemplate& t, const TemplateConfig& c);
// The inverse of label(); nullopt for anything that is not a label of this library.
std::optional<TemplateConfig> parse_label(std::string_view text);

}  // namespace kforge::search::templates
