// The evaluation worker end to end: real kforge-worker processes (python3 + torch + the worker
// library) supervised by WorkerProcess, fed a corpus of candidates that cheat in every way the
// issue lists, each of which must come back with the right reason, while the worker pool keeps
// serving; and correct candidates (the original algorithms written out by hand) must pass every
// trial and be timed.
//
// CPU cases ([cpu], ctest label 'integration') run on any machine with the project's venv; CUDA
// cases ([gpu], label 'gpu') need a GPU and run from the bundle (run-gpu-tests). The environment
// names the worker: KFORGE_WORKER (the launcher), KFORGE_PYTHON (a python3 with torch), and
// KFORGE_WORKER_LIB_DIR where the worker library is not beside the launcher's ../lib.
#include <catch2/catch.hpp>

#include <sched.h>
#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/environment.h"
#include "runtime/kernel_spec.h"
#include "runtime/op_signature.h"
#include "search_daemon/evaluator/eval_protocol.h"
#include "search_daemon/evaluator/worker_process.h"
#include "search_daemon/worker/builder.h"
#include "runtime/nvrtc.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using namespace kforge::eval;
using kforge::test_support::TempDir;

namespace {

constexpr int64_t kRows = 64;
constexpr int64_t kCols = 256;

TensorMeta matrix(DeviceType device, std::vector<int64_t> sizes) { return contiguous_tensor(DType::kFloat32, device, std::move(sizes)); }

Target target_for(Backend b, const std::string& arch) { return Target{b, arch}; }

OpSignature softmax_signature(Backend b, const std::string& arch) {
  const DeviceType dev = b == Backend::kCuda ? DeviceType::kCuda : DeviceType::kCpu;
  return OpSignature{"aten::_softmax", "", {Arg::tensor(matrix(dev, {kRows, kCols})), Arg::integer(-1), Arg::boolean(false)},
                     target_for(b, arch)};
}

OpSignature layer_norm_signature(Backend b, const std::string& arch) {
  const DeviceType dev = b == Backend::kCuda ? DeviceType::kCuda : DeviceType::kCpu;
  return OpSignature{"aten::native_layer_norm",
                     "",
                     {Arg::tensor(matrix(dev, {kRows, kCols})), Arg::int_list({kCols}), Arg::tensor(matrix(dev, {kCols})),
                      Arg::tensor(matrix(dev, {kCols})), Arg::real(1e-5)},
                     target_for(b, arch)};
}

// One block per row: softmax_rows(x, y, cols).
KernelSpec row_spec(Backend b, std::string source, const std::string& entry = "softmax_rows") {
  KernelSpec s;
  s.backend = b;
  s.language = b == Backend::kCuda ? SourceLanguage::kCuda : SourceLanguage::kCpp;
  s.source = std::move(source);
  s.entry_points = {entry};
  s.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = entry;
  l.grid = {"numel0 / size0_1", "1", "1"};
  l.block = {b == Backend::kCuda ? "256" : "1", "1", "1"};
  l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("size0_1")};
  s.plan.launches = {l};
  return s;
}

// native_layer_norm: out like the input, mean and rstd [rows, 1] as PyTorch returns them.
KernelSpec layer_norm_spec(Backend b, std::string source) {
  KernelSpec s = row_spec(b, std::move(source), "layer_norm_rows");
  s.plan.outputs = {OutputSpec::like(0), OutputSpec::explicit_layout(DType::kFloat32, {"size0_0", "1"}, {"1", "1"}),
                    OutputSpec::explicit_layout(DType::kFloat32, {"size0_0", "1"}, {"1", "1"})};
  s.plan.launches[0].args = {ArgBinding::input(0),  ArgBinding::input(2),  ArgBinding::input(3),
                             ArgBinding::output(0), ArgBinding::output(1), ArgBinding::output(2),
                             ArgBinding::size("size0_1"), ArgBinding::scalar(4, ValueType::kFloat64)};
  return s;
}

// ---- CPU sources ------------------------------------------------------------------------------------

// The original algorithm, written out: max, sum of exp(x - max), divide; double accumulation.
constexpr const char* kCpuSoftmax = R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t cols = *(const int64_t*)p[2];
  const float* xr = x + (int64_t)b->block_idx[0] * cols;
  float* yr = y + (int64_t)b->block_idx[0] * cols;
  BAD_HEAD
  double m = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
  double s = 0;
  for (int64_t c = 0; c < cols; ++c) s += exp((double)xr[c] - m);
  for (int64_t c = 0; c < cols; ++c) yr[c] = (float)(exp((double)xr[c] - m) / s);
  BAD_TAIL
}
)";

std::string cpu_softmax(const std::string& bad_tail, const std::string& prelude = "", const std::string& bad_head = "") {
  std::string s = kCpuSoftmax;
  s.replace(s.find("BAD_HEAD"), 8, bad_head);
  s.replace(s.find("BAD_TAIL"), 8, bad_tail);
  return prelude + s;
}

