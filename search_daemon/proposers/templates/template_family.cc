#include "search_daemon/proposers/templates/template_family.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "runtime/cuda_environment.h"

namespace kforge::search::templates {

const TensorMeta* tensor_arg(const OpSignature& sig, size_t i) {
  if (i >= sig.args.size()) return nullptr;
  return std::get_if<TensorMeta>(&sig.args[i].value);
}

namespace {

// The device and dtypes of `backend`'s templates: float32 everywhere, float16 and bfloat16 on CUDA.
bool backend_takes(const TensorMeta& t, Backend backend) {
  if (backend == Backend::kCpu) return t.device == DeviceType::kCpu && t.dtype == DType::kFloat32;
  return t.device == DeviceType::kCuda &&
         (t.dtype == DType::kFloat32 || t.dtype == DType::kFloat16 || t.dtype == DType::kBFloat16);
}

bool channels_last_4d(const TensorMeta& t) {
  if (t.sizes.size() != 4 || t.strides.size() != 4) return false;
  const int64_t c = t.sizes[1], h = t.sizes[2], w = t.sizes[3];
  const auto ok = [&](size_t d, int64_t stride) { return t.sizes[d] == 1 || t.strides[d] == stride; };
  return ok(1, 1) && ok(3, c) && ok(2, w * c) && ok(0, h * w * c);
}

}  // namespace

bool template_tensor(const TensorMeta* t, Backend backend) {
  if (t == nullptr || t->sizes.empty() || t->numel() <= 0 || !t->is_contiguous()) return false;
  return backend_takes(*t, backend);
}

bool template_dense_tensor(const TensorMeta* t, Backend backend) {
  if (!template_strided_tensor(t, backend)) return false;
  if (!t->is_contiguous()) {
    // Dimensions of more than one element, innermost (smallest stride) first: each stride must be
    // the product of the sizes inside it.
    std::vector<size_t> dims;
    for (size_t d = 0; d < t->sizes.size(); ++d) {
      if (t->sizes[d] > 1) dims.push_back(d);
    }
    std::sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return t->strides[a] < t->strides[b]; });
    int64_t expect = 1;
    for (size_t d : dims) {
      if (t->strides[d] != expect) return false;
      expect *= t->sizes[d];
    }
  }
  return true;
}

bool template_strided_tensor(const TensorMeta* t, Backend backend) {
  if (t == nullptr || t->sizes.empty() || t->numel() <= 0 || t->strides.size() != t->sizes.size()) return false;
  for (int64_t s : t->strides) {
    if (s < 0) return false;
  }
  return backend_takes(*t, backend);
}

// Note [Strided rows]
// ~~~~~~~~~~~~~~~~~~~
// A row kernel reads row r at x + KF_X_ROW(r) and writes a contiguous output at y + r * cols. The
// leading dimensions (all but the last) of size > 1 are merged where one's stride is the next
// one's size times its stride, so a contiguous tensor becomes one dimension of stride cols, and a
// chunk of a fused projection ([B, T, H, D] of strides [T*3*H*D, 3*H*D, D, 1]) becomes
// [B*T, H] of strides [3*H*D, D]. The remaining sizes and strides are the signature's own numbers,
// compiled into the offset as constants (a kernel is built for one signature): one division and
// one remainder per merged dimension, by constants, once per row.
namespace {

struct RowDim {
  int64_t size, stride;
};

std::vector<RowDim> merged_row_dims(const TensorMeta& t) {
  std::vector<RowDim> dims;   // outermost first
  for (size_t d = 0; d + 1 < t.sizes.size(); ++d) {
    if (t.sizes[d] == 1) continue;
    if (!dims.empty() && dims.back().stride == t.sizes[d] * t.strides[d]) {
      dims.back() = RowDim{dims.back().size * t.sizes[d], t.strides[d]};
    } else {
      dims.push_back(RowDim{t.sizes[d], t.strides[d]});
    }
  }
  return dims;
}

}  // namespace

bool strided_rows_tensor(const TensorMeta* t, Backend backend) {
  return template_strided_tensor(t, backend) && (t->sizes.back() == 1 || t->strides.back() == 1);
}

