// What the template families share (internal to search_daemon/proposers/templates/): a base class
// holding a family's name and knobs, the signature checks every family makes, the source preludes
// every kernel starts with, and how the families register, one .cc file per operator family
// (row_softmax.cc, layer_norm.cc, group_norm.cc, elementwise.cc).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "search_daemon/proposers/templates/kernel_template.h"

namespace kforge::search::templates {

class FamilyBase : public KernelTemplate {
 public:
  std::string_view family() const noexcept override { return family_; }
  Backend backend() const noexcept override { return backend_; }
  const std::vector<Knob>& knobs() const noexcept override { return knobs_; }

 protected:
  FamilyBase(std::string family, Backend backend, std::vector<Knob> knobs)
      : family_(std::move(family)), backend_(backend), knobs_(std::move(knobs)) {}

 private:
  std::string family_;
  Backend backend_;
  std::vector<Knob> knobs_;
};

// The CUDA row kernels (softmax, log_softmax, layer_norm) share their knobs and rules: rows on
// blocks or on groups of lanes (kCudaRowMapping), an algorithm, the block size, the lanes per row
// in warp mode (32 in block mode), the vector width and the register cache. Knob order is fixed:
// map, algo, block, row_lanes, vec, cache.
class CudaRowFamily : public FamilyBase {
 public:
  enum Knobs : size_t { kMap, kAlgo, kBlock, kRowLanes, kVec, kCache };

  bool valid(const OpSignature& sig, std::span<const int64_t> v) const override;
  double prior(const OpSignature& sig, std::span<const int64_t> v) const override;

