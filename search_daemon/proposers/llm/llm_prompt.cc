#include "search_daemon/proposers/llm/llm_prompt.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <variant>
#include <vector>

#include "runtime/accuracy.h"
#include "runtime/op_catalog.h"
#include "search_daemon/proposers/llm/kernel_answer.h"
#include "search_daemon/worker/cpu_kernel_abi_text.h"

namespace kforge::llm {

namespace {

using search::Node;
using search::Outcome;
using search::ProposalRequest;
using eval::EvalStatus;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string join_ints(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

std::string cut(std::string_view s, size_t max, std::string_view what) {
  if (s.size() <= max) return std::string(s);
  return std::string(s.substr(0, max)) + "\n[... " + std::string(what) + " cut: " + std::to_string(s.size() - max) +
         " more bytes]\n";
}

// ---- the system message ------------------------------------------------------------------------

constexpr std::string_view kRules = R"txt(You write kernels for kforge, which replaces one PyTorch operator call (one exact signature: dtypes, sizes, strides, scalar arguments) with a faster kernel. A candidate is used only if it is correct for every input of that signature and faster than PyTorch's own kernel.

Every candidate is checked against PyTorch on fresh inputs from several distributions (normal, uniform, large magnitudes, zeros, and the real process's inputs):
- its error against a float64 reference must be at most 2x PyTorch's own error (max-abs and relative L2) plus a tiny floor; NaN and Inf must appear exactly where PyTorch's output has them;
- two runs must give bitwise identical results (no races, no floating-point atomics whose order varies);
- every element of every output must be written, nothing outside the outputs and scratch buffers, and no input may be modified;
- outputs must have exactly PyTorch's sizes, strides and dtype (the operator's description says what they are).
Options that trade accuracy for speed are refused (--use_fast_math, -ftz=true, -prec-div=false, -prec-sqrt=false, -ffast-math).
Then it is timed against PyTorch's kernel, interleaved, median of many runs.
)txt";

constexpr std::string_view kCudaBackend = R"txt(Backend: CUDA. The source is compiled at run time by NVRTC for the GPU's exact architecture (ARCH) with no include path: write no #include at all (not cuda_fp16.h, cuda_bf16.h, stdint.h or any other). Use long long / unsigned long long for 64-bit integers. Device code only: extern "C" __global__ entry points (their names go in entry_points) and __device__ helpers; no host code, no device-side launches, no printf, no malloc. CUDA built-ins are there: threadIdx, blockIdx, blockDim, gridDim, __syncthreads, warp shuffles (__shfl_xor_sync etc., warp size 32), __ldg, expf, logf, erff, tanhf, sqrtf, rsqrtf, fmaxf, the double versions, __float_as_uint, __uint_as_float. Dynamic shared memory is `extern __shared__ unsigned char smem[];`, sized by the launch's shared_mem_bytes (over 48 KiB is allowed; kforge opts in).
float16 and bfloat16 data are raw 16-bit values: take them as unsigned short pointers and convert with
  __device__ float bf16_to_float(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
  __device__ unsigned short float_to_bf16(float f) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
  __device__ float half_to_float(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
  __device__ unsigned short float_to_half(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
Kernel parameters come in the plan's args order: a tensor or scratch buffer is a device pointer (const for inputs), a size is long long (int64) or int (int32), a scalar is long long, int, double, float or bool as its type says.
)txt";

constexpr std::string_view kCpuBackend = R"txt(Backend: CPU. The source is C++17, compiled by the host's compiler as `c++ -std=c++17 -O2 -fPIC -shared` plus your compile_options, which may only be -O0..-O3, -Os, -march=..., -mtune=..., -f<feature> / -fno-<feature> (no fast-math), -D / -U macros and -std=.... It may include "runtime/cpu_kernel_abi.h" and standard headers, but the built object may call only the math library and memcpy/memmove/memset: no threads, no allocation (new, malloc, std::vector), no I/O, no exceptions.
Each entry point has this C ABI (the header runtime/cpu_kernel_abi.h, verbatim):
```c
ABI_TEXT
```
kforge calls the entry point once per block of the launch's grid, from several threads at once and in any order, so give each block a disjoint part of the output and keep per-call state in locals (or the block's shared_mem). params[i] points at the value of the plan's i-th argument: a tensor or buffer is `*(const float* const*)params[i]` (its type as the dtype says), an int64 size `*(const int64_t*)params[i]`, a float64 scalar `*(const double*)params[i]`, and so on.
float16 and bfloat16 data are raw uint16_t values: convert with bit operations (bfloat16: the high half of a float32; round to nearest even when narrowing, and keep NaN a NaN).
)txt";

constexpr std::string_view kPlanLanguage = R"txt(The launch plan (the json block) says, with no host code, how kforge runs the kernel:
- Every number is an integer expression over the signature's named sizes (listed with the task): + - * / % with C semantics on int64 (overflow is an error), parentheses, and ceil_div(a, b), round_up(a, b), min(a, b, ...), max(a, b, ...), clamp(x, lo, hi), select(c, a, b) (c != 0 ? a : b). Example: "ceil_div(numel0, 256)". Write an expression as a JSON string (a plain integer may be a JSON number).
- Names, for the signature's argument at position i (every argument counts, tensors and scalars alike): a tensor has ndim{i}, numel{i}, size{i}_{d}, stride{i}_{d} (strides in elements); an int or bool argument arg{i}; an int list len{i} and arg{i}_{k}. Float and string arguments have no name; pass a float to the kernel with {"scalar": i, "type": "float32"} or "float64".
- "outputs", in the order the operator returns them: {"like": i} allocates like torch.empty_like(argument i): its sizes, its strides when it is non-overlapping and dense (else dense strides in its stride order), its dtype unless "dtype" is given. {"dtype": "float32", "sizes": [...], "strides": [...]} allocates exactly that; contiguous strides mean each dimension's stride is the product of the sizes after it. {"in_place": i} is argument i itself, written in place (an in-place operator such as relu_ returns its self): nothing is allocated, the output pointer is that argument's, so read every element before writing it.
- "scratch": named device buffers of "bytes" bytes, uninitialized, alive during one call's launches.
- "launches" run in order on one stream: "entry", "grid" and "block" (1 to 3 expressions: x, y, z; block x*y*z <= 1024, grid x < 2^31, y and z <= 65535), "shared_mem_bytes" (dynamic shared memory, default 0) and "args", the kernel's parameters in order:
  {"input": i} the data pointer of tensor argument i (it points at the first element; index it with its strides unless the signature shows it contiguous; a None argument cannot be bound),
  {"output": k}, {"scratch": k}, {"size": expr, "type": "int64" or "int32"} (default int64),
  {"scalar": i, "type": "int64", "int32", "float64", "float32" or "bool"} (argument i's value, converted),
  {"value": i, "type": ...} (the value of tensor argument i when it is a one-element CPU tensor, a Python number such as the 0.5 of x * 0.5: read at each call, converted; its value is not in the signature).
)txt";

constexpr std::string_view kAnswerFormat = R"txt(Answer with exactly two fenced blocks, the source and the plan, and keep any prose outside them short:
```TAG
<the complete kernel source>
```
```json
{"summary": "<one line: what this kernel does and how it differs from what it replaces>",
 "entry_points": ["rows_kernel"],
 "compile_options": [],
 "outputs": [{"like": 0}],
 "launches": [{"entry": "rows_kernel", "grid": ["numel0 / size0_1"], "block": [256], "shared_mem_bytes": 0,
               "args": [{"input": 0}, {"output": 0}, {"size": "size0_1", "type": "int64"}]}]}
```
The json block is strict JSON (double quotes, no comments, no trailing commas) with only these fields ("scratch": [{"name": "partials", "bytes": "size0_0 * 8"}] when you need a buffer); unknown fields are errors. The plan above is an example for a row-wise kernel, not the answer: write the plan your kernel needs.
)txt";

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

std::string system_message(const OpSignature& sig) {
  std::string s(kRules);
  s += '\n';
  if (sig.target.backend == Backend::kCuda) {
    s += replace_all(std::string(kCudaBackend), "ARCH", sig.target.arch.empty() ? "sm_XX" : sig.target.arch);
  } else {
    std::string_view abi = kCpuKernelAbiHeaderText;
    while (!abi.empty() && abi.back() == '\n') abi.remove_suffix(1);
    s += replace_all(std::string(kCpuBackend), "ABI_TEXT", abi);
  }
  s += '\n';
  s += kPlanLanguage;
  s += '\n';
  s += replace_all(std::string(kAnswerFormat), "TAG", source_fence_tag(sig.target.backend));
  return s;
}

// ---- the user message --------------------------------------------------------------------------

std::string describe_arg(const Arg& a) {
  struct Visit {
    std::string operator()(std::monostate) const { return "None"; }
    std::string operator()(const TensorMeta& t) const {
      std::string s = "tensor " + std::string(dtype_name(t.dtype)) + " sizes [" + join_ints(t.sizes) + "] strides [" +
                      join_ints(t.strides) + "]" + (t.is_contiguous() ? " (contiguous)" : " (not contiguous)");
      s += ", data pointer aligned to " + std::to_string(t.alignment) + " bytes";
      return s;
    }
    std::string operator()(const std::vector<TensorMeta>& ts) const {
      return "list of " + std::to_string(ts.size()) + " tensors";
    }
    std::string operator()(bool b) const { return std::string("bool ") + (b ? "true" : "false"); }
    std::string operator()(int64_t i) const { return "int " + std::to_string(i); }
    std::string operator()(double d) const { return "float " + fmt("%.17g", d); }
    std::string operator()(const std::string& s) const { return "string \"" + s + "\""; }
    std::string operator()(const std::vector<int64_t>& v) const { return "int list [" + join_ints(v) + "]"; }
  };
  return std::visit(Visit{}, a.value);
}

// PyTorch's kernel as the worker measured it in this search: the median of the measured nodes'
// baselines (each itself the median of a timing's runs), their range, and how many.
struct MeasuredBaseline {
  double median_ns = 0, min_ns = 0, max_ns = 0;
  size_t n = 0;
};

MeasuredBaseline measured_baseline(const search::SearchTree& tree) {
  std::vector<double> v;
  for (uint64_t id = 1; id < tree.size(); ++id) {
    const Node& n = tree.node(id);
    if (n.outcome && n.outcome->measured() && n.outcome->baseline_ns > 0) v.push_back(n.outcome->baseline_ns);
  }
  MeasuredBaseline b;
  if (v.empty()) return b;
  std::sort(v.begin(), v.end());
  b.n = v.size();
  b.min_ns = v.front();
  b.max_ns = v.back();
  b.median_ns = v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  return b;
}

// Note [Prompt numbers]
// A model reasons from the numbers it is given, so they must be the measured ones. PyTorch's time
// is the worker's own measurement once there is one (the hook's mean over the serving process's
// calls includes the first, cold calls: a prompt once said 78,860 us where the worker measured
// 3,210 us); before that, the hook's mean, said to be one. The memory floor is an estimate (bytes
// over the copy bandwidth the worker measured), never a bound: data that stays in caches beats it
// (a model's kernel ran in 1,618 us under a "no kernel can take less than 2,829 us").
std::string describe_roofline(const search::Roofline& r, const search::SearchTree& tree) {
  std::string s;
  const MeasuredBaseline m = measured_baseline(tree);
  const double baseline_ns = m.n > 0 ? m.median_ns : r.baseline_ns;
  if (m.n > 0) {
    s += "PyTorch's kernel takes " + fmt("%.2f", m.median_ns / 1000) + " us per call, as the worker measured it (";
    s += m.n == 1 ? std::string("one timing") : "median of " + std::to_string(m.n) + " timings in this search, from " +
                                                    fmt("%.2f", m.min_ns / 1000) + " to " + fmt("%.2f", m.max_ns / 1000) + " us";
    s += "; each timing interleaves PyTorch's kernel and the candidate on the same inputs). ";
  } else if (r.baseline_ns > 0) {
    s += "The serving process saw PyTorch's kernel take " + fmt("%.2f", r.baseline_ns / 1000) +
         " us per call on average (a mean over its calls, first and cold ones included; the worker has not timed it yet). ";
  }
  if (r.bytes > 0) s += "The call must move at least " + fmt("%.0f", r.bytes) + " bytes (inputs read once, outputs written once)";
  if (r.flops > 0) s += std::string(r.bytes > 0 ? " and" : "The call") + " does about " + fmt("%.0f", r.flops) + " floating-point operations";
  if (r.bytes > 0 || r.flops > 0) s += ". ";
  if (r.bandwidth_bytes_per_s > 0) {
    s += "The worker measured this device copying " + fmt("%.0f", r.bandwidth_bytes_per_s / 1e9) + " GB/s";
    if (r.floor_ns() > 0) {
      s += ": moving those bytes from and to memory at that rate takes about " + fmt("%.2f", r.floor_ns() / 1000) + " us";
      if (baseline_ns > 0) s += " (about " + fmt("%.1f", baseline_ns / r.floor_ns()) + "x less than PyTorch's time)";
      s += ". That is an estimate, not a bound: data that stays in the caches can be faster";
    }
    s += ". ";
  }
  if (s.empty()) return "Nothing is known yet about this operator's cost on this device.\n";
  s.pop_back();
  return s + "\n";
}

std::string_view status_words(EvalStatus s) {
  switch (s) {
    case EvalStatus::kMeasured: return "was verified and timed";
    case EvalStatus::kVerified: return "was verified (not timed)";
    case EvalStatus::kCompileError: return "did not compile";
    case EvalStatus::kRejected: return "was rejected before it ran (its plan or its resources)";
    case EvalStatus::kVerifyFailed: return "ran but failed verification";
    case EvalStatus::kFault: return "crashed (a fault or a sticky device error)";
    case EvalStatus::kTimeout: return "timed out (it hung, or took far too long)";
    case EvalStatus::kWorkerError: return "could not be evaluated (a worker problem, not the kernel's fault)";
  }
  return "has an unknown status";
}

// The accuracy bound as numbers, once a verification measured PyTorch's own error here (the worst
// over the tree's verified nodes: every verification draws the same trial kinds).
std::string describe_accuracy(const OpSignature& sig, const search::SearchTree& tree) {
  double abs_err = -1, rel_err = -1;
  for (uint64_t id = 1; id < tree.size(); ++id) {
    const Node& n = tree.node(id);
    if (!n.outcome || (n.outcome->torch_max_abs_error <= 0 && n.outcome->torch_rel_error <= 0)) continue;
    abs_err = std::max(abs_err, n.outcome->torch_max_abs_error);
    rel_err = std::max(rel_err, n.outcome->torch_rel_error);
  }
  if (abs_err < 0) return {};
  DType out = DType::kFloat32;
  for (const Arg& a : sig.args) {
    if (const auto* t = std::get_if<TensorMeta>(&a.value)) {
      out = t->dtype;
      break;
    }
  }
  const double eps = dtype_epsilon(out);
  return "\n## Accuracy\nOn the verification's trials PyTorch's kernel was off the float64 reference by at most " +
         fmt("%.3g", abs_err) + " (max abs) and " + fmt("%.3g", rel_err) + " (relative L2). A candidate may be off by at most 2x that plus " +
         fmt("%.3g", 8 * eps) + " x max|reference| (max abs) and " + fmt("%.3g", 2 * rel_err + 8 * eps) +
         " (relative L2), on every trial.\n";
}

// A timing's median with its spread: "12.34 us (runs within 5.0%)", the spread being (p90 - p10) /
// median of the timing's runs.
std::string time_with_spread(double ns, double spread) {
  std::string s = fmt("%.2f", ns / 1000) + " us";
  if (spread > 0) s += " (runs spread " + fmt("%.1f", spread * 100) + "%)";
  return s;
}

std::string describe_results(const Outcome& o) {
  std::string s = fmt("speedup %.3fx", o.speedup);
  if (o.baseline_ns > 0 || o.candidate_ns > 0) {
    s += " (PyTorch " + time_with_spread(o.baseline_ns, o.baseline_spread) + ", this kernel " +
         time_with_spread(o.candidate_ns, o.candidate_spread) + ")";
  }
  s += o.significant ? "" : ", inside the noise band";
  if (o.noise_band > 0) s += " (noise band " + fmt("%.1f", o.noise_band * 100) + "%)";
  return s;
}

// One line per child already proposed from the parent.
std::string describe_siblings(const search::SearchTree& tree, const Node& parent, size_t max) {
  std::string s;
  size_t listed = 0;
  for (uint64_t id : parent.children) {
    if (id >= tree.size()) continue;
    if (listed == max) {
      s += "- ... and " + std::to_string(parent.children.size() - listed) + " more\n";
      break;
    }
    const Node& c = tree.node(id);
    s += "- " + c.move.label + ": ";
    if (!c.outcome) {
      s += "not evaluated yet";
    } else if (c.outcome->status == EvalStatus::kMeasured) {
      s += describe_results(*c.outcome);
    } else {
      s += std::string(status_words(c.outcome->status));
      if (!c.outcome->message.empty()) s += " (" + cut(c.outcome->message, 200, "message") + ")";
    }
    s += '\n';
    ++listed;
  }
  return s;
}

PromptKind kind_for(const ProposalRequest& r, const Node& parent) {
  if (r.parent == 0 || parent.move.spec.source.empty()) return PromptKind::kFirst;
  if (!parent.outcome) return PromptKind::kImprove;
  switch (parent.outcome->status) {
    case EvalStatus::kCompileError:
    case EvalStatus::kRejected:
    case EvalStatus::kVerifyFailed:
    case EvalStatus::kFault:
    case EvalStatus::kTimeout:
      return PromptKind::kRepair;
    default:
      return PromptKind::kImprove;
  }
}

std::string summary_of(const Node& n) {
  // The label is "llm: <summary>" for our own moves, a template's description otherwise.
  std::string_view l = n.move.label;
  if (l.substr(0, 5) == "llm: ") l.remove_prefix(5);
  return std::string(l);
}

std::string candidate_block(const Node& parent, Backend backend, const PromptLimits& limits) {
  const KernelSpec& spec = parent.move.spec;
  std::string src = cut(spec.source, limits.max_source_bytes, "source");
  if (!src.empty() && src.back() != '\n') src += '\n';
  return "```" + std::string(source_fence_tag(backend)) + "\n" + src + "```\n```json\n" + plan_json(spec, summary_of(parent)) +
         "\n```\n";
}

// The best measured candidate of the whole tree, when it is not the parent: its results, and for a
// first candidate (which sees no other code) its source and plan.
std::string best_so_far(const search::SearchTree& tree, uint64_t parent, Backend backend, bool with_source,
                        const PromptLimits& limits) {
  uint64_t best = 0;
  for (uint64_t id = 1; id < tree.size(); ++id) {
    const Node& n = tree.node(id);
    if (!n.outcome || !n.outcome->improves()) continue;
    if (best == 0 || n.outcome->speedup > tree.node(best).outcome->speedup) best = id;
  }
  if (best == 0 || best == parent) return {};
  const Node& b = tree.node(best);
  std::string s = "\n## Best kernel found so far in this search\n\"" + b.move.label + "\" (proposed by " +
                  b.move.proposer + "): " + describe_results(*b.outcome) + ".\n";
  if (with_source) s += candidate_block(b, backend, limits) + "Beat it: a better idea, not a copy.\n";
  return s;
}

}  // namespace

