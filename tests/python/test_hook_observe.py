"""The hook in observe mode, inside real PyTorch processes.

The hook (libkforge_hook-torch<major.minor>.so) is loaded with ctypes after `import torch`, exactly
as the preload shim will load it. In observe mode it must be invisible to the program: every output
bitwise identical to a run without it, no delay when no daemon is there. And it must see what ran:
one count per intercepted call, per signature, with signatures equal to what Python itself knows of
the tensors (dtype, sizes, strides, data-pointer alignment, scalar arguments), encoded exactly as
OpSignature's canonical msgpack (checked here against Python's msgpack, an independent encoder),
and reported to a daemon over ZeroMQ.

Each scenario runs in fresh subprocesses (the hook registers once per process and never leaves), and
processes synchronize through their stdout/stdin and ZeroMQ with timeouts, never with sleeps.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import msgpack
import pytest
import torch

TORCH_MM = ".".join(torch.__version__.split("+")[0].split(".")[:2])


@pytest.fixture(scope="session")
def catalog_ops(build_dir):
    """Every operator of the catalog (runtime/op_catalog.h), as `kforge ops --json` lists them: the
    tests never keep a list of their own."""
    r = subprocess.run([str(build_dir / "tools" / "kforge"), "ops", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ops = json.loads(r.stdout)
    assert all(o["complete"] for o in ops), [o["incomplete"] for o in ops if not o["complete"]]
    return {o["operator"]: set(o["backends"]) for o in ops}


def on(catalog_ops, dev):
    """The catalog operators with a template family for `dev` ("cpu", "cuda"): every operator has
    both but the CUDA-only ones (cudnn_batch_norm: PyTorch has no CPU kernel for it)."""
    return {op for op, backends in catalog_ops.items() if dev in backends}


# Out variants the catalog names that get no interceptor, and why (Note [Out variants] in
# interposer/hook/swap_call.cc): _to_copy.out does not take _to_copy's arguments.
UNSERVED_OUT_VARIANTS = {"aten::_to_copy.out"}


@pytest.fixture(scope="session")
def out_variants(build_dir):
    """{functional operator: its out variant} for every catalog operator that names one."""
    r = subprocess.run([str(build_dir / "tools" / "kforge"), "ops", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {o["operator"]: o["out_variant"] for o in json.loads(r.stdout) if o["out_variant"]}


def intercepted(catalog_ops, out_variants, dev):
    """What the hook registers at `dev`: the catalog operators and their out variants."""
    ops = on(catalog_ops, dev)
    return ops | {v for op, v in out_variants.items() if op in ops and v not in UNSERVED_OUT_VARIANTS}

# Imported by every child: loads the hook when KFORGE_TEST_HOOK names it, and reads its stats.
PRELUDE = textwrap.dedent(
    """
    import ctypes, json, os, sys, time
    import torch
    import torch.nn.functional as F
    HOOK = os.environ.get("KFORGE_TEST_HOOK")
    lib = None
    if HOOK:
        lib = ctypes.CDLL(HOOK)
        lib.kforge_hook_stats_json.restype = ctypes.c_char_p
        lib.kforge_hook_report_now.argtypes = [ctypes.c_int]
    def stats():
        return json.loads(lib.kforge_hook_stats_json()) if lib else None
    def emit(obj):
        print("RESULT " + json.dumps(obj), flush=True)
    """
)


@pytest.fixture(scope="module")
def hook_path(build_dir):
    p = build_dir / "interposer" / "hook" / f"libkforge_hook-torch{TORCH_MM}.so"
    if not p.exists():
        pytest.fail(f"no hook at {p}: build the kforge_hook target")
    return p


@pytest.fixture(scope="module")
def cpu_arch(build_dir):
    out = subprocess.run([build_dir / "tools" / "kforge", "env", "--json"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)["cpu_environment"]["arch"]


def child_env(hook=None, observe_every=1, **extra):
    # The hook reads KFORGE_*: none of the caller's may leak into a child.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k != "LD_PRELOAD"}
    # Most tests here count calls exactly: every call observed. observe_every=None leaves the
    # hook's default (about one in 16 of an operator with no kernel loaded: Note [Observed calls]).
    if observe_every is not None:
        env["KFORGE_OBSERVE_EVERY"] = str(observe_every)
    # Nobody serves this endpoint unless a test says otherwise: the hook never talks to a real daemon.
    # A private (0700) directory nobody serves: the hook refuses socket directories others can write.
    env["KFORGE_DAEMON_ENDPOINT"] = f"ipc://{tempfile.mkdtemp(prefix='kforge-nobody-')}/daemon.sock"
    if hook is not None:
        env["KFORGE_TEST_HOOK"] = str(hook)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def loaded_by(how, hook, build_dir):
    """Environment for a child whose hook is loaded by ctypes (its own thread-local block) or by the
    preload shim, as in production (the shim's static TLS block: Note [The hook's thread block])."""
    if how == "ctypes":
        return {}
    shim = build_dir / "interposer" / "libkforge_preload.so"
    if not shim.exists():
        pytest.fail(f"{shim} is missing: cmake --build {build_dir} --target kforge_preload")
    return {"LD_PRELOAD": shim, "KFORGE_HOOK_DIR": hook.parent}


def expected_thread_block(how):
    return "shim" if how == "shim" else "own (no preload shim in the process)"


def run_child(body, env, timeout=240):
    """Runs PRELUDE + body in a fresh interpreter; returns (result object, stderr, wall seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    results = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, proc.stdout + proc.stderr
    return json.loads(results[-1]), proc.stderr, wall


def assert_bitwise_equal(a_path, b_path):
    a = torch.load(a_path)
    b = torch.load(b_path)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), f"{k} differs with the hook loaded"


# ---- the models ---------------------------------------------------------------------------------

