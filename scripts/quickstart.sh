#!/usr/bin/env bash
# Quickstart, command 1: install what is needed, build, and run what kforge can do today on an
# embedded default. (`kforge demo`, which runs a model under kforge end to end, arrives with the
# end-to-end issue; until then this shows the pieces that exist.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
"$ROOT/scripts/build.sh"
BUILD="${KFORGE_BUILD_DIR:-$ROOT/build}"
cmake --build "$BUILD" --target bundle
echo; echo "== kforge --version"; "$BUILD/tools/kforge" --version
echo; echo "== kforge env (what kforge sees on this host)"; "$BUILD/tools/kforge" env
echo; echo "== kforge selftest cuda (compile a kernel with NVRTC, launch it with the driver API)"
"$BUILD/tools/kforge" selftest cuda || echo "(no GPU here: the self-test reports unavailable and exits 3)"
echo; echo "== signature id cost"; "$BUILD/bench/bench_signature_id" 200000
echo; echo "bundle for GPU hosts: $(ls "$BUILD"/dist/*.tar.gz)"
