#!/usr/bin/env bash
# Sets up, builds and runs every test under CTest. GPU tests (label "gpu")
# skip themselves where no GPU is found. CTest's summary closes the output.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
BUILD_DIR=${KCACHE_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "${KCACHE_JOBS:-$(nproc)}" "$@"
