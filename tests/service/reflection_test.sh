#!/usr/bin/env bash
# A gRPC reflection client that kcache did not write (grpc-js-reflection-client
# from the npm registry, run with the machine's Node.js) against a real
# kcached in compile-only mode: lists the services, fetches a descriptor and
# calls through it, and calls grpc.health.v1.Health/Check (reflection/).
#
# usage: reflection_test.sh KCACHED REFLECTION_SRC_DIR WORK_DIR
# The npm packages are pinned by REFLECTION_SRC_DIR/package-lock.json and
# installed with `npm ci` into WORK_DIR (in the build tree) when missing or
# when the lock file changed. Without Node.js, or when the npm registry cannot
# be reached for that install, the test FAILS saying so: a skip would let CI
# go green without ever talking to the daemon through a foreign client.
set -euo pipefail

kcached=$1
src=$2
work=$3

fail() { echo "reflection_test: FAILED: $*" >&2; exit 1; }

command -v node >/dev/null || fail "Node.js (node) is not installed; this test runs a Node.js reflection client"
command -v npm >/dev/null || fail "npm is not installed; it installs the pinned reflection client (npm ci)"
[[ -x $kcached ]] || fail "no kcached at $kcached"

mkdir -p "$work"
cp "$src/package.json" "$src/package-lock.json" "$src/reflection_check.js" "$work/"
if [[ ! -d $work/node_modules ]] || ! cmp -s "$work/package-lock.json" "$work/node_modules/.kcache-installed-lock"; then
  echo "reflection_test: npm ci in $work"
  if ! (cd "$work" && npm ci --prefer-offline --no-audit --no-fund --fetch-retries=1 \
          --fetch-timeout=60000 >npm-ci.log 2>&1); then
    cat "$work/npm-ci.log" >&2 || true
    fail "npm ci could not install the pinned reflection client (see above). This test needs the npm registry (or npm's cache) the first time, to install grpc-js-reflection-client and @grpc/grpc-js into $work/node_modules"
  fi
  cp "$work/package-lock.json" "$work/node_modules/.kcache-installed-lock"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kcache-reflection-XXXXXX")
pid=
cleanup() {
  if [[ -n $pid ]]; then kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

sock=$tmp/kcached.sock
"$kcached" --store_path="$tmp/store" --socket_path="$sock" --compile_only=true \
  --compile_threads=1 2>"$tmp/kcached.log" &
pid=$!
for _ in $(seq 1 600); do
  [[ -S $sock ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/kcached.log" >&2; fail "kcached exited at start"; }
  sleep 0.1
done
[[ -S $sock ]] || { cat "$tmp/kcached.log" >&2; fail "kcached did not create $sock within 60 s"; }

if ! timeout 120 node "$work/reflection_check.js" "unix://$sock"; then
  cat "$tmp/kcached.log" >&2
  fail "the reflection client's checks failed (see above)"
fi

kill -TERM "$pid"
wait "$pid" || fail "kcached did not stop cleanly on SIGTERM"
pid=
echo "reflection_test: passed"
