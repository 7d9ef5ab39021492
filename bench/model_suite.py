"""Whole models under kforge (issue 26): eager, kforge with an empty cache, kforge after `kforge warm`,
torch.compile, and torch.compile under kforge, timed in one process per cache, with every output
checked against eager and against a float64 reference.

    python3 <bundle>/share/kforge/bench/model_suite.py --device cuda                        # the suite
    python3 bench/model_suite.py --device cuda --bundle-root <bundle>                      # the same
    python3 bench/model_suite.py --device cuda --bundle-root <bundle> --models resnet50 --dtypes bf16 \
        --warm-minutes 3                                                                   # one case
    .venv/bin/python bench/model_suite.py --device cpu --small --models resnet50,gpt2 \
        --phases decode1 --warm-minutes 1 --no-compile                                     # the plumbing, here
    python3 bench/model_suite.py --render <out dir>        # the report again from the cases' JSON files

The cases (random weights built in code, as bench/op_profile.py builds them): torchvision resnet50,
convnext_tiny and vit_b_16 at batch 64; a Stable-Diffusion-1.x-layout UNet (op_profile's, written
here; diffusers' UNet2DConditionModel in SD 1.x's configuration where diffusers is installed) at
batch 2 on 64x64 latents; GPT-2 and a Llama-style decoder
(TinyLlama's shape) from transformers configs with eager and SDPA attention, prefill at batch 8 x
512 and one decode step at batch 1 and 32 after a 512-token prompt. bf16 and fp32. --small: tiny
sizes of the same models, for a CPU.

Per case, three processes (the warm shared by a model's cases), each started as users start kforge (`kforge run`, KFORGE_BENCH_TOGGLE=1
so that the process can take kforge's interceptors out of PyTorch's dispatcher and put them back,
Note [Bench toggle]):

1. empty: `kforge run --no-daemon` on an empty cache. Blocks of steps with the interceptors out
   (PyTorch eager, exactly) and in (the hook with nothing to swap), alternated: the overhead alone,
   and whether the outputs are bitwise identical (issue 22), with eager against itself as the control.
2. warm: `kforge warm` runs the step again and again with a daemon of this run's own (its
   end-to-end check leaves out kernels that do not pay in the whole step); the daemon is stopped
   afterwards, so no search competes with the timing. By default one warm serves every case of a
   model and dtype (--warm-scope model): its workload steps each of them in turn, so an LLM's
   prefill and decodes, which share most operators, are searched once, in one cache.
3. timed: `kforge run --no-daemon` on that cache, a fresh process: the entries the cache holds go
   through their trial in this process first (shadow calls against PyTorch's kernels); then eager,
   kforge, torch.compile and torch.compile under kforge, one block of each per round in an order
   that rotates round by round, each block after an untimed step. Per variant the median step time
   and quartiles; per variant against eager the paired ratio per round, order-balanced, with a
   bootstrap 95% interval (bench/side_by_side.py's paired()). Then the outputs: each variant's
   against eager's, and against the same model and inputs in float64, judged by kforge's accuracy
   criterion (Note [Accuracy criterion]: at most twice PyTorch's own error, plus a few ulps).
   Then where the time goes, per ATen operator, with the interceptors out and in (torch.profiler;
   device time on CUDA, CPU time on a CPU), and every signature the step reached with the state of
   its kforge entry in this process and why (active, no win in this process, disabled, none).

Writes <out>/<case>.json per case as each case finishes (a run cut short keeps what it finished),
then <out>/report.md, speedup.png (speedup over eager per case and variant) and time.png (where
each case's step time goes, eager and under kforge) from every case JSON in <out>. Decode at batch 1
is launch-bound: its overhead is the hook's cost per call, and it is reported beside the others but
left out of the batch-and-prefill geometric mean, as the issue says.

Standard library and torch only (the GPU host has no pip). Not run in CI beyond a tiny CPU case: a
full run is a bench.
"""

import argparse
import copy
import importlib.util
import json
import math
import os
import pathlib
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Run from a source tree (bench/) or from an unpacked bundle (share/kforge/bench/, beside demo.py).
BUNDLE = ROOT.parent.parent if (ROOT / "demo.py").exists() and not (ROOT / "tools").exists() else None
DEMO = ROOT / "demo.py" if BUNDLE else ROOT / "tools" / "share" / "demo.py"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import per_op   # noqa: E402  (both standard library only at import)
import side_by_side as sbs   # noqa: E402

MODELS = ("resnet50", "convnext_tiny", "vit_b_16", "unet", "gpt2", "llama")
LLMS = ("gpt2", "llama")
VARIANTS = ("eager", "kforge", "compile", "compile_kforge")
INTERCEPTORS = {"eager": False, "kforge": True, "compile": False, "compile_kforge": True}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


# ---- the cases ------------------------------------------------------------------------------------

def cases(models, dtypes, phases, attention):
    """Case ids: model-dtype-phase[-attention]. Vision models and the UNet have one phase
    (forward); the LLMs prefill, decode1 and decode32, each with eager and SDPA attention."""
    out = []
    for m in models:
        for d in dtypes:
            if m in LLMS:
                out += [f"{m}-{d}-{p}-{a}" for p in phases for a in attention]
            else:
                out.append(f"{m}-{d}-forward")
    return out


def parse_case(case):
    parts = case.split("-")
    if len(parts) not in (3, 4) or parts[0] not in MODELS or parts[1] not in DTYPES:
        raise ValueError(f"not a case id: {case!r} (model-dtype-phase[-attention])")
    return dict(model=parts[0], dtype=parts[1], phase=parts[2], attention=parts[3] if len(parts) == 4 else "")


def workload_kind(case):
    """What the issue's targets group a case under."""
    c = parse_case(case)
    if c["phase"] == "decode1":
        return "decode at batch 1"
    return "llm" if c["model"] in LLMS else "batch"


_LLMS = {}   # (model, dtype, attention, device, small) -> the model, shared by the phases of one process