constexpr const char* kCpuLayerNorm = R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void layer_norm_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  const float* w = *(const float* const*)p[1];
  const float* bias = *(const float* const*)p[2];
  float* y = *(float* const*)p[3];
  float* mean_out = *(float* const*)p[4];
  float* rstd_out = *(float* const*)p[5];
  const int64_t cols = *(const int64_t*)p[6];
  const double eps = *(const double*)p[7];
  const int64_t row = b->block_idx[0];
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
#ifdef ONE_PASS_FLOAT
  float s = 0, ss = 0;
  for (int64_t c = 0; c < cols; ++c) { s += xr[c]; ss += xr[c] * xr[c]; }
  const double mean = s / cols;
  const double var = ss / cols - (float)mean * (float)mean;
#else
  double s = 0;
  for (int64_t c = 0; c < cols; ++c) s += xr[c];
  const double mean = s / cols;
  double var = 0;
  for (int64_t c = 0; c < cols; ++c) var += ((double)xr[c] - mean) * ((double)xr[c] - mean);
  var /= cols;
#endif
  const double rstd = 1.0 / sqrt(var + eps);
  for (int64_t c = 0; c < cols; ++c) yr[c] = (float)(((double)xr[c] - mean) * rstd * w[c] + bias[c]);
  mean_out[row] = (float)mean;
  rstd_out[row] = (float)rstd;
}
)";

// ---- CUDA sources -----------------------------------------------------------------------------------

// One 256-thread block per row, shared-memory reductions; fp32 arithmetic with expf.
constexpr const char* kCudaSoftmax = R"(
#define NEG_INF (-__int_as_float(0x7f800000))
PRELUDE
extern "C" __global__ void softmax_rows(const float* x, float* y, long long cols) {
  __shared__ float red[256];
  const float* xr = x + (long long)blockIdx.x * cols;
  float* yr = y + (long long)blockIdx.x * cols;
  float m = NEG_INF;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
    __syncthreads();
  }
  m = SHIFT;
  __syncthreads();
  float s = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  red[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  s = red[0];
  BEFORE_STORE
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) / s;
  BAD_TAIL
}
)";

std::string cuda_softmax(const std::string& bad_tail, const std::string& prelude = "",
                         const std::string& before_store = "", const std::string& shift = "red[0]") {
  std::string s = kCudaSoftmax;
  s.replace(s.find("PRELUDE"), 7, prelude);
  s.replace(s.find("SHIFT"), 5, shift);
  s.replace(s.find("BEFORE_STORE"), 12, before_store);
  s.replace(s.find("BAD_TAIL"), 8, bad_tail);
  return s;
}

constexpr const char* kCudaLayerNorm = R"(
extern "C" __global__ void layer_norm_rows(const float* x, const float* w, const float* bias, float* y,
                                           float* mean_out, float* rstd_out, long long cols, double eps) {
  __shared__ double red[256];
  const long long row = blockIdx.x;
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  double s = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  const double mean = red[0] / cols;
  __syncthreads();
  double v = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) v += (xr[c] - mean) * (xr[c] - mean);
  red[threadIdx.x] = v;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
    __syncthreads();
  }
  const double rstd = rsqrt(red[0] / cols + eps);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = (float)((xr[c] - mean) * rstd * w[c] + bias[c]);
  if (threadIdx.x == 0) { mean_out[row] = (float)mean; rstd_out[row] = (float)rstd; }
}
)";

// ---- the corpus --------------------------------------------------------------------------------------

struct Case {
  std::string name;
  KernelSpec spec;
  EvalStatus status;
  std::string check = "";        // VerifyOutcome::failed_check when status is kVerifyFailed
  std::string trial = "";        // the failing trial, when it matters
  std::string message_has = "";  // a part of EvalResult::message (or build_log)
  uint32_t run_budget_ms = 60000;
  OpSignature signature;
};