std::string row_offset_define(const TensorMeta& t, std::string_view cols_name) {
  if (t.is_contiguous()) return "#define KF_X_ROW(r) ((long long)(r) * " + std::string(cols_name) + ")\n";
  const std::vector<RowDim> dims = merged_row_dims(t);
  std::string e;
  int64_t inner = 1;   // rows per step of the dimension being written
  for (size_t k = dims.size(); k-- > 0;) {
    std::string idx = "(long long)(r)";
    if (inner > 1) idx = "(" + idx + " / " + std::to_string(inner) + "LL)";
    if (k > 0) idx = "(" + idx + " % " + std::to_string(dims[k].size) + "LL)";
    e += (e.empty() ? "" : " + ") + idx + " * " + std::to_string(dims[k].stride) + "LL";
    inner *= dims[k].size;
  }
  return "#define KF_X_ROW(r) (" + (e.empty() ? std::string("0LL") : e) + ")\n";
}

int64_t row_offset_granule(const TensorMeta& t) {
  int64_t g = 0;
  for (const RowDim& d : merged_row_dims(t)) g = std::gcd(g, d.stride);
  return g == 0 ? std::numeric_limits<int64_t>::max() / 2 : g;   // one row: any width
}

std::optional<bool> contiguous_or_channels_last(const TensorMeta* t, Backend backend) {
  if (!template_strided_tensor(t, backend)) return std::nullopt;
  if (t->is_contiguous()) return false;
  if (channels_last_4d(*t)) return true;
  return std::nullopt;
}

OutputSpec image_output(DType t, int64_t oh, int64_t ow, bool channels_last) {
  const std::string plane = std::to_string(oh * ow), ch = size_name(0, 1);
  std::vector<std::string> strides = {ch + " * " + plane, plane, std::to_string(ow), "1"};
  if (channels_last) strides = {plane + " * " + ch, "1", std::to_string(ow) + " * " + ch, ch};
  return OutputSpec::explicit_layout(t, {size_name(0, 0), ch, std::to_string(oh), std::to_string(ow)},
                                     std::move(strides));
}

int64_t image_rows(const TensorMeta& x, bool channels_last, int64_t oh) {
  return x.sizes[0] * (channels_last ? 1 : x.sizes[1]) * oh;
}

std::string image_rows_expr(bool channels_last, int64_t oh) {
  return size_name(0, 0) + (channels_last ? "" : " * " + size_name(0, 1)) + " * " + std::to_string(oh);
}

bool is_none(const OpSignature& sig, size_t i) {
  return i < sig.args.size() && std::holds_alternative<std::monostate>(sig.args[i].value);
}

const int64_t* int_arg(const OpSignature& sig, size_t i) {
  if (i >= sig.args.size()) return nullptr;
  return std::get_if<int64_t>(&sig.args[i].value);
}

int64_t cols_of(const TensorMeta& t) { return t.sizes.back(); }
int64_t rows_of(const TensorMeta& t) {
  const int64_t c = cols_of(t);
  return c > 0 ? t.numel() / c : 0;
}

std::string size_name(size_t arg, size_t dim) { return "size" + std::to_string(arg) + "_" + std::to_string(dim); }
std::string cols_expr(const TensorMeta& t) { return size_name(0, t.sizes.size() - 1); }
std::string rows_expr(const TensorMeta& t) { return "numel0 / " + cols_expr(t); }

DimSplit split_at_dim(const TensorMeta& t, int64_t dim) {
  auto product = [&](size_t from, size_t to) {
    std::string p;
    for (size_t i = from; i < to; ++i) p += (p.empty() ? "" : " * ") + size_name(0, i);
    return p.empty() ? std::string("1") : p;
  };
  const auto d = static_cast<size_t>(dim);
  DimSplit s{product(0, d), size_name(0, d), product(d + 1, t.sizes.size())};
  for (size_t i = 0; i < d; ++i) s.outer_size *= t.sizes[i];
  s.len_size = t.sizes[d];
  for (size_t i = d + 1; i < t.sizes.size(); ++i) s.inner_size *= t.sizes[i];
  return s;
}

namespace {

// The widest access of the column kernels the columns allow, up to `max_vec_bytes` bytes.
int64_t widest_column_vec(const OpSignature& sig, const DimSplit& e, int64_t max_vec_bytes) {
  const int64_t bytes = dtype_size_bytes(tensor_arg(sig, 0)->dtype);
  int64_t best_vec = 1;
  for (int64_t w : {2, 4, 8}) {
    if (e.inner_size % w == 0 && w * bytes <= max_vec_bytes && vector_fits(sig, w)) best_vec = w;
  }
  return best_vec;
}

}  // namespace