MODELS = """
import torchvision
from transformers import GPT2Config, GPT2LMHeadModel

DEV = os.environ.get("KFORGE_TEST_DEVICE", "cpu")
if DEV == "cuda":
    # Bitwise comparison across processes needs the same algorithms in both (cuDNN, cuBLAS).
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)

class Small(torch.nn.Module):
    # Every catalog operator, on CPU: layer_norm, group_norm, gelu, silu, add, relu, sigmoid, tanh,
    # hardswish, sub, mul (Tensor, Scalar), div, mean, amax, sum, neg, rsqrt, exp, pow, relu_, add_, mul_, _safe_softmax,
    # _to_copy, argmax, clamp_min, clamp_min_, upsample_nearest2d, max_pool2d_with_indices, cumsum,
    # avg_pool2d, _adaptive_avg_pool2d, upsample_bilinear2d,
    # batch norm (cuDNN off: on CUDA
    # resnet18's reaches cudnn_batch_norm), softmax, log_softmax; embedding is GPT-2's.
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32, 32)
        self.gn = torch.nn.GroupNorm(4, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.bn.running_mean.normal_()
        self.bn.running_var.uniform_(0.5, 2.0)
    def forward(self, x):                      # x: [8, 16, 32]
        h = F.gelu(self.fc(self.ln(x)))
        h = h + x
        h = self.gn(h)
        # cudnn_enabled=False alone still reaches cudnn_batch_norm on CUDA (torch 2.11, checked on an
        # H100): only cuDNN switched off makes it native_batch_norm there.
        with torch.backends.cudnn.flags(enabled=False):
            h = torch.batch_norm(h, self.bn.weight, self.bn.bias, self.bn.running_mean, self.bn.running_var,
                                 False, 0.1, 1e-5, False)
        h = F.silu(h) + F.gelu(F.relu(h), approximate="tanh")
        h = torch.sigmoid(h) * torch.tanh(h) - F.hardswish(h) / (h.abs() + 1)
        h = h - h.mean(-1, keepdim=True) + h.amax(-1, keepdim=True) * 0.1 + h.sum(-1, keepdim=True) * 0.01
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) + torch.exp(-h) * 1e-3
        h = torch.ops.aten.mul.Scalar(h, 0.5)   # what the math attention path calls to scale
        g = h * 1.5
        g.add_(h).mul_(torch.sigmoid(h)).relu_()   # in place: add_, mul_, relu_ (resnet's residual and ReLU)
        h = h + g
        h = h.double().float()                     # _to_copy, both ways (exact)
        h = torch.cat([h, h.transpose(1, 2).contiguous().transpose(1, 2)], 0)   # cat, clone
        return {"softmax": torch.softmax(h, dim=-1), "log_softmax": torch.log_softmax(h, dim=1), "h": h,
                "safe_softmax": torch.ops.aten._safe_softmax(h, -1),   # math attention's softmax
                "argmax": h.argmax(-1),                                 # greedy decoding's next token
                "clamp": h.clamp_min(-0.25) + h.clone().clamp_min_(0.0),
                "upsample": F.interpolate(h.unsqueeze(1), scale_factor=2.0),   # a UNet decoder's nearest 2x
                "max_pool": F.max_pool2d(h.unsqueeze(1), 3, 2, 1),             # resnet's stem
                "cumsum": h.cumsum(-1),
                "avg_pool": F.avg_pool2d(h.unsqueeze(1), 3, 2, 1, count_include_pad=False),
                "adaptive_avg_pool": F.adaptive_avg_pool2d(h.unsqueeze(1), (5, 7)),   # not 1x1: no mean
                # The aten op itself: with deterministic algorithms on CUDA (above), F.interpolate's
                # bilinear mode runs a Python decomposition instead of it.
                "bilinear": torch.ops.aten.upsample_bilinear2d.vec(h.unsqueeze(1), None, False, [2.0, 2.0])}

torch.manual_seed(0)
out = {}
with torch.no_grad():
    small = Small().eval().to(DEV)
    for k, v in small(torch.randn(8, 16, 32).to(DEV)).items():
        out["small." + k] = v
    resnet = torchvision.models.resnet18(weights=None).eval().to(DEV)
    out["resnet18"] = resnet(torch.randn(2, 3, 112, 112).to(DEV))
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0,
                     attn_implementation="eager")
    gpt2 = GPT2LMHeadModel(cfg).eval().to(DEV)
    out["gpt2.logits"] = gpt2(torch.randint(0, 1000, (2, 16)).to(DEV)).logits
out = {k: v.cpu() for k, v in out.items()}
torch.save(out, sys.argv[1] if len(sys.argv) > 1 else os.environ["KFORGE_TEST_OUT"])
emit({"stats": stats()})
if os.environ.get("KFORGE_TEST_WAIT"):
    assert lib.kforge_hook_report_now(10000) == 1   # built and offered, without waiting an interval
    sys.stdin.read()                                # the test closes stdin once it has the reports
"""

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]


# The same models on each device: on CPU here and in CI, on CUDA where a GPU is.
@pytest.fixture(scope="module", params=DEVICES)
def model_runs(request, hook_path, tmp_path_factory):
    dev = request.param
    d = tmp_path_factory.mktemp("models-" + dev)
    plain, _, plain_wall = run_child(MODELS, child_env(KFORGE_TEST_OUT=d / "plain.pt", KFORGE_TEST_DEVICE=dev))
    # The hook as it runs by default.
    hooked, hooked_err, hooked_wall = run_child(
        MODELS, child_env(hook_path, observe_every=None, KFORGE_TEST_OUT=d / "hooked.pt", KFORGE_TEST_DEVICE=dev))
    assert plain["stats"] is None
    return {"dir": d, "stats": hooked["stats"], "stderr": hooked_err, "device": dev,
            "wall": (plain_wall, hooked_wall)}


def device_signatures(s, dev):
    """The signatures of calls on `dev` (their target is "cpu:<arch>" or "cuda:sm_XY")."""
    return [sig for sig in s["signatures"] if sig["signature"].rsplit(" ", 1)[-1].startswith(dev + ":")]


def test_hook_registers_every_catalog_operator_at_cpu(model_runs, catalog_ops, out_variants):
    s = model_runs["stats"]
    assert s["started"] and s["mode"] == "observe"
    assert {r.split("@")[0] for r in s["registered"] if r.endswith("@CPU")} == intercepted(catalog_ops, out_variants, "cpu")
    # This torch is a CUDA build: its CUDA kernels exist even on a host without a GPU.
    assert {r.split("@")[0] for r in s["registered"] if r.endswith("@CUDA")} == intercepted(catalog_ops, out_variants,
                                                                                              "cuda")
    for v in UNSERVED_OUT_VARIANTS:
        assert any(x.startswith(v + "@CPU: no out-variant interceptor") for x in s["skipped"]), s["skipped"]
    # Every catalog operator gets the typed (unboxed) interceptor, the one without boxing costs
    # (Note [Typed interceptors] in interceptor.cc); "boxed" would name why here.
    assert s["interceptors"] == {r: "typed" for r in s["registered"]}


def test_small_model_outputs_are_bitwise_identical(model_runs, catalog_ops):
    d = model_runs["dir"]
    a = torch.load(d / "plain.pt")
    b = torch.load(d / "hooked.pt")
    for k in [k for k in a if k.startswith("small.")]:
        assert torch.equal(a[k], b[k]), k
    # ... and the hook saw each catalog operator the model used, with the encoders agreeing.
    s = model_runs["stats"]
    seen = {sig["op"] for sig in device_signatures(s, model_runs["device"])}
    assert on(catalog_ops, model_runs["device"]) <= seen
    assert s["id_mismatches"] == 0 and s["unknown_calls"] == 0


def test_resnet18_outputs_are_bitwise_identical(model_runs):
    d = model_runs["dir"]
    assert torch.equal(torch.load(d / "plain.pt")["resnet18"], torch.load(d / "hooked.pt")["resnet18"])


