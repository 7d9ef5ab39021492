"""End-to-end cost of the hook with an empty cache: GPT-2 small, batch 1, greedy decode steps.

Here (build tree, CPU; about 20 s per pair on 2 cores):
    .venv/bin/python bench/e2e_overhead.py --device cpu --pairs 40
On a GPU host, from an unpacked bundle and this source tree's bench/ (python3 with torch and
transformers; nothing else is needed; about 20 s per pair):
    python3 bench/e2e_overhead.py --device cuda --pairs 24 --steps 256 --bundle-root <bundle>

The model is transformers' GPT2LMHeadModel built from GPT2Config() (GPT-2 small: 12 layers, 768
wide), random weights from a fixed seed, no download, eval() and inference_mode. Every measurement
is its own process: "without" runs plain python; "with" runs it with kforge as users run it
(LD_PRELOAD of libkforge_preload.so, which loads the hook when torch is imported; --load ctypes
loads the hook with ctypes after import torch instead). Each round runs one of each, without first
in half the rounds (seeded), and the paired differences are balanced over that order. Each child
warms up, then times --steps greedy decode steps with the KV cache (one token in, synchronized
after every step on CUDA) and reports their median. The hook runs in KFORGE_MODE=active with an
empty private cache directory (its loader scans it and finds nothing) unless --mode observe, and
its daemon endpoint is in a private empty 0700 directory: a production host with no cache entries
and no daemon. CPU threads are fixed (--threads) in every child.

The parent prints the median ms/step without and with, their ratio, the paired relative
differences (order-balanced median, bootstrap 95% interval, min/max), and whether the run resolves
the 1% target (the interval lies wholly below or wholly above +1%). It also prints an analytic bound:
the calls the hook intercepted per decode step (its stats) times each operator's per-call miss
cost, measured in the same children on tiny CPU tensors (the hook's host-side work), as a share of
the step. Decoded tokens must be identical with and without the hook.

Host speed. On a VM the same child can run its host code (which is what a batch-1 decode step is
bound by) 1.5-2x slower in one process than in the next, for the whole process, with or without
kforge (bench/results/2026-12-04-h200-cuda-e2e-overhead-diag.log). So each child also times a host
probe after every step (--calib-calls calls of mul on 8-element CPU tensors: Python plus the
dispatcher, an operator the hook does not intercept) and the parent repeats the comparison on
step / probe, which divides the process's CPU speed out. --control adds a third, plain child per
round: its row is what process-to-process noise alone gives, raw and normalized, and says whether
the normalization works.
"""
import argparse
import inspect
import os
import resource
import statistics
import sys
import threading
import time

import side_by_side as sbs


