"""The kforge runtime inside a process that has imported torch.

This is the CPU-host half of the GPU smoke test (tests/gpu/cuda_smoke.py): the same library, loaded
the same way (ctypes, after `import torch`), must load cleanly next to torch's own CUDA libraries
and report a missing GPU as "unavailable" (exit code 2), never crash the process. On a GPU host
the self-test must pass (code 0).
"""
import json
import subprocess
import sys
import textwrap

import torch

PINNED_TORCH = "2.11.0"


def test_venv_has_the_pinned_torch():
    # The hook is built against this torch; the GPU machines run the same version.
    assert torch.__version__.split("+")[0] == PINNED_TORCH


def test_selftest_in_a_torch_process_reports_gpu_state(build_dir):
    lib = build_dir / "runtime" / "libkforge_runtime.so"
    script = textwrap.dedent(
        f"""
        import ctypes, json, torch
        x = torch.arange(10.0) * 2           # torch works before ...
        lib = ctypes.CDLL({str(lib)!r})
        buf = ctypes.create_string_buffer(8192)
        rc = lib.kforge_cuda_selftest(buf, ctypes.c_size_t(len(buf)))
        y = torch.arange(10.0) * 2           # ... and after
        print(json.dumps({{"rc": rc, "report": buf.value.decode(), "cuda": torch.cuda.is_available(),
                           "torch_ok": bool(torch.equal(x, y))}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["torch_ok"]
    if result["cuda"]:
        assert result["rc"] == 0, result["report"]
    else:
        assert result["rc"] == 2, result["report"]
        assert result["report"], "an unavailable GPU must be explained"


def test_cli_version_and_env(build_dir):
    kforge = build_dir / "tools" / "kforge"
    out = subprocess.run([kforge, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("kforge ")
    env = subprocess.run([kforge, "env", "--json"], capture_output=True, text=True, check=True).stdout
    data = json.loads(env)
    assert data["kforge_version"] == out.split()[1]
    assert data["cpu_environment"]["backend"] == "cpu"
    assert "cache_dir" in data