def build(case, device, small):
    """(model, step, output, reference): step() runs one step; output() runs one and returns the
    tensor the accuracy check compares; reference() returns the same computed in float64 (a copy
    of the model and inputs), run with whatever interceptors are in at the time."""
    import torch
    import op_profile   # bench/, beside this file (imports torch: children only)
    c = parse_case(case)
    dtype = getattr(torch, DTYPES[c["dtype"]])
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if c["model"] in ("resnet50", "convnext_tiny", "vit_b_16"):
        import torchvision
        if small and c["model"] == "vit_b_16":
            model = torchvision.models.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=2,
                                                         hidden_dim=64, mlp_dim=128)
        else:
            model = getattr(torchvision.models, c["model"])()
        batch, res = (2, 64) if small else (64, 224)
        inputs = (torch.randn(batch, 3, res, res, generator=g),)
    elif c["model"] == "unet":
        batch, lat, ctx = (1, 8, 64) if small else (2, 64, 768)
        inputs = (torch.randn(batch, 4, lat, lat, generator=g), torch.full((batch,), 500, dtype=torch.long),
                  torch.randn(batch, 77, ctx, generator=g))
        try:
            if small:
                raise ImportError("--small: the suite's own")
            import diffusers
            # SD 1.x's configuration (diffusers' defaults, with CLIP ViT-L's 768-wide context)
            net = diffusers.UNet2DConditionModel(sample_size=lat, cross_attention_dim=ctx)
            model = unet_output(net)
        except ImportError:
            model, _ = op_profile.unet(1, 64, small)
    else:
        # Built once per process for all its phases (a warm's workload steps a model's prefill and
        # decodes; a 1.1B-parameter model takes seconds to initialize). On the CPU, then moved:
        # initializing on the GPU would report the initializers' calls to the daemon as CUDA work.
        key = (c["model"], c["dtype"], c["attention"], device, small)
        if key not in _LLMS:
            _LLMS[key] = causal_lm(c["model"], c["attention"], small).eval().to(device, dtype)
        model = _LLMS[key]
        inputs = None
    model = model.eval()
    ref_model = None

    def to(x, dev, dt):
        return x.to(dev, dt) if x.is_floating_point() else x.to(dev)

    if inputs is not None:
        a = tuple(to(x, device, dtype) for x in inputs)
        model = model.to(device, dtype)

        def step():
            return model(*a)

        def reference():
            nonlocal ref_model
            ref_model = ref_model or copy.deepcopy(model).to(torch.float64)
            return ref_model(*(to(x, device, torch.float64) for x in inputs))
        return model, step, step, reference

    batch, seq = {"prefill": (8, 512), "decode1": (1, 512), "decode32": (32, 512)}[c["phase"]]
    if small:
        batch, seq = min(batch, 2), 32
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(device)
    if c["phase"] == "prefill":
        def step():
            return model(input_ids=ids, use_cache=False).logits

        def reference():
            nonlocal ref_model
            ref_model = ref_model or copy.deepcopy(model).to(torch.float64)
            return ref_model(input_ids=ids, use_cache=False).logits
        return model, step, step, reference

    # One decode step after the prompt. Each step appends a position to the KV cache; cropping it
    # back to the prompt (views, no kernels) gives every step the same shapes (op_profile's way).
    with torch.no_grad():
        past = model(input_ids=ids, use_cache=True).past_key_values
    nxt = ids[:, -1:]

    def decode(m, p):
        extra = p.get_seq_length() - seq
        if extra > 0:
            p.crop(-extra)
        return m(input_ids=nxt, past_key_values=p, use_cache=True).logits

    def step():
        return decode(model, past)

    def reference():
        nonlocal ref_model
        ref_model = ref_model or copy.deepcopy(model).to(torch.float64)
        p64 = ref_model(input_ids=ids, use_cache=True).past_key_values
        return decode(ref_model, p64)
    return model, step, step, reference


def causal_lm(kind, attention, small):
    import transformers
    if kind == "gpt2":
        cfg = dict(n_layer=2, n_embd=128, n_head=4) if small else {}
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg, attn_implementation=attention))
    cfg = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)   # TinyLlama-1.1B's shape
    if small:
        cfg.update(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, attn_implementation=attention))


def unet_output(net):
    """diffusers' UNet returns an output object: a module that returns its sample tensor."""
    import torch

    class DiffusersUNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, t, ctx):
            return self.net(x, t, encoder_hidden_states=ctx).sample
    return DiffusersUNet()


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- the children ---------------------------------------------------------------------------------

def child_steps(args):
    """The warm workload: each case's step in turn (--case: one, or a comma-separated group),
    again and again, for --seconds."""
    import torch
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    steps = [build(case, args.device, args.small)[1] for case in args.case.split(",")]
    end = time.monotonic() + args.seconds
    with torch.no_grad():
        while time.monotonic() < end:
            for step in steps:
                step()
            if args.device == "cuda":
                torch.cuda.synchronize()


