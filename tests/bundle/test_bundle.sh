#!/usr/bin/env bash
# test_bundle.sh TARBALL VERSION
# The bundle must run after unpacking into any directory, with a minimal environment: no build
# tree, no LD_LIBRARY_PATH. Unpacks into a fresh temporary directory, runs `kforge --version`
# from there, and checks that every library it loads from outside the system comes from the bundle.
set -euo pipefail
tarball="$1"; version="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

[[ -f "$tarball" ]] || fail "no bundle at $tarball"
size_kb=$(du -k "$tarball" | cut -f1)
(( size_kb < 65536 )) || fail "bundle is ${size_kb} KiB; it must stay small (< 64 MiB)"
tar -C "$tmp" -xzf "$tarball"
root="$(echo "$tmp"/kforge-*)"
[[ -x "$root/bin/kforge" ]] || fail "bin/kforge missing from the bundle"

out="$(env -i PATH=/usr/bin:/bin "$root/bin/kforge" --version)" || fail "kforge --version failed: $out"
[[ "$out" == "kforge $version"* ]] || fail "unexpected version line: $out"
echo "ok: $out"

# The loader must take our libraries from the unpacked bundle, not from the build tree.
maps="$(env -i PATH=/usr/bin:/bin LD_DEBUG=libs "$root/bin/kforge" --version 2>&1 >/dev/null | grep 'calling init' || true)"
echo "$maps" | grep -q "$root/bin/../lib/libkforge_runtime.so\|$root/lib/libkforge_runtime.so" \
  || fail "libkforge_runtime.so not loaded from the bundle: $maps"
# Everything resolves inside the bundle or the system, except torch's own libraries, which only the
# hook needs and which are in every process the hook is loaded into.
for f in "$root"/bin/* "$root"/lib/*.so*; do
  missing="$(ldd "$f" | grep "not found" | grep -vE "^\s*(libtorch[a-z_]*|libc10[a-z_]*|libgomp)\.so" || true)"
  [[ -z "$missing" ]] || fail "$f has unresolved libraries: $missing"
done
[[ -x "$root/share/kforge/tests/run-gpu-tests" ]] || fail "GPU suite runner missing from the bundle"
for f in python/conftest.py python/test_hook_observe.py python/test_hook_swap.py python/test_hook_swap_cuda.py \
         python/test_daemon.py python/test_daemon_cuda.py \
         include/runtime/cpu_kernel_abi.h; do
  [[ -f "$root/share/kforge/tests/$f" ]] || fail "share/kforge/tests/$f missing from the bundle (run-gpu-tests needs it)"
done

# The test publisher runs in place (RUNPATH $ORIGIN/../../../lib) with its libraries from the bundle.
tool="$root/share/kforge/tests/kforge-publish-test-entry"
[[ -x "$tool" ]] || fail "kforge-publish-test-entry missing from the bundle"
missing="$(ldd "$tool" | grep "not found" || true)"
[[ -z "$missing" ]] || fail "$tool has unresolved libraries: $missing"
env -i PATH=/usr/bin:/bin "$tool" --help | grep -q "^usage: kforge-publish-test-entry" \
  || fail "kforge-publish-test-entry --help does not print its usage"
maps="$(env -i PATH=/usr/bin:/bin LD_DEBUG=libs "$tool" --help 2>&1 >/dev/null | grep 'calling init' || true)"
echo "$maps" | grep -q "$root/share/kforge/tests/../../../lib/libkforge_runtime.so\|$root/lib/libkforge_runtime.so" \
  || fail "kforge-publish-test-entry does not load libkforge_runtime.so from the bundle: $maps"
rc=0; env -i PATH=/usr/bin:/bin "$tool" --cache "$tmp/c" >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "kforge-publish-test-entry with missing options exited $rc, not 2 (usage error)"
echo "ok: kforge-publish-test-entry runs from the bundle"

# The evaluation worker: the launcher in bin/, the worker library for the build's torch in lib/,
# its corpus test and the worker bench. Without torch the launcher says so in one line (status 3).
[[ -x "$root/bin/kforge-worker" ]] || fail "bin/kforge-worker missing from the bundle"
ls "$root"/lib/libkforge_worker-torch*.so >/dev/null 2>&1 || fail "lib/libkforge_worker-torch*.so missing from the bundle"
[[ -x "$root/bin/bench_worker" ]] || fail "bin/bench_worker missing from the bundle"
[[ -x "$root/bin/bench_pool" ]] || fail "bin/bench_pool missing from the bundle"
[[ -x "$root/share/kforge/tests/bin/kforge_worker_eval_tests" ]] || fail "the worker's corpus test is missing from the bundle"
rc=0; out="$(env -i PATH=/usr/bin:/bin KFORGE_PYTHON=/nonexistent/python3 "$root/bin/kforge-worker" --device cpu 2>&1)" || rc=$?
[[ $rc == 3 && "$out" == *"set KFORGE_PYTHON to a python3 with torch"* ]] \
  || fail "kforge-worker with no usable python: exit $rc, '$out' (want 3 and one line saying what to set)"
echo "ok: kforge-worker and its library are in the bundle"
echo "ok: bundle is relocatable ($(du -h "$tarball" | cut -f1))"
