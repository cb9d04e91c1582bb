#!/usr/bin/env bash
# Issue 27's device calls (H200, or an H100 lent for it), each within one call's 10 minutes.
# Prepare here with scripts/devcarry.sh and carry .devcarry/pack .devcarry/bin .devcarry/pygen:
#   bench/attention/run_issue27.sh suites   every GPU suite (scripts/gpu-suite.sh; ~250 s),
#                                           the kernel suites first
#   bench/attention/run_issue27.sh bench    bench_attention.py, every case, forward then
#                                           forward + backward, beside flex (eager mask),
#                                           SDPA FA2 and cuDNN (~130 s); then the drafter
#                                           layer against a kcached started here (~250 s)
#   bench/attention/run_issue27.sh layer    the layer alone
#   bench/attention/run_issue27.sh ncu      Nsight Compute, --set full, one launch each of the
#                                           causal D128 dK/dV (NCU_CASE: another case of
#                                           profile_fwd.py; cuDNN only beside the dense ones)
#                                           and of cuDNN's bprop (NCU_PASS=fwd:
#                                           the forwards instead; both: all four): the details,
#                                           the raw metrics and the SASS with its stall samples
#                                           (~120 s a pass)
#   AB_DEFINES=KC_X=1 bench/attention/run_issue27.sh ab
#                                           a forward measurement switch against the default:
#                                           both timed in interleaved rounds on the drafter
#                                           cases, then the forward suite's drafter variants
#                                           with it on (AB_SELECT: another regex) (~150 s);
#                                           AB_VARIANTS instead (or beside) sets bwd_variants.py's
#                                           VARIANTS, e.g. "base:;t64:TILES=128x64x8x2"
#                                           (AB_CASES: the cases). AB_BWD=1: a backward switch:
#                                           every backward suite variant built for sm_90a with it
#                                           (AB_SELECT_BWD), forward + backward timed
# Several parts run in the order given (run_issue27.sh suites ab). What comes back:
# $OUT/<part>.txt (the output) and $OUT/<part>-logs.tar.gz (logs and JSON), packed again as
# each step ends, so that a call cut at its limit still returns what ran (a device call
# returns at most 8 files). SEED for the suites and ab (default: the date).
set -u
cd "$(dirname "$0")/../.." || exit 1
if (($# == 0)); then
  echo "usage: run_issue27.sh PART... (suites, bench, layer, ab, ncu)" >&2
  exit 2
fi
for part in "$@"; do
  case $part in
    suites | bench | layer | ab | ncu) ;;
    *) echo "unknown part: $part (suites, bench, layer, ab or ncu)" >&2; exit 2 ;;
  esac
done
case ${NCU_PASS:-bwd} in  # checked here, before a device call spends time on other parts
  fwd | bwd | both) ;;
  *) echo "unknown NCU_PASS: $NCU_PASS (fwd, bwd or both)" >&2; exit 2 ;;
