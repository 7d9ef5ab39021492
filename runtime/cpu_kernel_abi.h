/* The ABI between kforge and a CPU kernel (Backend::kCpu). C, so kernels can be C or C++.
 *
 * A CPU kernel mirrors a CUDA kernel: the launch plan gives it a grid of blocks, and kforge calls
 * the entry point once per block (possibly from several threads at once, in any order), passing
 * the block's coordinates and the parameters exactly as cuLaunchKernel would: params[i] points at
 * the value of parameter i (a pointer parameter's value is the data pointer; an int64 parameter's
 * value is an int64_t; and so on, per the plan's ValueType).
 *
 *   extern "C" void scale_rows(const kforge_cpu_block* b, void* const* params) {
 *     const float* x = *(const float* const*)params[0];
 *     float* y = *(float* const*)params[1];
 *     long cols = *(const int64_t*)params[2];
 *     for (long c = 0; c < cols; ++c) y[b->block_idx[0] * cols + c] = 2 * x[b->block_idx[0] * cols + c];
 *   }
 *
 * block_dim and shared_mem_bytes are passed as the plan resolved them; shared_mem points at a
 * per-call buffer of that many bytes (NULL when 0), private to this block.
 */
#ifndef KFORGE_RUNTIME_CPU_KERNEL_ABI_H_
#define KFORGE_RUNTIME_CPU_KERNEL_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KFORGE_CPU_ABI_VERSION 1

typedef struct kforge_cpu_block {
  uint32_t abi_version;      /* KFORGE_CPU_ABI_VERSION */
  uint32_t grid_dim[3];
  uint32_t block_idx[3];
  uint32_t block_dim[3];
  uint32_t shared_mem_bytes;
  void* shared_mem;
} kforge_cpu_block;

typedef void (*kforge_cpu_entry)(const kforge_cpu_block* block, void* const* params);

#ifdef __cplusplus
}
#endif

#endif /* KFORGE_RUNTIME_CPU_KERNEL_ABI_H_ */
