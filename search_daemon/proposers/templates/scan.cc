// aten::cumsum (dtype None) of a contiguous input along any dimension: the input seen as
// [outer, len, inner] (inner = the product of the sizes after dim, 1 for the last dimension), each
// of the outer * inner columns summed cumulatively over its len elements, inner apart.
//
// One column per CUDA thread (neighbouring threads on neighbouring columns, so for inner > 1 each
// step reads one coalesced row of the [len, inner] slice; for the last dimension each thread walks
// its own row) or per CPU inner loop, the running sum in kf_acc (double for float32, float for
// 16-bit data) and each prefix rounded to the dtype on its own: never a sum of rounded prefixes.
// PyTorch's CPU kernel accumulates float32 in double too, so these prefixes are at least as close
// to the float64 reference as PyTorch's.
//
// Note [float16 cumsum on CUDA]
// PyTorch's CUDA scan keeps partial sums in the data type, so float16 partial sums of large
// values overflow to inf where the prefix itself is finite: on an H100, cumsum of float16 [7, 1001]
// from the worker's "large" trial, PyTorch gave inf at [0, 603] where the float64 prefix (and
// this kernel's float one) is 6.39e4 (bundle 61f8b86, the CUDA template run). The worker requires
// PyTorch's Inf positions, and where those come from depends on PyTorch's scan order, so the CUDA
// family refuses float16 (bfloat16's range does not overflow so; float32 partial sums are kept in
// float32 by PyTorch).
#include <algorithm>

#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

const char* const kCudaCumsum = R"kf(
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_cumsum(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 columns, kf_i64 len, kf_i64 inner) {
  const kf_i64 t = (kf_i64)blockIdx.x * KF_BLOCK + threadIdx.x;
  if (t >= columns) return;
  const kf_i64 o = t / inner;
  const kf_i64 base = o * len * inner + (t - o * inner);
  kf_acc s = 0;
  for (kf_i64 l = 0; l < len; ++l) {
    s += (kf_acc)kf_to_float(x[base + l * inner]);
    y[base + l * inner] = kf_from_float((float)s);
  }
}
)kf";

const char* const kCpuCumsum = R"kf(
// One block per outer index; its inner columns in chunks of KF_CHUNK, each step over len running
// across the chunk (for the last dimension, inner = 1: one row per block).
extern "C" void kf_cumsum(const kforge_cpu_block* b, void* const* p) {
  const float* x = KF_PTR(const float, 0);
  float* y = KF_PTR(float, 1);
  const int64_t len = KF_I64(2), inner = KF_I64(3);
  const int64_t o = (int64_t)b->block_idx[0];
  for (int64_t c0 = 0; c0 < inner; c0 += KF_CHUNK) {
    const int64_t n = inner - c0 < KF_CHUNK ? inner - c0 : KF_CHUNK;
    const float* __restrict__ xs = x + o * len * inner + c0;
    float* __restrict__ ys = y + o * len * inner + c0;
    double s[KF_CHUNK];
    for (int64_t k = 0; k < n; ++k) s[k] = 0;
    for (int64_t l = 0; l < len; ++l) {
      for (int64_t k = 0; k < n; ++k) {
        s[k] += (double)xs[l * inner + k];
        ys[l * inner + k] = (float)s[k];
      }
    }
  }
}
)kf";

// The summed dimension of a signature these families take, or -1.
int64_t cumsum_dim(const OpSignature& sig, Backend backend) {
  if (sig.op != "aten::cumsum" || !sig.overload.empty() || sig.args.size() != 3) return -1;
  const TensorMeta* x = tensor_arg(sig, 0);
  const int64_t* dim = int_arg(sig, 1);
  if (!template_tensor(x, backend) || dim == nullptr || !is_none(sig, 2)) return -1;   // dtype= changes the result type
  const auto rank = static_cast<int64_t>(x->sizes.size());
  if (rank == 0 || *dim < -rank || *dim >= rank) return -1;
  return *dim < 0 ? *dim + rank : *dim;
}

// ---- CUDA ------------------------------------------------------------------------------------------

class CumsumCuda final : public FamilyBase {
 public:
  CumsumCuda() : FamilyBase("cumsum", Backend::kCuda, {Knob{"block", {32, 64, 128, 256, 512}, {}}}) {}

  bool applies(const OpSignature& sig) const override {
    // Note [float16 cumsum on CUDA]
    return cumsum_dim(sig, Backend::kCuda) >= 0 && tensor_arg(sig, 0)->dtype != DType::kFloat16;
  }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const int64_t columns = x.numel() / x.sizes[static_cast<size_t>(cumsum_dim(sig, Backend::kCuda))];
    return v[0] <= std::max<int64_t>(32, pow2_ceil(columns));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    return closeness(static_cast<double>(v[0]), 128, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = split_at_dim(x, cumsum_dim(sig, Backend::kCuda));
    KernelSpec s = one_launch_spec(Backend::kCuda, std::string(kCudaPrelude) + kCudaCumsum, "kf_cumsum",
                                   {dtype_define(x.dtype), define("KF_BLOCK", v[0])});
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    const std::string columns = "(" + e.outer + ") * (" + e.inner + ")";
    l.grid[0] = "ceil_div(" + columns + ", " + std::to_string(v[0]) + ")";
    l.block[0] = std::to_string(v[0]);
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(columns), ArgBinding::size(e.len),
              ArgBinding::size(e.inner)};
    return s;
  }
};

// ---- CPU -------------------------------------------------------------------------------------------

class CumsumCpu final : public FamilyBase {
 public:
  CumsumCpu() : FamilyBase("cpu.cumsum", Backend::kCpu, {Knob{"chunk", {1, 8, 16, 32, 64, 128}, {}}}) {}

  bool applies(const OpSignature& sig) const override { return cumsum_dim(sig, Backend::kCpu) >= 0; }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const int64_t inner = split_at_dim(*tensor_arg(sig, 0), cumsum_dim(sig, Backend::kCpu)).inner_size;
    return inner == 1 ? v[0] == 1 : v[0] > 1 && v[0] <= std::max<int64_t>(8, pow2_ceil(inner));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    return v[0] == 1 ? 1.0 : closeness(static_cast<double>(v[0]), 32, 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const TensorMeta& x = *tensor_arg(sig, 0);
    const DimSplit e = split_at_dim(x, cumsum_dim(sig, Backend::kCpu));
    std::vector<std::string> options = cpu_base_options(sig);
    options.push_back(define("KF_CHUNK", v[0]));
    KernelSpec s = one_launch_spec(Backend::kCpu, std::string(kCpuPrelude) + kCpuCumsum, "kf_cumsum", options);
    s.plan.outputs = {OutputSpec::like(0)};
    Launch& l = s.plan.launches[0];
    l.grid[0] = e.outer;
    l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(e.len), ArgBinding::size(e.inner)};
    return s;
  }
};

}  // namespace

// "cumsum" (CUDA) and "cpu.cumsum".
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumCuda>(); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<CumsumCpu>(); },
};

}  // namespace kforge::search::templates
