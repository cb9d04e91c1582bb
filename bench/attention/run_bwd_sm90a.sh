#!/bin/bash
# One device call for the sm_90a wgmma backward (kernels/attention_bwd.cuh, kWg):
# correctness on every backward variant built for sm_90a, the dK/dV kernel beside the
# portable path of the same build, then bench_attention.py --backward (flex, SDPA FA2,
# cuDNN in the same run). Logs under $OUT. Run from anywhere in the tree.
set -u
OUT=${OUT:-/tmp/kc_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$OUT/smi.txt" 2>&1
t0=$(date +%s)
timeout "${T_TEST:-200}" python3 tests/kernels/test_attention_bwd.py --sm90a \
  --cases "${CASES:-120}" --jobs 16 ${SELECT:+--select "$SELECT"} --log "$OUT/bwd_sm90a.log" \
  > "$OUT/test.txt" 2>&1
trc=$?
echo "== correctness rc=$trc ($(( $(date +%s) - t0 ))s)"
grep -E "^FAIL|compiled|cases took|passed" "$OUT/test.txt" | tail -25
t0=$(date +%s)
SM90A=1 FLEX=0 VARIANTS="${VARIANTS:-wg:;fa2:KC_BWD_WGMMA=0}" timeout "${T_VAR:-100}" \
  python3 bench/attention/bwd_variants.py ${VCASES:-causal none d64 drafter_random drafter_sorted} \
  > "$OUT/bwd_variants.txt" 2>&1
echo "== bwd_variants rc=$? ($(( $(date +%s) - t0 ))s)"
grep variant "$OUT/bwd_variants.txt" | sed 's/"ptxas"[^,]*,//'
if [ "$trc" = 0 ] || [ "${BENCH_ANYWAY:-0}" = 1 ]; then
  t0=$(date +%s)
  timeout "${T_BENCH:-200}" python3 bench/attention/bench_attention.py --backward --jobs 16 \
    ${BENCH_ONLY:+--only "$BENCH_ONLY"} --json "$OUT/bench_bwd.json" > "$OUT/bench.txt" 2>&1
  echo "== bench rc=$? ($(( $(date +%s) - t0 ))s)"
  tail -22 "$OUT/bench.txt" | cut -c1-400
fi
