// 2D pooling of a contiguous [N, C, H, W] input, KF_OV outputs of a row per thread (CUDA) or rows of
// them per block (CPU), the window geometry compiled in:
// - aten::max_pool2d_with_indices (resnet's stem; F.max_pool2d): geometry and output size are the
//   catalog's (catalog::pool2d_geometry). Each output element walks its window as PyTorch's
//   kernels do, row by row, each row left to right, from maxval = -inf and maxidx = the first
//   in-bounds element, taking an element when val > maxval or val is NaN: ties keep the first
//   maximum, a window with NaNs gives its last NaN (both backends of torch 2.11 behave so). The
//   values are input values, exact; the indices (h * W + w within the plane, int64) are checked
//   exactly by the worker.
// - aten::avg_pool2d (F.avg_pool2d): the same geometry (dilation 1); the divisor counts the
//   padding (count_include_pad), or not, or is divisor_override, as PyTorch's kernels count it.
// - aten::_adaptive_avg_pool2d (F.adaptive_avg_pool2d to anything but 1x1): windows
//   [floor(o * H / OH), ceil((o + 1) * H / OH)).
// The averages sum in kf_acc (double for float32 on CUDA, double on CPU; PyTorch sums in float):
// at least as accurate, which is what the worker's criterion asks.
//
// Note [Whole windows]
// ~~~~~~~~~~~~~~~~~~~~
// A window's loop has bounds known only at run time (padding and the input's edges clip it), so
// the CUDA kernels would issue its loads one after the other, each add or compare waiting for its
// load: a 3x3 window paid nine memory latencies in a row. Most windows lie wholly inside the input;
// for them the CUDA kernels load all KH x KW elements first (the loops unrolled over the
// compiled-in window) and then reduce in the general loop's order with its comparison or sum, so
// the result, the index and the divisor are the ones the general loop gives.
// A channels-last input (KF_CL) gives a channels-last output, as PyTorch's kernels return it: the
// CUDA kernels number output elements in storage order (channel innermost), the CPU kernels take
// rows of [N, OH] and walk each window once for all channels.
#include <algorithm>

#include "runtime/op_catalog.h"
#include "search_daemon/proposers/templates/template_family.h"

