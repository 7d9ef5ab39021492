"""Live upgrades, revokes and the in-process check, on the CPU backend, in running hooked processes.

Note [Daemon notices] and Note [In-process win] in interposer/hook/swapper.h: an entry goes active
only if it is correct and faster than PyTorch's kernel in the process itself; a better entry the
daemon announces replaces the one in use without a restart; `kforge cache disable` takes an entry
out of every running process within a report round.

The kernels: add.Tensor of float32 [16384] + float64 [16384] (a float64 result). PyTorch's CPU
kernel first converts the float32 input into a float64 temporary and then adds (TensorIterator's
common dtype on CPU), so a kernel that adds with the conversion in registers does one pass instead
of two and no allocation: genuinely faster, on the same thread (16384 elements are below PyTorch's
and the entry's parallel grain, so neither wakes the thread pool, which keeps the timing quiet on
a loaded machine). The slow kernel is the same loop repeated KFORGE_TEST_REPEAT times: correct,
deliberately slower. The "half_again" kernel writes the first half of its chunk a second time: a
pass and a half, still faster than PyTorch's two passes and an allocation (here about 1.3x against
the one-pass kernel's 1.9x), and slower than the one-pass kernel. Float64 sums of a float32 and a float64 value are exact in either kernel, so
outputs are bitwise PyTorch's whichever runs.

Entries are published with kforge-publish-test-entry (--compiler gives a second entry another
key for the same signature; --speedup records the timings "better" compares); the daemon is a
ZeroMQ ROUTER in the test that sends KernelReady, as in test_hook_swap.py.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import torch

from test_hook_swap import PRELUDE, child_env, hook_path, run_child  # noqa: F401 (fixture)

KERNEL = r"""
#include <cstdint>
#include "runtime/cpu_kernel_abi.h"
#ifndef KFORGE_TEST_REPEAT
#define KFORGE_TEST_REPEAT 1
#endif
#ifndef KFORGE_TEST_CHUNK
#define KFORGE_TEST_CHUNK 65536
#endif
#ifndef KFORGE_TEST_HALF_AGAIN
#define KFORGE_TEST_HALF_AGAIN 0
#endif
// out = x + y for float32 x and float64 y (alpha 1, the signature's), one chunk per block.
extern "C" void add_mixed(const kforge_cpu_block* b, void* const* params) {
  const float* x = *(const float* const*)params[0];
  const double* y = *(const double* const*)params[1];
  double* out = *(double* const*)params[2];
  const int64_t n = *(const int64_t*)params[3];
  const int64_t begin = (int64_t)b->block_idx[0] * KFORGE_TEST_CHUNK;
  const int64_t end = begin + KFORGE_TEST_CHUNK < n ? begin + KFORGE_TEST_CHUNK : n;
  for (int r = 0; r < KFORGE_TEST_REPEAT; ++r) {
    for (int64_t i = begin; i < end; ++i) out[i] = (double)x[i] + y[i];
    asm volatile("" ::: "memory");   // every repeat really runs
  }
  if (KFORGE_TEST_HALF_AGAIN) {
    for (int64_t i = begin; i < begin + (end - begin) / 2; ++i) out[i] = (double)x[i] + y[i];
    asm volatile("" ::: "memory");
  }
}
"""
LAUNCH = ("entry=add_mixed;grid=ceil_div(numel0, 65536),1,1;block=1,1,1;smem=0;"
          "args=input:0,input:1,output:0,size:numel0:i64")
FLAGS = {"fast": ["-O3"], "faster": ["-O3", "-DKFORGE_TEST_CHUNK=32768"], "slow": ["-O3", "-DKFORGE_TEST_REPEAT=40"],
         "half_again": ["-O3", "-DKFORGE_TEST_HALF_AGAIN=1"]}
N = 16384


def add_sig(s):
    return [x for x in s["signatures"] if x["op"] == "aten::add.Tensor"]


@pytest.fixture(scope="module")
def kernels(kernel_include_dir, tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("upgrade-kernels")
    (d / "add.cc").write_text(KERNEL)
    for name, flags in FLAGS.items():
        r = subprocess.run([cxx, "-shared", "-fPIC", f"-I{kernel_include_dir}", *flags, "-o", str(d / f"{name}.so"),
                            str(d / "add.cc")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    return d


@pytest.fixture(scope="module")
def add_signature(hook_path):
    """The hook's own encoding of add(float32[16384], float64[16384]), from an observe run."""
    s, _ = run_child(f"""
        torch.add(torch.randn({N}), torch.randn({N}, dtype=torch.float64))
        emit(stats())
    """, child_env(hook_path))
    (sig,) = add_sig(s)
    return dict(sig, torch_version=s["torch_version"])


