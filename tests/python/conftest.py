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
    for sub in ("lib", "runtime", "interposer", "interposer/hook"):
        shutil.copytree(lib, out / sub, dirs_exist_ok=True)
    (out / "tools").mkdir(parents=True, exist_ok=True)
    shutil.copy2(bundle / "bin" / "kforge", out / "tools" / "kforge")   # RUNPATH $ORIGIN/../lib
    return out


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> pathlib.Path:
    bundle = os.environ.get("KFORGE_BUNDLE_ROOT")
    if bundle:
        return _layout_from_bundle(pathlib.Path(bundle).resolve(), tmp_path_factory.mktemp("bundle-layout"))
    d = pathlib.Path(os.environ.get("KFORGE_BUILD_DIR", ROOT / "build")).resolve()
    if not (d / "tools" / "kforge").exists():
        pytest.fail(f"no kforge build in {d}: run scripts/build.sh first")
    return d
