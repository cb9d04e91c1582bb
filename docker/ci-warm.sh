#!/usr/bin/env bash
# CI pre-population on a machine with no GPU: starts a compile-only kcached
# on a scratch store, compiles every spec x arch of MANIFEST with
# `kcache warm`, exports the result to BUNDLE, stops the daemon.
#
#   docker/ci-warm.sh MANIFEST BUNDLE
#
# KCACHE_BIN: directory of kcached and kcache (default: found on PATH).
# Exit status: kcache's (0 ok, 1 a spec failed, 2 bad manifest, 3 no daemon).
# Tested by CTest (tools_ci_warm_script); docs/ops.md explains the steps.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 MANIFEST BUNDLE" >&2
  exit 2
fi
manifest=$1
bundle=$2
bin=${KCACHE_BIN:+$KCACHE_BIN/}
work=$(mktemp -d)
daemon=
cleanup() {
  if [[ -n $daemon ]]; then
    kill -TERM "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"${bin}kcached" --compile_only=true --store_path="$work/store" \
  --socket_path="$work/kcached.sock" 2>"$work/kcached.log" &
daemon=$!
kcache=("${bin}kcache" --socket "$work/kcached.sock")
# Wait for the daemon to answer, up to ~60 s. An attempt fails at once while
# the socket does not exist yet (a loaded CI machine can take seconds to open
# the store), so the loop sleeps between attempts rather than relying on the
# client's own 3 s connect wait.
no_daemon() {
  echo "$0: kcached $1; its log:" >&2
  cat "$work/kcached.log" >&2
  exit 3
}
deadline=$((SECONDS + 60))
until "${kcache[@]}" status >/dev/null 2>&1; do
  kill -0 "$daemon" 2>/dev/null || no_daemon "exited before answering"
  ((SECONDS < deadline)) || no_daemon "did not answer on $work/kcached.sock within 60 s"
  sleep 0.5
done
"${kcache[@]}" warm "$manifest"
"${kcache[@]}" export --out "$bundle"
