#!/usr/bin/env bash
# make_bundle.sh STAGE_DIR OUT.tar.gz
# Turns an installed kforge tree into a relocatable tarball: copies every shared library that our
# ELF files need and that a GPU host cannot be assumed to have into STAGE_DIR/lib, points their
# RUNPATH at $ORIGIN, and checks that nothing outside the bundle but the system libraries is used.
#
# "System" = glibc and the GCC runtime (present on every Linux host we support), plus libcuda,
# which is the host's driver and is loaded with dlopen, never linked. Everything else travels.
# torch, CUDA runtime libraries and NVRTC never travel: kforge uses the host's own.
set -euo pipefail
stage="$1"; out="$2"
die() { echo "make_bundle: error: $*" >&2; exit 1; }
[[ -d "$stage/bin" ]] || die "$stage/bin missing (did cmake --install run?)"
command -v patchelf >/dev/null || die "missing patchelf (Debian: patchelf; scripts/bootstrap.sh installs it)"

is_system() {
  case "$(basename "$1")" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|\
    libutil.so*|libstdc++.so*|libgcc_s.so*|libcuda.so*|libnvrtc*|libcudart*|libtorch*|libc10*|\
    libgomp.so*) return 0 ;;   # libgomp: torch's own OpenMP runtime, in every process our torch-side libraries load into
  esac
  return 1
}

elves() { find "$stage/bin" "$stage/lib" "$stage/share" -type f -exec sh -c 'head -c4 "$1" | grep -q "ELF" && echo "$1"' _ {} \; ; }

mkdir -p "$stage/lib"
# Copy dependencies until the set is closed (a copied library can need another).
changed=1
while [[ $changed == 1 ]]; do
  changed=0
  while read -r elf; do
    while read -r lib path; do
      [[ -n "$path" && "$path" != "not" ]] || continue
      is_system "$lib" && continue
      [[ "$path" == "$stage"/* ]] && continue
      if [[ ! -e "$stage/lib/$lib" ]]; then
        cp -L "$path" "$stage/lib/$lib"
        chmod 755 "$stage/lib/$lib"
        patchelf --set-rpath '$ORIGIN' "$stage/lib/$lib"
        echo "make_bundle: + $lib (from $path)"
        changed=1
      fi
    done < <(ldd "$elf" 2>/dev/null | awk '/=>/ {print $1, $3}')
  done < <(elves)
done

# Every non-system dependency must now resolve inside the bundle.
bad=0
while read -r elf; do
  while read -r lib path; do
    # torch's libraries are absent outside a torch process (the hook is only ever loaded into one).
    is_system "$lib" && continue
    if [[ "$path" == "not" ]]; then echo "make_bundle: $elf: $lib not found" >&2; bad=1; continue; fi
    if [[ "$(readlink -f "$path")" != "$(readlink -f "$stage")"/* ]]; then
      echo "make_bundle: $elf uses $lib from outside the bundle ($path)" >&2; bad=1
    fi
  done < <(ldd "$elf" 2>/dev/null | awk '/=>/ {print $1, $3}')
done < <(elves)
[[ $bad == 0 ]] || die "bundle is not self-contained"

mkdir -p "$(dirname "$out")"
name="$(basename "$stage")"
tar -C "$(dirname "$stage")" --owner=0 --group=0 --sort=name -czf "$out.tmp" "$name"
mv "$out.tmp" "$out"
echo "make_bundle: wrote $out ($(du -h "$out" | cut -f1))"
