"""A program under kforge prints nothing kforge did not mean to say.

Every hooked process (each server worker, each multiprocessing child) used to print PyTorch's
multi-line "Overriding a previously registered kernel ... registered at <build machine>/interceptor.cc"
when the hook registered its interceptors. Now, by default, a hooked process's stderr is exactly
what it is without kforge, in every mode: the warning is dropped while (and only while) kforge
registers (Note [Quiet registration] in interceptor.cc), no path of the build machine or of the
source tree reaches the output, and PyTorch warnings raised by the program itself still reach it.
With KFORGE_LOG=1 each process that loads the hook says in one line that it registered.

The programs run under the real preload shim (LD_PRELOAD), the way users run them, with a fork and
a spawn multiprocessing child each.
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

TORCH_MM = ".".join(torch.__version__.split("+")[0].split(".")[:2])
SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]
REGISTERED_LINE = re.compile(
    r"^kforge: registered (\d+) interceptors \(PyTorch's 'overriding a registered kernel' warning suppressed\)$",
    re.M)

# Softmax and layer_norm (catalog operators) in the parent and in a fork and a spawn child; each
# process prints how many interceptors its hook registered (0 when no hook is in it), read through
# the hook's own C entry point, so a silent run is known to be a hooked one.
PROGRAM = textwrap.dedent(
    """
    import ctypes, json, multiprocessing as mp, os, sys
    import torch
    import torch.nn.functional as F

    def registered():
        hook = os.environ.get("KFORGE_TEST_HOOK")
        if not hook:
            return 0
        try:
            lib = ctypes.CDLL(hook, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        except OSError:
            return 0
        lib.kforge_hook_stats_json.restype = ctypes.c_char_p
        return len(json.loads(lib.kforge_hook_stats_json()).get("registered", []))

    def work(tag, q):
        x = torch.randn(8, 64)
        y = torch.softmax(x, dim=-1)
        z = F.layer_norm(x, (64,))
        q.put((tag, registered(), float(y.sum() + z.sum())))

    if __name__ == "__main__":
        work("parent", q := mp.SimpleQueue())
        for method in ("fork", "spawn"):
            ctx = mp.get_context(method)
            cq = ctx.SimpleQueue()
            p = ctx.Process(target=work, args=(method, cq))
            p.start()
            q.put(cq.get())
            p.join()
            assert p.exitcode == 0, (method, p.exitcode)
        while not q.empty():
            tag, n, _ = q.get()
            print(f"REGISTERED {tag} {n}", flush=True)
        if os.environ.get("KFORGE_TEST_USER_WARNINGS"):
            # A warning PyTorch raises (TORCH_WARN in C++) for the program's own call.
            out = torch.empty(2)
            torch.add(torch.ones(3), 1, out=out)
            # The program's own override of an aten kernel: PyTorch's warning about it is the
            # program's business and must reach it (warn-always, as the warning is once per process).
            torch._C._set_warnAlways(True)
            lib = torch.library.Library("aten", "IMPL")
            lib.impl("gelu", lambda x, approximate="none": x, "CPU")
        print("DONE", flush=True)
    """
)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    # A file, not -c: the spawn child imports the program's main module by path.
    p = tmp_path_factory.mktemp("quiet") / "program.py"
    p.write_text(PROGRAM)
    return p


@pytest.fixture(scope="module")
def hook_files(build_dir):
    hook = build_dir / "interposer" / "hook" / f"libkforge_hook-torch{TORCH_MM}.so"
    shim = build_dir / "interposer" / "libkforge_preload.so"
    for p in (hook, shim):
        if not p.exists():
            pytest.fail(f"no {p.name} at {p}: build the kforge_hook and kforge_preload targets")
    return hook, shim


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KFORGE_") and k not in ("LD_PRELOAD", "PYTHONWARNINGS")}
    # One OpenMP thread: a child forked after libgomp ran a parallel region hangs in its next one
    # (PyTorch's own behaviour, with or without kforge).
    env["OMP_NUM_THREADS"] = "1"
    # A private (0700) directory nobody serves: the hook never talks to a real daemon.
    env["KFORGE_DAEMON_ENDPOINT"] = f"ipc://{tempfile.mkdtemp(prefix='kforge-nobody-')}/daemon.sock"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(program, env):
    proc = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=program.parent)
    assert proc.returncode == 0, proc.stderr
    assert "DONE" in proc.stdout, proc.stdout + proc.stderr
    registered = dict(re.findall(r"^REGISTERED (\w+) (\d+)$", proc.stdout, re.M))
    return {k: int(v) for k, v in registered.items()}, proc.stderr


def hooked_env(hook_files, **extra):
    hook, shim = hook_files
    return clean_env(LD_PRELOAD=shim, KFORGE_HOOK_DIR=hook.parent, KFORGE_TEST_HOOK=hook, **extra)


def assert_no_kforge_trace(stderr, build_dir):
    for text in ("Overriding", "registered at", "interceptor.cc", str(build_dir), str(SOURCE_DIR)):
        assert text not in stderr, f"{text!r} in a hooked process's stderr:\n{stderr}"


@pytest.mark.parametrize("mode", ["observe", "shadow", "active"])
def test_a_hooked_program_and_its_children_print_exactly_what_they_print_without_kforge(
        program, hook_files, build_dir, tmp_path, mode):
    plain_registered, plain = run(program, clean_env(KFORGE_TEST_HOOK=hook_files[0]))
    assert plain_registered == {"parent": 0, "fork": 0, "spawn": 0}   # really without kforge
    registered, hooked = run(program, hooked_env(hook_files, KFORGE_MODE=mode,
                                                 KFORGE_CACHE_DIR=tmp_path / "cache"))
    # Every process had the hook, with interceptors registered (the fork child inherits the
    # parent's; the spawn child, a new interpreter, loaded its own).
    assert registered.keys() == {"parent", "fork", "spawn"} and min(registered.values()) > 0, registered
    assert_no_kforge_trace(hooked, build_dir)
    assert hooked == plain


def test_with_kforge_log_each_process_that_loads_the_hook_says_so_in_one_line(program, hook_files, build_dir):
    registered, stderr = run(program, hooked_env(hook_files, KFORGE_LOG=1))
    lines = REGISTERED_LINE.findall(stderr)
    # The parent and the spawn child load a hook; the fork child has its parent's.
    assert len(lines) == 2, stderr
    assert {int(n) for n in lines} == {registered["parent"]} == {registered["spawn"]}
    assert "Overriding" not in stderr and "registered at" not in stderr, stderr


def test_warnings_pytorch_raises_for_the_program_still_reach_it(program, hook_files, build_dir):
    _, plain = run(program, clean_env(KFORGE_TEST_USER_WARNINGS=1))
    _, hooked = run(program, hooked_env(hook_files, KFORGE_TEST_USER_WARNINGS=1))
    for stderr in (plain, hooked):
        assert "An output with one or more elements was resized" in stderr, stderr
        # The program's own override of a kernel.
        assert "Overriding a previously registered kernel" in stderr, stderr
    # kforge's own registration left no trace: the only override warning is the program's.
    # (The source directory itself may appear here: PyTorch's Python warnings name the venv's
    # torch/library.py, and the venv lives in the source tree.)
    assert hooked.count("Overriding a previously registered kernel") == 1, hooked
    assert "interceptor.cc" not in hooked and str(build_dir) not in hooked, hooked
