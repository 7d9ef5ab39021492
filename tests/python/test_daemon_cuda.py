"""kforged end to end on CUDA, with serving processes on every GPU there is:

Two serving processes run a float16 softmax under the preload shim in KFORGE_MODE=active, one per
GPU when there are two or more (the second on cuda:1, a device index other than 0 in its process),
both on cuda:0 otherwise. One kforged with a kforge-worker on every visible GPU (workers.devices =
auto, no CPU slot) receives the same signature from both, searches it once with the template
proposer, publishes the verified winner, and both still-running processes load, shadow and activate
that same entry. Their outputs meet the accuracy criterion against plain PyTorch on the same GPU,
computed here. While they run, `kforge status --json` shows which slot's GPU each one uses (GPU
UUIDs from the hooks' reports), and every timing run made on a GPU a serving process was using is
flagged (counters.timings_on_shared_gpu, the signature's shared_gpu_timings).

Processes synchronize through the daemon's status and the hook's stats, polled with deadlines; the
serving processes keep running until the parent creates their stop file.
"""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from test_daemon import Daemon, daemon_bin, hook_path, private_root, read_journals  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPE = (4096, 4096)   # float16: the template library's row softmax beats PyTorch's here on H200

MODEL = textwrap.dedent("""
    import ctypes, json, os, sys, time
    import torch
    lib = ctypes.CDLL(os.environ["KFORGE_TEST_HOOK"])
    lib.kforge_hook_stats_json.restype = ctypes.c_char_p
    def softmax_state():
        for s in json.loads(lib.kforge_hook_stats_json())["signatures"]:
            if s["op"] == "aten::_softmax":
                return s
        return None
    devices = [torch.device(d) for d in os.environ["KFORGE_TEST_DEVICE"].split(",")]   # a model split over them
    torch.manual_seed(int(os.environ["KFORGE_TEST_SEED"]))
    deadline = time.monotonic() + float(os.environ["KFORGE_TEST_SECONDS"])
    stop = os.environ["KFORGE_TEST_STOP"]
    saved, i = [], 0
    with torch.inference_mode():
        while time.monotonic() < deadline and not os.path.exists(stop):
            for device in devices:
                x = torch.randn(%r, dtype=torch.float16, device=device)
                y = torch.softmax(x, -1)
            i += 1
            if not saved and i %% 20 == 0:
                for device in devices:
                    torch.cuda.synchronize(device)
                s = softmax_state()
                if s and s["state"] == "active" and s["active_calls"] >= 40 * len(devices):
                    xs = [(str(device), torch.randn(%r, dtype=torch.float16, device=device) * 4)
                          for device in devices for _ in range(2)]
                    saved = [(d, x.cpu(), torch.softmax(x, -1).cpu()) for d, x in xs]
                    torch.save(saved, os.environ["KFORGE_TEST_OUT"])
                    print("ACTIVE", flush=True)
            if saved:
                time.sleep(0.01)   # keep the GPU in use at a low rate until the parent says stop
    for device in devices:
        torch.cuda.synchronize(device)
    print("RESULT " + json.dumps({"iterations": i, "devices": [str(d) for d in devices], "saved": len(saved),
                                  "stats": json.loads(lib.kforge_hook_stats_json())}), flush=True)
""" % (SHAPE, SHAPE))


def criterion_ok(x, y, device):
    """Note [Accuracy criterion] against plain PyTorch on the same GPU, here without the hook."""
    x, y = x.to(device), y.to(device)
    plain = torch.softmax(x, -1)
    ref = torch.softmax(x.double(), -1)
    eps = torch.finfo(torch.float16).eps
    err_c = (y.double() - ref).abs().max().item()
    err_t = (plain.double() - ref).abs().max().item()
    rel_c = ((y.double() - ref).norm() / ref.norm()).item()
    rel_t = ((plain.double() - ref).norm() / ref.norm()).item()
    ok = (y.dtype == plain.dtype and y.shape == plain.shape and y.stride() == plain.stride()
          and err_c <= 2 * err_t + 8 * eps * ref.abs().max().item() and rel_c <= 2 * rel_t + 8 * eps)
    return ok, (err_c, err_t, rel_c, rel_t)


def softmax_record(status):
    return next((s for s in status["signatures"] if s["signature"].startswith("aten::_softmax(float16[4096,4096]")), None)


