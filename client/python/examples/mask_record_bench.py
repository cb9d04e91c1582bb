#!/usr/bin/env python3
"""Per-step mask cost: kcache.create_block_mask (recording mask_mod on symbolic values)
against torch's create_block_mask (eager, and compiled where a GPU is present) for the
DFlash drafter mask with new anchors each step. CPU-only runs measure kcache's recording
and torch's CPU create_block_mask.

  python3 client/python/examples/mask_record_bench.py [--context 4096 --blocks 64]
"""

import argparse
import statistics
import time

import torch
from torch.nn.attention import flex_attention as tfa

import kcache


def dflash_mask_mod(anchors, keep, S, block_size):
    def mask_mod(b, h, q_idx, kv_idx):
        j = q_idx // block_size
        context = (kv_idx < S) & (kv_idx < anchors[b, j])
        own_block = (kv_idx >= S) & (j == (kv_idx - S) // block_size)
        return (context | own_block) & keep[b, j]
    return mask_mod


def bench(fn, n, sync):
    times = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    B, S, N, bs = args.batch, args.context, args.blocks, args.block_size
    L, KV = N * bs, S + N * bs

    def make(create, **kw):
        def step():
            anchors = torch.randint(0, S, (B, N), device=dev)
            keep = torch.ones(B, N, dtype=torch.bool, device=dev)
            return create(dflash_mask_mod(anchors, keep, S, bs), B, None, L, KV, device=dev,
                          **kw)
        return step

    print("drafter mask, B=%d Q_LEN=%d KV_LEN=%d on %s (median of %d)" % (B, L, KV, dev,
                                                                           args.iters))
    print("  kcache.create_block_mask        %10.1f us  (-> %s)" % (
        bench(make(kcache.create_block_mask), args.iters, sync),
        make(kcache.create_block_mask)().builtin))
    print("  torch create_block_mask         %10.1f us" % bench(make(tfa.create_block_mask),
                                                                 max(3, args.iters // 10), sync))
    if dev == "cuda":
        f = make(tfa.create_block_mask, _compile=True)
        f()
        print("  torch create_block_mask compiled %9.1f us" % bench(f, args.iters, sync))


if __name__ == "__main__":
    main()