def tiny_calls(torch):
    """One tiny call per catalog operator, for its per-call miss cost (CPU tensors: the hook's
    work is on the host whatever the device)."""
    F = torch.nn.functional
    a, b, g = torch.ones(4), torch.ones(4), torch.ones(1, 4, 2)
    ix, w = torch.tensor([0, 1]), torch.ones(4, 2)
    return {
        "aten::add.Tensor": lambda: torch.add(a, b),
        "aten::native_layer_norm": lambda: F.layer_norm(a, (4,)),
        "aten::_softmax": lambda: torch.softmax(a, -1),
        "aten::_log_softmax": lambda: torch.log_softmax(a, -1),
        "aten::gelu": lambda: F.gelu(a),
        "aten::silu": lambda: F.silu(a),
        "aten::native_group_norm": lambda: F.group_norm(g, 2),
        "aten::relu": lambda: F.relu(a),
        "aten::sigmoid": lambda: torch.sigmoid(a),
        "aten::tanh": lambda: torch.tanh(a),
        "aten::hardswish": lambda: F.hardswish(a),
        "aten::sub.Tensor": lambda: torch.sub(a, b),
        "aten::mul.Tensor": lambda: torch.mul(a, b),
        "aten::div.Tensor": lambda: torch.div(a, b),
        "aten::native_batch_norm": lambda: F.batch_norm(g, b[:4], b[:4], training=False),
        "aten::sum.dim_IntList": lambda: torch.sum(a, -1),
        "aten::mean.dim": lambda: torch.mean(a, -1),
        "aten::amax": lambda: torch.amax(a, -1),
        "aten::neg": lambda: torch.neg(a),
        "aten::rsqrt": lambda: torch.rsqrt(a),
        "aten::exp": lambda: torch.exp(a),
        "aten::pow.Tensor_Scalar": lambda: torch.pow(a, 2),
        "aten::embedding": lambda: F.embedding(ix, w),
        "aten::mul.Scalar": lambda: torch.ops.aten.mul.Scalar(a, 0.5),
        "aten::cat": lambda: torch.cat([a, b]),
        "aten::clone": lambda: a.clone(),
        "aten::argmax": lambda: torch.argmax(a, -1),
        "aten::cumsum": lambda: torch.cumsum(a, 0),
        "aten::clamp_min": lambda: torch.clamp_min(a, 0.0),
        "aten::_to_copy": lambda: a.to(torch.float64),
        "aten::_adaptive_avg_pool2d": lambda: F.adaptive_avg_pool2d(g, 1),
        "aten::avg_pool2d": lambda: F.avg_pool2d(g, (1, 2)),
        "aten::max_pool2d_with_indices": lambda: F.max_pool2d(g, (1, 2)),
        "aten::upsample_nearest2d": lambda: F.interpolate(g, scale_factor=2, mode="nearest"),
        "aten::upsample_bilinear2d": lambda: F.interpolate(g, scale_factor=2, mode="bilinear"),
        # aten::cudnn_batch_norm: CUDA only, no CPU call to time
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--pairs", type=int, default=16, help="rounds of one child without and one with (even)")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps per child")
    p.add_argument("--warmup", type=int, default=16, help="untimed decode steps per child first")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every child")
    p.add_argument("--mode", choices=("active", "observe"), default="active",
                   help="KFORGE_MODE of the hooked child (active: with an empty cache directory)")
    p.add_argument("--calls", type=int, default=20000, help="calls per repeat of the per-call bench")
    p.add_argument("--repeats", type=int, default=5, help="repeats of the per-call bench per child")
    p.add_argument("--seed", type=int, default=0, help="seed of the round order")
    p.add_argument("--control", action="store_true",
                   help="also run a second plain child per round ('control', identical to 'without'): "
                        "its paired difference from 'without' is what process-to-process noise alone gives")
    p.add_argument("--calib-calls", type=int, default=100,
                   help="calls of the host-speed probe after every timed step (0: none)")
    p.add_argument("--child", choices=("without", "with", "control"), help=argparse.SUPPRESS)
    p.add_argument("--ops", default="", help=argparse.SUPPRESS)   # which tiny_calls a child times
    sbs.add_kforge_arguments(p)
    return p.parse_args(argv)


# ---- one child ---------------------------------------------------------------------------------

def thread_times():
    """{tid: (name, CPU clock ticks, last CPU, involuntary switches)} of this process's threads
    (/proc/self/task; a thread that ends meanwhile is left out)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                s = f.read()
            with open(f"/proc/self/task/{tid}/status") as f:
                nivcsw = next(int(l.split()[1]) for l in f if l.startswith("nonvoluntary_ctxt_switches"))
        except (OSError, StopIteration):
            continue
        fields = s[s.rindex(")") + 2:].split()   # fields[0] is stat's field 3 (state)
        out[int(tid)] = (s[s.index("(") + 1:s.rindex(")")], int(fields[11]) + int(fields[12]),
                         int(fields[36]), nivcsw)
    return out


def thread_deltas(before, after, exclude):
    """CPU time each other thread used between two thread_times(), busiest first."""
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    rows = [{"name": a[0], "cpu_ms": (a[1] - before.get(tid, (None, 0))[1]) * tick_ms}
            for tid, a in after.items() if tid != exclude]
    return sorted((r for r in rows if r["cpu_ms"] > 0), key=lambda r: -r["cpu_ms"])


def sm_clock(torch, device):
    """The GPU's SM clock now in MHz (needs pynvml), or None."""
    if device != "cuda":
        return None
    try:
        return torch.cuda.clock_rate()
    except Exception:   # no pynvml, no NVML
        return None


def host_probe(torch, calls):
    """A fixed piece of host work like a decode step's (Python calling small ATen ops through the
    dispatcher), none of whose operators the hook intercepts: its time measures how fast this
    process's CPU runs now. mul on 8-element CPU tensors; returns ms for `calls` calls."""
    a, b = torch.ones(8), torch.full((8,), 1.5)
    mul = torch.mul
    t0 = time.perf_counter()
    for _ in range(calls):
        mul(a, b)
    return (time.perf_counter() - t0) * 1000


