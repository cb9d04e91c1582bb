#!/usr/bin/env bash
# Sets up, builds and runs the kcache daemon on the embedded default: the
# store in .kcache/store and the socket .kcache/kcached.sock under the
# working tree, Prometheus metrics on 127.0.0.1:9464. Extra arguments are
# passed to kcached (see `kcached --help`). Stop it with Ctrl-C (SIGINT) or
# SIGTERM: it shuts down gracefully.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
mkdir -p .kcache
exec "${KCACHE_BUILD_DIR:-build}/bin/kcached" --metrics_address=127.0.0.1:9464 "$@"
