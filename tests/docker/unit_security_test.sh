#!/usr/bin/env bash
# The shipped systemd unit stays least-privilege and still works on a GPU
# node: `systemd-analyze security --offline=yes` rates it at or below 3.0,
# its closed device policy still allows the NVIDIA nodes the CUDA driver
# opens, and `systemd-analyze verify` finds nothing wrong (with ExecStart
# pointed at the kcached built here, since verify checks that it exists).
#
# usage: unit_security_test.sh UNIT KCACHED
set -euo pipefail
unit=$1 kcached=$2
limit=3.0
command -v systemd-analyze >/dev/null || { echo "FAILED: systemd-analyze not installed (systemd)"; exit 1; }

report=$(systemd-analyze security --offline=yes "$unit" 2>&1) || true
score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' <<<"$report")
if [[ -z $score ]]; then
  echo "$report"
  echo "FAILED: no exposure level in systemd-analyze's report"
  exit 1
fi
echo "unit_security_test: exposure $score (limit $limit)"
if awk -v s="$score" -v l="$limit" 'BEGIN{exit !(s > l)}'; then
  grep '✗' <<<"$report"
  echo "FAILED: $unit is rated $score, above $limit"
  exit 1
fi

grep -qx 'DevicePolicy=closed' "$unit" || { echo "FAILED: no DevicePolicy=closed in $unit"; exit 1; }
for dev in 'char-nvidia-frontend rw' '/dev/nvidiactl rw' '/dev/nvidia-uvm rw' 'char-nvidia-uvm rw'; do
  grep -qx "DeviceAllow=$dev" "$unit" || { echo "FAILED: $unit does not allow $dev"; exit 1; }
done
if grep -qE '^(PrivateDevices=yes|PrivateNetwork=yes)' "$unit"; then
  echo "FAILED: $unit hides the GPU devices or the network the daemon needs"
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|/usr/local/bin/kcached|$(readlink -f "$kcached")|" "$unit" >"$tmp/kcached.service"
if ! out=$(systemd-analyze verify "$tmp/kcached.service" 2>&1) || [[ -n $out ]]; then
  echo "$out"
  echo "FAILED: systemd-analyze verify is not clean"
  exit 1
fi
echo "unit_security_test: passed"
