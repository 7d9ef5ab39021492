// aten::cat: the tensors of a list joined along dim. Handled: 1 to kMaxInputs non-empty tensors of
// one dtype on one device, of one rank, equal in every dimension but dim, each laid out as rows
// (Note [Cat rows]); the output contiguous (as PyTorch makes it). The kernels are specialized to
// the shapes: with outer = the product of the sizes before dim and inner = those after it, input k
// is `outer` rows of seg_k = size_k(dim) * inner elements, and output row o is input 0's row o,
// then input 1's, and so on. Elements move as stored (raw words on CUDA, memcpy on CPU), so NaN
// payloads survive as in PyTorch's copy. The inputs are the list's elements (Note [List inputs]
// in runtime/kernel_spec.cc: input bindings 2, 3, ... after the two arguments).
//
// Note [Cat rows]
// ~~~~~~~~~~~~~~~
// An input's row o must be seg_k elements in a row in storage: its dimensions from dim on are
// dense in row-major order (size-1 dimensions aside). Its dimensions before dim may have any
// non-negative strides: row o starts at KF_A<k>_ROW(o), the row offset of the view [outer..., seg_k]
// (Note [Strided rows] in template_family.cc). So are served, besides contiguous inputs, the two
// strided cats of a Llama-style decoder: rotate_half's torch.cat((-x2, x1), -1), whose x1 is the
// first half of the last dimension of q or k (q itself a transposed view), and a KV cache that was
// cropped (a narrowed view along the sequence) and grows by one position. The CUDA kernel moves
// vectors of KF_VEC elements, so every row offset must be a multiple of KF_VEC
// (row_offset_granule) as well as every seg_k.
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

constexpr size_t kMaxInputs = 16;

struct CatArgs {
  const std::vector<TensorMeta>* tensors = nullptr;
  std::vector<TensorMeta> rows;   // per input, the view [outer..., seg_k] (Note [Cat rows])
  size_t dim = 0;
  int64_t outer = 1;
  std::vector<int64_t> seg;   // elements per row of each input
  int64_t row = 0;            // elements per output row: the sum of seg
  std::vector<int64_t> out_sizes;
};

std::optional<CatArgs> cat_args(const OpSignature& sig, Backend backend) {
  if (sig.op != "aten::cat" || !sig.overload.empty() || sig.args.size() != 2) return std::nullopt;
  const auto* list = std::get_if<std::vector<TensorMeta>>(&sig.args[0].value);
  const auto* dim = std::get_if<int64_t>(&sig.args[1].value);
  if (list == nullptr || dim == nullptr || list->empty() || list->size() > kMaxInputs) return std::nullopt;
  const TensorMeta& first = (*list)[0];
  const auto rank = static_cast<int64_t>(first.sizes.size());
  if (rank == 0 || *dim < -rank || *dim >= rank) return std::nullopt;
  CatArgs a;
  a.tensors = list;
  a.dim = static_cast<size_t>(*dim < 0 ? *dim + rank : *dim);
  for (const TensorMeta& t : *list) {
    if (!template_strided_tensor(&t, backend) || t.dtype != first.dtype || t.sizes.size() != first.sizes.size()) {
      return std::nullopt;
    }
    int64_t dense = 1;   // the elements of dimensions after d: each row-major from dim on
    for (size_t d = t.sizes.size(); d-- > 0;) {
      if (d != a.dim && t.sizes[d] != first.sizes[d]) return std::nullopt;
      if (d >= a.dim && t.sizes[d] > 1) {
        if (t.strides[d] != dense) return std::nullopt;
        dense *= t.sizes[d];
      }
    }
  }
  int64_t inner = 1;
  for (size_t d = 0; d < first.sizes.size(); ++d) {
    if (d < a.dim) a.outer *= first.sizes[d];
    if (d > a.dim) inner *= first.sizes[d];
  }
  a.out_sizes = first.sizes;
  a.out_sizes[a.dim] = 0;
  for (const TensorMeta& t : *list) {
    a.seg.push_back(t.sizes[a.dim] * inner);
    a.row += a.seg.back();
    a.out_sizes[a.dim] += t.sizes[a.dim];
    TensorMeta view = t;
    view.sizes.assign(t.sizes.begin(), t.sizes.begin() + static_cast<std::ptrdiff_t>(a.dim));
    view.strides.assign(t.strides.begin(), t.strides.begin() + static_cast<std::ptrdiff_t>(a.dim));
    view.sizes.push_back(a.seg.back());
    view.strides.push_back(1);
    a.rows.push_back(std::move(view));
  }
  return a;
}

