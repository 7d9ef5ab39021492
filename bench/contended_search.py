"""Searches on a host whose cores a serving process keeps busy: does any published speedup exceed
what the cost model allows? (issue 19; Note [Plausible timing] in search_daemon/worker/measurer.h)

Here (build tree, the 2-core VM; about 10 minutes):
    .venv/bin/python bench/contended_search.py --minutes 8

What runs: kforged (one CPU slot, --cpu-threads 2: the worker's torch threads on both cores, as in
the report that published 239x), a serving process under the hook (KFORGE_MODE=observe, torch on
both cores) running a small model of layer_norm [64,128], softmax over rows of 3 and gelu in a
loop, and --spinners busy Python processes on top. The daemon searches what the process reports.

What it prints: every published entry with its PyTorch time, its candidate time, its speedup, and
the ratio of its PyTorch time to the cost model's (bytes at the worker's measured copy bandwidth
plus the worker's smallest call; both from the daemon's status and log), and every implausible
timing the daemon refused (from the journals). The check: no published entry's PyTorch time is
over search.max_baseline_model_ratio (250) x the model; exit status 1 if one is.
"""
import argparse
import json
import os
import pathlib
import re
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

MODEL = textwrap.dedent("""
    import time, torch
    torch.set_num_threads(2)
    ln = torch.nn.LayerNorm(128).eval()
    deadline = time.monotonic() + float(__import__("sys").argv[1])
    with torch.inference_mode():
        while time.monotonic() < deadline:
            x = torch.randn(64, 128)
            y = ln(x)
            z = torch.softmax(torch.randn(4096, 3), -1)
            g = torch.nn.functional.gelu(torch.randn(256, 256))
""")

SPIN = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"


def signature_bytes(sig):
    """Bytes the op moves by op_cost.h's rule: tensor inputs once, and (for these ops) one output of
    input 0's shape; layer_norm's mean and rstd are counted too."""
    m = re.match(r"(aten::\w+)\((\w+)\[([\d,]*)\]", sig)
    op, dtype, dims = m.group(1), m.group(2), [int(d) for d in m.group(3).split(",") if d]
    size = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[dtype]
    numel = 1
    for d in dims:
        numel *= d
    total = 2 * numel * size
    for t in re.findall(r"(\w+)\[([\d,]*)\]", sig)[1:]:   # weight, bias
        n = 1
        for d in t[1].split(","):
            n *= int(d) if d else 1
        total += n * size
    if op == "aten::native_layer_norm":
        total += 2 * dims[0] * 4
    return total


