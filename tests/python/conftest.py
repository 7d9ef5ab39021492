"""Shared fixtures: where the build tree is (KFORGE_BUILD_DIR, default build/)."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("KFORGE_BUILD_DIR", ROOT / "build")).resolve()
    if not (d / "tools" / "kforge").exists():
        pytest.fail(f"no kforge build in {d}: run scripts/build.sh first")
    return d