namespace kforge::search::templates {

namespace {

// KF_KH..KF_OW: catalog::Pool2d. The window of output (oh, ow) as PyTorch computes it.
const char* const kPoolWindow = R"kf(
#define KF_WINDOW(oh, ow, hs, he, ws, we)                                     \
  kf_i64 hs = (oh) * KF_SH - KF_PH;                                          \
  kf_i64 ws = (ow) * KF_SW - KF_PW;                                          \
  const kf_i64 he = hs + (KF_KH - 1) * KF_DH + 1 < KF_H ? hs + (KF_KH - 1) * KF_DH + 1 : KF_H; \
  const kf_i64 we = ws + (KF_KW - 1) * KF_DW + 1 < KF_W ? ws + (KF_KW - 1) * KF_DW + 1 : KF_W; \
  while (hs < 0) hs += KF_DH;                                                \
  while (ws < 0) ws += KF_DW;
)kf";

// Note [Outputs per thread]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A thread computes KF_OV consecutive outputs of one output row (contiguous layout; channels-last
// takes 1), so the position's divisions are paid once for KF_OV outputs and the outputs go out in
// one vector store (the indices in 16-byte ones); OW is a multiple of KF_OV (`valid`), so a group
// never crosses a row and the stores are aligned. Thread g's group starts at output g * KF_OV.
// Note [Window spans]
// ~~~~~~~~~~~~~~~~~~~
// With KF_OV outputs per thread, the windows of a group overlap (a 3x3 window at stride 2 shares a
// column with the next), and each was read element by element: 72 two-byte loads for 8 bf16
// outputs, each instruction touching 32 sectors for 64 useful bytes. The max pooling kernel ran at
// 74% of the H100's copy bandwidth (its int64 indices counted), most likely held by those load
// instructions rather than by DRAM (not profiled). With `span`, a thread reads, for each window row, the columns its KF_OV windows cover as
// aligned 16-byte vectors (3 per row for 8 bf16 outputs of a 3x3 window at stride 2), then reduces
// each window from registers in the general loop's order, masking what lies outside the input as
// the `edges` path does. valid() keeps the vectors aligned: KF_W a multiple of the vector, so a
// vector is wholly inside a row or wholly outside it, and KF_OV * KF_SW a multiple of it, so
// every group's first column sits at the same offset in its first vector, a compile-time constant
// (KF_SPAN_OFF) like every register index.
const char* const kCudaPoolGroup = R"kf(
#if KF_CL
#define KF_GROUP(g, oh, ow0, base) KF_POSITION(g, oh, ow0, base)
#else
#define KF_GROUP(g, oh, ow0, base)                                            \
  const kf_i64 ow0 = ((g) % (KF_OW / KF_OV)) * KF_OV;                        \
  const kf_i64 oh##_r = (g) / (KF_OW / KF_OV);                               \
  const kf_i64 oh = oh##_r % KF_OH;                                          \
  const kf_i64 base = (oh##_r / KF_OH) * (KF_H * KF_W);
#endif
// The body that follows runs for each of this thread's groups g: KF_ITEMS of them, KF_BLOCK apart,
// those below n.
#define KF_FOR_GROUPS(g, n)                                                                  \
  _Pragma("unroll") for (int kf_item = 0; kf_item < KF_ITEMS; ++kf_item)                    \
    if (const kf_i64 g = (kf_i64)blockIdx.x * (KF_BLOCK * KF_ITEMS) + threadIdx.x + (kf_i64)kf_item * KF_BLOCK; g < (n))
)kf";

const char* const kCudaMaxPool = R"kf(
// The max of window (oh, ow) and its first index, in the general loop's order (row by row, each
// left to right, from -inf and the first in-bounds element, taking val > max or NaN).
__device__ __forceinline__ void kf_max_window(const kf_t* __restrict__ xp, kf_i64 oh, kf_i64 ow, float& m, kf_i64& best) {
  const kf_i64 h0 = oh * KF_SH - KF_PH, w0 = ow * KF_SW - KF_PW;
  m = KF_NEG_INF;
#if KF_EDGES
  // Every window the same way, its out-of-bounds elements masked (Note [Whole windows]): no
  // branch between edge and interior windows that a warp's threads would take both ways.
  best = -1;
  float v[KF_KH][KF_KW];
#pragma unroll
  for (int a = 0; a < KF_KH; ++a) {
#pragma unroll
    for (int b = 0; b < KF_KW; ++b) {
      const kf_i64 h = h0 + a * KF_DH, w = w0 + b * KF_DW;
      v[a][b] = h >= 0 && h < KF_H && w >= 0 && w < KF_W ? kf_to_float(xp[KF_AT(h, w)]) : KF_NEG_INF;
    }
  }
#pragma unroll
  for (int a = 0; a < KF_KH; ++a) {
#pragma unroll
    for (int b = 0; b < KF_KW; ++b) {
      const kf_i64 h = h0 + a * KF_DH, w = w0 + b * KF_DW;
      if (h >= 0 && h < KF_H && w >= 0 && w < KF_W) {
        if (best < 0) best = h * KF_W + w;
        if (v[a][b] > m || v[a][b] != v[a][b]) {
          m = v[a][b];
          best = h * KF_W + w;
        }
      }
    }
  }
#else
  // Note [Whole windows]: a window inside the input, its loads issued together.
  if (h0 >= 0 && w0 >= 0 && h0 + (KF_KH - 1) * KF_DH < KF_H && w0 + (KF_KW - 1) * KF_DW < KF_W) {
    float v[KF_KH][KF_KW];
#pragma unroll
    for (int a = 0; a < KF_KH; ++a) {
#pragma unroll
      for (int b = 0; b < KF_KW; ++b) v[a][b] = kf_to_float(xp[KF_AT(h0 + a * KF_DH, w0 + b * KF_DW)]);
    }
    best = h0 * KF_W + w0;
#pragma unroll
    for (int a = 0; a < KF_KH; ++a) {
#pragma unroll
      for (int b = 0; b < KF_KW; ++b) {
        if (v[a][b] > m || v[a][b] != v[a][b]) {
          m = v[a][b];
          best = (h0 + a * KF_DH) * KF_W + w0 + b * KF_DW;
        }
      }
    }
    return;
  }
  KF_WINDOW(oh, ow, hs, he, ws, we)
  best = hs * KF_W + ws;
  for (kf_i64 h = hs; h < he; h += KF_DH) {
    for (kf_i64 w = ws; w < we; w += KF_DW) {
      const float v = kf_to_float(xp[KF_AT(h, w)]);
      if (v > m || v != v) {
        m = v;
        best = h * KF_W + w;
      }
    }
  }
#endif
}

#if KF_SPAN
// Note [Window spans]: the KF_OV windows of a group, row a of each, read as aligned 16-byte
// vectors of input row h0 + a * KF_DH, then reduced in the general loop's order.
#define KF_VEC (16 / (int)sizeof(kf_t))
#define KF_SPAN_COLS ((KF_OV - 1) * KF_SW + (KF_KW - 1) * KF_DW + 1)
#define KF_SPAN_OFF ((KF_VEC - KF_PW % KF_VEC) % KF_VEC)
#define KF_SPAN_VECS ((KF_SPAN_OFF + KF_SPAN_COLS + KF_VEC - 1) / KF_VEC)
__device__ __forceinline__ void kf_max_span(const kf_t* __restrict__ xp, kf_i64 oh, kf_i64 ow0, float (&m)[KF_OV],
                                            kf_i64 (&best)[KF_OV]) {
  const kf_i64 h0 = oh * KF_SH - KF_PH;
  const kf_i64 a0 = ow0 * KF_SW - KF_PW - KF_SPAN_OFF;   // a multiple of KF_VEC (valid())
#pragma unroll
  for (int j = 0; j < KF_OV; ++j) {
    m[j] = KF_NEG_INF;
    best[j] = -1;
  }
#pragma unroll
  for (int a = 0; a < KF_KH; ++a) {
    const kf_i64 h = h0 + a * KF_DH;
    const bool row_in = h >= 0 && h < KF_H;
    float r[KF_SPAN_VECS * KF_VEC];
#pragma unroll
    for (int q = 0; q < KF_SPAN_VECS; ++q) {
      // KF_W is a multiple of KF_VEC: a vector lies wholly inside the row or wholly outside it.
      const kf_i64 w = a0 + q * KF_VEC;
      float part[KF_VEC];
      if (row_in && w >= 0 && w + KF_VEC <= KF_W) {
        kf_load<KF_VEC>(xp + h * KF_W + w, 0, part);
      } else {
#pragma unroll
        for (int k = 0; k < KF_VEC; ++k) part[k] = KF_NEG_INF;
      }
#pragma unroll
      for (int k = 0; k < KF_VEC; ++k) r[q * KF_VEC + k] = part[k];
    }
#pragma unroll
    for (int j = 0; j < KF_OV; ++j) {
#pragma unroll
      for (int b = 0; b < KF_KW; ++b) {
        const int c = KF_SPAN_OFF + j * KF_SW + b * KF_DW;   // a constant once unrolled
        const kf_i64 w = a0 + c;
        if (row_in && w >= 0 && w < KF_W) {
          const kf_i64 at = h * KF_W + w;
          if (best[j] < 0) best[j] = at;
          if (r[c] > m[j] || r[c] != r[c]) {
            m[j] = r[c];
            best[j] = at;
          }
        }
      }
    }
  }
}
#endif

// KF_OV outputs per thread (Note [Outputs per thread]); KF_ITEMS groups per thread, KF_BLOCK apart,
// of n groups.
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_max_pool2d(const kf_t* __restrict__ x, kf_t* __restrict__ y, long long* __restrict__ idx, kf_i64 n) {
  KF_FOR_GROUPS(g, n) {
    KF_GROUP(g, oh, ow0, base)
    float m[KF_OV];
    kf_i64 best[KF_OV];
#if KF_SPAN
    kf_max_span(x + base, oh, ow0, m, best);
#else
#pragma unroll
    for (int j = 0; j < KF_OV; ++j) kf_max_window(x + base, oh, ow0 + j, m[j], best[j]);
#endif
#if KF_OV == 1
    y[g] = kf_from_float(m[0]);
    idx[g] = best[0];
#else
    kf_store<KF_OV>(y, g, m);
#pragma unroll
    for (int j = 0; j < KF_OV; j += 2) {
      reinterpret_cast<longlong2*>(idx)[(g * KF_OV + j) / 2] = make_longlong2(best[j], best[j + 1]);
    }
#endif
  }
}
)kf";

