"""Hot swap on the CUDA backend: the hook loads a cubin cache entry, shadows it, activates or
quarantines it, under load from another thread and inside CUDA graph capture.

The cache entry is made here: a hand-written CUDA softmax kernel (float32, last dim, contiguous
rows; one block of 256 threads per row) that kforge-publish-test-entry compiles with NVRTC for
device 0's exact architecture and publishes (tests/support/publish_test_entry.h) for the exact
signature the hook reports in observe mode (its canonical encoding, from kforge_hook_stats_json)
with the hook's own torch version. Everything runs on device 0 only: entries on several GPUs (one
entry loaded on each matching device, calls on a device it is not loaded on) are another issue's
tests.

As in test_hook_swap.py, each scenario runs in a fresh subprocess that loads the hook through
ctypes after `import torch`; processes synchronize with kforge_hook_report_now (a loader round),
thread conditions and their exit, never sleeps; the parent, which has no hook, compares the
children's outputs with plain PyTorch on the same GPU (Note [Shadow comparison] in
interposer/hook/swap_call.cc). The state-machine tests set KFORGE_CONFIRM_WIN=0: whether the
hand-written kernel beats PyTorch's on a given GPU is not what they test (Note [In-process win]).
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import types

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TORCH_MM = ".".join(torch.__version__.split("+")[0].split(".")[:2])
DEVICE = "cuda:0"
SHADOW_CALLS = 20

PRELUDE = textwrap.dedent(
    """
    import ctypes, json, os, sys
    import torch
    HOOK = os.environ.get("KFORGE_TEST_HOOK")
    lib = ctypes.CDLL(HOOK)
    lib.kforge_hook_stats_json.restype = ctypes.c_char_p
    lib.kforge_hook_report_now.argtypes = [ctypes.c_int]
    DEVICE = "cuda:0"
    def stats():
        return json.loads(lib.kforge_hook_stats_json())
    def softmax_sig(s):
        return [x for x in s["signatures"] if x["op"] == "aten::_softmax"]
    def entry(s):
        (sig,) = softmax_sig(s)
        return sig
    def loader_round():
        # A round of the reporter thread, which is where the loader runs; 1: it happened.
        assert lib.kforge_hook_report_now(60000) == 1, "kforge_hook_report_now timed out"
    def emit(obj):
        print("RESULT " + json.dumps(obj), flush=True)
    """
)

# NVRTC compiles this without any header (it has no <cmath>, and no INFINITY). One block per row;
# the row max is exact in float, the sum of exponentials and the normalization are in double, so
# every output is within an ulp or so of the exact value: well inside the shadow criterion, and
# (as the tests check) not bitwise PyTorch's float kernel. The block must be THREADS wide.
KERNEL = r"""
#ifndef KFORGE_TEST_SCALE
#define KFORGE_TEST_SCALE 1.0
#endif
#define THREADS 256
#define WARPS (THREADS / 32)

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, long long cols) {
  __shared__ float warp_max[WARPS];
  __shared__ double warp_sum[WARPS];
  const float* xr = x + (long long)blockIdx.x * cols;
  float* yr = y + (long long)blockIdx.x * cols;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float m = __int_as_float(0xff800000);   // -inf
  for (long long c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  m = warp_max[0];
  for (int w = 1; w < WARPS; ++w) m = fmaxf(m, warp_max[w]);

  double s = 0.0;
  for (long long c = threadIdx.x; c < cols; c += THREADS) s += exp((double)xr[c] - (double)m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) warp_sum[warp] = s;
  __syncthreads();
  s = 0.0;
  for (int w = 0; w < WARPS; ++w) s += warp_sum[w];   // same order in every thread

  const double scale = KFORGE_TEST_SCALE / s;
  for (long long c = threadIdx.x; c < cols; c += THREADS) yr[c] = (float)(exp((double)xr[c] - (double)m) * scale);
}
"""
KERNEL_LAUNCH = ("entry=softmax_rows;grid=numel0 / size0_1,1,1;block=256,1,1;smem=0;"
                 "args=input:0,output:0,size:size0_1:i64")
# The wrong kernel is 0.1% off: far outside the criterion, close enough to look plausible.
KERNEL_OPTIONS = {"good": [], "wrong": ["-DKFORGE_TEST_SCALE=1.001"], "good2": ["-DKFORGE_TEST_VARIANT=2"]}


def softmax_sig(s):
    return [x for x in s["signatures"] if x["op"] == "aten::_softmax"]


def entry(s):
    """The one softmax signature's entry in a stats object."""
    (sig,) = softmax_sig(s)
    return sig


def child_env(hook, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k != "LD_PRELOAD"}
    # A private (0700) directory nobody serves: the hook refuses socket directories others can write.
    env["KFORGE_DAEMON_ENDPOINT"] = f"ipc://{tempfile.mkdtemp(prefix='kforge-nobody-')}/daemon.sock"
    env["KFORGE_TEST_HOOK"] = str(hook)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_child(body, env, timeout=300):
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, proc.stdout + proc.stderr
    return json.loads(results[-1]), proc.stderr


def plain(x):
    """PyTorch's own CUDA kernel, in this process (which has no hook)."""
    return torch.softmax(x.to(DEVICE), -1).cpu()


def criterion_error(x, y):
    """Why y fails Note [Shadow comparison] for softmax(x, -1) on the GPU; "" if it passes."""
    xd = x.to(DEVICE)
    torch_y = torch.softmax(xd, -1).double()
    ref = torch.softmax(xd.double(), -1)
    if y.dtype != torch.float32 or y.shape != x.shape or y.stride() != torch_y.stride():
        return f"layout {y.dtype} {tuple(y.shape)} {y.stride()}"
    yd = y.to(DEVICE).double()
    eps = torch.finfo(torch.float32).eps
    err, err_t = (yd - ref).abs().max().item(), (torch_y - ref).abs().max().item()
    rel, rel_t = ((yd - ref).norm() / ref.norm()).item(), ((torch_y - ref).norm() / ref.norm()).item()
    bound, rel_bound = 2 * err_t + 8 * eps * ref.abs().max().item(), 2 * rel_t + 8 * eps
    if not err <= bound:
        return f"max abs error {err:.3g} > {bound:.3g}"
    if not rel <= rel_bound:
        return f"relative L2 error {rel:.3g} > {rel_bound:.3g}"
    return ""


@pytest.fixture(scope="module")
def hook_path(build_dir):
    p = build_dir / "interposer" / "hook" / f"libkforge_hook-torch{TORCH_MM}.so"
    if not p.exists():
        pytest.fail(f"no hook at {p}: build the kforge_hook target")
    return p


@pytest.fixture(scope="module")
def tools(publish_tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("swap-cuda-tools")
    (d / "softmax.cu").write_text(KERNEL)
    return types.SimpleNamespace(dir=d, publish=publish_tool)


@pytest.fixture(scope="module")
def softmax_signature(hook_path):
    """The hook's own canonical encoding of softmax(float32[64,1000] on cuda:0, -1)."""
    s, _ = run_child("""
        x = torch.randn(64, 1000, device=DEVICE)
        torch.softmax(x, -1)
        torch.cuda.synchronize()
        loader_round()
        emit(stats())
    """, child_env(hook_path))
    sigs = softmax_sig(s)
    assert len(sigs) == 1 and " cuda:sm_" in sigs[0]["signature"], s["signatures"]
    cc = torch.cuda.get_device_capability(0)
    assert sigs[0]["signature"].endswith(f" cuda:sm_{cc[0]}{cc[1]}"), sigs[0]["signature"]
    return dict(sigs[0], torch_version=s["torch_version"])


def torch_nvrtc():
    """The NVRTC of torch's own CUDA wheels, if this torch has one: the tool, which has no torch in
    its process, would otherwise search the system's (runtime/nvrtc.h). KFORGE_LIBNVRTC wins."""
    if os.environ.get("KFORGE_LIBNVRTC"):
        return os.environ["KFORGE_LIBNVRTC"]
    nvidia = pathlib.Path(torch.__file__).resolve().parent.parent / "nvidia"
    found = sorted(p for p in nvidia.glob("*/lib/libnvrtc.so.*") if p.name.split(".so.")[1].isdigit())
    return str(found[-1]) if found else None


def make_cache(tmp_path, tools, signature, kernel):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = dict(os.environ)
    if torch_nvrtc():
        env["KFORGE_LIBNVRTC"] = torch_nvrtc()
    r = subprocess.run([str(tools.publish), "--cache", str(cache), "--signature", signature["encoding"],
                        "--backend", "cuda", "--device", "0", "--source", str(tools.dir / "softmax.cu"),
                        "--entry", "softmax_rows", "--launch", KERNEL_LAUNCH, "--output", "like:0",
                        "--torch-version", signature["torch_version"],
                        *[f"--compile-option={o}" for o in KERNEL_OPTIONS[kernel]]],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert len(key) == 32, r.stdout
    return cache, key


def cache_show(build_dir, cache, key):
    r = subprocess.run([str(build_dir / "tools" / "kforge"), "--cache-dir", str(cache), "cache", "show", key,
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# The model: softmax over the last dim of float32 [64, 1000] CUDA tensors. The first call lets the
# hook see the signature; a loader round loads the entry; the next CALLS calls go through
# shadow/active. Inputs and outputs go back to the parent on the CPU.
MODEL = """
torch.manual_seed(0)
xs = [(torch.randn(64, 1000) * (1 + i % 3)).to(DEVICE) for i in range(CALLS + 1)]
ys = [torch.softmax(xs[0], -1)]
torch.cuda.synchronize()
loader_round()
s0 = stats()
marker_during = None
for i, x in enumerate(xs[1:]):
    ys.append(torch.softmax(x, -1))
    if i == 0:
        torch.cuda.synchronize()
        marker_during = sorted(os.listdir(os.path.join(s0["swap"]["cache_dir"], "trial")))
torch.cuda.synchronize()
loader_round()   # quarantines and marker removals happen on a round
torch.save({"xs": [x.cpu() for x in xs], "ys": [y.cpu() for y in ys]}, os.environ["KFORGE_TEST_OUT"])
emit({"stats": stats(), "after_load": s0, "marker_during": marker_during})
"""


def run_model(hook_path, tmp_path, cache, calls, **env):
    out = tmp_path / "out.pt"
    res, err = run_child(MODEL.replace("CALLS", str(calls)),
                         child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_TEST_OUT=out, **env))
    data = torch.load(out)
    return res, err, data["xs"], data["ys"]


def test_good_entry_goes_shadow_then_active(hook_path, build_dir, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    calls = 2 * SHADOW_CALLS
    res, err, xs, ys = run_model(hook_path, tmp_path, cache, calls, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0,
                                 KFORGE_SHADOW_CALLS=SHADOW_CALLS)
    s = res["stats"]
    assert s["mode"] == "active", err
    # Loaded (on device 0) by the round report_now asked for: shadow, with its trial marker.
    loaded = softmax_sig(res["after_load"])
    assert len(loaded) == 1 and loaded[0]["state"] == "shadow" and loaded[0]["entry"] == key, (loaded, err)
    assert res["marker_during"] == [key]
    (sig,) = softmax_sig(s)
    assert sig["id"] == softmax_signature["id"]
    assert sig["state"] == "active", (sig, err)
    assert sig["shadow_calls"] == SHADOW_CALLS and sig["clean_shadow_calls"] == SHADOW_CALLS, sig
    assert sig["active_calls"] == calls - SHADOW_CALLS and sig["fallbacks"] == 0, sig
    assert sig["calls"] == calls + 1
    # Shadow calls return PyTorch's result exactly; every call meets the accuracy criterion.
    assert len(ys) == calls + 1
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i <= SHADOW_CALLS:
            assert torch.equal(y, plain(x)), i
        assert criterion_error(x, y) == "", (i, criterion_error(x, y))
    # The active calls really ran the kernel (double accumulation: not bitwise PyTorch's).
    assert any(not torch.equal(y, plain(x)) for x, y in zip(xs[SHADOW_CALLS + 1:], ys[SHADOW_CALLS + 1:]))
    assert not os.listdir(cache / "trial"), "the marker is removed once the trial passed"
    assert cache_show(build_dir, cache, key)["state"] == "active"


def test_wrong_entry_is_quarantined_after_one_shadow_call(hook_path, build_dir, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "wrong")
    res, err, xs, ys = run_model(hook_path, tmp_path, cache, 30, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0,
                                 KFORGE_SHADOW_CALLS=SHADOW_CALLS)
    (sig,) = softmax_sig(res["stats"])
    assert sig["state"] == "disabled", (sig, err)
    assert sig["shadow_calls"] == 1 and sig["active_calls"] == 0 and sig["clean_shadow_calls"] == 0, sig
    assert "shadow mismatch" in sig["reason"] and "max abs error" in sig["reason"], sig["reason"]
    assert res["stats"]["swap"]["quarantined"] == 1
    assert err.count(f"entry {key}") >= 1 and "quarantined in the cache" in err, err
    for i, (x, y) in enumerate(zip(xs, ys)):
        assert torch.equal(y, plain(x)), i
    shown = cache_show(build_dir, cache, key)
    assert shown["state"] == "quarantined" and "shadow mismatch" in shown["reason"], shown
    assert not os.listdir(cache / "trial")


# Hot swap under load: a second thread calls softmax in a loop (8 inputs in turn) from before the
# entry is loaded until well after it is active; the main thread only runs the loader round and
# reads counters. Every output is kept, folded into the distinct outputs per input (the kernels
# are deterministic, so each input has at most PyTorch's output and the entry's; anything torn
# during the swap would be one more), and each distinct output goes to the parent with its count.
UNDER_LOAD = """
import threading
torch.manual_seed(0)
xs = [torch.randn(64, 1000, device=DEVICE) * (1 + i % 4) for i in range(8)]
torch.cuda.synchronize()
cv = threading.Condition()
count = 0
stop = False
errors = []
distinct = [[] for _ in xs]   # per input: [output, calls]

def fold(pending):
    for i, y in pending:
        for d in distinct[i]:
            if torch.equal(d[0], y):
                d[1] += 1
                break
        else:
            if len(distinct[i]) >= 16:
                raise RuntimeError(f"more than 16 distinct outputs for input {i}")
            distinct[i].append([y, 1])

def work():
    global count
    pending = []
    try:
        while True:
            with cv:
                if stop:
                    break
                i = count % len(xs)
            pending.append((i, torch.softmax(xs[i], -1)))
            if len(pending) == 32:
                fold(pending)
                pending = []
            with cv:
                count += 1
                cv.notify_all()
        fold(pending)
    except BaseException as e:
        errors.append(repr(e))
        with cv:
            cv.notify_all()

def wait_calls(n):
    with cv:
        ok = cv.wait_for(lambda: count >= n or errors, timeout=240)
        assert ok and not errors, (n, count, errors)
        return count

t = threading.Thread(target=work)
t.start()
before_round = wait_calls(30)
round_done = lib.kforge_hook_report_now(60000)   # the thread keeps calling (ctypes drops the GIL)
after_round = wait_calls(0)
at_load = stats()
mid_count = wait_calls(after_round + 10 * SHADOW_CALLS)
mid = stats()
late_count = wait_calls(mid_count + 100)
late = stats()
with cv:
    stop = True
t.join()
torch.cuda.synchronize()
loader_round()
torch.save({"xs": [x.cpu() for x in xs],
            "distinct": [[(d[0].cpu(), d[1]) for d in ds] for ds in distinct]}, os.environ["KFORGE_TEST_OUT"])
emit({"errors": errors, "count": count, "round_done": round_done, "before_round": before_round, "after_round": after_round,
      "mid_count": mid_count, "late_count": late_count,
      "at_load": at_load, "mid": mid, "late": late, "final": stats()})
"""


def test_hot_swap_while_another_thread_calls(hook_path, build_dir, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    out = tmp_path / "load.pt"
    res, err = run_child(UNDER_LOAD.replace("SHADOW_CALLS", str(SHADOW_CALLS)),
                         child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0,
                                   KFORGE_SHADOW_CALLS=SHADOW_CALLS, KFORGE_TEST_OUT=out))
    assert res["errors"] == [], res["errors"]
    assert res["round_done"] == 1, "kforge_hook_report_now timed out"
    # The thread had been calling before the round that loads the entry (or a periodic round
    # before it: the thread's first call is the signature's first sight either way).
    assert res["before_round"] >= 30
    first = entry(res["at_load"])
    assert first["state"] in ("shadow", "active") and first["entry"] == key, (first, err)
    # Active while the thread was still calling, and it kept taking the replacement.
    mid, late, final = entry(res["mid"]), entry(res["late"]), entry(res["final"])
    assert mid["state"] == "active" and mid["shadow_calls"] == SHADOW_CALLS and mid["active_calls"] > 0, (mid, err)
    assert late["state"] == "active" and late["active_calls"] > mid["active_calls"], (mid, late)
    assert final["state"] == "active" and final["fallbacks"] == 0, (final, err)
    assert final["shadow_calls"] == SHADOW_CALLS and final["clean_shadow_calls"] == SHADOW_CALLS, final
    assert final["shadow_calls"] + final["active_calls"] <= res["count"] == final["calls"], (final, res["count"])
    assert not os.listdir(cache / "trial")

    data = torch.load(out)
    assert sum(n for ds in data["distinct"] for _, n in ds) == res["count"]
    torch_outputs = replacement_outputs = 0
    for i, (x, ds) in enumerate(zip(data["xs"], data["distinct"])):
        for y, n in ds:
            assert criterion_error(x, y) == "", (i, n, criterion_error(x, y))
            if torch.equal(y, plain(x)):
                torch_outputs += n
            else:
                replacement_outputs += n
    # Before the swap and in shadow: PyTorch's outputs; once active: the kernel's.
    assert torch_outputs >= SHADOW_CALLS and replacement_outputs > 0, (torch_outputs, replacement_outputs)


# CUDA graphs. While the entry is in shadow, a captured call runs PyTorch's kernel only (the
# comparison would synchronize, which capture forbids) and is not a shadow call. Once it is
# active, the capture records the entry's launch, and replays run it on whatever the static input
# holds. Warm-up before each capture on a side stream, as torch.cuda.graph's documentation asks.
GRAPHS = """
torch.manual_seed(0)
static_x = torch.randn(64, 1000, device=DEVICE)
torch.softmax(static_x, -1)
torch.cuda.synchronize()
loader_round()
result = {"loaded": entry(stats())}

def warm_up():
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.softmax(static_x, -1)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

def capture_and_replay(tag, replays):
    warm_up()
    before = entry(stats())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = torch.softmax(static_x, -1)
    torch.cuda.synchronize()
    after = entry(stats())
    xs, ys = [], []
    for k in range(replays):
        x = torch.randn(64, 1000, device=DEVICE) * (1 + k)
        static_x.copy_(x)
        g.replay()
        xs.append(x.cpu())
        ys.append(static_y.clone().cpu())
    torch.cuda.synchronize()
    result[tag] = {"before": before, "after": after}
    return xs, ys, g, static_y

shadow_xs, shadow_ys, g1, y1 = capture_and_replay("shadow", 4)
# End the trial with eager calls on fresh inputs.
for _ in range(SHADOW_CALLS):
    torch.softmax(torch.randn(64, 1000, device=DEVICE), -1)
torch.cuda.synchronize()
result["after_trial"] = entry(stats())
active_xs, active_ys, g2, y2 = capture_and_replay("active", 6)
# The graph captured in shadow still replays PyTorch's kernel.
static_x.copy_(shadow_xs[0].to(DEVICE))
g1.replay()
torch.cuda.synchronize()
shadow_again = y1.clone().cpu()
loader_round()
result["final"] = stats()
torch.save({"shadow_xs": shadow_xs, "shadow_ys": shadow_ys, "active_xs": active_xs, "active_ys": active_ys,
            "shadow_again": shadow_again}, os.environ["KFORGE_TEST_OUT"])
emit(result)
"""


def test_cuda_graph_capture_in_shadow_and_active(hook_path, tools, softmax_signature, tmp_path):
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    out = tmp_path / "graphs.pt"
    res, err = run_child(GRAPHS.replace("SHADOW_CALLS", str(SHADOW_CALLS)),
                         child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_MODE="active", KFORGE_CONFIRM_WIN=0,
                                   KFORGE_SHADOW_CALLS=SHADOW_CALLS, KFORGE_TEST_OUT=out))
    assert res["loaded"]["state"] == "shadow" and res["loaded"]["entry"] == key, (res["loaded"], err)
    data = torch.load(out)

    # Captured in shadow: no shadow call counted during capture, PyTorch's exact results on replay.
    before, after = res["shadow"]["before"], res["shadow"]["after"]
    assert before["state"] == after["state"] == "shadow", (before, after, err)
    assert before["shadow_calls"] == 3, before   # the warm-up calls were compared
    assert after["shadow_calls"] == before["shadow_calls"], (before, after)
    assert after["active_calls"] == 0 and after["fallbacks"] == 0, after
    for k, (x, y) in enumerate(zip(data["shadow_xs"], data["shadow_ys"])):
        assert torch.equal(y, plain(x)), k
    assert torch.equal(data["shadow_again"], plain(data["shadow_xs"][0]))

    # The trial passed on eager calls; captured while active, the graph runs the entry's kernel.
    trial = res["after_trial"]
    assert trial["state"] == "active" and trial["shadow_calls"] == SHADOW_CALLS, (trial, err)
    before, after = res["active"]["before"], res["active"]["after"]
    assert before["state"] == after["state"] == "active", (before, after)
    assert after["active_calls"] == before["active_calls"] + 1, (before, after)   # the captured call
    assert after["shadow_calls"] == SHADOW_CALLS and after["fallbacks"] == 0, after
    for k, (x, y) in enumerate(zip(data["active_xs"], data["active_ys"])):
        assert criterion_error(x, y) == "", (k, criterion_error(x, y))
    assert any(not torch.equal(y, plain(x)) for x, y in zip(data["active_xs"], data["active_ys"])), \
        "the replays ran PyTorch's kernel, not the captured entry"

    final = entry(res["final"])
    assert final["state"] == "active" and final["fallbacks"] == 0, (final, err)
    assert not os.listdir(cache / "trial")


# Note [Samples and graph capture]: the reporter drains an input sample (a device copy taken by the
# first calls of a signature) while this thread captures a graph, in torch's default global mode.
# The capture must end well and replay PyTorch's result; the sample is still counted.
SAMPLE_DURING_CAPTURE = """
torch.manual_seed(0)
static_x = torch.randn(64, 1000, device=DEVICE)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    torch.softmax(static_x, -1)   # the signature's first call: sampled, drained by the next round
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
before = stats()["inputs"]
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_y = torch.softmax(static_x, -1)
    loader_round()   # the reporter's round runs now, on its thread, inside this capture
g.replay()
torch.cuda.synchronize()
emit({"before": before, "after": stats()["inputs"], "exact": bool(torch.equal(static_y, torch.softmax(static_x, -1)))})
"""


def test_a_sample_drained_during_graph_capture_leaves_the_capture_whole(hook_path, tmp_path):
    # Rounds only when asked for: the sample is still waiting when the capture begins.
    res, err = run_child(SAMPLE_DURING_CAPTURE,
                         child_env(hook_path, KFORGE_MODE="observe", KFORGE_REPORT_INTERVAL_MS=3600000))
    before, after = res["before"], res["after"]
    assert before["sampled"] >= 1, (before, err)
    assert after["failed"] == 0, (after, err)
    assert res["exact"], err


# Note [Stopping before CUDA's teardown] (recorder.cc): a program whose last calls are new CUDA
# signatures leaves input samples for the reporter's last round, which runs at exit. That round
# must run before the CUDA runtime's own teardown: on the H100, `kforge demo` (whose last steps,
# a float64 run, are new signatures) died at exit by SIGABRT from c10's event destructor, 3 runs
# of 3. The child exits normally right after its calls; its exit summary, written after that last
# round (for a process that used CUDA), must count every sample and no failure.
SAMPLES_LEFT_AT_EXIT = """
torch.manual_seed(0)
for n in range(8):
    for dt in (torch.float32, torch.float64):
        torch.softmax(torch.randn(16 + n, 300 + n, device=DEVICE, dtype=dt), -1)
emit({"inputs": stats()["inputs"]})
"""


def test_samples_left_at_exit_are_drained_before_cuda_tears_down(hook_path, tmp_path):
    for attempt in range(3):
        summary_dir = tmp_path / f"summary{attempt}"
        summary_dir.mkdir()
        # No round before exit: every sample is still waiting when the program ends. Every call
        # observed (Note [Observed calls] in interceptor.cc), so each of the 16 signatures is seen
        # and sampled: by default a thread observes about one call in 16 of an operator.
        res, err = run_child(SAMPLES_LEFT_AT_EXIT,
                             child_env(hook_path, KFORGE_MODE="observe", KFORGE_REPORT_INTERVAL_MS=3600000,
                                       KFORGE_OBSERVE_EVERY=1, KFORGE_SUMMARY_DIR=summary_dir))
        assert "terminate called" not in err and "AcceleratorError" not in err, err
        assert res["inputs"]["sampled"] >= 8 and res["inputs"]["failed"] == 0, res
        (summary,) = [json.loads(f.read_text()) for f in summary_dir.glob("kforge-summary-*.json")]
        assert summary["inputs"]["sampled"] == res["inputs"]["sampled"], (summary["inputs"], res)
        assert summary["inputs"]["failed"] == 0, (summary["inputs"], err)


# ---- Note [Daemon notices]: a live upgrade and a disable in the cache, in one running process -------
# The CUDA twin of test_hook_upgrade.py's. The daemon republishes a better kernel under the same key
# (one entry per signature and environment): the process trials the new kernel beside PyTorch's and
# switches; then `kforge cache disable` takes it out within a report round.
LIVE = """
import time
torch.manual_seed(0)
x = torch.randn(64, 1000).to(DEVICE)
want = torch.softmax(x, -1)
def calls(n):
    ys = [torch.softmax(x, -1) for _ in range(n)]
    torch.cuda.synchronize()
    return [bool(torch.equal(y, want)) for y in ys]
torch.softmax(x, -1)
torch.cuda.synchronize()
loader_round()
calls(40)
emit({"stats": stats()})
while True:
    line = sys.stdin.readline().split()
    if not line:
        break
    if line[0] == "go":
        deadline = time.monotonic() + 30
        while stats()["swap"]["notices"] < int(line[1]) and time.monotonic() < deadline:
            lib.kforge_hook_report_now(1000)
        loader_round()
        during = stats()
        exact = calls(40)
        loader_round()
        emit({"during": during, "stats": stats(), "exact": exact})
    elif line[0] == "watch":
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            calls(1)
            if entry(stats())["state"] != "active":
                break
            time.sleep(0.005)
        took = time.monotonic() - t0
        emit({"stats": stats(), "exact": calls(20), "took": took})
"""


def test_live_upgrade_then_disable_in_the_cache(hook_path, build_dir, tools, softmax_signature, tmp_path):
    zmq = pytest.importorskip("zmq")
    msgpack = pytest.importorskip("msgpack")
    cache, a = make_cache(tmp_path, tools, softmax_signature, "good")
    d = tempfile.mkdtemp(prefix="kf-")
    endpoint = f"ipc://{d}/daemon.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    env = child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_DAEMON_ENDPOINT=endpoint, KFORGE_MODE="active",
                    KFORGE_CONFIRM_WIN=0, KFORGE_SHADOW_CALLS=SHADOW_CALLS)
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(LIVE)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result():
        line = proc.stdout.readline()
        assert line.startswith("RESULT "), line + proc.stderr.read()
        return json.loads(line[len("RESULT "):])

    def say(text):
        proc.stdin.write(text + "\n")
        proc.stdin.flush()

    try:
        (s,) = softmax_sig(result()["stats"])
        assert s["entry"] == a and s["state"] == "active", s
        ident = None
        for _ in range(60):
            if router.poll(timeout=500):
                ident, _ = router.recv_multipart()
                break
        assert ident is not None, "the hook never connected"
        # The better kernel, republished under the same key with a higher speedup.
        e = dict(os.environ)
        if torch_nvrtc():
            e["KFORGE_LIBNVRTC"] = torch_nvrtc()
        r = subprocess.run([str(tools.publish), "--cache", str(cache), "--signature", softmax_signature["encoding"],
                            "--backend", "cuda", "--device", "0", "--source", str(tools.dir / "softmax.cu"),
                            "--entry", "softmax_rows", "--launch", KERNEL_LAUNCH, "--output", "like:0",
                            "--torch-version", softmax_signature["torch_version"], "--speedup", "2",
                            *[f"--compile-option={o}" for o in KERNEL_OPTIONS["good2"]]],
                           capture_output=True, text=True, env=e)
        assert r.returncode == 0 and r.stdout.strip() == a, r.stderr
        router.send_multipart([ident, msgpack.packb(["kforge", 1, 5, [bytes.fromhex(s["id"]), bytes(16), a, 2.0]])])
        say("go 1")
        r = result()
        during = entry(r["during"])
        assert during["state"] == "shadow" and during["previous_entry"] == a, during
        assert during["previous_state"] == "active" and during["speedup"] == 2, during
        s = entry(r["stats"])
        assert s["state"] == "active" and s["previous_entry"] == "" and s["speedup"] == 2, s
        assert s["shadow_calls"] == SHADOW_CALLS and r["stats"]["swap"]["upgrades"] == 1, s
        assert s["pytorch_median_ns"] > 0 and s["entry_median_ns"] > 0, s
        assert all(r["exact"][:SHADOW_CALLS])   # the trial's calls got PyTorch's result

        subprocess.run([str(build_dir / "tools" / "kforge"), "--cache-dir", str(cache), "cache", "disable", a],
                       check=True, capture_output=True)
        say("watch")
        r = result()
        s = entry(r["stats"])
        assert s["state"] == "disabled" and s["reason"].startswith("entry disabled in the cache"), s
        assert r["took"] < 2.0 and all(r["exact"]), r
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        router.close()
        ctx.term()
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "disabled in the cache: PyTorch's kernel runs" in err, err


OUT_MODEL = """
torch.manual_seed(0)
xs = [(torch.randn(64, 1000) * (1 + i % 3)).to(DEVICE) for i in range(CALLS + 1)]
ys = []
for x in xs:                               # out= calls only: first sight, trial and active use
    y = torch.empty(64, 1000, device=DEVICE)
    assert torch._softmax(x, -1, False, out=y) is y
    ys.append(y)
    if len(ys) == 1:
        torch.cuda.synchronize()
        loader_round()
torch.cuda.synchronize()
served = stats()
x = xs[1]
base = torch.empty(64 * 1000 + 4, device=DEVICE)
odd = {"misaligned": torch._softmax(x, -1, False, out=base[4:].view(64, 1000)).cpu(),   # 16 bytes in
       "resized": torch._softmax(x, -1, False, out=torch.empty(0, device=DEVICE)).cpu()}
alias = x.clone()
odd["aliased"] = torch._softmax(alias, -1, False, out=alias).cpu()
torch.cuda.synchronize()
torch.save({"xs": [x.cpu() for x in xs], "ys": [y.cpu() for y in ys], "odd": odd}, os.environ["KFORGE_TEST_OUT"])
emit({"served": served, "stats": stats()})
"""


def test_an_entry_serves_out_calls_into_the_callers_tensor(hook_path, tools, softmax_signature, tmp_path):
    # Note [Out variants] in interposer/hook/swap_call.cc, on CUDA: _softmax.out goes through the
    # functional signature's trial and then the entry writes the caller's tensor on torch's
    # stream; out tensors it cannot write as they are get PyTorch's out kernel.
    cache, key = make_cache(tmp_path, tools, softmax_signature, "good")
    calls = 2 * SHADOW_CALLS
    out = tmp_path / "out.pt"
    res, err = run_child(OUT_MODEL.replace("CALLS", str(calls)),
                         child_env(hook_path, KFORGE_CACHE_DIR=cache, KFORGE_TEST_OUT=out, KFORGE_MODE="active",
                                   KFORGE_CONFIRM_WIN=0, KFORGE_SHADOW_CALLS=SHADOW_CALLS))
    assert "aten::_softmax.out@CUDA" in res["stats"]["registered"]
    sig = entry(res["served"])
    assert sig["state"] == "active" and sig["entry"] == key, (sig, err)
    assert sig["calls"] == calls + 1 and sig["shadow_calls"] == sig["clean_shadow_calls"] == SHADOW_CALLS, sig
    assert sig["active_calls"] == calls - SHADOW_CALLS and sig["fallbacks"] == 0, sig
    data = torch.load(out)
    for i, (x, y) in enumerate(zip(data["xs"], data["ys"])):
        if i <= SHADOW_CALLS:
            assert torch.equal(y, plain(x)), i
        assert criterion_error(x, y) == "", (i, criterion_error(x, y))
    assert any(not torch.equal(y, plain(x)) for x, y in zip(data["xs"][SHADOW_CALLS + 1:], data["ys"][SHADOW_CALLS + 1:]))
    for name, y in data["odd"].items():
        assert torch.equal(y, plain(data["xs"][1])), name
    assert entry(res["stats"])["active_calls"] == calls - SHADOW_CALLS
