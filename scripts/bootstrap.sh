#!/usr/bin/env bash
# Installs everything kforge needs to build and test on a Debian 12 (bookworm) x86-64 host:
# the Debian packages, and a project-local Python virtual environment (.venv) with torch pinned
# to the GPU machines' version. Idempotent: a second run installs nothing and takes seconds.
#
#   scripts/bootstrap.sh            # packages + venv
#   KFORGE_SKIP_APT=1 scripts/bootstrap.sh   # venv only (no root)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KFORGE_VENV:-$ROOT/.venv}"
TORCH_VERSION="${KFORGE_TORCH_VERSION:-2.11.0}"
TORCHVISION_VERSION="${KFORGE_TORCHVISION_VERSION:-0.26.0}"

log() { printf 'bootstrap: %s\n' "$*"; }
die() { printf 'bootstrap: error: %s\n' "$*" >&2; exit 1; }

DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config patchelf file
  clang libclang-rt-14-dev            # libFuzzer targets and sanitizers
  libzmq3-dev cppzmq-dev              # wire transport
  libmsgpack-cxx-dev                  # wire encoding
  libxxhash-dev                       # 128-bit signature ids (XXH3)
  flatbuffers-compiler libflatbuffers-dev   # cache manifests
  libtbb-dev                          # daemon concurrency
  catch2                              # unit tests (Catch2 v2 on bookworm)
  libcurl4-openssl-dev                # LLM proposer
  libsodium-dev                       # Ed25519 bundle signing, SHA-256
  libzstd-dev zstd                    # bundle compression
  nlohmann-json3-dev                  # GUI JSON API, TOML-free config dumps
  libtomlplusplus-dev                 # the daemon's configuration file
  libcpp-httplib-dev                  # the daemon's HTTP endpoints (metrics, GUI); the tests' LLM server
  chromium chromium-driver            # the GUI's browser test (headless, driven by Selenium)
  python3-venv
)

missing_debs() {
  local p out=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || out+=("$p")
  done
  echo "${out[@]:-}"
}

if [[ "${KFORGE_SKIP_APT:-0}" != 1 ]]; then
  miss="$(missing_debs)"
  if [[ -n "$miss" ]]; then
    [[ $(id -u) == 0 ]] || die "missing Debian packages: $miss (run as root, or install them and set KFORGE_SKIP_APT=1)"
    log "installing Debian packages: $miss"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $miss >/dev/null || die "apt-get install failed for: $miss"
  else
    log "Debian packages present"
  fi
fi

# The CUDA toolkit is the machine's own (nvcc, NVRTC, headers, driver stub); we never download it.
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
if [[ ! -x "$CUDA_HOME/bin/nvcc" ]] && ! command -v nvcc >/dev/null; then
  die "missing CUDA toolkit: no nvcc in \$CUDA_HOME/bin ($CUDA_HOME) or on PATH"
fi
[[ -f "$CUDA_HOME/include/nvrtc.h" ]] || die "missing NVRTC header: $CUDA_HOME/include/nvrtc.h"
[[ -f "$CUDA_HOME/include/cuda.h" ]] || die "missing CUDA driver API header: $CUDA_HOME/include/cuda.h"

PY="${KFORGE_PYTHON:-python3}"
command -v "$PY" >/dev/null || die "missing python3"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtual environment $VENV"
  "$PY" -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
fi
VPY="$VENV/bin/python"

have_py() { "$VPY" - "$@" <<'PYEOF' 2>/dev/null
import sys, importlib.metadata as md
for spec in sys.argv[1:]:
    name, _, ver = spec.partition("==")
    try:
        v = md.version(name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if ver and not v.startswith(ver):
        sys.exit(1)
PYEOF
}

if have_py "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" transformers numpy pytest selenium; then
  log "python packages present (torch $TORCH_VERSION)"
else
  log "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION transformers numpy pytest into $VENV"
  "$VPY" -m pip install -q --upgrade pip >/dev/null
  "$VPY" -m pip install -q "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" \
      transformers numpy pytest pyzmq msgpack selenium \
    || die "pip could not install torch==$TORCH_VERSION (try KFORGE_TORCH_VERSION=2.11.x for the nearest release)"
fi
log "ready: $("$VPY" -c 'import torch; print("torch", torch.__version__)')"
