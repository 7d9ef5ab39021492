"""Honest timings (issue 19, Note [Plausible timing] in search_daemon/worker/measurer.h): a speedup
that the hardware cannot give is never published.

The test plants a slow baseline: the daemon's workers run with a `sitecustomize` that replaces
PyTorch's CPU kernel of aten::_softmax, inside the worker only, by one that computes the same
softmax after sleeping 20 ms, as a descheduled thread at an OpenMP barrier would. Every candidate
the search times then looks about a thousand times faster than "PyTorch". The serving process
(the same model as test_daemon.py's, under the hook) sees PyTorch's real kernel. The daemon must
re-measure, flag every such timing, publish nothing (the cache stays empty, so the process can
never get a kernel), say so once in its log and count it in `kforge status`.
"""
import json
import subprocess

from test_daemon import (Daemon, daemon_bin, hook_path, private_root,  # noqa: F401 (fixtures)
                         softmax_record, start_model)

SLOW_SOFTMAX = '''
import os
if os.environ.get("KFORGE_TEST_SLOW_BASELINE") == "1":
    import time
    import torch
    _lib = torch.library.Library("aten", "IMPL")

    def _slow_softmax(x, dim, half_to_float):
        time.sleep(0.02)
        # The same values, from other operators (aten::_softmax's CPU kernel is this function now).
        e = (x - x.amax(dim, keepdim=True)).exp()
        return e / e.sum(dim, keepdim=True)

    _lib.impl("_softmax", _slow_softmax, "CPU")
'''


def test_a_planted_slow_baseline_is_caught_and_nothing_is_published(daemon_bin, hook_path, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SOFTMAX)
    root = private_root(tmp_path)
    d = Daemon(daemon_bin, root, "--max-evaluations", "3", "--strategy", "greedy", "--set", "search.concurrent_searches=1",
               "--set", "search.min_calls=30")
    d.start(PYTHONPATH=site, KFORGE_TEST_SLOW_BASELINE=1)
    try:
        model = start_model(daemon_bin, hook_path, d, tmp_path, 400, "steady", KFORGE_TEST_GELU=0)
        try:
            st = d.wait_for(lambda s: (softmax_record(s) or {}).get("state") in ("done", "published"), 380,
                            "the softmax search to end")
        finally:
            model.kill()
            model.communicate(timeout=60)
        rec = softmax_record(st)
        # Measured, found implausible, not published.
        assert rec["state"] == "done" and rec["entry"] == "" and rec["best_speedup"] == 0, f"{rec}\n{d.log_text()}"
        assert rec["implausible_timings"] >= 1, f"{rec}\n{d.log_text()}"
        assert st["counters"]["timings_implausible"] >= 1 and st["counters"].get("kernels_published", 0) == 0, st["counters"]
        log = d.log_path.read_text()
        lines = [l for l in log.splitlines() if "an implausible timing of aten::_softmax(float32[4096,3]" in l]
        assert len(lines) == 1, log[-4000:]
        assert "x the cost model's" in lines[0], lines[0]
        # The cache holds nothing for it.
        ls = subprocess.run([str(daemon_bin["kforge"]), "--cache-dir", str(root / "cache"), "cache", "ls", "--json"],
                            capture_output=True, text=True, timeout=60)
        assert ls.returncode == 0 and json.loads(ls.stdout)["entries"] == [], ls.stdout
    finally:
        assert d.stop() == 0, d.log_text()
