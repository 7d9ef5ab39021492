// The answer format LlmProposer asks a language model for, and its parser: an answer is text that
// holds exactly one fenced source block and exactly one fenced JSON block (anything around them
// is ignored):
//
//   ```cuda                                   (```cpp for the CPU backend; the tag is not checked)
//   extern "C" __global__ void softmax_rows(const float* x, float* y, long long cols) { ... }
//   ```
//   ```json
//   {
//     "summary": "one block per row, warp-shuffle reductions",
//     "entry_points": ["softmax_rows"],
//     "compile_options": [],                                       (optional)
//     "scratch": [{"name": "partials", "bytes": "size0_0 * 8"}],   (optional)
//     "outputs": [{"like": 0}],
//     "launches": [{"entry": "softmax_rows", "grid": ["size0_0"], "block": [256],
//                   "shared_mem_bytes": "0",                       (optional, default 0)
//                   "args": [{"input": 0}, {"output": 0}, {"size": "size0_1", "type": "int64"}]}]
//   }
//   ```
//
// Outputs: {"like": i} (torch.empty_like(args[i]); optional "dtype") or {"dtype": d, "sizes":
// [...], "strides": [...]} (explicit). Arguments: {"input": i} (tensor argument i's data pointer),
// {"output": k}, {"scratch": k}, {"size": expr, "type": "int64" | "int32"} (type optional, default
// int64), {"scalar": i, "type": "int64" | "int32" | "float64" | "float32" | "bool"}. Every number
// of the plan is a launch expression (runtime/launch_expr.h), written as a JSON string or integer;
// grid and block take 1 to 3 of them (missing ones are 1). Unknown fields are errors, so a typo
// never silently drops part of a plan.
//
//   StatusOr<KernelAnswer> a = parse_kernel_answer(model_text, sig);
//   if (!a.ok()) log("rejected: " + a.status().message());   // "json.launches[0].args[2].type: ..."
//
// Promises: parse_kernel_answer() never throws; what it returns passed KernelSpec::validate() and
// KernelSpec::resolve(sig), has the signature's backend and that backend's language, and every
// entry point appears in the source. A rejection's message says what is wrong and where: a missing
// or unclosed block, the JSON syntax error's line and column, the field path of a bad value, or the
// validate()/resolve() message. plan_json() writes a spec in the same schema, and parsing that back
// gives the same spec.
#pragma once

#include <string>
#include <string_view>

#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"
#include "runtime/status.h"

namespace kforge::llm {

struct KernelAnswer {
  KernelSpec spec;
  std::string summary;   // the first line of the JSON's "summary", trimmed (may be empty)
};

StatusOr<KernelAnswer> parse_kernel_answer(std::string_view text, const OpSignature& sig);

// The JSON block for `spec` (its entry points, options and plan; not its source), pretty-printed.
std::string plan_json(const KernelSpec& spec, std::string_view summary);

// The fence tag the prompt asks for: "cuda" or "cpp".
std::string_view source_fence_tag(Backend backend) noexcept;

}  // namespace kforge::llm
