# Session 40: checks KC_FWD_OSTAGE's staging addressing off-GPU (python3 FILE prints ok).
# Emulates the staged epilogue's addressing: fragment (row, col) -> smem -> (row, col) read back.
def chunk_addr(ROWS, r, c): return (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4)
def run(kBM, kDQK, kDV, warp):
    smem = {}
    kDT = kDV // 8
    # thread lane's accumulator o[dt][e]: row g + 8*(e>>1), col dt*8 + 2*t4 + (e&1)
    def val(lane, dt, e):
        g, t4 = lane >> 2, lane & 3
        return (warp * 16 + g + 8 * (e >> 1), dt * 8 + 2 * t4 + (e & 1))
    for dt in range(0, kDT, 2):
        regs = {lane: [(val(lane, dt, 0), val(lane, dt, 1)), (val(lane, dt, 2), val(lane, dt, 3)),
                       (val(lane, dt + 1, 0), val(lane, dt + 1, 1)), (val(lane, dt + 1, 2), val(lane, dt + 1, 3))]
                for lane in range(32)}
        for i in range(4):
            for j in range(8):
                L = 8 * i + j
                addr = chunk_addr(kBM, warp * 16 + (L & 15), dt + (L >> 4))
                for k in range(4):  # matrix i, row j, elements 2k, 2k+1 held by lane 4j + k, reg i
                    a, b = regs[4 * j + k][i]
                    smem[addr + 4 * k] = a; smem[addr + 4 * k + 2] = b
    assert max(smem) < kBM * kDQK * 2
    rc = kDV // 8; rpp = 32 // rc
    for i in range(16 // rpp):
        for lane in range(32):
            r = warp * 16 + i * rpp + lane // rc; c = lane % rc
            a = chunk_addr(kBM, r, c)
            for e in range(8):
                got = smem[a + 2 * e]
                assert got == (r, c * 8 + e), (got, r, c, e)
    # rows touched belong to this warp only
    return True
for kBM, kD, nw in ((128, 128, 8), (192, 64, 12), (128, 64, 8)):
    for w in range(nw): run(kBM, kD, kD, w)
print("ok")