std::vector<Case> cpu_corpus(const OpSignature& sm) {
  const Backend B = Backend::kCpu;
  std::vector<Case> c;
  auto add = [&](std::string name, KernelSpec spec, EvalStatus st, std::string check = "", std::string trial = "",
                 std::string msg = "") {
    c.push_back(Case{std::move(name), std::move(spec), st, std::move(check), std::move(trial), std::move(msg), 60000, sm});
  };
  add("does not compile", row_spec(B, "this is not C++;"), EvalStatus::kCompileError, "", "", "compile error");
  add("traps", row_spec(B, cpu_softmax("__builtin_trap();")), EvalStatus::kFault, "", "", "SIGILL");
  c.push_back(Case{"hangs", row_spec(B, cpu_softmax("volatile int spin = 1; while (spin) {}")), EvalStatus::kTimeout,
                   "", "", "verify", 3000, sm});
  add("writes out of bounds",
      row_spec(B, cpu_softmax("if (b->block_idx[0] + 1 == b->grid_dim[0]) yr[cols] = 1.0f;")),
      EvalStatus::kVerifyFailed, "out_of_bounds", "normal", "after the end");
  add("wrong only for large-magnitude inputs", row_spec(B, R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t cols = *(const int64_t*)p[2];
  const float* xr = x + (int64_t)b->block_idx[0] * cols;
  float* yr = y + (int64_t)b->block_idx[0] * cols;
  float s = 0;                                   // no max subtraction: exp overflows for large x
  for (int64_t c = 0; c < cols; ++c) s += expf(xr[c]);
  for (int64_t c = 0; c < cols; ++c) yr[c] = expf(xr[c]) / s;
}
)"),
      EvalStatus::kVerifyFailed, "", "large");
  add("wrong only in the last element",
      row_spec(B, cpu_softmax("if (b->block_idx[0] + 1 == b->grid_dim[0]) yr[cols - 1] *= 1.001f;")),
      EvalStatus::kVerifyFailed, "accuracy", "normal", "[63, 255]");
  add("skips the work when inputs are zero", row_spec(B, cpu_softmax("", "", "if (xr[0] == 0.0f) return;")),
      EvalStatus::kVerifyFailed, "not_written", "zeros");
  add("writes into an input", row_spec(B, cpu_softmax("((float*)xr)[0] = 0.0f;")), EvalStatus::kVerifyFailed,
      "input_modified", "normal");
  // Each block shifts by the max of whichever block ran before it: mathematically the same
  // softmax, but the rounding depends on the order blocks run in.
  add("nondeterministic (a race between blocks)", row_spec(B, R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
static float g_last_max = 0;
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t cols = *(const int64_t*)p[2];
  const float* xr = x + (int64_t)b->block_idx[0] * cols;
  float* yr = y + (int64_t)b->block_idx[0] * cols;
  float m = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
  const float shift = g_last_max;
  g_last_max = m;
  float s = 0;
  for (int64_t c = 0; c < cols; ++c) s += expf(xr[c] - shift);
  for (int64_t c = 0; c < cols; ++c) yr[c] = expf(xr[c] - shift) / s;
}
)"),
      EvalStatus::kVerifyFailed, "nondeterministic", "normal");
  add("returns the previous call's output", row_spec(B, R"(
#include <math.h>
#include <string.h>
#include "runtime/cpu_kernel_abi.h"
static float g_rows[64][256];
static int g_done[64];
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t cols = *(const int64_t*)p[2];
  const int64_t row = b->block_idx[0];
  const float* xr = x + row * cols;
  if (!g_done[row]) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    for (int64_t c = 0; c < cols; ++c) s += exp((double)xr[c] - m);
    for (int64_t c = 0; c < cols; ++c) g_rows[row][c] = (float)(exp((double)xr[c] - m) / s);
    g_done[row] = 1;
  }
  memcpy(y + row * cols, g_rows[row], cols * sizeof(float));
}
)"),
      EvalStatus::kVerifyFailed, "stale_output", "uniform");
  {
    KernelSpec s = row_spec(B, R"(
#include <math.h>
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t cols = *(const int64_t*)p[2];
  float* sums = *(float* const*)p[3];            // never zeroed: reads what was there before
  const int64_t row = b->block_idx[0];
  const float* xr = x + row * cols;
  float m = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
  for (int64_t c = 0; c < cols; ++c) sums[row] += expf(xr[c] - m);
  for (int64_t c = 0; c < cols; ++c) y[row * cols + c] = expf(xr[c] - m) / sums[row];
}
)");
    s.plan.scratch = {ScratchBuffer{"sums", "size0_0 * 4"}};
    s.plan.launches[0].args.push_back(ArgBinding::scratch(0));
    add("reads uninitialized memory", std::move(s), EvalStatus::kVerifyFailed, "uninitialized_read", "normal");
  }
  {
    KernelSpec s = row_spec(B, cpu_softmax(""));
    s.plan.launches[0].shared_mem_bytes = "2097152";
    add("asks for more shared memory than the device has", std::move(s), EvalStatus::kRejected, "", "",
        "shared memory");
  }
  {
    KernelSpec s = row_spec(B, cpu_softmax(""));
    s.plan.outputs = {OutputSpec::explicit_layout(DType::kFloat32, {"size0_0", "size0_1"}, {"1", "size0_0"})};
    add("changes output strides", std::move(s), EvalStatus::kVerifyFailed, "output_layout", "", "sizes/strides");
  }
  // Cheats that fit the newer shapes of operators: in place, broadcast, reduction.
  {
    const std::string arch = sm.target.arch;
    OpSignature relu_ = OpSignature{"aten::relu_", "", {Arg::tensor(matrix(DeviceType::kCpu, {kRows, kCols}))},
                                    target_for(B, arch)};
    KernelSpec s = row_spec(B, R"(
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];               // a scratch copy: self is never written
  const int64_t cols = *(const int64_t*)p[2];
  const int64_t row = b->block_idx[0];
  for (int64_t c = 0; c < cols; ++c) y[row * cols + c] = x[row * cols + c] < 0 ? 0.0f : x[row * cols + c];
}
)");
    s.plan.outputs = {OutputSpec::in_place(0)};
    s.plan.scratch = {ScratchBuffer{"copy", "numel0 * 4"}};
    s.plan.launches[0].args = {ArgBinding::input(0), ArgBinding::scratch(0), ArgBinding::size("size0_1")};
    c.push_back(Case{"an in-place kernel that writes a copy", std::move(s), EvalStatus::kVerifyFailed, "not_written",
                     "normal", "written in place", 60000, relu_});
  }
  {
    OpSignature bias_add{"aten::add", "Tensor",
                         {Arg::tensor(matrix(DeviceType::kCpu, {kRows, kCols})),
                          Arg::tensor(matrix(DeviceType::kCpu, {kCols})), Arg::integer(1)},
                         target_for(B, sm.target.arch)};
    KernelSpec s = row_spec(B, R"(
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  const float* bias = *(const float* const*)p[1];
  float* y = *(float* const*)p[2];
  const int64_t cols = *(const int64_t*)p[3];
  const int64_t i0 = (int64_t)b->block_idx[0] * cols;
  for (int64_t i = i0; i < i0 + cols; ++i) y[i] = x[i] + bias[i];   // bias indexed as if it were x's size
}
)");
    s.plan.launches[0].args = {ArgBinding::input(0), ArgBinding::input(1), ArgBinding::output(0),
                               ArgBinding::size("size0_1")};
    c.push_back(Case{"a broadcast that reads past its operand", std::move(s), EvalStatus::kVerifyFailed,
                     "nan_inf_positions", "normal", "", 60000, bias_add});
  }
  {
    OpSignature row_sum{"aten::sum", "dim_IntList",
                        {Arg::tensor(matrix(DeviceType::kCpu, {kRows, kCols + 1})), Arg::int_list({-1}),
                         Arg::boolean(false), Arg::none()},
                        target_for(B, sm.target.arch)};
    KernelSpec s = row_spec(B, R"(
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t cols = *(const int64_t*)p[2];
  const float* xr = x + (int64_t)b->block_idx[0] * cols;
  double s = 0;
  for (int64_t c = 0; c + 4 <= cols; c += 4) s += (double)xr[c] + xr[c + 1] + xr[c + 2] + xr[c + 3];   // the tail is dropped
  y[b->block_idx[0]] = (float)s;
}
)");
    s.plan.outputs = {OutputSpec::explicit_layout(DType::kFloat32, {"size0_0"}, {"1"})};
    c.push_back(Case{"a reduction that drops the tail", std::move(s), EvalStatus::kVerifyFailed, "accuracy", "normal",
                     "", 60000, row_sum});
  }
  {
    // Right wherever a row's maximum is unique; on ties (a row of zeros) the last index, not the first.
    OpSignature row_argmax{"aten::argmax", "",
                           {Arg::tensor(matrix(DeviceType::kCpu, {kRows, kCols})), Arg::integer(-1), Arg::boolean(false)},
                           target_for(B, sm.target.arch)};
    KernelSpec s = row_spec(B, R"(
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  int64_t* y = *(int64_t* const*)p[1];
  const int64_t cols = *(const int64_t*)p[2];
  const float* xr = x + (int64_t)b->block_idx[0] * cols;
  int64_t at = 0;
  for (int64_t c = 1; c < cols && xr[at] == xr[at]; ++c) {   // the first NaN ends the row, as in PyTorch
    if (xr[c] != xr[c] || xr[c] >= xr[at]) at = c;             // >=: the last of equal maxima
  }
  y[b->block_idx[0]] = at;
}
)");
    s.plan.outputs = {OutputSpec::explicit_layout(DType::kInt64, {"size0_0"}, {"1"})};
    c.push_back(Case{"an argmax that returns the last of equal maxima", std::move(s), EvalStatus::kVerifyFailed,
                     "accuracy", "zeros", "values differ", 60000, row_argmax});
  }
  {
    // Right inside the image; at its border the window's padding is counted, though the call says not to.
    OpSignature avg_pool{"aten::avg_pool2d", "",
                         {Arg::tensor(matrix(DeviceType::kCpu, {kRows / 16, 1, 16, 16})), Arg::int_list({3, 3}),
                          Arg::int_list({1, 1}), Arg::int_list({1, 1}), Arg::boolean(false), Arg::boolean(false),
                          Arg::none()},
                         target_for(B, sm.target.arch)};
    KernelSpec s = row_spec(B, R"(
#include "runtime/cpu_kernel_abi.h"
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* p) {
  const float* x = *(const float* const*)p[0];
  float* y = *(float* const*)p[1];
  const int64_t W = *(const int64_t*)p[2], H = 16;
  const int64_t r = (int64_t)b->block_idx[0], oh = r % H;
  const float* xp = x + (r / H) * H * W;
  for (int64_t ow = 0; ow < W; ++ow) {
    double s = 0;
    for (int64_t h = oh - 1; h <= oh + 1; ++h)
      for (int64_t w = ow - 1; w <= ow + 1; ++w)
        if (h >= 0 && h < H && w >= 0 && w < W) s += xp[h * W + w];
    y[r * W + ow] = (float)(s / 9);   // count_include_pad=False: the border windows have fewer than 9
  }
}
)");
    s.plan.launches[0].grid[0] = "numel0 / size0_3";
    s.plan.launches[0].args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size("size0_3")};
    c.push_back(Case{"an average pool that counts the padding it was told not to", std::move(s),
                     EvalStatus::kVerifyFailed, "accuracy", "normal", "", 60000, avg_pool});
  }
  // The CPU's "another stream": work that outlives the launch on a thread of its own.
  add("launches work outside the launch (a thread)", row_spec(B, cpu_softmax("pthread_t t; pthread_create(&t, 0, work, 0);",
                                                                              "#include <pthread.h>\nstatic void* work(void*) { return 0; }\n")),
      EvalStatus::kCompileError, "", "", "pthread_create");
  return c;
}