const char* const kCpuMaxPool = R"kf(
#if KF_CL
// KF_ROWS output rows (of OW * C elements) per block, rows numbered over [N, OH]; each window
// walked once, every channel updated at each element (the output holds the running maxima).
extern "C" void kf_max_pool2d(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  float* __restrict__ y = KF_PTR(float, 1);
  int64_t* __restrict__ idx = KF_PTR(int64_t, 2);
  const int64_t rows = KF_I64(3);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t oh = r % KF_OH;
    const float* __restrict__ xn = x + (r / KF_OH) * (KF_H * KF_W * KF_C);
    for (int64_t ow = 0; ow < KF_OW; ++ow) {
      KF_WINDOW(oh, ow, hs, he, ws, we)
      float* __restrict__ m = y + (r * KF_OW + ow) * KF_C;
      int64_t* __restrict__ best = idx + (r * KF_OW + ow) * KF_C;
      for (int64_t c = 0; c < KF_C; ++c) m[c] = -INFINITY, best[c] = hs * KF_W + ws;
      for (int64_t h = hs; h < he; h += KF_DH) {
        for (int64_t w = ws; w < we; w += KF_DW) {
          const float* __restrict__ xv = xn + (h * KF_W + w) * KF_C;
          for (int64_t c = 0; c < KF_C; ++c) {
            const float v = xv[c];
            if (v > m[c] || v != v) {
              m[c] = v;
              best[c] = h * KF_W + w;
            }
          }
        }
      }
    }
  }
}
#else
// KF_ROWS output rows (of OW elements) per block, rows numbered over [planes = N*C, OH].
extern "C" void kf_max_pool2d(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  float* __restrict__ y = KF_PTR(float, 1);
  int64_t* __restrict__ idx = KF_PTR(int64_t, 2);
  const int64_t rows = KF_I64(3);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t oh = r % KF_OH, plane = r / KF_OH;
    const float* __restrict__ xp = x + plane * (KF_H * KF_W);
    for (int64_t ow = 0; ow < KF_OW; ++ow) {
      KF_WINDOW(oh, ow, hs, he, ws, we)
      int64_t best = hs * KF_W + ws;
      float m = -INFINITY;
      for (int64_t h = hs; h < he; h += KF_DH) {
        for (int64_t w = ws; w < we; w += KF_DW) {
          const float v = xp[h * KF_W + w];
          if (v > m || v != v) {
            m = v;
            best = h * KF_W + w;
          }
        }
      }
      y[r * KF_OW + ow] = m;
      idx[r * KF_OW + ow] = best;
    }
  }
}
#endif
)kf";

