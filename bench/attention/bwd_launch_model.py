"""A schedule model of the wgmma dK/dV kernel's launch order under GQA, on the CPU.

  python3 bench/attention/bwd_launch_model.py [--sms 132] [--window 6]

The drafter training shape of bench_attention.py (B2, 32 / 8 heads, 512 blocks of 16 after a
context of 3 072, sorted uniform anchors): one CTA per (key tile, batch, key head), each
walking its items (query step, query head) as the kernel's item_of does (last query tile
first, the group's heads inner), one time unit a step. CTAs start in launch order on the
first free SM. A step reads its query rows (Q, dO, dQ) from DRAM unless some CTA touched the
same (pair, query tile, head) within the last `window` steps (L2 holds about that many
steps of the whole GPU's traffic: 50 MB against 132 SMs x 64 KB). Printed per order: the
makespan in steps (the load balance) and the share of steps that read from DRAM.

Under the key-tile-major order this model gave ~5.4 GB from DRAM; ncu measured ~6 GB of
DRAM traffic in the whole kernel (H100, session 28); the order in bands that the kernel
now uses (launch_order_bands) measured 56 -> 37 % DRAM throughput.
"""
import argparse
import heapq
import random

B, HKV, GROUP, NB, BLK, CTX = 2, 8, 4, 512, 16, 3072
BM, BN = 64, 128
NQT = NB * BLK // BM                 # query steps per head
KT_CTX = CTX // BN                   # context key tiles
NKT = KT_CTX + NB * BLK // BN        # key tiles
PAIRS = B * HKV


def make_items(anchors):
    """items[(pair, tile)]: the CTA's (query tile, head) steps in walk order."""
    out = {}
    for pair in range(PAIRS):
        b = pair // HKV  # launch_order: y = key head (inner), z = batch
        for t in range(NKT):
            if t < KT_CTX:  # a context tile: the query steps with a block anchored past it
                qts = [qt for qt in range(NQT)
                       if any(anchors[b][qt * (BM // BLK) + i] > BN * t for i in range(BM // BLK))]
            else:           # an own tile: its own two query steps
                o = t - KT_CTX
                qts = [2 * o, 2 * o + 1]
            out[pair, t] = [(qt, hh) for qt in sorted(qts, reverse=True) for hh in range(GROUP)]
    return out


def tile_major():
    return [(lin % PAIRS, lin // PAIRS) for lin in range(NKT * PAIRS)]


def bands(lead, band):
    """launch_order_bands: lead tiles tile-major, then bands pair-major."""
    seq = [(pr, t) for t in range(min(lead, NKT)) for pr in range(PAIRS)]
    for t0 in range(lead, NKT, band):
        seq += [(pr, t) for pr in range(PAIRS) for t in range(t0, min(NKT, t0 + band))]
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
    args = ap.parse_args()
    rng = random.Random(args.seed)
    anchors = [sorted(rng.randint(1, CTX) for _ in range(NB)) for _ in range(B)]
    items = make_items(anchors)
    orders = [("key-tile-major", tile_major())]
    orders += [("lead %d, bands of %d" % (lead, band), bands(lead, band))
               for lead, band in ((8, 2), (8, 4), (8, 8), (8, 16), (4, 4))]
    for name, seq in orders:
        end, steps, dram = simulate(seq, items, args.sms, args.window)
        print("%-22s makespan %5.0f steps   steps reading DRAM %5.1f %%   (~%.1f GB)"
              % (name, end, 100.0 * dram / steps, dram * 3 * BM * 128 * 4 / 1e9))


if __name__ == "__main__":
    main()
