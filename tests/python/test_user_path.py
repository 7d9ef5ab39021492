"""The user's path, end to end with the real CLI, daemon, worker and hook (CPU backend).

  kforge warm -- WORKLOAD      search in staging until the daemon has a verified faster kernel
  kforge cache export/import   ship it into a fresh cache
  kforge run --no-daemon       production: the kernel is active without any search, and the
                               workload's outputs stay within the accuracy criterion

plus what a script relies on from `kforge run`: the program's exit status and signal passed on,
125/126/127 for what kforge or the program's lookup could not do, usage errors as 2.

The workload is softmax over rows of 3 floats (float32 [16384, 3], one torch thread), where the
CPU templates beat PyTorch's kernel by about 4x on this VM (docs/BENCHMARKS.md), so a search of a few
evaluations finds a winner. Each test gets its own daemon endpoint, state and cache directories.
"""

import json
import re
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

WORKLOAD = textwrap.dedent(
    """
    import json, sys, time, torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(16384, 3) * 4
    ref = torch.softmax(x.double(), -1)
    torch_err = (torch.softmax(x, -1).double() - ref).abs().max().item()
    worst, t_end, n = 0.0, time.monotonic() + float(sys.argv[1]), 0
    while time.monotonic() < t_end or n < 50:
        y = torch.softmax(x, -1)
        n += 1
        # Note [Accuracy criterion], max-abs part: within 2x PyTorch's own error + 8 ulps.
        worst = max(worst, (y.double() - ref).abs().max().item())
    bound = 2 * torch_err + 8 * torch.finfo(torch.float32).eps * ref.abs().max().item()
    print(json.dumps({"calls": n, "max_abs_error": worst, "bound": bound}))
    """
)


