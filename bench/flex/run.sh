#!/usr/bin/env bash
# Issue 15's GPU measurements, against one kcached started here on an empty
# store (the GPU machine's static build: dist/kcached):
#   - a new process's first attention result against a warm daemon, beside
#     torch's own first-call floor in the same process (run twice: the first
#     run warms the daemon's store, the second is the measurement);
#   - the drafter written as a SpecForge-style mask_mod against the built-in
#     kcache.drafter, training shape (B2, 32/8 heads, D128, context 3072 +
#     512 blocks of 16), forward + backward;
#   - the toy drafter layer trained with kcache and with flex_attention;
#   - the per-step mask cost against torch's create_block_mask (last: torch's
#     compiled builder can take minutes to compile).
# usage: bench/flex/run.sh KCACHED
set -euo pipefail
cd "$(dirname "$0")/../.."
kcached=$1
tmp=$(mktemp -d)
"$kcached" --store_path="$tmp/store" --socket_path="$tmp/k.sock" 2>"$tmp/kcached.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do [[ -S $tmp/k.sock ]] && break; sleep 0.1; done
export KCACHE_TARGET=unix:$tmp/k.sock PYTHONPATH=$PWD/client/python
ex=client/python/examples
echo "--- first call (warming run)"; python3 $ex/flex_bench.py first
echo "--- first call (measured: new process, warm daemon)"; python3 $ex/flex_bench.py first
echo "--- first call (new process, warm daemon, KCACHE_WARM_IMPORTS=0: the call imports grpc)"
KCACHE_WARM_IMPORTS=0 python3 $ex/flex_bench.py first
echo "--- first call (a new process, profiled: where the time goes)"
python3 $ex/flex_bench.py first --profile
echo "--- drafter mask_mod vs built-in, training shape"
python3 $ex/flex_bench.py drafter --batch 2 --context 3072 --blocks 512 --block-size 16 --iters 20
echo "--- toy drafter training"
python3 $ex/train_drafter_toy.py
echo "--- per-step mask cost"
python3 $ex/mask_record_bench.py --context 3072 --blocks 512