def child_time(args):
    import torch
    dev = args.device
    if dev == "cpu":
        torch.set_num_threads(args.threads)
    demo = load_module("kforge_demo", DEMO)
    import op_profile
    lib = per_op.hook()
    variants = args.variants.split(",")
    out = dict(case=args.case, device=dev, torch=torch.__version__, variants=variants,
               gpu=torch.cuda.get_device_name() if dev == "cuda" else f"{os.cpu_count()} CPUs",
               threads=args.threads if dev == "cpu" else None)

    def log(msg):
        print(f"model_suite: {args.case}: {msg}", file=sys.stderr, flush=True)

    def interceptors(on):
        per_op.set_interceptors(lib, on, "model_suite")

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def sigs():
        return {s["signature"]: s for s in json.loads(lib.kforge_hook_stats_json())["signatures"]}

    model, step, output, reference = build(args.case, dev, args.small)
    out["model_class"] = type(model).__name__
    fns = {"eager": step, "kforge": step}
    with torch.no_grad():
        # The entries this step reaches finish their trial in this process before anything is
        # timed (the hook looks new signatures up in the cache in its reporter's rounds).
        # A thread observes about one call in observe_every of an operator it has called before
        # (Note [Observed calls]): a signature called once a step is seen within 2 * observe_every
        # steps, and only a seen signature is looked up in the cache.
        interceptors(True)
        t0 = time.monotonic()
        m = re.search(r"observe_every=(\d+)", json.loads(lib.kforge_hook_stats_json()).get("config", ""))
        for _ in range(2 * int(m.group(1)) if m else 32):
            step()
        sync()
        lib.kforge_hook_report_now(20000)
        while time.monotonic() - t0 < args.settle_s:
            if all(v["state"] != "shadow" for v in sigs().values() if v.get("entry")):
                break
            for _ in range(4):
                step()
            sync()
        out["settle_s"] = round(time.monotonic() - t0, 1)

        # Outputs first (a timing run cut short still says whether they are right).
        interceptors(False)
        outputs = {"eager": output().detach().clone()}
        # The control for "identical": eager against itself. A step whose PyTorch kernels are not
        # run-to-run deterministic cannot be bitwise identical under any hook.
        out["eager_repeatable"] = bool(torch.equal(output(), outputs["eager"]))
        interceptors(True)
        if "kforge" in variants:
            outputs["kforge"] = output().detach().clone()
        if {"compile", "compile_kforge"} & set(variants):   # one compiled step serves both
            interceptors(False)
            t1 = time.monotonic()
            try:
                cstep = torch.compile(step, dynamic=False)
                for _ in range(3):
                    cstep()
                sync()
                fns["compile"] = fns["compile_kforge"] = cstep
                out["compile_s"] = round(time.monotonic() - t1, 1)
            except Exception as e:   # a model torch.compile cannot take: say so, time the rest
                out["compile_error"] = f"{type(e).__name__}: {e}"[:400]
                log(f"torch.compile failed: {out['compile_error']}")
        variants = [v for v in variants if v in fns]
        for v in ("compile", "compile_kforge"):
            if v in variants:
                interceptors(INTERCEPTORS[v])
                outputs[v] = fns[v]().detach().clone()
        interceptors(False)
        if not args.no_reference:
            ref = reference().double()
            eps = torch.finfo(outputs["eager"].dtype).eps
            e_torch = demo.error_measures(outputs["eager"], ref)
            acc = {"eager": dict(vs_float64=e_torch)}
            for v, o in outputs.items():
                if v == "eager":
                    continue
                e = demo.error_measures(o, ref)
                ok, max_bound, rel_bound = demo.judge(e, e_torch, eps)
                acc[v] = dict(vs_float64=e, vs_eager=demo.error_measures(o, outputs["eager"].double()),
                              passed=bool(ok), max_abs_bound=max_bound, rel_l2_bound=rel_bound,
                              identical_to_eager=bool(torch.equal(o, outputs["eager"])))
            out["accuracy"] = acc
            del ref
        else:
            out["accuracy"] = {v: dict(identical_to_eager=bool(torch.equal(o, outputs["eager"])))
                               for v, o in outputs.items() if v != "eager"}
        del outputs
        if dev == "cuda":
            torch.cuda.empty_cache()

        # Timing: blocks of about --block-ms, each after an untimed step, one block per variant
        # per round in a rotating order.
        def block(fn, n):
            sync()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            return (time.perf_counter() - t) / n

        for v in variants:
            interceptors(INTERCEPTORS[v])
            block(fns[v], 2)
        interceptors(False)
        once = min(block(step, 1) for _ in range(3))
        n = max(1, int(args.block_ms * 1e-3 / max(once, 1e-6)))
        times = {v: [] for v in variants}
        first = {v: [] for v in variants}   # per round: did eager run before this variant?
        orders = []
        for r in range(args.rounds):
            # Every variant in every position equally often: the rotations of the variants, then
            # of their reverse (so a variant follows each other one too), and again.
            base = variants if (r // len(variants)) % 2 == 0 else variants[::-1]
            order = base[r % len(variants):] + base[:r % len(variants)]
            orders.append(order)
            for v in order:
                interceptors(INTERCEPTORS[v])
                fns[v]()   # untimed: the first calls after a switch are a transient
                times[v].append(block(fns[v], n))
            for v in variants:
                first[v].append(order.index("eager") < order.index(v))
        out["steps_per_block"] = n
        out["orders"] = orders
        out["rounds"] = args.rounds
        out["times_ms"] = {v: [t * 1e3 for t in ts] for v, ts in times.items()}
        stats = {}
        for v in variants:
            ts = sorted(times[v])
            stats[v] = dict(median_ms=statistics.median(ts) * 1e3, q1_ms=ts[len(ts) // 4] * 1e3,
                            q3_ms=ts[(3 * len(ts)) // 4] * 1e3)
            if v != "eager":
                p = sbs.paired(times["eager"], times[v], first[v], relative=True)
                # p["diff"]: variant time / eager time - 1, order-balanced; speedup = eager / variant
                stats[v].update(speedup=1 / (1 + p["diff"]), speedup_interval=[1 / (1 + p["interval"][1]), 1 / (1 + p["interval"][0])],
                                speedup_min=1 / (1 + p["max"]), speedup_max=1 / (1 + p["min"]))
        out["stats"] = stats
        log(", ".join(f"{v} {s['median_ms']:.3f} ms" + (f" ({s['speedup']:.3f}x)" if "speedup" in s else "")
                      for v, s in stats.items()))

        # Where the time goes, per operator, without and with kforge's interceptors.
        if not args.no_profile:
            census = op_profile.Census()
            interceptors(False)
            with census:
                step()
            seen = set(census.overloads)
            prof = {}
            for label, on in (("eager", False), ("kforge", True)):
                interceptors(on)
                events = op_profile.profile_run(step, dev, args.profile_steps)
                per = op_profile.attribute(events, seen, dev)
                prof[label] = sorted(([name, t / args.profile_steps, op_profile.op_class(name)]
                                      for name, (t, _) in per.items()), key=lambda x: -x[1])
            out["profile_us"] = prof
        interceptors(True)

    # Every signature the step reached, and what kforge did with it in this process.
    out["signatures"] = [dict(signature=k, op=v.get("op"), state=v.get("state", "none") if v.get("entry") else "none",
                              entry=v.get("entry"), reason=v.get("reason", ""), calls=v.get("calls", 0),
                              pytorch_median_ns=v.get("pytorch_median_ns"), entry_median_ns=v.get("entry_median_ns"))
                         for k, v in sorted(sigs().items()) if v.get("calls", 0) > 0]
    with open(args.result + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(args.result + ".tmp", args.result)


# ---- the parent -----------------------------------------------------------------------------------

def run_group(group, args, kforge, tmp, out_dir, env):
    """The processes of a group of cases (one model and dtype, or one case: --warm-scope): per case
    an empty-cache process; one kforge warm whose workload steps every case of the group in turn;
    per case a fresh process on the warm cache. Returns the cases' results (each also written to
    <out>/<case>.json as it is done)."""
    def common(case):
        return [sys.executable, str(pathlib.Path(__file__).resolve()), "--device", args.device, "--case", case,
                "--threads", str(args.threads)] + (["--small"] if args.small else [])
    timing = ["--block-ms", str(args.block_ms), "--settle-s", str(args.settle_s), "--profile-steps", str(args.profile_steps)]
    results = {case: dict(case=case, kind=workload_kind(case), **parse_case(case)) for case in group}
    child_env = dict(env, KFORGE_BENCH_TOGGLE="1", KFORGE_REPORT_INTERVAL_MS="200", KFORGE_LOG="1")

    def run(label, cmd, cache, timeout, owners):
        t = time.monotonic()
        # A session of its own, so that a child past its time is killed with everything it started.
        p = subprocess.Popen([kforge, "--cache-dir", str(cache), *cmd], env=child_env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            _, err = p.communicate()
            for res in owners:
                res.setdefault("errors", []).append(f"{label}: did not finish within {timeout:.0f} s")
            return None, err
        for res in owners:
            res.setdefault("seconds", {})[label] = round(time.monotonic() - t, 1)
            if p.returncode != 0:
                res.setdefault("errors", []).append(f"{label}: exit status {p.returncode}: " + tail(err, 1500, tmp))
        return (p if p.returncode == 0 else None), err

    def timed(case, label, cache, variants):
        result = tmp / f"{case}-{label}.json"
        result.unlink(missing_ok=True)
        p, err = run(label, ["run", "--no-daemon", "--", *common(case), "--child", "time", "--result", str(result),
                             "--variants", variants, *timing, "--rounds", str(args.overhead_rounds if label == "empty" else args.rounds)]
                    + (["--no-profile", "--no-reference"] if label == "empty" else []),
                     cache, args.child_timeout, [results[case]])
        (out_dir / f"{case}-{label}-hook.log").write_text(
            "".join(line.replace(str(tmp), "<tmp>") + "\n" for line in (err or "").splitlines() if line.startswith("kforge")))
        return json.loads(result.read_text()) if p is not None and result.exists() else None

    empty = tmp / "empty-cache"
    for case in group:
        print(f"model_suite: {case}: empty cache", flush=True)
        shutil.rmtree(empty, ignore_errors=True)
        empty.mkdir()
        results[case]["empty"] = timed(case, "empty", empty, "eager,kforge")
    if not args.no_warm:
        name = group[0] if len(group) == 1 else "-".join(group[0].split("-")[:2])
        print(f"model_suite: {name}: kforge warm, {args.warm_minutes} min, its workload steps {', '.join(group)}", flush=True)
        shutil.rmtree(tmp / "warm", ignore_errors=True)
        daemon_args = ["--daemon-arg=--devices", f"--daemon-arg={'cuda:0' if args.device == 'cuda' else 'cpu'}",
                       "--daemon-arg=--max-evaluations", f"--daemon-arg={args.max_evaluations}"]
        run("warm", ["warm", "--minutes", str(args.warm_minutes), "--report", str(tmp / "warm"), *daemon_args,
                     "--", *common(",".join(group)), "--child", "steps", "--seconds", str(args.warm_run_seconds)],
            tmp / "cache", args.warm_minutes * 60 + args.child_timeout, list(results.values()))
        per_op.stop_daemon(tmp)
        report = tmp / "warm" / "report.md"
        if report.exists():
            text = report.read_text().replace(str(tmp), "<tmp>").replace(sys.executable, "python3").replace(f"{ROOT}/", "")
            (out_dir / f"{name}-warm.md").write_text(text)
            for res in results.values():
                res["warm_report"] = f"{name}-warm.md"
                res["warm_cases"] = group
                res["warm_e2e"] = next((l for l in text.splitlines() if l.startswith("Step rate with every kernel in")), "")
                res["warm_left_out"] = re.findall(r"\| `([^`]+)` \| [^|]+ \| \d+ \| \*\*left out\*\* \|", text)
    variants = "eager,kforge" + ("" if args.no_compile else ",compile,compile_kforge")
    for case in group:
        print(f"model_suite: {case}: timed on the {'warm' if not args.no_warm else 'given'} cache", flush=True)
        results[case]["timed"] = timed(case, "timed", tmp / "cache", variants)
        (out_dir / f"{case}.json").write_text(json.dumps(results[case], indent=1))
    return list(results.values())


def groups_of(selected, scope):
    """The cases in warm groups: one per model and dtype (in the order first selected), or each alone."""
    if scope == "case":
        return [[c] for c in selected]
    out = {}
    for c in selected:
        out.setdefault(tuple(c.split("-")[:2]), []).append(c)
    return list(out.values())


def tail(text, n, tmp):
    return (text or "")[-n:].replace(str(tmp), "<tmp>")


# ---- the report -----------------------------------------------------------------------------------

def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(v, spec=".3f", none="-"):
    return none if v is None else format(v, spec)


def fx(v):
    return "-" if v is None else f"{v:.3f}x"


def identical(s):
    """The table's identical column: the empty-cache output against eager's, and the control."""
    if s["empty_identical"] is None:
        return "-"
    if s["empty_identical"]:
        return "yes"
    return "no (nor is eager against itself)" if s["eager_repeatable"] is False else "**no**"


def summarize(res):
    """The numbers one case contributes to the report (None where not measured)."""
    t, e = res.get("timed") or {}, res.get("empty") or {}
    st, est = t.get("stats", {}), e.get("stats", {})
    acc = t.get("accuracy", {})
    s = dict(case=res["case"], kind=res["kind"], errors=res.get("errors", []))
    s["eager_ms"] = st.get("eager", {}).get("median_ms")
    for v in ("kforge", "compile", "compile_kforge"):
        s[f"{v}_ms"] = st.get(v, {}).get("median_ms")
        s[f"{v}_x"] = st.get(v, {}).get("speedup")
        s[f"{v}_iv"] = st.get(v, {}).get("speedup_interval")
    k = est.get("kforge", {})
    s["overhead"] = (1 / k["speedup"] - 1) if k.get("speedup") else None
    s["overhead_iv"] = [1 / k["speedup_interval"][1] - 1, 1 / k["speedup_interval"][0] - 1] if k.get("speedup_interval") else None
    s["empty_identical"] = (e.get("accuracy", {}).get("kforge") or {}).get("identical_to_eager")
    s["eager_repeatable"] = e.get("eager_repeatable")
    s["accuracy"] = {v: a.get("passed") for v, a in acc.items() if v != "eager"}
    s["err_kforge"] = (acc.get("kforge") or {}).get("vs_float64", {}).get("rel_l2")
    s["err_eager"] = (acc.get("eager") or {}).get("vs_float64", {}).get("rel_l2")
    s["err_vs_eager"] = (acc.get("kforge") or {}).get("vs_eager", {}).get("rel_l2")
    s["active"] = [g for g in t.get("signatures", []) if g["state"] == "active"]
    s["kept"] = [g for g in t.get("signatures", []) if g["state"] not in ("active", "none")]
    s["no_entry"] = [g for g in t.get("signatures", []) if g["state"] == "none"]
    s["vs_compile"] = (s["compile_ms"] / s["kforge_ms"]) if s["compile_ms"] and s["kforge_ms"] else None
    return s


def render(out_dir, header=""):
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]
    results = [r for r in results if "case" in r and "kind" in r]
    if not results:
        sys.exit(f"model_suite: no case results in {out_dir}")
    rows = [summarize(r) for r in results]
    if not header and (out_dir / "command.txt").exists():
        header = "\n".join(f"- {l}" for l in (out_dir / "command.txt").read_text().splitlines() if l.strip())
    some = next((r["timed"] for r in results if r.get("timed")), {}) or next((r["empty"] for r in results if r.get("empty")), {}) or {}
    L = [f"# Model suite: {some.get('gpu', '?')}, torch {some.get('torch', '?')}", ""]
    if header:
        L += [header, ""]
    L += ["Step time is the median over interleaved blocks in one process per cache; a speedup is eager's step time "
          "over the variant's, paired round by round (order-balanced median, 95% bootstrap interval in brackets). "
          "**empty**: kforge's hook with an empty cache, its overhead (+ is slower) and whether the output is "
          "bitwise identical to eager's (the control: eager's output against a second run of its own; a step "
          "whose PyTorch kernels are not deterministic from run to run is identical under no hook). **warm**: a fresh process on the cache `kforge warm` left "
          "(`kforge run --no-daemon`). **compile**: torch.compile of the same step, interceptors out; **compile+kf**: "
          "the same compiled step with kforge's interceptors in. **ok**: every variant's output within kforge's "
          "accuracy criterion against float64 (at most twice eager's error).", "",
          "![speedup](speedup.png)", "",
          "Per case, numbered as in the table: speedup over eager with an empty cache (blue), after warm (orange), "
          "torch.compile (green), torch.compile under kforge (purple); the black line is 1x.", ""]
    L += ["| # | case | eager ms | empty: overhead | identical | warm ms | warm speedup | compile ms | compile | "
          "compile+kf | warm vs compile | ok | kforge kernels active |", "|" + "---|" * 13]
    for i, s in enumerate(rows, 1):
        ok = s["accuracy"]
        okt = "-" if not ok else ("yes" if all(ok.values()) else "**NO**: " + ",".join(v for v, p in ok.items() if not p))
        iv = lambda x: f" [{x[0]:.3f}-{x[1]:.3f}]" if x else ""   # noqa: E731
        ov = f"{s['overhead']:+.2%}" + (f" [{s['overhead_iv'][0]:+.2%}, {s['overhead_iv'][1]:+.2%}]" if s["overhead_iv"] else "") \
            if s["overhead"] is not None else "-"
        L.append(f"| {i} | {s['case']} | {fmt(s['eager_ms'], '.3f')} | {ov} | {identical(s)} | "
                 f"{fmt(s['kforge_ms'])} | {fx(s['kforge_x'])}{iv(s['kforge_iv'])} | {fmt(s['compile_ms'])} | "
                 f"{fx(s['compile_x'])} | {fx(s['compile_kforge_x'])} | {fx(s['vs_compile'])} | {okt} | {len(s['active'])} |")
    L += ["", "## Against the issue's targets", ""]
    batch = [s["kforge_x"] for s in rows if s["kind"] == "batch"]
    llm = [s["kforge_x"] for s in rows if s["kind"] == "llm"]
    both = batch + llm
    gm = lambda xs: f"{geomean(xs):.3f}x over {len([x for x in xs if x])} cases" if geomean(xs) else "not measured"   # noqa: E731
    L.append(f"- Warm-cache geometric mean over eager, batch and prefill workloads (vision, UNet, LLM prefill and "
             f"decode at batch 32): {gm(both)} (target at least 1.25x).")
    L.append(f"- The same over the LLM cases alone: {gm(llm)} (target at least 1.15x).")
    slow = [s for s in rows if s["kforge_x"] is not None and s["kforge_x"] < 0.99]
    L.append(f"- Cases slower than 0.99x eager after warm: {len(slow)}" +
             (": " + ", ".join(f"{s['case']} {s['kforge_x']:.3f}x" for s in slow) if slow else "") + ".")
    ovs = [s for s in rows if s["overhead"] is not None]
    worst = max(ovs, key=lambda s: s["overhead"], default=None)
    noisy = [s["case"] for s in ovs if s["eager_repeatable"] is False]
    L.append(f"- Empty-cache overhead: largest {worst['overhead']:+.2%} ({worst['case']}); cases above 1%: "
             f"{sum(1 for s in ovs if s['overhead'] > 0.01)} of {len(ovs)}; output bitwise identical to eager in "
             f"{sum(1 for s in ovs if s['empty_identical'])} of {len(ovs)}"
             + (f" (eager's own output differed between two runs of the step in {len(noisy)}: {', '.join(noisy)})" if noisy else "")
             + "." if worst else "- Empty-cache overhead: not measured.")
    by_model = {}
    for s in rows:
        if s["vs_compile"] is not None:
            by_model.setdefault(s["case"].split("-")[0], []).append(s["vs_compile"])
    at_or_above = sorted(m for m, xs in by_model.items() if min(xs) >= 1.0)
    if by_model:
        L.append(f"- Models at or above torch.compile in every measured configuration: {len(at_or_above)}"
                 + (f" ({', '.join(at_or_above)})" if at_or_above else "") + f" of {len(by_model)} (target at least two).")
    else:
        L.append("- Against torch.compile: not measured (no case timed torch.compile).")
    bad = [s for s in rows if s["accuracy"] and not all(s["accuracy"].values())]
    L.append(f"- Outputs outside the criterion: {len(bad)} cases" + (": " + ", ".join(s["case"] for s in bad) if bad else "") + ".")
    L += ["", "## Per case: where the time goes, what kforge runs, and why", "", "![time by operator](time.png)", "",
          "Per case, eager's profiled step time (left bar) and under kforge (right), as a share of eager's: matmul, "
          "convolution and attention (light grey), eager's five largest other operators as listed below (blue, "
          "orange, green, purple, red), every other operator (dark grey).", ""]
    for i, (s, r) in enumerate(zip(rows, results), 1):
        t = r.get("timed") or {}
        L.append(f"### {i}. {s['case']}")
        L.append("")
        for err in s["errors"]:
            L.append(f"- error: {err}")
        if t.get("compile_error"):
            L.append(f"- torch.compile failed: {t['compile_error']}")
        if r.get("warm_e2e"):
            L.append(f"- kforge warm (`{r.get('warm_report', '')}`, its workload: {', '.join(r.get('warm_cases', []))}), "
                     f"end-to-end check: {r['warm_e2e']}" +
                     (f" Left out: {', '.join('`' + k + '`' for k in r['warm_left_out'])}." if r.get("warm_left_out") else ""))
        if s["err_kforge"] is not None:
            L.append(f"- Output error against float64 (relative L2): eager {s['err_eager']:.3g}, kforge {s['err_kforge']:.3g}; "
                     f"kforge against eager {s['err_vs_eager']:.3g}.")
        prof = t.get("profile_us") or {}
        if prof.get("eager"):
            tot = {k: sum(x[1] for x in v) for k, v in prof.items()}
            kf = {x[0]: x[1] for x in prof.get("kforge", [])}
            L.append(f"- Operator time per step (profiler), eager {tot['eager'] / 1e3:.3f} ms, under kforge "
                     f"{tot.get('kforge', 0) / 1e3:.3f} ms; the largest:")
            for name, us, cls in prof["eager"][:10]:
                L.append(f"  - {name} ({cls}): {us / tot['eager']:.1%} of eager, {us:.0f} us -> {kf.get(name, 0):.0f} us")
        for g in s["active"]:
            ratio = (g["pytorch_median_ns"] / g["entry_median_ns"]) if g.get("pytorch_median_ns") and g.get("entry_median_ns") else None
            L.append(f"- active: `{g['signature'][:110]}`" + (f", {ratio:.2f}x in this process" if ratio else ""))
        for g in s["kept"]:
            L.append(f"- PyTorch's kernel kept ({g['state']}): `{g['signature'][:110]}`" + (f": {g['reason']}" if g["reason"] else ""))
        if s["no_entry"]:
            ops = sorted({(g.get("op") or g["signature"].split("(")[0]) for g in s["no_entry"]})
            L.append(f"- No entry in the cache (searched without a win, or not searched within the warm's budget) for "
                     f"{len(s['no_entry'])} signatures of: {', '.join(ops)}.")
        L.append("")
    (out_dir / "report.md").write_text("\n".join(L) + "\n")
    write_speedup_png(out_dir / "speedup.png", rows)
    write_time_png(out_dir / "time.png", results)
    return out_dir / "report.md"


# ---- PNG charts without an image library (the GPU host has no pip) -------------------------------

# 5x7 glyphs (bit 4 leftmost): digits and what axis labels need. Cases are numbered as in the report.
FONT = {"0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14), "2": (14, 17, 1, 2, 4, 8, 31),
        "3": (31, 2, 4, 2, 1, 17, 14), "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
        "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8), "8": (14, 17, 17, 14, 17, 17, 14),
        "9": (14, 17, 17, 15, 1, 2, 12), ".": (0, 0, 0, 0, 0, 12, 12), "x": (0, 0, 17, 10, 4, 10, 17),
        "%": (24, 25, 2, 4, 8, 19, 3), "-": (0, 0, 0, 31, 0, 0, 0)}
PALETTE = [(255, 255, 255), (0, 0, 0), (200, 200, 200), (31, 119, 180), (255, 127, 14), (44, 160, 44),
           (148, 103, 189), (214, 39, 40), (140, 86, 75), (127, 127, 127)]


class Canvas:
    def __init__(self, w, h):
        self.w, self.h, self.px = w, h, bytearray(w * h)

    def rect(self, x0, y0, x1, y1, c):
        x0, x1 = sorted((int(x0), int(x1)))
        y0, y1 = sorted((int(y0), int(y1)))
        for y in range(max(y0, 0), min(y1, self.h - 1) + 1):
            a, b = max(x0, 0), min(x1, self.w - 1)
            if a <= b:
                self.px[y * self.w + a:y * self.w + b + 1] = bytes([c]) * (b - a + 1)

    def text(self, x, y, s, c=1):
        for ch in s:
            for r, bits in enumerate(FONT.get(ch, (0,) * 7)):
                for col in range(5):
                    if bits & (16 >> col):
                        self.rect(x + 2 * col, y + 2 * r, x + 2 * col + 1, y + 2 * r + 1, c)
            x += 12

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w:(y + 1) * self.w]) for y in range(self.h))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
        data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 3, 0, 0, 0))
                + chunk(b"PLTE", b"".join(bytes(c) for c in PALETTE)) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
        pathlib.Path(path).write_bytes(data)


