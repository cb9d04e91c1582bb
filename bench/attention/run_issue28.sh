#!/usr/bin/env bash
# One device call for issue 28 (H200): correctness of the expression-mask variants,
# the numeric check on the suites' selected variants, then the expression-mask
# benchmark beside flex and the built-in drafter (last: flex's first compiles take
# minutes on a fresh machine; kcache's times print before flex starts). Logs under $OUT.
# Cubins compiled on the CPU machines travel in .devcarry/cubins.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out28}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
SEL=${SEL:-'expr|^gen_|^bf16_d128_causal$|^bf16_d128_drafter16_causal$|^bf16_d128_drafter7_w50$|^fp16_d64_doc_causal$|^bf16_d128_causal_softcap$|^fp16_d64_none_alibi$|^bf16_d128_win100_20_br$'}
t0=$(date +%s)
timeout 35 python3 tests/kernels/test_attention_fwd.py --select expr --cases 48 --log "$OUT/fwd.log" 2>&1 | tail -4; echo "fwd rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 35 python3 tests/kernels/test_attention_bwd.py --select expr --cases 24 --log "$OUT/bwd.log" 2>&1 | tail -4; echo "bwd rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
[ -x bin/numeric_check_gpu_test ] && KC_REPO=$PWD KC_CHECK_CUBINS=.devcarry/check timeout 30 bin/numeric_check_gpu_test 2>&1 | tee "$OUT/numeric_gpu.log" | grep -E "rel L2|fault|PASSED|FAILED|OK \]|Failure" ; echo "numeric_gpu rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout 40 python3 tests/kernels/test_numeric_check.py --select "$SEL" --cases 2 --log "$OUT/numeric.log" 2>&1 | tail -8; echo "numeric rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
timeout ${BENCH_TIMEOUT:-400} python3 bench/attention/bench_attention.py --expr --only drafter_expr,neighbourhood_expr,head_window_expr --json "$OUT/expr.json" 2>&1 | tee "$OUT/bench.log" | grep -v '^{' ; echo "bench rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s"