@pytest.fixture
def env(tmp_path, build_dir):
    """A private endpoint, state and cache for one test; the daemons it started are stopped."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    e = dict(os.environ)
    e["KFORGE_DAEMON_ENDPOINT"] = f"ipc://{run_dir}/daemon.sock"
    e["XDG_STATE_HOME"] = str(tmp_path / "state")
    e["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + e.get("PATH", "")
    e.pop("KFORGE_CACHE_DIR", None)
    yield e
    st = subprocess.run([str(build_dir / "tools" / "kforge"), "status", "--json"], env=e, capture_output=True,
                        text=True, timeout=30)
    if st.returncode == 0:
        os.kill(json.loads(st.stdout)["daemon"]["pid"], signal.SIGTERM)


def kforge(build_dir, env, *args, timeout=600):
    return subprocess.run([str(build_dir / "tools" / "kforge"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def workload(tmp_path, seconds):
    p = tmp_path / "workload.py"
    p.write_text(WORKLOAD)
    return [sys.executable, str(p), str(seconds)]


def test_warm_export_import_then_run_without_daemon(build_dir, env, tmp_path):
    staging, production = tmp_path / "staging-cache", tmp_path / "production-cache"
    report = tmp_path / "report"
    t0 = time.monotonic()
    w = kforge(build_dir, env, "--cache-dir", str(staging), "warm", "--minutes", "6", "--report", str(report),
               "--daemon-arg=--devices", "--daemon-arg=cpu", "--daemon-arg=--min-calls", "--daemon-arg=20",
               "--daemon-arg=--max-evaluations", "--daemon-arg=4", "--", *workload(tmp_path, 6), timeout=900)
    print(w.stdout, w.stderr, sep="\n")
    assert w.returncode == 0, w.stderr
    assert "warm: run 1 done" in w.stdout
    # The end-to-end check ran in one process: the kernel pays (this workload is all softmax).
    assert "warm: end to end, every kernel in vs none:" in w.stdout, w.stdout
    md = (report / "report.md").read_text()
    assert "| kept |" in md, md
    assert "aten::_softmax(float32[16384,3]" in md
    # Note [Search speed]: evaluations per minute, and the softmax's time to its first win.
    assert "## Search speed" in md and " per minute**" in md, md
    speed = md.split("## Search speed", 1)[1].split("## Runs", 1)[0]
    row = next(line for line in speed.splitlines() if "aten::_softmax(float32[16384,3]" in line)
    assert re.search(r"\*\*\d+ s\*\*", row), row
    assert re.search(r"warm: [0-9.]+ evaluations per minute", w.stdout), w.stdout
    # The workers' builds over the warm, from the daemon's counters: every evaluation built its
    # candidate, by compiling it or from the build cache.
    builds = re.search(r"Workers' builds: (\d+) compiled \(([0-9.]+) s of compiling\), (\d+) from the build cache", speed)
    assert builds and int(builds.group(1)) + int(builds.group(3)) >= 1, speed
    # The last run's kernels: the process's own ratio beside the worker's best.
    kernels = md.split("## Kernels in the last run", 1)[1].split("## End to end", 1)[0]
    assert "| in process | worker's best |" in kernels, kernels
    row = next(line for line in kernels.splitlines() if "aten::_softmax(float32[16384,3]" in line)
    assert re.search(r"\| [0-9.]+x \| [0-9.]+x \| `aten::_softmax", row), row
    png = (report / "best-speedup.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10000
    print(f"warm took {time.monotonic() - t0:.0f} s")

    ls = json.loads(kforge(build_dir, env, "--cache-dir", str(staging), "cache", "ls", "--json").stdout)
    entries = ls["entries"] if isinstance(ls, dict) else ls
    softmax = [e for e in entries if "_softmax" in json.dumps(e)]
    assert softmax, f"warm left no softmax kernel in the cache: {ls}"

    bundle = tmp_path / "kernels.kfb"
    assert kforge(build_dir, env, "--cache-dir", str(staging), "cache", "export", str(bundle)).returncode == 0
    imp = kforge(build_dir, env, "--cache-dir", str(production), "cache", "import", str(bundle))
    assert imp.returncode == 0, imp.stderr

    # Production: the cache only (the staging daemon still runs at the test's endpoint: --no-daemon
    # must neither use it nor report to it).
    summary = tmp_path / "summary.json"
    r = kforge(build_dir, env, "--cache-dir", str(production), "run", "--no-daemon", "--summary-json", str(summary),
               "--", *workload(tmp_path, 3))
    print(r.stdout, r.stderr, sep="\n")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["max_abs_error"] <= result["bound"], result
    s = json.loads(summary.read_text())
    kernels = [k for k in s["kernels"] if k["signature"].startswith("aten::_softmax(float32[16384,3]")]
    assert kernels and kernels[0]["states"].get("active") == 1, s["kernels"]
    assert kernels[0]["active_calls"] > 0
    assert "nothing was searched" in r.stderr


def test_run_passes_on_exit_status_and_signals(build_dir, env, tmp_path):
    base = ["--cache-dir", str(tmp_path / "cache"), "run", "--no-daemon", "--quiet", "--"]
    r = kforge(build_dir, env, *base, sys.executable, "-c", "import torch, sys; torch.softmax(torch.ones(4, 4), -1); sys.exit(7)")
    assert r.returncode == 7, r.stderr
    r = kforge(build_dir, env, *base, sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert r.returncode == -signal.SIGTERM, (r.returncode, r.stderr)
    r = kforge(build_dir, env, *base, "no-such-program-kforge-test")
    assert r.returncode == 127 and "no-such-program-kforge-test" in r.stderr
    r = kforge(build_dir, env, *base, str(tmp_path))   # a directory: found, cannot be executed
    assert r.returncode == 126, r.stderr
    r = kforge(build_dir, env, "run", "--mode", "fast", "--", "true")
    assert r.returncode == 2 and "--mode" in r.stderr
    r = kforge(build_dir, env, "run")
    assert r.returncode == 2 and "no command" in r.stderr


def test_run_forwards_a_signal_sent_to_kforge(build_dir, env, tmp_path):
    """A supervisor's SIGTERM to kforge reaches the program, which decides how to exit."""
    script = tmp_path / "graceful.py"
    script.write_text(textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))
        print("ready", flush=True)
        time.sleep(60)   # the workload: waits for the signal
    """))
    p = subprocess.Popen([str(build_dir / "tools" / "kforge"), "--cache-dir", str(tmp_path / "cache"), "run",
                          "--no-daemon", "--quiet", "--", sys.executable, str(script)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"   # the handler is installed
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 42, err


def test_run_starts_a_daemon_and_reports(build_dir, env, tmp_path):
    summary = tmp_path / "summary.json"
    r = kforge(build_dir, env, "--cache-dir", str(tmp_path / "cache"), "run", "--mode", "observe",
               "--daemon-arg=--devices", "--daemon-arg=cpu", "--summary-json", str(summary), "--",
               *workload(tmp_path, 1))
    assert r.returncode == 0, r.stderr
    assert "(started now; it keeps running" in r.stderr
    assert "aten::_softmax" in r.stderr
    s = json.loads(summary.read_text())
    assert s["operators"]["aten::_softmax"]["calls"] >= 50
    st = kforge(build_dir, env, "status", "--json")
    assert st.returncode == 0
    sigs = [x["signature"] for x in json.loads(st.stdout)["signatures"]]
    assert any(x.startswith("aten::_softmax(float32[16384,3]") for x in sigs), sigs


def test_demo_runs_on_the_cpu(build_dir, env, tmp_path):
    """`kforge demo` end to end on the CPU backend, with a 30-second search: it prints a measured
    before/after and the output check, and exits 0 only with the output within the criterion."""
    r = kforge(build_dir, env, "demo", "--device", "cpu", "--minutes", "0.5", "--json", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout)   # stdout is the JSON document alone; progress goes to stderr
    assert "demo: cpu, search budget" in r.stderr and "steps, kernels in this process" in r.stderr
    assert res["check"]["passed"] and res["before_median_ms"] > 0 and res["after_median_ms"] > 0
    assert len(res["before_ms"]) == len(res["after_ms"]) >= 10
    assert set(res["operators"]) == {"aten::_softmax", "aten::native_layer_norm"}   # KFORGE_OPS on the CPU
    # The demo's daemon is stopped: nothing answers at its endpoint any more.
    sock = pathlib.Path(env["XDG_STATE_HOME"]) / "kforge" / "demo" / "daemon.sock"
    st = kforge(build_dir, env, "status", "--endpoint", f"ipc://{sock}", "--timeout-ms", "500")
    assert st.returncode == 3, st.stdout + st.stderr