std::vector<Case> cuda_corpus(const OpSignature& sm) {
  const Backend B = Backend::kCuda;
  std::vector<Case> c;
  auto add = [&](std::string name, KernelSpec spec, EvalStatus st, std::string check = "", std::string trial = "",
                 std::string msg = "") {
    c.push_back(Case{std::move(name), std::move(spec), st, std::move(check), std::move(trial), std::move(msg), 60000, sm});
  };
  add("does not compile", row_spec(B, "this is not CUDA;"), EvalStatus::kCompileError, "", "", "compile error");
  add("traps", row_spec(B, cuda_softmax("__trap();")), EvalStatus::kFault);
  // clock64() is volatile: the compiler cannot prove the loop ends, or drop it.
  c.push_back(Case{"hangs", row_spec(B, cuda_softmax("while (clock64() >= 0) __nanosleep(1000);")), EvalStatus::kTimeout,
                   "", "", "verify", 3000, sm});
  add("writes out of bounds",
      row_spec(B, cuda_softmax("if (blockIdx.x + 1 == gridDim.x && threadIdx.x == 0) yr[cols] = 1.0f;")),
      EvalStatus::kVerifyFailed, "out_of_bounds", "normal", "after the end");
  add("wrong only for large-magnitude inputs", row_spec(B, cuda_softmax("", "", "", "0.0f")), EvalStatus::kVerifyFailed,
      "", "large");
  add("wrong only in the last element",
      row_spec(B, cuda_softmax("if (blockIdx.x + 1 == gridDim.x && threadIdx.x == 0) yr[cols - 1] *= 1.001f;")),
      EvalStatus::kVerifyFailed, "accuracy", "normal", "[63, 255]");
  add("skips the work when inputs are zero", row_spec(B, cuda_softmax("", "", "if (xr[0] == 0.0f) return;")),
      EvalStatus::kVerifyFailed, "not_written", "zeros");
  add("writes into an input",
      row_spec(B, cuda_softmax("__syncthreads(); if (threadIdx.x == 0) ((float*)xr)[0] = 0.0f;")),
      EvalStatus::kVerifyFailed, "input_modified", "normal");
  // The last bit of each element flipped by the SM clock: right to an ulp, different every run.
  add("nondeterministic", row_spec(B, cuda_softmax("__syncthreads(); if ((clock64() >> 3) & 1) for (long long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __int_as_float(__float_as_int(yr[c]) ^ 1);")),
      EvalStatus::kVerifyFailed, "nondeterministic", "normal");
  add("returns the previous call's output", row_spec(B, cuda_softmax(
      "__syncthreads(); if (g_done[blockIdx.x]) { for (long long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = g_rows[blockIdx.x][c]; }"
      " else { for (long long c = threadIdx.x; c < cols; c += blockDim.x) g_rows[blockIdx.x][c] = yr[c]; __syncthreads(); if (threadIdx.x == 0) g_done[blockIdx.x] = 1; }",
      "__device__ float g_rows[64][256]; __device__ int g_done[64];")),
      EvalStatus::kVerifyFailed, "stale_output", "uniform");
  {
    KernelSpec s = row_spec(B, cuda_softmax("", "", "if (threadIdx.x == 0) sums[blockIdx.x] += s; __syncthreads(); s = sums[blockIdx.x];"));
    s.source.replace(s.source.find("long long cols)"), 15, "long long cols, float* sums)");
    s.plan.scratch = {ScratchBuffer{"sums", "size0_0 * 4"}};
    s.plan.launches[0].args.push_back(ArgBinding::scratch(0));
    add("reads uninitialized memory", std::move(s), EvalStatus::kVerifyFailed, "uninitialized_read", "normal");
  }
  // A device-side launch onto another stream needs relocatable device code and the device
  // runtime, which a candidate cannot bring: NVRTC refuses it.
  add("launches on another stream", row_spec(B, cuda_softmax("if (threadIdx.x == 0) { cudaStream_t st; cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking); other<<<1, 1, 0, st>>>(y); }",
                                                             "extern \"C\" __global__ void other(float* y) { y[0] = 0; }")),
      EvalStatus::kCompileError);
  {
    KernelSpec s = row_spec(B, cuda_softmax(""));
    s.plan.launches[0].shared_mem_bytes = "1048576";
    add("asks for more shared memory than the device has", std::move(s), EvalStatus::kRejected, "", "", "shared memory");
  }
  {
    KernelSpec s = row_spec(B, cuda_softmax(""));
    s.plan.outputs = {OutputSpec::explicit_layout(DType::kFloat32, {"size0_0", "size0_1"}, {"1", "size0_0"})};
    add("changes output strides", std::move(s), EvalStatus::kVerifyFailed, "output_layout", "", "sizes/strides");
  }
  return c;
}

