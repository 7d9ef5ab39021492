"""The per-operator report (issue 23): catalog operators on shapes taken from real models, PyTorch's
eager kernel against the kernel kforge's own search found, and against torch.compile's kernel for the
same single operator, all timed in one process.

    .venv/bin/python bench/per_op.py --device cpu --minutes 20 --threads 1,2        # this host
    python3 bench/per_op.py --device cuda --bundle-root <bundle> --minutes 20       # a GPU host
    .venv/bin/python bench/per_op.py --device cpu --only softmax,layer_norm --minutes 3 --no-compile

1. warm: `kforge warm --no-e2e` runs this file as a workload (--child steps) that calls every row's
   operator in turn, with a daemon, cache and state of its own (a temporary directory), until the
   budget is spent or the daemon has nothing left to search. Every row's signature is reported by
   the hook and searched; what wins its search and its trial in the workload's process is active
   in the cache. The daemon warm started is then stopped (its searches would compete with the
   timing run).
2. time: `kforge run --no-daemon` runs this file again (--child time, KFORGE_BENCH_TOGGLE=1) on
   that cache alone. It first measures the copy bandwidth (a large clone), then per row: blocks of
   calls with kforge's interceptors out of the dispatcher (PyTorch eager) and in (kforge's kernel
   where one is active, else PyTorch's own through the hook), alternated, each after an untimed
   block, medians per call; then
   torch.compile of the same single operator, with the interceptors out. On CUDA, rows that move
   under 16 MB are launch-bound: they are also timed as CUDA graphs of the same calls, where launch
   latency does not hide the kernel (graph_* columns). The hook's statistics say which rows a
   kforge kernel served: a row without one keeps PyTorch's kernel, and says so (kernel column).
3. writes <out>/<date>-<device>-per-op.csv with the columns
   op,dtype,shape,torch_us,compile_us,kforge_us,speedup,speedup_vs_compile,pct_copy_bw
   (then threads, kernel, graph_torch_us, graph_kforge_us, graph_speedup, bytes), and a markdown
   table beside it. pct_copy_bw is the row's bytes (inputs read, outputs written) over its best
   time (kforge's where it serves, else PyTorch's), as a share of the copy bandwidth measured in the
   same run.

Standard library and torch only (the GPU host has no pip). Not run in CI: a full run is a bench.
"""

import argparse
import ctypes
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
COLUMNS = ["op", "dtype", "shape", "torch_us", "compile_us", "kforge_us", "speedup", "speedup_vs_compile", "pct_copy_bw",
           "threads", "kernel", "graph_torch_us", "graph_kforge_us", "graph_speedup", "bytes"]


# ---- the rows ------------------------------------------------------------------------------------

