"""What the dispatcher hook costs, measured side by side in one process.

    .venv/bin/python bench/hook_overhead.py --hook build/interposer/hook/libkforge_hook-torch2.11.so [--device cpu|cuda]

1. Per intercepted call on a miss (empty replacement table): torch.add on 4-element tensors,
   N calls, median of R repeats, before and after the hook is loaded into this process.
   Target: at most 150 ns added.
2. End to end on a launch-bound model: GPT-2 small (12 layers, 768 wide, built from its config,
   random weights, no download), batch 1, greedy decode steps with the KV cache, median time per
   step, before and after. Target: at most 1% slower.
The hook cannot be unloaded, so "before" always runs first; the model and inputs are the same
objects in both phases. KFORGE_DAEMON_ENDPOINT is pointed at an endpoint nobody serves (what a
production host without a daemon sees).
A quick look only: "after" always runs second, in the same process. bench/e2e_overhead.py (the
decode step) and bench/hook_hit_overhead.py (per call: without kforge, miss, hit) measure each
variant in its own process, side by side, with intervals.
"""
import argparse
import ctypes
import json
import os
import statistics
import tempfile
import time

import torch


def per_call_ns(device, n, repeats):
    a = torch.ones(4, device=device)
    b = torch.ones(4, device=device)
    for _ in range(1000):
        torch.add(a, b)
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            torch.add(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def decode_step_ms(model, device, steps, repeats):
    ids = torch.tensor([[464, 2068, 7586, 21831]], device=device)
    samples = []
    with torch.inference_mode():
        for r in range(repeats + 1):
            out = model(ids, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            if device == "cuda":
                torch.cuda.synchronize()
            if r > 0:   # the first round is warm-up
                samples.append((time.perf_counter() - t0) * 1000 / steps)
    return statistics.median(samples), samples


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hook", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=200000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=32)
    args = p.parse_args()
    os.environ.setdefault("KFORGE_DAEMON_ENDPOINT", "ipc://" + tempfile.mkdtemp() + "/nobody.sock")

    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval().to(args.device)   # GPT-2 small

    before_call = per_call_ns(args.device, args.calls, args.repeats)
    before_step, before_all = decode_step_ms(model, args.device, args.steps, args.repeats)

    hook = ctypes.CDLL(args.hook)
    hook.kforge_hook_stats_json.restype = ctypes.c_char_p

    after_call = per_call_ns(args.device, args.calls, args.repeats)
    after_step, after_all = decode_step_ms(model, args.device, args.steps, args.repeats)
    stats = json.loads(hook.kforge_hook_stats_json())
    intercepted = sum(s["calls"] for s in stats.get("signatures", []))

    print(f"device {args.device}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    print(f"{'measure':34s} {'without':>12s} {'with hook':>12s} {'added':>10s} {'ratio':>7s}")
    print(f"{'torch.add(4 elems), ns/call':34s} {before_call:12.0f} {after_call:12.0f} "
          f"{after_call - before_call:10.0f} {after_call / before_call:7.3f}")
    print(f"{'GPT-2 small decode, ms/step':34s} {before_step:12.3f} {after_step:12.3f} "
          f"{after_step - before_step:10.3f} {after_step / before_step:7.3f}")
    print(f"decode step samples without: {[round(x, 3) for x in before_all]}")
    print(f"decode step samples with:    {[round(x, 3) for x in after_all]}")
    print(f"calls the hook intercepted: {intercepted}")
    print("targets: <= 150 ns added per call on a miss; <= 1% end to end")


if __name__ == "__main__":
    main()