// The output: contiguous, every size and stride a number (the kernel is specialized to them).
OutputSpec cat_output(const CatArgs& a) {
  std::vector<std::string> sizes, strides(a.out_sizes.size());
  int64_t step = 1;
  for (size_t d = a.out_sizes.size(); d-- > 0;) {
    strides[d] = std::to_string(step);
    step *= a.out_sizes[d];
  }
  for (int64_t s : a.out_sizes) sizes.push_back(std::to_string(s));
  return OutputSpec::explicit_layout((*a.tensors)[0].dtype, std::move(sizes), std::move(strides));
}

// One input binding per list element, then the output.
std::vector<ArgBinding> cat_bindings(const OpSignature& sig, const CatArgs& a, int64_t count) {
  std::vector<ArgBinding> b;
  for (size_t k = 0; k < a.tensors->size(); ++k) b.push_back(ArgBinding::input(static_cast<uint32_t>(sig.args.size() + k)));
  b.push_back(ArgBinding::output(0));
  b.push_back(ArgBinding::size(std::to_string(count)));
  return b;
}

// `#define KF_A<k>_ROW(o) ...` per input: the element offset of its row o (Note [Cat rows]).
std::string row_defines(const CatArgs& a) {
  std::string s;
  for (size_t k = 0; k < a.rows.size(); ++k) {
    std::string d = row_offset_define(a.rows[k], std::to_string(a.seg[k]));
    d.replace(d.find("KF_X_ROW"), 8, "KF_A" + std::to_string(k) + "_ROW");
    s += d;
  }
  return s;
}

