"""End-to-end cost of the hook with an empty cache, measured inside one process: GPT-2 small, batch 1,
greedy decode steps in blocks with kforge's interceptors in the dispatcher and blocks without them.

Here (build tree, CPU; about 4 minutes):
    .venv/bin/python bench/e2e_toggle.py --device cpu --processes 2 --rounds 60 --block 8
Here, host-bound like a CUDA step (GPT-2 small's layers at width 64; about 2 minutes per process):
    .venv/bin/python bench/e2e_toggle.py --device cpu --processes 3 --rounds 300 --block 2 --settle 6 \
        --control --continuous --n-embd 64
On a GPU host, from an unpacked bundle and this source tree's bench/ (about 5 minutes):
    python3 bench/e2e_toggle.py --device cuda --processes 3 --rounds 300 --block 2 --settle 6 --control \
        --continuous --bundle-root <bundle>

Why --settle 6. During an "off" block nothing of the hook runs, so its code and data leave the
caches and TLBs, and the first steps of the next "on" block pay to bring them back: a cost that a
process under the hook never pays, as it runs the interceptors every step. On the CPU VM the
same build measured +1.81% with --settle 1 and +1.08% with --settle 6 (3 processes x 300 rounds
each, bench/results/2026-12-05-cpu-e2e-toggle-settle.log); before 2026-12-05 the logs used
--settle 1.

Why one process. bench/e2e_overhead.py compares a process without kforge against one with it. On a
VM the same program runs its host code (which is what a batch-1 decode step is bound by) up to 2x
slower in one process than in the next, with or without kforge, so those comparisons cannot resolve
1% (bench/results/2026-12-04-h200-cuda-e2e-overhead-*.log). Here every child is started as users
run kforge (LD_PRELOAD of libkforge_preload.so, KFORGE_MODE=active, an empty private cache
directory, a daemon endpoint nobody serves) plus KFORGE_BENCH_TOGGLE=1, which lets the benchmark
take the interceptors out of PyTorch's dispatcher and put them back (Note [Bench toggle] in
interposer/hook/interceptor.cc). "off" is then exactly a process without kforge's interceptors:
the dispatcher's tables hold PyTorch's own kernels; "on" is the hook as it runs in production.

Each round runs one block of each variant, in an order that cycles through every order of the
variants (seeded), so drift and any effect of running first or second fall on both alike. A block
sets the variant, prefills the same prompt into a fresh KV cache, runs --settle untimed steps, then
times --block decode steps (synchronized after every step on CUDA) and keeps their median. Every
block decodes the same tokens at the same positions, which the parent checks, and it checks the
hook's counters: every "on" block counts intercepted calls, an "off" block none (the hook observes
about one call in KFORGE_OBSERVE_EVERY, so a block's counts vary; calls/step come from their sums).
--control adds a second "off" block per round ("off2"): off against off2 is the noise floor.
With --continuous the blocks do not prefill: they continue one decode (a fresh prefill, outside
the blocks, every --segment rounds), so with short blocks the variants of a round run tens of
milliseconds apart. On the H200 host that gave an interval 2.6 times narrower than whole prefilled blocks in
the same time, with an A/A control near zero (bench/results/2026-12-04-h200-cuda-e2e-toggle-*.log);
each decode must then decode the same tokens at the same positions.

The parent pools every round of every child and prints the paired relative difference on/off - 1
(order-balanced median with a bootstrap 95% interval, as bench/side_by_side.py's paired()), the same
per child, and whether the 1% target is resolved. It also prints the per-call cost of each
intercepted operator, on and off alternated in the same process, and the CPU time the hook's own
threads used (they run in both variants: a cost the block comparison does not see).

Not measured here: the hook's one-time load and registration at start-up, and any effect of the
hook's idle reporter thread on the decoding thread beyond its CPU time, which is printed.
"""
import argparse
import itertools
import json
import os
import random
import statistics
import sys
import threading
import time