double split_columns_prior(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, int64_t min_split,
                           int64_t max_split, int64_t min_per_thread, int64_t max_vec_bytes) {
  const int64_t block = v[0], split = v[1], vec = v[2];
  const int64_t bytes = dtype_size_bytes(tensor_arg(sig, 0)->dtype);
  const int64_t best_vec = widest_column_vec(sig, e, max_vec_bytes);
  // Enough threads to cover the latency.
  const int64_t column_threads = std::max<int64_t>(1, e.outer_size * e.inner_size / best_vec);
  int64_t ideal_split = std::clamp<int64_t>(pow2_ceil(kCudaLatencyThreads / column_threads), min_split, max_split);
  while (ideal_split > min_split && e.len_size / ideal_split < min_per_thread) ideal_split /= 2;
  const double row_bytes = static_cast<double>(std::min<int64_t>(block / split * vec, e.inner_size) * bytes);
  return closeness(static_cast<double>(vec), static_cast<double>(best_vec), 0.5) *
         closeness(static_cast<double>(split), static_cast<double>(ideal_split), 0.4) *
         closeness(static_cast<double>(block), 256, 0.3) * closeness(std::min(row_bytes, 128.0), 128, 0.2);
}

void split_columns_launch(const DimSplit& e, std::span<const int64_t> v, Launch& l) {
  const std::string tiles = "ceil_div(" + e.inner + ", " + std::to_string(v[0] / v[1] * v[2]) + ")";
  l.grid[0] = "(" + e.outer + ") * " + tiles;
  l.block[0] = std::to_string(v[0]);
  l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::size(e.len), ArgBinding::size(e.inner),
            ArgBinding::size(tiles)};
}

int64_t column_copy_bytes(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v) {
  return e.len_size * (v[0] / v[1]) * v[2] * dtype_size_bytes(tensor_arg(sig, 0)->dtype);
}

bool columns_past_l2(const OpSignature& sig, const DimSplit& e) {
  return e.outer_size * e.len_size * e.inner_size * dtype_size_bytes(tensor_arg(sig, 0)->dtype) > (int64_t{24} << 20);
}

double cached_columns_prior(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, int64_t static_bytes,
                            int64_t per_thread, double sector_weight, int64_t max_vec_bytes) {
  const int64_t block = v[0], split = v[1], vec = v[2];
  const int64_t esz = dtype_size_bytes(tensor_arg(sig, 0)->dtype);
  const int64_t best_vec = widest_column_vec(sig, e, max_vec_bytes);
  const int64_t tile = block / split * vec;
  const int64_t per_block = column_copy_bytes(sig, e, v) + static_bytes + 1024;
  const int64_t blocks_per_sm = std::max<int64_t>(1, std::min<int64_t>(2048 / block, (228 * 1024) / per_block));
  const double resident = static_cast<double>(std::min<int64_t>(2048, blocks_per_sm * block));
  const double elements = static_cast<double>(std::max<int64_t>(1, e.len_size / split));
  return closeness(static_cast<double>(vec), static_cast<double>(best_vec), 0.5) * closeness(resident, 2048, 0.5) *
         closeness(std::min<double>(static_cast<double>(tile * esz), 32), 32, sector_weight) *
         closeness(elements, static_cast<double>(per_thread), 0.2);
}

void cached_columns_launch(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, int64_t static_bytes,
                           Launch& l) {
  const bool cache = v[3] == 1;
  const int64_t tile_bytes = v[0] / v[1] * v[2] * dtype_size_bytes(tensor_arg(sig, 0)->dtype);
  const std::string bytes = "(" + e.len + ") * " + std::to_string(tile_bytes);
  const std::string fits =
      cache ? "min(1, " + std::to_string(kCudaSharedBudget - static_bytes) + " / (" + bytes + "))" : "0";
  if (cache) l.shared_mem_bytes = "(" + fits + ") * " + bytes;
  l.args.push_back(ArgBinding::size(fits));
}

int64_t clustered_chunk(const DimSplit& e, std::span<const int64_t> v) { return (e.len_size + v[3] - 1) / v[3]; }

int64_t clustered_copy_bytes(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v) {
  return clustered_chunk(e, v) * (v[0] / v[1]) * v[2] * dtype_size_bytes(tensor_arg(sig, 0)->dtype);
}

int64_t clustered_static_bytes(std::span<const int64_t> v, int64_t entry_bytes) {
  return column_parts_bytes(v, entry_bytes) + v[0] / v[1] * v[2] * entry_bytes;
}

