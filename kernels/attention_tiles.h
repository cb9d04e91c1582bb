// Tile configurations for the attention forward template (attention_fwd.cuh).
// Used on the host by the code generator (to choose KC_BLOCK_M/N, KC_NUM_WARPS,
// KC_STAGES, the launch's thread count and its dynamic shared memory) and by
// the template itself under NVRTC (static_asserts). Everything is constexpr
// and header-only; it includes only attention_params.h (plain data, for the
// KC_MASK_* values), so it compiles as host C++17 and under NVRTC alike.
#pragma once
#include "attention_params.h"

// Under NVRTC (and nvcc) these functions must be usable in device code too.
#if defined(__CUDACC__)
#define KC_TILES_HD __host__ __device__
#else
#define KC_TILES_HD
#endif

namespace kcache {

// One tile configuration. threads = num_warps * 32; smem_bytes is the
// dynamic shared memory the forward kernel needs (attention_fwd.cuh lays it
// out exactly so). All zero means "unsupported".
struct AttentionTiles {
  int block_m;     // query rows per CTA
  int block_n;     // keys per iteration
  int num_warps;   // each warp owns block_m / num_warps query rows (16 or 32)
  int stages;      // K/V shared-memory pipeline depth (cp.async)
  int smem_bytes;  // dynamic shared memory of kcache_attn_fwd
};

// Masks that are not analytic (document, drafter, expression) walk a list of
// non-empty key tiles built in shared memory at the start of each CTA. Up to
// this many key tiles are classified; beyond it (kv_len > 2048 * block_n)
// every tile is treated as partial: still correct, no longer sparse.
constexpr int kAttnMaxListTiles = 2048;

// Shared memory of the mask scratch: the tile list (uint16 each), one int4 of
// row data per query row, a few counters, 64 bytes of mbarriers, and 1024
// bytes of slack to align the tiles to 1024 bytes (wgmma's swizzle atoms on
// sm_90a).
KC_TILES_HD constexpr int AttentionScratchBytes(int block_m) {
  return 2 * kAttnMaxListTiles + 16 * block_m + 16 + 64 + 1024;
}

// Dynamic shared memory of the forward kernel: Q tile, `stages` K and V
// tiles, and the mask scratch (always reserved, so that the figure does not
// depend on the mask kind).
KC_TILES_HD constexpr int AttentionSmemBytes(int block_m, int block_n, int stages, int dqk, int dv,
                                             int elem_bytes) {
  return block_m * dqk * elem_bytes + stages * block_n * (dqk + dv) * elem_bytes +
         AttentionScratchBytes(block_m);
}

// Largest dynamic shared memory a block may opt into, per architecture.
KC_TILES_HD constexpr int AttentionMaxSmemPerBlock(int arch) {
  return arch == 90 ? 232448 : arch == 80 ? 166912 : (arch == 86 || arch == 89) ? 101376 : 0;
}

KC_TILES_HD constexpr bool AttentionHeadDimSupported(int d) {
  return d == 64 || d == 128 || d == 256;
}

// sm_90a's ping-pong forward (attention_fwd.cuh, kPingpong): warpgroups of
// 16-row warps that take turns on the tensor cores, two stages. Two
// warpgroups (block_m 128) for head dim QK 128; three (block_m 192,
// FlashAttention-3's shape for head dim 64) for 64 / 64 with key tiles of
// 128, the default under analytic masks (the drafter's gathered own tile
// needs block_m == block_n, so 192-row drafter tiles go without it). Two
// warpgroups at head dim 64 measured 8 % slower than the plain wgmma path
// (kernels/NOTES.md, session 23) and are not built. A producer warpgroup
// beside them issues the K / V copies, so the kernel runs num_warps * 32 +
// kAttnFwdProducerThreads threads there.
constexpr int kAttnFwdProducerThreads = 128;
KC_TILES_HD constexpr bool AttentionFwdPingpong(const AttentionTiles& t, bool sm90a,
                                                int head_dim_qk, int head_dim_v) {
  const bool two = t.num_warps == 8 && t.block_m == 8 * 16 && head_dim_qk == 128 &&
                   head_dim_v >= 64 && head_dim_v <= 128;
  // Three warpgroups get 160 registers each: S of 176 keys spills there.
  const bool three = t.num_warps == 12 && t.block_m == 12 * 16 && head_dim_qk == 64 &&
                     head_dim_v == 64 && t.block_n == 128;
  return sm90a && t.stages == 2 && (two || three);
}

// Whether a configuration can be compiled and launched. Used for the spec's
// Tuning overrides. t.smem_bytes is ignored (it is derived: AttentionSmemBytes
// with 2-byte elements). Rules: 4 or 8 warps (12 on the sm_90a ping-pong);
// rows per warp 16 or 32; block_n 32, 64 or 128, or 176 on the sm_90a
// ping-pong (FlashAttention-3's key tile for head dim 128 without a causal
// mask: a key tile's fixed instructions over more keys); 2..4 stages; the fp32 accumulators of S
// and O fit the register file (rows_per_warp/16 * (block_n + dv) / 2 <= 192 floats per thread);
// shared memory within the architecture's limit.
KC_TILES_HD constexpr bool AttentionTilesLegal(const AttentionTiles& t, int arch, int head_dim_qk,
                                               int head_dim_v, bool sm90a = false) {
  if (AttentionMaxSmemPerBlock(arch) == 0) return false;
  if (!AttentionHeadDimSupported(head_dim_qk) || !AttentionHeadDimSupported(head_dim_v)) {
    return false;
  }
  if (t.num_warps != 4 && t.num_warps != 8 &&
      !(t.num_warps == 12 && AttentionFwdPingpong(t, sm90a, head_dim_qk, head_dim_v))) {
    return false;
  }
  const int rows_per_warp = t.num_warps > 0 ? t.block_m / t.num_warps : 0;
  if (t.block_m != t.num_warps * rows_per_warp) return false;
  if (rows_per_warp != 16 && rows_per_warp != 32) return false;
  if (t.block_n != 32 && t.block_n != 64 && t.block_n != 128 &&
      !(t.block_n == 176 && AttentionFwdPingpong(t, sm90a, head_dim_qk, head_dim_v))) {
    return false;
  }
  if (t.stages < 2 || t.stages > 4) return false;
  if ((rows_per_warp / 16) * (t.block_n + head_dim_v) / 2 > 192) return false;
  // Key-tile indices are packed into 14 bits of the tile list.
  return AttentionSmemBytes(t.block_m, t.block_n, t.stages, head_dim_qk, head_dim_v, 2) <=
         AttentionMaxSmemPerBlock(arch);
}

// Fills in smem_bytes for a configuration (2-byte elements).
KC_TILES_HD constexpr AttentionTiles MakeAttentionTiles(int block_m, int block_n, int num_warps,
                                                        int stages, int head_dim_qk,
                                                        int head_dim_v) {
  return AttentionTiles{block_m, block_n, num_warps, stages,
                        AttentionSmemBytes(block_m, block_n, stages, head_dim_qk, head_dim_v, 2)};
}

// Threads of kcache_attn_fwd.
KC_TILES_HD constexpr int AttentionFwdThreads(const AttentionTiles& t, bool sm90a, int head_dim_qk,
                                              int head_dim_v) {
  return t.num_warps * 32 +
         (AttentionFwdPingpong(t, sm90a, head_dim_qk, head_dim_v) ? kAttnFwdProducerThreads : 0);
}

// The default configuration for a spec, or all zeros when the combination is
// unsupported. mask_kind is a KC_MASK_* value (none, causal and sliding
// window are the analytic masks); is_fp16 selects fp16 over bf16 (both 2-byte,
// same tiles today). sm90a: the target is sm_90a (KC_ARCH_SM90A), where
// warpgroup-shaped tiles (16 rows per warp) run the wgmma path of
// attention_fwd.cuh.
KC_TILES_HD constexpr AttentionTiles SelectAttentionTiles(int arch, int head_dim_qk, int head_dim_v,
                                                          int mask_kind, bool is_fp16,
                                                          bool sm90a = false) {
  (void)is_fp16;
  const AttentionTiles zero{0, 0, 0, 0, 0};
  if (AttentionMaxSmemPerBlock(arch) == 0) return zero;
  if (!AttentionHeadDimSupported(head_dim_qk) || !AttentionHeadDimSupported(head_dim_v)) {
    return zero;
  }
  const int dmax = head_dim_qk > head_dim_v ? head_dim_qk : head_dim_v;
  const bool analytic = mask_kind == KC_MASK_NONE || mask_kind == KC_MASK_CAUSAL ||
                        mask_kind == KC_MASK_SLIDING_WINDOW;
  // Measured on an H200 (kernels/NOTES.md). mma.sync: 32 rows per warp, and
  // block_n 32 for head dim 128, which keeps the S and O accumulators within
  // the register file without spills. wgmma (sm_90a): two warpgroups of 64
  // rows; block_n 128 for head dim 128 (ping-pong; 176 keys did not pay in
  // four runs, sessions 23-24), 64 for head dim 64; head dims 64 / 64 under
  // analytic masks: three warpgroups over 192 rows, 128 keys (-2.3 / -3.0 %,
  // causal, session 23).
  AttentionTiles t = zero;
  if (arch == 90 && sm90a && head_dim_qk == 64 && head_dim_v == 64 && analytic) {
    t = MakeAttentionTiles(192, 128, 12, 2, head_dim_qk, head_dim_v);
  } else if (arch == 90 && sm90a && dmax <= 128) {
    t = MakeAttentionTiles(128, dmax <= 64 ? 64 : 128, 8, 2, head_dim_qk, head_dim_v);
  } else if (dmax <= 64) {
    t = MakeAttentionTiles(128, 64, 4, 2, head_dim_qk, head_dim_v);
  } else if (dmax <= 128) {
    t = MakeAttentionTiles(128, 32, 4, 2, head_dim_qk, head_dim_v);
  } else {
    t = MakeAttentionTiles(64, 32, 4, 2, head_dim_qk, head_dim_v);
  }
  return AttentionTilesLegal(t, arch, head_dim_qk, head_dim_v, sm90a) ? t : zero;
}

// ---------------------------------------------------------------------------
// Backward tiles (attention_bwd.cuh). Two kernels share one configuration:
//   kcache_attn_bwd_dkdv: a CTA owns block_n keys of one (batch, kv head),
//     16 per warp, and walks the query steps of block_m rows that see them
//     (over every query head of the GQA group);
//   kcache_attn_bwd_dq (deterministic mode): a CTA owns block_n query rows
//     of one (batch, query head), 16 per warp, and walks key steps of
//     block_m.
// block_m = 64 and block_n = 16 * num_warps: the dK and dV accumulators
// (2 x 16 x d fp32 per warp) leave no register room for wider S tiles on
// mma.sync, and 128 keys per CTA halve the dQ atomics of a 64-key tile.
// Head dims up to 128.
// ---------------------------------------------------------------------------
struct AttentionBwdTiles {
  int block_m;
  int block_n;
  int num_warps;
  int smem_dkdv;  // dynamic shared memory of kcache_attn_bwd_dkdv
  int smem_dq;    // dynamic shared memory of kcache_attn_bwd_dq
};

// Threads of the elementwise backward kernels (preprocess, dQ conversion),
// each CTA covering kAttnBwdRowsPerCta query rows of one (batch, head).
constexpr int kAttnBwdRowsPerCta = 64;
constexpr int kAttnBwdAuxThreads = 256;

// The backward kernels walk a list of non-empty tiles built in shared memory
// (uint32 entries: tile, query head within the GQA group, class). Past this
// many entries every tile in range is treated as partial: still correct, no
// longer sparse. Smaller than the forward's so that two dK/dV CTAs of head
// dim 128 fit one SM.
constexpr int kAttnBwdMaxList = 1024;

// Threads of kcache_attn_bwd_dkdv: num_warps * 32 compute threads and, on the
// wgmma path outside the deterministic mode, a producer warpgroup that issues
// the query steps' copies (attention_bwd.cuh, kProducer).
constexpr int kAttnBwdProducerThreads = 128;
KC_TILES_HD constexpr int AttentionBwdDkdvThreads(int num_warps, bool wgmma, bool deterministic) {
  return num_warps * 32 + (wgmma && !deterministic ? kAttnBwdProducerThreads : 0);
}

// dK/dV kernel: K and V of the CTA's keys, two stages of Q and dO, the dS^T
// tile (two on sm_90+, where the dQ of a query step runs one step late:
// AttentionBwdDsBuffers), two stages of (LSE, delta) and of per-row mask
// data, the tile list and counters. sm_90a (wgmma): 1024 bytes of slack to
// align the tiles to wgmma's 1024-byte swizzle atoms, the drafter's block
// order (2 bytes per block, up to kAttnBwdMaxList blocks; attention_bwd.cuh,
// kBwdDrafterSort), four mbarriers of the producer warpgroup's stages, and a
// query step's fp32 dQ partials (each warpgroup's 64 x 64 block), staged for
// one bulk reduction.
KC_TILES_HD constexpr int AttentionBwdDsBuffers(int arch) { return arch >= 90 ? 2 : 1; }
KC_TILES_HD constexpr int AttentionBwdDqStageBytes(int block_m, bool wgmma) {
  return wgmma ? 2 * block_m * 64 * 4 : 0;
}
KC_TILES_HD constexpr int AttentionBwdDkdvSmemBytes(int arch, int block_m, int block_n, int dqk,
                                                    int dv, bool wgmma = false) {
  return block_n * (dqk + dv) * 2 + 2 * block_m * (dqk + dv) * 2 +
         AttentionBwdDsBuffers(arch) * block_n * block_m * 2 + 2 * block_m * 8 + 2 * block_m * 16 +
         4 * kAttnBwdMaxList + 16 + (wgmma ? 1024 + 2 * kAttnBwdMaxList + 32 : 0) +
         AttentionBwdDqStageBytes(block_m, wgmma);
}

// Whether the dK/dV kernel runs its products as wgmma (attention_bwd.cuh,
// KC_BWD_WGMMA): sm_90a builds with head dims 64 or 128 (every mask, score
// modification, GQA ratio and the deterministic mode; the dQ kernel of the
// deterministic mode stays mma.sync). Elsewhere the portable mma.sync path.
KC_TILES_HD constexpr bool AttentionBwdWgmma(int arch, bool sm90a, int head_dim_qk,
                                             int head_dim_v) {
  return arch == 90 && sm90a && (head_dim_qk == 64 || head_dim_qk == 128) &&
         (head_dim_v == 64 || head_dim_v == 128);
}

// dQ kernel: Q and dO of the CTA's block_n rows, two stages of K and V
// (block_m keys each), per-row mask data, the tile list and counters.
KC_TILES_HD constexpr int AttentionBwdDqSmemBytes(int block_m, int block_n, int dqk, int dv) {
  return block_n * (dqk + dv) * 2 + 2 * block_m * (dqk + dv) * 2 + block_n * 16 +
         4 * kAttnBwdMaxList + 16;
}

// The backward configuration for a spec, or all zeros when unsupported
// (head dims other than 64 / 128, or shared memory past the limit).
KC_TILES_HD constexpr AttentionBwdTiles SelectAttentionBwdTiles(int arch, int head_dim_qk,
                                                                int head_dim_v, int mask_kind,
                                                                bool is_fp16, bool sm90a = false) {
  (void)mask_kind;
  (void)is_fp16;
  const AttentionBwdTiles zero{0, 0, 0, 0, 0};
  if (AttentionMaxSmemPerBlock(arch) == 0) return zero;
  if ((head_dim_qk != 64 && head_dim_qk != 128) || (head_dim_v != 64 && head_dim_v != 128)) {
    return zero;
  }
  const AttentionBwdTiles t{
      64, 128, 8,
      AttentionBwdDkdvSmemBytes(arch, 64, 128, head_dim_qk, head_dim_v,
                                AttentionBwdWgmma(arch, sm90a, head_dim_qk, head_dim_v)),
      AttentionBwdDqSmemBytes(64, 128, head_dim_qk, head_dim_v)};
  const int limit = AttentionMaxSmemPerBlock(arch);
  return t.smem_dkdv <= limit && t.smem_dq <= limit ? t : zero;
}

// Query rows per tile class of an expression mask's forward classification
// (kcache_attn_mask_build, KC_CLASS_BLOCK_M). With a backward whose tiles
// refine the forward's (same block_n, block_m a multiple of the backward's),
// the forward classifies with the backward's tiles and reads block_m /
// class_block_m class rows per query tile, so that one classification serves
// the forward and the backward of a call (issue 28; docs/kernel-contract.md).
// Otherwise the forward's own block_m.
KC_TILES_HD constexpr int AttentionClassBlockM(const AttentionTiles& fwd,
                                               const AttentionBwdTiles& bwd, bool backward) {
  return backward && bwd.block_m > 0 && bwd.block_n == fwd.block_n && fwd.block_m % bwd.block_m == 0
             ? bwd.block_m
             : fwd.block_m;
}

}  // namespace kcache
