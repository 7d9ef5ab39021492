#!/usr/bin/env python3
"""kforge's CUDA loader inside a real PyTorch process, on a GPU.

Usage: cuda_smoke.py [path/to/libkforge_runtime.so]   (or set KFORGE_RUNTIME_LIB)

What it proves: with torch's CUDA context already alive, kforge's runtime library (loaded with
ctypes, as a Python process would) finds the driver and an NVRTC, compiles and runs its self-test
kernel through torch's primary context, and leaves torch working: a torch op after the self-test
still gives exact results. Exits 0 on success, 1 on any failure, 2 when no GPU is usable.
Plain Python 3, no pytest.
"""

import ctypes
import os
import sys


def fail(message, code=1):
    print(f"cuda_smoke: FAIL: {message}", flush=True)
    sys.exit(code)


def mapped_libraries(*needles):
    """Files mapped into this process whose name contains one of the needles, in map order."""
    seen = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            name = os.path.basename(path)
            if any(n in name for n in needles) and path not in seen:
                seen.append(path)
    return seen


def torch_check(torch, label):
    """An exact elementwise op and a reduction; both results are exactly representable."""
    x = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
    y = x * 2.0 + 1.0
    expected_sum = float(sum(range(1 << 16)) * 2 + (1 << 16))
    got_sum = float(y.sum(dtype=torch.float64).item())
    if got_sum != expected_sum:
        fail(f"torch op {label} the self-test gave sum {got_sum}, expected {expected_sum}")
    if not torch.equal(y[:5].cpu(), torch.tensor([1.0, 3.0, 5.0, 7.0, 9.0])):
        fail(f"torch op {label} the self-test gave {y[:5].cpu().tolist()}")
    torch.cuda.synchronize()
    print(f"torch check {label} self-test: ok", flush=True)


def main():
    lib_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KFORGE_RUNTIME_LIB")
    if not lib_path:
        fail("give the kforge runtime library as argv[1] or KFORGE_RUNTIME_LIB")
    if not os.path.exists(lib_path):
        fail(f"no such file: {lib_path}")

    import torch

    if not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False: no usable GPU", code=2)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"device {torch.cuda.get_device_name(0)}", flush=True)
    # Creates torch's primary context on device 0 and makes it current on this thread.
    torch_check(torch, "before")

    lib = ctypes.CDLL(lib_path)
    selftest = lib.kforge_cuda_selftest
    selftest.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    selftest.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(16384)
    rc = selftest(buf, ctypes.sizeof(buf))
    report = buf.value.decode("utf-8", errors="replace")
    print("---- kforge_cuda_selftest report ----")
    print(report.rstrip("\n"))
    print(f"---- returned {rc} ----", flush=True)

    print("mapped libnvrtc:", *(mapped_libraries("libnvrtc.so") or ["(none)"]), sep="\n  ")
    print("mapped libcuda:", *(mapped_libraries("libcuda.so") or ["(none)"]), sep="\n  ")

    if rc != 0:
        fail(f"kforge_cuda_selftest returned {rc}", code=2 if rc == 2 else 1)
    if "primary (already current)" not in report:
        fail("the self-test did not run in torch's (current, primary) context")
    torch_check(torch, "after")
    print("cuda_smoke: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