bool clustered_columns_valid(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, int64_t entry_bytes,
                             int64_t max_split) {
  const int64_t block = v[0], split = v[1], vec = v[2];
  if (split > block || split > max_split) return false;   // first: the sizes below divide by block / split
  const int64_t static_bytes = clustered_static_bytes(v, entry_bytes);
  if (e.inner_size % vec != 0 || !vector_fits(sig, vec)) return false;
  if (clustered_chunk(e, v) * (v[3] - 1) >= e.len_size) return false;              // a block with no rows
  if (block / split * vec > std::max(vec, pow2_ceil(e.inner_size))) return false;   // no tile mostly past the last column
  if (static_bytes > 48 * 1024) return false;
  return clustered_copy_bytes(sig, e, v) + static_bytes <= kCudaSharedBudget;
}

double clustered_columns_prior(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v,
                               int64_t static_bytes, int64_t per_thread, int64_t max_vec_bytes) {
  const int64_t block = v[0], split = v[1], vec = v[2];
  const int64_t esz = dtype_size_bytes(tensor_arg(sig, 0)->dtype);
  const int64_t tile = block / split * vec;
  const int64_t per_block = clustered_copy_bytes(sig, e, v) + static_bytes + 1024;
  const int64_t blocks_per_sm = std::max<int64_t>(1, std::min<int64_t>(2048 / block, (228 * 1024) / per_block));
  const double resident = static_cast<double>(std::min<int64_t>(2048, blocks_per_sm * block));
  const double elements = static_cast<double>(std::max<int64_t>(1, clustered_chunk(e, v) / split));
  return (columns_past_l2(sig, e) ? 1.0 : 0.5) *
         closeness(static_cast<double>(vec), static_cast<double>(widest_column_vec(sig, e, max_vec_bytes)), 0.5) *
         closeness(resident, 2048, 0.5) * closeness(std::min<double>(static_cast<double>(tile * esz), 128), 128, 0.5) *
         closeness(elements, static_cast<double>(per_thread), 0.2);
}

void clustered_columns_launch(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, Launch& l) {
  l.grid[0] = "(" + l.grid[0] + ") * " + std::to_string(v[3]);   // a cluster per tile
  const int64_t tile_bytes = v[0] / v[1] * v[2] * dtype_size_bytes(tensor_arg(sig, 0)->dtype);
  l.shared_mem_bytes = "ceil_div(" + e.len + ", " + std::to_string(v[3]) + ") * " + std::to_string(tile_bytes);
  l.args.push_back(ArgBinding::size("1"));
}

int64_t column_parts_bytes(std::span<const int64_t> v, int64_t entry_bytes) {
  const int64_t tx = v[0] / v[1], w = tx >= 32 ? 1 : 32 / tx;
  return std::max<int64_t>(1, v[1] / w) * tx * v[2] * entry_bytes;
}

bool has_clusters(const OpSignature& sig) {
  int major = 0, minor = 0;
  return parse_cuda_arch(sig.target.arch, major, minor) && major >= 9;
}

bool vector_fits(const OpSignature& sig, int64_t vec) {
  for (const Arg& a : sig.args) {
    const auto* t = std::get_if<TensorMeta>(&a.value);
    if (t == nullptr) continue;
    const int64_t bytes = vec * dtype_size_bytes(t->dtype);
    if (bytes > 16 || static_cast<int64_t>(t->alignment) % bytes != 0) return false;
  }
  return true;
}

std::vector<Knob> flat_cuda_knobs() {
  return {Knob{"block", {64, 128, 256, 512, 1024}, {}}, Knob{"vec", {1, 2, 4, 8}, {}}, Knob{"items", {1, 2, 4, 8}, {}}};
}

double flat_cuda_prior(int64_t element_bytes, int64_t elements, std::span<const int64_t> v) {
  // Measured on an H200 (pointwise kernels): 16-byte vectors and 256 threads; two vectors per
  // thread were as fast as any on large tensors, more cost registers and occupancy (eight: up to
  // 2x slower).
  const double ideal_items = elements >= (int64_t{1} << 18) ? 2 : 1;
  return closeness(static_cast<double>(v[1] * element_bytes), 16, 0.5) * closeness(static_cast<double>(v[0]), 256, 0.3) *
         closeness(static_cast<double>(v[2]), ideal_items, 0.3);
}

bool flat_cuda_fits(int64_t elements, std::span<const int64_t> v) {
  return v[0] * v[1] * v[2] <= std::max<int64_t>(64, 2 * elements);
}

std::vector<Knob> flat_cpu_knobs() { return {Knob{"chunk", {1024, 4096, 16384, 65536, 262144}, {}}}; }

double flat_cpu_prior(int64_t elements, std::span<const int64_t> v) {
  return closeness(static_cast<double>(v[0]), std::clamp(static_cast<double>(elements) / 16, 1024.0, 65536.0), 0.3);
}

