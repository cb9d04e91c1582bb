#!/usr/bin/env bash
# Builds kcached and its compile worker linked statically against Debian's
# archives, stripped, into dist/: what travels to a GPU machine that has only
# glibc, libstdc++, the CUDA driver, NVRTC and nvJitLink. The worker carries
# LLVM 22's NVPTX backend (KCACHE_WITH_LLVM, the default), so LLVM IR raw
# kernels compile there too. Run there with LD_LIBRARY_PATH=/usr/local/cuda/lib64
# for NVRTC and nvJitLink. The worker needs glibc 2.36 or later (LLVM's
# Support calls arc4random); kcached needs 2.35.
#
# dist/kcached (~23 MB) and dist/kcache-compile-worker (~23 MB with LLVM 22) are for local
# use; dist/kcache-dist.tar.xz (~13 MB, both of them) is what to carry to the
# GPU machine (carry dist/kcache-dist.tar.xz alone), and there unpacks in place with:
#   tar -xJf dist/kcache-dist.tar.xz -C dist
# or, where there is no xz:
#   python3 -c "import tarfile; tarfile.open('dist/kcache-dist.tar.xz').extractall('dist')"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
BUILD_DIR=${KCACHE_BUILD_DIR:-build}
cmake --build "$BUILD_DIR" -j "${KCACHE_JOBS:-$(nproc)}" --target kcached-static kcache-compile-worker-static
mkdir -p dist
strip -o dist/kcached "$BUILD_DIR/bin/kcached-static"
strip -o dist/kcache-compile-worker "$BUILD_DIR/bin/kcache-compile-worker-static"
# Only glibc/libstdc++/libgcc may be left dynamic: fail here, not there.
for f in dist/kcached dist/kcache-compile-worker; do
  if extra=$(ldd "$f" | grep -vE '^\s*(linux-vdso|/lib64/ld-linux|lib(c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so)'); then
    echo "build-static: $f needs libraries the GPU machine may lack:" >&2
    echo "$extra" >&2
    exit 1
  fi
done
# Written to a temporary name first, so an interrupted run leaves no
# truncated archive behind.
tar -cf - -C dist kcached kcache-compile-worker | xz -9 >dist/kcache-dist.tar.xz.tmp
mv dist/kcache-dist.tar.xz.tmp dist/kcache-dist.tar.xz
ls -la dist/