def test_gpt2_outputs_are_bitwise_identical(model_runs):
    d = model_runs["dir"]
    assert torch.equal(torch.load(d / "plain.pt")["gpt2.logits"], torch.load(d / "hooked.pt")["gpt2.logits"])
    s = model_runs["stats"]
    assert s["id_mismatches"] == 0 and s["overflow_calls"] == 0


# ---- counts and signatures ------------------------------------------------------------------------

# Each case: a call made N times on fixed tensors, and the signature Python expects for it, as the
# canonical msgpack array (Note [Canonical signature encoding]); alignment and strides come from
# the tensors themselves. The child packs them with Python's msgpack and compares bytes.
COUNTS = """
import msgpack

def align(t):
    p = t.data_ptr()
    if p == 0:
        return 16
    a = p & -p
    return min(a, 16)

DT = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int64: 8}
def T(t):
    return [1, DT[t.dtype], 0, list(t.shape), list(t.stride()), align(t)]

torch.manual_seed(0)
x = torch.randn(4, 8)
xt = torch.randn(8, 4).t()                 # non-contiguous
xs = torch.randn(33)[1:]                   # data pointer 4 bytes past an aligned allocation
xd = torch.randn(3, 5, dtype=torch.float64)
xb = torch.randn(2, 6, dtype=torch.bfloat16)   # not .to(): _to_copy is intercepted
img = torch.randn(2, 8, 5, 5)
w8, b8 = torch.randn(8), torch.randn(8)
m8, v8 = torch.randn(8), torch.empty(8).uniform_(0.5, 1.5)   # no intercepted operator
xr, xa, xm, xm2, xc = (torch.randn(4, 8) for _ in range(5))   # written in place
n0 = torch.randn(0, 8)                     # no elements: null data pointer
ix = torch.tensor([[0, 3], [2, 2]])        # int64 indices into a [4, 2] table
cases = [
    (3,  lambda: torch.softmax(x, -1),                 ["aten::_softmax", "", [T(x), [4, -1], [3, False]]]),
    (5,  lambda: torch.softmax(x, 0),                  ["aten::_softmax", "", [T(x), [4, 0], [3, False]]]),
    (7,  lambda: torch.log_softmax(xt, 1),             ["aten::_log_softmax", "", [T(xt), [4, 1], [3, False]]]),
    (2,  lambda: F.layer_norm(x, [8], w8, b8, 1e-5),   ["aten::native_layer_norm", "", [T(x), [7, [8]], T(w8), T(b8), [5, 1e-5]]]),
    (4,  lambda: F.layer_norm(xd, [5]),                ["aten::native_layer_norm", "", [T(xd), [7, [5]], [0], [0], [5, 1e-5]]]),
    (6,  lambda: F.group_norm(img, 4, w8, None, 1e-6), ["aten::native_group_norm", "", [T(img), T(w8), [0], [4, 2], [4, 8], [4, 25], [4, 4], [5, 1e-6]]]),
    (8,  lambda: F.gelu(xs),                           ["aten::gelu", "", [T(xs), [6, "none"]]]),
    (9,  lambda: F.gelu(xb, approximate="tanh"),       ["aten::gelu", "", [T(xb), [6, "tanh"]]]),
    (10, lambda: F.silu(xd),                           ["aten::silu", "", [T(xd)]]),
    (11, lambda: x + x,                                ["aten::add", "Tensor", [T(x), T(x), [4, 1]]]),
    (12, lambda: torch.add(x, xt, alpha=2),            ["aten::add", "Tensor", [T(x), T(xt), [4, 2]]]),
    (13, lambda: torch.add(xd, xd, alpha=0.5),         ["aten::add", "Tensor", [T(xd), T(xd), [5, 0.5]]]),
    (14, lambda: F.silu(n0),                           ["aten::silu", "", [T(n0)]]),
    (15, lambda: F.relu(xt),                           ["aten::relu", "", [T(xt)]]),
    (16, lambda: torch.sigmoid(x),                     ["aten::sigmoid", "", [T(x)]]),
    (17, lambda: torch.tanh(xd),                       ["aten::tanh", "", [T(xd)]]),
    (18, lambda: F.hardswish(xb),                      ["aten::hardswish", "", [T(xb)]]),
    (19, lambda: x - w8,                               ["aten::sub", "Tensor", [T(x), T(w8), [4, 1]]]),
    (20, lambda: torch.sub(x, xt, alpha=0.25),         ["aten::sub", "Tensor", [T(x), T(xt), [5, 0.25]]]),
    (21, lambda: img * w8.view(8, 1, 1),               ["aten::mul", "Tensor", [T(img), T(w8.view(8, 1, 1))]]),
    (22, lambda: xs / xs,                              ["aten::div", "Tensor", [T(xs), T(xs)]]),
    (23, lambda: F.batch_norm(img, m8, v8, w8, None, False, 0.1, 1e-5),
                                                       ["aten::native_batch_norm", "", [T(img), T(w8), [0], T(m8), T(v8), [3, False], [5, 0.1], [5, 1e-5]]]),
    (24, lambda: x.mean(-1, keepdim=True),             ["aten::mean", "dim", [T(x), [7, [-1]], [3, True], [0]]]),
    (25, lambda: torch.sum(img, (2, 3)),               ["aten::sum", "dim_IntList", [T(img), [7, [2, 3]], [3, False], [0]]]),
    (26, lambda: torch.sum(x, -1, dtype=torch.float64), ["aten::sum", "dim_IntList", [T(x), [7, [-1]], [3, False], [4, 7]]]),
    (27, lambda: torch.amax(xd, 1),                    ["aten::amax", "", [T(xd), [7, [1]], [3, False]]]),
    (28, lambda: -x,                                   ["aten::neg", "", [T(x)]]),
    (29, lambda: torch.rsqrt(v8),                      ["aten::rsqrt", "", [T(v8)]]),
    (30, lambda: torch.exp(xb),                        ["aten::exp", "", [T(xb)]]),
    (31, lambda: x.pow(2),                             ["aten::pow", "Tensor_Scalar", [T(x), [4, 2]]]),
    (32, lambda: xd ** 0.5,                            ["aten::pow", "Tensor_Scalar", [T(xd), [5, 0.5]]]),
    (34, lambda: torch.ops.aten.mul.Scalar(x, 0.125),  ["aten::mul", "Scalar", [T(x), [5, 0.125]]]),
    (35, lambda: torch.cat([x, x], 1),                 ["aten::cat", "", [[2, [T(x)[1:], T(x)[1:]]], [4, 1]]]),
    (37, lambda: xt.contiguous(),                      ["aten::clone", "", [T(xt), [4, 0]]]),
    (38, lambda: x.clone(),                            ["aten::clone", "", [T(x), [0]]]),
    (36, lambda: torch.cat([xs, xs], 0),               ["aten::cat", "", [[2, [T(xs)[1:], T(xs)[1:]]], [4, 0]]]),
    (33, lambda: F.embedding(ix, w8.view(4, 2)),      ["aten::embedding", "", [T(w8.view(4, 2)), T(ix), [4, -1], [3, False], [3, False]]]),
    (39, lambda: xr.relu_(),                           ["aten::relu_", "", [T(xr)]]),
    (40, lambda: xa.add_(w8, alpha=2),                 ["aten::add_", "Tensor", [T(xa), T(w8), [4, 2]]]),
    (41, lambda: xm.mul_(xm2),                         ["aten::mul_", "Tensor", [T(xm), T(xm2)]]),
    (42, lambda: torch.ops.aten._safe_softmax(x, -1),  ["aten::_safe_softmax", "", [T(x), [4, -1], [0]]]),
    (43, lambda: x.to(torch.float64),                  ["aten::_to_copy", "", [T(x), [4, 7], [0], [0], [0], [3, False], [0]]]),
    (44, lambda: xb.float(),                           ["aten::_to_copy", "", [T(xb), [4, 6], [0], [0], [0], [3, False], [0]]]),
    (45, lambda: x.to("cpu", torch.float64),           ["aten::_to_copy", "", [T(x), [4, 7], [0], [6, "cpu"], [0], [3, False], [0]]]),
    (46, lambda: x.argmax(-1),                         ["aten::argmax", "", [T(x), [4, -1], [3, False]]]),
    (47, lambda: torch.argmax(xd, keepdim=True),       ["aten::argmax", "", [T(xd), [0], [3, True]]]),
    (48, lambda: x.clamp_min(1e-6),                    ["aten::clamp_min", "", [T(x), [5, 1e-6]]]),
    (49, lambda: xc.clamp_min_(0),                     ["aten::clamp_min_", "", [T(xc), [4, 0]]]),
    (50, lambda: F.interpolate(img, scale_factor=2.0), ["aten::upsample_nearest2d", "", [T(img), [7, [10, 10]], [5, 2.0], [5, 2.0]]]),
    (52, lambda: x.cumsum(0),                          ["aten::cumsum", "", [T(x), [4, 0], [0]]]),
    (51, lambda: F.max_pool2d(img, 3, 2, 1),          ["aten::max_pool2d_with_indices", "", [T(img), [7, [3, 3]], [7, [2, 2]], [7, [1, 1]], [7, [1, 1]], [3, False]]]),
    (53, lambda: F.avg_pool2d(img, 2, ceil_mode=True, count_include_pad=False),
                                                       ["aten::avg_pool2d", "", [T(img), [7, [2, 2]], [7, []], [7, [0, 0]], [3, True], [3, False], [0]]]),
    (54, lambda: F.adaptive_avg_pool2d(img, (3, 2)),   ["aten::_adaptive_avg_pool2d", "", [T(img), [7, [3, 2]]]]),
    (55, lambda: F.interpolate(img, size=(7, 9), mode="bilinear"),
                                                       ["aten::upsample_bilinear2d", "", [T(img), [7, [7, 9]], [3, False], [0], [0]]]),
]
arch = os.environ["KFORGE_TEST_ARCH"]
expected = {}
with torch.no_grad():
    for n, fn, sig in cases:
        for _ in range(n):
            fn()
        enc = msgpack.packb([1, sig[0], sig[1], sig[2], [0, arch]]).hex()
        expected[enc] = expected.get(enc, 0) + n
emit({"stats": stats(), "expected": expected})
"""


