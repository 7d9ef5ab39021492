"""Shared fixtures: where kforge's binaries are.

In a build tree: KFORGE_BUILD_DIR (default build/). From an unpacked bundle on a GPU host:
KFORGE_BUNDLE_ROOT=<bundle>, and the fixture lays the bundle's files out as a build tree would
have them (copies, so that each library's $ORIGIN RUNPATH still finds its neighbours).
"""
import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _layout_from_bundle(bundle: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    lib = bundle / "lib"
    for sub in ("lib", "runtime", "interposer", "interposer/hook", "search_daemon"):
        shutil.copytree(lib, out / sub, dirs_exist_ok=True)
    (out / "tools").mkdir(parents=True, exist_ok=True)
    shutil.copy2(bundle / "bin" / "kforge", out / "tools" / "kforge")   # RUNPATH $ORIGIN/../lib
    for name in ("kforged", "kforge-worker"):   # the daemon tests' layout; the worker's library beside it
        shutil.copy2(bundle / "bin" / name, out / "search_daemon" / name)
    return out


def _bundle_root():
    bundle = os.environ.get("KFORGE_BUNDLE_ROOT")
    return pathlib.Path(bundle).resolve() if bundle else None


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> pathlib.Path:
    bundle = _bundle_root()
    if bundle:
        return _layout_from_bundle(bundle, tmp_path_factory.mktemp("bundle-layout"))
    d = pathlib.Path(os.environ.get("KFORGE_BUILD_DIR", ROOT / "build")).resolve()
    if not (d / "tools" / "kforge").exists():
        pytest.fail(f"no kforge build in {d}: run scripts/build.sh first")
    return d


@pytest.fixture(scope="session")
def publish_tool(build_dir) -> pathlib.Path:
    """kforge-publish-test-entry (tests/support/publish_test_entry.h), run where it was built or
    installed: the bundle's copy finds lib/ through its RUNPATH, so it is not moved."""
    bundle = _bundle_root()
    p = (bundle / "share" / "kforge" / "tests" if bundle else build_dir / "tests") / "kforge-publish-test-entry"
    if not p.exists():
        pytest.fail(f"no kforge-publish-test-entry at {p}: build the kforge-publish-test-entry target")
    return p


@pytest.fixture(scope="session")
def kernel_include_dir() -> pathlib.Path:
    """The directory CPU kernels are compiled with (-I) to find runtime/cpu_kernel_abi.h."""
    bundle = _bundle_root()
    d = bundle / "share" / "kforge" / "tests" / "include" if bundle else ROOT
    if not (d / "runtime" / "cpu_kernel_abi.h").exists():
        pytest.fail(f"no runtime/cpu_kernel_abi.h under {d}")
    return d