def journals(state_dir):
    import msgpack
    out = []
    jdir = state_dir / "journal"
    if not jdir.exists():
        return out
    for f in sorted(os.listdir(jdir)):
        b = (jdir / f).read_bytes()
        pos = 0
        while pos + 12 <= len(b):
            n = struct.unpack_from("<I", b, pos)[0]
            rec = msgpack.unpackb(b[pos + 12:pos + 12 + n], raw=False)
            pos += 12 + n
            if rec[0] == "outcome" and rec[2] == 0:
                out.append({"journal": f, "speedup": rec[3], "baseline_ns": rec[6], "candidate_ns": rec[7],
                            "implausible": rec[12] if len(rec) > 12 else ""})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=str(ROOT / "build"))
    ap.add_argument("--minutes", type=float, default=8)
    ap.add_argument("--spinners", type=int, default=2)
    ap.add_argument("--max-evaluations", type=int, default=12)
    args = ap.parse_args()
    build = pathlib.Path(args.build_dir).resolve()
    import torch
    mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    kforged, kforge = build / "search_daemon" / "kforged", build / "tools" / "kforge"
    shim, hook = build / "interposer" / "libkforge_preload.so", build / "interposer" / "hook" / f"libkforge_hook-torch{mm}.so"
    for p in (kforged, kforge, shim, hook):
        if not p.exists():
            sys.exit(f"no {p}: build kforge first (scripts/build.sh)")
    root = pathlib.Path(tempfile.mkdtemp(prefix="kforge-contended-"))
    (root / "run").mkdir(mode=0o700)
    endpoint = f"ipc://{root}/run/daemon.sock"
    seconds = args.minutes * 60
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k != "LD_PRELOAD"}
    env["KFORGE_WORKER_LIB_DIR"] = str(kforged.parent)
    log = open(root / "daemon.log", "w")
    daemon = subprocess.Popen([str(kforged), "--endpoint", endpoint, "--cache-dir", str(root / "cache"), "--state-dir",
                               str(root / "state"), "--devices", "cpu", "--cpu-slots", "1", "--cpu-threads", "2",
                               "--worker", str(kforged.parent / "kforge-worker"), "--worker-python", sys.executable,
                               "--min-calls", "30", "--max-evaluations", str(args.max_evaluations),
                               "--set", "search.concurrent_searches=1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    serve_env = dict(env, LD_PRELOAD=str(shim), KFORGE_HOOK=str(hook), KFORGE_DAEMON_ENDPOINT=endpoint,
                     KFORGE_CACHE_DIR=str(root / "cache"), KFORGE_REPORT_INTERVAL_MS="500")
    serving = subprocess.Popen([sys.executable, "-c", MODEL, str(seconds)], env=serve_env)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)]) for _ in range(args.spinners)]

    def status():
        r = subprocess.run([str(kforge), "status", "--json", "--endpoint", endpoint, "--timeout-ms", "5000"],
                           capture_output=True, text=True)
        return json.loads(r.stdout) if r.returncode == 0 else None

    deadline = time.monotonic() + seconds
    st = None
    try:
        while time.monotonic() < deadline:
            time.sleep(5)
            st = status() or st
            sigs = (st or {}).get("signatures", [])
            if sigs and all(s["state"] in ("done", "published", "unrunnable", "failed") for s in sigs if s["calls"] >= 30):
                if any(s["state"] in ("done", "published") for s in sigs):
                    break
    finally:
        for p in [serving, *spinners]:
            p.kill()
            p.wait()
        st = status() or st
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=120)
        log.close()
    text = (root / "daemon.log").read_text()
    floor = re.search(r"smallest call (\d+) ns", text)
    floor_ns = float(floor.group(1)) if floor else 0.0
    bw = (st or {}).get("slots", [{}])[0].get("bandwidth_bytes_per_s", 0)
    print(f"worker: copy bandwidth {bw / 1e9:.2f} GB/s, smallest call {floor_ns:.0f} ns (measured at its start)")
    ratio_limit = 250
    worst = 0.0
    bad = 0
    by_id = {s["id"]: s for s in (st or {}).get("signatures", [])}
    ls = subprocess.run([str(kforge), "--cache-dir", str(root / "cache"), "cache", "ls", "--json"], capture_output=True,
                        text=True)
    entries = json.loads(ls.stdout)["entries"] if ls.returncode == 0 else []
    print(f"published entries: {len(entries)}")
    for e in entries:
        show = json.loads(subprocess.run([str(kforge), "--cache-dir", str(root / "cache"), "cache", "show", e["key"], "--json"],
                                         capture_output=True, text=True).stdout)
        t = show["timings"]
        sig = show["signature"]
        expected = signature_bytes(sig) / bw * 1e9 + floor_ns if bw > 0 else 0
        ratio = t["baseline_ns"] / expected if expected > 0 else float("nan")
        worst = max(worst, ratio)
        bad += ratio > ratio_limit
        print(f"  {t['baseline_ns'] / 1e3:10.1f} us PyTorch, {t['candidate_ns'] / 1e3:10.1f} us candidate, "
              f"{t['baseline_ns'] / t['candidate_ns']:6.2f}x, PyTorch/model {ratio:7.1f}  {sig}")
    refused = [o for o in journals(root / "state") if o["implausible"]]
    print(f"implausible timings refused: {len(refused)} (daemon counter {((st or {}).get('counters') or {}).get('timings_implausible')})")
    for o in refused[:10]:
        print(f"  {o['speedup']:8.2f}x  {o['implausible'][:200]}")
    print(f"searches: " + ", ".join(f"{s['signature'][:50]} {s['state']} ({s['evaluations']} evals)" for s in by_id.values()
                                    if s["evaluations"]))
    print(f"worst published PyTorch/model ratio: {worst:.1f} (limit {ratio_limit}); over the limit: {bad}")
    print(f"logs: {root}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
