#!/usr/bin/env bash
# The runtime image installs every shared library the shipped programs need.
# The image cannot be built on these machines (no Docker engine), so this maps
# each library that `ldd` lists for kcached, kcache-compile-worker and kcache
# (built here, on the same Debian release as the image's builder stage) to
# its Debian package with `dpkg -S`, and checks that the Dockerfile's runtime
# stage installs that package. Allowed without: what debian:bookworm-slim
# itself carries (libc6, libgcc-s1, libstdc++6) and NVRTC, which the image
# copies from the CUDA image.
#
# usage: runtime_libs_test.sh DOCKERFILE BINARY...
set -euo pipefail
dockerfile=$1
shift
# The runtime stage's apt-get install list: from the last FROM to its end.
runtime_pkgs=$(awk '/^FROM /{stage=$0; buf=""} {buf=buf"\n"$0} END{print buf}' "$dockerfile" |
  sed -n '/apt-get install/,/rm -rf/p' | tr ' \\' '\n\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' |
  grep -vE '^(apt-get|install|rm|update|DEBIAN_FRONTEND.*|ca-certificates)$' | sort -u)
base_pkgs="libc6 libgcc-s1 libstdc++6"
missing=0
for bin in "$@"; do
  [[ -x $bin ]] || { echo "runtime_libs_test: no program at $bin" >&2; exit 1; }
  while read -r lib path; do
    case $lib in libnvrtc*|libcuda.so*|linux-vdso*|ld-linux*) continue ;; esac
    [[ $path == /* ]] || { echo "FAILED: $bin: $lib is not found here ($path)"; missing=1; continue; }
    real=$(readlink -f "$path")
    pkg=$(dpkg -S "$real" 2>/dev/null | head -1 | cut -d: -f1) ||
      pkg=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1) || true
    if [[ -z $pkg ]]; then
      echo "FAILED: $bin: $lib ($real) belongs to no Debian package"
      missing=1
    elif ! grep -qx "$pkg" <<<"$runtime_pkgs" && [[ " $base_pkgs " != *" $pkg "* ]]; then
      echo "FAILED: $bin needs $lib from package $pkg, which the runtime stage of $dockerfile does not install"
      missing=1
    fi
  done < <(ldd "$bin" | awk '/=>/{print $1, $3} !/=>/{print $1, $1}')
done
if ((missing)); then
  echo "runtime_libs_test: add the packages above to the runtime stage's apt-get install" >&2
  exit 1
fi
echo "runtime_libs_test: every library of $(basename -a "$@" | tr '\n' ' ')maps to an installed package"
