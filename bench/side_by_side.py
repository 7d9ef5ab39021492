"""PyTorch with and without kforge, each in its own process, measured side by side.

The hook cannot be unloaded, so a process that has had it can never again measure "without". The
benches here therefore run one child process per measurement: a *variant* is one way of starting
the same child (plain, or with the hook preloaded, ...), and run_rounds() runs every variant once
per round, cycling through every order of the variants (seeded), so that drift of the machine and
any effect of running first or second fall on all variants alike. A child prints one line
`RESULT <json>`; paired() turns two variants' per-round values into the numbers the benches print:
medians, the paired differences' order-balanced median with a bootstrap 95% interval, and the
extremes.

Used by bench/e2e_overhead.py and bench/hook_hit_overhead.py. Everything here is standard library
only: the GPU host has python3 with torch but no pip.
"""
import argparse
import ctypes
import itertools
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULT_PREFIX = "RESULT "


# ---- where kforge's files are --------------------------------------------------------------

def add_kforge_arguments(parser):
    g = parser.add_argument_group("kforge files (default: this source tree's build/)")
    g.add_argument("--build-dir", default=str(ROOT / "build"), help="a kforge build tree")
    g.add_argument("--bundle-root", help="an unpacked kforge bundle: lib/, bin/, share/kforge/tests/")
    g.add_argument("--hook", help="libkforge_hook-torchX.Y.so (overrides the bundle's or build's)")
    g.add_argument("--shim", help="libkforge_preload.so (overrides the bundle's or build's)")
    g.add_argument("--load", choices=("preload", "ctypes"), default="preload",
                   help="preload: LD_PRELOAD the shim, which loads the hook once torch is in the process "
                        "(how users run kforge); ctypes: load the hook with ctypes right after import torch")
    parser.add_argument("--cpus", type=parse_cpu_list, metavar="LIST",
                        help="run every child on these CPUs only (Linux list syntax, e.g. 2-3 or 2,5): on a "
                             "many-core host, children otherwise land on different cores and their "
                             "per-child medians spread more than the effect being measured")


def parse_cpu_list(text):
    """'2-3,6' -> {2, 3, 6}; a CPU this process may not run on is an error."""
    cpus = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list like 2-3 or 2,5") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise argparse.ArgumentTypeError(f"{text!r}: this process may run only on CPUs {sorted(allowed)}")
    return cpus


def torch_major_minor(version):
    return ".".join(version.split("+")[0].split(".")[:2])


def kforge_files(args, torch_version):
    """{"hook", "shim", "bundle", "build"} as absolute paths (bundle or build None); exits with one
    line if one is missing."""
    mm = torch_major_minor(torch_version)
    if args.bundle_root:
        b = pathlib.Path(args.bundle_root).resolve()
        hook, shim = b / "lib" / f"libkforge_hook-torch{mm}.so", b / "lib" / "libkforge_preload.so"
    else:
        b = None
        build = pathlib.Path(args.build_dir).resolve()
        hook = build / "interposer" / "hook" / f"libkforge_hook-torch{mm}.so"
        shim = build / "interposer" / "libkforge_preload.so"
    hook = pathlib.Path(args.hook).resolve() if args.hook else hook
    shim = pathlib.Path(args.shim).resolve() if args.shim else shim
    for what, p in (("hook", hook), ("shim", shim)):
        if (what == "hook" or args.load == "preload") and not p.exists():
            sys.exit(f"no {what} at {p}: build kforge (scripts/build.sh) or pass --bundle-root / --{what}")
    return {"hook": hook, "shim": shim, "bundle": b, "build": None if b else build}


_private_dirs = []


def private_dir(prefix):
    """A fresh 0700 directory of our own (mkdtemp), as the hook requires of socket and cache dirs;
    remove_private_dirs() removes them all."""
    d = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    _private_dirs.append(d)
    return d


def remove_private_dirs():
    while _private_dirs:
        shutil.rmtree(_private_dirs.pop(), ignore_errors=True)


