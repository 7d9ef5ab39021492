"""With an empty cache, the hook changes no model's output: six models, bitwise, interceptors out and in.

Here (build tree, CPU; small configurations, about a minute on 2 cores):
    .venv/bin/python bench/hook_identity.py --device cpu --small
On a GPU host, from an unpacked bundle and this source tree's bench/ (python3 with torch,
torchvision and transformers; the op_profile.py sizes, bf16 and fp32; not yet run there):
    python3 bench/hook_identity.py --device cuda --bundle-root <bundle> --json identity.json

The models are bench/op_profile.py's, built by its code: torchvision resnet50, convnext_tiny and
vit_b_16, the Stable-Diffusion-style UNet, and GPT-2 and a TinyLlama-shaped Llama decoder from
transformers configs (random weights from a fixed seed, no download; the language models run a
prefill and one decode step with the KV cache). --small takes op_profile's --small sizes.

Each model runs in its own child process, started as users run kforge: LD_PRELOAD of
libkforge_preload.so (which loads the hook once torch is imported), KFORGE_MODE=active, an empty
private cache directory, a daemon endpoint nobody serves; plus KFORGE_BENCH_TOGGLE=1, which lets
the child take kforge's interceptors out of PyTorch's dispatcher and put them back (Note [Bench
toggle] in interposer/hook/interceptor.cc). Per dtype (bf16 and fp32 on CUDA, fp32 on CPU) the
child builds the model (fixed seed) and its inputs (fixed seed) once, then under torch.no_grad(),
with cuDNN's benchmark off and deterministic algorithms asked for (warn_only: an operator without
a deterministic implementation warns, and is listed, instead of raising; CUBLAS_WORKSPACE_CONFIG
:4096:8 unless set), runs it three times:
interceptors out (A), in (B), out again (C). Every tensor of the outputs (logits; for the language
models also the decode step's logits and the KV cache) is compared bit for bit, as integers of its
width, so NaNs and signed zeros compare too. A != C: the model does not reproduce itself without
kforge, reported as "nondeterministic without kforge" and not counted against the hook.
Otherwise B must equal A. The hook's counters must show intercepted calls during B and none
during A and C (the hook observes about one call in KFORGE_OBSERVE_EVERY and counts it with the
calls skipped before it, so B's count is an estimate, short of the calls after each operator's
last observed one; --observe-every 1 counts every call; A's and C's are exact).

Exit status 0 only if every case that reproduces itself is identical, every B intercepted calls
and no A or C did, and at least one case was checked.

Not checked here: a cache with entries (shadow and active replacements run other kernels; the
swap tests and the daemon's verification cover those), outputs across processes (only within one),
the model's construction and its inputs (built with the interceptors out), the interceptors as
registered at load (B runs with them as the toggle registers them again: the same operators and
counters), autograd (no_grad only), CUDA graphs and torch.compile, and other threads calling
operators while the model runs.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import side_by_side as sbs

MODELS = ("resnet50", "convnext_tiny", "vit_b_16", "unet", "gpt2", "llama")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {','.join(MODELS)}")
    p.add_argument("--dtypes", help="comma-separated, of bf16,fp16,fp32 (default: bf16,fp32 on CUDA, fp32 on CPU)")
    p.add_argument("--small", action="store_true", help="op_profile.py's tiny sizes (CPU tests: seconds per model)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads in every child (0: torch's default)")
    p.add_argument("--observe-every", type=int,
                   help="KFORGE_OBSERVE_EVERY of the children (default: unset, the hook's default)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per child")
    p.add_argument("--json", help="write the results to this file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    sbs.add_kforge_arguments(p)
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    bad = [m for m in args.models if m not in MODELS]
    if bad or not args.models:
        p.error(f"--models: unknown {bad}; known: {','.join(MODELS)}")
    args.dtypes = [d for d in (args.dtypes or ("bf16,fp32" if args.device == "cuda" else "fp32")).split(",") if d]
    bad = [d for d in args.dtypes if d not in DTYPES]
    if bad or not args.dtypes:
        p.error(f"--dtypes: unknown {bad}; known: {','.join(DTYPES)}")
    return args


# ---- one child: one model, every dtype ---------------------------------------------------------

def output_tensors(obj, label, out):
    """Every tensor in a model's output, in a fixed order, as (label, tensor): tensors, tuples,
    lists, dicts and transformers' ModelOutput, and the key and value tensors of a KV cache (a
    transformers Cache: `layers` with keys/values in transformers 5, key_cache/value_cache before)."""
    import torch
    if isinstance(obj, torch.Tensor):
        out.append((label, obj))
    elif isinstance(obj, dict):   # ModelOutput is an OrderedDict of the fields that are set
        for k, v in obj.items():
            output_tensors(v, f"{label}.{k}" if label else str(k), out)
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            output_tensors(v, f"{label}[{i}]", out)
    elif getattr(obj, "layers", None) is not None:
        for i, layer in enumerate(obj.layers):
            for name in ("keys", "values"):
                output_tensors(getattr(layer, name, None), f"{label}.layers[{i}].{name}", out)
    elif getattr(obj, "key_cache", None) is not None:
        output_tensors(list(obj.key_cache), f"{label}.key_cache", out)
        output_tensors(list(obj.value_cache), f"{label}.value_cache", out)
    return out


def bits(t):
    """t's raw bits as integers of its element's width (NaN payloads and -0.0 included)."""
    import torch
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(width[t.element_size()]) if t.is_floating_point() else t


def first_difference(a, b):
    """None if the outputs (lists of (label, tensor)) are the same bits, else what differs first."""
    import torch
    if [l for l, _ in a] != [l for l, _ in b]:
        return f"different outputs: {[l for l, _ in a]} vs {[l for l, _ in b]}"
    for k, ((label, x), (_, y)) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return (f"output {k} ({label}): {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
        ne = bits(x) != bits(y)
        n = int(ne.sum())
        if n:
            at = tuple(int(i) for i in ne.nonzero()[0])
            return (f"{n} of {x.numel()} elements of output {k} ({label} {list(x.shape)}); first at {list(at)}: "
                    f"{x[at].item()!r} vs {y[at].item()!r}")
    return None


def build(name, small, dev, dtype):
    """(model, run) from op_profile.py's builders: run() -> the outputs' tensors as (label, tensor)."""
    import torch
    import op_profile
    torch.manual_seed(0)
    with torch.device(dev):   # weights initialized on the device (seconds less for the big ones on CUDA)
        if name in ("resnet50", "convnext_tiny", "vit_b_16"):
            batch, res = (2, 64) if small else (64, 224)   # op_profile's sizes; ViT-B/16 takes 224 only
            model, make_inputs = op_profile.vision(name, batch, 224 if name == "vit_b_16" else res)
        elif name == "unet":
            model, make_inputs = op_profile.unet(1 if small else 2, 64 if small else 512, small)
        else:
            model, make_inputs = op_profile.causal_lm(name, small), None
    model = model.to(device=dev, dtype=dtype).eval()
    torch.manual_seed(1)
    if make_inputs is not None:
        a, kw = make_inputs(dev, dtype)
        return model, lambda: output_tensors(model(*a, **kw), "output", [])

    # A prefill into a fresh KV cache, then one decode step of the greedy token (transformers 5
    # renamed `past_key_values` to `cache`: bench/e2e_overhead.py's decoder()).
    import inspect
    batch, seq = (2, 32) if small else (8, 512)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=dev)
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def run():
        pre = model(input_ids=ids, use_cache=True)
        cache = pre["cache"] if "cache" in pre else pre["past_key_values"]
        nxt = pre.logits[:, -1:].argmax(-1)
        dec = model(input_ids=nxt, use_cache=True, **{key: cache})
        cache = dec["cache"] if "cache" in dec else dec["past_key_values"]
        # The cache after the decode step holds the prefill's keys and values and the step's.
        return [("prefill logits", pre.logits), ("decode logits", dec.logits)] + output_tensors(cache, "cache", [])
    return model, run


def child(args):
    import ctypes
    import warnings
    import torch
    hook = sbs.open_hook()
    if hook is None:
        sys.exit("the child runs only with the hook")
    hook.lib.kforge_hook_bench_set_interceptors.restype = ctypes.c_char_p
    hook.lib.kforge_hook_bench_set_interceptors.argtypes = [ctypes.c_int]

    def set_interceptors(on):
        said = hook.lib.kforge_hook_bench_set_interceptors(1 if on else 0).decode()
        if said:
            sys.exit(f"kforge_hook_bench_set_interceptors({int(on)}): {said}")

    def counted():
        return sum(hook.calls_by_op().values())

    if args.threads:
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # CUBLAS_WORKSPACE_CONFIG is set by the parent; warn_only: a nondeterministic operator warns
    # (listed below) instead of raising, and A against C says whether it mattered.
    torch.use_deterministic_algorithms(True, warn_only=True)
    set_interceptors(False)   # the model and inputs are built by PyTorch alone
    cases = []
    (name,) = args.models
    for dname in args.dtypes:
        dtype = getattr(torch, DTYPES[dname])
        t0 = time.perf_counter()
        case = {"model": name, "dtype": dname, "device": args.device}
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            set_interceptors(False)
            model, run = build(name, args.small, args.device, dtype)
            outs, calls = {}, {}
            for variant, on in (("A", False), ("B", True), ("C", False)):
                set_interceptors(on)
                before = counted()
                outs[variant] = run()
                sync()
                calls[variant] = counted() - before
                set_interceptors(False)
            self_diff = first_difference(outs["A"], outs["C"])
            hook_diff = None if self_diff else first_difference(outs["A"], outs["B"])
        case.update(status="nondeterministic" if self_diff else "different" if hook_diff else "identical",
                    detail=self_diff or hook_diff or "",
                    outputs=[[label, str(t.dtype).removeprefix("torch."), list(t.shape)] for label, t in outs["A"]],
                    intercepted_on=calls["B"], intercepted_off=[calls["A"], calls["C"]],
                    nondeterministic_ops=sorted({str(w.message).split("\n")[0] for w in caught
                                                 if "deterministic" in str(w.message)}),
                    seconds=time.perf_counter() - t0)
        cases.append(case)
        del model, run, outs
        if args.device == "cuda":
            torch.cuda.empty_cache()
    stats = hook.stats()
    set_interceptors(True)   # as the process started
    sbs.emit({"cases": cases, "config": stats.get("config", ""), "torch": torch.__version__})


# ---- the parent --------------------------------------------------------------------------------

def verdict(case):
    """(ok, text) of one case."""
    on, off = case["intercepted_on"], case["intercepted_off"]
    toggled = on > 0 and off == [0, 0]
    calls = f"intercepted calls counted: {on} in (B), {off[0]} and {off[1]} out (A, C)"
    if case["status"] == "identical":
        text = "identical"
    elif case["status"] == "nondeterministic":
        text = f"nondeterministic without kforge ({case['detail']})"
    else:
        text = f"DIFFERENT ({case['detail']})"
    if not toggled:
        calls += " (the toggle did not do what it says!)"
    return case["status"] != "different" and toggled, f"{text}; {calls}"


def main():
    args = parse_args()
    if args.child:
        return child(args)
    print(f"# {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    torch, files = sbs.parent_start(args)
    print(f"# torch {torch.__version__}; {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
          + f"; {'small' if args.small else 'op_profile'} sizes, {','.join(args.dtypes)}; "
          + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), flush=True)
    results, config = [], None
    for name in args.models:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--device", args.device, "--models", name,
               "--dtypes", ",".join(args.dtypes), "--threads", str(args.threads)] + (["--small"] if args.small else [])
        env = sbs.child_env(files, args.load, KFORGE_MODE="active", KFORGE_BENCH_TOGGLE=1,
                            KFORGE_CACHE_DIR=sbs.private_dir("kforge-empty-cache-"),
                            CUBLAS_WORKSPACE_CONFIG=os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
                            **({"KFORGE_OBSERVE_EVERY": args.observe_every} if args.observe_every else {}))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                                      preexec_fn=(lambda: os.sched_setaffinity(0, args.cpus)) if args.cpus else None)
            lines = [l[len(sbs.RESULT_PREFIX):] for l in proc.stdout.splitlines() if l.startswith(sbs.RESULT_PREFIX)]
            failure = None if proc.returncode == 0 and lines else \
                f"exit {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-2000:]}"
        except subprocess.TimeoutExpired:
            failure, lines = f"no result in {args.timeout} s", []
        if failure:
            # A child that dies (or an ON run that raises) is a failure of every case it had.
            cases = [{"model": name, "dtype": d, "device": args.device, "status": "failed", "detail": failure,
                      "intercepted_on": 0, "intercepted_off": [0, 0]} for d in args.dtypes]
        else:
            res = json.loads(lines[-1])
            cases, config = res["cases"], config or res["config"]
        if config and not results:
            print(f"# hook config: {config}")
        for case in cases:
            if case["status"] == "failed":
                ok, text = False, f"FAILED: child {case['detail']}"
            else:
                ok, text = verdict(case)
            case["ok"] = ok
            took = f" ({case['seconds']:.1f} s)" if "seconds" in case else ""
            print(f"{case['model']:14s} {case['dtype']:5s} {case['device']:5s} {text}{took}", flush=True)
            for op in case.get("nondeterministic_ops", []):
                print(f"{'':26s} without a deterministic implementation: {op}")
            results.append(case)
        if failure:
            print(f"{'':26s} ({time.perf_counter() - t0:.0f} s)", flush=True)
    sbs.remove_private_dirs()

    identical = sum(c["status"] == "identical" for c in results)
    selfish = sum(c["status"] == "nondeterministic" for c in results)
    failed = [c for c in results if not c["ok"]]
    print(f"hook_identity: {identical} of {len(results)} identical"
          + (f", {selfish} nondeterministic without kforge" if selfish else "")
          + (f", {len(failed)} failed" if failed else ""))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"argv": sys.argv, "torch": torch.__version__, "device": args.device, "small": args.small,
             "config": config, "results": results}, indent=1))
    if failed:
        sys.exit(1)
    if identical == 0:
        sys.exit("hook_identity: no case reproduced itself without kforge, so nothing was checked")


if __name__ == "__main__":
    main()