def test_counts_and_signatures_match_the_calls(hook_path, cpu_arch):
    result, _, _ = run_child(COUNTS, child_env(hook_path, KFORGE_TEST_ARCH=cpu_arch))
    s = result["stats"]
    got = {sig["encoding"]: sig for sig in s["signatures"]}
    for enc, n in result["expected"].items():
        assert enc in got, f"no signature {msgpack.unpackb(bytes.fromhex(enc))}; got " + \
            ", ".join(sig["signature"] for sig in s["signatures"])
        assert got[enc]["calls"] == n, got[enc]["signature"]
    # Nothing else was intercepted (no hidden internal calls), and nothing was unknown.
    assert sum(sig["calls"] for sig in s["signatures"]) == sum(result["expected"].values())
    assert s["unknown_calls"] == 0 and s["overflow_calls"] == 0
    # The fast path's id equals OpSignature::id() of the signature it built, for every one of them.
    assert s["id_mismatches"] == 0
    assert len({sig["id"] for sig in s["signatures"]}) == len(s["signatures"])


OBSERVED = """
a, b = torch.randn(4, 8), torch.randn(2, 16)
with torch.no_grad():
    F.layer_norm(a, [8])            # once: a thread's first call of an operator is always observed
    for _ in range(12000):          # two shapes in turn: a fixed sampling period could see only one
        torch.softmax(a, -1)
        torch.softmax(b, -1)
    for _ in range(1000):
        F.gelu(a)
emit({"stats": stats()})
"""


@pytest.mark.parametrize("how", ["ctypes", "shim"])
def test_by_default_about_one_call_in_16_is_observed_and_the_counts_still_add_up(hook_path, build_dir, how):
    # The default: no replacement is loaded, so each thread observes about one call in 16 of each
    # operator (Note [Observed calls]); KFORGE_SAMPLE_RATE=1 times every observed call, so
    # sampled_calls counts them. The countdowns live in the thread's block, the hook's own
    # thread_local or the shim's static TLS.
    result, _, _ = run_child(OBSERVED, child_env(hook_path, observe_every=None, KFORGE_SAMPLE_RATE=1,
                                                 **loaded_by(how, hook_path, build_dir)))
    s = result["stats"]
    assert s["thread_block"] == expected_thread_block(how)
    assert " observe_every=16 " in s["config"], s["config"]
    by_op = lambda op: [sig for sig in s["signatures"] if sig["op"] == op]  # noqa: E731
    assert [sig["calls"] for sig in by_op("aten::native_layer_norm")] == [1]
    softmax = by_op("aten::_softmax")
    assert len(softmax) == 2, [sig["signature"] for sig in softmax]
    # Each observed call counts the calls skipped before it: exact up to the last observed call,
    # and gaps are at most 31 calls.
    total = sum(sig["calls"] for sig in softmax)
    assert 24000 - 31 < total <= 24000, total
    # Each signature's share is estimated from about 750 observed calls: its standard deviation is
    # about 340 calls here (simulated), so +-20% is 7 of them (with 3000 calls each it was 3.5).
    for sig in softmax:
        assert 0.8 * 12000 <= sig["calls"] <= 1.2 * 12000, (sig["signature"], sig["calls"])
    observed = sum(sig["sampled_calls"] for sig in softmax)
    assert 1200 <= observed <= 1840, observed        # 24000 / 16 = 1500
    gelu = by_op("aten::gelu")
    assert len(gelu) == 1 and 1000 - 31 < gelu[0]["calls"] <= 1000 and gelu[0]["sampled_calls"] <= 100
    assert s["unknown_calls"] == 0 and s["id_mismatches"] == 0


