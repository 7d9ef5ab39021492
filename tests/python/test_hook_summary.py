"""KFORGE_SUMMARY_DIR: each hooked process leaves kforge-summary-<pid>.json when it exits normally.

`kforge run` reads these files to say what kforge did for a program and all its processes, so each
must be whole (written to a temp file and renamed), belong to one process (its pid, its parent, its
own counts: a forked child's start from zero at the fork), and carry what kforge_hook_stats_json()
says plus the process's identity and times (Note [Exit summary] in hook_main.cc). A directory that
cannot take the files costs one line at start, naming the variable and the value, and no file.

The programs run under the real preload shim, as users run them.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

TORCH_MM = ".".join(torch.__version__.split("+")[0].split(".")[:2])

# Runs softmax PARENT_CALLS times, then forks a child (os.fork, ending with sys.exit: a normal
# exit) that runs it FORK_CALLS times on another shape, and a multiprocessing "spawn" child (a new
# interpreter, which loads its own hook) that runs it SPAWN_CALLS times. Prints each pid and the
# parent's own stats JSON (for the field comparison).
PROGRAM = textwrap.dedent(
    """
    import ctypes, json, multiprocessing as mp, os, sys
    import torch

    def softmax_calls(n, cols):
        x = torch.randn(4, cols)
        for _ in range(n):
            torch.softmax(x, dim=-1)

    def spawned(n, q):
        softmax_calls(n, 48)
        q.put(os.getpid())

    if __name__ == "__main__":
        n_parent, n_fork, n_spawn = (int(v) for v in sys.argv[1:4])
        softmax_calls(n_parent, 32)
        pid = os.fork()
        if pid == 0:
            softmax_calls(n_fork, 40)
            print("FORK", os.getpid(), flush=True)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        if n_spawn:
            ctx = mp.get_context("spawn")
            q = ctx.SimpleQueue()
            p = ctx.Process(target=spawned, args=(n_spawn, q))
            p.start()
            print("SPAWN", q.get(), flush=True)
            p.join()
            assert p.exitcode == 0
        hook = ctypes.CDLL(os.environ["KFORGE_TEST_HOOK"], mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        hook.kforge_hook_stats_json.restype = ctypes.c_char_p
        print("STATS " + hook.kforge_hook_stats_json().decode(), flush=True)
        print("PARENT", os.getpid(), flush=True)
    """
)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    p = tmp_path_factory.mktemp("summary") / "program.py"
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


def run(program, hook_files, counts, **extra):
    hook, shim = hook_files
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k != "LD_PRELOAD"}
    env["KFORGE_DAEMON_ENDPOINT"] = f"ipc://{tempfile.mkdtemp(prefix='kforge-nobody-')}/daemon.sock"
    # One OpenMP thread: a child forked after libgomp ran a parallel region hangs in its next one
    # (PyTorch's own behaviour, with or without kforge).
    env["OMP_NUM_THREADS"] = "1"
    env.update(LD_PRELOAD=str(shim), KFORGE_HOOK_DIR=str(hook.parent), KFORGE_TEST_HOOK=str(hook),
               KFORGE_OBSERVE_EVERY="1")   # every call counted: exact counts to compare
    env.update({k: str(v) for k, v in extra.items()})
    proc = subprocess.run([sys.executable, str(program), *map(str, counts)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=program.parent)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        out[tag] = json.loads(rest) if tag == "STATS" else int(rest)
    return out, proc.stderr


def softmax_signatures(summary):
    return [s for s in summary["signatures"] if s["op"] == "aten::_softmax"]


def test_each_process_leaves_its_own_whole_summary_with_its_own_counts(program, hook_files, tmp_path):
    out, stderr = run(program, hook_files, (37, 23, 11), KFORGE_SUMMARY_DIR=tmp_path)
    assert stderr == ""   # writing summaries is silent
    files = sorted(p.name for p in tmp_path.iterdir())
    # One file per process, nothing else (no temp file left behind).
    assert files == sorted(f"kforge-summary-{out[k]}.json" for k in ("PARENT", "FORK", "SPAWN")), files
    summaries = {k: json.loads((tmp_path / f"kforge-summary-{out[k]}.json").read_text())
                 for k in ("PARENT", "FORK", "SPAWN")}

    for tag, calls, cols in (("PARENT", 37, 32), ("FORK", 23, 40), ("SPAWN", 11, 48)):
        s = summaries[tag]
        assert s["summary_format"] == 1
        assert s["pid"] == out[tag]
        assert s["ppid"] == (out["PARENT"] if tag != "PARENT" else os.getpid())
        assert s["argv0"] == pathlib.Path(sys.executable).name
        assert s["torch"] == torch.__version__
        assert s["mode"] == "observe"
        assert 0 < s["wall_s"] < 300
        # This process's own calls only: the fork child's counters started over at the fork.
        [sig] = softmax_signatures(s)
        assert sig["calls"] == calls, (tag, sig)
        assert f"float32[4,{cols}]" in sig["signature"], sig["signature"]
        # A thread's first call of a signature is timed, so every signature here has a mean.
        assert sig["sampled_calls"] >= 1
        assert sig["mean_ns"] == pytest.approx(sig["sampled_ns"] / sig["sampled_calls"])
        assert sig["estimated_ns"] == pytest.approx(sig["mean_ns"] * sig["calls"])
        assert sig["state"] == "observe"

    # The parent's summary is kforge_hook_stats_json()'s object plus the summary's own fields.
    stats = out["STATS"]
    parent = summaries["PARENT"]
    assert set(stats) <= set(parent), set(stats) - set(parent)
    for key in ("registered", "skipped", "interceptors", "config", "kforge_version", "swap"):
        assert parent[key] == stats[key], key
    assert set(softmax_signatures(stats)[0]) <= set(softmax_signatures(parent)[0])


def test_a_summary_is_written_in_every_mode(program, hook_files, tmp_path):
    for mode in ("shadow", "active"):
        d = tmp_path / mode
        d.mkdir()
        out, stderr = run(program, hook_files, (5, 3, 0), KFORGE_SUMMARY_DIR=d, KFORGE_MODE=mode,
                          KFORGE_CACHE_DIR=tmp_path / "cache")
        assert stderr == ""
        parent = json.loads((d / f"kforge-summary-{out['PARENT']}.json").read_text())
        assert parent["mode"] == mode
        assert softmax_signatures(parent)[0]["calls"] == 5
        assert json.loads((d / f"kforge-summary-{out['FORK']}.json").read_text())["mode"] == mode


def test_a_relative_directory_means_where_the_program_started(program, hook_files, tmp_path):
    (program.parent / "rel-summaries").mkdir(exist_ok=True)
    out, _ = run(program, hook_files, (2, 1, 0), KFORGE_SUMMARY_DIR="rel-summaries")
    assert (program.parent / "rel-summaries" / f"kforge-summary-{out['PARENT']}.json").exists()


@pytest.mark.parametrize("bad", ["missing", "a-file"])
def test_a_bad_directory_gets_one_line_naming_it_and_no_file(program, hook_files, tmp_path, bad):
    (tmp_path / "a-file").write_text("not a directory")
    value = tmp_path / bad
    out, stderr = run(program, hook_files, (3, 2, 0), KFORGE_SUMMARY_DIR=value)
    what = "does not exist" if bad == "missing" else "is not a directory"
    expected = f"kforge: KFORGE_SUMMARY_DIR='{value}' {what}; no summary will be written"
    # One line per process that loaded a hook: here only the parent (the fork child has its hook).
    assert stderr.splitlines() == [expected], stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert out["PARENT"] > 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_a_directory_the_process_cannot_write_gets_one_line(program, hook_files, tmp_path):
    d = tmp_path / "ro"
    d.mkdir(mode=0o500)
    try:
        _, stderr = run(program, hook_files, (1, 1, 0), KFORGE_SUMMARY_DIR=d)
        assert stderr.startswith(f"kforge: KFORGE_SUMMARY_DIR='{d}' is not writable ("), stderr
        assert list(d.iterdir()) == []
    finally:
        d.chmod(0o700)
