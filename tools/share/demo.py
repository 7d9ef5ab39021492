"""kforge demo: a small model built in code, run under kforge, measured before and after.

`kforge demo` runs this file under the hook (KFORGE_MODE=active, KFORGE_BENCH_TOGGLE=1) with a
daemon of its own, and reads the JSON it writes to --result. Run by hand it needs the same
environment (the hook preloaded); `kforge demo --help` says what the phases are.

The model: a convolution stem, then diffusion-style residual blocks ((group norm, SiLU, convolution)
twice) and windowed self-attention written out (layer norm, q/k/v projections, q @ k^T,
softmax, @ v) with a GELU MLP. On CUDA it runs in float16 at sizes where the normalizations and the
softmax dominate (1024-wide rows); on the CPU it runs in float32 at the shapes where kforge's CPU kernel templates
are known to beat PyTorch's (short softmax rows, narrow layer norms), and `kforge demo` lets the
hook report only those two operators there (KFORGE_OPS), so that a few minutes of search on a small
machine have something to find. Both are stated in the demo's output.

Phases:
  1. search: steps in a loop while the daemon searches; the hook loads each kernel the daemon
     publishes, checks it against PyTorch's (outputs and time, in this process) and swaps it in.
     Ends when the control file (--control) says the search is over, or at --search-seconds, and
     then once no kernel is still in its trial.
  2. measure: blocks of steps with kforge's interceptors taken out of the dispatcher (PyTorch
     alone, "before") and put back ("after"), alternated in this one process, so the ratio is not
     a difference between processes.
  3. check: the model's outputs with and without kforge against a float64 reference of the same
     model, judged by kforge's accuracy criterion (docs/REFERENCE.md): kforge's error must stay
     within 2x PyTorch's own plus 8 ulps of the output's magnitude.
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    """A diffusion UNet's residual block: (group norm, SiLU, 3x3 convolution) twice, plus the input."""

    def __init__(self, channels, groups):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(F.silu(self.norm2(self.conv1(F.silu(self.norm1(x))))))


