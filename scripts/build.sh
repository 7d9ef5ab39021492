#!/usr/bin/env bash
# build.sh [extra cmake args...]: configures and builds kforge in build/ (warnings are errors).
# Sourced by quickstart.sh and test.sh after bootstrap.sh has installed the dependencies.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${KFORGE_BUILD_DIR:-$ROOT/build}"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKFORGE_WERROR=ON "$@"
fi
cmake --build "$BUILD" --parallel "$(nproc)"
