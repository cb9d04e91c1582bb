#!/usr/bin/env bash
# Sets up, builds and runs kcache's main program on the embedded default
# store under .kcache/ in the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
mkdir -p .kcache
BUILD_DIR=${KCACHE_BUILD_DIR:-build}
if [[ -x "$BUILD_DIR/service/kcached" ]]; then
  exec "$BUILD_DIR/service/kcached" --store=.kcache/store --socket=.kcache/kcached.sock "$@"
fi
exec "$BUILD_DIR/cache/kcache-store" --store=.kcache/store stats "$@"
