// The CUDA backend's end-to-end self-test: driver -> NVRTC -> module -> launch -> exact check.
//
//   std::string report;
//   Status s = run_cuda_selftest(&report);   // report holds one "key: value" line per fact
//   if (s.code() == StatusCode::kUnavailable) { /* no GPU here: not an error */ }
//
// It answers "can kforge build and run its own kernels in this process?" for `kforge env`, the
// worker's start-up check and tests/gpu/cuda_smoke.py (through the C entry point below, with
// ctypes). It works inside a PyTorch process: it uses the device of the context that is current
// on the calling thread (else device 0) through that device's primary context, which is the one
// PyTorch uses, and leaves the calling thread's current context as it found it.
//
// Promises: never crashes or throws on a host without a GPU, driver or NVRTC (kUnavailable);
// refuses to run while a CUDA graph capture is in progress (kUnavailable) rather than break it;
// a wrong result is kInternal and names the first bad element. The report is filled as far as the
// test got, also on failure.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "runtime/status.h"

namespace kforge {

// y[i] = fmaf(a, x[i], b): one correctly rounded operation, so the host can check it exactly.
inline constexpr std::string_view kCudaSelftestKernelName = "kforge_selftest_axpb";
std::string_view cuda_selftest_kernel_source() noexcept;

// `report` may be null.
Status run_cuda_selftest(std::string* report);

}  // namespace kforge

// C entry point for ctypes. Writes the report (and on failure an "error: ..." line) into buf,
// truncated to len - 1 bytes and always NUL-terminated when len > 0.
// Returns 0 on success, 1 on failure, 2 when no GPU, driver or NVRTC is available.
extern "C" __attribute__((visibility("default"))) int kforge_cuda_selftest(
    char* buf, std::size_t len) noexcept;