// KF_MEAN_WINDOW(oh, ow, hs, he, ws, we, div): the in-bounds window of output (oh, ow) and its
// divisor. avg_pool2d's, as PyTorch's kernels compute it (KF_DIVISOR 0: no divisor_override):
const char* const kAvgWindow = R"kf(
#define KF_MEAN_WINDOW(oh, ow, hs, he, ws, we, div)                                  \
  kf_i64 hs = (oh) * KF_SH - KF_PH;                                                 \
  kf_i64 ws = (ow) * KF_SW - KF_PW;                                                 \
  kf_i64 he = hs + KF_KH < KF_H + KF_PH ? hs + KF_KH : KF_H + KF_PH;                \
  kf_i64 we = ws + KF_KW < KF_W + KF_PW ? ws + KF_KW : KF_W + KF_PW;                \
  const kf_i64 pool_size = (he - hs) * (we - ws);                                   \
  hs = hs > 0 ? hs : 0;                                                             \
  ws = ws > 0 ? ws : 0;                                                             \
  he = he < KF_H ? he : KF_H;                                                       \
  we = we < KF_W ? we : KF_W;                                                       \
  const kf_i64 div = KF_DIVISOR != 0 ? (kf_i64)KF_DIVISOR : (KF_INCLUDE_PAD ? pool_size : (he - hs) * (we - ws));
)kf";

// _adaptive_avg_pool2d's: PyTorch's start_index and end_index.
const char* const kAdaptiveWindow = R"kf(
#define KF_MEAN_WINDOW(oh, ow, hs, he, ws, we, div)                                  \
  const kf_i64 hs = ((oh) * KF_H) / KF_OH;                                          \
  const kf_i64 he = (((oh) + 1) * KF_H + KF_OH - 1) / KF_OH;                        \
  const kf_i64 ws = ((ow) * KF_W) / KF_OW;                                          \
  const kf_i64 we = (((ow) + 1) * KF_W + KF_OW - 1) / KF_OW;                        \
  const kf_i64 div = (he - hs) * (we - ws);
)kf";

