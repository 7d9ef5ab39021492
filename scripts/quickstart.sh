#!/usr/bin/env bash
# Quickstart, command 1: install what is needed, build, make the bundle, check the host, and run
# `kforge demo`: a small model built in code, run under kforge end to end (search, verified kernels
# swapped in, step time before/after measured in one process, outputs checked). On the GPU when
# torch sees one, else on the CPU backend (about 5 minutes on a 2-core machine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
"$ROOT/scripts/build.sh"
BUILD="${KFORGE_BUILD_DIR:-$ROOT/build}"
cmake --build "$BUILD" --target bundle
KFORGE="$BUILD/tools/kforge"
echo; echo "== kforge --version"; "$KFORGE" --version
echo; echo "== kforge doctor (what this host can run; warnings are fine)"
"$KFORGE" doctor --python "$ROOT/.venv/bin/python" || echo "(doctor found a problem: see its 'fix:' lines)"
echo; echo "bundle for GPU hosts: $(ls "$BUILD"/dist/*.tar.gz)"
echo; echo "== kforge demo"
PATH="$ROOT/.venv/bin:$PATH" "$KFORGE" demo "$@"