def publish(publish_tool, kernels, cache, signature, kernel, compiler=None, speedup=None):
    args = [str(publish_tool), "--cache", str(cache), "--signature", signature["encoding"], "--backend", "cpu",
            "--source", str(kernels / "add.cc"), "--so", str(kernels / f"{kernel}.so"), "--entry", "add_mixed",
            "--launch", LAUNCH, "--output", "like:1", "--torch-version", signature["torch_version"],
            *[f"--compile-option={o}" for o in FLAGS[kernel]]]
    if compiler:
        args += ["--compiler", compiler]
    if speedup:
        args += ["--speedup", str(speedup)]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def kforge(build_dir, cache, *args):
    return subprocess.run([str(build_dir / "tools" / "kforge"), "--cache-dir", str(cache), "cache", *args],
                          capture_output=True, text=True, check=True).stdout


# One process: report_now loads the entry, then CALLS calls; the outputs are compared in the child
# (bitwise: a float64 sum of a float32 and a float64 value is exact).
MODEL = f"""
torch.manual_seed(0)
x, y = torch.randn({N}), torch.randn({N}, dtype=torch.float64)
want = torch.from_numpy(x.numpy().astype('float64') + y.numpy())   # no second add signature
torch.add(x, y)
lib.kforge_hook_report_now(20000)
exact = [bool(torch.equal(torch.add(x, y), want)) for _ in range(CALLS)]
lib.kforge_hook_report_now(20000)
emit({{"stats": stats(), "exact": exact}})
"""