def axes(cv, left, top, right, bottom, ymax, ticks, label):
    cv.rect(left, top, left, bottom, 1)
    cv.rect(left, bottom, right, bottom, 1)
    for k in range(ticks + 1):
        v = ymax * k / ticks
        y = bottom - (bottom - top) * k / ticks
        cv.rect(left + 1, y, right, y, 2)
        cv.text(4, int(y) - 7, label(v))


def write_speedup_png(path, rows):
    """Per case (numbered as in the report's table), bars of the speedup over eager: empty cache
    (blue, 1/(1+overhead)), warm (orange), torch.compile (green), torch.compile under kforge
    (purple); a black line at 1x."""
    keys = [("overhead", 3), ("kforge_x", 4), ("compile_x", 5), ("compile_kforge_x", 6)]
    vals = [[(1 / (1 + s["overhead"]) if k == "overhead" and s["overhead"] is not None else s.get(k)) for k, _ in keys] for s in rows]
    ymax = max([v for vs in vals for v in vs if v] + [1.5])
    ymax = math.ceil(ymax * 2) / 2
    W, H, left, top, bottom = max(400, 90 + 56 * len(rows)), 360, 70, 20, 320
    cv = Canvas(W, H)
    axes(cv, left, top, W - 10, bottom, ymax, 5, lambda v: f"{v:.1f}x")
    for i, vs in enumerate(vals):
        x0 = left + 10 + 56 * i
        for j, v in enumerate(vs):
            if v:
                cv.rect(x0 + 11 * j, bottom - (bottom - top) * v / ymax, x0 + 11 * j + 9, bottom - 1, keys[j][1])
        cv.text(x0 + 8, bottom + 8, str(i + 1))
    y1 = bottom - (bottom - top) / ymax
    cv.rect(left, y1, W - 10, y1 + 1, 1)
    cv.png(path)