std::string format_repair_message(std::string_view why, Backend backend) {
  const std::string tag(source_fence_tag(backend));
  std::string s = "Your answer could not be used: " + cut(why, 2048, "reason") + ".\n";
  if (why.find("repeats") != std::string_view::npos) {
    s += "That kernel was already tried: write a different one.\n";
  }
  s += "Answer again with the whole kernel: exactly one ```" + tag +
       " block with the source and one ```json block with the plan, as the system message says, and keep any prose "
       "outside them short.\n";
  return s;
}

std::string_view prompt_kind_name(PromptKind k) noexcept {
  switch (k) {
    case PromptKind::kFirst: return "first";
    case PromptKind::kImprove: return "improve";
    case PromptKind::kRepair: return "repair";
  }
  return "unknown";
}

Prompt build_prompt(const ProposalRequest& r, const PromptLimits& limits) {
  const OpSignature& sig = *r.signature;
  const Node& parent = r.tree->node(r.parent);
  Prompt p;
  p.kind = kind_for(r, parent);
  p.chat.system = system_message(sig);

  std::string u;
  // Note [Operator semantics] in runtime/op_catalog.cc.
  const catalog::OpEntry* op = catalog::find(sig);
  u += "## Operator\n";
  if (op != nullptr) {
    u += std::string(op->schema) + "\n" + std::string(op->semantics) + "\n";
  } else {
    u += sig.op + (sig.overload.empty() ? "" : "." + sig.overload) + " (no description: match PyTorch's definition)\n";
  }
  u += "\n## Signature\n" + sig.to_string() + "\n";
  for (size_t i = 0; i < sig.args.size(); ++i) u += "- argument " + std::to_string(i) + ": " + describe_arg(sig.args[i]) + "\n";
  u += "Named sizes for the plan:";
  for (const auto& [name, value] : sig.named_sizes()) u += " " + name + "=" + std::to_string(value);
  if (!r.roofline.device_facts.empty()) u += "\n\n## Device\n" + r.roofline.device_facts;
  u += "\n\n## Roofline\n" + describe_roofline(r.roofline, *r.tree);
  u += describe_accuracy(sig, *r.tree);
  u += best_so_far(*r.tree, r.parent, sig.target.backend, p.kind == PromptKind::kFirst, limits);

  u += "\n## Task\n";
  switch (p.kind) {
    case PromptKind::kFirst:
      u += "No candidate exists yet. Write a kernel for exactly this signature that is correct and faster than "
           "PyTorch's: choose the parallelization and memory access for these sizes.\n";
      break;
    case PromptKind::kImprove: {
      u += "The current candidate (\"" + parent.move.label + "\") ";
      if (parent.outcome && parent.outcome->status == EvalStatus::kMeasured) {
        u += "is correct: " + describe_results(*parent.outcome) + ".\n";
      } else if (parent.outcome) {
        u += std::string(status_words(parent.outcome->status)) + ".\n";
      } else {
        u += "has not been evaluated yet.\n";
      }
      u += candidate_block(parent, sig.target.backend, limits);
      u += "Write a faster kernel for this signature: a different algorithm, memory access pattern or "
           "parallelization where the numbers say there is time to gain, keeping it exactly as correct.\n";
      break;
    }
    case PromptKind::kRepair: {
      const Outcome& o = *parent.outcome;
      u += "This candidate (\"" + parent.move.label + "\") " + std::string(status_words(o.status)) + ":\n";
      u += candidate_block(parent, sig.target.backend, limits);
      if (!o.failed_check.empty()) u += "Failed check: " + o.failed_check + "\n";
      // A compile error's message is the head of its log: the log alone, once.
      const bool message_in_log = !o.build_log.empty() && o.build_log.find(o.message) != std::string::npos;
      if (!o.message.empty() && !message_in_log) u += "What went wrong: " + cut(o.message, limits.max_log_bytes, "message") + "\n";
      if (!o.build_log.empty()) {
        u += "Compiler output:\n```\n" + cut(o.build_log, limits.max_log_bytes, "log");
        if (u.back() != '\n') u += '\n';
        u += "```\n";
      }
      u += "Fix it: answer with the whole corrected kernel (source and plan), keeping what was meant to make it fast.\n";
      break;
    }
  }
  if (p.kind != PromptKind::kFirst || !parent.children.empty()) {
    const std::string tried = describe_siblings(*r.tree, parent, limits.max_siblings);
    if (!tried.empty()) u += "\nAlready proposed from here (propose something different):\n" + tried;
  }
  u += "\nAnswer with one ```" + std::string(source_fence_tag(sig.target.backend)) +
       " block and one ```json block, as the system message says.\n";
  p.chat.messages.push_back(ChatMessage{ChatRole::kUser, std::move(u)});
  return p;
}

}  // namespace kforge::llm