def test_a_correct_but_slow_entry_ends_in_no_win_and_pytorch_runs(hook_path, build_dir, publish_tool, kernels,
                                                                   add_signature, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    key = publish(publish_tool, kernels, cache, add_signature, "slow")
    res, err = run_child(MODEL.replace("CALLS", "60"), child_env(hook_path, KFORGE_CACHE_DIR=cache,
                                                                 KFORGE_MODE="active"))
    (sig,) = add_sig(res["stats"])
    assert sig["state"] == "no_win", (sig, err)
    # 20 shadow calls, then 20 pairs timed alone (Note [Timing phase]); nothing after the verdict.
    assert sig["shadow_calls"] == 20 and sig["timing_calls"] == 40 and sig["active_calls"] == 0, sig
    assert sig["entry_median_ns"] > sig["pytorch_median_ns"] > 0, sig
    assert sig["timed_calls"] == 20
    assert "no win in this process" in sig["reason"]
    assert all(res["exact"])
    assert res["stats"]["swap"]["quarantined"] == 0
    assert "is correct but not faster in this process" in err, err
    # Correct, so not quarantined: the cache keeps it active, with this process's no-win record.
    shown = json.loads(kforge(build_dir, cache, "show", key, "--json"))
    assert shown["state"] == "active"
    (record,) = shown["no_win"]
    assert record["entry_ns"] == sig["entry_median_ns"] and record["pytorch_ns"] == sig["pytorch_median_ns"]
    assert record["text"].startswith(f"no win in process {record['pid']} (")
    assert "no win in process" in kforge(build_dir, cache, "ls")
    assert not os.listdir(cache / "trial")
    # The process is gone: gc removes its record.
    assert "1 no-win records" in kforge(build_dir, cache, "gc", "--max-size", "1G")
    assert json.loads(kforge(build_dir, cache, "show", key, "--json"))["no_win"] == []


def test_a_fast_entry_goes_active_with_both_medians(hook_path, publish_tool, kernels, add_signature, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    key = publish(publish_tool, kernels, cache, add_signature, "fast")
    res, err = run_child(MODEL.replace("CALLS", "100"), child_env(hook_path, KFORGE_CACHE_DIR=cache,
                                                                  KFORGE_MODE="active"))
    (sig,) = add_sig(res["stats"])
    assert sig["state"] == "active" and sig["entry"] == key, (sig, err)
    # Note [Timing phase]: 20 shadow calls, then 20 pairs of calls served by either kernel alone.
    assert sig["shadow_calls"] == 20 and sig["timing_calls"] == 40 and sig["active_calls"] == 40, sig
    assert sig["timed_calls"] == 20, sig
    assert 0 < sig["entry_median_ns"] <= 0.97 * sig["pytorch_median_ns"], sig
    assert all(res["exact"])
    assert not (cache / "nowin").exists() or not os.listdir(cache / "nowin")


def test_confirm_win_off_activates_a_slow_entry(hook_path, publish_tool, kernels, add_signature, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    publish(publish_tool, kernels, cache, add_signature, "slow")
    res, err = run_child(MODEL.replace("CALLS", "30"), child_env(hook_path, KFORGE_CACHE_DIR=cache,
                                                                 KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0))
    (sig,) = add_sig(res["stats"])
    assert sig["state"] == "active" and sig["active_calls"] == 10, (sig, err)
    assert sig["entry_median_ns"] > 0 and sig["pytorch_median_ns"] > 0   # timed all the same
    assert all(res["exact"])


# Stays alive across the steps the test drives through stdin ("go <notices>" or "watch").
LIVE = f"""
import time
torch.manual_seed(0)
x, y = torch.randn({N}), torch.randn({N}, dtype=torch.float64)
want = torch.from_numpy(x.numpy().astype('float64') + y.numpy())   # no second add signature
def calls(n):
    return [bool(torch.equal(torch.add(x, y), want)) for _ in range(n)]
torch.add(x, y)                      # first sight
lib.kforge_hook_report_now(20000)    # loads entry A
exact = calls(80)                    # A: 20 shadow calls, 20 timed pairs, then active
emit({{"stats": stats(), "exact": exact}})
while True:
    line = sys.stdin.readline().split()
    if not line:
        break
    if line[0] == "go":               # after a KernelReady: wait until the notice is in, then call
        deadline = time.monotonic() + 30
        while stats()["swap"]["notices"] < int(line[1]) and time.monotonic() < deadline:
            lib.kforge_hook_report_now(1000)
        lib.kforge_hook_report_now(20000)
        during = stats()
        exact = calls(80)
        lib.kforge_hook_report_now(20000)
        emit({{"during": during, "stats": stats(), "exact": exact}})
    elif line[0] == "watch":          # the entry was disabled in the cache just now: no report_now,
        t0 = time.monotonic()         # the loader's own rounds must find it
        state = None
        while time.monotonic() - t0 < 10:
            exact = calls(1)
            state = add_sig(stats())[0]["state"]
            if state != "active":
                break
            time.sleep(0.005)
        took = time.monotonic() - t0
        exact += calls(20)
        emit({{"stats": stats(), "exact": exact, "took": took}})
"""


def test_live_upgrade_then_disable_in_the_cache(hook_path, build_dir, publish_tool, kernels, add_signature,
                                                 tmp_path):
    zmq = pytest.importorskip("zmq")
    msgpack = pytest.importorskip("msgpack")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    # A: a pass and a half, faster than PyTorch's kernel and slower than B's one pass.
    a = publish(publish_tool, kernels, cache, add_signature, "half_again", speedup=1.2)
    d = tempfile.mkdtemp(prefix="kf-")
    endpoint = f"ipc://{d}/daemon.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    env = child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_DAEMON_ENDPOINT=endpoint, KFORGE_MODE="active")
    prelude = PRELUDE + "\ndef add_sig(s):\n    return [x for x in s['signatures'] if x['op'] == 'aten::add.Tensor']\n"
    proc = subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(LIVE)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result():
        line = proc.stdout.readline()
        assert line.startswith("RESULT "), line + proc.stderr.read()
        return json.loads(line[len("RESULT "):])

    def say(text):
        proc.stdin.write(text + "\n")
        proc.stdin.flush()

    def hook_identity():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if router.poll(timeout=500):
                ident, _ = router.recv_multipart()
                return ident
        raise AssertionError("the hook never connected")

    try:
        first = result()
        (s,) = add_sig(first["stats"])
        assert s["entry"] == a and s["state"] == "active" and s["speedup"] == pytest.approx(1.2), s
        assert all(first["exact"])
        ident = hook_identity()
        sig_id = bytes.fromhex(s["id"])

        # A worse entry (another compiler: another key) is announced: not taken.
        worse = publish(publish_tool, kernels, cache, add_signature, "faster", compiler="c++ (worse)", speedup=1.1)
        router.send_multipart([ident, msgpack.packb(["kforge", 1, 5, [sig_id, bytes(16), worse, 1.1]])])
        say("go 1")
        r = result()
        (s,) = add_sig(r["stats"])
        assert s["entry"] == a and s["state"] == "active" and s["previous_entry"] == "", s

        # A better entry B: trialled beside PyTorch (PyTorch's results meanwhile), then it takes A's place.
        b = publish(publish_tool, kernels, cache, add_signature, "faster", compiler="c++ (better)", speedup=2.0)
        assert b not in (a, worse)
        router.send_multipart([ident, msgpack.packb(["kforge", 1, 5, [sig_id, bytes(16), b, 2.0]])])
        say("go 2")
        r = result()
        (during,) = add_sig(r["during"])
        assert during["entry"] == b and during["state"] == "shadow", during
        assert during["previous_entry"] == a and during["previous_state"] == "active", during
        (s,) = add_sig(r["stats"])
        assert s["entry"] == b and s["state"] == "active", s
        assert s["previous_entry"] == "" and s["shadow_calls"] == 20 and s["timing_calls"] == 40, s
        assert s["active_calls"] == 20, s
        assert r["stats"]["swap"]["upgrades"] == 1
        assert [e["entry"] for e in r["stats"]["swap"]["entries"]] == [b]   # A is gone
        assert all(r["exact"])

        # Note [Upgrade pays]: C, announced 3.0x (a worker that flattered it), runs a pass and a half:
        # faster than PyTorch's kernel in its trial, slower than B, so B runs again and C is not retried.
        c = publish(publish_tool, kernels, cache, add_signature, "half_again", compiler="c++ (flattered)", speedup=3.0)
        assert c not in (a, b, worse)
        router.send_multipart([ident, msgpack.packb(["kforge", 1, 5, [sig_id, bytes(16), c, 3.0]])])
        say("go 3")
        r = result()
        (during,) = add_sig(r["during"])
        assert during["entry"] == c and during["state"] == "shadow" and during["previous_entry"] == b, during
        (s,) = add_sig(r["stats"])
        assert s["entry"] == b and s["state"] == "active" and s["previous_entry"] == "", s
        assert r["stats"]["swap"]["upgrades"] == 1 and r["stats"]["swap"]["upgrades_declined"] == 1
        assert all(r["exact"])

        # `kforge cache disable B`: the process takes it out on its own within a round (1 s).
        kforge(build_dir, cache, "disable", b)
        say("watch")
        r = result()
        (s,) = add_sig(r["stats"])
        assert s["state"] == "disabled" and s["reason"].startswith("entry disabled in the cache"), s
        assert r["took"] < 2.0, r["took"]
        assert r["stats"]["swap"]["revoked_in_cache"] == 1
        assert all(r["exact"])
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        router.close()
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert f"entry {b} for " in err and f"it replaces entry {a} (" in err, err
    assert f"entry {c} for " in err and "not than the version in use in this process" in err, err
    assert f"entry {b} runs again (active)" in err, err
    assert f"entry {b} for " in err and "disabled in the cache: PyTorch's kernel runs" in err, err