def start_serving(bins, hook, daemon, out, stop, device, seed):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k != "LD_PRELOAD"}
    env.update({"LD_PRELOAD": str(bins["shim"]), "KFORGE_HOOK_DIR": str(hook.parent), "KFORGE_MODE": "active",
                "KFORGE_DAEMON_ENDPOINT": daemon.endpoint, "KFORGE_CACHE_DIR": str(daemon.root / "cache"),
                "KFORGE_REPORT_INTERVAL_MS": "200", "KFORGE_SAMPLE_RATE": "4", "KFORGE_TEST_HOOK": str(hook),
                "KFORGE_TEST_SECONDS": "540", "KFORGE_TEST_DEVICE": device, "KFORGE_TEST_SEED": str(seed),
                "KFORGE_TEST_OUT": str(out), "KFORGE_TEST_STOP": str(stop)})
    return subprocess.Popen([sys.executable, "-c", MODEL], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("layout", ["process_per_gpu", "split_model"])
def test_serving_processes_on_every_gpu_share_one_search_and_activate_its_winner(daemon_bin, hook_path, tmp_path, layout):
    gpus = torch.cuda.device_count()
    if layout == "split_model":
        # One process whose model runs on two GPUs (the same softmax on each), beside one on cuda:0:
        # the entry is loaded on both devices of the split process and active on both.
        if gpus < 2:
            pytest.skip("a model split across GPUs needs two")
        devices = ["cuda:0,cuda:1", "cuda:0"]
    else:
        devices = ["cuda:0", "cuda:1"] if gpus >= 2 else ["cuda:0", "cuda:0"]
    root = private_root(tmp_path)
    d = Daemon(daemon_bin, root, "--max-evaluations", "6", "--set", "search.concurrent_searches=1")
    at = d.args.index("--devices")
    d.args[at:at + 4] = ["--devices", "auto", "--cpu-slots", "0"]   # a worker on every visible GPU
    d.start()
    stop = tmp_path / "stop"
    procs = []
    try:
        st = d.status()
        assert len(st["slots"]) == gpus and all(s["device"].startswith("cuda:") for s in st["slots"]), st["slots"]
        assert all(s["uuid"].startswith("GPU-") for s in st["slots"]), st["slots"]
        procs = [start_serving(daemon_bin, hook_path, d, tmp_path / f"out{i}.pt", stop, dev, seed=i)
                 for i, dev in enumerate(devices)]
        pids = [p.pid for p in procs]

        # Both activate, then the daemon's view while they still run.
        deadline = time.monotonic() + 480
        while not all((tmp_path / f"out{i}.pt").exists() for i in range(len(procs))):
            for p in procs:
                if p.poll() is not None:
                    out, err = p.communicate()
                    raise AssertionError(f"a serving process exited early ({p.returncode}):\n{out}\n{err[-4000:]}\n{d.log_text()}")
            assert time.monotonic() < deadline, f"not both active in time; status {json.dumps(d.status())[:3000]}\n{d.log_text()}"
            time.sleep(0.5)   # poll interval of a deadline-bound wait
        st = d.wait_for(lambda s: sorted(p for slot in s["slots"] for p in slot["serving_pids"])
                        == sorted(p for p, dev in zip(pids, devices) for _ in dev.split(",")),
                        60, "every serving process seen on its GPUs' slots")
        by_pid = {p["pid"]: p for p in st["processes"]}
        for pid, dev in zip(pids, devices):
            used = dev.split(",")
            slots_used = [s for s in st["slots"] if pid in s["serving_pids"]]
            assert sorted(s["device"] for s in slots_used) == sorted(used), (pid, dev, slots_used)   # same GPU order
            assert all(s["uuid"] in by_pid[pid]["gpus"] for s in slots_used), (pid, slots_used, by_pid[pid])
        d.wait_for(lambda s: (softmax_record(s) or {}).get("state") in ("published", "done"), 300, "the search to end")
    finally:
        stop.touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            results.append((p.returncode, out, err))
        final = d.status()
        assert d.stop() == 0, d.log_text()

    # One search for the signature both reported, its winner active in both.
    rec = softmax_record(final)
    assert rec and rec["state"] == "published" and rec["best_speedup"] > 1, (rec, d.log_text())
    assert rec["evaluations"] <= 6
    assert sum(1 for s in final["signatures"] if s["signature"] == rec["signature"]) == 1
    try:
        import msgpack  # noqa: F401
    except ImportError:
        msgpack = None   # a GPU host's python may lack it: the journal is then not read back
    if msgpack:
        journals = read_journals(root / "state")
        assert rec["id"] + ".kfj" in journals
        for _, (nodes, outcomes) in journals.items():
            assert all(len(v) == 1 for v in outcomes.values())   # nothing evaluated twice
    for (code, out, err), dev, i in zip(results, devices, range(len(results))):
        assert code == 0, out + err[-4000:]
        res = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][len("RESULT "):])
        sm = next(s for s in res["stats"]["signatures"] if s["op"] == "aten::_softmax")
        assert sm["state"] == "active" and sm["entry"] == rec["entry"], (sm, rec)
        assert sm["fallbacks"] == 0 and sm["shadow_calls"] >= 20, sm
        saved = torch.load(tmp_path / f"out{i}.pt")
        assert sorted({on for on, _, _ in saved}) == sorted(dev.split(","))
        for on, x, y in saved:
            ok, errs = criterion_ok(x, y, on)
            assert ok, (on, errs)

    # Every timing ran on a GPU a serving process was using: flagged, counted, logged.
    assert rec["shared_gpu_timings"] >= 1, rec
    assert final["counters"].get("timings_on_shared_gpu", 0) >= rec["shared_gpu_timings"], final["counters"]
    assert "shared the GPU with serving pid" in d.log_text()