const char* const kCudaMeanPool = R"kf(
// The mean of window (oh, ow).
__device__ __forceinline__ float kf_mean_window(const kf_t* __restrict__ xp, kf_i64 oh, kf_i64 ow) {
#ifdef KF_KH
  // Note [Whole windows]: avg_pool2d's window inside the input, its loads issued together; the
  // sum in the general loop's order, the divisor what the general case counts there.
  const kf_i64 h0 = oh * KF_SH - KF_PH, w0 = ow * KF_SW - KF_PW;
  if (h0 >= 0 && w0 >= 0 && h0 + KF_KH <= KF_H && w0 + KF_KW <= KF_W) {
    float v[KF_KH][KF_KW];
#pragma unroll
    for (int a = 0; a < KF_KH; ++a) {
#pragma unroll
      for (int b = 0; b < KF_KW; ++b) v[a][b] = kf_to_float(xp[KF_AT(h0 + a, w0 + b)]);
    }
    kf_acc sum = 0;
#pragma unroll
    for (int a = 0; a < KF_KH; ++a) {
#pragma unroll
      for (int b = 0; b < KF_KW; ++b) sum += v[a][b];
    }
    const kf_i64 div = KF_DIVISOR != 0 ? (kf_i64)KF_DIVISOR : (kf_i64)(KF_KH * KF_KW);
    return (float)(sum / (kf_acc)div);
  }
#endif
  KF_MEAN_WINDOW(oh, ow, hs, he, ws, we, div)
  kf_acc sum = 0;
  for (kf_i64 h = hs; h < he; ++h) {
    for (kf_i64 w = ws; w < we; ++w) sum += kf_to_float(xp[KF_AT(h, w)]);
  }
  return hs < he && ws < we ? (float)(sum / (kf_acc)div) : 0.0f;
}

// KF_OV outputs per thread (Note [Outputs per thread]); KF_ITEMS groups per thread, KF_BLOCK apart,
// of n groups.
extern "C" __global__ void __launch_bounds__(KF_BLOCK)
kf_mean_pool2d(const kf_t* __restrict__ x, kf_t* __restrict__ y, kf_i64 n) {
  KF_FOR_GROUPS(g, n) {
    KF_GROUP(g, oh, ow0, base)
    float m[KF_OV];
#pragma unroll
    for (int j = 0; j < KF_OV; ++j) m[j] = kf_mean_window(x + base, oh, ow0 + j);
#if KF_OV == 1
    y[g] = kf_from_float(m[0]);
#else
    kf_store<KF_OV>(y, g, m);
#endif
  }
}
)kf";

const char* const kCpuMeanPool = R"kf(
#if KF_CL
// KF_ROWS output rows (of OW * C elements) per block, rows numbered over [N, OH]; each window
// walked once, summing every channel (KF_C sums in double on the stack).
extern "C" void kf_mean_pool2d(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  float* __restrict__ y = KF_PTR(float, 1);
  const int64_t rows = KF_I64(2);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  double sum[KF_C];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t oh = r % KF_OH;
    const float* __restrict__ xn = x + (r / KF_OH) * (KF_H * KF_W * KF_C);
    for (int64_t ow = 0; ow < KF_OW; ++ow) {
      KF_MEAN_WINDOW(oh, ow, hs, he, ws, we, div)
      for (int64_t c = 0; c < KF_C; ++c) sum[c] = 0;
      for (int64_t h = hs; h < he; ++h) {
        for (int64_t w = ws; w < we; ++w) {
          const float* __restrict__ xv = xn + (h * KF_W + w) * KF_C;
          for (int64_t c = 0; c < KF_C; ++c) sum[c] += xv[c];
        }
      }
      float* __restrict__ yo = y + (r * KF_OW + ow) * KF_C;
      const int empty = !(hs < he && ws < we);
      for (int64_t c = 0; c < KF_C; ++c) yo[c] = empty ? 0.0f : (float)(sum[c] / (double)div);
    }
  }
}
#else
// KF_ROWS output rows (of OW elements) per block, rows numbered over [planes = N*C, OH].
extern "C" void kf_mean_pool2d(const kforge_cpu_block* blk, void* const* p) {
  const float* __restrict__ x = KF_PTR(const float, 0);
  float* __restrict__ y = KF_PTR(float, 1);
  const int64_t rows = KF_I64(2);
  const int64_t r0 = (int64_t)blk->block_idx[0] * KF_ROWS;
  const int64_t r1 = r0 + KF_ROWS < rows ? r0 + KF_ROWS : rows;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t oh = r % KF_OH, plane = r / KF_OH;
    const float* __restrict__ xp = x + plane * (KF_H * KF_W);
    for (int64_t ow = 0; ow < KF_OW; ++ow) {
      KF_MEAN_WINDOW(oh, ow, hs, he, ws, we, div)
      double sum = 0;
      for (int64_t h = hs; h < he; ++h) {
        for (int64_t w = ws; w < we; ++w) sum += xp[h * KF_W + w];
      }
      y[r * KF_OW + ow] = hs < he && ws < we ? (float)(sum / (double)div) : 0.0f;
    }
  }
}
#endif
)kf";

