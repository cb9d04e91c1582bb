#!/usr/bin/env bash
# Builds kcached and its compile worker linked statically against Debian's
# archives, stripped, into dist/ (about 20 MB together): what travels to a GPU
# machine that has only glibc, libstdc++, the CUDA driver and NVRTC. Run
# there with LD_LIBRARY_PATH=/usr/local/cuda/lib64 for NVRTC.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
BUILD_DIR=${KCACHE_BUILD_DIR:-build}
cmake --build "$BUILD_DIR" -j "${KCACHE_JOBS:-$(nproc)}" --target kcached-static kcache-compile-worker-static
mkdir -p dist
strip -o dist/kcached "$BUILD_DIR/bin/kcached-static"
strip -o dist/kcache-compile-worker "$BUILD_DIR/bin/kcache-compile-worker-static"
ls -la dist/