// "const T* __restrict__ a0, const T* __restrict__ a1, ..." for the kernel's parameter list.
std::string input_params(size_t n, const char* type) {
  std::string s;
  for (size_t k = 0; k < n; ++k) s += "const " + std::string(type) + "* __restrict__ a" + std::to_string(k) + ", ";
  return s;
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum CatCudaKnob : size_t { kBlock, kVec, kItems };

// Output vector i (KF_VEC elements; KF_VEC divides every seg_k, so a vector never straddles two
// inputs) lies in row o = i / (row / KF_VEC) at r; the input is found by walking the segments
// (their lengths are compiled in), and the vector copied as one kf_word.
std::string cuda_source(const CatArgs& a, int64_t vec) {
  std::string s = std::string(kCudaPrelude) + kCudaRawWord + row_defines(a);
  s += "extern \"C\" __global__ void __launch_bounds__(KF_BLOCK)\nkf_cat(" + input_params(a.seg.size(), "kf_word") +
       "kf_word* __restrict__ y, kf_i64 nvec) {\n"
       "  const kf_i64 row_words = " + std::to_string(a.row / vec) + ";\n"
       "  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x;\n"
       "#pragma unroll\n"
       "  for (int it = 0; it < KF_ITEMS; ++it) {\n"
       "    const kf_i64 i = first + (kf_i64)it * KF_BLOCK;\n"
       "    if (i >= nvec) continue;\n"
       "    const kf_i64 o = i / row_words;\n"
       "    kf_i64 r = i - o * row_words;\n";
  for (size_t k = 0; k < a.seg.size(); ++k) {
    const std::string seg = std::to_string(a.seg[k] / vec);
    const std::string copy = "y[i] = a" + std::to_string(k) + "[KF_A" + std::to_string(k) + "_ROW(o) / KF_VEC + r];";
    if (k + 1 == a.seg.size()) {
      s += "    " + copy + "\n";
    } else {
      s += "    if (r < " + seg + ") { " + copy + " continue; }\n    r -= " + seg + ";\n";
    }
  }
  s += "  }\n}\n";
  return s;
}

class CatCuda final : public FamilyBase {
 public:
  CatCuda()
      : FamilyBase("cat", Backend::kCuda,
                   flat_cuda_knobs()) {}

  bool applies(const OpSignature& sig) const override { return cat_args(sig, Backend::kCuda).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const CatArgs a = *cat_args(sig, Backend::kCuda);
    const int64_t bytes = v[kVec] * dtype_size_bytes((*a.tensors)[0].dtype);
    if (bytes > 16) return false;
    // Every input's rows whole vectors starting on one, every input aligned to one (the output is
    // a fresh allocation).
    for (size_t k = 0; k < a.seg.size(); ++k) {
      if (a.seg[k] % v[kVec] != 0 || row_offset_granule(a.rows[k]) % v[kVec] != 0 ||
          static_cast<int64_t>((*a.tensors)[k].alignment) % bytes != 0) {
        return false;
      }
    }
    return flat_cuda_fits(a.outer * a.row, v);
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const CatArgs a = *cat_args(sig, Backend::kCuda);
    return flat_cuda_prior(dtype_size_bytes((*a.tensors)[0].dtype), a.outer * a.row, v);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const CatArgs a = *cat_args(sig, Backend::kCuda);
    const int64_t bytes = v[kVec] * dtype_size_bytes((*a.tensors)[0].dtype);
    std::vector<std::string> options = {dtype_define((*a.tensors)[0].dtype)};
    for (std::string d : {define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]), define("KF_ITEMS", v[kItems]),
                          define("KF_WORD_BYTES", bytes)}) {
      options.push_back(std::move(d));
    }
    KernelSpec s = one_launch_spec(Backend::kCuda, cuda_source(a, v[kVec]), "kf_cat", options);
    s.plan.outputs = {cat_output(a)};
    const int64_t nvec = a.outer * a.row / v[kVec];
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(" + std::to_string(nvec) + ", " + std::to_string(v[kBlock] * v[kItems]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = cat_bindings(sig, a, nvec);
    return s;
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

// KF_ROWS output rows per block; each row the inputs' rows one after the other (memcpy, float32).
std::string cpu_source(const CatArgs& a) {
  const size_t n = a.seg.size();
  std::string s = std::string(kCpuPrelude) + "#include <string.h>\n" + row_defines(a);
  s += "extern \"C\" void kf_cat(const kforge_cpu_block* blk, void* const* p) {\n";
  for (size_t k = 0; k < n; ++k) {
    s += "  const float* __restrict__ a" + std::to_string(k) + " = KF_PTR(const float, " + std::to_string(k) + ");\n";
  }
  s += "  float* __restrict__ y = KF_PTR(float, " + std::to_string(n) + ");\n"
       "  const int64_t rows = KF_I64(" + std::to_string(n + 1) + ");\n"
       "  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;\n"
       "  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;\n"
       "  for (int64_t o = r0; o < r1; ++o) {\n"
       "    float* __restrict__ out = y + o * " + std::to_string(a.row) + ";\n";
  for (size_t k = 0; k < n; ++k) {
    const std::string seg = std::to_string(a.seg[k]);
    s += "    memcpy(out, a" + std::to_string(k) + " + KF_A" + std::to_string(k) + "_ROW(o), sizeof(float) * " + seg + ");\n";
    if (k + 1 < n) s += "    out += " + seg + ";\n";
  }
  s += "  }\n}\n";
  return s;
}

class CatCpu final : public FamilyBase {
 public:
  CatCpu() : FamilyBase("cpu.cat", Backend::kCpu, {Knob{"rows", {1, 4, 16, 64, 256, 1024}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return cat_args(sig, Backend::kCpu).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    return v[0] <= std::max<int64_t>(1, pow2_ceil(cat_args(sig, Backend::kCpu)->outer));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const CatArgs a = *cat_args(sig, Backend::kCpu);
    // About 16K elements per block.
    const double ideal = std::clamp(16384.0 / static_cast<double>(a.row), 1.0, 1024.0);
    return closeness(static_cast<double>(v[0]), ideal, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const CatArgs a = *cat_args(sig, Backend::kCpu);
    std::vector<std::string> options = cpu_base_options(sig);
    options.push_back(define("KF_ROWS", v[0]));
    KernelSpec s = one_launch_spec(Backend::kCpu, cpu_source(a), "kf_cat", options);
    s.plan.outputs = {cat_output(a)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = "ceil_div(" + std::to_string(a.outer) + ", " + std::to_string(v[0]) + ")";
    l.args = cat_bindings(sig, a, a.outer);
    return s;
  }
};

}  // namespace

// "cat" (CUDA) and "cpu.cat".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CatCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CatCpu>(); },
};

}  // namespace kforge::search::templates
