"""What an intercepted call costs with the hook: without kforge, on a miss, and on a hit.

Here (build tree, CPU):
    .venv/bin/python bench/hook_hit_overhead.py --device cpu --rounds 12
On a GPU host, from an unpacked bundle and this source tree's bench/ (python3 with torch; the CPU
kernel needs a C++ compiler there, or one built here passed with --kernel-so):
    python3 bench/hook_hit_overhead.py --device cpu --rounds 12 --bundle-root <bundle>
    python3 bench/hook_hit_overhead.py --device cuda --rounds 12 --bundle-root <bundle>

The benchmarked call is torch.softmax(x, -1) on a tiny contiguous float32 x ([4, 16] by default),
so the kernel's own time does not hide the cost of getting to it. Three variants, each its own
process, once per round (rounds cycle through all 6 orders, seeded):
  without  plain python, no kforge;
  miss     kforge preloaded (LD_PRELOAD of the shim, or --load ctypes), KFORGE_MODE=active, an
           empty private cache: the hook records the call and runs PyTorch's kernel;
  hit      the same, with a cache that holds a real entry for exactly this signature: a
           hand-written softmax kernel (one block per row; CPU: runtime/cpu_kernel_abi.h, compiled
           with c++; CUDA: compiled by NVRTC for device 0) published by kforge-publish-test-entry
           for the signature the hook itself reports. The child runs a loader round
           (kforge_hook_report_now), calls through the shadow phase until the entry is active, and
           only then times: every timed call runs the replacement instead of PyTorch's kernel
           (checked with the entry's active-call counter, and its output against PyTorch's).
Each child reports the median over --repeats of the mean of --calls back-to-back calls (on CUDA
synchronized at both ends); it also times torch.add on 4-element tensors, which has no entry, so
its "hit" column is a second miss. Rounds cycle through all 6 orders of the three variants; per
round, the paired differences against "without" give the added ns per call: the table prints
medians, and the differences' median balanced over which of the two ran first, with a bootstrap
95% interval.
CPU threads are fixed with --threads. Target: at most 150 ns added on a miss.
--device cuda ran once on the H200 (bench/results/2026-12-03-h200-cuda-hook-hit-overhead.log): per-call
times of 6.5-11.3 us vary more between children than the 150 ns target, so that run is inconclusive.
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys

import side_by_side as sbs

CPU_KERNEL = r"""
#include <cmath>
#include <cstdint>
#include "runtime/cpu_kernel_abi.h"
// Softmax over the last dimension of a contiguous float32 matrix, one block per row, in double.
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* params) {
  const float* x = *(const float* const*)params[0];
  float* y = *(float* const*)params[1];
  const int64_t cols = *(const int64_t*)params[2];
  const float* xr = x + (int64_t)b->block_idx[0] * cols;
  float* yr = y + (int64_t)b->block_idx[0] * cols;
  double m = -INFINITY, s = 0;
  for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
  for (int64_t c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
  for (int64_t c = 0; c < cols; ++c) yr[c] = (float)(std::exp((double)xr[c] - m) / s);
}
"""
# NVRTC compiles this without headers. One single-thread block per row: the rows are tiny.
CUDA_KERNEL = r"""
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, long long cols) {
  const float* xr = x + (long long)blockIdx.x * cols;
  float* yr = y + (long long)blockIdx.x * cols;
  float m = __int_as_float(0xff800000);   // -inf
  for (long long c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
  double s = 0.0;
  for (long long c = 0; c < cols; ++c) s += exp((double)xr[c] - (double)m);
  for (long long c = 0; c < cols; ++c) yr[c] = (float)(exp((double)xr[c] - (double)m) / s);
}
"""
LAUNCH = {"cpu": "entry=softmax_rows;grid=numel0 / size0_1,1,1;block=1,1,1;smem=0;"
                 "args=input:0,output:0,size:size0_1:i64",
          "cuda": "entry=softmax_rows;grid=numel0 / size0_1,1,1;block=1,1,1;smem=0;"
                  "args=input:0,output:0,size:size0_1:i64"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--cols", type=int, default=16)
    p.add_argument("--rounds", type=int, default=12,
                   help="rounds of one child per variant (rounded up to a multiple of 6, all orders)")
    p.add_argument("--calls", type=int, default=50000, help="back-to-back calls per repeat")
    p.add_argument("--repeats", type=int, default=7, help="repeats per child (their median is reported)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every child")
    p.add_argument("--shadow-calls", type=int, default=20, help="KFORGE_SHADOW_CALLS of the hit child")
    p.add_argument("--seed", type=int, default=0, help="seed of the round order")
    p.add_argument("--publisher", help="kforge-publish-test-entry (default: the bundle's or build's)")
    p.add_argument("--kernel-so", help="CPU: the kernel already compiled (default: compile it with c++)")
    p.add_argument("--child", choices=("without", "miss", "hit", "signature"), help=argparse.SUPPRESS)
    sbs.add_kforge_arguments(p)
    return p.parse_args(argv)


# ---- one child ---------------------------------------------------------------------------------

def child(args):
    import torch
    hook = sbs.open_hook()
    torch.set_num_threads(args.threads)
    dev = args.device
    sync = torch.cuda.synchronize if dev == "cuda" else None
    torch.manual_seed(0)
    x = torch.randn(args.rows, args.cols, device=dev)
    a, b = torch.ones(4, device=dev), torch.ones(4, device=dev)

    def softmax_entry():
        (sig,) = [s for s in hook.stats()["signatures"] if s["op"] == "aten::_softmax"]
        return sig

    y_first = torch.softmax(x, -1)
    if args.child == "signature":
        return sbs.emit({"signature": softmax_entry(), "torch_version": hook.stats()["torch_version"]})
    out = {}
    if hook:
        hook.report_now()   # a loader round: the hit child's entry is loaded (shadow) here
        for _ in range(args.shadow_calls + 5):
            if softmax_entry()["state"] != "shadow":
                break
            torch.softmax(x, -1)
        before = softmax_entry()
        if args.child == "hit" and before["state"] != "active":
            sys.exit(f"the entry never went active: {before} {hook.stats()['swap']}")
        if args.child == "miss" and before["state"] != "observe":
            sys.exit(f"the miss child's signature is not a miss: {before}")
    softmax_ns = sbs.ns_per_call(lambda: torch.softmax(x, -1), args.calls, args.repeats, sync)
    add_ns = sbs.ns_per_call(lambda: torch.add(a, b), args.calls, args.repeats, sync)
    y = torch.softmax(x, -1)
    out.update(softmax_ns=softmax_ns, add_ns=add_ns, headline=f"{softmax_ns:.0f}/{add_ns:.0f} ns",
               max_abs_diff_vs_first_call=(y - y_first).abs().max().item())
    if hook:
        after = softmax_entry()
        timed = args.calls * args.repeats + min(args.calls, 2000)
        out.update(state=after["state"], entry=after.get("entry"), config=hook.stats()["config"],
                   active_calls=after.get("active_calls", 0) - before.get("active_calls", 0),
                   fallbacks=after.get("fallbacks", 0), timed_calls=timed)
        if args.child == "hit" and out["active_calls"] < timed:
            sys.exit(f"only {out['active_calls']} of {timed} timed calls ran the replacement: {after}")
    sbs.emit(out)


# ---- the parent --------------------------------------------------------------------------------

def tool_paths(args, files):
    bundle_tests = files["bundle"] / "share" / "kforge" / "tests" if files["bundle"] else None
    publisher = pathlib.Path(args.publisher) if args.publisher else (
        bundle_tests / "kforge-publish-test-entry" if bundle_tests
        else files["build"] / "tests" / "kforge-publish-test-entry")
    include = next((d for d in ([bundle_tests / "include"] if bundle_tests else []) + [sbs.ROOT]
                    if (d / "runtime" / "cpu_kernel_abi.h").exists()), None)
    if not publisher.exists():
        sys.exit(f"no kforge-publish-test-entry at {publisher}: build it or pass --publisher")
    return publisher.resolve(), include


def publish_entry(args, files, signature, torch_version, work):
    """A cache directory (0700) holding one entry for `signature`; returns (dir, key)."""
    publisher, include = tool_paths(args, files)
    src = work / ("softmax.cc" if args.device == "cpu" else "softmax.cu")
    src.write_text(CPU_KERNEL if args.device == "cpu" else CUDA_KERNEL)
    extra = []
    if args.device == "cpu":
        so = pathlib.Path(args.kernel_so).resolve() if args.kernel_so else work / "softmax.so"
        if not args.kernel_so:
            cxx = shutil.which("c++") or shutil.which("g++")
            if cxx is None or include is None:
                sys.exit("no C++ compiler or no runtime/cpu_kernel_abi.h here: pass --kernel-so "
                         "(built elsewhere with: c++ -shared -fPIC -O2 -I<kforge src> softmax.cc)")
            subprocess.run([cxx, "-shared", "-fPIC", "-O2", f"-I{include}", "-o", str(so), str(src)],
                           check=True)
        extra = ["--so", str(so), "--compile-option", "-O2"]
    cache = sbs.private_dir("kforge-bench-cache-")
    r = subprocess.run([str(publisher), "--cache", str(cache), "--signature", signature["encoding"],
                        "--backend", args.device, "--source", str(src), "--entry", "softmax_rows",
                        "--launch", LAUNCH[args.device], "--output", "like:0",
                        "--torch-version", torch_version, *extra], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"kforge-publish-test-entry failed (exit {r.returncode}): {r.stderr}")
    return cache, r.stdout.strip()


def main():
    args = parse_args()
    if args.child:
        return child(args)
    torch, files = sbs.parent_start(args)
    base = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--rows", str(args.rows),
            "--cols", str(args.cols), "--calls", str(args.calls), "--repeats", str(args.repeats),
            "--threads", str(args.threads), "--shadow-calls", str(args.shadow_calls)]

    # The signature exactly as the hook encodes it, from an observe-mode child.
    probe = sbs.run_child(base + ["--child", "signature"], sbs.child_env(files, args.load),
                          timeout=600, cpus=args.cpus)
    sig = probe["signature"]
    work = sbs.private_dir("kforge-bench-work-")
    cache, key = publish_entry(args, files, sig, probe["torch_version"], work)
    print(f"# signature {sig['signature']} (id {sig['id']}); entry {key} published into {cache}")
    empty = sbs.private_dir("kforge-empty-cache-")
    hooked = dict(KFORGE_MODE="active", KFORGE_SHADOW_CALLS=args.shadow_calls)
    variants = {"without": sbs.child_env(),
                "miss": sbs.child_env(files, args.load, KFORGE_CACHE_DIR=empty, **hooked),
                "hit": sbs.child_env(files, args.load, KFORGE_CACHE_DIR=cache, **hooked)}

    def start(name, env):
        return sbs.run_child(base + ["--child", name], env,
                             timeout=600, cpus=args.cpus)

    res, orders = sbs.run_rounds(variants, args.rounds, args.seed, start)
    hit = res["hit"]
    print(f"# hook config (hit child): {hit[0]['config']}")
    print(f"# {args.threads} CPU thread(s); per child: median of {args.repeats} x {args.calls} calls; "
          f"{len(orders)} rounds; hit children: state {sorted({r['state'] for r in hit})}, every timed call "
          f"active ({min(r['active_calls'] for r in hit)} >= {hit[0]['timed_calls']}), "
          f"{max(r['fallbacks'] for r in hit)} fallbacks, replacement vs. PyTorch's first call: max abs "
          f"diff {max(r['max_abs_diff_vs_first_call'] for r in hit):.2e}")
    print()
    print(f"ns per call, median of {len(orders)} rounds; added = paired difference vs. without kforge, "
          f"balanced over which ran first [bootstrap 95% interval]")
    print(f"{'call':38s} {'without':>8s} {'miss':>8s} {'hit':>8s}   {'miss added':>24s}   {'hit added':>24s}")
    for what, label in (("softmax_ns", f"torch.softmax(f32[{args.rows},{args.cols}], -1)"),
                        ("add_ns", "torch.add(f32[4], f32[4]) (no entry)")):
        wo = [r[what] for r in res["without"]]
        miss = sbs.paired(wo, [r[what] for r in res["miss"]], sbs.first(orders, "without", "miss"))
        hitp = sbs.paired(wo, [r[what] for r in hit], sbs.first(orders, "without", "hit"))

        def added(p):
            return f"{p['diff']:+6.0f} " + "{:>17s}".format("[{:+.0f}, {:+.0f}]".format(*p["interval"]))
        print(f"{label:38s} {miss['without']:8.0f} {miss['with']:8.0f} {hitp['with']:8.0f}   "
              f"{added(miss):>24s}   {added(hitp):>24s}")
    print("(the add row's 'hit' column is a second miss: the hit child's cache has no entry for add)")
    print("round orders: " + " | ".join(",".join(o) for o in orders))
    for what in ("softmax_ns", "add_ns"):
        print(f"per-child {what}: " + "; ".join(
            f"{v} " + " ".join(f"{r[what]:.0f}" for r in res[v]) for v in variants))
    print("target: <= 150 ns added per call on a miss")
    print(f"# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sbs.remove_private_dirs()


if __name__ == "__main__":
    main()