esac
R=${OUT:-/tmp/kcache-issue27}
mkdir -p "$R"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
export SEED=${SEED:-$(date +%s)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu \
  --format=csv,noheader | tee "$R/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$R/gpu.txt"
scripts/devcarry.sh --unpack || exit 1
work=""
part=""
save() { tar -czf "$R/$part-logs.tar.gz" -C "$work" . 2>/dev/null; }

suites() {
  # Two runs of gpu-suite.sh, so that the kernel suites (what a kernel change risks) come
  # first whatever the limit leaves of the rest.
  OUT=$work SUITES='kernel_correctness|kernel_backward' bash scripts/gpu-suite.sh
  save
  OUT=$work SUITES='^(cuda_driver_gpu_test|client_gpu_test|python_gpu_e2e|python_flex_gpu|python_raw_gpu|triton_raw|python_gpu_triton)$' \
    bash scripts/gpu-suite.sh
  save
}

bench() {
  local t0=$SECONDS
  timeout 200 python3 bench/attention/bench_attention.py --flex-mask eager --jobs 16 --rounds 3 \
    --json "$work/bench-fwd.json"
  echo "== bench_attention forward: rc $? ($((SECONDS - t0)) s)"
  save
  t0=$SECONDS
  timeout 260 python3 bench/attention/bench_attention.py --backward --flex-mask eager --jobs 16 \
    --rounds 3 --json "$work/bench-bwd.json"
  echo "== bench_attention forward + backward: rc $? ($((SECONDS - t0)) s)"
  save
}

layer() {
  local t0=$SECONDS
  dist/kcached --store_path="$work/store" --socket_path="$work/k.sock" 2>"$work/kcached.log" &
  local pid=$!
  for _ in $(seq 100); do [[ -S $work/k.sock ]] && break; sleep 0.1; done
  KCACHE_TARGET=unix:$work/k.sock PYTHONPATH=$PWD/client/python timeout 300 \
    python3 bench/attention/bench_drafter_layer.py \
    --only kcache,flex_eager_mask,flex_compiled_mask,no_attention
  echo "== drafter layer: rc $? ($((SECONDS - t0)) s)"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  rm -rf "$work/store"
  save
}

ab() {
  local defs=${AB_DEFINES:-} t0=$SECONDS
  if [[ -z $defs && -z ${AB_VARIANTS:-} ]]; then
    echo "ab needs AB_DEFINES (e.g. KC_X=1,KC_Y=2) or AB_VARIANTS"
    return 2
  fi
  local bwd=${AB_BWD:-0} sel=${AB_SELECT:-drafter} sel_bwd=${AB_SELECT_BWD:-.}
  # The timing first: it is what the call is for, and a call cut at its limit keeps it.
  # AB_BWD=1: forward + backward timed (SDPA cuDNN beside the dense cases), else the forward.
  # shellcheck disable=SC2086  # AB_CASES: several case names
  VARIANTS=${AB_VARIANTS:-"base:;ab:$defs"} ROUNDS=7 REPS=25 SM90A=1 BWD=$bwd FLEX=0 SDPA=$bwd \
    timeout 240 python3 bench/attention/bwd_variants.py ${AB_CASES:-drafter_sorted drafter_random}
  echo "== ab: timing rc $? ($((SECONDS - t0)) s)"
  save
  [[ -n $defs ]] || return 0
  t0=$SECONDS
  echo "== ab: $defs"
  KC_EXTRA_DEFINES=$defs timeout 150 python3 tests/kernels/test_attention_fwd.py \
    --select "$sel" --cases 150 --seed "$SEED" --log "$work/ab-fwd-cases.log" |
    tail -n 6
  echo "== ab: forward variants /$sel/ with $defs: rc ${PIPESTATUS[0]} ($((SECONDS - t0)) s)"
  save
  if ((bwd)); then
    t0=$SECONDS
    KC_EXTRA_DEFINES=$defs timeout 150 python3 tests/kernels/test_attention_bwd.py \
      --sm90a --select "$sel_bwd" --cases 150 --seed "$SEED" \
      --log "$work/ab-bwd-cases.log" | tail -n 4
    echo "== ab: backward variants (sm_90a) /$sel_bwd/ with $defs: rc ${PIPESTATUS[0]} ($((SECONDS - t0)) s)"
    save
  fi
}

ncu_one() {  # NAME KERNEL_REGEX SKIP COMMAND...: profile one launch, then three views of it
  local name=$1 regex=$2 skip=$3 t0=$SECONDS
  shift 3
  timeout 240 ncu --clock-control none --set full --import-source no -k "regex:$regex" \
    --launch-skip "$skip" --launch-count 1 -f -o "$work/$name" "$@" >"$work/$name-run.txt" 2>&1
  echo "== ncu $name: rc $? ($((SECONDS - t0)) s)"
  tail -n 3 "$work/$name-run.txt"
  [[ -f $work/$name.ncu-rep ]] || return 1
  ncu -i "$work/$name.ncu-rep" --page details >"$work/$name-details.txt" 2>&1
  ncu -i "$work/$name.ncu-rep" --page raw --csv >"$work/$name-raw.csv" 2>&1
  ncu -i "$work/$name.ncu-rep" --page source --csv --print-source sass >"$work/$name-sass.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Executed Instructions  |Registers Per|Issue Slots Busy" \
    "$work/$name-details.txt"
  python3 bench/attention/ncu_sass.py "$work/$name-sass.csv" --top 30 >"$work/$name-stalls.txt" 2>&1
  sed -n '/^reasons/,/^top/p' "$work/$name-stalls.txt" | head -n 45
  rm -f "$work/$name.ncu-rep"  # the three views are what comes back
}

ncu_part() {  # NCU_PASS: fwd, bwd or both (default bwd; checked above)
  local case=${NCU_CASE:-causal_d128} pass=${NCU_PASS:-bwd} cudnn=1
  # cuDNN beside the dense cases only (kernel_times.py's); the drafter and expression cases
  # of profile_fwd.py have no cuDNN counterpart.
  case $case in drafter_* | *_expr) cudnn=0 ;; esac
  if [[ $pass != bwd ]]; then
    ncu_one fwd kcache_attn_fwd 2 python3 bench/attention/profile_fwd.py "$case"
    save
    if ((cudnn)); then
      ncu_one cudnn-fwd flash_fprop 3 python3 bench/attention/kernel_times.py "$case" --reps 1
      save
    fi
  fi
  if [[ $pass != fwd ]]; then
    ncu_one dkdv kcache_attn_bwd_dkdv 2 python3 bench/attention/profile_fwd.py --backward "$case"
    save
    if ((cudnn)); then
      ncu_one cudnn flash_bprop 3 python3 bench/attention/kernel_times.py "$case" --reps 1
      save
    fi
  fi
}

for part in "$@"; do
  work=/tmp/kcache-issue27-$part
  # Emptied first: a machine kept warm (or reused) holds an earlier call's files, which
  # save would otherwise pack beside this call's.
  rm -rf "$work" && mkdir -p "$work"
  case $part in
    suites) suites ;;
    bench) bench; layer ;;
    layer) layer ;;
    ab) ab ;;
    ncu) ncu_part ;;
  esac 2>&1 | tee -a "$R/$part.txt"
done