def decoder(model):
    """step(ids, cache) -> (next ids, cache), for transformers before and after `past_key_values`
    was renamed `cache`."""
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def step(ids, cache):
        out = model(ids, use_cache=True, **({key: cache} if cache is not None else {}))
        new_cache = out["cache"] if "cache" in out else out["past_key_values"]
        return out.logits[:, -1:].argmax(-1), new_cache
    return step


def child(args):
    import torch
    hook = sbs.open_hook()
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with torch.device(args.device):   # weights initialized on the device: seconds less per child
        model = GPT2LMHeadModel(GPT2Config()).eval()
    step = decoder(model)
    tokens, step_ms = [], []
    with torch.inference_mode():
        ids, cache = step(torch.tensor([[464, 2068, 7586, 21831]], device=args.device), None)
        for _ in range(args.warmup):
            ids, cache = step(ids, cache)
        sync()
        before = hook.calls_by_op() if hook else {}
        threads_before, main_before = thread_times(), resource.getrusage(resource.RUSAGE_THREAD)
        issue_ms, probe_ms = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            ids, cache = step(ids, cache)
            t1 = time.perf_counter()
            sync()
            step_ms.append((time.perf_counter() - t0) * 1000)
            issue_ms.append((t1 - t0) * 1000)
            tokens.append(int(ids.item()))
            if args.calib_calls:
                probe_ms.append(host_probe(torch, args.calib_calls))
        threads_after, main_after = thread_times(), resource.getrusage(resource.RUSAGE_THREAD)
        after = hook.calls_by_op() if hook else {}
        # Per-call cost of each operator the decode step uses, on tiny CPU tensors.
        calls = tiny_calls(torch)
        micro = {op: sbs.ns_per_call(calls[op], args.calls, args.repeats)
                 for op in filter(None, args.ops.split(",")) if op in calls}
    median = statistics.median(step_ms)
    main_cpu_ms = ((main_after.ru_utime + main_after.ru_stime) - (main_before.ru_utime + main_before.ru_stime)) * 1000
    others = thread_deltas(threads_before, threads_after, exclude=threading.get_native_id())
    diag = {"main_cpu_ms_per_step": main_cpu_ms / args.steps,
            "main_nivcsw": main_after.ru_nivcsw - main_before.ru_nivcsw,
            "main_nvcsw": main_after.ru_nvcsw - main_before.ru_nvcsw,
            "main_cpu": threads_after.get(threading.get_native_id(), (None, 0, -1, 0))[2],
            "others_cpu_ms": sum(t["cpu_ms"] for t in others), "busiest": others[:3],
            "p90_ms": statistics.quantiles(step_ms, n=10)[-1], "min_ms": min(step_ms),
            "issue_ms": statistics.median(issue_ms), "sm_mhz": sm_clock(torch, args.device),
            "probe_ms": statistics.median(probe_ms) if probe_ms else None}
    # The step in units of the host probe: a process whose CPU runs slower (the same work, more CPU
    # time) scales both, the hook's added work only the step.
    normalized = median / diag["probe_ms"] if probe_ms else None
    out = {"median_ms": median, "normalized": normalized, "step_ms": step_ms, "diag": diag, "tokens": tokens, "micro_ns": micro,
           "headline": (f"{median:.3f} ms/step (issue {diag['issue_ms']:.3f}, main cpu "
                        f"{diag['main_cpu_ms_per_step']:.3f}, nivcsw {diag['main_nivcsw']}, cpu "
                        f"{diag['main_cpu']}, others {diag['others_cpu_ms']:.0f} ms, sm {diag['sm_mhz']} MHz"
                        + (f", probe {diag['probe_ms']:.4f} ms, step/probe {normalized:.2f}" if probe_ms else "")
                        + ")"), "threads": torch.get_num_threads(),
           "transformers": transformers.__version__,
           "attn": getattr(model.config, "_attn_implementation", "?")}
    if hook:
        s = hook.stats()
        out.update(calls_per_step={op: (after.get(op, 0) - before.get(op, 0)) / args.steps for op in after},
                   hook=hook.path, load=hook.load, config=s["config"], mode=s["mode"],
                   swap_entries=len(s["swap"]["entries"]), cache_error=s["swap"]["cache_error"])
    sbs.emit(out)


# ---- the parent --------------------------------------------------------------------------------