enum class Pool { kMax, kAvg, kAdaptive };

struct PoolCall {
  const TensorMeta* x = nullptr;
  bool channels_last = false;
  catalog::Pool2d g;   // kAdaptive: only h, w, oh, ow
};

std::optional<PoolCall> pool_call(const OpSignature& sig, Backend backend, Pool kind) {
  static constexpr std::string_view kOps[] = {"aten::max_pool2d_with_indices", "aten::avg_pool2d",
                                              "aten::_adaptive_avg_pool2d"};
  static constexpr size_t kArgs[] = {6, 7, 2};
  const auto k = static_cast<size_t>(kind);
  if (sig.op != kOps[k] || !sig.overload.empty() || sig.args.size() != kArgs[k]) return std::nullopt;
  PoolCall c;
  c.x = tensor_arg(sig, 0);
  const std::optional<bool> cl = contiguous_or_channels_last(c.x, backend);
  if (!cl || c.x->sizes.size() != 4) return std::nullopt;
  c.channels_last = *cl;
  // The CPU channels-last mean kernel keeps KF_C sums on its stack (the same bound for every kind).
  if (c.channels_last && backend == Backend::kCpu && c.x->sizes[1] > kMaxCpuChannelsOnStack) return std::nullopt;
  if (kind != Pool::kAdaptive) {
    const std::optional<catalog::Pool2d> g = catalog::pool2d_geometry(sig);
    if (!g) return std::nullopt;
    c.g = *g;
    return c;
  }
  const auto* out = std::get_if<std::vector<int64_t>>(&sig.args[1].value);
  if (out == nullptr || out->size() != 2 || (*out)[0] <= 0 || (*out)[1] <= 0) return std::nullopt;
  c.g.h = c.x->sizes[2];
  c.g.w = c.x->sizes[3];
  c.g.oh = (*out)[0];
  c.g.ow = (*out)[1];
  return c;
}

std::vector<std::string> pool_defines(Pool kind, const PoolCall& c) {
  const catalog::Pool2d& g = c.g;
  std::vector<std::string> d = {define("KF_H", g.h),   define("KF_W", g.w),
                                define("KF_OH", g.oh), define("KF_OW", g.ow),
                                define("KF_C", c.x->sizes[1]), define("KF_CL", c.channels_last ? 1 : 0)};
  if (kind == Pool::kAdaptive) return d;
  for (std::string s : {define("KF_KH", g.kh), define("KF_KW", g.kw), define("KF_SH", g.sh), define("KF_SW", g.sw),
                        define("KF_PH", g.ph), define("KF_PW", g.pw)}) {
    d.push_back(std::move(s));
  }
  if (kind == Pool::kMax) {
    d.push_back(define("KF_DH", g.dh));
    d.push_back(define("KF_DW", g.dw));
  } else {
    d.push_back(define("KF_INCLUDE_PAD", g.count_include_pad ? 1 : 0));
    d.push_back(define("KF_DIVISOR", g.divisor));
  }
  return d;
}