THREADS = """
import threading
x = torch.randn(16, 16)
def work():
    with torch.no_grad():
        for _ in range(1000):
            torch.softmax(x, -1)
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
work()                                      # and the main thread
emit({"stats": stats()})
"""


@pytest.mark.parametrize("how", ["ctypes", "shim"])
def test_counts_from_many_threads_add_up_after_the_threads_exit(hook_path, build_dir, how):
    result, _, _ = run_child(THREADS, child_env(hook_path, **loaded_by(how, hook_path, build_dir)))
    s = result["stats"]
    assert s["thread_block"] == expected_thread_block(how)
    softmax = [sig for sig in s["signatures"] if sig["op"] == "aten::_softmax"]
    assert len(softmax) == 1
    assert softmax[0]["calls"] == 5000
    assert s["threads"] == 5
    # Per thread and signature, the first call is timed and then one in 64: 1000 calls -> 16
    # samples in each of 5 threads.
    assert softmax[0]["sampled_calls"] == 5 * ((1000 + 63) // 64)
    assert softmax[0]["sampled_ns"] > 0


FORK = """
# GNU OpenMP cannot be used in a child forked after the parent used its thread pool (a hang with or
# without kforge), so this process stays on one thread.
torch.set_num_threads(1)
x = torch.randn(4, 4)
with torch.no_grad():
    for _ in range(10):
        torch.softmax(x, -1)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    with torch.no_grad():
        for _ in range(3):
            torch.softmax(x, -1)
    os.write(w, json.dumps(stats()).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.fdopen(r).read())
os.waitpid(pid, 0)
emit({"parent": stats(), "child": child})
"""


def test_a_forked_child_counts_its_own_calls(hook_path):
    result, _, _ = run_child(FORK, child_env(hook_path), timeout=60)
    calls = lambda s: sum(sig["calls"] for sig in s["signatures"])  # noqa: E731
    assert calls(result["parent"]) == 10
    assert calls(result["child"]) == 3
    assert result["child"]["pid"] != result["parent"]["pid"]


# ---- the daemon side ------------------------------------------------------------------------------

REPORTING = """
x = torch.randn(6, 10)
with torch.no_grad():
    for _ in range(25):
        torch.softmax(x, -1)
        F.gelu(x)
emit({"stats": stats()})
assert lib.kforge_hook_report_now(10000) == 1   # built and offered, without waiting an interval
sys.stdin.read()                                # the test closes stdin once it has the report
"""


def collect_reports(router, pid, want, timeout=60, gpus=None):
    """Reads the ROUTER until a Hello and HotReports whose cumulative counts equal `want` arrived.
    Each report's gpus_in_use is appended to `gpus` when given."""
    hello, reported = None, {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (hello is None or reported != want):
        if not router.poll(timeout=1000):
            continue
        frames = router.recv_multipart()
        assert len(frames) == 2, frames            # [routing id, message]
        magic, version, mtype, body = msgpack.unpackb(frames[1])
        assert magic == "kforge" and version == 1
        if mtype == 1:                              # Hello
            hello = body
        elif mtype == 2:                            # HotReport: [pid, sequence, dropped, entries, gpus_in_use]
            assert body[0] == pid and body[1] >= 1
            assert len(body) == 5, body[:3]
            if gpus is not None:
                gpus.append(body[4])
            for entry in body[3]:                   # [signature, calls, sampled, ns, stats]
                reported[msgpack.packb(entry[0]).hex()] = entry[1]
    return hello, reported


def test_hello_and_hot_reports_reach_a_daemon(hook_path):
    zmq = pytest.importorskip("zmq")          # in the project venv; absent from some GPU images
    d = tempfile.mkdtemp(prefix="kf-")
    endpoint = f"ipc://{d}/daemon.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(REPORTING)],
                            env=child_env(hook_path, KFORGE_DAEMON_ENDPOINT=endpoint),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("RESULT "), line + proc.stderr.read()
        stats = json.loads(line[len("RESULT "):])["stats"]
        want = {sig["encoding"]: sig["calls"] for sig in stats["signatures"]}
        assert len(want) == 2

        gpus = []
        hello, reported = collect_reports(router, proc.pid, want, timeout=30, gpus=gpus)
        assert hello is not None, "no Hello"
        assert hello[0] == proc.pid and hello[1] == stats["kforge_version"]
        assert hello[2] == torch.__version__
        assert hello[5][0][1] == 0                      # the CPU is device 0
        assert hello[5][0][5] == ""                     # ... and has no GPU UUID
        assert reported == want
        # A process that never used CUDA has no GPU in use, and the hook did not make it load CUDA.
        assert gpus and all(g == [] for g in gpus), gpus
        assert stats["gpus_in_use"] == []
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        router.close()
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    assert proc.returncode == 0


@pytest.mark.parametrize("dev", DEVICES)
def test_model_signatures_reach_a_daemon(hook_path, dev, tmp_path):
    # resnet18, GPT-2 and the small model under the hook with a ZeroMQ receiver as the daemon: it
    # gets a Hello and every signature the models ran, with the counts the process itself has.
    zmq = pytest.importorskip("zmq")
    d = tempfile.mkdtemp(prefix="kf-")
    endpoint = f"ipc://{d}/daemon.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    env = child_env(hook_path, KFORGE_DAEMON_ENDPOINT=endpoint, KFORGE_TEST_OUT=tmp_path / "out.pt",
                    KFORGE_TEST_DEVICE=dev, KFORGE_TEST_WAIT=1)
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(MODELS)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("RESULT "):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        stats = json.loads(line[len("RESULT "):])["stats"]
        want = {sig["encoding"]: sig["calls"] for sig in stats["signatures"]}
        assert device_signatures(stats, dev), stats["signatures"]
        hello, reported = collect_reports(router, proc.pid, want)
        assert hello is not None, "no Hello"
        assert reported == want
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        router.close()
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    assert proc.returncode == 0


CAPTURING = """
DEV = os.environ["KFORGE_TEST_DEVICE"]
torch.manual_seed(0)
x = torch.normal(0.0, 3.0, (6, 10)).to(DEV)   # no catalog operator: only the two calls below are sampled
x[0, 0] = float("nan")
x[1, 1] = float("-inf")
x[2, :4] = 0
xt = torch.randn(10, 6).to(DEV).t()          # non-contiguous: captured row-major, strides kept
with torch.no_grad():
    for _ in range(5):
        torch.softmax(x, -1)
        torch.add(xt, 1.0, alpha=2)
torch.save({"x": x.cpu(), "xt": xt.cpu()}, os.environ["KFORGE_TEST_OUT"])
assert lib.kforge_hook_report_now(20000) == 1   # samples drained, stats and captures offered
emit({"stats": stats()})
sys.stdin.read()
"""


def decode_capture(body):
    pid, sig_id, tensors = body
    out = {}
    for arg, dtype, sizes, strides, data in tensors:
        tdtype = {0: torch.float32, 1: torch.float64}[dtype]    # DType::kFloat32, kFloat64
        t = torch.frombuffer(bytearray(data), dtype=tdtype).reshape(sizes)
        out[arg] = (t, strides)
    return pid, bytes(sig_id).hex(), out


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("capture", [False, True])
def test_input_statistics_and_captured_inputs_reach_a_daemon(hook_path, dev, capture, tmp_path):
    # Every hot signature's report carries statistics of its inputs; with KFORGE_CAPTURE_INPUTS=1
    # (only then) the daemon also gets the inputs themselves, exactly as the call saw them.
    zmq = pytest.importorskip("zmq")
    d = tempfile.mkdtemp(prefix="kf-")
    endpoint = f"ipc://{d}/daemon.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    # The test's own copies to and from the device (.to(DEV), .cpu(): _to_copy) are not what it samples.
    env = child_env(hook_path, KFORGE_DAEMON_ENDPOINT=endpoint, KFORGE_TEST_OUT=tmp_path / "in.pt",
                    KFORGE_TEST_DEVICE=dev, KFORGE_CAPTURE_INPUTS=int(capture), KFORGE_DENY_OPS="aten::_to_copy")
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(CAPTURING)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stats_by_sig, captures = {}, []
    try:
        line = proc.stdout.readline()
        assert line.startswith("RESULT "), line + proc.stderr.read()
        s = json.loads(line[len("RESULT "):])["stats"]
        assert s["inputs"]["capture"] == capture
        assert s["inputs"]["sampled"] == 2 and s["inputs"]["failed"] == 0
        assert s["inputs"]["captured"] == (2 if capture else 0)
        def take(msg):
            _, _, mtype, body = msgpack.unpackb(msg)
            if mtype == 2:
                # Counters are cumulative: a report built while the child was still calling has
                # fewer calls, and a later one supersedes it.
                for sig, calls, _, _, input_stats, *_ in body[3]:   # [..., in_process] appended later
                    if input_stats:
                        stats_by_sig[sig[1]] = (calls, input_stats)
            elif mtype == 3:
                captures.append(decode_capture(body))
            return mtype

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (len(stats_by_sig) < 2 or any(c < 5 for c, _ in stats_by_sig.values())
                                               or len(captures) < (2 if capture else 0)):
            if router.poll(timeout=500):
                take(router.recv_multipart()[1])
        # A moment more: nothing else may arrive (no capture when it is off).
        while router.poll(timeout=300):
            assert take(router.recv_multipart()[1]) != 3, "CapturedInputs beyond those expected (or with capture off)"
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        router.close()
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    assert proc.returncode == 0
    inputs = torch.load(tmp_path / "in.pt")
    x = inputs["x"].double()
    fin = x[torch.isfinite(x)]
    calls, (st,) = stats_by_sig["aten::_softmax"]
    arg, lo, hi, mean, std, nan, inf, zero_fraction = st
    assert arg == 0 and calls == 5
    assert (nan, inf) == (1, 1)
    assert zero_fraction == pytest.approx(4 / 60)
    assert (lo, hi) == (fin.min().item(), fin.max().item())
    assert mean == pytest.approx(fin.mean().item(), rel=1e-9)
    assert std == pytest.approx(fin.std(unbiased=False).item(), rel=1e-6)
    # torch.add(t, 1.0) passes the number as a 0-dim tensor: both arguments are described.
    calls, add_stats = stats_by_sig["aten::add"]
    assert calls == 5 and [a for a, *_ in add_stats] == [0, 1]
    assert add_stats[1][1:5] == [1.0, 1.0, 1.0, 0.0]
    if capture:
        assert all(pid == proc.pid for pid, _, _ in captures)
        softmax = [t for _, _, t in captures if set(t) == {0} and t[0][0].shape == (6, 10)]
        assert softmax and torch.equal(softmax[0][0][0].nan_to_num(7), inputs["x"].nan_to_num(7))
        assert softmax[0][0][1] == [10, 1]
        added = [t for _, _, t in captures if set(t) == {0, 1}]
        assert added and added[0][0][1] == [1, 6]
        assert torch.equal(added[0][0][0], inputs["xt"].contiguous())
        assert added[0][1][0].shape == () and added[0][1][0].item() == 1.0
    else:
        assert captures == []


LATE_DAEMON = """
torch.manual_seed(0)
x = torch.randn(6, 10)
with torch.no_grad():
    for _ in range(3):
        torch.softmax(x, -1)
assert lib.kforge_hook_report_now(20000) == 1   # the capture is made, and no daemon is there
emit(stats())
sys.stdin.readline()                            # now one is
deadline = time.monotonic() + 30
while stats()["reports"]["extras_held"] and time.monotonic() < deadline:
    lib.kforge_hook_report_now(1000)
    time.sleep(0.05)
torch.save(x, os.environ["KFORGE_TEST_OUT"])
emit(stats())
sys.stdin.read()
"""


def test_captured_inputs_wait_for_a_daemon_that_connects_late(hook_path, tmp_path):
    # A report lost before the daemon connects is sent again, but a captured input is taken once:
    # it waits in the hook until a daemon is there (Note [Extras wait for a daemon]).
    zmq = pytest.importorskip("zmq")
    d = tempfile.mkdtemp(prefix="kf-")
    endpoint = f"ipc://{d}/daemon.sock"
    env = child_env(hook_path, KFORGE_DAEMON_ENDPOINT=endpoint, KFORGE_TEST_OUT=tmp_path / "x.pt",
                    KFORGE_CAPTURE_INPUTS=1, KFORGE_REPORT_INTERVAL_MS=100)
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(LATE_DAEMON)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    captures = []
    try:
        line = proc.stdout.readline()
        assert line.startswith("RESULT "), line + proc.stderr.read()
        before = json.loads(line[len("RESULT "):])
        assert before["inputs"]["captured"] == 1
        assert before["reports"]["extras_held"] == 1 and before["reports"]["extras_offered"] == 0
        router.bind(endpoint)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line.startswith("RESULT "), line + proc.stderr.read()
        after = json.loads(line[len("RESULT "):])
        assert after["reports"]["extras_held"] == 0 and after["reports"]["extras_offered"] == 1
        assert after["reports"]["extras_refused"] == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not captures:
            if router.poll(timeout=500):
                _, _, mtype, body = msgpack.unpackb(router.recv_multipart()[1])
                if mtype == 3:
                    captures.append(decode_capture(body))
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        router.close()
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    assert proc.returncode == 0
    (pid, _, tensors), = captures
    assert pid == proc.pid and set(tensors) == {0}
    assert torch.equal(tensors[0][0], torch.load(tmp_path / "x.pt"))


WORKLOAD = """
torch.manual_seed(0)
ln = torch.nn.LayerNorm(64)
x = torch.randn(32, 64)
t0 = time.perf_counter()
with torch.no_grad():
    for _ in range(2000):
        y = torch.softmax(F.gelu(ln(x)) + x, -1)
elapsed = time.perf_counter() - t0
torch.save({"y": y}, os.environ["KFORGE_TEST_OUT"])
if lib:
    # One more report, then wait (bounded) for the client thread to give up on it.
    assert lib.kforge_hook_report_now(10000) == 1
    deadline = time.monotonic() + 10
    while stats()["reports"]["client_dropped"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
emit({"stats": stats(), "elapsed": elapsed})
"""


def test_an_absent_daemon_changes_nothing(hook_path, tmp_path):
    plain, _, plain_wall = run_child(WORKLOAD, child_env(KFORGE_TEST_OUT=tmp_path / "plain.pt"))
    hooked, _, hooked_wall = run_child(
        WORKLOAD, child_env(hook_path, KFORGE_TEST_OUT=tmp_path / "hooked.pt", KFORGE_REPORT_INTERVAL_MS=20))
    assert_bitwise_equal(tmp_path / "plain.pt", tmp_path / "hooked.pt")
    s = hooked["stats"]
    # Reports were built and, with nobody to take them, dropped and counted.
    assert s["reports"]["built"] >= 1
    assert s["reports"]["client_sent"] == 0
    assert s["reports"]["client_dropped"] >= 1
    # No stall: a send that blocked on the absent daemon would hang the loop or the exit for good.
    # The bounds only catch that; they are deliberately loose because this is not a benchmark (2
    # shared cores, other builds running): bench/hook_overhead.py measures the cost.
    assert hooked["elapsed"] < 3 * plain["elapsed"] + 2.0, (plain["elapsed"], hooked["elapsed"])
    assert hooked_wall < 2 * plain_wall + 10.0, (plain_wall, hooked_wall)


def test_loaded_by_the_preload_shim_the_hook_observes_and_changes_nothing(hook_path, build_dir, tmp_path, catalog_ops,
                                                                         out_variants):
    # The way it runs in production: LD_PRELOAD=libkforge_preload.so, which loads the hook from
    # KFORGE_HOOK_DIR as soon as torch is in the process. (The child's ctypes.CDLL of the same path
    # then returns the already loaded hook, to read its stats.)
    shim = build_dir / "interposer" / "libkforge_preload.so"
    if not shim.exists():
        pytest.fail(f"{shim} is missing: cmake --build {build_dir} --target kforge_preload")
    run_child(WORKLOAD, child_env(KFORGE_TEST_OUT=tmp_path / "plain.pt"))
    hooked, err, _ = run_child(WORKLOAD, child_env(hook_path, KFORGE_TEST_OUT=tmp_path / "shim.pt",
                                                   LD_PRELOAD=shim, KFORGE_HOOK_DIR=hook_path.parent,
                                                   KFORGE_LOG=1))
    assert_bitwise_equal(tmp_path / "plain.pt", tmp_path / "shim.pt")
    assert err.count("kforge: loaded hook ") == 1, err
    s = hooked["stats"]
    assert s["thread_block"] == "shim"
    assert len(s["registered"]) == len(set(s["registered"])) == (len(intercepted(catalog_ops, out_variants, "cpu")) +
                                                                 len(intercepted(catalog_ops, out_variants, "cuda")))
    # Per operator (an operator may still have several signatures, e.g. for different shapes).
    calls = {}
    for sig in s["signatures"]:
        calls[sig["op"]] = calls.get(sig["op"], 0) + sig["calls"]
    assert calls == {"aten::native_layer_norm": 2000, "aten::gelu": 2000, "aten::add.Tensor": 2000,
                     "aten::_softmax": 2000}


TOGGLE = """
lib.kforge_hook_bench_set_interceptors.restype = ctypes.c_char_p
lib.kforge_hook_bench_set_interceptors.argtypes = [ctypes.c_int]
def toggle(on):
    return lib.kforge_hook_bench_set_interceptors(on).decode()
def calls():
    out = {}
    for sig in stats()["signatures"]:
        out[sig["op"]] = out.get(sig["op"], 0) + sig["calls"]
    return out
torch.manual_seed(0)
x, y = torch.randn(64, 32), torch.randn(64, 32)
buf = torch.empty(64, 32)
def work():
    return [torch.add(x, y), torch.softmax(x, -1), F.layer_norm(x, (32,)), F.gelu(x),
            torch.mul(x, y, out=buf)]   # an out variant's interceptor: counted as mul.Tensor
rows = []
with torch.no_grad():
    for on in [1, 0, 0, 1, 0, 1, 1]:
        said = toggle(on)
        outs = work()
        rows.append({"on": on, "said": said, "calls": calls(), "outs": [o.tolist() for o in outs]})
emit({"rows": rows, "registered": len(stats()["registered"])})
"""


def test_the_bench_toggle_takes_the_interceptors_out_and_puts_them_back(hook_path, catalog_ops, out_variants):
    # KFORGE_BENCH_TOGGLE=1 (Note [Bench toggle]): off, calls reach PyTorch's kernels without
    # passing through kforge (nothing is counted); on again, every interceptor is back (counted
    # again), however often it flips. The outputs are the same throughout.
    result, _, _ = run_child(TOGGLE, child_env(hook_path, KFORGE_BENCH_TOGGLE=1))
    rows = result["rows"]
    assert all(r["said"] == "" for r in rows), [r["said"] for r in rows]
    ops = {"aten::add.Tensor", "aten::_softmax", "aten::native_layer_norm", "aten::gelu", "aten::mul.Tensor"}
    previous = {}
    for r in rows:
        for op in ops:
            added = r["calls"].get(op, 0) - previous.get(op, 0)
            assert added == (1 if r["on"] else 0), (r["on"], op, r["calls"], previous)
        previous = r["calls"]
        assert r["outs"] == rows[0]["outs"]
    assert result["registered"] == (len(intercepted(catalog_ops, out_variants, "cpu")) +
                                    len(intercepted(catalog_ops, out_variants, "cuda")))

    # Without the variable the call is refused and changes nothing.
    result, _, _ = run_child(TOGGLE, child_env(hook_path))
    assert all(r["said"] == "refused: the hook was loaded without KFORGE_BENCH_TOGGLE=1" for r in result["rows"])
    assert result["rows"][-1]["calls"] == {op: len(result["rows"]) for op in ops}


OVERHEAD = """
a = torch.ones(4)
b = torch.ones(4)
def bench():
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(100_000):
            torch.add(a, b)
        best = min(best, time.perf_counter() - t0)
    return best / 100_000
with torch.no_grad():
    before = bench()
    hook = ctypes.CDLL(os.environ["KFORGE_HOOK_LATE"])
    after = bench()
emit({"before_ns": before * 1e9, "after_ns": after * 1e9})
"""


def test_per_call_overhead_of_a_miss(hook_path):
    # torch.add on 4-element tensors, 100k calls, best of 3, before and after loading the hook in
    # the same process: the difference is what interception costs a call that finds no
    # replacement (boxing the arguments, the signature hash, the counter, the boxed original).
    result, _, _ = run_child(OVERHEAD, child_env(KFORGE_HOOK_LATE=hook_path))
    overhead = result["after_ns"] - result["before_ns"]
    print(f"\ntorch.add miss: {result['before_ns']:.0f} ns/call without the hook, "
          f"{result['after_ns']:.0f} ns/call with it (+{overhead:.0f} ns)")
    # A loose ceiling against regressions on a noisy shared machine, not the design's budget.
    assert overhead < 5000


ERRORS = """
try:
    torch.add(torch.randn(4, 8), torch.randn(8, 4))
    emit({"error": None})
except RuntimeError as e:
    emit({"error": str(e), "stats": stats()})
"""


def test_an_error_of_pytorchs_kernel_reaches_the_caller_unchanged(hook_path):
    plain, _, _ = run_child(ERRORS, child_env())
    hooked, _, _ = run_child(ERRORS, child_env(hook_path))
    assert plain["error"] and hooked["error"] == plain["error"]
    # The interceptor stays in place: the failed call was counted like any other.
    assert [sig["calls"] for sig in hooked["stats"]["signatures"]] == [1]


# ---- CUDA (runs where a GPU is) ---------------------------------------------------------------------

CUDA = """
torch.manual_seed(0)
x = torch.randn(64, 256, device="cuda")
xh = x.half()
w = torch.randn(256, device="cuda")
b = torch.randn(256, device="cuda")
img = torch.randn(2, 32, 8, 8, device="cuda")
out = {}
with torch.no_grad():
    # The process's first intercepted CUDA call happens inside stream capture: the hook's first
    # look at the device (its arch, through the driver) and its slow path must not break capture.
    static_x = torch.empty_like(x).copy_(x)   # not x.clone(): clone is a catalog operator
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = F.silu(static_x) + static_x
    g.replay()
    torch.cuda.synchronize()
    out["graph"] = static_y.cpu()
    out["graph_eager"] = (F.silu(x) + x).cpu()
    for _ in range(5):
        step = {"softmax": torch.softmax(x, -1), "log_softmax": torch.log_softmax(xh, 0),
                "layer_norm": F.layer_norm(x, [256], w, b), "group_norm": F.group_norm(img, 8),
                "gelu": F.gelu(xh, approximate="tanh")}
    out.update({k: v.cpu() for k, v in step.items()})
torch.save(out, os.environ["KFORGE_TEST_OUT"])
if lib:
    torch.cuda.synchronize()
    assert lib.kforge_hook_report_now(20000) == 1   # the reporter reads the timing events
emit({"stats": stats(), "cc": list(torch.cuda.get_device_capability())})
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_calls_are_observed_and_unchanged(hook_path, tmp_path):
    run_child(CUDA, child_env(KFORGE_TEST_OUT=tmp_path / "plain.pt"))
    # The test's own copies (x.half(), .cpu(): _to_copy) are not what it counts and times.
    hooked, _, _ = run_child(CUDA, child_env(hook_path, KFORGE_TEST_OUT=tmp_path / "hooked.pt",
                                             KFORGE_SAMPLE_RATE=1, KFORGE_DENY_OPS="aten::_to_copy"))
    assert_bitwise_equal(tmp_path / "plain.pt", tmp_path / "hooked.pt")
    out = torch.load(tmp_path / "hooked.pt")
    assert torch.equal(out["graph"], out["graph_eager"])
    s = hooked["stats"]
    assert s["id_mismatches"] == 0 and s["unknown_calls"] == 0
    arch = "sm_%d%d" % tuple(hooked["cc"])
    cuda = [sig for sig in s["signatures"] if sig["signature"].endswith(" cuda:" + arch)]
    calls = {sig["op"]: sig["calls"] for sig in cuda}
    for op in ["aten::_softmax", "aten::_log_softmax", "aten::native_layer_norm", "aten::native_group_norm",
               "aten::gelu"]:
        assert calls.get(op) == 5, (op, calls)
    # silu and add: once while capturing, once eagerly (a replay runs kernels, not operators).
    assert calls.get("aten::silu") == 2 and calls.get("aten::add.Tensor") == 2, calls
    # With KFORGE_SAMPLE_RATE=1 every eager call is timed with CUDA events (cuda_timer.h); the two
    # calls made while capturing are not (an event record would become part of the graph).
    timed = {sig["op"]: (sig["sampled_calls"], sig["sampled_ns"]) for sig in cuda}
    for op in ["aten::_softmax", "aten::_log_softmax", "aten::native_layer_norm", "aten::native_group_norm",
               "aten::gelu"]:
        assert timed[op][0] == 5 and timed[op][1] > 0, (op, timed)
    assert timed["aten::silu"][0] == 1 and timed["aten::add.Tensor"][0] == 1, timed
    # 27 timed calls are within the thread's budget of 32 per second (Note [CUDA timing budget]).
    assert s["cuda_timing"] == {"timed": 27, "skipped_capturing": 2, "skipped_other": 0, "dropped_stale": 0,
                                "skipped_budget": 0}
    # The input sampler likewise copies nothing while capturing: silu and add were first seen there.
    assert s["inputs"]["skipped_capturing"] == 2 and s["inputs"]["sampled"] == 5 and s["inputs"]["failed"] == 0


BUDGET = """
x = torch.randn(16, device="cuda")
with torch.no_grad():
    torch.add(x, x)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    for _ in range(400):
        torch.add(x, x)
    torch.cuda.synchronize()
    elapsed = time.monotonic() - t0
assert lib.kforge_hook_report_now(20000) == 1
emit({"stats": stats(), "elapsed": elapsed})
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_timing_keeps_to_its_budget_per_thread_and_second(hook_path):
    # KFORGE_SAMPLE_RATE=1 asks to time every call; a thread times at most 32 per second (Note
    # [CUDA timing budget]) and the rest are counted as skipped_budget, never lost from the counts.
    result, _, _ = run_child(BUDGET, child_env(hook_path, KFORGE_SAMPLE_RATE=1))
    s = result["stats"]
    assert sum(sig["calls"] for sig in s["signatures"]) == 401
    t = s["cuda_timing"]
    windows = int(result["elapsed"]) + 2          # the loop's seconds, and the first call's window
    assert 32 <= t["timed"] <= 32 * windows, (t, result["elapsed"])
    assert t["timed"] + t["skipped_budget"] == 401, t
    assert t["skipped_other"] == 0 and t["skipped_capturing"] == 0, t