bool flat_cpu_fits(int64_t elements, std::span<const int64_t> v) {
  return v[0] <= std::max<int64_t>(1024, pow2_ceil(elements));
}

std::string define(std::string_view name, int64_t value) {
  return "-D" + std::string(name) + "=" + std::to_string(value);
}

std::string dtype_define(DType t) {
  return define("KF_DTYPE", t == DType::kFloat16 ? 1 : t == DType::kBFloat16 ? 2 : 0);
}

KernelSpec one_launch_spec(Backend backend, std::string source, std::string entry, std::vector<std::string> options) {
  KernelSpec s;
  s.backend = backend;
  s.language = backend == Backend::kCuda ? SourceLanguage::kCuda : SourceLanguage::kCpp;
  s.source = std::move(source);
  s.entry_points = {entry};
  s.compile_options = std::move(options);
  Launch l;
  l.entry = std::move(entry);
  s.plan.launches = {std::move(l)};
  return s;
}

std::vector<std::string> cpu_base_options(const OpSignature& sig) {
  std::vector<std::string> o = {"-O3", "-fno-math-errno"};
  // The ISA level the target names (cpu_host_environment() appends it to the arch, so it is part
  // of the cache key); -march=native is refused by the builder for that reason.
  const std::string& arch = sig.target.arch;
  if (arch.starts_with("x86_64")) {
    if (arch.ends_with("-avx512f")) {
      o.push_back("-march=x86-64-v4");
    } else if (arch.ends_with("-avx2")) {
      o.push_back("-march=x86-64-v3");
    } else if (arch.ends_with("-sse4.2")) {
      o.push_back("-march=x86-64-v2");
    }
  }
  return o;
}

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v && p < (int64_t{1} << 62)) p *= 2;
  return p;
}

double closeness(double a, double b, double weight) {
  if (a <= 0 || b <= 0) return 1.0 / (1.0 + 8 * weight);
  return 1.0 / (1.0 + std::fabs(std::log2(a / b)) * weight);
}

CudaRowFamily::CudaRowFamily(std::string family, std::vector<std::string> algo_names)
    : FamilyBase(std::move(family), Backend::kCuda,
                 {Knob{"map", {0, 1}, {"block_row", "warp_row"}},
                  Knob{"algo", {0, 1}, std::move(algo_names)},
                  Knob{"block", {32, 64, 128, 256, 512, 1024}, {}},
                  Knob{"row_lanes", {4, 8, 16, 32}, {}},
                  Knob{"vec", {1, 2, 4, 8}, {}},
                  Knob{"cache", {0, 1}, {}}}) {}

namespace {

// Vectors per thread when the row is held in registers.
int64_t cached_items(int64_t nvec, int64_t threads) { return std::max<int64_t>(1, (nvec + threads - 1) / threads); }

}  // namespace

bool CudaRowFamily::valid(const OpSignature& sig, std::span<const int64_t> v) const {
  const TensorMeta& x = *tensor_arg(sig, 0);
  const int64_t cols = cols_of(x), rows = rows_of(x);
  if (cols % v[kVec] != 0 || !vector_fits(sig, v[kVec])) return false;
  const int64_t nvec = cols / v[kVec];
  const bool warp = v[kMap] == 1;
  const int64_t nt = warp ? v[kRowLanes] : v[kBlock];
  if (!warp) {
    if (v[kRowLanes] != 32) return false;                                      // no meaning: one value
    if (v[kBlock] > std::max<int64_t>(32, (nvec + 31) / 32 * 32)) return false;   // idle warps
  } else {
    if (nvec > 32 * v[kRowLanes]) return false;                                // a long row on few lanes
    if (v[kRowLanes] > std::max<int64_t>(4, pow2_ceil(nvec))) return false;    // idle lanes
    if (v[kBlock] / v[kRowLanes] > pow2_ceil(rows)) return false;              // idle rows
  }
  return v[kCache] == 0 || cached_items(nvec, nt) * v[kVec] <= 32;            // registers per thread
}

