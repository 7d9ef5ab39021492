// The benchmarks' candidate: aten::silu on a float32 vector, y = x / (1 + exp(-x)), one element per
// thread (CUDA) or 4096 per block (CPU); a -D salt makes each salted copy a new build-cache key.
// Used by bench_worker (one worker) and bench_pool (the evaluator pool).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"
#include "search_daemon/evaluator/eval_protocol.h"

namespace kforge::bench {

constexpr const char* kCpuSilu = R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void silu(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t n = *(const int64_t*)p[2];
  const int64_t begin = (int64_t)b->block_idx[0] * 4096;
  const int64_t end = begin + 4096 < n ? begin + 4096 : n;
  for (int64_t i = begin; i < end; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
}
)";

constexpr const char* kCudaSilu = R"(
extern "C" __global__ void silu(const float* x, float* y, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] / (1.0f + expf(-x[i]));
}
)";


inline KernelSpec silu_spec(bool cuda, int salt) {
  KernelSpec s;
  s.backend = cuda ? Backend::kCuda : Backend::kCpu;
  s.language = cuda ? SourceLanguage::kCuda : SourceLanguage::kCpp;
  s.source = cuda ? kCudaSilu : kCpuSilu;
  s.entry_points = {"silu"};
  if (salt > 0) s.compile_options = {"-DKFORGE_BENCH_SALT=" + std::to_string(salt)};
  s.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "silu";
  l.grid = {cuda ? "ceil_div(numel0, 256)" : "ceil_div(numel0, 4096)", "1", "1"};
  l.block = {cuda ? "256" : "1", "1", "1"};
  l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("numel0")};
  s.plan.launches = {l};
  return s;
}

// Why an evaluation that should have been measured was not, in one line.
inline std::string failure_line(const eval::EvalResult& r) {
  return std::string(eval::eval_status_name(r.status)) + ": " + r.message + " " + r.verify.detail;
}

inline OpSignature silu_signature(bool cuda, int64_t n, const std::string& arch) {
  TensorMeta m;
  m.dtype = DType::kFloat32;
  m.device = cuda ? DeviceType::kCuda : DeviceType::kCpu;
  m.sizes = {n};
  m.strides = {1};
  return OpSignature{"aten::silu", "", {Arg::tensor(m)}, Target{cuda ? Backend::kCuda : Backend::kCpu, arch}};
}

}  // namespace kforge::bench