def child_env(files=None, load="preload", **extra):
    """The environment of one child: the parent's without any KFORGE_* or LD_PRELOAD, the daemon
    endpoint in a private empty directory (what a production host without a daemon sees: reports
    are dropped and counted), and, with `files`, the hook loaded the `load` way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k != "LD_PRELOAD"}
    env["KFORGE_DAEMON_ENDPOINT"] = f"ipc://{private_dir('kforge-nobody-')}/daemon.sock"
    if files is not None:
        env["KFORGE_BENCH_HOOK"] = str(files["hook"])
        env["KFORGE_BENCH_LOAD"] = load
        if load == "preload":
            env["LD_PRELOAD"] = str(files["shim"])
            if files["hook"].parent != files["shim"].parent:   # a build tree; the bundle's are side by side
                env["KFORGE_HOOK"] = str(files["hook"])
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ---- inside a child ----------------------------------------------------------------------------

class Hook:
    """The hook's C entry points in this (child) process, or None where it runs without kforge.
    Call open_hook() right after `import torch`."""

    def __init__(self, lib, path, load):
        self.lib, self.path, self.load = lib, path, load
        lib.kforge_hook_stats_json.restype = ctypes.c_char_p
        lib.kforge_hook_report_now.argtypes = [ctypes.c_int]

    def stats(self):
        return json.loads(self.lib.kforge_hook_stats_json())

    def report_now(self, timeout_ms=20000):
        return self.lib.kforge_hook_report_now(timeout_ms)

    def calls_by_op(self):
        calls = {}
        for s in self.stats()["signatures"]:
            calls[s["op"]] = calls.get(s["op"], 0) + s["calls"]
        return calls


def open_hook():
    path, load = os.environ.get("KFORGE_BENCH_HOOK"), os.environ.get("KFORGE_BENCH_LOAD")
    if not path:
        return None
    if load == "preload":
        # RTLD_NOLOAD: only a handle to the copy the shim already loaded; fails if it did not.
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            sys.exit(f"the shim did not load {path} (LD_PRELOAD={os.environ.get('LD_PRELOAD')})")
    else:
        lib = ctypes.CDLL(path)
    hook = Hook(lib, path, load)
    if not hook.stats().get("started"):
        sys.exit(f"the hook at {path} did not start: {hook.stats()}")
    return hook


def ns_per_call(fn, calls, repeats, sync=None):
    """Median over `repeats` of the mean time of `calls` back-to-back calls of fn(), in ns."""
    for _ in range(min(calls, 2000)):
        fn()
    samples = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        if sync:
            sync()
        samples.append((time.perf_counter_ns() - t0) / calls)
    return statistics.median(samples)


def emit(obj):
    print(RESULT_PREFIX + json.dumps(obj), flush=True)


# ---- in the parent -----------------------------------------------------------------------------

def run_child(cmd, env, timeout, cpus=None):
    """Runs one child (on `cpus` only, when given) and returns its RESULT dict; exits with its
    output if it fails."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=pin)
    lines = [l[len(RESULT_PREFIX):] for l in proc.stdout.splitlines() if l.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.exit(f"child failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n"
                 f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    out["stderr"] = proc.stderr
    return out


def run_rounds(variants, rounds, seed, start_child, log=print):
    """variants: {name: env}; start_child(name, env) -> result dict. Runs `rounds` rounds, rounded
    up to whole cycles: a cycle runs every order of the variants once (2 for two variants, 6 for
    three), in a seeded random sequence, so every variant runs equally often in every position and
    after every other. Returns ({name: [result per round]}, [order per round])."""
    rng = random.Random(seed)
    cycle = list(itertools.permutations(variants))
    rounds = -(-rounds // len(cycle)) * len(cycle)
    results = {name: [] for name in variants}
    orders = []
    for r in range(rounds):
        if r % len(cycle) == 0:
            rng.shuffle(cycle)
        order = cycle[r % len(cycle)]
        orders.append(order)
        for name in order:
            results[name].append(start_child(name, variants[name]))
        log(f"  round {r + 1}/{rounds}: " + ", ".join(
            f"{n} {results[n][-1].get('headline', '')}" for n in order), flush=True)
    return results, orders


def first(orders, a, b):
    """Per round: True where variant a ran before variant b."""
    return [list(o).index(a) < list(o).index(b) for o in orders]


def paired(without, with_, without_first, relative=False, resamples=10000, seed=1):
    """Per-round values of two variants, and per round whether `without` ran first -> their
    medians; the paired differences (with - without, or with/without - 1 when relative); the mean
    of the median difference over the rounds where `without` ran first and over those where it ran
    second (so an effect of running first or second - caches, clocks, a neighbour's load - cancels
    instead of widening the spread), with a 95% percentile bootstrap interval that resamples within
    each of the two groups; min and max; and each group's median (None where a group is empty)."""
    diffs = [(w / o - 1) if relative else (w - o) for o, w in zip(without, with_)]
    by_order = {"without first": [d for d, f in zip(diffs, without_first) if f],
                "with first": [d for d, f in zip(diffs, without_first) if not f]}
    groups = [g for g in by_order.values() if g]
    rng = random.Random(seed)
    boot = sorted(statistics.fmean(statistics.median(rng.choices(g, k=len(g))) for g in groups)
                  for _ in range(resamples))
    return {"without": statistics.median(without), "with": statistics.median(with_),
            "diff": statistics.fmean(statistics.median(g) for g in groups),
            "interval": (boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]),
            "min": min(diffs), "max": max(diffs), "diffs": diffs,
            "by_order": {k: (statistics.median(g), len(g)) if g else None for k, g in by_order.items()}}


def parent_start(args):
    """The parent's common start: torch imported, the device checked, kforge's files found and the
    run's header printed. Returns (torch, files)."""
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device")
    files = kforge_files(args, torch.__version__)
    print(f"# {machine_line(torch)}"
          + (f"; children pinned to CPUs {sorted(args.cpus)}" if args.cpus else ""))
    print(f"# hook {files['hook']}, loaded by "
          + (f"LD_PRELOAD={files['shim']}" if args.load == "preload" else "ctypes after import torch"))
    return torch, files


def machine_line(torch_module):
    import platform
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    dev = ""
    if torch_module.cuda.is_available():
        dev = f", GPU {torch_module.cuda.get_device_name(0)}"
    return (f"{platform.node()}: {os.cpu_count()} CPUs{dev}, python {platform.python_version()}, "
            f"torch {torch_module.__version__}, load average at start "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