def verdict(p, pairs):
    """Whether a sbs.paired() relative comparison resolves the 1% target."""
    lo, hi = p["interval"]
    interval = f"[{lo:+.2%}, {hi:+.2%}]"
    if pairs < 8:
        return f"NOT resolved: {pairs} pairs are too few for an interval (at least 8)"
    if hi < 0.01:
        return f"resolved: the added cost is below 1% (the interval {interval} lies below +1%)"
    if lo > 0.01:
        return f"resolved: the added cost is above 1% (the interval {interval} lies above +1%)"
    return f"NOT resolved at 1%: the interval {interval} contains +1% (width {hi - lo:.2%})"


def main():
    args = parse_args()
    if args.child:
        return child(args)
    torch, files = sbs.parent_start(args)
    cache_dir = sbs.private_dir("kforge-empty-cache-")
    hooked_env = sbs.child_env(files, args.load, KFORGE_MODE=args.mode,
                               **({"KFORGE_CACHE_DIR": cache_dir} if args.mode == "active" else {}))
    variants = {"without": sbs.child_env(), "with": hooked_env}
    if args.control:
        variants["control"] = sbs.child_env()
    base = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--threads", str(args.threads), "--calls", str(args.calls),
            "--repeats", str(args.repeats), "--calib-calls", str(args.calib_calls)]

    # A first hooked child, not counted: it warms the file cache and says which operators a
    # decode step sends through the hook (every measured child then times those per call).
    probe = sbs.run_child(base + ["--child", "with", "--steps", "4"], hooked_env,
                          timeout=900, cpus=args.cpus)
    ops = sorted(op for op, n in probe["calls_per_step"].items() if n > 0)
    print(f"# hook config: {probe['config']}")
    print(f"# transformers {probe['transformers']}, attention {probe['attn']}, {probe['threads']} CPU "
          f"thread(s), {args.warmup} warm-up + {args.steps} timed decode steps per child, {args.pairs} pairs")

    def start(name, env):
        return sbs.run_child(base + ["--child", name, "--ops", ",".join(ops)], env,
                             timeout=900, cpus=args.cpus)

    res, orders = sbs.run_rounds(variants, args.pairs, args.seed, start)
    sbs.remove_private_dirs()
    wo, wi = res["without"], res["with"]
    if any(r["tokens"] != wo[0]["tokens"] for r in wo + wi + res.get("control", [])):
        sys.exit("decoded tokens differ between children: the runs are not comparable")
    if any(r["swap_entries"] or r["cache_error"] for r in wi):
        found = [(r["swap_entries"], r["cache_error"]) for r in wi]
        sys.exit(f"a hooked child found cache entries or a cache error: {found}")
    wo_first = sbs.first(orders, "without", "with")
    step = sbs.paired([r["median_ms"] for r in wo], [r["median_ms"] for r in wi], wo_first, relative=True)
    lo, hi = step["interval"]
    interval = f"[{lo:+.2%}, {hi:+.2%}]"
    print()
    print(f"GPT-2 small, batch 1, greedy decode with KV cache, {args.device}: median ms/step over "
          f"{len(orders)} pairs of processes")
    print(f"{'without kforge':>16s} {'with kforge':>12s} {'ratio':>7s} {'paired diff':>12s} "
          f"{'95% bootstrap':>18s} {'min':>7s} {'max':>7s}")
    print(f"{step['without']:16.3f} {step['with']:12.3f} {step['with'] / step['without']:7.4f} "
          f"{step['diff']:+12.2%} {interval:>18s} {step['min']:+7.2%} {step['max']:+7.2%}")
    if args.control:
        ctl = sbs.paired([r["median_ms"] for r in wo], [r["median_ms"] for r in res["control"]],
                         sbs.first(orders, "without", "control"), relative=True)
        print(f"{'control':>16s} {ctl['with']:12.3f} {ctl['with'] / ctl['without']:7.4f} {ctl['diff']:+12.2%} "
              "{:>18s} {:+7.2%} {:+7.2%}   (plain python again: the noise floor)".format(
                  "[{:+.2%}, {:+.2%}]".format(*ctl["interval"]), ctl["min"], ctl["max"]))
    print(verdict(step, len(orders)))
    print("(paired diff: with/without - 1 per round; their median within each order, averaged over "
          "the two orders; interval: bootstrap within each order)")
    print("median paired diff by order: " + ", ".join(
        f"{k}: {v[0]:+.2%} (n={v[1]})" for k, v in step["by_order"].items() if v))
    print("paired diffs in round order: " + ", ".join(f"{d:+.2%}" for d in step["diffs"]))
    print(f"per-child medians without: {[round(r['median_ms'], 3) for r in wo]}")
    print(f"per-child medians with:    {[round(r['median_ms'], 3) for r in wi]}")
    print("decoded tokens: identical in every child")
    if args.calib_calls:
        # The same comparison in units of each child's host probe (host_probe()): what is left
        # when each process's CPU speed is divided out. The control row says how well that works:
        # plain against plain should then differ by far less than unnormalized.
        norm = sbs.paired([r["normalized"] for r in wo], [r["normalized"] for r in wi], wo_first, relative=True)
        print()
        print(f"the same, per child divided by its host probe ({args.calib_calls} x mul of 8-element CPU tensors "
              "after every step, median ms):")
        print(f"{'without':>16s} {'with':>12s} {'ratio':>7s} {'paired diff':>12s} {'95% bootstrap':>18s} {'min':>7s} {'max':>7s}")
        rows = [("", norm)]
        if args.control:
            rows.append(("control", sbs.paired([r["normalized"] for r in wo], [r["normalized"] for r in res["control"]],
                                               sbs.first(orders, "without", "control"), relative=True)))
        for label, n in rows:
            print(f"{n['without']:16.2f} {n['with']:12.2f} {n['with'] / n['without']:7.4f} {n['diff']:+12.2%} "
                  "{:>18s} {:+7.2%} {:+7.2%}".format("[{:+.2%}, {:+.2%}]".format(*n["interval"]), n["min"], n["max"])
                  + (f"   ({label}: plain python again)" if label else ""))
        print("normalized: " + verdict(norm, len(orders)))
    print()
    print("per child, in run order (main: the decoding thread's CPU time per step and its involuntary "
          "context switches over the timed steps; others: CPU time of all other threads then)")
    print(f"{'round':>5s} {'child':>8s} {'median':>7s} {'p90':>7s} {'min':>7s} {'issue':>7s} {'main cpu':>9s} "
          f"{'nivcsw':>6s} {'cpu#':>4s} {'others ms':>9s} {'probe ms':>8s} {'step/probe':>10s}  busiest other threads")
    for r, order in enumerate(orders):
        for name in order:
            c = res[name][r]
            d = c["diag"]
            busiest = ", ".join(f"{t['name']} {t['cpu_ms']:.0f}" for t in d["busiest"])
            print(f"{r + 1:5d} {name:>8s} {c['median_ms']:7.3f} {d['p90_ms']:7.3f} {d['min_ms']:7.3f} {d['issue_ms']:7.3f} "
                  f"{d['main_cpu_ms_per_step']:9.3f} {d['main_nivcsw']:6d} {d['main_cpu']:4d} "
                  f"{d['others_cpu_ms']:9.0f} {d['probe_ms'] or 0:8.4f} {c['normalized'] or 0:10.2f}  {busiest}")

    # The analytic bound: intercepted calls per step x per-call miss cost.
    calls = wi[0]["calls_per_step"]
    print()
    print(f"{'intercepted op':26s} {'calls/step':>10s} {'without ns':>11s} {'miss ns':>8s} "
          f"{'added ns':>9s} {'95% bootstrap':>16s}")
    bound_ns = 0.0
    untimed = [op for op in ops if any(op not in r["micro_ns"] for r in wo + wi)]
    for op in ops:
        if op in untimed:
            print(f"{op:26s} {calls.get(op, 0):10.1f}  (no tiny call to time: left out of the bound)")
            continue
        m = sbs.paired([r["micro_ns"][op] for r in wo], [r["micro_ns"][op] for r in wi], wo_first)
        bound_ns += calls.get(op, 0) * max(m["diff"], m["interval"][1], 0.0)
        interval = "[{:+.0f}, {:+.0f}]".format(*m["interval"])
        print(f"{op:26s} {calls.get(op, 0):10.1f} {m['without']:11.0f} {m['with']:8.0f} {m['diff']:+9.0f} "
              f"{interval:>16s}")
    total = sum(n for op, n in calls.items() if op not in untimed)
    print(f"analytic bound: {total:.0f} intercepted calls/step x per-call added cost (upper end of its "
          f"interval) = {bound_ns / 1000:.1f} us = {bound_ns / 1e6 / step['without']:.3%} of a "
          f"{step['without']:.3f} ms step"
          + (f" (leaves out {', '.join(untimed)}: no tiny call to time)" if untimed else ""))
    print("(per-call costs are on tiny CPU tensors, 1 thread of calls; targets: <= 150 ns added per "
          "call on a miss, <= 1% end to end)")
    print(f"# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
