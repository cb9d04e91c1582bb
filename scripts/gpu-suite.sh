#!/usr/bin/env bash
# Every GPU test in one go, for a machine with an NVIDIA GPU but none of
# kcache's build dependencies (the lent H200). Needs what this machine built:
#   dist/kcached, dist/kcache-compile-worker   (scripts/build-static.sh)
#   .devcarry/bin/{cuda_driver_gpu_test,client_gpu_test}   (static test binaries)
#   .devcarry/pygen/kcache/v1/*.py             (ninja kcache_python_proto)
#   .devcarry/cubins/                          (optional: kernel harness cache)
# Prints one line per suite at the end; exit status 1 if any failed.
set -u
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
LOGS=${OUT:-/tmp/kcache-gpu-suite}
mkdir -p "$LOGS"
SEED=${SEED:-$(date +%s)}
CASES=${CASES:-300}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'

results=()
failed=0
suite() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  echo "=== $name: $*"
  if timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1; then
    results+=("PASS  $name ($((SECONDS - start)) s)")
  else
    results+=("FAIL  $name (exit $?, $((SECONDS - start)) s)")
    failed=1
  fi
  tail -n 12 "$LOGS/$name.log"
}

suite cuda_driver_gpu_test 120 .devcarry/bin/cuda_driver_gpu_test
suite client_gpu_test 180 env KCACHE_TEST_KCACHED="$PWD/dist/kcached" .devcarry/bin/client_gpu_test
suite python_gpu_e2e 240 python3 tests/python/gpu_e2e.py --kcached dist/kcached \
  --pythonpath-gen .devcarry/pygen
# KERNEL_SELECT: a regex on variant names (e.g. sm90a) to check a subset.
suite kernel_correctness 300 python3 tests/kernels/test_attention_fwd.py --cases "$CASES" \
  --seed "$SEED" --log "$LOGS/kernel_cases.log" ${KERNEL_SELECT:+--select "$KERNEL_SELECT"}
if [[ -n ${BENCH:-} ]]; then
  suite attention_bench 300 python3 bench/attention/bench_attention.py --json "$LOGS/bench.json"
fi

echo
echo "GPU suites (seed $SEED):"
printf '  %s\n' "${results[@]}"
exit $failed