class WindowAttention(nn.Module):
    """Self-attention inside non-overlapping windows of `window` x `window` pixels."""

    def __init__(self, channels, heads, window):
        super().__init__()
        self.heads, self.window = heads, window
        self.norm1 = nn.LayerNorm(channels // heads)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.norm2 = nn.LayerNorm(channels)
        self.mlp1 = nn.Linear(channels, 2 * channels)
        self.mlp2 = nn.Linear(2 * channels, channels)

    def forward(self, x):
        b, c, h, w = x.shape
        s = self.window
        t = x.reshape(b, c, h // s, s, w // s, s).permute(0, 2, 4, 3, 5, 1).reshape(-1, s * s, c)
        q, k, v = self.qkv(t).chunk(3, dim=-1)
        hd = c // self.heads

        def heads(z):   # per-head layer norm (QK-norm) on contiguous rows, then heads first
            return self.norm1(z.reshape(z.shape[0], s * s, self.heads, hd)).transpose(1, 2)

        q, k, v = heads(q) * hd ** -0.5, heads(k), v.reshape(v.shape[0], s * s, self.heads, hd).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        o = (att @ v).transpose(1, 2).reshape(-1, s * s, c)
        t = t + self.proj(o)
        t = t + self.mlp2(F.gelu(self.mlp1(self.norm2(t))))
        return t.reshape(b, h // s, w // s, s, s, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, h, w)


class DemoModel(nn.Module):
    def __init__(self, channels, groups, heads, window, blocks):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        layers = []
        for _ in range(blocks):
            layers += [ResBlock(channels, groups), WindowAttention(channels, heads, window)]
        self.layers = nn.Sequential(*layers)
        self.head = nn.Conv2d(channels, 3, 1)

    def forward(self, x):
        return self.head(self.layers(self.stem(x)))


# Per device: the model's sizes, its dtype and the input's shape. The CPU shapes: softmax rows of
# 4 (2 x 2 windows) and layer norms over 8 channels per head, where the CPU templates win; CUDA:
# float16, 1024-wide softmax rows (32 x 32 windows), group norm over large groups.
CONFIGS = {
    "cpu": dict(model=dict(channels=16, groups=4, heads=2, window=2, blocks=2), dtype=torch.float32,
                input=(2, 3, 64, 64)),
    "cuda": dict(model=dict(channels=64, groups=8, heads=8, window=32, blocks=2), dtype=torch.float16,
                 input=(2, 3, 128, 128)),
}


def hook_library():
    """The hook the shim loaded into this process (same path: dlopen returns the same handle)."""
    d = os.environ.get("KFORGE_HOOK_DIR", "")
    v = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    path = os.path.join(d, f"libkforge_hook-torch{v}.so")
    if not d or not os.path.exists(path):
        sys.exit(f"demo: no kforge hook for torch {v} at {path}: run this through `kforge demo`")
    lib = ctypes.CDLL(path)
    lib.kforge_hook_stats_json.restype = ctypes.c_char_p
    lib.kforge_hook_bench_set_interceptors.restype = ctypes.c_char_p
    lib.kforge_hook_bench_set_interceptors.argtypes = [ctypes.c_int]
    return lib


def kernels(lib):
    """The hook's entries: signature -> state (shadow, active, no_win, disabled)."""
    st = json.loads(lib.kforge_hook_stats_json())
    return {s["signature"]: s for s in st.get("signatures", []) if s.get("entry")}, st


def set_kforge(lib, on):
    why = lib.kforge_hook_bench_set_interceptors(1 if on else 0).decode()
    if why:
        sys.exit(f"demo: cannot switch kforge's interceptors {'on' if on else 'off'}: {why}")


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed_block(model, x, steps, device):
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        model(x)
    sync(device)
    return (time.perf_counter() - t0) / steps


def error_measures(out, ref):
    d = (out.double() - ref).abs()
    ref_abs = ref.abs()
    l2 = float(ref.norm()) or 1.0
    return dict(max_abs=float(d.max()), rel_l2=float((out.double() - ref).norm()) / l2, ref_max=float(ref_abs.max()))


def judge(cand, torch_err, eps):
    """Note [Accuracy criterion] (runtime/accuracy.h), applied to the whole model's output."""
    max_bound = 2 * torch_err["max_abs"] + 8 * eps * cand["ref_max"]
    rel_bound = 2 * torch_err["rel_l2"] + 8 * eps
    ok = cand["max_abs"] <= max_bound and cand["rel_l2"] <= rel_bound
    return ok, max_bound, rel_bound


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--search-seconds", type=float, default=300)
    ap.add_argument("--control", default="", help="file whose existence means the search is over")
    ap.add_argument("--result", required=True, help="where to write the result (JSON)")
    ap.add_argument("--rounds", type=int, default=12, help="before/after block pairs to time")
    args = ap.parse_args()

    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(1)   # leave the other cores to the search (and keep timings steady)
    cfg = CONFIGS[args.device]
    model = DemoModel(**cfg["model"]).to(args.device, cfg["dtype"]).eval()
    x = torch.randn(*cfg["input"], device=args.device, dtype=cfg["dtype"])
    lib = hook_library()
    result = dict(device=args.device, dtype=str(cfg["dtype"]).replace("torch.", ""), model=cfg["model"],
                  input=list(cfg["input"]), torch=torch.__version__)
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()

    def emit(msg):
        print(f"demo: {msg}", file=sys.stderr, flush=True)

    # 1. search
    t0 = time.monotonic()
    steps, last_line = 0, 0.0
    with torch.inference_mode():
        while True:
            model(x)
            steps += 1
            now = time.monotonic() - t0
            over = (args.control and os.path.exists(args.control)) or now > args.search_seconds
            if now - last_line > 15 or over:
                k, _ = kernels(lib)
                states = sorted(s["state"] for s in k.values())
                emit(f"{now:5.0f} s, {steps} steps, kernels in this process: "
                     f"{', '.join(states) if states else 'none yet'}")
                last_line = now
            if over:
                break
        # Let what was published last finish its trial (at most a minute more).
        settle = time.monotonic()
        while time.monotonic() - settle < 60:
            k, _ = kernels(lib)
            if all(s["state"] not in ("shadow",) for s in k.values()):
                break
            for _ in range(20):
                model(x)
        k, _ = kernels(lib)
        result["search_seconds"] = round(time.monotonic() - t0, 1)
        result["search_steps"] = steps
        result["kernels"] = [dict(signature=sig, op=s.get("op"), state=s["state"], entry=s["entry"],
                                  reason=s.get("reason", ""), pytorch_median_ns=s.get("pytorch_median_ns"),
                                  entry_median_ns=s.get("entry_median_ns"))
                             for sig, s in sorted(k.items())]
        _, st = kernels(lib)
        result["operators"] = sorted({s["op"] for s in st.get("signatures", [])})

        # 2. measure: before (interceptors out) and after (in), alternated.
        warm = 3
        for on in (False, True):
            set_kforge(lib, on)
            timed_block(model, x, warm, args.device)
        # Blocks of about a second each: long enough that a block's time is not one step's noise.
        block = max(5, int(1.0 / max(timed_block(model, x, 3, args.device), 1e-6)))
        before, after = [], []
        for r in range(args.rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                set_kforge(lib, on)
                (after if on else before).append(timed_block(model, x, block, args.device))
        set_kforge(lib, True)
        ratios = sorted(b / a for b, a in zip(before, after))
        result["steps_per_block"] = block
        result["before_ms"] = [round(t * 1e3, 4) for t in before]
        result["after_ms"] = [round(t * 1e3, 4) for t in after]
        result["before_median_ms"] = statistics.median(before) * 1e3
        result["after_median_ms"] = statistics.median(after) * 1e3
        result["speedup"] = statistics.median(before) / statistics.median(after)
        result["speedup_range"] = [ratios[0], ratios[-1]]

        # 3. check: outputs with and without kforge against a float64 reference.
        set_kforge(lib, False)
        out_torch = model(x)
        ref = model.to(torch.float64)(x.double())
        model.to(cfg["dtype"])
        set_kforge(lib, True)
        out_kforge = model(x)
    eps = torch.finfo(cfg["dtype"]).eps
    e_torch, e_kforge = error_measures(out_torch, ref), error_measures(out_kforge, ref)
    ok, max_bound, rel_bound = judge(e_kforge, e_torch, eps)
    result["check"] = dict(passed=ok, kforge=e_kforge, pytorch=e_torch, max_abs_bound=max_bound, rel_l2_bound=rel_bound,
                           identical=bool(torch.equal(out_torch, out_kforge)))
    with open(args.result + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(args.result + ".tmp", args.result)


if __name__ == "__main__":
    main()