// The window text and the kernel, by kind.
std::string pool_source(Backend backend, Pool kind) {
  const bool cuda = backend == Backend::kCuda;
  std::string s = cuda ? std::string(kCudaPrelude) + kCudaImagePosition + kCudaPoolGroup : std::string(kCpuPrelude) + "typedef int64_t kf_i64;\n";
  switch (kind) {
    case Pool::kMax: return s + kPoolWindow + (cuda ? kCudaMaxPool : kCpuMaxPool);
    case Pool::kAvg: return s + kAvgWindow + (cuda ? kCudaMeanPool : kCpuMeanPool);
    case Pool::kAdaptive: return s + kAdaptiveWindow + (cuda ? kCudaMeanPool : kCpuMeanPool);
  }
  return s;
}

const char* pool_entry(Pool kind) { return kind == Pool::kMax ? "kf_max_pool2d" : "kf_mean_pool2d"; }

// The largest window, for the CPU prior.
int64_t window_elements(Pool kind, const catalog::Pool2d& g) {
  if (kind != Pool::kAdaptive) return g.kh * g.kw;
  return ((g.h + g.oh - 1) / g.oh + 1) * ((g.w + g.ow - 1) / g.ow + 1);
}

// [N, C, OH, OW], contiguous or channels-last as self: the values in self's dtype (and max
// pooling's indices, int64).
std::vector<OutputSpec> pool_outputs(Pool kind, const PoolCall& c) {
  std::vector<OutputSpec> out = {image_output(c.x->dtype, c.g.oh, c.g.ow, c.channels_last)};
  if (kind == Pool::kMax) out.push_back(image_output(DType::kInt64, c.g.oh, c.g.ow, c.channels_last));
  return out;
}

std::vector<ArgBinding> pool_bindings(Pool kind, const std::string& n) {
  if (kind == Pool::kMax) return {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::output(1), ArgBinding::size(n)};
  return {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(n)};
}

std::string planes_expr() { return size_name(0, 0) + " * " + size_name(0, 1); }

const char* family_name(Backend backend, Pool kind) {
  static constexpr const char* kCuda[] = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"};
  static constexpr const char* kCpu[] = {"cpu.max_pool2d", "cpu.avg_pool2d", "cpu.adaptive_avg_pool2d"};
  return (backend == Backend::kCuda ? kCuda : kCpu)[static_cast<size_t>(kind)];
}

// ---- CUDA ------------------------------------------------------------------------------------------

enum PoolCudaKnob : size_t { kBlock, kItems, kOv, kEdges, kSpan };

std::vector<Knob> pool_cuda_knobs(Pool kind) {
  std::vector<Knob> k = {Knob{"block", {64, 128, 256, 512}, {}}, Knob{"items", {1, 2, 4}, {}},
                         // Note [Outputs per thread]
                         Knob{"ov", {1, 2, 4, 8}, {}}};
  // max: 1 masks every window's out-of-bounds elements; 0 branches to a general loop at the edges.
  if (kind == Pool::kMax) k.push_back(Knob{"edges", {0, 1}, {"branch", "masked"}});
  // max: 1 reads a group's windows as aligned vectors of the rows they cover (Note [Window spans]).
  if (kind == Pool::kMax) k.push_back(Knob{"span", {0, 1}, {"windows", "vectors"}});
  return k;
}

class PoolCuda final : public FamilyBase {
 public:
  explicit PoolCuda(Pool kind) : FamilyBase(family_name(Backend::kCuda, kind), Backend::kCuda, pool_cuda_knobs(kind)), kind_(kind) {}