double CudaRowFamily::prior(const OpSignature& sig, std::span<const int64_t> v) const {
  const TensorMeta& x = *tensor_arg(sig, 0);
  const int64_t nvec = cols_of(x) / v[kVec];
  const bool warp = v[kMap] == 1;
  double p = closeness(static_cast<double>(v[kVec] * dtype_size_bytes(x.dtype)), 16, 0.5);
  if (warp) {
    // Short rows: a few vectors per lane, several rows per block.
    p *= nvec <= 128 ? 1.0 : 0.4;
    p *= closeness(static_cast<double>(v[kRowLanes]), std::clamp(static_cast<double>(pow2_ceil(nvec)) / 4, 4.0, 32.0), 0.5);
    p *= closeness(static_cast<double>(v[kBlock]), 128, 0.3);
  } else {
    p *= nvec <= 64 ? 0.5 : 1.0;
    p *= closeness(static_cast<double>(nvec) / static_cast<double>(v[kBlock]), 4, 0.3);
  }
  const bool cached = v[kCache] == 1;
  return p * (cached ? 1.0 : 0.6) * algo_prior(cached, v[kAlgo]);
}

void CudaRowFamily::map_rows(const TensorMeta& x, std::span<const int64_t> v, std::vector<std::string>& options,
                             Launch& l) const {
  const int64_t nvec = cols_of(x) / v[kVec];
  const bool warp = v[kMap] == 1;
  const int64_t nt = warp ? v[kRowLanes] : v[kBlock];
  for (std::string o : {define("KF_WARP_ROW", v[kMap]), define("KF_ROW_LANES", v[kRowLanes]),
                        define("KF_BLOCK", v[kBlock]), define("KF_VEC", v[kVec]),
                        define("KF_ITEMS", v[kCache] == 1 ? cached_items(nvec, nt) : 0)}) {
    options.push_back(std::move(o));
  }
  const std::string rows = rows_expr(x);
  l.grid[0] = warp ? "ceil_div(" + rows + ", " + std::to_string(v[kBlock] / v[kRowLanes]) + ")" : rows;
  l.block[0] = std::to_string(v[kBlock]);
}

// Note [Template arithmetic]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Inputs and outputs of 16-bit types are converted to float for every operation, as PyTorch's
// opmath does. Reductions that decide accuracy accumulate in kf_acc: double for float32 rows,
// because PyTorch's float sums have an error that depends on its reduction order and ours must
// stay within 2x of it whatever our order (runtime/accuracy.h); float for 16-bit rows, whose
// outputs round far more coarsely than a float sum errs. The layer and group norm statistics are
// always double: their mean and rstd outputs are float32 for every input dtype on CUDA.
// NaN and infinity propagate as in PyTorch's kernels: a NaN in a row makes its sum NaN, a +inf
// makes exp(inf - inf) NaN, a row of -inf has max -inf and gives NaN.
const char* const kCudaPrelude = R"kf(// kforge kernel template (NVRTC: no headers; knobs arrive as -D options).
typedef long long kf_i64;
#define KF_NEG_INF (-__int_as_float(0x7f800000))

