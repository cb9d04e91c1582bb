#!/usr/bin/env bash
# Sets up, builds and runs every test under CTest. GPU tests (label "gpu")
# skip themselves where no GPU is found. Python tests run under Debian's
# packages and under the PyPI environment (scripts/python-env.sh); the log
# ends with which ran under which, counted, after CTest's own summary.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KCACHE_BUILD_DIR:-build}
scripts/setup.sh
start=$SECONDS
scripts/python-env.sh "$BUILD_DIR/pyenv" >/dev/null
echo "test: Python environment ready in $((SECONDS - start)) s"
scripts/build.sh
rm -rf "$BUILD_DIR/pytest-results"
rc=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "${KCACHE_JOBS:-$(nproc)}" "$@") || rc=$?
"$BUILD_DIR/pyenv/bin/python" scripts/pytest_summary.py "$BUILD_DIR/pytest-results" || rc=1
exit "$rc"
