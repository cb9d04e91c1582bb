#!/usr/bin/env bash
# Every GPU test in one go, for a machine with an NVIDIA GPU but none of
# kcache's build dependencies (the lent H200). Needs what this machine built:
#   dist/kcached, dist/kcache-compile-worker   (scripts/build-static.sh; unpacked here
#                                              from .devcarry/pack/kcache-dist.tar.xz
#                                              when dist/ lacks them)
#   .devcarry/bin/{cuda_driver_gpu_test,client_gpu_test}   (static test binaries)
#   .devcarry/pygen/kcache/v1/*.py             (ninja kcache_python_proto)
#   .devcarry/cubins/                          (optional: kernel harness cache; unpacked
#                                              here from .devcarry/pack/cubins.tar.xz)
# scripts/devcarry.sh makes all of these.
# Prints one line per suite as it ends and all of them at the end, each with its log's
# count line (n passed / failed); also when stopped from outside (TERM: the running suite is
# marked CUT). Exit status 1 if any failed.
# Environment: SEED, CASES (forward kernel cases, 300), CASES_BWD (backward kernel
# cases, 200), KERNEL_SELECT (regex on kernel variant names, both kernel suites),
# BENCH=1 (also the forward and the forward+backward benchmarks), SUITES (regex on
# suite names: run only those, e.g. SUITES='kernel_backward|attention_bench_backward').
set -u
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
scripts/devcarry.sh --unpack || exit 1
LOGS=${OUT:-/tmp/kcache-gpu-suite}
mkdir -p "$LOGS"
SEED=${SEED:-$(date +%s)}
CASES=${CASES:-300}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'

results=()
failed=0
current=""
child=0
# The log's last line that counts tests (passed / failed / failures), else its last line:
# each result line says what ran, so that a tail of the output is enough to count from.
counted() {
  local line
  line=$(grep -E -i 'passed|failed|failure' "$1" | tail -n 1)
  [[ -n $line ]] || line=$(tail -n 1 "$1")
  printf '%s' "${line:0:120}"
}
summary() {
  echo
  echo "GPU suites (seed $SEED, $SECONDS s in all):"
  printf '  %s\n' "${results[@]}"
}
# Stopped from outside (a device call's time limit): the running suite is stopped too and
# the summary still printed, the suite cut marked as such (not counted as passed).
# shellcheck disable=SC2317  # reached through the trap
stopped() {
  if ((child > 0)); then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; fi
  [[ -n $current ]] && results+=("CUT   $current (stopped from outside)")
  summary
  exit 143
}
trap stopped TERM INT
suite() {
  local name=$1 limit=$2
  shift 2
  if [[ -n ${SUITES:-} && ! $name =~ $SUITES ]]; then
    return 0
  fi
  local start=$SECONDS status=0
  echo "=== $name: $*"
  current=$name
  # In the background so that a TERM reaches the trap at once (bash runs a trap only after
  # the foreground command it waits for).
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1 &
  child=$!
  wait "$child" || status=$?
  child=0
  current=""
  tail -n 12 "$LOGS/$name.log"
  if ((status == 0)); then
    results+=("PASS  $name ($((SECONDS - start)) s): $(counted "$LOGS/$name.log")")
  else
    results+=("FAIL  $name (exit $status, $((SECONDS - start)) s): $(counted "$LOGS/$name.log")")
    failed=1
  fi
  echo "${results[-1]}"
}

suite cuda_driver_gpu_test 120 .devcarry/bin/cuda_driver_gpu_test
suite client_gpu_test 180 env KCACHE_TEST_KCACHED="$PWD/dist/kcached" .devcarry/bin/client_gpu_test
suite python_gpu_e2e 240 python3 tests/python/gpu_e2e.py --kcached dist/kcached \
  --pythonpath-gen .devcarry/pygen
# KERNEL_SELECT: a regex on variant names (e.g. sm90a) to check a subset.
suite kernel_correctness 300 python3 tests/kernels/test_attention_fwd.py --cases "$CASES" \
  --seed "$SEED" --log "$LOGS/kernel_cases.log" ${KERNEL_SELECT:+--select "$KERNEL_SELECT"}
# The backward: forward then the backward sequence against float64 autograd, every mask,
# score modification, deterministic on/off (compiles its variants in parallel first).
suite kernel_backward 420 python3 tests/kernels/test_attention_bwd.py --cases "${CASES_BWD:-200}" \
  --seed "$SEED" --log "$LOGS/kernel_bwd_cases.log" ${KERNEL_SELECT:+--select "$KERNEL_SELECT"}
# Raw kernels (fixtures, PTX and LLVM IR) fetched and launched through the Python client
# (CTest python_raw_gpu_test).
suite python_raw_gpu 240 env PYTHONPATH="$PWD/client/python:$PWD/.devcarry/pygen" \
  KCACHE_TEST_KCACHED="$PWD/dist/kcached" python3 -m pytest -q -rs -p no:cacheprovider \
  tests/python/gpu_raw.py
# Issue #8: a Triton kernel's PTX and LLVM IR through the raw front door, against Triton's
# own binary.
suite triton_raw 180 python3 tests/python/triton_raw_gpu.py --kcached dist/kcached \
  --pythonpath-gen .devcarry/pygen --out "$LOGS/triton"
# Issue #15: kcache.flex_attention against torch's flex_attention, torch.compile, CUDA
# graphs, three first callers (CTest python_flex_gpu_test).
suite python_flex_gpu 420 env PYTHONPATH="$PWD/client/python" \
  KCACHE_TEST_KCACHED="$PWD/dist/kcached" python3 -m pytest -q -rs -p no:cacheprovider \
  tests/python/gpu_flex.py
# Issue #22: Triton 3.6 kernels (elementwise, a 96 KiB tl.dot, a cluster kernel) through
# from_triton and raw_kernel, bit-identical to Triton's own launch.
suite python_gpu_triton 240 python3 tests/python/gpu_triton.py --kcached dist/kcached \
  --pythonpath-gen .devcarry/pygen
# Issue #15's measurements (first call, drafter mask_mod vs built-in, mask cost).
if [[ -n ${BENCH:-} || -n ${FLEX_BENCH:-} ]]; then
  suite flex_bench 300 bench/flex/run.sh "$PWD/dist/kcached"
fi
if [[ -n ${BENCH:-} ]]; then
  suite attention_bench 300 python3 bench/attention/bench_attention.py --json "$LOGS/bench.json"
  suite attention_bench_backward 540 python3 bench/attention/bench_attention.py --backward \
    --json "$LOGS/bench_bwd.json"
fi

summary
exit $failed