// ---- running them ------------------------------------------------------------------------------------

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

WorkerOptions worker_options(const std::string& device, const std::string& build_cache) {
  WorkerOptions o;
  o.program = env_or_empty("KFORGE_WORKER");
  INFO("KFORGE_WORKER must name the kforge-worker launcher (ctest sets it)");
  REQUIRE(!o.program.empty());
  o.device = device;
  o.build_cache_dir = build_cache;
  return o;
}

EvalJob job_for(uint64_t id, const Case& c) {
  EvalJob j;
  j.job_id = id;
  j.signature = c.signature;
  j.spec = c.spec;
  j.policy.seed = 42;
  j.policy.measure = false;
  j.run_budget_ms = c.run_budget_ms;
  return j;
}

void check_case(const Case& c, const EvalResult& r) {
  INFO("case: " << c.name);
  INFO("status " << eval_status_name(r.status) << " in " << r.phase << ": " << r.message);
  INFO("verify: " << r.verify.failed_check << " / " << r.verify.trial << " / " << r.verify.detail);
  INFO("build log: " << r.build_log.substr(0, 2000));
  CHECK(r.status == c.status);
  if (!c.check.empty()) CHECK(r.verify.failed_check == c.check);
  if (c.status == EvalStatus::kVerifyFailed) CHECK(!r.verify.failed_check.empty());
  if (!c.trial.empty()) CHECK(r.verify.trial == c.trial);
  if (!c.message_has.empty()) {
    const std::string all = r.message + "\n" + r.verify.detail + "\n" + r.build_log + "\n" + r.phase;
    CHECK_THAT(all, Catch::Contains(c.message_has));
  }
}

