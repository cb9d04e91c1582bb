"""A schedule model of the wgmma dK/dV kernel's launch order under GQA, on the CPU.

  python3 bench/attention/bwd_launch_model.py [--sms 132] [--window 6] [--batch 2]
      [--kv-heads 8] [--group 4] [--mask drafter|causal|none] [--seq 4096]

By default the drafter training shape of bench_attention.py (B2, 32 / 8 heads, 512 blocks of
16 after a context of 3 072, sorted uniform anchors); --mask causal or none models a
self-attention of --seq tokens instead. One CTA per (key tile, batch, key head), each
walking its items (query step, query head) as the kernel's item_of does (last query tile
first, the group's heads inner), one time unit a step. CTAs start in launch order on the
first free SM. A step reads its query rows (Q, dO, dQ) from DRAM unless some CTA touched the
same (pair, query tile, head) within the last `window` steps (L2 holds about that many
steps of the whole GPU's traffic: 50 MB against 132 SMs x 64 KB). Printed per order: the
makespan in steps (the load balance) and the share of steps that read from DRAM.

Under the key-tile-major order this model gave ~5.4 GB from DRAM; ncu measured ~6 GB of
DRAM traffic in the whole kernel (H100, session 28); the kernel's order in bands
(launch_order_bands, after a lead of 8 key-tile-major tiles) measured 56 -> 37 % DRAM
throughput. The "(kernel)" line is the order bands_for picks for the shape's pair count.
"""
import argparse
import heapq
import random

BLK, CTX, BM, BN, D = 16, 3072, 64, 128, 128
# What a step that misses L2 moves: its Q and dO rows (bf16) read, and its dq_accum rows
# (fp32) read and written back.
STEP_DRAM_BYTES = BM * D * (2 + 2) + 2 * BM * D * 4


class Shape:
    def __init__(self, args):
        self.b, self.hkv, self.group, self.mask = args.batch, args.kv_heads, args.group, args.mask
        self.pairs = self.b * self.hkv
        if self.mask == "drafter":
            self.nb = 512
            self.nqt = self.nb * BLK // BM                   # query steps per head
            self.kt_ctx = CTX // BN                          # context key tiles
            self.nkt = self.kt_ctx + self.nb * BLK // BN     # key tiles
        else:
            self.nqt, self.nkt = args.seq // BM, args.seq // BN


def make_items(sh, rng):
    """items[(pair, tile)]: the CTA's (query tile, head) steps in walk order."""
    anchors = [sorted(rng.randint(1, CTX) for _ in range(sh.nb)) for _ in range(sh.b)] \
        if sh.mask == "drafter" else None
    out = {}
    for pair in range(sh.pairs):
        b = pair // sh.hkv  # launch_order: y = key head (inner), z = batch
        for t in range(sh.nkt):
            if sh.mask == "causal":  # query tiles at or past the key tile's first key
                qts = list(range(t * BN // BM, sh.nqt))
            elif sh.mask == "none":
                qts = list(range(sh.nqt))
            elif t < sh.kt_ctx:  # a context tile: the query steps with a block anchored past it
                per = BM // BLK
                qts = [qt for qt in range(sh.nqt)
                       if any(anchors[b][qt * per + i] > BN * t for i in range(per))]
            else:                # an own tile: its own two query steps
                o = t - sh.kt_ctx
                qts = list(range(o * BN // BM, (o + 1) * BN // BM))
            out[pair, t] = [(qt, hh) for qt in sorted(qts, reverse=True) for hh in range(sh.group)]
    return out


def tile_major(sh):
    return [(lin % sh.pairs, lin // sh.pairs) for lin in range(sh.nkt * sh.pairs)]


def kernel_bands(pairs):
    """bands_for in kernels/attention_bwd.cuh: a lead of 8 key-tile-major tiles while it fits
    one wave (132 CTAs), then bands of pairs / 4 tiles, within [4, 16]. CI's
    launch_order_host_test checks this copy against the kernel's."""
    return (8 if 8 * pairs <= 132 else 0), min(16, max(4, pairs // 4))


def bands(sh, lead, band):
    """launch_order_bands: `lead` tiles key-tile-major, then bands of `band` tiles in tile
    order, pair-major within a band."""
    seq = [(pr, t) for t in range(min(lead, sh.nkt)) for pr in range(sh.pairs)]
    for t0 in range(lead, sh.nkt, band):
        seq += [(pr, t) for pr in range(sh.pairs) for t in range(t0, min(sh.nkt, t0 + band))]
    return seq


def simulate(seq, items, sms, window):
    free = [(0.0, s) for s in range(sms)]
    heapq.heapify(free)
    last, dram, steps, end = {}, 0, 0, 0.0
    for pr, t in seq:
        tm, sm = heapq.heappop(free)
        for qt, hh in items[pr, t]:
            key = (pr, qt, hh)
            dram += key not in last or tm - last[key] > window
            last[key] = tm
            steps += 1
            tm += 1
        end = max(end, tm)
        heapq.heappush(free, (tm, sm))
    return end, steps, dram


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--group", type=int, default=4, help="query heads per key head")
    ap.add_argument("--mask", choices=("drafter", "causal", "none"), default="drafter")
    ap.add_argument("--seq", type=int, default=4096, help="sequence length (causal, none)")
    args = ap.parse_args()
    sh = Shape(args)
    items = make_items(sh, random.Random(args.seed))
    orders = [("key-tile-major", tile_major(sh))]
    lead, band = kernel_bands(sh.pairs)
    orders.append(("lead %d, bands of %d (kernel)" % (lead, band), bands(sh, lead, band)))
    orders += [("bands of %d" % band, bands(sh, 0, band)) for band in (2, 4, 8, 16)]
    for name, seq in orders:
        end, steps, dram = simulate(seq, items, args.sms, args.window)
        print("%-28s makespan %5.0f steps   steps reading DRAM %5.1f %%   (~%.1f GB)"
              % (name, end, 100.0 * dram / steps, dram * STEP_DRAM_BYTES / 1e9))


if __name__ == "__main__":
    main()