 protected:
  CudaRowFamily(std::string family, std::vector<std::string> algo_names);
  // -DKF_WARP_ROW/ROW_LANES/BLOCK/VEC/ITEMS, and the launch's grid and block for x's rows.
  void map_rows(const TensorMeta& x, std::span<const int64_t> v, std::vector<std::string>& options, Launch& l) const;
  // How much the algorithm is expected to matter, in (0, 1], with the row cached or streamed.
  virtual double algo_prior(bool cached, int64_t algo) const = 0;
};

// The flat CUDA kernels (pointwise, batch norm, embedding, cat, clone): each thread handles
// `items` vectors of `vec` elements, `block` threads apart. Their knobs, in this order (each
// family's own enum names the positions: block, vec, items), the prior, and the bound that keeps
// a block's work from being mostly missing (the smallest configuration always fits).
std::vector<Knob> flat_cuda_knobs();
double flat_cuda_prior(int64_t element_bytes, int64_t elements, std::span<const int64_t> v);
bool flat_cuda_fits(int64_t elements, std::span<const int64_t> v);

// Their CPU twins (pointwise, clone, to_copy): one knob, `chunk` elements per block; the prior
// favours about 16 blocks (1024 to 65536 elements each), and no chunk beyond the tensor rounded up
// to a power of two (at least 1024).
std::vector<Knob> flat_cpu_knobs();
double flat_cpu_prior(int64_t elements, std::span<const int64_t> v);
bool flat_cpu_fits(int64_t elements, std::span<const int64_t> v);

// ---- signature checks ---------------------------------------------------------------------------

// Argument i as a tensor, or nullptr (missing, None, a scalar, a list).
const TensorMeta* tensor_arg(const OpSignature& sig, size_t i);
// A non-empty contiguous tensor on the device of `backend`, with a dtype the backend's templates
// handle: float32 everywhere, float16 and bfloat16 on CUDA.
bool template_tensor(const TensorMeta* t, Backend backend);
// As template_tensor, but any dense layout: the elements fill [0, numel) of the storage without
// gaps or overlaps in some order of the dimensions (channels-last, a transposed contiguous
// tensor). A kernel that walks the storage in order, with an output of the same strides
// (OutputSpec::like, in place), needs nothing else.
bool template_dense_tensor(const TensorMeta* t, Backend backend);
// As template_tensor, with any non-negative strides (a view that is only read: a slice, an
// expanded or transposed tensor).
bool template_strided_tensor(const TensorMeta* t, Backend backend);
// Rows with any layout outside the last dimension: a template tensor (any non-negative strides)
// whose last dimension is contiguous (stride 1, or a single element). The QK-norm of attention
// heads normalizes such rows: layer_norm over the head dimension of a q/k/v projection's chunk
// ([B, T, H, D] with strides [T*3*H*D, 3*H*D, D, 1]). Note [Strided rows].
bool strided_rows_tensor(const TensorMeta* t, Backend backend);
// `#define KF_X_ROW(r) ...`: the element offset of row r of such a tensor (rows numbered in
// row-major order of the dimensions before the last), with the dimensions that can be merged
// merged; for a contiguous tensor `(r) * cols_name`. C for both backends (long long arithmetic).
std::string row_offset_define(const TensorMeta& t, std::string_view cols_name);
// The largest number of elements every row offset of t is a multiple of (row starts stay aligned
// to vectors of a width dividing it).
int64_t row_offset_granule(const TensorMeta& t);
// The layouts of the image families (pooling, upsampling, batch norm): false for a contiguous
// template tensor, true for a 4-dimensional channels-last one (strides [H*W*C, 1, W*C, C], size-1
// dimensions' strides not looked at, as PyTorch's is_contiguous(channels_last) does not); nullopt
// for any other tensor.
std::optional<bool> contiguous_or_channels_last(const TensorMeta* t, Backend backend);
// The most channels a CPU channels-last kernel keeps per-channel values for on its stack.
constexpr int64_t kMaxCpuChannelsOnStack = 4096;
// The most dynamic shared memory a CUDA family's copy of its data may take: an sm_90 block can have
// 227 KiB, less the kernels' static reductions.
constexpr int64_t kCudaSharedBudget = 224 * 1024;
// Threads that cover a Hopper's memory latency in a memory-bound kernel (an H100 or H200 holds
// 270,336 resident): what the column priors aim a launch at.
constexpr int64_t kCudaLatencyThreads = int64_t{1} << 17;
// [N, C, OH, OW] of dtype `t` (N and C argument 0's), contiguous or channels-last.
OutputSpec image_output(DType t, int64_t oh, int64_t ow, bool channels_last);
// The rows the CPU image kernels split into blocks: [N*C, OH] contiguous, or [N, OH] channels-last
// (OW*C elements each); their count for argument 0 `x`, and as a launch expression.
int64_t image_rows(const TensorMeta& x, bool channels_last, int64_t oh);
std::string image_rows_expr(bool channels_last, int64_t oh);
bool is_none(const OpSignature& sig, size_t i);
const int64_t* int_arg(const OpSignature& sig, size_t i);
// The last dimension's length and the product of the others.
int64_t cols_of(const TensorMeta& t);
int64_t rows_of(const TensorMeta& t);
// "size0_2": the name of tensor argument `arg`'s dimension `dim` in a launch plan.
std::string size_name(size_t arg, size_t dim);
// The launch-plan names of the last dimension and of the row count of tensor argument 0.
std::string cols_expr(const TensorMeta& t);
std::string rows_expr(const TensorMeta& t);
// Tensor argument 0 seen as [outer, len, inner] around its dimension `dim`: len its size there,
// outer and inner the products of the sizes before and after it (1 when there are none), as
// launch-plan expressions and as this signature's values (softmax over a dimension, cumsum).
struct DimSplit {
  std::string outer, len, inner;
  int64_t outer_size = 1, len_size = 1, inner_size = 1;
};
DimSplit split_at_dim(const TensorMeta& t, int64_t dim);
// The column kernels over [outer, len, inner] (softmax_dim, cumsum_split): a block takes a tile of
// block / split * vec neighbouring columns of one outer index, `split` threads share each column,
// `vec` columns per access. Knobs v = {block, split, vec}. The prior: the widest access the columns
// allow up to `max_vec_bytes` (a kernel that keeps per-column state in registers may want fewer
// columns per thread than 16 bytes hold), about 2^17 threads in all with split in [min_split,
// max_split] and at least `min_per_thread` elements of a column per thread, blocks of 256, tiles
// of 128 bytes. The launch: grid outer * tiles, block, and the size arguments (len, inner, tiles)
// after x and y.
double split_columns_prior(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, int64_t min_split,
                           int64_t max_split, int64_t min_per_thread, int64_t max_vec_bytes = 16);
// The same kernels with a copy of the block's tile (len x tile elements) in dynamic shared memory
// (Note [Cached columns] in dim_softmax.cc), knobs v = {block, split, vec, cache}:
// - column_copy_bytes: the copy's bytes for the signature;
// - columns_past_l2: whether the tensor is past about half of a Hopper's 50 MB L2, so that a
//   second pass without the copy reads memory again;
// - cached_columns_prior: the widest access (up to `max_vec_bytes`, as above), resident threads
//   per SM (the copy and the kernel's static shared memory limit the blocks an SM holds), rows of
//   the tile of at least 32 bytes (a sector; `sector_weight` says how much a narrower row costs),
//   about `per_thread` elements of a column per thread;
// - cached_columns_launch: after split_columns_launch, the copy's dynamic shared memory and a last
//   size argument, 1 when the copy fits the signature the spec is resolved for (else 0: the kernel
//   streams, with no shared memory asked).
int64_t column_copy_bytes(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v);
bool columns_past_l2(const OpSignature& sig, const DimSplit& e);
double cached_columns_prior(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, int64_t static_bytes,
                            int64_t per_thread, double sector_weight, int64_t max_vec_bytes = 16);
void cached_columns_launch(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, int64_t static_bytes,
                           Launch& l);
// The same kernels over a cluster (softmax_dim_cluster, cumsum_cluster: Notes [Clustered
// columns] in dim_softmax.cc, [Clustered scan] in scan.cc), knobs v = {block, split, vec,
// cluster}: a tile's len rows in `cluster` chunks, one block each, each block's chunk copied to
// dynamic shared memory.
// - clustered_chunk: a block's rows, ceil(len / cluster);
// - clustered_copy_bytes: a block's copy, clustered_chunk x tile elements;
// - clustered_static_bytes: the kernels' static shared memory, KF_PARTS x tile partials and the
//   tile's merged values, `entry_bytes` each;
// - clustered_columns_valid: split at most the block and `max_split` (the family's bound for the
//   chunk), accesses the columns allow, every block of a cluster with rows, no tile mostly past
//   the last column, and the copy with the static shared memory within the budget;
// - clustered_columns_prior: the widest access (up to `max_vec_bytes`), resident threads per SM
//   (the copy and the static shared memory limit the blocks an SM holds), tile rows up to 128
//   bytes (whole lines), about `per_thread` elements of a column per thread; halved for tensors
//   within L2, which the one-block kernels read twice at little cost;
// - clustered_columns_launch: after split_columns_launch, a cluster of blocks per tile, the copy's
//   dynamic shared memory, and a last size argument 1 (the copy fits: the families' valid()).
int64_t clustered_chunk(const DimSplit& e, std::span<const int64_t> v);
int64_t clustered_copy_bytes(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v);
int64_t clustered_static_bytes(std::span<const int64_t> v, int64_t entry_bytes);
bool clustered_columns_valid(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, int64_t entry_bytes,
                             int64_t max_split);
double clustered_columns_prior(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v,
                               int64_t static_bytes, int64_t per_thread, int64_t max_vec_bytes);
void clustered_columns_launch(const OpSignature& sig, const DimSplit& e, std::span<const int64_t> v, Launch& l);
// A warp's threads of one column in those kernels (lanes block / split apart) share their partials
// by shuffles; the static shared memory of KF_PARTS x tile entries of `entry_bytes` each.
int64_t column_parts_bytes(std::span<const int64_t> v, int64_t entry_bytes);
void split_columns_launch(const DimSplit& e, std::span<const int64_t> v, Launch& l);
// Whether the signature's target runs thread block clusters (sm_90 on): the cluster families and
// knobs (Notes [Split rows], [Cached group rows], [Clustered columns], [Clustered scan]).
bool has_clusters(const OpSignature& sig);
// Whether a vector access of `vec` elements is allowed for every tensor argument of `sig`: the
// vector is at most 16 bytes and every tensor's pointer alignment is a multiple of it. (Outputs
// are fresh allocations, aligned far beyond 16 bytes by both allocators.)
bool vector_fits(const OpSignature& sig, int64_t vec);

// ---- spec assembly ----------------------------------------------------------------------------------

std::string define(std::string_view name, int64_t value);   // "-DKF_BLOCK=256"
// -DKF_DTYPE=0|1|2 for float32, float16, bfloat16.
std::string dtype_define(DType t);
// A spec with one entry point and one launch; the caller fills the launch's numbers and args.
KernelSpec one_launch_spec(Backend backend, std::string source, std::string entry, std::vector<std::string> options);
// Compile options every CPU template uses before its knobs: -O3 over the builder's fixed -O2, and
// the x86-64 level (v2, v3, v4) of the ISA the signature's target arch names ("x86_64-avx2").
std::vector<std::string> cpu_base_options(const OpSignature& sig);

// The first thing in every CUDA template: dtype and accumulator types, conversions, vector
// loads, warp and block reductions. Needs KF_DTYPE and KF_BLOCK.
extern const char* const kCudaPrelude;
// After the prelude in the row kernels: the row-to-thread mapping (KF_WARP_ROW, KF_ROW_LANES)
// and reductions over a row's threads.
extern const char* const kCudaRowMapping;
// Thread block clusters (sm_90 on, kernels compiled with __cluster_dims__): a block's shared
// memory read by another block of its cluster (kf_cluster_ld of a float or a double). Only in the
// sources of configurations that launch clusters: the instructions do not exist before sm_90.
extern const char* const kCudaClusterShared;
// Row statistics for the norms (Note [Norm statistics] in layer_norm.cc): Welford states and
// their merges. Needs the prelude, the row mapping and KF_VEC.
extern const char* const kCudaNormStatistics;
// After the prelude in the copying kernels (embedding, cat): kf_word, an unsigned type of
// KF_WORD_BYTES (2, 4, 8 or 16) bytes, to move elements as they are stored, never through float.
extern const char* const kCudaRawWord;
// After the prelude in the image kernels (pooling, upsampling) of [N, C, H, W] input, contiguous
// or channels-last (KF_CL; KF_C, KF_H, KF_W, KF_OH, KF_OW): KF_POSITION(i, oh, ow, base) gives
// output element i's (oh, ow), the elements numbered in the output's storage order, and `base`,
// where its input plane starts; KF_AT(h, w) is element (h, w)'s offset from there.
extern const char* const kCudaImagePosition;
// The first thing in every CPU template: the ABI header, libm, parameter access.
extern const char* const kCpuPrelude;
// After the prelude in the CPU norms (layer_norm, group_norm): kf_row_stats, a row's mean and
// biased variance in double over KF_LANES accumulators, Welford's (KF_WELFORD) or two passes.
extern const char* const kCpuNormStatistics;

// Smallest power of two >= v (v >= 1).
int64_t pow2_ceil(int64_t v);
// 1 / (1 + |log2(a / b)| * weight): how close a is to b on a log scale, in (0, 1].
double closeness(double a, double b, double weight);

// ---- the families ----------------------------------------------------------------------------------

// Each family's .cc file registers its families, once, at static initialization:
//   const FamilyRegistration kRegistered{[]() -> std::unique_ptr<KernelTemplate> { return ...; }, ...};
// The library (kernel_template.cc) makes one of each and orders them as the operator catalog names
// them (runtime/op_catalog.h: OpEntry::template_families), CUDA before CPU. The target is an
// OBJECT library, so every family file is linked and registers: a new family is its file, its
// line in CMakeLists.txt and its name in the catalog entry it serves.
using FamilyFactory = std::unique_ptr<KernelTemplate> (*)();
struct FamilyRegistration {
  FamilyRegistration(std::initializer_list<FamilyFactory> factories);
};
// Every factory registered so far.
const std::vector<FamilyFactory>& registered_families();

}  // namespace kforge::search::templates