def write_time_png(path, results):
    """Per case two stacked bars, eager then under kforge, in % of eager's profiled step time, from
    the bottom: matmul, convolution and attention (light grey); eager's five largest other
    operators (blue, orange, green, purple, red: the report lists them per case in this order);
    every other operator (dark grey)."""
    bars = []
    for r in results:
        prof = (r.get("timed") or {}).get("profile_us") or {}
        if not prof.get("eager"):
            bars.append(None)
            continue
        tot = sum(x[1] for x in prof["eager"]) or 1.0
        lib_cls = ("matmul", "conv", "attention")
        # eager's five largest other operators, in the same colours in both bars
        largest = [x[0] for x in prof["eager"] if x[2] not in lib_cls][:5]
        pair = []
        for label in ("eager", "kforge"):
            segs = prof.get(label, [])
            us = {x[0]: x[1] for x in segs}
            lib = sum(x[1] for x in segs if x[2] in lib_cls)
            rest = sum(x[1] for x in segs if x[2] not in lib_cls and x[0] not in largest)
            pair.append([(lib / tot, 2)] + [(us.get(name, 0.0) / tot, 3 + k) for k, name in enumerate(largest)] + [(rest / tot, 9)])
        bars.append(pair)
    ymax = max([sum(v for v, _ in p) for b in bars if b for p in b] + [1.0])
    ymax = math.ceil(ymax * 5) / 5
    W, H, left, top, bottom = max(400, 90 + 40 * len(bars)), 360, 70, 20, 320
    cv = Canvas(W, H)
    axes(cv, left, top, W - 10, bottom, ymax, 5, lambda v: f"{v * 100:.0f}%")
    for i, b in enumerate(bars):
        x0 = left + 8 + 40 * i
        cv.text(x0 + 4, bottom + 8, str(i + 1))
        if not b:
            continue
        for j, segs in enumerate(b):
            y = bottom - 1
            for v, c in segs:
                h = (bottom - top) * v / ymax
                if h >= 1:
                    cv.rect(x0 + 15 * j, y - h + 1, x0 + 15 * j + 12, y, c)
                y -= h
    cv.png(path)