#if KF_DTYPE == 0
typedef float kf_t;
typedef double kf_acc;
__device__ __forceinline__ float kf_to_float(float v) { return v; }
__device__ __forceinline__ float kf_from_float(float v) { return v; }
#elif KF_DTYPE == 1
typedef unsigned short kf_t;
typedef float kf_acc;
__device__ __forceinline__ float kf_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short kf_from_float(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#elif KF_DTYPE == 2
typedef unsigned short kf_t;
typedef float kf_acc;
__device__ __forceinline__ float kf_to_float(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
// Round to nearest even, as c10::BFloat16 rounds (the instruction from sm_80 on).
__device__ __forceinline__ unsigned short kf_from_float(float f) {
#if __CUDA_ARCH__ >= 800
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
#endif
}
#endif

__device__ __forceinline__ float kf_log(float v) { return logf(v); }
__device__ __forceinline__ double kf_log(double v) { return log(v); }

// N elements in one access; the caller guarantees the alignment.
template <int N>
struct alignas(sizeof(kf_t) * N) kf_vec {
  kf_t v[N];
};
template <int N>
__device__ __forceinline__ void kf_load(const kf_t* __restrict__ p, kf_i64 i, float (&out)[N]) {
  const kf_vec<N> r = reinterpret_cast<const kf_vec<N>*>(p)[i];
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = kf_to_float(r.v[k]);
}
#if KF_DTYPE != 0 && __CUDA_ARCH__ >= 800
// Two floats rounded into one 32-bit word of 16-bit values, `lo` at the lower address: one
// instruction for both (the scalar conversions cost a second one and the packing).
__device__ __forceinline__ unsigned kf_pack2(float lo, float hi) {
  unsigned w;
#if KF_DTYPE == 1
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
#endif
  return w;
}
template <int N>
struct alignas(sizeof(kf_t) * N) kf_words {
  unsigned w[N / 2];
};
#endif
template <int N>
__device__ __forceinline__ void kf_store(kf_t* __restrict__ p, kf_i64 i, const float (&in)[N]) {
#if KF_DTYPE != 0 && __CUDA_ARCH__ >= 800
  if constexpr (N % 2 == 0) {
    kf_words<N> r;
#pragma unroll
    for (int k = 0; k < N / 2; ++k) r.w[k] = kf_pack2(in[2 * k], in[2 * k + 1]);
    reinterpret_cast<kf_words<N>*>(p)[i] = r;
    return;
  }
#endif
  kf_vec<N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) r.v[k] = kf_from_float(in[k]);
  reinterpret_cast<kf_vec<N>*>(p)[i] = r;
}

// Butterfly reductions over aligned groups of W lanes (W a power of two up to 32; every lane of
// the warp takes part): every lane ends with the same value (each step adds the same two
// operands, in either order), so every thread of a row agrees bit for bit.
template <int W = 32>
__device__ __forceinline__ float kf_warp_max(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int W = 32, typename T>
__device__ __forceinline__ T kf_warp_sum(T v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Over the KF_BLOCK threads of a block; `red` is __shared__ [32]. The first barrier lets an
// earlier reduction finish reading `red`.
__device__ __forceinline__ float kf_block_max(float v, float* red) {
  v = kf_warp_max(v);
  if (KF_BLOCK == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return kf_warp_max(lane < KF_BLOCK / 32 ? red[lane] : KF_NEG_INF);
}
template <typename T>
__device__ __forceinline__ T kf_block_sum(T v, T* red) {
  v = kf_warp_sum(v);
  if (KF_BLOCK == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return kf_warp_sum(lane < KF_BLOCK / 32 ? red[lane] : (T)0);
}
)kf";

const char* const kCudaClusterShared = R"kf(
// This block's shared address of p, and p as it lies in block `rank` of the cluster.
__device__ __forceinline__ unsigned kf_shared_addr(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ unsigned kf_cluster_addr(const void* p, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(kf_shared_addr(p)), "r"(rank));
  return r;
}
__device__ __forceinline__ float kf_cluster_ld(const float* p, unsigned rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(kf_cluster_addr(p, rank)) : "memory");
  return v;
}
__device__ __forceinline__ double kf_cluster_ld(const double* p, unsigned rank) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(kf_cluster_addr(p, rank)) : "memory");
  return v;
}
)kf";

const char* const kCudaRowMapping = R"kf(
// Rows of a contiguous [rows, cols] tensor on threads: one row per block of KF_BLOCK threads
// (KF_WARP_ROW 0), or one row per KF_ROW_LANES lanes of a warp (KF_WARP_ROW 1: 4 to 32 lanes,
// KF_BLOCK / KF_ROW_LANES rows per block). KF_NT threads share a row.
#if KF_WARP_ROW
#define KF_NT KF_ROW_LANES
#else
#define KF_NT KF_BLOCK
#endif
// This thread's row and its index among the row's threads. A lane whose row is past the end is
// not live (it reads and writes nothing) but still takes part in its warp's shuffles; false when
// the whole warp is past the end, which may then leave (warp mode has no block-wide barrier).
__device__ __forceinline__ bool kf_map_row(kf_i64 rows, kf_i64& row, int& tid, bool& live) {
#if KF_WARP_ROW
  const kf_i64 first = (kf_i64)blockIdx.x * (KF_BLOCK / KF_ROW_LANES);
  row = first + threadIdx.x / KF_ROW_LANES;
  tid = threadIdx.x % KF_ROW_LANES;
  live = row < rows;
  return first + (threadIdx.x & ~31u) / KF_ROW_LANES < rows;
#else
  (void)rows;
  row = blockIdx.x;
  tid = threadIdx.x;
  live = true;
  return true;
#endif
}
// Over the KF_NT threads of a row; `red` is __shared__ [32] (block mode only).
__device__ __forceinline__ float kf_row_max(float v, float* red) {
#if KF_WARP_ROW
  (void)red;
  return kf_warp_max<KF_ROW_LANES>(v);
#else
  return kf_block_max(v, red);
#endif
}
template <typename T>
__device__ __forceinline__ T kf_row_sum(T v, T* red) {
#if KF_WARP_ROW
  (void)red;
  return kf_warp_sum<KF_ROW_LANES>(v);
#else
  return kf_block_sum(v, red);
#endif
}
)kf";

