"""`kforge doctor` (tools/doctor_command.h), the real CLI of the build tree on this host.

Each problem must FAIL with the exact fix, a healthy setup must exit 0, and on a host without a GPU
the CUDA line is a warning ("CPU backend only"), never a failure. The endpoint is always given, so
a daemon another user of this machine runs is never asked.
"""
import ctypes.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from test_daemon import Daemon, private_root


@pytest.fixture(scope="module")
def kforge(build_dir):
    p = build_dir / "tools" / "kforge"
    if not p.exists():
        pytest.fail(f"no kforge at {p}: build it first")
    return p


@pytest.fixture
def no_daemon_endpoint():
    """An ipc:// endpoint in a private, short directory where no daemon listens."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="kfdoc-"))
    os.chmod(d, 0o700)
    yield f"ipc://{d}/daemon.sock"
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def doctor(kforge, *args, cache_dir=None, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_") and k != "LD_PRELOAD"}
    env.update(env_extra or {})
    pre = ["--cache-dir", str(cache_dir)] if cache_dir else []
    text = subprocess.run([str(kforge), *pre, "doctor", *args], capture_output=True, text=True, timeout=600, env=env)
    js = subprocess.run([str(kforge), *pre, "doctor", "--json", *args], capture_output=True, text=True, timeout=600, env=env)
    assert js.returncode == text.returncode, js.stderr
    checks = json.loads(js.stdout)
    for c in checks:
        assert set(c) == {"check", "status", "detail", "fix"}
        assert c["status"] in ("ok", "warn", "fail"), c
        assert c["status"] == "ok" or c["fix"], f"a problem without a fix: {c}"
    return text, checks


def by_name(checks, name):
    found = [c for c in checks if c["check"] == name]
    assert found, f"no '{name}' check in {[c['check'] for c in checks]}"
    return found[0]


def private_cache(tmp_path, mode=0o700):
    d = tmp_path / "cache"
    d.mkdir()
    os.chmod(d, mode)
    return d


def test_a_healthy_host_passes_and_a_missing_gpu_is_only_a_warning(kforge, tmp_path, no_daemon_endpoint):
    cache = private_cache(tmp_path)
    r, checks = doctor(kforge, "--python", sys.executable, "--endpoint", no_daemon_endpoint, cache_dir=cache)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [c for c in checks if c["status"] == "fail"], r.stdout
    # Every part of the install, the interpreter with its torch, the hook and the worker for it.
    for name in ("install: kforged", "install: kforge-worker", "install: preload shim", "install: hooks", "python",
                 "torch hook", "worker"):
        assert by_name(checks, name)["status"] == "ok", r.stdout
    import torch
    assert torch.__version__ in by_name(checks, "python")["detail"]
    assert "through the preload shim" in by_name(checks, "torch hook")["detail"]
    c = by_name(checks, "cache dir")
    assert c["status"] == "ok" and str(cache) in c["detail"] and "0700" in c["detail"] and "writable" in c["detail"]
    assert "free" in c["detail"]
    d = by_name(checks, "daemon")
    assert d["status"] == "warn" and no_daemon_endpoint in d["detail"] and "kforged" in d["fix"]
    if ctypes.util.find_library("cuda") is None:   # this host: no NVIDIA driver
        cu = by_name(checks, "cuda")
        assert cu["status"] == "warn" and "CPU backend only" in cu["detail"]
    # The text form: one line per check, led by its verdict, and the fix under each problem.
    lines = r.stdout.splitlines()
    assert any(l.startswith("ok    python: ") for l in lines), r.stdout
    assert any(l.startswith("warn  daemon: ") for l in lines), r.stdout
    assert lines[-1] == "kforge doctor: nothing failed"


def test_a_group_writable_cache_directory_fails_naming_chmod_700(kforge, tmp_path, no_daemon_endpoint):
    cache = private_cache(tmp_path, 0o770)
    r, checks = doctor(kforge, "--python", sys.executable, "--endpoint", no_daemon_endpoint, cache_dir=cache)
    assert r.returncode == 1, r.stdout + r.stderr
    c = by_name(checks, "cache dir")
    assert c["status"] == "fail"
    assert "writable by group or others" in c["detail"] and "0770" in c["detail"]
    assert c["fix"] == f"chmod 700 {cache}"
    assert f"FAIL  cache dir: {cache}" in r.stdout and f"      fix: chmod 700 {cache}" in r.stdout
    # The directory was only looked at, not repaired behind the user's back.
    assert (os.stat(cache).st_mode & 0o777) == 0o770


def test_a_symlinked_cache_directory_fails(kforge, tmp_path, no_daemon_endpoint):
    real = private_cache(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    r, checks = doctor(kforge, "--python", sys.executable, "--endpoint", no_daemon_endpoint, cache_dir=link)
    assert r.returncode == 1
    c = by_name(checks, "cache dir")
    assert c["status"] == "fail" and "symbolic link" in c["detail"]


def test_a_missing_python_fails_naming_the_python_option_and_the_daemon_key(kforge, tmp_path, no_daemon_endpoint):
    cache = private_cache(tmp_path)
    missing = tmp_path / "no-such-python3"
    r, checks = doctor(kforge, "--python", str(missing), "--endpoint", no_daemon_endpoint, cache_dir=cache)
    assert r.returncode == 1, r.stdout + r.stderr
    p = by_name(checks, "python")
    assert p["status"] == "fail" and str(missing) in p["detail"]
    assert "--python" in p["fix"] and "workers.python" in p["fix"]
    # The checks that do not need python still ran.
    assert by_name(checks, "cache dir")["status"] == "ok"
    # KFORGE_PYTHON is the default when --python is not given (the workers' own default).
    r2, checks2 = doctor(kforge, "--endpoint", no_daemon_endpoint, cache_dir=cache, env_extra={"KFORGE_PYTHON": str(missing)})
    assert r2.returncode == 1
    assert "KFORGE_PYTHON" in by_name(checks2, "python")["detail"]


def test_a_python_without_torch_fails(kforge, tmp_path, no_daemon_endpoint):
    cache = private_cache(tmp_path)
    # -I: isolated, without the venv's site-packages (the base interpreter has no torch here).
    base = pathlib.Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run([str(base), "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base} has torch: no torch-less python on this host")
    r, checks = doctor(kforge, "--python", str(base), "--endpoint", no_daemon_endpoint, cache_dir=cache)
    assert r.returncode == 1
    p = by_name(checks, "python")
    assert p["status"] == "fail" and "cannot import torch" in p["detail"] and "pip install torch" in p["fix"]


def test_usage_errors_exit_2(kforge):
    r = subprocess.run([str(kforge), "doctor", "--frobnicate"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown option '--frobnicate'" in r.stderr
    r = subprocess.run([str(kforge), "doctor", "--python"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--python needs a value" in r.stderr


def test_a_running_daemon_is_checked_for_its_version_and_cache_directory(kforge, build_dir, tmp_path):
    bins = {"kforged": build_dir / "search_daemon" / "kforged", "worker": build_dir / "search_daemon" / "kforge-worker",
            "kforge": kforge}
    root = private_root(tmp_path)
    # Normal priority: this test is about the answer, and a loaded test host must not starve the worker.
    daemon = Daemon(bins, root, "--set", "workers.priority=normal").start()
    try:
        r, checks = doctor(kforge, "--python", sys.executable, "--endpoint", daemon.endpoint, cache_dir=root / "cache")
        assert r.returncode == 0, r.stdout + r.stderr
        d = by_name(checks, "daemon")
        assert d["status"] == "ok" and f"pid {daemon.proc.pid}" in d["detail"]
        assert by_name(checks, "daemon cache")["status"] == "ok"
        # A hook with another cache directory would never load what this daemon finds.
        other = private_cache(tmp_path)
        r, checks = doctor(kforge, "--python", sys.executable, "--endpoint", daemon.endpoint, cache_dir=other)
        assert r.returncode == 1
        c = by_name(checks, "daemon cache")
        assert c["status"] == "fail" and str(other) in c["detail"] and str(root / "cache") in c["detail"]
        assert f"--cache-dir {other}" in c["fix"]
    finally:
        daemon.stop()