// A correct candidate: built, every trial passed, timed against PyTorch's kernel.
void check_passes(WorkerProcess& w, uint64_t id, const OpSignature& sig, const KernelSpec& spec, const char* clock) {
  Case good{"correct", spec, EvalStatus::kMeasured, "", "", "", 60000, sig};
  EvalJob j = job_for(id, good);
  j.policy.measure = true;
  const EvalResult r = w.evaluate(j);
  INFO("status " << eval_status_name(r.status) << " in " << r.phase << ": " << r.message << " | " << r.verify.detail);
  INFO("build log: " << r.build_log.substr(0, 2000));
  INFO("timing: " << r.timing.clock << " baseline " << r.timing.baseline_median_ns << " ns, candidate "
                  << r.timing.candidate_median_ns << " ns, speedup " << r.timing.speedup << " +- "
                  << r.timing.noise_band << (r.timing.significant ? " (significant)" : " (noise)") << "; checks: "
                  << r.verify.checks << "; max abs error " << r.verify.max_abs_error << " (PyTorch's "
                  << r.verify.torch_max_abs_error << ")");
  REQUIRE(r.status == EvalStatus::kMeasured);
  CHECK(r.verify.failed_check.empty());
  CHECK(r.verify.trials_run >= kMinTrials);
  CHECK(r.verify.trials_passed == r.verify.trials_run);
  CHECK(r.verify.max_abs_error <= 2 * r.verify.torch_max_abs_error + 1e-5);
  // CUDA: CUPTI's kernel durations where the worker could enable them, else events.
  if (std::string(clock) == "cuda_events") {
    CHECK((r.timing.clock == "cupti" || r.timing.clock == "cuda_events"));
  } else {
    CHECK(r.timing.clock == clock);
  }
  CHECK(r.timing.runs >= kMinMeasureRuns);
  CHECK(r.timing.baseline_median_ns > 0);
  CHECK(r.timing.candidate_median_ns > 0);
  CHECK(r.timing.speedup > 0);
  CHECK(r.timing.bytes > 0);
  CHECK(r.timing.bandwidth_ceiling_bytes_per_s > 0);
  CHECK(!r.artifact.empty());
  CHECK(r.environment.torch_version.size() > 0);
  CHECK(r.worker_pid > 0);
  // Where the evaluation's time went: every phase the worker entered, in order, each timed.
  std::vector<std::string> phases;
  for (const auto& [phase, ms] : w.last_phase_ms()) {
    phases.push_back(phase);
    CHECK(ms >= 0);
  }
  // measure: the measurer's set-up, then PyTorch's kernel alone (Note [Whose fault is a death in
  // measure]), then the timed pairs.
  CHECK(phases == std::vector<std::string>{"start", "build", "verify", "measure", "baseline", "measure"});
}

