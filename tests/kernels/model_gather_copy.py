"""A check of load_tile_blocks (attention_fwd.cuh, KC_FWD_GATHER_BY_BLOCK; kernels/NOTES.md,
session 22, v20) against load_tile_rows, the copy it replaces, run by hand when either
changes:

  python3 tests/kernels/model_gather_copy.py

Both copies' index arithmetic, written again in Python: for random thread counts, head
dims, block sizes, layouts (wgmma and ldmatrix), row limits and key lengths, the set of
(shared address, source row and column chunk, or zero-fill) each produces must be the
same, for the drafter's gathered own tile (rows of block s from its row data's key z) and
for a permuted tile's Q (block rank -> the sorted order, nothing past the last block).
It checks the arithmetic; the GPU suites check the kernel.
"""
import random


def dst_of(ROWS, D, WGMMA, r, c):
    return (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4) if WGMMA else r * (D * 2) + ((c ^ (r & 7)) << 4)
def rows_way(ROWS, D, THREADS, WGMMA, row_of):  # load_tile_rows
    kChunks = D // 8; out = []
    for tid in range(THREADS):
        for idx in range(tid, ROWS * kChunks, THREADS):
            r, c = idx // kChunks, idx % kChunks
            sr = row_of(r)
            out.append((dst_of(ROWS, D, WGMMA, r, c), (sr, c) if sr >= 0 else None))
    return sorted(out, key=repr)
def blocks_way(ROWS, D, BLK, THREADS, WGMMA, block_row, nrows, ln):  # load_tile_blocks
    kChunks = D // 8; kPass = THREADS // kChunks; out = []
    assert THREADS % kChunks == 0 and kPass % 8 == 0 and BLK % kPass == 0 and ROWS % BLK == 0
    for tid in range(THREADS):
        c, r0 = tid % kChunks, tid // kChunks
        d0 = dst_of(ROWS, D, WGMMA, r0, c)
        for s in range(ROWS // BLK):
            first = block_row(s); src0 = first + r0
            for j in range(BLK // kPass):
                ok = first >= 0 and s * BLK + j * kPass + r0 < nrows and src0 + j * kPass < ln
                out.append((d0 + (s * BLK + j * kPass) * (128 if WGMMA else D * 2), (src0 + j * kPass, c) if ok else None))
    return sorted(out, key=repr)
rng = random.Random(7); n = [0, 0]
for trial in range(600):
    THREADS = rng.choice([128, 256]); D = rng.choice([64, 128]); BLK = rng.choice([8, 16, 32, 64, 128]); WG = rng.choice([True, False])
    ROWS = 128; kPass = THREADS // (D // 8)
    if BLK % kPass or kPass % 8: continue
    nb = rng.randint(1, 600)
    if rng.random() < 0.5:  # the own tile: rows of block s from key rowdata[s BLK].z
        ctx = rng.randint(0, 3000)
        z = [ctx + rng.randrange(nb) * BLK for _ in range(ROWS // BLK)]
        nrows = rng.randint(1, ROWS); kv_len = ctx + nb * BLK - rng.choice([0, 0, rng.randint(0, 40)])
        def own_row(r):  # attention_fwd.cuh's own_row
            kv = z[r // BLK] + r % BLK
            return kv if r <= nrows - 1 and kv < kv_len else -1
        assert rows_way(ROWS, D, THREADS, WG, own_row) == blocks_way(ROWS, D, BLK, THREADS, WG, lambda s: z[s], nrows, kv_len); n[0] += 1
    else:  # the permuted Q: block rank -> sorder[rank], -1 past nb
        mtile = rng.randrange((nb * BLK + ROWS - 1) // ROWS); order = list(range(nb)); rng.shuffle(order)
        def src_row(r):  # attention_fwd.cuh's src_row (permute)
            rank = mtile * (ROWS // BLK) + r // BLK
            return -1 if rank >= nb else order[rank] * BLK + r % BLK
        assert rows_way(ROWS, D, THREADS, WG, src_row) == blocks_way(ROWS, D, BLK, THREADS, WG, lambda s: src_row(s * BLK), ROWS, nb * BLK); n[1] += 1
print("the same copies: %d own-tile and %d permuted-Q configurations" % (n[0], n[1]))