# ---- main -----------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--bundle-root", help="an unpacked kforge bundle (bin/kforge); default: the bundle this file is in "
                                          "(share/kforge/bench/), else this source tree's build/")
    ap.add_argument("--kforge", help="the kforge CLI (overrides --bundle-root)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {','.join(MODELS)}")
    ap.add_argument("--dtypes", default="bf16,fp32", help="comma-separated, of bf16,fp16,fp32")
    ap.add_argument("--phases", default="prefill,decode1,decode32", help="the LLMs' phases: prefill,decode1,decode32")
    ap.add_argument("--attention", default="sdpa,eager", help="the LLMs' attention: sdpa,eager")
    ap.add_argument("--cases", help="comma-separated case ids (model-dtype-phase[-attention]); overrides the four above")
    ap.add_argument("--small", action="store_true", help="tiny sizes of the same models (a CPU)")
    ap.add_argument("--threads", type=int, default=1, help="CPU: torch threads in every child")
    ap.add_argument("--warm-minutes", type=float, default=5, help="each warm's budget (kforge warm --minutes)")
    ap.add_argument("--warm-scope", choices=("model", "case"), default="model",
                    help="model: one warm per model and dtype, its workload stepping each of their cases in turn "
                         "(an LLM's prefill and decodes share most operators); case: one warm per case")
    ap.add_argument("--warm-run-seconds", type=float, default=20, help="how long each run of the warm's workload steps")
    ap.add_argument("--max-evaluations", type=int, default=16, help="each signature's search budget (kforged --max-evaluations)")
    ap.add_argument("--no-warm", action="store_true", help="time what --cache-dir holds, without warming it")
    ap.add_argument("--cache-dir", help="the kernel cache the cases warm and the timed runs use (default: a new one)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile and torch.compile under kforge")
    ap.add_argument("--rounds", type=int, default=12, help="timed rounds (one block of each variant) in the warm-cache process")
    ap.add_argument("--overhead-rounds", type=int, default=40,
                    help="timed rounds in the empty-cache process (two variants; the 1%% overhead target needs many)")
    ap.add_argument("--block-ms", type=float, default=200, help="about this long per timed block")
    ap.add_argument("--settle-s", type=float, default=120, help="at most this long for the cache's entries to finish their trial")
    ap.add_argument("--profile-steps", type=int, default=3, help="steps per profile (without and with kforge)")
    ap.add_argument("--child-timeout", type=float, default=1800, help="seconds a timing process may take")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds for the whole run: a case is not started once it is spent (0: no limit)")
    ap.add_argument("--out", help="the results directory (default: bench/results/<date>-<device>-models in a source "
                                  "tree, ./kforge-<date>-<device>-models from a bundle)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (cache, daemon state)")
    ap.add_argument("--skip-done", action="store_true",
                    help="leave out the cases --out already holds a result for (without errors): a suite run in pieces")
    ap.add_argument("--render", metavar="DIR", help="only write the report from the case JSON files in DIR")
    ap.add_argument("--list", action="store_true", help="print the case ids the arguments select, and exit")
    # the children
    ap.add_argument("--child", choices=("steps", "time"), help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=20, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=argparse.SUPPRESS)
    ap.add_argument("--no-reference", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "steps":
        return child_steps(args)
    if args.child == "time":
        return child_time(args)
    if args.render:
        print(render(pathlib.Path(args.render)).read_text())
        return

    def split(text, allowed, what):
        items = [x for x in text.split(",") if x]
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            sys.exit(f"model_suite: {what} {','.join(bad) or '(none)'} not of {','.join(allowed)}")
        return items
    if args.cases:
        selected = args.cases.split(",")
        for c in selected:
            try:
                parse_case(c)
            except ValueError as e:
                sys.exit(f"model_suite: {e}")
    else:
        selected = cases(split(args.models, MODELS, "model"), split(args.dtypes, tuple(DTYPES), "dtype"),
                         split(args.phases, ("prefill", "decode1", "decode32"), "phase"),
                         split(args.attention, ("sdpa", "eager"), "attention"))
    stem = f"{time.strftime('%Y-%m-%d', time.gmtime())}-{args.device}-models"
    out_dir = pathlib.Path(args.out or (pathlib.Path.cwd() / f"kforge-{stem}" if BUNDLE else ROOT / "bench" / "results" / stem))
    if args.skip_done:
        # A suite run in pieces (a GPU lent in short calls) goes on where the last piece stopped.
        done = [c for c in selected if (out_dir / f"{c}.json").exists() and not json.loads((out_dir / f"{c}.json").read_text()).get("errors")]
        if done:
            print(f"model_suite: already in {out_dir}, skipped: {', '.join(done)}", flush=True)
        selected = [c for c in selected if c not in done]
    if args.list:
        print("\n".join(selected))
        return
    kforge = args.kforge or (str(pathlib.Path(args.bundle_root) / "bin" / "kforge") if args.bundle_root
                             else str(BUNDLE / "bin" / "kforge") if BUNDLE else str(ROOT / "build" / "tools" / "kforge"))
    if not os.access(kforge, os.X_OK):
        sys.exit(f"model_suite: no kforge CLI at {kforge}: build kforge or pass --bundle-root")
    if args.no_warm and not args.cache_dir:
        sys.exit("model_suite: --no-warm times what a cache holds: give it with --cache-dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="kforge-models-"))
    (tmp / "run").mkdir(mode=0o700)
    if args.cache_dir:
        (tmp / "cache").symlink_to(pathlib.Path(args.cache_dir).resolve(), target_is_directory=True)
    env = dict(os.environ, KFORGE_DAEMON_ENDPOINT=f"ipc://{tmp}/run/daemon.sock", XDG_STATE_HOME=str(tmp / "state"))
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    shown = " ".join("<path>" if "/" in a else a for a in sys.argv[1:])   # no machine paths in a results file
    header = f"`bench/model_suite.py {shown}`, started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
    # Every piece of a suite run in pieces is named.
    with open(out_dir / "command.txt", "a") as f:
        f.write(header + "\n")
    start = time.monotonic()
    try:
        for group in groups_of(selected, args.warm_scope):
            if args.time_budget and time.monotonic() - start > args.time_budget:
                print(f"model_suite: {', '.join(group)}: not started, the run's --time-budget is spent", flush=True)
                continue
            for res in run_group(group, args, kforge, tmp, out_dir, env):
                s = summarize(res)
                print(f"model_suite: {res['case']}: eager {fmt(s['eager_ms'])} ms, overhead "
                      f"{fmt(s['overhead'], '+.2%')}, warm {fx(s['kforge_x'])}, compile {fx(s['compile_x'])}, "
                      f"outputs {'ok' if s['accuracy'] and all(s['accuracy'].values()) else s['accuracy']}"
                      + (f"; errors: {s['errors']}" if s["errors"] else ""), flush=True)
            render(out_dir)
    finally:
        per_op.stop_daemon(tmp)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {out_dir}/report.md, speedup.png, time.png")


if __name__ == "__main__":
    main()