void run_corpus(const std::string& device, const OpSignature& softmax, const OpSignature& layer_norm,
                const std::vector<Case>& corpus, const KernelSpec& good_softmax, const KernelSpec& good_layer_norm,
                const KernelSpec& one_pass_layer_norm, const char* clock) {
  TempDir t("kforge-worker-eval-test");
  WorkerProcess w(worker_options(device, (t.path / "builds").string()));
  uint64_t id = 1;
  check_passes(w, id++, softmax, good_softmax, clock);
  check_passes(w, id++, layer_norm, good_layer_norm, clock);
  const uint64_t starts_before = w.starts();
  uint64_t deaths = 0;
  for (const Case& c : corpus) {
    const EvalResult r = w.evaluate(job_for(id++, c));
    check_case(c, r);
    if (r.status == EvalStatus::kFault || r.status == EvalStatus::kTimeout) ++deaths;
  }
  {
    Case c{"layer_norm with a one-pass float variance", one_pass_layer_norm, EvalStatus::kVerifyFailed, "accuracy",
           "offset", "", 60000, layer_norm};
    check_case(c, w.evaluate(job_for(id++, c)));
  }
  // The pool kept serving: every fault and hang cost one worker, and the next job got a new one.
  check_passes(w, id++, softmax, good_softmax, clock);
  CHECK(w.starts() == starts_before + deaths);
  // A known candidate again: its build comes from the build cache.
  Case again{"again", good_softmax, EvalStatus::kVerified, "", "", "", 60000, softmax};
  const EvalResult r = w.evaluate(job_for(id++, again));
  CHECK(r.status == EvalStatus::kVerified);
  CHECK(r.build_cached);
}

}  // namespace

TEST_CASE("worker: CPU candidates that cheat are rejected with the right reason, correct ones pass and are timed",
          "[cpu]") {
  const std::string arch = cpu_host_environment("").arch;
  const OpSignature sm = softmax_signature(Backend::kCpu, arch);
  const OpSignature ln = layer_norm_signature(Backend::kCpu, arch);
  run_corpus("cpu", sm, ln, cpu_corpus(sm), row_spec(Backend::kCpu, cpu_softmax("")),
             layer_norm_spec(Backend::kCpu, kCpuLayerNorm),
             layer_norm_spec(Backend::kCpu, std::string("#define ONE_PASS_FLOAT 1\n") + kCpuLayerNorm), "steady_clock");
}

TEST_CASE("worker: CUDA candidates that cheat are rejected with the right reason, correct ones pass and are timed",
          "[gpu]") {
  const std::string arch = env_or_empty("KFORGE_TEST_CUDA_ARCH").empty() ? "sm_90" : env_or_empty("KFORGE_TEST_CUDA_ARCH");
  const OpSignature sm = softmax_signature(Backend::kCuda, arch);
  const OpSignature ln = layer_norm_signature(Backend::kCuda, arch);
  std::string one_pass = kCudaLayerNorm;
  // float sums of x and x*x: the variance cancels for inputs far from zero.
  const std::string two_pass_var = "double v = 0;\n  for (long long c = threadIdx.x; c < cols; c += blockDim.x) v += (xr[c] - mean) * (xr[c] - mean);";
  one_pass.replace(one_pass.find(two_pass_var), two_pass_var.size(),
                   "float v = 0;\n  for (long long c = threadIdx.x; c < cols; c += blockDim.x) v += xr[c] * xr[c];");
  const std::string final_var = "rsqrt(red[0] / cols + eps)";
  one_pass.replace(one_pass.find(final_var), final_var.size(), "rsqrt((double)((float)(red[0] / cols) - (float)mean * (float)mean) + eps)");
  run_corpus("cuda:0", sm, ln, cuda_corpus(sm), row_spec(Backend::kCuda, cuda_softmax("")),
             layer_norm_spec(Backend::kCuda, kCudaLayerNorm), layer_norm_spec(Backend::kCuda, one_pass), "cuda_events");
}