import side_by_side as sbs
from e2e_overhead import decoder, thread_deltas, thread_times, tiny_calls, verdict


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--processes", type=int, default=2, help="child processes, one after the other")
    p.add_argument("--rounds", type=int, default=60, help="rounds per child (one block of each variant)")
    p.add_argument("--block", type=int, default=16, help="timed decode steps per block")
    p.add_argument("--settle", type=int, default=2, help="untimed decode steps per block after the prefill")
    p.add_argument("--warmup", type=int, default=4, help="untimed blocks of each variant per child first")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every child")
    p.add_argument("--control", action="store_true", help="a second 'off' block per round: the noise floor")
    p.add_argument("--continuous", action="store_true",
                   help="blocks continue one decode instead of each starting from a fresh prefill")
    p.add_argument("--segment", type=int, default=40,
                   help="with --continuous: rounds per decode before a fresh prefill (GPT-2 has 1024 positions)")
    p.add_argument("--calls", type=int, default=20000, help="calls per repeat of the per-call bench")
    p.add_argument("--repeats", type=int, default=6, help="repeats of the per-call bench, each variant (even)")
    p.add_argument("--seed", type=int, default=0, help="seed of the block orders (child i uses seed + i)")
    p.add_argument("--sample-rate", type=int,
                   help="KFORGE_SAMPLE_RATE of the children (default: unset, the hook's default)")
    p.add_argument("--n-embd", type=int, default=0,
                   help="GPT-2's width (default 0: GPT-2 small's 768); a narrow one (64) makes a CPU decode step "
                        "bound by host-side dispatch, as a CUDA step is")
    p.add_argument("--observe-every", type=int,
                   help="KFORGE_OBSERVE_EVERY of the children (default: unset, the hook's default)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    sbs.add_kforge_arguments(p)
    return p.parse_args(argv)


# ---- one child ---------------------------------------------------------------------------------

def child(args):
    import ctypes
    import torch
    hook = sbs.open_hook()
    if hook is None:
        sys.exit("the child runs only with the hook")
    hook.lib.kforge_hook_bench_set_interceptors.restype = ctypes.c_char_p
    hook.lib.kforge_hook_bench_set_interceptors.argtypes = [ctypes.c_int]

    def set_interceptors(on):
        said = hook.lib.kforge_hook_bench_set_interceptors(1 if on else 0).decode()
        if said:
            sys.exit(f"kforge_hook_bench_set_interceptors({int(on)}): {said}")

    from transformers import GPT2Config, GPT2LMHeadModel
    torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with torch.device(args.device):
        # --n-embd: the same layers and operator calls with less arithmetic per call.
        model = GPT2LMHeadModel(GPT2Config(**({"n_embd": args.n_embd, "n_head": 4} if args.n_embd else {}))).eval()
    step = decoder(model)
    prompt = torch.tensor([[464, 2068, 7586, 21831]], device=args.device)

    # --continuous: one decode runs on across blocks (a fresh prefill, outside every block and with
    # the interceptors out, every --segment rounds), so the blocks of a round are a few steps apart.
    run = {"ids": None, "cache": None, "tokens": None}
    segments = []

    def new_segment():
        set_interceptors(False)
        if run["tokens"]:
            segments.append(run["tokens"])
        run["ids"], run["cache"] = step(prompt, None)
        run["tokens"] = [int(run["ids"].item())]

    def block(variant):
        set_interceptors(variant == "on")
        before = hook.calls_by_op()
        if args.continuous:
            ids, cache = run["ids"], run["cache"]
        else:
            ids, cache = step(prompt, None)
        for _ in range(args.settle):
            ids, cache = step(ids, cache)
            if args.continuous:
                run["tokens"].append(int(ids.item()))
        sync()
        times, tokens = [], []
        cpu0 = time.thread_time()
        for _ in range(args.block):
            t0 = time.perf_counter()
            ids, cache = step(ids, cache)
            sync()
            times.append((time.perf_counter() - t0) * 1000)
            tokens.append(int(ids.item()))
        cpu_ms = (time.thread_time() - cpu0) * 1000 / args.block
        after = hook.calls_by_op()
        counted = {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}
        if args.continuous:
            run["ids"], run["cache"] = ids, cache
            run["tokens"] += tokens
            tokens = []   # checked per segment instead: they depend on the block's position
        return statistics.median(times), tokens, counted, cpu_ms

    variants = ["on", "off"] + (["off2"] if args.control else [])
    rng = random.Random(args.seed)
    cycle = list(itertools.permutations(variants))
    rows = []
    threads_before = thread_times()
    t_start = time.perf_counter()
    with torch.inference_mode():
        if args.continuous:
            new_segment()
        for _ in range(args.warmup):
            for v in variants:
                block(v)
        for r in range(args.rounds):
            if args.continuous and r % args.segment == 0:
                new_segment()
            if r % len(cycle) == 0:
                rng.shuffle(cycle)
            order = cycle[r % len(cycle)]
            row = {"order": order}
            for v in order:
                row[v] = block(v)
            rows.append(row)
        wall_ms = (time.perf_counter() - t_start) * 1000
        if args.continuous:
            segments.append(run["tokens"])
        threads_after = thread_times()
        # Per-call cost of each intercepted operator on tiny CPU tensors (the hook's work is on the
        # host whatever the device), on and off alternated.
        ops = sorted({op for row in rows for op in row["on"][2]})
        calls = tiny_calls(torch)
        if args.device == "cuda":
            # The same calls on CUDA tensors: launch-bound, so this is the host's cost per call,
            # including what the hook does only for CUDA calls (timing one call in
            # KFORGE_SAMPLE_RATE with CUDA events).
            with torch.device("cuda"):
                calls.update({f"{op} (cuda)": fn for op, fn in tiny_calls(torch).items()})
            ops += [f"{op} (cuda)" for op in ops]
        micro = {op: {"on": [], "off": []} for op in ops if op in calls}
        for rep in range(args.repeats):
            for v in (("on", "off") if rep % 2 == 0 else ("off", "on")):
                set_interceptors(v == "on")
                for op in micro:
                    micro[op][v].append(sbs.ns_per_call(calls[op], args.calls, 1, sync=sync))
        set_interceptors(True)
    others = thread_deltas(threads_before, threads_after, exclude=threading.get_native_id())
    stats = hook.stats()
    on = [row["on"][0] for row in rows]
    off = [row["off"][0] for row in rows]
    sbs.emit({"rows": [{"order": row["order"], **{v: row[v][0] for v in variants},
                        **{v + "_cpu": row[v][3] for v in variants}} for row in rows],
              "tokens": {v: sorted({tuple(row[v][1]) for row in rows}) for v in variants},
              # Per variant: the operators each block counted, and the calls counted over all blocks
              # (the hook observes about one call in KFORGE_OBSERVE_EVERY and counts it with the calls
              # it skipped before it, so a block's counts vary; their sum does not).
              "counted_ops": {v: sorted({tuple(sorted(row[v][2])) for row in rows}) for v in variants},
              "counted_sum": {v: {op: sum(row[v][2].get(op, 0) for row in rows)
                                  for op in sorted({op for row in rows for op in row[v][2]})} for v in variants},
              "segments": segments, "micro": micro, "wall_ms": wall_ms, "others": others, "threads": torch.get_num_threads(),
              "config": stats["config"], "cuda_timing": stats["cuda_timing"],
              "headline": f"on {statistics.median(on):.3f} ms/step, off {statistics.median(off):.3f} ms/step "
                          f"(medians over {len(rows)} rounds)"})


# ---- the parent --------------------------------------------------------------------------------

def main():
    args = parse_args()
    if args.child:
        return child(args)
    if args.repeats % 2:
        sys.exit("--repeats must be even (on and off alternate which goes first)")
    per_round = (3 if args.control else 2) * (args.settle + args.block)
    if args.continuous and max(args.segment, args.warmup) * per_round > 1000:
        sys.exit(f"--continuous: {max(args.segment, args.warmup)} rounds of {per_round} decode steps run past "
                 f"GPT-2's 1024 positions; lower --segment, --warmup or --block")
    torch, files = sbs.parent_start(args)
    base = [sys.executable, os.path.abspath(__file__), "--child", "--device", args.device,
            "--rounds", str(args.rounds), "--block", str(args.block), "--settle", str(args.settle),
            "--warmup", str(args.warmup), "--threads", str(args.threads), "--calls", str(args.calls),
            "--repeats", str(args.repeats), "--segment", str(args.segment), "--n-embd", str(args.n_embd)] + \
        (["--control"] if args.control else []) + (["--continuous"] if args.continuous else [])
    results = []
    for i in range(args.processes):
        env = sbs.child_env(files, args.load, KFORGE_MODE="active", KFORGE_BENCH_TOGGLE=1,
                            KFORGE_CACHE_DIR=sbs.private_dir("kforge-empty-cache-"),
                            **({"KFORGE_SAMPLE_RATE": args.sample_rate} if args.sample_rate else {}),
                            **({"KFORGE_OBSERVE_EVERY": args.observe_every} if args.observe_every else {}))
        res = sbs.run_child(base + ["--seed", str(args.seed + i)], env, timeout=1800, cpus=args.cpus)
        print(f"  child {i + 1}/{args.processes}: {res['headline']}", flush=True)
        results.append(res)
    sbs.remove_private_dirs()

    # The runs must be comparable and the toggle must have done what it says.
    variants = ["on", "off"] + (["off2"] if args.control else [])
    tokens = {json.dumps(r["tokens"][v]) for r in results for v in variants}
    if len(tokens) != 1 or len(results[0]["tokens"]["on"]) != 1:
        sys.exit(f"decoded tokens differ between blocks: {sorted(tokens)}")
    if any(not ops for r in results for ops in r["counted_ops"]["on"]):
        sys.exit(f"an 'on' block counted no intercepted call: {[r['counted_ops']['on'] for r in results]}")
    for v in variants[1:]:
        if any(r["counted_ops"][v] != [[]] for r in results):
            sys.exit(f"an '{v}' block counted intercepted calls: {[r['counted_ops'][v] for r in results]}")
    if args.continuous:
        # Each decode, whatever blocks of which variants it ran through, must decode what the
        # longest one did at the same positions.
        segments = [seg for r in results for seg in r["segments"]]
        longest = max(segments, key=len)
        if any(seg != longest[:len(seg)] for seg in segments):
            sys.exit("decoded tokens differ between decodes at the same positions")
    # A block's counts cover its untimed steps too, and its prefill (the same calls as a decode
    # step, on 4 tokens) unless --continuous.
    steps = sum(len(r["rows"]) for r in results) * ((0 if args.continuous else 1) + args.settle + args.block)
    per_step = {}
    for r in results:
        for op, n in r["counted_sum"]["on"].items():
            per_step[op] = per_step.get(op, 0) + n / steps

    print(f"# hook config: {results[0]['config']}")
    where = (f"continuing one decode (a fresh prefill every {args.segment} rounds)" if args.continuous
             else "after a fresh prefill")
    print(f"# {args.processes} processes x {args.rounds} rounds, {args.block} timed + {args.settle} untimed "
          f"decode steps per block {where}, {args.warmup} warm-up blocks per variant, "
          f"{results[0]['threads']} CPU thread(s)")
    print()
    model = f"GPT-2 small's layers at width {args.n_embd}" if args.n_embd else "GPT-2 small"
    print(f"{model}, batch 1, greedy decode with KV cache, {args.device}, interceptors in (on) and out "
          f"of (off) the dispatcher in the same process: median of block medians, ms/step")

    def compare(rows, a, b, value=""):
        return sbs.paired([r[a + value] for r in rows], [r[b + value] for r in rows],
                          [list(r["order"]).index(a) < list(r["order"]).index(b) for r in rows], relative=True)

    def line(label, p, note=""):
        interval = "[{:+.2%}, {:+.2%}]".format(*p["interval"])
        return (f"{label:>10s} {p['without']:9.3f} {p['with']:9.3f} {p['with'] / p['without']:7.4f} {p['diff']:+12.3%} "
                f"{interval:>20s} {p['min']:+8.2%} {p['max']:+8.2%}{note}")

    print(f"{'':>10s} {'off':>9s} {'on':>9s} {'ratio':>7s} {'paired diff':>12s} {'95% bootstrap':>20s} "
          f"{'min':>8s} {'max':>8s}")
    pooled = [row for r in results for row in r["rows"]]
    total = compare(pooled, "off", "on")
    print(line("all", total, f"   ({len(pooled)} rounds)"))
    if args.control:
        print(line("control", compare(pooled, "off", "off2"), "   (off2 against off: the noise floor)"))
    for i, r in enumerate(results):
        print(line(f"child {i + 1}", compare(r["rows"], "off", "on")))
    print(verdict(total, len(pooled)))
    print("(paired diff: on/off - 1 per round, the median within each order averaged over the two orders; "
          "interval: bootstrap within each order)")
    # The decoding thread's own CPU time per step (CLOCK_THREAD_CPUTIME_ID over each block's timed
    # steps): what the hook adds to the thread's work, without the time the VM or other threads
    # take the CPU away (which wall time includes). Not the target, which is wall time; a
    # cross-check with less noise.
    print()
    print("the decoding thread's CPU time per step (ms, mean over each block):")
    cpu = compare(pooled, "off", "on", "_cpu")
    print(line("cpu all", cpu))
    if args.control:
        print(line("cpu ctl", compare(pooled, "off", "off2", "_cpu"), "   (off2 against off)"))
    print("cpu time: " + verdict(cpu, len(pooled)))
    if args.continuous:
        print(f"decoded tokens: identical at the same positions in every decode ({len(segments)} decodes, "
              f"up to {len(longest)} tokens)")
    else:
        print(f"decoded tokens: identical in every block ({args.block} per block)")

    print()
    print(f"{'intercepted op':33s} {'calls/step':>10s} {'off ns':>8s} {'on ns':>8s} {'added ns':>9s}")
    bounds = {}
    for op in results[0]["micro"]:
        off = statistics.median(x for r in results for x in r["micro"][op]["off"])
        on = statistics.median(x for r in results for x in r["micro"][op]["on"])
        where = "cuda" if op.endswith(" (cuda)") else "cpu"
        n = per_step.get(op.removesuffix(" (cuda)"), 0)
        bounds[where] = bounds.get(where, 0.0) + n * max(on - off, 0.0)
        print(f"{op:33s} {n:10.1f} {off:8.0f} {on:8.0f} {on - off:+9.0f}")
    for where, bound_ns in bounds.items():
        print(f"{sum(per_step.values()):.0f} intercepted calls/step x added ns/call on tiny {where.upper()} tensors = "
              f"{bound_ns / 1000:.1f} us = {bound_ns / 1e6 / total['without']:.3%} of a {total['without']:.3f} ms step "
              f"(per-call medians over all children, {args.repeats} repeats of {args.calls} calls each way)")
    hook_ms = sum(t["cpu_ms"] for r in results for t in r["others"])
    wall_ms = sum(r["wall_ms"] for r in results)
    busiest = {}
    for r in results:
        for t in r["others"]:
            busiest[t["name"]] = busiest.get(t["name"], 0) + t["cpu_ms"]
    print(f"other threads' CPU time over the rounds: {hook_ms:.0f} ms in {wall_ms / 1000:.0f} s of wall time "
          f"({hook_ms / wall_ms:.3%}): " + (", ".join(f"{k} {v:.0f} ms" for k, v in
                                                      sorted(busiest.items(), key=lambda kv: -kv[1])[:5]) or "none"))
    if args.device == "cuda":
        timing = {k: sum(r["cuda_timing"][k] for r in results) for k in results[0]["cuda_timing"]}
        print("hook's CUDA timing over all children (Note [CUDA timing budget]): " +
              ", ".join(f"{k} {v}" for k, v in timing.items()))
    print(f"# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
