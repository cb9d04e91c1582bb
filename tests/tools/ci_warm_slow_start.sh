#!/usr/bin/env bash
# docker/ci-warm.sh against a kcached that takes 3 s to create its socket, as
# on a loaded CI machine (the CI run of 1357e2b failed there: the script gave
# up after 0.4 s because a missing socket fails each readiness check at once).
#
#   tests/tools/ci_warm_slow_start.sh BIN_DIR MANIFEST BUNDLE
set -euo pipefail
bin=$1
manifest=$2
bundle=$3
here=$(cd "$(dirname "$0")" && pwd)
slow=$(mktemp -d)
trap 'rm -rf "$slow"' EXIT
printf '#!/bin/sh\nsleep 3\nexec "%s/kcached" "$@"\n' "$bin" >"$slow/kcached"
chmod +x "$slow/kcached"
ln -s "$bin/kcache" "$slow/kcache"
KCACHE_BIN=$slow bash "$here/../../docker/ci-warm.sh" "$manifest" "$bundle"