namespace {

// The scheduling policy and nice value in a /proc/<pid>/stat line (fields 41 and 19, counted
// after the ')' that ends the command name).
std::pair<int, int> policy_and_nice(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return {-1, 99};
  std::istringstream in(stat.substr(close + 2));
  std::vector<std::string> f;   // f[0] is field 3
  for (std::string x; in >> x;) f.push_back(x);
  if (f.size() < 39) return {-1, 99};
  return {std::stoi(f[41 - 3]), std::stoi(f[19 - 3])};
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every thread of `pid` (python's, torch's pool) with its policy and nice.
std::vector<std::pair<int, int>> thread_scheduling(pid_t pid) {
  std::vector<std::pair<int, int>> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    out.push_back(policy_and_nice(read_all(e.path() / "stat")));
  }
  return out;
}

// Starts a real worker whose CPU compiler is a wrapper that appends its own stat line to
// `record` before it runs c++, builds one candidate, and returns the worker's threads' and every
// compiler run's (policy, nice).
struct Observed {
  std::vector<std::pair<int, int>> worker_threads;
  std::vector<std::pair<int, int>> compiler_runs;
  std::string note;
};

Observed observe_worker(WorkerPriority priority) {
  TempDir t("kforge-worker-priority-test");
  const std::string record = t / "compiler-runs";
  const std::string wrapper = t / "cxx-wrapper.sh";
  std::ofstream(wrapper) << "#!/bin/sh\ncat /proc/$$/stat >> '" << record << "'\nexec c++ \"$@\"\n";
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  WorkerOptions o = worker_options("cpu", t / "builds");
  o.priority = priority;
  o.env.emplace_back("KFORGE_CXX", wrapper);
  WorkerProcess w(o);
  const Status started = w.start();
  INFO(started.to_string());
  REQUIRE(started.ok());
  Observed seen;
  seen.note = w.ready()->note;
  seen.worker_threads = thread_scheduling(w.pid());
  // A build: the compiler runs for the candidate, not only for its --version at start.
  const OpSignature sm = softmax_signature(Backend::kCpu, cpu_host_environment("").arch);
  Case c{"correct", row_spec(Backend::kCpu, cpu_softmax("")), EvalStatus::kVerified, "", "", "", 60000, sm};
  const EvalResult r = w.evaluate(job_for(1, c));
  INFO(r.message << "\n" << r.build_log.substr(0, 2000));
  CHECK(r.status == EvalStatus::kVerified);
  std::istringstream lines(read_all(record));
  for (std::string line; std::getline(lines, line);) seen.compiler_runs.push_back(policy_and_nice(line));
  return seen;
}

}  // namespace

// Note [Idle workers] in evaluator/worker_process.h: the search must not take the serving
// processes' cores. The worker, every thread torch starts in it, and every compiler it runs are at
// SCHED_IDLE; workers.priority = normal (a host that only searches) leaves all of them as the
// supervisor is.
TEST_CASE("worker: a started worker with its threads and the compilers it runs is at idle priority (or all normal when asked)",
          "[cpu]") {
  const Observed idle = observe_worker(WorkerPriority::kIdle);
  INFO("note: " << idle.note);
  CHECK_THAT(idle.note, Catch::Contains("scheduling SCHED_IDLE"));
  REQUIRE(idle.worker_threads.size() >= 2);   // python's thread and torch's pool at least
  for (const auto& [policy, nice] : idle.worker_threads) CHECK(policy == SCHED_IDLE);
  REQUIRE(idle.compiler_runs.size() >= 2);    // --version at start, then the build
  for (const auto& [policy, nice] : idle.compiler_runs) CHECK(policy == SCHED_IDLE);

  const Observed normal = observe_worker(WorkerPriority::kNormal);
  const int own_policy = ::sched_getscheduler(0);
  const int own_nice = ::getpriority(PRIO_PROCESS, 0);
  INFO("note: " << normal.note);
  CHECK_THAT(normal.note, Catch::Contains("scheduling SCHED_OTHER nice " + std::to_string(own_nice)));
  REQUIRE(!normal.worker_threads.empty());
  for (const auto& [policy, nice] : normal.worker_threads) {
    CHECK(policy == own_policy);
    CHECK(nice == own_nice);
  }
  REQUIRE(normal.compiler_runs.size() >= 2);
  for (const auto& [policy, nice] : normal.compiler_runs) {
    CHECK(policy == own_policy);
    CHECK(nice == own_nice);
  }
}

// The CUDA corpus is compiled by the GPU run only; here NVRTC (no GPU needed) checks that every
// CUDA case builds except those meant not to, so a typo in a kernel cannot pass for a rejection.
TEST_CASE("worker: the CUDA corpus builds with NVRTC exactly where it should", "[cpu]") {
  StatusOr<const Nvrtc*> nvrtc = Nvrtc::load();
  if (!nvrtc.ok()) {
    WARN("no NVRTC on this host: " << nvrtc.status().to_string());
    return;
  }
  TempDir t("kforge-worker-eval-test");
  StatusOr<CandidateBuilder> b = CandidateBuilder::for_cuda((t.path / "cache").string(), *nvrtc, 9, 0);
  REQUIRE(b.ok());
  const OpSignature sm = softmax_signature(Backend::kCuda, "sm_90");
  std::vector<Case> all = cuda_corpus(sm);
  all.push_back(Case{"correct softmax", row_spec(Backend::kCuda, cuda_softmax("")), EvalStatus::kMeasured, "", "", "", 0, sm});
  all.push_back(Case{"correct layer_norm", layer_norm_spec(Backend::kCuda, kCudaLayerNorm), EvalStatus::kMeasured, "", "", "", 0, sm});
  for (const Case& c : all) {
    StatusOr<BuildOutput> out = b->build(c.spec, 60000);
    REQUIRE(out.ok());
    INFO("case: " << c.name << "\n" << out->log);
    CHECK(out->compiled == (c.status != EvalStatus::kCompileError));
    CHECK(c.spec.validate().ok());
  }
}