const char* const kCudaRawWord = R"kf(
#if KF_WORD_BYTES == 16
typedef uint4 kf_word;
#elif KF_WORD_BYTES == 8
typedef uint2 kf_word;
#elif KF_WORD_BYTES == 4
typedef unsigned int kf_word;
#else
typedef unsigned short kf_word;
#endif
)kf";

const char* const kCudaImagePosition = R"kf(
#if KF_CL
#define KF_POSITION(i, oh, ow, base)                                          \
  const kf_i64 oh##_q = (i) / KF_C;                                          \
  const kf_i64 ow = oh##_q % KF_OW;                                          \
  const kf_i64 oh = (oh##_q / KF_OW) % KF_OH;                                \
  const kf_i64 base = (oh##_q / (KF_OW * KF_OH)) * (KF_H * KF_W * KF_C) + (i) % KF_C;
#define KF_AT(h, w) (((h) * KF_W + (w)) * KF_C)
#else
#define KF_POSITION(i, oh, ow, base)                                          \
  const kf_i64 ow = (i) % KF_OW;                                             \
  const kf_i64 oh = ((i) / KF_OW) % KF_OH;                                   \
  const kf_i64 base = ((i) / (KF_OW * KF_OH)) * (KF_H * KF_W);
#define KF_AT(h, w) ((h) * KF_W + (w))
#endif
)kf";

const char* const kCpuPrelude = R"kf(// kforge kernel template (CPU): one call per block, blocks in parallel in any order.
#include <math.h>
#include <stdint.h>
#include "runtime/cpu_kernel_abi.h"
#define KF_PTR(T, i) (*(T* const*)p[i])
#define KF_I64(i) (*(const int64_t*)p[i])
#define KF_F32(i) (*(const float*)p[i])
#define KF_F64(i) (*(const double*)p[i])
)kf";

const char* const kCpuNormStatistics = R"kf(
// Mean and biased variance of x[0, n) in double, KF_LANES independent accumulators: Welford's
// running update with merges (KF_WELFORD) or two passes.
static inline void kf_welford_merge(double& n, double& mean, double& m2, double bn, double bmean, double bm2) {
  const double t = n + bn;
  if (t == 0) return;
  const double e = bmean - mean;
  const double fb = bn / t;
  mean += e * fb;
  m2 += bm2 + e * e * n * fb;
  n = t;
}

static inline void kf_row_stats(const float* __restrict__ x, int64_t len, double* mean_out, double* var_out) {
  const int64_t body = len - len % KF_LANES;
  double mean, var;
#if KF_WELFORD
  double nl[KF_LANES], ml[KF_LANES], ql[KF_LANES];
  for (int l = 0; l < KF_LANES; ++l) nl[l] = 0, ml[l] = 0, ql[l] = 0;
  for (int64_t c = 0; c < body; c += KF_LANES) {
    for (int l = 0; l < KF_LANES; ++l) {
      nl[l] += 1;
      const double e = (double)x[c + l] - ml[l];
      ml[l] += e / nl[l];
      ql[l] += e * ((double)x[c + l] - ml[l]);
    }
  }
  for (int64_t c = body; c < len; ++c) kf_welford_merge(nl[0], ml[0], ql[0], 1.0, (double)x[c], 0.0);
  double n = 0, m2 = 0;
  mean = 0;
  for (int l = 0; l < KF_LANES; ++l) kf_welford_merge(n, mean, m2, nl[l], ml[l], ql[l]);
  var = m2 / (double)len;
#else
  double sl[KF_LANES];
  for (int l = 0; l < KF_LANES; ++l) sl[l] = 0;
  for (int64_t c = 0; c < body; c += KF_LANES) {
    for (int l = 0; l < KF_LANES; ++l) sl[l] += (double)x[c + l];
  }
  for (int64_t c = body; c < len; ++c) sl[0] += (double)x[c];
  double s = 0;
  for (int l = 0; l < KF_LANES; ++l) s += sl[l];
  mean = s / (double)len;
  for (int l = 0; l < KF_LANES; ++l) sl[l] = 0;
  for (int64_t c = 0; c < body; c += KF_LANES) {
    for (int l = 0; l < KF_LANES; ++l) {
      const double e = (double)x[c + l] - mean;
      sl[l] += e * e;
    }
  }
  for (int64_t c = body; c < len; ++c) {
    const double e = (double)x[c] - mean;
    sl[0] += e * e;
  }
  double q = 0;
  for (int l = 0; l < KF_LANES; ++l) q += sl[l];
  var = q / (double)len;
#endif
  *mean_out = mean;
  *var_out = var;
}
)kf";

}  // namespace kforge::search::templates
