#!/usr/bin/env bash
# Quickstart, command 2 (and what CI runs): install what is needed, build with warnings as
# errors, and run every test that this machine can run:
#   1. Catch2 unit tests, the bundle test and the integration tests (ctest -L 'unit|bundle|integration':
#      the latter start real kforge-worker processes in the venv's python)
#   2. the libFuzzer targets, each for KFORGE_FUZZ_SECONDS (clang build in build-fuzz/)
#   3. the unit tests again under AddressSanitizer + UBSan (build-asan/)
#   4. the Python tests (pytest, in the project's venv)
# GPU tests (label 'gpu') need a GPU: run them from the bundle (docs/REFERENCE.md, "GPU hosts").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${KFORGE_BUILD_DIR:-$ROOT/build}"
FUZZ_BUILD="${KFORGE_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
ASAN_BUILD="${KFORGE_ASAN_BUILD_DIR:-$ROOT/build-asan}"
t0=$(date +%s)
"$ROOT/scripts/bootstrap.sh"
"$ROOT/scripts/build.sh"
t_build=$(date +%s)

status=0
# Each phase's seconds, printed at the end (CI's time limit is the whole run's).
phases=""
t_phase=$t_build
phase() { local now; now=$(date +%s); phases+=" $1 $((now - t_phase)) s,"; t_phase=$now; }
# The NVRTC test compiles the first configuration of every signature and one in 3 of the rest
# (KFORGE_NVRTC_EVERY=1 compiles them all: 7 minutes on 2 cores; the bundle's GPU tests build and
# verify instances of every family on the device).
KFORGE_NVRTC_EVERY="${KFORGE_NVRTC_EVERY:-3}" ctest --test-dir "$BUILD" -L 'unit|bundle|integration' --output-on-failure -j "$(nproc)" || status=1
phase ctest

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$FUZZ_BUILD/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$FUZZ_BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DKFORGE_WERROR=ON \
    -DKFORGE_BUILD_TESTS=OFF -DKFORGE_FUZZ=ON -DKFORGE_FUZZ_SECONDS="${KFORGE_FUZZ_SECONDS:-10}"
fi
cmake --build "$FUZZ_BUILD" --parallel "$(nproc)" --target fuzz_launch_expr fuzz_kernel_spec fuzz_wire fuzz_op_signature fuzz_bundle fuzz_manifest fuzz_daemon_messages
phase fuzz-build
ctest --test-dir "$FUZZ_BUILD" -L fuzz --output-on-failure -j "$(nproc)" || status=1
phase fuzz

# No torch targets here: the unit tests link only torch-free libraries, and an instrumented hook or
# worker library cannot be loaded into an uninstrumented python3 anyway (their tests run above).
KFORGE_BUILD_DIR="$ASAN_BUILD" "$ROOT/scripts/build.sh" -DKFORGE_SANITIZE="address;undefined" -DCMAKE_BUILD_TYPE=Debug \
  -DKFORGE_BUILD_HOOK=OFF
phase asan-build
# NVRTC under ASan is slow and is not our code: the sanitizer run compiles one CUDA template
# configuration in 8 (every one compiles in the plain run above).
KFORGE_NVRTC_EVERY=8 ctest --test-dir "$ASAN_BUILD" -L unit --output-on-failure -j "$(nproc)" || status=1
phase asan-ctest

KFORGE_BUILD_DIR="$BUILD" "$ROOT/.venv/bin/python" -m pytest -q --durations=12 "$ROOT/tests/python" || status=1
phase pytest

t_end=$(date +%s)
phases=${phases# }
echo "test.sh: build $((t_build - t0)) s, tests $((t_end - t_build)) s (${phases%,}), status $status"
exit $status
