"""Hot swap on the CPU backend: the hook loads a cache entry, shadows it, activates or quarantines it.

The cache entry is made here: a hand-written CPU softmax kernel (runtime/cpu_kernel_abi.h: one
block per row, float32, last dim, contiguous) compiled with the system compiler, and published by
kforge-publish-test-entry (tests/support/publish_test_entry.h). The signature it is published for
is the exact one the hook reports in observe mode (its canonical encoding, from
kforge_hook_stats_json), so the test never re-derives the hook's encoding; the torch version is
the hook's own, which is what its loader compares.

Each scenario runs in fresh subprocesses with the hook loaded through ctypes after `import torch`
(as in test_hook_observe.py); the parent compares the children's outputs with plain PyTorch.
Processes synchronize with kforge_hook_report_now (a loader round) and their exit, never sleeps.
These tests are about the state machine, and the test kernel (double accumulation, scalar exp) is
slower than PyTorch's: they set KFORGE_CONFIRM_WIN=0 (test_hook_upgrade.py tests the in-process
check, Note [In-process win] in swapper.h).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import types

import pytest
import torch

TORCH_MM = ".".join(torch.__version__.split("+")[0].split(".")[:2])

PRELUDE = textwrap.dedent(
    """
    import ctypes, json, os, sys
    import torch
    HOOK = os.environ.get("KFORGE_TEST_HOOK")
    lib = ctypes.CDLL(HOOK)
    lib.kforge_hook_stats_json.restype = ctypes.c_char_p
    lib.kforge_hook_report_now.argtypes = [ctypes.c_int]
    def stats():
        return json.loads(lib.kforge_hook_stats_json())
    def softmax_sig(s):
        return [x for x in s["signatures"] if x["op"] == "aten::_softmax"]
    def emit(obj):
        print("RESULT " + json.dumps(obj), flush=True)
    """
)

KERNEL = r"""
#include <cmath>
#include <cstdint>
#include "runtime/cpu_kernel_abi.h"
#ifndef KFORGE_TEST_SCALE
#define KFORGE_TEST_SCALE 1.0
#endif
// One block per row of a contiguous float32 matrix; softmax over the last dimension, accumulated
// in double.
extern "C" void softmax_rows(const kforge_cpu_block* b, void* const* params) {
  const float* x = *(const float* const*)params[0];
  float* y = *(float* const*)params[1];
  const int64_t cols = *(const int64_t*)params[2];
  const float* xr = x + (int64_t)b->block_idx[0] * cols;
  float* yr = y + (int64_t)b->block_idx[0] * cols;
  double m = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
  double s = 0;
  for (int64_t c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
  for (int64_t c = 0; c < cols; ++c) yr[c] = (float)(std::exp((double)xr[c] - m) / s * KFORGE_TEST_SCALE);
}
"""

# The model: softmax over the last dim of float32 [64, 1000] contiguous tensors. The first call
# lets the hook see the signature; report_now runs a loader round (the entry is loaded then); the
# next CALLS calls go through shadow/active. Inputs and outputs are saved for the parent.
MODEL = """
torch.manual_seed(0)
xs = [torch.randn(64, 1000) * (1 + i % 3) for i in range(CALLS + 1)]
ys = [torch.softmax(xs[0], -1)]
lib.kforge_hook_report_now(20000)
marker_during = None
s0 = stats()
for i, x in enumerate(xs[1:]):
    ys.append(torch.softmax(x, -1))
    if i == 0 and s0["swap"]["cache_dir"]:
        d = os.path.join(s0["swap"]["cache_dir"], "trial")
        marker_during = sorted(os.listdir(d)) if os.path.isdir(d) else []
lib.kforge_hook_report_now(20000)   # quarantines and marker removals happen on this round
torch.save({"xs": xs, "ys": ys}, os.environ["KFORGE_TEST_OUT"])
emit({"stats": stats(), "after_load": s0, "marker_during": marker_during})
"""


def softmax_sig(s):
    return [x for x in s["signatures"] if x["op"] == "aten::_softmax"]


def child_env(hook, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k != "LD_PRELOAD"}
    # A private (0700) directory nobody serves: the hook refuses socket directories others can write.
    env["KFORGE_DAEMON_ENDPOINT"] = f"ipc://{tempfile.mkdtemp(prefix='kforge-nobody-')}/daemon.sock"
    env["KFORGE_TEST_HOOK"] = str(hook)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_child(body, env, timeout=240, expect_rc=0):
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == expect_rc, proc.stdout + proc.stderr
    results = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return (json.loads(results[-1]) if results else None), proc.stderr


@pytest.fixture(scope="module")
def hook_path(build_dir):
    p = build_dir / "interposer" / "hook" / f"libkforge_hook-torch{TORCH_MM}.so"
    if not p.exists():
        pytest.fail(f"no hook at {p}: build the kforge_hook target")
    return p


KERNEL_LAUNCH = "entry=softmax_rows;grid=numel0 / size0_1,1,1;block=1,1,1;smem=0;args=input:0,output:0,size:size0_1:i64"
KERNEL_FLAGS = {"good": ["-O2"], "wrong": ["-O2", "-DKFORGE_TEST_SCALE=1.01"]}


@pytest.fixture(scope="module")
def tools(publish_tool, kernel_include_dir, tmp_path_factory):
    """Both kernels compiled (the right one, and one that is 1% off), and the publishing tool."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("swap-tools")
    (d / "kernel.cc").write_text(KERNEL)
    for name, flags in KERNEL_FLAGS.items():
        r = subprocess.run([cxx, "-shared", "-fPIC", f"-I{kernel_include_dir}", *flags, "-o", str(d / f"{name}.so"),
                            str(d / "kernel.cc")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    return types.SimpleNamespace(dir=d, publish=publish_tool)


@pytest.fixture(scope="module")
def softmax_signature(hook_path):
    """The hook's own canonical encoding of softmax(float32[64,1000], -1), from an observe run."""
    s, _ = run_child("""
        x = torch.randn(64, 1000)
        torch.softmax(x, -1)
        emit(stats())
    """, child_env(hook_path))
    sigs = [x for x in s["signatures"] if x["op"] == "aten::_softmax"]
    assert len(sigs) == 1, s["signatures"]
    return dict(sigs[0], torch_version=s["torch_version"])


def make_cache(tmp_path, tools, signature, kernel):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    r = subprocess.run([str(tools.publish), "--cache", str(cache), "--signature", signature["encoding"],
                        "--backend", "cpu", "--source", str(tools.dir / "kernel.cc"),
                        "--so", str(tools.dir / f"{kernel}.so"), "--entry", "softmax_rows",
                        "--launch", KERNEL_LAUNCH, "--output", "like:0",
                        "--torch-version", signature["torch_version"],
                        *[f"--compile-option={o}" for o in KERNEL_FLAGS[kernel]]],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) == 32, r.stdout
    return cache, r.stdout.strip()


def cache_show(build_dir, cache, key):
    r = subprocess.run([str(build_dir / "tools" / "kforge"), "--cache-dir", str(cache), "cache", "show", key,
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def run_model(hook_path, tmp_path, cache, calls, **env):
    out = tmp_path / "out.pt"
    res, err = run_child(MODEL.replace("CALLS", str(calls)),
                         child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_TEST_OUT=out, **env))
    data = torch.load(out)
    return res, err, data["xs"], data["ys"]


def criterion_ok(x, y):
    """Note [Shadow comparison] against plain PyTorch in this (hook-free) process."""
    plain = torch.softmax(x, -1)
    ref = torch.softmax(x.double(), -1)
    eps = torch.finfo(torch.float32).eps
    err_c = (y.double() - ref).abs().max().item()
    err_t = (plain.double() - ref).abs().max().item()
    rel_c = ((y.double() - ref).norm() / ref.norm()).item()
    rel_t = ((plain.double() - ref).norm() / ref.norm()).item()
    return (y.dtype == plain.dtype and y.shape == plain.shape and y.stride() == plain.stride()
            and err_c <= 2 * err_t + 8 * eps * ref.abs().max().item() and rel_c <= 2 * rel_t + 8 * eps)


PARTIAL = """
torch.manual_seed(0)
x, g = torch.randn(64, 1000), torch.randn(64, 1000)
torch.softmax(x, -1)                 # first sight: the next round loads the softmax entry
lib.kforge_hook_report_now(20000)
for _ in range(1600):
    torch.softmax(x, -1)
    torch.nn.functional.gelu(g)
emit({"stats": stats()})
"""


def test_only_the_operator_with_a_replacement_is_observed_on_every_call(hook_path, tools, softmax_signature,
                                                                         tmp_path):
    # Note [Observed calls]: the loaded softmax entry makes every softmax call observed (a hit may
    # come on any of them); gelu, with no entry, stays at about one call in 16. KFORGE_SAMPLE_RATE=1
    # times every observed miss, so sampled_calls counts them.
    cache, _ = make_cache(tmp_path, tools, softmax_signature, "good")
    res, err = run_child(PARTIAL, child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0,
                                            KFORGE_SAMPLE_RATE=1))
    s = res["stats"]
    (sig,) = softmax_sig(s)
    assert sig["state"] == "active", (sig, err)
    assert sig["calls"] == 1601 and sig["shadow_calls"] + sig["active_calls"] == 1600, sig
    (gelu,) = [x for x in s["signatures"] if x["op"] == "aten::gelu"]
    assert 1600 - 31 < gelu["calls"] <= 1600, gelu
    assert 60 <= gelu["sampled_calls"] <= 150, gelu       # 1600 / 16 = 100


def test_good_entry_goes_shadow_then_active(hook_path, build_dir, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    res, err, xs, ys = run_model(hook_path, tmp_path, cache, 40, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0)
    s = res["stats"]
    assert s["mode"] == "active" and "not yet implemented" not in err, err
    # Loaded by the round report_now asked for: shadow, with its trial marker written.
    (loaded,) = softmax_sig(res["after_load"])
    assert loaded["state"] == "shadow" and loaded["entry"] == key
    assert res["marker_during"] == [key]
    (sig,) = softmax_sig(s)
    assert sig["id"] == softmax_signature["id"]
    assert sig["state"] == "active", (sig, err)
    assert sig["shadow_calls"] == 20 and sig["clean_shadow_calls"] == 20
    assert sig["active_calls"] == 20 and sig["fallbacks"] == 0
    assert sig["calls"] == 41
    # Shadow calls return PyTorch's result exactly; every call meets the accuracy criterion.
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i <= 20:
            assert torch.equal(y, torch.softmax(x, -1)), i
        assert criterion_ok(x, y), i
    # The active calls really ran the replacement (double accumulation: not bitwise PyTorch's).
    assert any(not torch.equal(y, torch.softmax(x, -1)) for x, y in zip(xs[21:], ys[21:]))
    assert not os.listdir(cache / "trial"), "the marker is removed once the trial passed"
    assert json.loads(cache_show(build_dir, cache, key))["state"] == "active"


def test_wrong_entry_is_quarantined_after_one_shadow_call(hook_path, build_dir, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "wrong")
    res, err, xs, ys = run_model(hook_path, tmp_path, cache, 30, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0)
    (sig,) = softmax_sig(res["stats"])
    assert sig["state"] == "disabled", sig
    assert sig["shadow_calls"] == 1 and sig["active_calls"] == 0 and sig["clean_shadow_calls"] == 0
    assert "max abs error" in sig["reason"]
    assert res["stats"]["swap"]["quarantined"] == 1
    assert err.count(f"entry {key}") == 1 and "quarantined in the cache" in err, err
    for i, (x, y) in enumerate(zip(xs, ys)):
        assert torch.equal(y, torch.softmax(x, -1)), i
    shown = json.loads(cache_show(build_dir, cache, key))
    assert shown["state"] == "quarantined" and "shadow mismatch" in shown["reason"]
    text = subprocess.run([str(build_dir / "tools" / "kforge"), "--cache-dir", str(cache), "cache", "show", key],
                          capture_output=True, text=True, check=True).stdout
    assert "quarantined (shadow mismatch" in text
    assert not os.listdir(cache / "trial")


def test_observe_mode_never_loads(hook_path, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "wrong")
    res, err, xs, ys = run_model(hook_path, tmp_path, cache, 10, KFORGE_MODE="observe")
    s = res["stats"]
    (sig,) = softmax_sig(s)
    assert s["mode"] == "observe" and sig["state"] == "observe" and "entry" not in sig
    assert not s["swap"]["enabled"] and s["swap"]["entries"] == []
    assert not (cache / "trial").exists()
    for x, y in zip(xs, ys):
        assert torch.equal(y, torch.softmax(x, -1))


def test_shadow_mode_never_activates(hook_path, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    res, err, xs, ys = run_model(hook_path, tmp_path, cache, 25, KFORGE_MODE="shadow", KFORGE_CONFIRM_WIN=0, KFORGE_SHADOW_CALLS=5)
    (sig,) = softmax_sig(res["stats"])
    assert sig["state"] == "shadow" and sig["shadow_calls"] == 25 and sig["active_calls"] == 0
    for x, y in zip(xs, ys):
        assert torch.equal(y, torch.softmax(x, -1))
    assert not os.listdir(cache / "trial"), "trial passed after 5 clean calls: marker removed"


def test_process_killed_during_trial_quarantines_entry(hook_path, build_dir, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    env = child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0, KFORGE_SHADOW_CALLS=1000)
    # A process that exits normally in the middle of its trial removes its marker: not a crash.
    res, _ = run_child("""
        x = torch.randn(64, 1000)
        torch.softmax(x, -1)
        lib.kforge_hook_report_now(20000)
        torch.softmax(x, -1)
        emit({"state": softmax_sig(stats())[0]["state"], "markers": os.listdir(os.environ["KFORGE_CACHE_DIR"] + "/trial")})
    """, env)
    assert res == {"state": "shadow", "markers": [key]}
    assert os.listdir(cache / "trial") == []
    # A process that dies (SIGKILL) while its entry is in shadow leaves its marker behind.
    run_child("""
        x = torch.randn(64, 1000)
        torch.softmax(x, -1)
        lib.kforge_hook_report_now(20000)
        for _ in range(3):
            torch.softmax(x, -1)
        assert softmax_sig(stats())[0]["state"] == "shadow"
        os.kill(os.getpid(), 9)
    """, env, expect_rc=-signal.SIGKILL)
    assert os.listdir(cache / "trial") == [key]
    assert json.loads(cache_show(build_dir, cache, key))["state"] == "active"
    # The next process quarantines that entry on its first loader round and never uses it.
    res, err = run_child("""
        x = torch.randn(64, 1000)
        y = torch.softmax(x, -1)
        lib.kforge_hook_report_now(20000)
        y2 = torch.softmax(x, -1)
        emit({"stats": stats(), "same": torch.equal(y, y2)})
    """, env)
    s = res["stats"]
    assert s["swap"]["markers_quarantined"] == 1, err
    assert softmax_sig(s)[0]["state"] == "observe"
    assert "died during its trial" in err
    assert not os.listdir(cache / "trial")
    shown = json.loads(cache_show(build_dir, cache, key))
    assert shown["state"] == "quarantined" and shown["reason"] == "process died during trial"


def test_threads_share_one_trial(hook_path, tools, softmax_signature, tmp_path):
    """Several threads calling through shadow into active: every call accounted for, all correct."""
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    out = tmp_path / "threads.pt"
    res, err = run_child("""
        import threading
        torch.manual_seed(0)
        x0 = torch.randn(64, 1000)
        torch.softmax(x0, -1)
        lib.kforge_hook_report_now(20000)
        xs = [torch.randn(64, 1000) for _ in range(4)]
        ys = [[] for _ in range(4)]
        def work(i):
            for _ in range(50):
                ys[i].append(torch.softmax(xs[i], -1))
        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts: t.start()
        for t in ts: t.join()
        torch.save({"xs": xs, "ys": ys}, os.environ["KFORGE_TEST_OUT"])
        emit(stats())
    """, child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0, KFORGE_TEST_OUT=out))
    (sig,) = softmax_sig(res)
    assert sig["state"] == "active" and sig["fallbacks"] == 0, (sig, err)
    assert sig["shadow_calls"] >= 20 and sig["shadow_calls"] + sig["active_calls"] == 200
    assert sig["calls"] == 201
    data = torch.load(out)
    for x, ys in zip(data["xs"], data["ys"]):
        assert len(ys) == 50 and all(criterion_ok(x, y) for y in ys)


# ---- entries the daemon announces (Note [Daemon notices] in swapper.h) ----------------------------

# Stays alive across several steps the test drives through stdin: each line read is a step.
NOTICED = """
import time
torch.manual_seed(0)
x = torch.randn(64, 1000)
want = torch.softmax(x, -1)
def step():
    notices = int(sys.stdin.readline())   # the test's go-ahead: how many notices it has sent
    # The client thread delivers notices asynchronously, and each one wakes a loader round:
    # wait round by round (each report_now returns when a round has finished) until they are in.
    deadline = time.monotonic() + 30
    while stats()["swap"]["notices"] < notices and time.monotonic() < deadline:
        lib.kforge_hook_report_now(1000)
    lib.kforge_hook_report_now(20000)    # a loader round after the last notice arrived
    ys = [torch.softmax(x, -1) for _ in range(30)]
    emit({"stats": stats(), "exact": [bool(torch.equal(y, want)) for y in ys]})
torch.softmax(x, -1)                      # first sight: nothing in the cache yet
lib.kforge_hook_report_now(20000)
emit({"stats": stats()})
step()                                    # after KernelReady: shadow, then active
step()                                    # after Revoke: PyTorch's kernel again
sys.stdin.read()
"""


def test_kernel_ready_loads_a_new_entry_and_revoke_removes_it(hook_path, tools, softmax_signature, tmp_path):
    zmq = pytest.importorskip("zmq")
    msgpack = pytest.importorskip("msgpack")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    d = tempfile.mkdtemp(prefix="kf-")
    endpoint = f"ipc://{d}/daemon.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    env = child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_DAEMON_ENDPOINT=endpoint, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0,
                    KFORGE_SHADOW_CALLS=5, KFORGE_LOG=1)
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(NOTICED)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result():
        line = proc.stdout.readline()
        assert line.startswith("RESULT "), line + proc.stderr.read()
        return json.loads(line[len("RESULT "):])

    def hook_identity():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if router.poll(timeout=500):
                ident, _ = router.recv_multipart()
                return ident
        raise AssertionError("the hook never connected")

    def send(ident, mtype, body):
        router.send_multipart([ident, msgpack.packb(["kforge", 1, mtype, body], use_bin_type=True)])

    try:
        first = result()
        (sig,) = softmax_sig(first["stats"])
        assert sig["state"] == "observe"
        ident = hook_identity()
        # The daemon publishes a verified entry, then tells the hook.
        r = subprocess.run([str(tools.publish), "--cache", str(cache), "--signature", sig["encoding"],
                            "--backend", "cpu", "--source", str(tools.dir / "kernel.cc"),
                            "--so", str(tools.dir / "good.so"), "--entry", "softmax_rows",
                            "--launch", KERNEL_LAUNCH, "--output", "like:0",
                            "--torch-version", softmax_signature["torch_version"],
                            *[f"--compile-option={o}" for o in KERNEL_FLAGS["good"]]],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        key = r.stdout.strip()
        sig_id = bytes.fromhex(sig["id"])
        send(ident, 5, [sig_id, bytes(16), key, 1.5])                      # KernelReady
        proc.stdin.write("1\n")
        proc.stdin.flush()
        ready = result()
        (s,) = softmax_sig(ready["stats"])
        assert s["entry"] == key and s["state"] == "active", s
        assert s["shadow_calls"] == 5 and s["active_calls"] == 25, s
        assert ready["exact"][:5] == [True] * 5                              # shadow: PyTorch's result
        # Revoke: the hook drops it at once, without touching the cache.
        send(ident, 6, [sig_id, key, "found slower on this host"])           # Revoke
        proc.stdin.write("2\n")
        proc.stdin.flush()
        revoked = result()
        (s,) = softmax_sig(revoked["stats"])
        assert s["state"] == "disabled" and s["reason"] == "revoked by the daemon: found slower on this host", s
        assert s["active_calls"] == 25 and all(revoked["exact"])
        assert revoked["stats"]["swap"]["quarantined"] == 0
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        router.close()
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "is ready (daemon)" in err and "revoked by the daemon" in err, err


# ---- a Python number read at each call (Note [Tensor values] in runtime/kernel_spec.cc) --------------

VALUE_KERNEL = r"""
#include <cstdint>
#include "runtime/cpu_kernel_abi.h"
// y = x * s over a contiguous float32 tensor; s is the value of the call's 0-dimensional operand.
extern "C" void mul_value(const kforge_cpu_block* b, void* const* params) {
  (void)b;
  const float* x = *(const float* const*)params[0];
  const float s = *(const float*)params[1];
  float* y = *(float* const*)params[2];
  const int64_t n = *(const int64_t*)params[3];
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}
"""

VALUE_MODEL = """
torch.manual_seed(0)
x = torch.randn(64, 1000)
x * 0.5                                 # first sight
lib.kforge_hook_report_now(20000)       # loads the entry
values = [0.5, -3.0, 1e-3, 7.25, 0.1]
ys = [x * values[i % len(values)] for i in range(40)]
torch.save({"x": x, "values": values, "ys": ys}, os.environ["KFORGE_TEST_OUT"])
emit({"stats": stats()})
"""


def test_one_entry_serves_every_number_of_x_times_a_number(hook_path, build_dir, publish_tool, kernel_include_dir,
                                                           tmp_path):
    # `x * v` is mul.Tensor(x, v as a 0-dimensional float64 CPU tensor): v is not in the signature,
    # so one signature (and one entry) covers every v, and the entry must read v at each call.
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "value.cc").write_text(VALUE_KERNEL)
    r = subprocess.run([cxx, "-shared", "-fPIC", f"-I{kernel_include_dir}", "-O2", "-o", str(tmp_path / "value.so"),
                        str(tmp_path / "value.cc")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s, _ = run_child("""
        x = torch.randn(64, 1000)
        x * 0.5
        x * -2.0
        emit(stats())
    """, child_env(hook_path, KFORGE_OBSERVE_EVERY=1))
    sigs = [x for x in s["signatures"] if x["signature"].startswith("aten::mul")]
    assert len(sigs) == 1 and sigs[0]["calls"] == 2, s["signatures"]
    assert "float64[]" in sigs[0]["signature"], sigs[0]
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    r = subprocess.run([str(publish_tool), "--cache", str(cache), "--signature", sigs[0]["encoding"],
                        "--backend", "cpu", "--source", str(tmp_path / "value.cc"), "--so", str(tmp_path / "value.so"),
                        "--entry", "mul_value", "--launch",
                        "entry=mul_value;grid=1,1,1;block=1,1,1;smem=0;args=input:0,value:1:f32,output:0,size:numel0:i64",
                        "--output", "like:0", "--torch-version", s["torch_version"], "--compile-option=-O2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.pt"
    res, err = run_child(VALUE_MODEL, child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_TEST_OUT=out,
                                                KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0))
    (sig,) = [x for x in res["stats"]["signatures"] if x["signature"].startswith("aten::mul")]
    assert sig["state"] == "active", (sig, err)
    assert sig["shadow_calls"] == 20 and sig["clean_shadow_calls"] == 20 and sig["active_calls"] == 20, sig
    data = torch.load(out)
    for i, y in enumerate(data["ys"]):
        v = data["values"][i % len(data["values"])]
        assert torch.equal(y, data["x"] * v), (i, v)   # one float multiply: PyTorch's exact result


CAT_KERNEL = r"""
#include <cstdint>
#include <cstring>
#include "runtime/cpu_kernel_abi.h"
// cat([a, b], 1) of two contiguous float32 [rows, 8] tensors into [rows, 16]. The list's elements
// are inputs 2 and 3 (after cat's two arguments: Note [List inputs] in runtime/kernel_spec.cc).
extern "C" void cat_two(const kforge_cpu_block* blk, void* const* params) {
  (void)blk;
  const float* a = *(const float* const*)params[0];
  const float* b = *(const float* const*)params[1];
  float* y = *(float* const*)params[2];
  const int64_t rows = *(const int64_t*)params[3];
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(y + r * 16, a + r * 8, 8 * sizeof(float));
    std::memcpy(y + r * 16 + 8, b + r * 8, 8 * sizeof(float));
  }
}
"""

CAT_MODEL = """
torch.manual_seed(0)
a, b = torch.randn(4, 8), torch.randn(4, 8)
torch.cat([a, b], 1)                    # first sight
lib.kforge_hook_report_now(20000)       # loads the entry
pairs = [(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(40)]
ys = [torch.cat([p, q], 1) for p, q in pairs]
torch.save({"pairs": pairs, "ys": ys}, os.environ["KFORGE_TEST_OUT"])
emit({"stats": stats()})
"""


def test_an_entry_for_cat_reads_the_tensors_of_its_list(hook_path, build_dir, publish_tool, kernel_include_dir,
                                                         tmp_path):
    # cat's inputs are the elements of a tensor list: the swap call passes their data pointers after
    # one slot per argument, and the entry's input bindings 2 and 3 name them.
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "cat.cc").write_text(CAT_KERNEL)
    r = subprocess.run([cxx, "-shared", "-fPIC", f"-I{kernel_include_dir}", "-O2", "-o", str(tmp_path / "cat.so"),
                        str(tmp_path / "cat.cc")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s, _ = run_child("""
        torch.cat([torch.randn(4, 8), torch.randn(4, 8)], 1)
        emit(stats())
    """, child_env(hook_path, KFORGE_OBSERVE_EVERY=1))
    (sig,) = [x for x in s["signatures"] if x["signature"].startswith("aten::cat")]
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    r = subprocess.run([str(publish_tool), "--cache", str(cache), "--signature", sig["encoding"],
                        "--backend", "cpu", "--source", str(tmp_path / "cat.cc"), "--so", str(tmp_path / "cat.so"),
                        "--entry", "cat_two", "--launch",
                        "entry=cat_two;grid=1,1,1;block=1,1,1;smem=0;args=input:2,input:3,output:0,size:4:i64",
                        "--output", "explicit:float32:4,16:16,1", "--torch-version", s["torch_version"],
                        "--compile-option=-O2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.pt"
    res, err = run_child(CAT_MODEL, child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_TEST_OUT=out,
                                              KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0))
    (sig,) = [x for x in res["stats"]["signatures"] if x["signature"].startswith("aten::cat")]
    assert sig["state"] == "active", (sig, err)
    assert sig["clean_shadow_calls"] == sig["shadow_calls"] > 0 and sig["active_calls"] > 0, sig
    data = torch.load(out)
    for (p, q), y in zip(data["pairs"], data["ys"]):
        assert torch.equal(y, torch.cat([p, q], 1))


ADD_INPLACE_KERNEL = r"""
#include <cstdint>
#include "runtime/cpu_kernel_abi.h"
// add_.Tensor(self, other, alpha) of two contiguous float32 tensors of n elements: self += alpha * other,
// written through self's own pointer (the plan's output 0 is argument 0, in place).
extern "C" void add_in_place(const kforge_cpu_block* blk, void* const* params) {
  (void)blk;
  const float* self = *(const float* const*)params[0];
  const float* other = *(const float* const*)params[1];
  const float alpha = *(const float*)params[2];
  float* out = *(float* const*)params[3];
  const int64_t n = *(const int64_t*)params[4];
  for (int64_t i = 0; i < n; ++i) out[i] = self[i] + alpha * other[i];
}
"""

INPLACE_MODEL = """
torch.manual_seed(0)
x, y = torch.randn(4, 8), torch.randn(4, 8)
x.add_(y)                               # first sight
lib.kforge_hook_report_now(20000)       # loads the entry
res = {"same_object": [], "versions": [], "pairs": [], "results": []}
for i in range(40):
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    a0, v0 = a.clone(), a._version
    r = a.add_(b)
    res["same_object"].append(r is a)
    res["versions"].append(a._version - v0)
    res["pairs"].append((a0, b))
    res["results"].append(a.clone())
# Through a view: the rows 4..7 of a bigger tensor (its data pointer is past the storage's start).
base = torch.randn(8, 8)
base0, b = base.clone(), torch.randn(4, 8)
base[4:].add_(b)
res["view"] = (base0, b, base.clone())
# self as other, exactly: the entry (active) reads each element before writing it.
z = torch.randn(4, 8)
z0 = z.clone()
z.add_(z)
res["aliased"] = (z0, z.clone())
# Partial overlap is PyTorch's to refuse, hooked or not.
big = torch.randn(8, 8)
try:
    big[0:4].add_(big[2:6])
    res["partial"] = "no error"
except RuntimeError as e:
    res["partial"] = str(e).splitlines()[0]
torch.save(res, os.environ["KFORGE_TEST_OUT"])
emit({"stats": stats()})
"""


def test_an_in_place_entry_writes_self_through_its_views_and_returns_it(hook_path, build_dir, publish_tool,
                                                                        kernel_include_dir, tmp_path):
    # add_ writes into self and returns it (Note [In-place calls] in interposer/hook/swap_call.cc):
    # the shadow calls compare the entry's copy of self with what PyTorch's kernel wrote; once
    # active, the entry writes the caller's tensor (a view too), the caller gets the same object
    # back with its version bumped once, and a partial overlap still raises PyTorch's error.
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "add.cc").write_text(ADD_INPLACE_KERNEL)
    r = subprocess.run([cxx, "-shared", "-fPIC", f"-I{kernel_include_dir}", "-O2", "-o", str(tmp_path / "add.so"),
                        str(tmp_path / "add.cc")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s, _ = run_child("""
        x = torch.randn(4, 8)
        x.add_(torch.randn(4, 8))
        emit(stats())
    """, child_env(hook_path, KFORGE_OBSERVE_EVERY=1))
    (sig,) = [x for x in s["signatures"] if x["signature"].startswith("aten::add_")]
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    r = subprocess.run([str(publish_tool), "--cache", str(cache), "--signature", sig["encoding"],
                        "--backend", "cpu", "--source", str(tmp_path / "add.cc"), "--so", str(tmp_path / "add.so"),
                        "--entry", "add_in_place", "--launch",
                        "entry=add_in_place;grid=1,1,1;block=1,1,1;smem=0;args=input:0,input:1,scalar:2:f32,output:0,"
                        "size:numel0:i64",
                        "--output", "in_place:0", "--torch-version", s["torch_version"], "--compile-option=-O2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.pt"
    res, err = run_child(INPLACE_MODEL, child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_TEST_OUT=out,
                                                  KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0))
    (sig,) = [x for x in res["stats"]["signatures"] if x["signature"].startswith("aten::add_")]
    assert sig["state"] == "active", (sig, err)
    # Every call here has the entry's signature (44); the partial overlap went to PyTorch's kernel,
    # so 20 of the loop, the view and the aliased call were the entry's.
    assert sig["calls"] == 44 and sig["shadow_calls"] == sig["clean_shadow_calls"] == 20, sig
    assert sig["active_calls"] == 22 and sig["fallbacks"] == 0, sig
    data = torch.load(out)
    assert all(data["same_object"]) and data["versions"] == [1] * 40
    for (a0, b), y in zip(data["pairs"], data["results"]):
        assert torch.equal(y, a0 + b)          # one float add: PyTorch's exact result
    base0, b, base = data["view"]
    assert torch.equal(base[:4], base0[:4]) and torch.equal(base[4:], base0[4:] + b)
    z0, z = data["aliased"]
    assert torch.equal(z, z0 + z0)
    assert "single memory location" in data["partial"], data["partial"]


OUT_MODEL = """
torch.manual_seed(0)
xs = [torch.randn(64, 1000) * (1 + i % 3) for i in range(41)]
ys = []
for x in xs:                               # out= calls only: first sight, trial and active use
    y = torch.empty(64, 1000)
    r = torch._softmax(x, -1, False, out=y)
    assert r is y
    ys.append(y)
    if len(ys) == 1:
        lib.kforge_hook_report_now(20000)
served = stats()
x = xs[1]
odd = {}
base = torch.empty(64 * 1000 + 1)
view = base[1:].view(64, 1000)             # storage offset 4 bytes: not aligned as torch allocates
odd["misaligned"] = torch._softmax(x, -1, False, out=view).clone()
small = torch.empty(0)                     # PyTorch resizes it
odd["resized"] = torch._softmax(x, -1, False, out=small).clone()
alias = x.clone()                          # out is the input
odd["aliased"] = torch._softmax(alias, -1, False, out=alias).clone()
half = torch.empty(64, 1000, dtype=torch.float64)   # another dtype: PyTorch's rules
try:
    torch._softmax(x, -1, False, out=half)
    odd["dtype"] = half.clone()
except RuntimeError as e:
    odd["dtype"] = str(e).splitlines()[0]
torch.save({"xs": xs, "ys": ys, "odd": odd}, os.environ["KFORGE_TEST_OUT"])
emit({"served": served, "stats": stats()})
"""


def test_an_entry_serves_out_calls_into_the_callers_tensor(hook_path, tools, softmax_signature, tmp_path):
    # Note [Out variants] in interposer/hook/swap_call.cc: _softmax.out is counted as the functional
    # signature, goes through the same trial (shadow calls copy PyTorch's result into out), and once
    # active the entry writes the caller's tensor, which the call returns. Out tensors the entry
    # cannot write as they are (misaligned, to be resized, the input itself, another dtype) get
    # PyTorch's out kernel.
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    out = tmp_path / "out.pt"
    res, err = run_child(OUT_MODEL, child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_TEST_OUT=out,
                                              KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0))
    assert "aten::_softmax.out@CPU" in res["stats"]["registered"]
    (sig,) = softmax_sig(res["served"])
    assert sig["state"] == "active" and sig["entry"] == key, (sig, err)
    assert sig["calls"] == 41 and sig["shadow_calls"] == sig["clean_shadow_calls"] == 20, sig
    assert sig["active_calls"] == 20 and sig["fallbacks"] == 0, sig
    data = torch.load(out)
    for i, (x, y) in enumerate(zip(data["xs"], data["ys"])):
        if i <= 20:                                     # first sight and the shadow calls: PyTorch's
            assert torch.equal(y, torch.softmax(x, -1)), i
        assert criterion_ok(x, y), i
    # The active calls wrote the entry's result (double accumulation: not bitwise PyTorch's).
    assert any(not torch.equal(y, torch.softmax(x, -1)) for x, y in zip(data["xs"][21:], data["ys"][21:]))
    x = data["xs"][1]
    odd = data["odd"]
    for name in ("misaligned", "resized", "aliased"):
        assert torch.equal(odd[name], torch.softmax(x, -1)), name
    plain = torch.empty(64, 1000, dtype=torch.float64)
    try:
        torch._softmax(x, -1, False, out=plain)
        assert torch.equal(odd["dtype"], plain)
    except RuntimeError as e:
        assert odd["dtype"] == str(e).splitlines()[0]
    (after,) = softmax_sig(res["stats"])
    assert after["active_calls"] == 20 and after["state"] == "active", after