def rows(device):
    """(op, dtype, shape text, make) where make(device) -> (fn, args): fn(*args) calls the operator.
    CUDA: the shapes of issue 23 and of the operators issue's models (GPT-2 and Llama prefill and
    decode, a 262k vocabulary, ViT, ResNet, a diffusion UNet). CPU: float32 at sizes a 2-core host
    times in seconds, and the short rows where PyTorch's CPU kernels vectorize poorly."""
    import torch
    import torch.nn.functional as F
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32

    def t(shape, dtype, dev, channels_last=False, low=None):
        # A generator of its own: a CUDA graph capture that fails (a row's graph_error) leaves the
        # default CUDA generator registered with the dead graph, and every later torch.randn on
        # the device then raises "Offset increment outside graph capture" (the H100 run of aa0caff
        # lost all rows after its third that way).
        g = torch.Generator(device=dev)
        g.manual_seed(zlib.crc32(repr((shape, str(dtype))).encode()))
        x = torch.randn(shape, dtype=torch.float32, device=dev, generator=g)
        if low is not None:
            x = x.abs() + low
        x = x.to(dtype)
        return x.contiguous(memory_format=torch.channels_last) if channels_last else x

    def r(op, dtype, shape, make):
        return (op, str(dtype).replace("torch.", ""), shape, make)

    out = []
    if device == "cuda":
        out += [
            r("softmax", bf, "[4096,50257] dim=-1", lambda d: (lambda x: torch.softmax(x, -1), (t((4096, 50257), bf, d),))),
            r("softmax", bf, "[8,262144] dim=-1", lambda d: (lambda x: torch.softmax(x, -1), (t((8, 262144), bf, d),))),
            r("softmax", bf, "[64,4096,512] dim=1", lambda d: (lambda x: torch.softmax(x, 1), (t((64, 4096, 512), bf, d),))),
            r("softmax", f16, "[4096,4096] dim=-1", lambda d: (lambda x: torch.softmax(x, -1), (t((4096, 4096), f16, d),))),
            r("log_softmax", f32, "[4096,50257] dim=-1", lambda d: (lambda x: torch.log_softmax(x, -1), (t((4096, 50257), f32, d),))),
            r("layer_norm", bf, "[8192,768]", lambda d: (lambda x, w, b: F.layer_norm(x, (768,), w, b),
                                                         (t((8192, 768), bf, d), t((768,), bf, d), t((768,), bf, d)))),
            r("layer_norm", bf, "[1,768] decode", lambda d: (lambda x, w, b: F.layer_norm(x, (768,), w, b),
                                                             (t((1, 768), bf, d), t((768,), bf, d), t((768,), bf, d)))),
            r("layer_norm", f16, "[8192,1024]", lambda d: (lambda x, w, b: F.layer_norm(x, (1024,), w, b),
                                                           (t((8192, 1024), f16, d), t((1024,), f16, d), t((1024,), f16, d)))),
            r("group_norm", bf, "[16,320,64,64] G=32", lambda d: (lambda x, w, b: F.group_norm(x, 32, w, b),
                                                                  (t((16, 320, 64, 64), bf, d), t((320,), bf, d), t((320,), bf, d)))),
            r("group_norm", bf, "[16,320,64,64] G=32 channels_last",
              lambda d: (lambda x, w, b: F.group_norm(x, 32, w, b),
                         (t((16, 320, 64, 64), bf, d, True), t((320,), bf, d), t((320,), bf, d)))),
            # A UNet at batch 2 (classifier-free guidance at one image): 64 rows, fewer than the SMs.
            r("group_norm", bf, "[2,320,64,64] G=32", lambda d: (lambda x, w, b: F.group_norm(x, 32, w, b),
                                                                 (t((2, 320, 64, 64), bf, d), t((320,), bf, d), t((320,), bf, d)))),
            r("batch_norm", bf, "[64,256,56,56] eval", lambda d: (lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b),
                                                                  (t((64, 256, 56, 56), bf, d), t((256,), bf, d), t((256,), bf, d, low=0.5),
                                                                   t((256,), bf, d), t((256,), bf, d)))),
            r("gelu", bf, "[8192,3072]", lambda d: (F.gelu, (t((8192, 3072), bf, d),))),
            r("gelu", bf, "[8192,3072] tanh", lambda d: (lambda x: F.gelu(x, approximate="tanh"), (t((8192, 3072), bf, d),))),
            r("silu", bf, "[8192,11008]", lambda d: (F.silu, (t((8192, 11008), bf, d),))),
            r("silu", bf, "[1,11008] decode", lambda d: (F.silu, (t((1, 11008), bf, d),))),
            r("add", bf, "[8192,768]", lambda d: (torch.add, (t((8192, 768), bf, d), t((8192, 768), bf, d)))),
            r("mul", bf, "[8192,11008]", lambda d: (torch.mul, (t((8192, 11008), bf, d), t((8192, 11008), bf, d)))),
            r("relu", bf, "[64,256,56,56]", lambda d: (torch.relu, (t((64, 256, 56, 56), bf, d),))),
            r("sigmoid", bf, "[64,256,56,56]", lambda d: (torch.sigmoid, (t((64, 256, 56, 56), bf, d),))),
            r("rsqrt", f32, "[8192,4096]", lambda d: (torch.rsqrt, (t((8192, 4096), f32, d, low=0.1),))),
            r("pow", f32, "[8192,4096] ^2", lambda d: (lambda x: x.pow(2), (t((8192, 4096), f32, d),))),
            r("mean", f32, "[8192,4096] dim=-1", lambda d: (lambda x: x.mean(-1, keepdim=True), (t((8192, 4096), f32, d),))),
            r("amax", bf, "[4096,50257] dim=-1", lambda d: (lambda x: x.amax(-1), (t((4096, 50257), bf, d),))),
            r("argmax", bf, "[64,50257] dim=-1", lambda d: (lambda x: x.argmax(-1), (t((64, 50257), bf, d),))),
            r("cumsum", bf, "[64,4096,512] dim=1", lambda d: (lambda x: x.cumsum(1), (t((64, 4096, 512), bf, d),))),
            r("embedding", bf, "[50257,768] ids [8,1024]",
              lambda d: (F.embedding, (torch.randint(0, 50257, (8, 1024), device=d), t((50257, 768), bf, d)))),
            r("cat", bf, "[8,12,1024,64]+[8,12,1,64] dim=2",
              lambda d: (lambda a, b: torch.cat([a, b], 2), (t((8, 12, 1024, 64), bf, d), t((8, 12, 1, 64), bf, d)))),
            r("clone", bf, "[8,1024,12,64] transposed", lambda d: (lambda x: x.transpose(1, 2).contiguous(),
                                                                   (t((8, 1024, 12, 64), bf, d),))),
            r("to_copy", bf, "[8192,4096] to float32", lambda d: (lambda x: x.float(), (t((8192, 4096), bf, d),))),
            r("max_pool2d", bf, "[64,64,112,112] 3x3 s2", lambda d: (lambda x: F.max_pool2d(x, 3, 2, 1), (t((64, 64, 112, 112), bf, d),))),
            r("avg_pool2d", bf, "[64,256,56,56] 2x2", lambda d: (lambda x: F.avg_pool2d(x, 2), (t((64, 256, 56, 56), bf, d),))),
            r("adaptive_avg_pool2d", bf, "[256,2048,7,7] to 1x1",
              lambda d: (lambda x: F.adaptive_avg_pool2d(x, 1), (t((256, 2048, 7, 7), bf, d),))),
            r("upsample_nearest2d", bf, "[16,320,64,64] x2",
              lambda d: (lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"), (t((16, 320, 64, 64), bf, d),))),
            r("clamp_min", f32, "[8192,4096]", lambda d: (lambda x: x.clamp_min(1e-6), (t((8192, 4096), f32, d),))),
        ]
    else:
        out += [
            r("softmax", f32, "[16384,3] dim=-1", lambda d: (lambda x: torch.softmax(x, -1), (t((16384, 3), f32, d),))),
            r("log_softmax", f32, "[16384,5] dim=-1", lambda d: (lambda x: torch.log_softmax(x, -1), (t((16384, 5), f32, d),))),
            r("softmax", f32, "[256,1024] dim=-1", lambda d: (lambda x: torch.softmax(x, -1), (t((256, 1024), f32, d),))),
            r("layer_norm", f32, "[16384,8]", lambda d: (lambda x, w, b: F.layer_norm(x, (8,), w, b),
                                                         (t((16384, 8), f32, d), t((8,), f32, d), t((8,), f32, d)))),
            r("layer_norm", f32, "[512,768]", lambda d: (lambda x, w, b: F.layer_norm(x, (768,), w, b),
                                                         (t((512, 768), f32, d), t((768,), f32, d), t((768,), f32, d)))),
            r("group_norm", f32, "[2,64,32,32] G=32", lambda d: (lambda x, w, b: F.group_norm(x, 32, w, b),
                                                                 (t((2, 64, 32, 32), f32, d), t((64,), f32, d), t((64,), f32, d)))),
            r("batch_norm", f32, "[8,64,28,28] eval", lambda d: (lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b),
                                                                 (t((8, 64, 28, 28), f32, d), t((64,), f32, d), t((64,), f32, d, low=0.5),
                                                                  t((64,), f32, d), t((64,), f32, d)))),
            r("gelu", f32, "[512,3072]", lambda d: (F.gelu, (t((512, 3072), f32, d),))),
            r("silu", f32, "[512,2048]", lambda d: (F.silu, (t((512, 2048), f32, d),))),
            r("add", f32, "[512,768]", lambda d: (torch.add, (t((512, 768), f32, d), t((512, 768), f32, d)))),
            r("mul", f32, "[512,2048]", lambda d: (torch.mul, (t((512, 2048), f32, d), t((512, 2048), f32, d)))),
            r("relu", f32, "[8,64,56,56]", lambda d: (torch.relu, (t((8, 64, 56, 56), f32, d),))),
            r("sigmoid", f32, "[8,64,56,56]", lambda d: (torch.sigmoid, (t((8, 64, 56, 56), f32, d),))),
            r("rsqrt", f32, "[512,1024]", lambda d: (torch.rsqrt, (t((512, 1024), f32, d, low=0.1),))),
            r("mean", f32, "[512,1024] dim=-1", lambda d: (lambda x: x.mean(-1, keepdim=True), (t((512, 1024), f32, d),))),
            r("argmax", f32, "[16,50257] dim=-1", lambda d: (lambda x: x.argmax(-1), (t((16, 50257), f32, d),))),
            r("cumsum", f32, "[8,1024,64] dim=1", lambda d: (lambda x: x.cumsum(1), (t((8, 1024, 64), f32, d),))),
            r("embedding", f32, "[50257,768] ids [1,128]",
              lambda d: (F.embedding, (torch.randint(0, 50257, (1, 128), device=d), t((50257, 768), f32, d)))),
            r("cat", f32, "[1,12,128,64]+[1,12,1,64] dim=2",
              lambda d: (lambda a, b: torch.cat([a, b], 2), (t((1, 12, 128, 64), f32, d), t((1, 12, 1, 64), f32, d)))),
            r("clone", f32, "[1,128,12,64] transposed", lambda d: (lambda x: x.transpose(1, 2).contiguous(),
                                                                   (t((1, 128, 12, 64), f32, d),))),
            r("max_pool2d", f32, "[8,64,56,56] 3x3 s2", lambda d: (lambda x: F.max_pool2d(x, 3, 2, 1), (t((8, 64, 56, 56), f32, d),))),
            r("adaptive_avg_pool2d", f32, "[8,512,7,7] to 1x1",
              lambda d: (lambda x: F.adaptive_avg_pool2d(x, 1), (t((8, 512, 7, 7), f32, d),))),
            r("upsample_nearest2d", f32, "[2,64,32,32] x2",
              lambda d: (lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"), (t((2, 64, 32, 32), f32, d),))),
        ]
    return out


def selected_rows(device, only):
    keep = set(only.split(",")) if only else None
    return [row for row in rows(device) if keep is None or row[0] in keep]


# Bytes a row's operator writes that its Python function drops: F.max_pool2d runs
# aten::max_pool2d_with_indices (on CUDA and on the CPU), whose kernel, PyTorch's and kforge's
# alike, also writes an int64 index per output; torch.compile's kernel for the same function does
# not write them, so its % copy bw counts bytes it never moved (a lower bound on what it saves).
HIDDEN_OUTPUT_BYTES = {"max_pool2d": lambda result: result.numel() * 8}


def nbytes(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(o) for o in obj)
    return 0


# ---- the child: the workload and the timing ---------------------------------------------------------

def hook():
    """The hook's C entry points in this process (loaded by the preload shim)."""
    import torch
    mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    lib = ctypes.CDLL(os.path.join(os.environ["KFORGE_HOOK_DIR"], f"libkforge_hook-torch{mm}.so"))
    lib.kforge_hook_stats_json.restype = ctypes.c_char_p
    lib.kforge_hook_bench_set_interceptors.restype = ctypes.c_char_p
    return lib


def set_interceptors(lib, on, who):
    """kforge's interceptors out of PyTorch's dispatcher or back in (Note [Bench toggle]); exits
    naming `who` where the hook cannot (a process without KFORGE_BENCH_TOGGLE=1)."""
    why = lib.kforge_hook_bench_set_interceptors(int(on)).decode()
    if why:
        sys.exit(f"{who}: cannot toggle kforge's interceptors: {why} (KFORGE_BENCH_TOGGLE=1?)")


def child_steps(args):
    """The warm workload: every row's operator in turn, for --seconds."""
    import torch
    dev = "cuda" if args.device == "cuda" else "cpu"
    torch.manual_seed(0)
    work = [row[3](dev) for row in selected_rows(args.device, args.only)]
    end = time.monotonic() + args.seconds
    with torch.inference_mode():
        while time.monotonic() < end:
            for fn, a in work:
                fn(*a)
            if dev == "cuda":
                torch.cuda.synchronize()


def child_time(args):
    import torch
    dev = "cuda" if args.device == "cuda" else "cpu"
    lib = hook()

    def interceptors(on):
        set_interceptors(lib, on, "per_op")

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def per_call_us(fn, a, n):
        """The time of n calls, per call, in microseconds (CUDA: events on the current stream)."""
        if dev == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(n):
                fn(*a)
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) * 1e3 / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*a)
        return (time.perf_counter() - t0) * 1e6 / n

    def calls_for(fn, a):
        """Calls per block: about args.block_ms of them, at least 3."""
        sync()
        once = max(per_call_us(fn, a, 1), per_call_us(fn, a, 3), 0.5)
        return max(3, int(args.block_ms * 1e3 / once))

    # A thread observes about one call in observe_every of an operator it has called before
    # (Note [Observed calls] in interceptor.cc), at most 2 * observe_every - 1 apart: settle() makes
    # as many calls as that, so it sees every operator the row reaches. One call missed group_norm's
    # contiguous() copy (clone, called before by the copy-bandwidth measurement), whose entry then
    # never finished its trial within the row.
    m = re.search(r"observe_every=(\d+)", json.loads(lib.kforge_hook_stats_json()).get("config", ""))
    seeing_calls = 2 * int(m.group(1)) if m else 32

    def settle(fn, a):
        """Calls fn until every kforge entry its calls reach has ended its trial in this process
        (shadow calls against PyTorch's kernel; at most a minute): {signature: stats} of those."""
        def sigs():
            return {s["signature"]: s for s in json.loads(lib.kforge_hook_stats_json())["signatures"]}
        before = sigs()
        for _ in range(seeing_calls):
            fn(*a)
        sync()
        touched = [k for k, v in sigs().items() if v.get("calls", 0) > before.get(k, {}).get("calls", 0)]
        # The hook looks a new signature up in the cache in its reporter's rounds: one now, waited
        # for, then calls until no entry reached is still on trial (its shadow calls, then its
        # timing phase on CPU; the stats say "shadow" until the verdict).
        lib.kforge_hook_report_now(20000)
        start = time.monotonic()
        while True:
            now = sigs()
            entries = {k: now[k] for k in touched if now[k].get("entry")}
            if all(v["state"] != "shadow" for v in entries.values()) or time.monotonic() - start > 60:
                # A signature the row calls that has no entry in this process says so too.
                return {**{k: {"state": "none"} for k in touched if k not in entries}, **entries}
            for _ in range(20):
                fn(*a)
            sync()

    def graph_us(fn, a, n):
        """n calls captured in one CUDA graph, replayed: per call, in microseconds."""
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(*a)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(n):
                fn(*a)
        g.replay()
        sync()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3 / n)
        return statistics.median(times)

    torch.manual_seed(0)
    out = {"device": args.device, "torch": torch.__version__, "rows": []}
    if dev == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    with torch.inference_mode():
        # The copy bandwidth, in this process: a large clone, bytes read + written per second.
        interceptors(False)
        big = torch.empty(((1 << 30) if dev == "cuda" else (64 << 20)) // 4, dtype=torch.float32, device=dev).fill_(1.0)
        copy = lambda x: x.clone()   # noqa: E731
        n = calls_for(copy, (big,))
        out["copy_bytes_per_s"] = 2 * nbytes(big) / (statistics.median(per_call_us(copy, (big,), n) for _ in range(5)) * 1e-6)
        del big
        for threads in args.threads if dev == "cpu" else [0]:
            if threads:
                torch.set_num_threads(threads)
            for op, dtype, shape, make in selected_rows(args.device, args.only):
                row = {"op": op, "dtype": dtype, "shape": shape, "threads": threads or "", "kernel": "pytorch (no kforge kernel)"}
                if args.deadline and time.time() > args.deadline:
                    row["error"] = "not timed: the run's --time-budget was spent"
                    out["rows"].append(row)
                    continue
                fn, a = make(dev)
                try:
                    interceptors(False)
                    result = fn(*a)
                    row["bytes"] = nbytes(a) + nbytes(result) + HIDDEN_OUTPUT_BYTES.get(op, lambda _: 0)(result)
                    del result
                    interceptors(True)
                    entries = settle(fn, a)
                    active = sorted(k for k, v in entries.items() if v["state"] == "active")
                    # Every entry the row's calls reached and its state in this process: a row that
                    # calls several operators (group_norm's contiguous() copy) says which ones ran.
                    row["entries"] = {k: v["state"] for k, v in entries.items()}
                    if active:
                        row["kernel"] = "kforge: " + "; ".join(active)
                    elif any(v["state"] != "none" for v in entries.values()):
                        row["kernel"] = "pytorch (kforge's entry: " + ", ".join(sorted({v["state"] for v in entries.values() if v["state"] != "none"})) + ")"
                    n = calls_for(fn, a)
                    eager, kf = [], []
                    for p in range(args.pairs):
                        for on in ((False, True) if p % 2 == 0 else (True, False)):
                            interceptors(on)
                            # An untimed block first: the calls right after a switch are a transient
                            # (CPU: glibc's heap trims and grows again around the large outputs,
                            # page-faulting them, for several calls; a one-call warm-up measured
                            # sigmoid [8,64,56,56] 5-7% slower through the hook, a block 0.7-1.4%).
                            per_call_us(fn, a, n)
                            (kf if on else eager).append(per_call_us(fn, a, n))
                    row["torch_us"], row["kforge_us"] = statistics.median(eager), statistics.median(kf)
                    if dev == "cuda" and row["bytes"] < (16 << 20):
                        try:
                            gn = max(10, min(n, 200))
                            interceptors(False)
                            row["graph_torch_us"] = graph_us(fn, a, gn)
                            interceptors(True)
                            row["graph_kforge_us"] = graph_us(fn, a, gn)
                        except Exception as e:   # a kernel that cannot be captured: say so, keep the row
                            row["graph_error"] = f"{type(e).__name__}: {e}"[:200]
                    if args.deadline and time.time() > args.deadline - 60:
                        row["compile_error"] = "not compiled: under a minute of the run's --time-budget left"
                    elif not args.no_compile:
                        interceptors(False)
                        try:
                            cfn = torch.compile(fn, dynamic=False)
                            for _ in range(3):
                                cfn(*a)
                            row["compile_us"] = statistics.median(per_call_us(cfn, a, n) for _ in range(args.pairs))
                        except Exception as e:
                            row["compile_error"] = f"{type(e).__name__}: {e}"[:200]
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                interceptors(True)
                out["rows"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    with open(args.result, "w") as f:
        json.dump(out, f)


# ---- the parent -----------------------------------------------------------------------------------

def stop_daemon(tmp):
    """Stops the daemon `kforge warm` started at this run's private endpoint (warm leaves it running,
    as `kforge run` does): its searches would otherwise go on beside the timing run, and it would
    outlive the temporary directory."""
    report = tmp / "warm" / "report.md"
    m = re.search(r"daemon: pid (\d+) at `([^`]*)`", report.read_text()) if report.exists() else None
    if not m or m.group(2) != f"ipc://{tmp}/run/daemon.sock":
        return
    pid = int(m.group(1))
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            if exited(pid):
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        print(f"per_op: the warm daemon (pid {pid}) did not stop within 30 s of SIGTERM: killed", file=sys.stderr)
    except ProcessLookupError:
        pass


def exited(pid):
    """A process that has exited but that no parent reaps (warm's daemon outlives warm, and a
    container's first process may reap nothing) stays a zombie: kill(pid, 0) still finds it."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def finish(row, copy_bw):
    """The derived columns: speedups, and the best time's share of the copy bandwidth."""
    t, k, c = row.get("torch_us"), row.get("kforge_us"), row.get("compile_us")
    served = row.get("kernel", "").startswith("kforge")
    if t and k:
        row["speedup"] = t / k
    if c and k:
        row["speedup_vs_compile"] = c / k
    best = k if served and k else t
    if best and row.get("bytes"):
        row["pct_copy_bw"] = 100.0 * row["bytes"] / (best * 1e-6) / copy_bw
    if row.get("graph_torch_us") and row.get("graph_kforge_us"):
        row["graph_speedup"] = row["graph_torch_us"] / row["graph_kforge_us"]
    return row


# Issue 23's targets on CUDA: (op, dtype, shape) -> the speedup over PyTorch eager the row must
# reach. Every other large row (LARGE_BYTES or more moved) must reach 90% of the copy bandwidth.
TARGETS = {
    ("softmax", "bfloat16", "[64,4096,512] dim=1"): 30.0,
    ("cumsum", "bfloat16", "[64,4096,512] dim=1"): 10.0,
    ("group_norm", "bfloat16", "[16,320,64,64] G=32"): 5.0,
    ("group_norm", "bfloat16", "[16,320,64,64] G=32 channels_last"): 10.0,
    ("adaptive_avg_pool2d", "bfloat16", "[256,2048,7,7] to 1x1"): 9.0,
    ("softmax", "bfloat16", "[8,262144] dim=-1"): 10.0,
    ("batch_norm", "bfloat16", "[64,256,56,56] eval"): 3.0,
    ("softmax", "bfloat16", "[4096,50257] dim=-1"): 1.6,
    ("gelu", "bfloat16", "[8192,3072]"): 1.5,
    ("gelu", "bfloat16", "[8192,3072] tanh"): 1.5,
    ("silu", "bfloat16", "[8192,11008]"): 1.5,
}
LARGE_BYTES = 64 << 20
TARGET_PCT_BW = 90.0


def verdict(row, copy_bw):
    """Whether a row meets issue 23's target, and if not, why: the speedup the copy bandwidth allows
    (PyTorch's time over the row's bytes moved at the measured copy bandwidth) against the target,
    and the kernel's own share of that bandwidth. None for a row with no target."""
    t, k, b = row.get("torch_us"), row.get("kforge_us"), row.get("bytes")
    served = row.get("kernel", "").startswith("kforge")
    target = TARGETS.get((row["op"], row["dtype"], row["shape"]))
    large = bool(b) and b >= LARGE_BYTES
    if target is None and not large:
        return None
    if not (t and b):
        return {"target": target, "met": False, "why": row.get("error") or "not timed"}
    floor_us = b / copy_bw * 1e6
    ceiling = t / floor_us
    pct = row.get("pct_copy_bw") or 0.0
    speedup = row.get("speedup") if served else 1.0
    if target is None:
        goal, met = f"{TARGET_PCT_BW:.0f}% of copy bw", pct >= TARGET_PCT_BW
    else:
        goal, met = f"{target:g}x", (speedup or 0) >= target
    if met:
        why = ""
    elif target is not None and ceiling < target:
        why = (f"out of reach: PyTorch already runs at {100 / ceiling:.0f}% of the copy bandwidth, so a kernel at the "
               f"copy bandwidth would give {ceiling:.2f}x")
    elif not served:
        why = f"no kforge kernel serves it ({row.get('kernel', '')}); PyTorch's runs at {100 * floor_us / t:.0f}% of the copy bandwidth"
    else:
        why = f"kforge's kernel runs at {pct:.0f}% of the copy bandwidth ({b / (k * 1e-6) / 1e9:.0f} GB/s)"
        if target is not None:
            why += f"; {target:g}x needs {100 * target / ceiling:.0f}%"
    return {"target": target, "goal": goal, "met": met, "ceiling": ceiling, "why": why}


def summary(table, copy_bw):
    """The issue's checks over the whole table, as markdown lines."""
    lines = []
    checked = [(r, verdict(r, copy_bw)) for r in table]
    checked = [(r, v) for r, v in checked if v is not None]
    if checked:
        lines += ["| op | dtype | shape | goal | reached | ceiling at copy bw | met | why not |", "|---|---|---|---|---|---|---|---|"]
        for r, v in checked:
            reached = (f"{r['speedup']:.2f}x" if v.get("target") and r.get("speedup") and r.get("kernel", "").startswith("kforge")
                       else "1.00x (PyTorch's)" if v.get("target") else f"{r.get('pct_copy_bw') or 0:.0f}%")
            ceiling = f"{v['ceiling']:.2f}x" if "ceiling" in v else ""
            lines.append(f"| {r['op']} | {r['dtype']} | {r['shape']} | {v.get('goal', '')} | {reached} | {ceiling} | "
                         f"{'yes' if v['met'] else 'no'} | {v['why']} |")
        lines.append("")
    compared = [r for r in table if r.get("speedup_vs_compile")]
    if compared:
        ok = sum(1 for r in compared if r["speedup_vs_compile"] >= 0.98)
        lines.append(f"- At least as fast as torch.compile's kernel (within 2%) on {ok} of {len(compared)} rows "
                     f"({100 * ok / len(compared):.0f}%; the issue asks 80%).")
    slower = [r for r in table if r.get("kernel", "").startswith("kforge") and (r.get("speedup") or 1) < 0.98]
    lines.append("- Rows where a kforge kernel is slower than PyTorch's by more than 2%: "
                 + (", ".join(f"{r['op']} {r['shape']} ({r['speedup']:.3f}x)" for r in slower) if slower else "none") + ".")
    return lines


def cell(v):
    if isinstance(v, float):
        return f"{v:.3f}" if v < 100 else f"{v:.1f}"
    return str(v).replace(",", ";") if v is not None else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--bundle-root", help="an unpacked kforge bundle (bin/kforge); default: this tree's build/")
    ap.add_argument("--kforge", help="the kforge CLI (overrides --bundle-root)")
    ap.add_argument("--minutes", type=float, default=20, help="the warm budget (kforge warm --minutes)")
    ap.add_argument("--max-evaluations", type=int, default=16, help="each signature's search budget (kforged --max-evaluations)")
    ap.add_argument("--only", help="comma-separated op names (the op column)")
    ap.add_argument("--daemon-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a kforged configuration key for the warm's daemon (kforged --set; repeatable), "
                         "e.g. workers.prebuild_threads=0")
    ap.add_argument("--threads", default=None, help="CPU: comma-separated torch thread counts (default: 1 and all)")
    ap.add_argument("--pairs", type=int, default=10, help="eager/kforge block pairs per row")
    ap.add_argument("--block-ms", type=float, default=20, help="about this long per timed block")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (daemon log, cache)")
    ap.add_argument("--cache-dir", help="use this kernel cache instead of a new one in the temporary directory")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm step: time what --cache-dir holds")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds for the whole run (warm and timing): rows left when it is spent are listed untimed, "
                         "and torch.compile is skipped in its last minute (0: no limit)")
    ap.add_argument("--deadline", type=float, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=("steps", "time"), help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=20, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.threads = [int(x) for x in args.threads.split(",")] if args.threads else sorted({1, os.cpu_count() or 1})
    if args.child == "steps":
        return child_steps(args)
    if args.child == "time":
        return child_time(args)
    if not selected_rows(args.device, args.only):
        sys.exit(f"per_op: no row has an op in {args.only!r}")

    kforge = args.kforge or (str(pathlib.Path(args.bundle_root) / "bin" / "kforge") if args.bundle_root
                             else str(ROOT / "build" / "tools" / "kforge"))
    if not os.access(kforge, os.X_OK):
        sys.exit(f"per_op: no kforge CLI at {kforge}: build kforge or pass --bundle-root")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kforge-per-op-"))
    (tmp / "run").mkdir(mode=0o700)
    env = dict(os.environ, KFORGE_DAEMON_ENDPOINT=f"ipc://{tmp}/run/daemon.sock", XDG_STATE_HOME=str(tmp / "state"))
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    common = [sys.executable, str(pathlib.Path(__file__).resolve()), "--device", args.device]
    if args.only:
        common += ["--only", args.only]
    if args.no_warm and not args.cache_dir:
        sys.exit("per_op: --no-warm times what a cache holds: give it with --cache-dir")
    cache = ["--cache-dir", str(pathlib.Path(args.cache_dir).resolve()) if args.cache_dir else str(tmp / "cache")]
    devices = "cuda:0" if args.device == "cuda" else "cpu"
    daemon_args = ["--daemon-arg=--devices", f"--daemon-arg={devices}",
                   "--daemon-arg=--max-evaluations", f"--daemon-arg={args.max_evaluations}"]
    for kv in args.daemon_set:
        daemon_args += ["--daemon-arg=--set", f"--daemon-arg={kv}"]
    t0 = time.monotonic()
    deadline = ["--deadline", str(time.time() + args.time_budget)] if args.time_budget else []
    warm = subprocess.CompletedProcess([], 0, "", "") if args.no_warm else subprocess.run([kforge, *cache, "warm", "--no-e2e", "--minutes", str(args.minutes), "--report", str(tmp / "warm"),
                           *daemon_args, "--", *common, "--child", "steps", "--seconds", "20"],
                          env=env, capture_output=True, text=True)
    print(warm.stdout[-4000:], end="")
    stop_daemon(tmp)
    if warm.returncode != 0:
        print(warm.stderr[-4000:], file=sys.stderr)
        sys.exit(f"per_op: kforge warm failed with {warm.returncode} (temporary directory {tmp})")
    warm_s = time.monotonic() - t0
    result = tmp / "time.json"
    timed = subprocess.run([kforge, *cache, "run", "--no-daemon", "--", *common, "--child", "time", "--result", str(result),
                            "--pairs", str(args.pairs), "--block-ms", str(args.block_ms),
                            "--threads", ",".join(map(str, args.threads))] + deadline + (["--no-compile"] if args.no_compile else []),
                           env=dict(env, KFORGE_BENCH_TOGGLE="1", KFORGE_REPORT_INTERVAL_MS="200", KFORGE_LOG="1"),
                           capture_output=True, text=True)
    if timed.returncode != 0 or not result.exists():
        print(timed.stderr[-6000:], file=sys.stderr)
        sys.exit(f"per_op: the timing run failed with {timed.returncode} (temporary directory {tmp})")
    res = json.loads(result.read_text())
    copy_bw = res["copy_bytes_per_s"]
    table = [finish(r, copy_bw) for r in res["rows"]]

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{time.strftime('%Y-%m-%d', time.gmtime())}-{args.device}-per-op"
    # The hook's own lines in the timing process (KFORGE_LOG=1): which entries it found, loaded,
    # trialled, and why one was not used.
    with open(f"{stem}-hook.log", "w") as f:
        f.writelines(line.replace(str(tmp), "<tmp>") + "\n" for line in timed.stderr.splitlines() if line.startswith("kforge"))
    with open(f"{stem}.csv", "w") as f:
        f.write(",".join(COLUMNS) + "\n")
        for r in table:
            f.write(",".join(cell(r.get(c)) for c in COLUMNS) + "\n")
    where = res.get("gpu", f"{os.cpu_count()} CPUs")
    served = sum(1 for r in table if r.get("kernel", "").startswith("kforge"))
    with open(f"{stem}.md", "w") as f:
        f.write(f"# Per-operator report, {args.device} ({where}), torch {res['torch']}\n\n")
        shown = " ".join("<path>" if "/" in a else a for a in sys.argv[1:])   # no machine paths in a results file
        f.write(f"`bench/per_op.py {shown}`; "
                f"{'no warm step (a given cache)' if args.no_warm else f'warm took {warm_s / 60:.1f} min'}. Copy bandwidth measured in the timing process: {copy_bw / 1e9:.1f} GB/s. "
                f"{served} of {len(table)} rows served by a kforge kernel; the others keep PyTorch's (their kforge "
                f"column is PyTorch's kernel called through the hook). A % copy bw over 100 is a shape that stays in "
                f"the caches. Bytes are the row's inputs and outputs, and for max_pool2d the int64 indices "
                f"PyTorch's operator (max_pool2d_with_indices) writes and F.max_pool2d drops.\n\n")
        f.write("| op | dtype | shape | threads | torch us | compile us | kforge us | speedup | vs compile | % copy bw | kernel |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in table:
            note = r.get("error") or r.get("kernel", "")
            f.write("| " + " | ".join(cell(r.get(c)) for c in ("op", "dtype", "shape", "threads", "torch_us", "compile_us",
                                                                 "kforge_us", "speedup", "speedup_vs_compile", "pct_copy_bw"))
                    + f" | {note[:120]} |\n")
        several = [r for r in table if any(s != "none" for s in (r.get("entries") or {}).values()) and
                   (len(r["entries"]) > 1 or any(s != "active" for s in r["entries"].values()))]
        if several:
            f.write("\n## Entries reached\n\nRows whose calls reached a kforge entry and another signature, or an entry not "
                    "active in this process, with each signature's state after the trial (none: no entry in this process):\n\n")
            for r in several:
                f.write(f"- {r['op']} {r['dtype']} {r['shape']}: " + "; ".join(f"{s}: `{k}`" for k, s in sorted(r["entries"].items())) + "\n")
        if args.device == "cuda":
            f.write("\n## Issue 23's targets\n\nA named shape's speedup over PyTorch eager, and for every other row that moves "
                    f"{LARGE_BYTES >> 20} MB or more, {TARGET_PCT_BW:.0f}% of the copy bandwidth. The ceiling is PyTorch's time over "
                    "the row's bytes at the copy bandwidth: the most any kernel that reads its inputs and writes its outputs "
                    "once could give.\n\n")
            f.write("\n".join(summary(table, copy_bw)) + "\n")
    print(pathlib.Path(f"{stem}.md").read_text())
    print(f"wrote {stem}.csv and {stem}.md")
    # The warm's own report beside it (what was searched, and how fast: Note [Search speed] in
    # tools/warm_command.cc), with this run's temporary paths left out.
    warm_md = tmp / "warm" / "report.md"
    if warm_md.exists():
        # No machine paths in a results file: the temporary directory, the interpreter, this tree.
        text = warm_md.read_text().replace(str(tmp), "<tmp>").replace(sys.executable, "python3").replace(f"{ROOT}/", "")
        pathlib.Path(f"{stem}-warm.md").write_text(text)
        print(f"wrote {stem}-warm.md")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept {tmp}")


if __name__ == "__main__":
    main()