  bool applies(const OpSignature& sig) const override { return pool_call(sig, Backend::kCuda, kind_).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const PoolCall c = *pool_call(sig, Backend::kCuda, kind_);
    // Note [Outputs per thread]: whole groups in a row; channels-last numbers channels innermost.
    if (v[kOv] > 1 && (c.channels_last || c.g.ow % v[kOv] != 0)) return false;
    if (kind_ == Pool::kMax && v[kSpan] == 1) {
      // Note [Window spans]: 16-byte vectors at multiples of 16 bytes in every row of every plane,
      // and a group's first column at one, which fixes the span's offset at compile time. The
      // masks cover every window the same way: one edges value is enough.
      const int64_t vec = 16 / static_cast<int64_t>(dtype_size_bytes(c.x->dtype));
      if (c.channels_last || v[kOv] * c.g.sw % vec != 0 || c.g.w % vec != 0 || !vector_fits(sig, vec) ||
          v[kEdges] != 1) {
        return false;
      }
    }
    const int64_t groups = c.x->sizes[0] * c.x->sizes[1] * c.g.oh * c.g.ow / v[kOv];
    return v[kBlock] * v[kItems] <= std::max<int64_t>(64, pow2_ceil(groups));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    (void)sig;
    double p = closeness(static_cast<double>(v[kBlock]), 256, 0.3) * closeness(static_cast<double>(v[kItems]), 1, 0.3) *
               closeness(static_cast<double>(v[kOv]), 2, 0.2);
    if (kind_ == Pool::kMax) p *= (v[kEdges] == 1 ? 1.0 : 0.9) * (v[kSpan] == 1 ? 1.0 : 0.9);
    return p;
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const PoolCall c = *pool_call(sig, Backend::kCuda, kind_);
    std::vector<std::string> options = {dtype_define(c.x->dtype), define("KF_BLOCK", v[kBlock]), define("KF_ITEMS", v[kItems]),
                                        define("KF_OV", v[kOv])};
    if (kind_ == Pool::kMax) {
      options.push_back(define("KF_EDGES", v[kEdges]));
      options.push_back(define("KF_SPAN", v[kSpan]));
    }
    for (std::string& d : pool_defines(kind_, c)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCuda, pool_source(Backend::kCuda, kind_), pool_entry(kind_), options);
    s.plan.outputs = pool_outputs(kind_, c);
    Launch& l = s.plan.launches[0];
    const std::string n = planes_expr() + " * " + std::to_string(c.g.oh * c.g.ow / v[kOv]);
    l.grid[0] = "ceil_div(" + n + ", " + std::to_string(v[kBlock] * v[kItems]) + ")";
    l.block[0] = std::to_string(v[kBlock]);
    l.args = pool_bindings(kind_, n);
    return s;
  }

 private:
  Pool kind_;
};

// ---- CPU -------------------------------------------------------------------------------------------

class PoolCpu final : public FamilyBase {
 public:
  explicit PoolCpu(Pool kind)
      : FamilyBase(family_name(Backend::kCpu, kind), Backend::kCpu, {Knob{"rows", {1, 4, 16, 64, 256}, {}}}),
        kind_(kind) {}

  bool applies(const OpSignature& sig) const override { return pool_call(sig, Backend::kCpu, kind_).has_value(); }

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override {
    const PoolCall c = *pool_call(sig, Backend::kCpu, kind_);
    return v[0] <= std::max<int64_t>(1, pow2_ceil(image_rows(*c.x, c.channels_last, c.g.oh)));
  }

  double prior(const OpSignature& sig, std::span<const int64_t> v) const override {
    const PoolCall c = *pool_call(sig, Backend::kCpu, kind_);
    const double work = static_cast<double>(c.g.ow * window_elements(kind_, c.g) * (c.channels_last ? c.x->sizes[1] : 1));
    return closeness(static_cast<double>(v[0]), std::clamp(4096.0 / work, 1.0, 256.0), 0.3);
  }

  KernelSpec instantiate(const OpSignature& sig, std::span<const int64_t> v) const override {
    const PoolCall c = *pool_call(sig, Backend::kCpu, kind_);
    std::vector<std::string> options = cpu_base_options(sig);
    options.push_back(define("KF_ROWS", v[0]));
    for (std::string& d : pool_defines(kind_, c)) options.push_back(std::move(d));
    KernelSpec s = one_launch_spec(Backend::kCpu, pool_source(Backend::kCpu, kind_), pool_entry(kind_), options);
    s.plan.outputs = pool_outputs(kind_, c);
    Launch& l = s.plan.launches[0];
    const std::string rows = image_rows_expr(c.channels_last, c.g.oh);
    l.grid[0] = "ceil_div(" + rows + ", " + std::to_string(v[0]) + ")";
    l.args = pool_bindings(kind_, rows);
    return s;
  }

 private:
  Pool kind_;
};

}  // namespace

// "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d" (CUDA) and their "cpu." twins.
const FamilyRegistration kRegistered{
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PoolCuda>(Pool::kMax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PoolCpu>(Pool::kMax); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PoolCuda>(Pool::kAvg); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PoolCpu>(Pool::kAvg); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PoolCuda>(Pool::kAdaptive); },
    []() -> std::unique_ptr<KernelTemplate> { return std::make_unique<PoolCpu>(Pool::kAdaptive); },
};

}  // namespace kforge::search::templates
