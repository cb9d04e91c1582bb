// Attention forward, FlashAttention-2 style, compiled by NVRTC after the
// generated prelude (docs/kernel-contract.md). Portable across sm_80..sm_90:
// mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate), ldmatrix, cp.async
// multi-stage K/V pipeline, XOR-swizzled shared memory (no bank conflicts),
// online softmax in registers in the log2 domain.
//
// On sm_90a (KC_ARCH_SM90A) with warpgroup-shaped tiles (16 rows per warp,
// whole warpgroups, head dims <= 128) the two GEMMs run as wgmma instead:
// S = Q K^T with both operands in 128-byte-swizzled shared memory, O += P V
// with P from registers (the S accumulator layout is the A-fragment layout)
// and V read transposed. With two warpgroups and 2 stages (head dim 128), or
// three over 192 rows (head dim 64; AttentionFwdPingpong), they ping-pong
// (FlashAttention-3): named barriers make them take turns issuing wgmma, a
// turn issuing S of key tile i and then P V of tile i - 1, so that a
// warpgroup's softmax runs under its own P V and the others' turns; a
// producer warpgroup issues the K/V copies, which complete on mbarriers
// (cp.async.mbarrier.arrive) instead of a CTA barrier per tile.
//
// One CTA computes block_m query rows of one (batch, query head); each warp
// owns block_m / num_warps rows (16 or 32) and walks the key tiles that the
// mask leaves visible:
//   - none / causal / sliding window: an analytic range of key tiles;
//   - document / drafter / expression: a list of non-empty key tiles built in
//     shared memory when the CTA starts (drafter and document classify
//     tiles from the anchors / sequence ids; expression masks read the
//     classes written by kcache_attn_mask_build into p.tile_class).
//     Drafter tiles hold blocks sorted by anchor, not consecutive blocks
//     (kDrafterSort): each CTA sorts its batch row's anchors first.
// Tiles are "full" (no per-element mask), "partial" (mask per element, and
// the kv_len bound) or empty (never loaded, never computed). Partial tiles
// are classified again per warp before any MMA: a warp that sees none of
// the tile skips it (mma.sync) or its softmax (wgmma, which is collective),
// a warp that sees all of it skips the per-element mask.
//
// Requirements on the launch (checked by the caller, not here): q, k, v, o
// 16-byte aligned; the b/h/s strides of q, k, v multiples of 8 elements and
// of o multiples of 2; num_q_heads % num_kv_heads == 0.
#pragma once

#include "attention_params.h"
#include "attention_tiles.h"

#ifndef KC_ARCH
#error "attention_fwd.cuh needs the generated prelude (docs/kernel-contract.md)"
#endif

static_assert(kcache::AttentionTilesLegal(kcache::AttentionTiles{KC_BLOCK_M, KC_BLOCK_N,
                                                                 KC_NUM_WARPS, KC_STAGES, 0},
                                          KC_ARCH, KC_HEAD_DIM_QK, KC_HEAD_DIM_V,
                                          KC_ARCH_SM90A != 0),
              "illegal tile configuration for this architecture and head dims");

// Expression masks: what the generated code says of its predicate
// (compiler/attention/expr_lower.cc); a prelude without it reads b and h and
// has no interval evaluation.
#if KC_MASK == KC_MASK_EXPR
#ifndef KC_EXPR_MASK_READS_B
#define KC_EXPR_MASK_READS_B 1
#endif
#ifndef KC_EXPR_MASK_READS_H
#define KC_EXPR_MASK_READS_H 1
#endif
#ifndef KC_EXPR_MASK_TILE
#define KC_EXPR_MASK_TILE 0
#endif
// Query rows per tile class (kcache::AttentionClassBlockM): the backward's
// block_m when the forward's classification also serves the backward.
#ifndef KC_CLASS_BLOCK_M
#define KC_CLASS_BLOCK_M KC_BLOCK_M
#endif
static_assert(KC_CLASS_BLOCK_M > 0 && KC_BLOCK_M % KC_CLASS_BLOCK_M == 0,
              "tile classes must divide the forward's query tile");
#endif
#ifndef KC_EXPR_MASK_ROW  // outside the block above: KC_MASK_ROW_DATA reads it for every mask
#define KC_EXPR_MASK_ROW 0
#endif
// Masks whose partial tiles read per-row data (rowdata, an int4 per query
// row in shared memory) in their per-element test: document ids, the
// drafter's visible ranges, an expression mask's row-only part
// (kc_expr_mask_row).
#define KC_MASK_ROW_DATA                                        \
  (KC_MASK == KC_MASK_DOCUMENT || KC_MASK == KC_MASK_DRAFTER || \
   (KC_MASK == KC_MASK_EXPR && KC_EXPR_MASK_ROW))

namespace kcache {
namespace attn_fwd {

typedef unsigned short elem_t;  // raw bf16 / fp16 bits

constexpr int kBM = KC_BLOCK_M;
constexpr int kBN = KC_BLOCK_N;  // 32, 64, 128; 176 on the ping-pong (AttentionTilesLegal)
constexpr int kNW = KC_NUM_WARPS;
constexpr int kThreads = kNW * 32;
constexpr int kStages = KC_STAGES;
constexpr int kDQK = KC_HEAD_DIM_QK;
constexpr int kDV = KC_HEAD_DIM_V;
constexpr int kWM = kBM / kNW;  // rows per warp
constexpr int kMT = kWM / 16;   // m16 tiles per warp
constexpr int kNT = kBN / 8;    // n8 tiles of S
constexpr int kKQ = kDQK / 16;  // k16 steps of Q.K^T
constexpr int kDT = kDV / 8;    // n8 tiles of O
constexpr int kKV = kBN / 16;   // k16 steps of P.V

// Shared memory layout (bytes), matching kcache::AttentionSmemBytes.
constexpr int kQBytes = kBM * kDQK * 2;
constexpr int kKBytes = kBN * kDQK * 2;  // one stage
constexpr int kVBytes = kBN * kDV * 2;   // one stage
constexpr int kKOff = kQBytes;
constexpr int kVOff = kKOff + kStages * kKBytes;
constexpr int kListOff = kVOff + kStages * kVBytes;
constexpr int kRowOff = kListOff + 2 * kAttnMaxListTiles;
constexpr int kMiscOff = kRowOff + 16 * kBM;
constexpr int kBarOff = kMiscOff + 16;  // 8 mbarriers (sm_90a ping-pong)
static_assert(kBarOff + 64 + 1024 == AttentionSmemBytes(kBM, kBN, kStages, kDQK, kDV, 2),
              "shared-memory layout out of step with attention_tiles.h");
static_assert(kAttnMaxListTiles <= (1 << 14), "tile index must fit 14 bits");

constexpr float kScale = KC_SOFTMAX_SCALE;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Without a score modification (and with a positive scale) the scale and
// log2(e) fold into the exp2 argument: x = qk * kMul, one FFMA per element.
constexpr bool kFold = (KC_SCORE_MOD == KC_SCORE_NONE) && (kScale > 0.f);
constexpr float kMul = kFold ? kScale * kLog2e : 1.f;
// sm_90a: warpgroup MMA (wgmma) when the tiles are warpgroup-shaped (16 rows
// per warp, whole warpgroups of 64 rows); Q, K, V then live in the 128-byte
// swizzled layout wgmma reads, and everything else is shared with mma.sync.
// The wgmma helpers exist only where they can be used: on sm_90a with head
// dims that warpgroup tiles support. Outside templates a discarded
// `if constexpr` branch is still compiled, so this must be a preprocessor
// condition (d256 would not compile against the d64/d128 helpers).
#define KC_WGMMA_HEAD_DIMS \
  (KC_ARCH_SM90A && KC_HEAD_DIM_QK <= 128 && KC_HEAD_DIM_V <= 128 && KC_HEAD_DIM_V >= 64)
#if KC_WGMMA_HEAD_DIMS
constexpr bool kWgmma = kWM == 16 && kNW % 4 == 0 && kDQK <= 128 && kDV <= 128 && kDV >= 64;
#else
constexpr bool kWgmma = false;
#endif
// sm_90a with two (or, head dim 64 over 192 rows, three) warpgroups and 2
// stages: the warpgroups take turns on the tensor cores (FlashAttention-3's
// ping-pong), one's softmax under the others' wgmma; loads complete on
// mbarriers instead of CTA barriers.
// Head dim 64 ran slower on two warpgroups: 1.5 % with 64-key tiles
// (session 11), 8 % with 128 (session 23; kernels/NOTES.md), its GEMMs too
// short; three warpgroups over 192 rows ran 2-3 % faster than the plain
// wgmma path (session 23).
// The tiles as attention_tiles.h names them (smem_bytes unused here).
constexpr AttentionTiles kTiles{kBM, kBN, kNW, kStages, 0};
// attention_tiles.h's AttentionFwdPingpong decides, so that the launch's
// thread count (AttentionFwdThreads) and the kernel cannot disagree.
constexpr bool kPingpong = AttentionFwdPingpong(kTiles, KC_ARCH_SM90A != 0, kDQK, kDV);
static_assert(!kPingpong || kWgmma, "the ping-pong runs on the wgmma path");
// FlashAttention-4's lazy rescale: the running max moves (and O is rescaled)
// only when a row of the warp grows by more than kRescaleSlack (log2 units);
// otherwise exponents are taken against the stale max, at most 2^slack,
// which fp32 sums and bf16 / fp16 P hold. m and l stay consistent, so O / l
// and the LSE are exact either way. Measured (session 12, kernels/NOTES.md
// s1): head dim 64 sm_90a 0.435 -> 0.415 ms, the mma.sync forward -5..-7 %;
// On the ping-pong O's rescale follows P V's wait, on a warpgroup's own
// chain: lazy there took the no-mask forward -3..-4 % (two runs, session
// 21), but moved the others by -3..+6 % from run to run, so only no mask.
constexpr float kRescaleSlack = !kPingpong || KC_MASK == KC_MASK_NONE ? 8.f : 0.f;
// The ping-pong's producer warpgroup (threads kThreads .. kThreads + 127)
// issues the K / V copies; elsewhere the compute threads do.
constexpr int kFwdThreadsAll = AttentionFwdThreads(kTiles, KC_ARCH_SM90A != 0, kDQK, kDV);
constexpr int kLoadThreads = kPingpong ? kAttnFwdProducerThreads : kThreads;
// The ping-pong's compute warpgroups (two, or three over 192 rows for head
// dim 64), and the registers setmaxnreg moves from the producer to them:
// FlashAttention-3's split (24 / 240 beside two, 32 / 160 beside three).
constexpr int kNWG = kNW / 4;
constexpr int kProducerRegs = kNWG == 3 ? 32 : 24;
constexpr int kConsumerRegs = kNWG == 3 ? 160 : 240;
// setmaxnreg.inc waits until the pool holds what it asks for, so the
// producer's release must cover the consumers' growth from the launch's
// per-thread count (__launch_bounds__: 65536 / threads, rounded down to 8).
constexpr int kLaunchRegs = (65536 / kFwdThreadsAll) & ~7;
static_assert(!kPingpong || ((kNWG == 2 || kNWG == 3) &&
                             (kLaunchRegs - kProducerRegs) >= kNWG * (kConsumerRegs - kLaunchRegs)),
              "the ping-pong's register split takes more than the producer gives up");
// Named barriers of the ping-pong: 1 + w, warpgroup w's turn (kTurnThreads:
// w and the warpgroup before it take part); then the compute warps together.
constexpr int kBarTurn = 1;
constexpr int kTurnThreads = 256;
constexpr int kBarCompute = kBarTurn + kNWG;
static_assert(kBarCompute < 16, "named barriers 0..15");
// sm_90a with 3+ stages: softmax overlaps the previous tile's P V wgmma.
constexpr bool kOverlap = kWgmma && !kPingpong && kStages >= 3;
// Tiles in flight ahead of the one computed.
constexpr int kPrefetch = kOverlap ? kStages - 2 : kStages - 1;
// Q fragments stay in registers when they are small enough.
constexpr bool kQInRegs =
    !kWgmma && kMT * kKQ * 4 <= 32 && kMT * (kDV + kBN) / 2 + kMT * kKQ * 4 <= 160;

// The ping-pong's O leaves through shared memory: each warp stages its 16
// normalized rows in its own rows of the Q tile (free once its last S wgmma
// is waited) with stmatrix, then a half-warp stores one whole 256-byte row in
// 16-byte chunks, where the direct path writes 4 bytes of 8 rows per
// instruction (4x the store instructions, each 32-byte sector in halves).
// Measured (session 41, H100, two runs): sorted drafter -2.3 %, random
// -1..-2 %, causal -3..-4 %, causal GQA -3 %, D64 0. Not with no mask: its
// producer's 24 registers then spill 16 B (+1.4 / +4.0 %). O rows that are
// not 16-byte aligned take the direct path; KC_FWD_DIRECT_OUT=1 forces it
// (the A/B's baseline).
#ifndef KC_FWD_DIRECT_OUT
#define KC_FWD_DIRECT_OUT 0
#endif
#if KC_WGMMA_HEAD_DIMS
constexpr bool kOStage = kPingpong && kMT == 1 && kDV % 64 == 0 && kDV <= kDQK &&
                         KC_MASK != KC_MASK_NONE && !KC_FWD_DIRECT_OUT;
#else
constexpr bool kOStage = false;
#endif
constexpr bool kListMask =
    KC_MASK == KC_MASK_DOCUMENT || KC_MASK == KC_MASK_DRAFTER || KC_MASK == KC_MASK_EXPR;

// Drafter mask: query tiles hold drafter blocks sorted by anchor. A tile of
// consecutive blocks with unrelated (random) anchors computes every key tile
// below its largest anchor (E[max of 8 uniform] = 8/9 of the context against
// a mean of 1/2: ~1.8x the visible work); blocks of near-equal anchors make
// most of those tiles full and none wasted. Each CTA sorts its batch row's
// (anchor, block) keys (a counting sort, in the K/V stages, before the K/V
// loads) and takes the blocks of ranks [mtile * kBM / block, ...); rows keep
// their order within a block. Only when a block divides the tile. Keys
// already in order (sorted anchors) skip the sort (drafter_rank_blocks).
__host__ __device__ constexpr int pow2_ceil(int x) {
  int r = 1;
  while (r < x) r *= 2;
  return r;
}
// Score modifications that read the query index (ALiBi, expressions) keep
// the identity order: the permuted index would cost registers in the loop.
constexpr bool kDrafterSort = KC_MASK == KC_MASK_DRAFTER && KC_DRAFTER_BLOCK <= kBM &&
                              kBM % KC_DRAFTER_BLOCK == 0 &&
                              (KC_SCORE_MOD == KC_SCORE_NONE || KC_SCORE_MOD == KC_SCORE_SOFTCAP);
// drafter_rank_blocks (below): buckets of its counting sort, and the shared
// memory it needs for n blocks beside the order (per bucket a count, then
// start, then end; the sort anchors; the blocks by bucket).
constexpr int kRankBuckets = 256;
__host__ __device__ constexpr int drafter_rank_scratch_bytes(int n) {
  return 4 * kRankBuckets + 6 * n;
}
// Blocks the forward can sort: their order (16-bit block indices, padded to
// 16 bytes) and the scratch fit in the K/V stages.
constexpr int kSortRoom = kStages * (kKBytes + kVBytes) - 16 - drafter_rank_scratch_bytes(0);
constexpr int kSortCap = kSortRoom / 8 < 65535 ? kSortRoom / 8 : 65535;
// Sorted blocks (permuted tiles) with square tiles: the tile's own keys
// (each block's kBlk keys past the context) are gathered into one key tile,
// kOwnTile in the tile list, whose column c holds the own key of tile row c's
// block at offset c % kBlk, so its mask is block-diagonal (row r sees column
// c iff both are of one block, and with causal blocks c % kBlk <= r % kBlk).
// Other tiles then test the context ranges only. A permuted tile's blocks
// are scattered over the own keys: without it, each of its kBM / kBlk
// blocks costs a whole key tile for kBlk visible columns (random anchors:
// 8 own tiles per query tile beside ~12 context tiles on the drafter
// training shape).
constexpr bool kOwnGather = kDrafterSort && kBM == kBN;
constexpr int kOwnTile = 0x3fff;  // tile-list index of the gathered tile

// ---------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned smem_u32(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Packs two floats into a bf16x2/f16x2 word, `lo` in the low half.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r;
#if KC_DTYPE_BF16
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                        unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                          unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D += A.B, m16n8k16, fp32 accumulators.
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
#if KC_DTYPE_BF16
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

#if KC_WGMMA_HEAD_DIMS
// wgmma (sm_90a) wrappers, one overload per N. A and B from shared memory (S = Q K^T,
// both K-major) or A from registers and B N-major (O += P V). Generated text.
#if KC_DTYPE_BF16
#define KC_WG_T "bf16"
#else
#define KC_WG_T "f16"
#endif
__device__ __forceinline__ void wgmma_ss(float (&d)[4][4], unsigned long long da,
                                         unsigned long long db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." KC_WG_T "." KC_WG_T
      " "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], unsigned long long da,
                                         unsigned long long db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." KC_WG_T "." KC_WG_T
      " "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[16][4], unsigned long long da,
                                         unsigned long long db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." KC_WG_T "." KC_WG_T
      " "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"
      "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[22][4], unsigned long long da,
                                         unsigned long long db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n176k16.f32." KC_WG_T "." KC_WG_T
      " "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"
      "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%"
      "71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87}, %88, %89, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]),
        "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]),
        "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]),
        "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]),
        "+f"(d[21][3])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const unsigned (&a)[4],
                                         unsigned long long db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." KC_WG_T "." KC_WG_T
      " "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

__device__ __forceinline__ void wgmma_rs(float (&d)[16][4], const unsigned (&a)[4],
                                         unsigned long long db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." KC_WG_T "." KC_WG_T
      " "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"
      "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, "
      "1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads above wgmma_wait0.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
  }
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#if KC_WGMMA_HEAD_DIMS
// Four 8x8 b16 matrices from mma fragments to shared memory (lanes 8i..8i+7
// give matrix i's row addresses), and a 16-byte shared load.
__device__ __forceinline__ void stsm_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2,
                                        unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ uint4 lds_u4(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
// One 16-byte global store (the caller checked the alignment at run time,
// which the compiler cannot see: a uint4 assignment compiled to 4 x 4 bytes).
__device__ __forceinline__ void stg_u4(void* gaddr, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(gaddr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
#endif
__device__ __forceinline__ void mbar_init(unsigned addr, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
// Arrives once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned addr, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return static_cast<unsigned long long>((addr & 0x3FFFFu) >> 4) |
         (static_cast<unsigned long long>(lbo >> 4) << 16) |
         (static_cast<unsigned long long>(sbo >> 4) << 32) | (1ull << 62);
}
#endif  // KC_ARCH_SM90A

// Shared address of 16-byte chunk c of row r in a swizzled [ROWS, D] tile at
// sdst: r * 2D + ((c ^ (r & 7)) * 16) for ldmatrix, or wgmma's canonical
// 128-byte-swizzled K-major layout, [D / 64][ROWS][64] (Swizzle<3,4,3>).
// tile_row_bytes: bytes per row between rows of one swizzle key (r & 7), so
// that a pass of P rows, P a multiple of 8, moves a chunk's address by P times
// that.
template <int ROWS, int D, bool WGMMA>
__device__ __forceinline__ unsigned tile_chunk_addr(unsigned sdst, int r, int c) {
  return WGMMA ? sdst + (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4)
               : sdst + r * (D * 2) + ((c ^ (r & 7)) << 4);
}
template <int D, bool WGMMA>
__device__ __forceinline__ constexpr int tile_row_bytes() {
  return WGMMA ? 128 : D * 2;
}

// Copies rows [row0, row0 + ROWS) of a [len, D] matrix (row stride `stride`
// elements) into a swizzled shared tile (tile_chunk_addr). Rows at or past
// `len` are zero-filled.
// THREADS threads (tid in [0, THREADS)) share the copy; the backward passes
// its own count and the ldmatrix layout.
template <int ROWS, int D, int THREADS = kThreads, bool WGMMA = kWgmma>
__device__ __forceinline__ void load_tile(unsigned sdst, const elem_t* g, long long stride,
                                          int row0, int len, int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kTotal = ROWS * kChunks;
  static_assert(kTotal % THREADS == 0, "tile copy does not divide among threads");
  // A whole tile in bounds (all but a last partial one): each thread copies
  // one 16-byte column chunk c of rows r0, r0 + P, r0 + 2P, ... (P rows per
  // pass). With P a multiple of 8 the swizzle key (r & 7) is the same for all
  // of a thread's rows, so its shared addresses are one base plus constants
  // and its global ones one base plus multiples of P rows: per chunk a 64-bit
  // add and the copy, where the general loop below spends ~8 instructions
  // (bound test, select, address arithmetic) and kept per-chunk addresses in
  // registers (ncu, causal D128 sm_90a forward: IMAD/LEA/IADD3/ISETP were 31 %
  // of the executed instructions; 250 registers, 208 with this path).
  constexpr int kPass = THREADS / kChunks;  // rows per pass
  constexpr bool kFastPath = THREADS % kChunks == 0 && kPass % 8 == 0 && ROWS % kPass == 0;
  if constexpr (kFastPath) {
    if (row0 + ROWS <= len) {
      const int c = tid % kChunks;
      const int r0 = tid / kChunks;
      const unsigned d0 = tile_chunk_addr<ROWS, D, WGMMA>(sdst, r0, c);
      const elem_t* src = g + (long long)(row0 + r0) * stride + c * 8;
      const long long step = (long long)kPass * stride;
#pragma unroll
      for (int i = 0; i < ROWS / kPass; ++i) {
        cp_async16(d0 + i * kPass * tile_row_bytes<D, WGMMA>(), src, true);
        src += step;
      }
      return;
    }
  }
  // The general copy (a last partial tile, or a layout the path above does
  // not cover): rolled where the path above exists, since it is then rare and
  // its unrolled copies cost NVRTC time in every load site.
#pragma unroll(kFastPath ? 1 : kTotal / THREADS)
  for (int i = 0; i < kTotal / THREADS; ++i) {
    const int idx = tid + i * THREADS;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const bool ok = row0 + r < len;
    const elem_t* src = ok ? g + (long long)(row0 + r) * stride + c * 8 : g;
    cp_async16(tile_chunk_addr<ROWS, D, WGMMA>(sdst, r, c), src, ok);
  }
}

// The same for a gathered tile: tile row r comes from source row row_of(r),
// zero-filled when that is negative (the drafter's permuted query rows).
// ROLLED: a loop that is not unrolled (a tile loaded once per CTA, where
// code size costs NVRTC time and the copy's issue rate does not matter).
template <int ROWS, int D, int THREADS = kThreads, bool WGMMA = kWgmma, bool ROLLED = false,
          typename RowOf>
__device__ __forceinline__ void load_tile_rows(unsigned sdst, const elem_t* g, long long stride,
                                               RowOf row_of, int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kTotal = ROWS * kChunks;
  static_assert(kTotal % THREADS == 0, "tile copy does not divide among threads");
  auto copy = [&](int idx) {
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const int src_row = row_of(r);
    const bool ok = src_row >= 0;
    const elem_t* src = ok ? g + (long long)src_row * stride + c * 8 : g;
    cp_async16(tile_chunk_addr<ROWS, D, WGMMA>(sdst, r, c), src, ok);
  };
  if constexpr (ROLLED) {
#pragma unroll 1
    for (int idx = tid; idx < kTotal; idx += THREADS) copy(idx);
  } else {
#pragma unroll
    for (int i = 0; i < kTotal / THREADS; ++i) copy(tid + i * THREADS);
  }
}

// The same for a tile gathered in runs of RUN consecutive rows: tile rows
// [j RUN, (j + 1) RUN) come from source rows run_row(j) + [0, RUN) (the
// drafter's blocks: the backward's query steps, the forward's permuted query
// tile and its gathered own keys). BOUNDED: a negative run_row zero-fills its
// run, and so does each source row at or past `limit`; otherwise every row is
// in bounds. Each thread copies one 16-byte column chunk of rows r0, r0 + P,
// ... as load_tile's fast path does, so a run costs one run_row and a chunk
// an add and the copy; load_tile_rows spent ~50 instructions a chunk on its
// row arithmetic. Random drafter on an H100: dK/dV 1.18 -> 0.90 G
// instructions (the sorted case's 0.88), 3.60 -> 2.94 ms at B2, -10 to -12 %
// at B4 and B8; forward 1.148 -> 1.094 ms.
template <int ROWS, int D, int RUN, int THREADS, bool WGMMA, bool BOUNDED = false, typename RunRow>
__device__ __forceinline__ void load_tile_runs(unsigned sdst, const elem_t* g, long long stride,
                                               RunRow run_row, int tid, int limit = 0) {
  constexpr int kChunks = D / 8;
  constexpr int kPass = THREADS / kChunks;  // rows per pass
  constexpr bool kFastPath =
      THREADS % kChunks == 0 && kPass % 8 == 0 && RUN % kPass == 0 && ROWS % RUN == 0;
  if constexpr (kFastPath) {
    const int c = tid % kChunks;
    const int r0 = tid / kChunks;
    const unsigned d0 = tile_chunk_addr<ROWS, D, WGMMA>(sdst, r0, c);
    const long long step = (long long)kPass * stride;
    // BOUNDED (the forward's, in its producer): rolled over the runs, which
    // unrolled spilled there (D128 t128_128: 4 / 16 bytes).
#pragma unroll(BOUNDED ? 1 : ROWS / RUN)
    for (int j = 0; j < ROWS / RUN; ++j) {
      const int base = run_row(j);
      const bool run_ok = !BOUNDED || base >= 0;
      const elem_t* src = g + (long long)((run_ok ? base : 0) + r0) * stride + c * 8;
#pragma unroll
      for (int i = 0; i < RUN / kPass; ++i) {
        const bool ok = !BOUNDED || (run_ok && base + r0 + i * kPass < limit);
        cp_async16(d0 + (j * RUN + i * kPass) * tile_row_bytes<D, WGMMA>(), ok ? src : g, ok);
        src += step;
      }
    }
  } else {
    auto row_of = [&](int r) {
      const int base = run_row(r / RUN);
      if constexpr (BOUNDED) {
        if (base < 0 || base + r % RUN >= limit) return -1;
      }
      return base + r % RUN;
    };
    load_tile_rows<ROWS, D, THREADS, WGMMA, true>(sdst, g, stride, row_of, tid);
  }
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// Launch order of a (tile, y, z) grid: CTAs of chunk_pairs (y, z) pairs at
// a time run together, so that the K / V (forward) or Q / dO / dQ (dK/dV)
// of those pairs stay in L2, and within a chunk the tile index varies
// slowest, so that the chunk's tile 0 of every pair starts first (callers
// map tile 0 to their heaviest tile). The list scheduling this gives is
// near longest-first.
__device__ __forceinline__ void launch_order(int& tile, int& y, int& z, int chunk_pairs) {
  const int nt = gridDim.x, ny = gridDim.y, nyz = gridDim.y * gridDim.z;
  const int lin = blockIdx.x + nt * (blockIdx.y + ny * blockIdx.z);
  const int cp = imin(chunk_pairs, nyz);
  const int chunk = lin / (nt * cp);
  const int in = lin - chunk * nt * cp;
  const int csize = imin(cp, nyz - chunk * cp);
  tile = in / csize;
  const int yz = chunk * cp + in % csize;
  y = yz % ny;
  z = yz / ny;
}
// (batch, head) pairs per chunk of the forward's launch order: four query
// heads share a key / value head under the drafter's GQA (8 gave the same
// times, 2 none of the gain; session 21).
constexpr int kFwdHeadChunk = 4;

#if KC_MASK == KC_MASK_DRAFTER
// Batch row b's nb drafter blocks in ascending order of (sort anchor, block
// index): order[rank] = block, by THREADS threads, unless they are in order
// already. Returns to every thread whether order now holds a permutation
// other than the identity (false: order untouched, and the caller keeps its
// identity path, also correct, only slower). The sort anchor is the anchor
// clamped to [0, context] plus one; dropped blocks see nothing and sort first
// (0). Used by the forward (its query tiles) and the dK/dV kernel (its query
// steps).
// A counting sort: a histogram of the sort anchors over kRankBuckets buckets
// (monotone in the anchor: dropped blocks alone in the first, the others
// spread over the rest by anchor), its prefix sums, the blocks scattered by
// bucket (shared atomics), then each kept block's rank = its bucket's start +
// the blocks of its bucket with a smaller key, counted, so that the scatter's
// order does not matter. Dropped blocks come first in block order, placed by
// one warp's ballots: every CTA of a batch row sorts on its own and takes the
// rows of its own ranks, so all of them must arrive at the same permutation
// (placed by shared atomics, a dropped block could fall to two CTAs' ranks or
// to none, and its rows were then never written). Five barriers and no dependent
// chain but warp 0's walk of nb / 32 ballots; the bitonic network it replaced
// took ~log2(nb)^2 / 2 dependent shared-memory stages (0.25 ms of the random
// drafter forward's 1.51 on an H200). A bucket holding more than a few times
// its share of the blocks (anchors bunched within a bucket's width, or many
// at or past the context) would make the count quadratic: the order is then
// left as it is (false). scratch: drafter_rank_scratch_bytes(nb) bytes,
// 4-byte aligned; nb <= 65536. Out of line: it runs once per CTA, and the
// kernels of a translation unit then share one copy (NVRTC time).
template <int THREADS>
__device__ __noinline__ bool drafter_rank_blocks(unsigned short* order, unsigned char* scratch,
                                                 const AttentionParams& p, int b, int nb, int tid) {
  const int ctx = imax(p.drafter_context_len, 0);
  const kc_i32* anc = p.drafter_anchor + b * p.drafter_stride_b;
  const kc_i8* kp = p.drafter_keep == nullptr ? nullptr : p.drafter_keep + b * p.drafter_stride_b;
  auto sort_anchor = [&](int i) -> unsigned {
    return (kp == nullptr || kp[i] != 0) ? static_cast<unsigned>(imax(0, imin(anc[i], ctx))) + 1u
                                         : 0u;
  };
  int* const cur = reinterpret_cast<int*>(scratch);  // per bucket: count, start, end
  unsigned* const sa = reinterpret_cast<unsigned*>(cur + kRankBuckets);     // sort anchors
  unsigned short* const slot = reinterpret_cast<unsigned short*>(sa + nb);  // blocks by bucket
  // Kept blocks' sort anchors [1, ctx + 1] over buckets [1, kRankBuckets).
  const unsigned width =
      (static_cast<unsigned>(ctx) + kRankBuckets - 1) / (kRankBuckets - 1);  // >= 1
  auto bucket = [&](unsigned a) -> int {
    return a == 0u ? 0 : 1 + static_cast<int>((a - 1u) / width);
  };
  bool unordered = false;
  for (int k = tid; k < kRankBuckets; k += THREADS) cur[k] = 0;
  for (int i = tid; i < nb; i += THREADS) {
    const unsigned a = sort_anchor(i);
    sa[i] = a;
    // Block indices break ties: the blocks are in order iff every adjacent
    // pair of sort anchors is.
    if (i + 1 < nb && a > sort_anchor(i + 1)) unordered = true;
  }
  if (__syncthreads_or(unordered) == 0) return false;
  for (int i = tid; i < nb; i += THREADS) atomicAdd(&cur[bucket(sa[i])], 1);
  __syncthreads();
  bool bunched = false;
  if (tid < 32) {  // counts -> starts: lane l scans buckets [kPer l, kPer (l + 1))
    constexpr int kPer = kRankBuckets / 32;
    int v[kPer];
    int sum = 0, most = 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      v[k] = cur[tid * kPer + k];
      sum += v[k];
      if (tid * kPer + k > 0) most = imax(most, v[k]);
    }
    int incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, incl, d);
      if (tid >= d) incl += x;
    }
    int run = incl - sum;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      cur[tid * kPer + k] = run;
      run += v[k];
    }
    bunched = __reduce_max_sync(0xffffffffu, most) > imax(64, 4 * (nb / (kRankBuckets - 1) + 1));
  }
  // The verdict travels with the barrier: no thread reads the scratch after
  // it on that path, so the caller may reuse it at once.
  if (__syncthreads_or(bunched)) return false;
  for (int i = tid; i < nb; i += THREADS) {
    const int k = bucket(sa[i]);
    if (k != 0) slot[atomicAdd(&cur[k], 1)] = static_cast<unsigned short>(i);
  }
  if (tid < 32) {  // dropped blocks: ranks [0, dropped) in block order
    int dropped = 0;
    for (int c = 0; c < nb; c += 32) {
      const int i = c + tid;
      const bool drop = i < nb && sa[i] == 0u;
      const unsigned bal = __ballot_sync(0xffffffffu, drop);
      if (drop) order[dropped + __popc(bal & ((1u << tid) - 1u))] = static_cast<unsigned short>(i);
      dropped += __popc(bal);
    }
    if (tid == 0) cur[0] = dropped;  // bucket 0's end (no atomic touched it)
  }
  __syncthreads();  // cur[k] is now bucket k's end
  for (int i = tid; i < nb; i += THREADS) {
    const unsigned a = sa[i];
    const int k = bucket(a);
    if (k == 0) continue;  // placed by the scatter
    const int start = cur[k - 1];
    const int end = cur[k];
    int rank = start;
    for (int s = start; s < end; ++s) {
      const int j = slot[s];
      const unsigned aj = sa[j];
      rank += (aj < a || (aj == a && j < i)) ? 1 : 0;
    }
    order[rank] = static_cast<unsigned short>(i);
  }
  __syncthreads();
  return true;
}
#endif

#if KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
#if KC_MASK == KC_MASK_CAUSAL
constexpr int kWinLeft = -1;
constexpr int kWinRight = 0;
#else
constexpr int kWinLeft = KC_WINDOW_LEFT;
constexpr int kWinRight = KC_WINDOW_RIGHT;
#endif
#endif

}  // namespace attn_fwd
}  // namespace kcache

// KC_OMIT_FWD: the backward's translation unit of a module (codegen.cc
// compiles a backward module as two units, each into an image of its own):
// these helpers without the forward's kernels.
#if !KC_OMIT_FWD
extern "C" __global__ void __launch_bounds__(kcache::attn_fwd::kFwdThreadsAll)
    kcache_attn_fwd(const __grid_constant__ kcache::AttentionParams p) {
  using namespace kcache;
  using namespace kcache::attn_fwd;
  extern __shared__ __align__(1024) unsigned char smem[];

  // kPingpong: the producer warpgroup's threads take part in the prologue's
  // CTA barriers but none of its tid-strided work (their tid is past every
  // range), then leave for their own loop.
  const int tid_real = threadIdx.x;
  const bool producer = kPingpong && tid_real >= kThreads;
  const int tid = producer ? tid_real + (1 << 20) : tid_real;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;  // row within an m16 tile (and +8)
  const int t4 = lane & 3;  // column pair within an n8 tile
  // Heavy query tiles (the last ones, under causal masks and for sorted
  // drafter anchors) start first, four (batch, head) pairs at a time
  // (launch_order). Measured (H200, kernels/NOTES.md, session 21): causal
  // B4 H32 S4096 D128 -2 % against each pair's tiles in turn, whose last
  // heavy tiles started late.
  int mtile, h, b;
  launch_order(mtile, h, b, kFwdHeadChunk);
  mtile = gridDim.x - 1 - mtile;
  const int m0 = mtile * kBM;
  const int hkv = h / (p.num_q_heads / p.num_kv_heads);
  const int mlast = imin(m0 + kBM, p.q_len) - 1;  // last valid row of this tile
  const elem_t* qg = static_cast<const elem_t*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
  const elem_t* kg = static_cast<const elem_t*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h;
  const elem_t* vg = static_cast<const elem_t*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h;
  const int q_len = p.q_len;
  const int kv_len = p.kv_len;
  const int n_kv_tiles = (kv_len + kBN - 1) / kBN;
  (void)n_kv_tiles;

  // wgmma's swizzle atoms need 1024-byte alignment (AttentionSmemBytes
  // reserves the slack).
  const unsigned smem_raw = smem_u32(smem);
  const unsigned sQ = (smem_raw + 1023u) & ~1023u;
  unsigned char* const sbase = smem + (sQ - smem_raw);
  const unsigned sK = sQ + kKOff;
  const unsigned sV = sQ + kVOff;
  unsigned short* tile_list = reinterpret_cast<unsigned short*>(sbase + kListOff);
#if KC_MASK == KC_MASK_DOCUMENT || KC_MASK == KC_MASK_DRAFTER || KC_MASK == KC_MASK_EXPR
  int4* rowdata = reinterpret_cast<int4*>(sbase + kRowOff);
  int* misc = reinterpret_cast<int*>(sbase + kMiscOff);
#endif

  bool gather = false;  // kOwnGather, this tile (below)
#if KC_MASK == KC_MASK_DRAFTER
  // Sorted drafter blocks (kDrafterSort above). The tile's rows come from
  // src_row(r) (-1: past q_len). The order is read before the barrier that
  // follows the row data, and the K/V stages it lives in are loaded only
  // after it; later, a row's query index is recovered from its row data
  // (rowdata[r].z = ctx_len + block * block_size, also for dropped blocks).
  bool permute = false;
  // The order (rank -> block) in the K/V stages, the sort's scratch after it.
  unsigned short* const sorder = reinterpret_cast<unsigned short*>(sbase + kKOff);
  if constexpr (kDrafterSort) {
    constexpr int kBlocksPerTile = kBM / KC_DRAFTER_BLOCK;
    const int nb = p.drafter_num_blocks;
    const int ctx = p.drafter_context_len;
    // It pays when the context spans several key tiles (a guess, not tuned).
    permute = q_len == nb * KC_DRAFTER_BLOCK && nb > kBlocksPerTile && nb <= kSortCap &&
              ctx >= 2 * kBN && ctx >= pow2_ceil(nb);
    if (permute) {
      permute = drafter_rank_blocks<kThreads>(sorder, sbase + kKOff + ((2 * nb + 15) & ~15), p, b,
                                              nb, tid);
    }
  }
  // kOwnGather: this tile's own keys come as one gathered tile, an entry past
  // the key tiles' (so fewer key tiles than the list holds: a kv_len that
  // left none of them empty would otherwise overflow it).
  gather = kOwnGather && permute && n_kv_tiles < kAttnMaxListTiles;
  auto src_row = [&](int r) -> int {
    if constexpr (kDrafterSort) {
      if (permute) {
        constexpr int kBlocksPerTile = kBM / KC_DRAFTER_BLOCK;
        const int rank = mtile * kBlocksPerTile + r / KC_DRAFTER_BLOCK;
        if (rank >= p.drafter_num_blocks) return -1;
        return static_cast<int>(sorder[rank]) * KC_DRAFTER_BLOCK + r % KC_DRAFTER_BLOCK;
      }
    }
    return m0 + r < q_len ? m0 + r : -1;
  };
  if (producer) {
    // Q is the compute threads' copy.
  } else if (permute) {
    if constexpr (kDrafterSort) {  // whole blocks; ranks past the blocks zero-filled
      auto q_run = [&](int j) -> int {
        const int rank = mtile * (kBM / KC_DRAFTER_BLOCK) + j;
        return rank < p.drafter_num_blocks ? static_cast<int>(sorder[rank]) * KC_DRAFTER_BLOCK : -1;
      };
      load_tile_runs<kBM, kDQK, KC_DRAFTER_BLOCK, kThreads, kWgmma, true>(sQ, qg, p.q_stride_s,
                                                                          q_run, tid, q_len);
    }
  } else {
    load_tile<kBM, kDQK>(sQ, qg, p.q_stride_s, m0, q_len, tid);
  }
  cp_async_commit();
#else
  // Q first (the compute threads): its copy overlaps the tile planning below.
  if (!producer) load_tile<kBM, kDQK>(sQ, qg, p.q_stride_s, m0, q_len, tid);
  cp_async_commit();
#endif

  // ------------------------------------------------------------------------
  // The walk over key tiles: iteration i visits tile `first + i` (analytic
  // masks, or list masks past the list's capacity) or tile_list[i].
  // ------------------------------------------------------------------------
  int first = 0;
  int n_iter = 0;
  bool use_list = false;
#if KC_MASK == KC_MASK_NONE
  n_iter = n_kv_tiles;
#elif KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
  const int off = KC_MASK_BOTTOM_RIGHT ? kv_len - q_len : 0;
  {
    const int kv_lo = kWinLeft < 0 ? 0 : imax(0, m0 + off - kWinLeft);
    const int kv_hi = kWinRight < 0 ? kv_len : imin(kv_len, mlast + off + kWinRight + 1);
    if (kv_hi > kv_lo) {
      first = kv_lo / kBN;
      n_iter = (kv_hi + kBN - 1) / kBN - first;
    }
  }
#else
  // List masks: classify every key tile into tile_list[t] (0/1/2), then
  // compact the non-empty ones in place as (t | class << 14).
  use_list = n_kv_tiles <= kAttnMaxListTiles;
#if KC_MASK == KC_MASK_DOCUMENT
  const int* q_ids = p.q_seq_id + b * p.q_seq_id_stride_b;
  const int* kv_ids = p.kv_seq_id + b * p.kv_seq_id_stride_b;
  if (tid == 0) {
    misc[1] = 0x7fffffff;
    misc[2] = -0x7fffffff - 1;
  }
  __syncthreads();
  {
    int lo = 0x7fffffff, hi = -0x7fffffff - 1;
    for (int r = tid; r < kBM; r += kThreads) {
      const int q = m0 + r;
      const int id = q < q_len ? q_ids[q] : 0;
      rowdata[r] = make_int4(id, 0, 0, 0);
      if (q < q_len) {
        lo = imin(lo, id);
        hi = imax(hi, id);
      }
    }
    atomicMin(&misc[1], lo);
    atomicMax(&misc[2], hi);
  }
  __syncthreads();
  if (use_list) {
    const int qmin = misc[1], qmax = misc[2];
    const int t_end = KC_DOC_CAUSAL ? imin(n_kv_tiles, mlast / kBN + 1) : n_kv_tiles;
    for (int t = warp; t < n_kv_tiles; t += kNW) {
      int cls = 0;
      if (t < t_end) {
        int lo = 0x7fffffff, hi = -0x7fffffff - 1;
        for (int c = lane; c < kBN; c += 32) {
          const int kv = t * kBN + c;
          if (kv < kv_len) {
            const int id = kv_ids[kv];
            lo = imin(lo, id);
            hi = imax(hi, id);
          }
        }
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) {
          lo = imin(lo, __shfl_xor_sync(0xffffffffu, lo, s));
          hi = imax(hi, __shfl_xor_sync(0xffffffffu, hi, s));
        }
        if (!(hi < qmin || lo > qmax)) {
          cls = (qmin == qmax && lo == hi && lo == qmin) ? 2 : 1;
          if (KC_DOC_CAUSAL && t * kBN + kBN - 1 > m0) cls = 1;
        }
      }
      if (lane == 0) tile_list[t] = static_cast<unsigned short>(cls);
    }
  }
#elif KC_MASK == KC_MASK_DRAFTER
  const int ctx_len = p.drafter_context_len;
  constexpr int kBlk = KC_DRAFTER_BLOCK;
  static_assert(kBlk > 0, "drafter block size must be positive");
  for (int r = tid; r < kBM; r += kThreads) {
    const int q = src_row(r);  // -1 past q_len
    const int j = q / kBlk;
    int4 rd = make_int4(0, 0, 0, 0);  // visible: [x, y) U [z, w)
    if (q >= 0 && j < p.drafter_num_blocks) {
      const bool keep =
          p.drafter_keep == nullptr || p.drafter_keep[b * p.drafter_stride_b + j] != 0;
      rd.z = rd.w = ctx_len + j * kBlk;  // dropped: empty, but z still names the block
      if (keep) {
        const int a = p.drafter_anchor[b * p.drafter_stride_b + j];
        rd.y = imax(0, imin(a, ctx_len));
        rd.x = KC_DRAFTER_WINDOW > 0 ? imin(imax(a - KC_DRAFTER_WINDOW, 0), rd.y) : 0;
        rd.z = ctx_len + j * kBlk;
        rd.w = KC_DRAFTER_CAUSAL ? ctx_len + q + 1 : ctx_len + (j + 1) * kBlk;
      }
    }
    rowdata[r] = rd;
  }
  __syncthreads();
  if (use_list) {
    const int nrows = mlast - m0 + 1;
    for (int t = tid; t < n_kv_tiles; t += kThreads) {
      const int n0 = t * kBN;
      const int n1 = imin(n0 + kBN, kv_len);
      bool any = false, all = n1 - n0 == kBN;
      // One step per drafter block (rows of a block share their context range).
      for (int r = 0; r < nrows;) {
        const int r_end = imin(nrows, ((m0 + r) / kBlk + 1) * kBlk - m0);
        const int4 f = rowdata[r];
        const int own_hi_any = rowdata[r_end - 1].w;  // causal: the last row sees most
        const bool ctx_any = n0 < f.y && n1 > f.x;
        const bool own_any = !gather && f.z < own_hi_any && n0 < own_hi_any && n1 > f.z;
        const bool ctx_all = n0 >= f.x && n1 <= f.y;
        const bool own_all = !gather && n0 >= f.z && n1 <= f.w;  // f.w: the first row sees least
        any = any || ctx_any || own_any;
        all = all && (ctx_all || own_all);
        r = r_end;
      }
      tile_list[t] = static_cast<unsigned short>(any ? (all ? 2 : 1) : 0);
    }
  }
#elif KC_MASK == KC_MASK_EXPR
#if KC_EXPR_MASK_ROW
  // Read by the partial tiles' visibility after the pipeline's first barrier.
  for (int r = tid; r < kBM; r += kThreads) rowdata[r] = kc_expr_mask_row(b, h, m0 + r, p);
#endif
  if (use_list) {
    // kClassRows class rows per query tile (one unless the classes are the
    // backward's, KC_CLASS_BLOCK_M): a tile is empty or full only if each of
    // its rows' classes says so; rows past q_len have no class row.
    constexpr int kClassRows = kBM / KC_CLASS_BLOCK_M;
    const int class_rows = imin(kClassRows, (q_len - m0 + KC_CLASS_BLOCK_M - 1) / KC_CLASS_BLOCK_M);
    const kc_i8* row = p.tile_class == nullptr
                           ? nullptr
                           : p.tile_class + (KC_EXPR_MASK_READS_B ? b : 0) * p.tile_class_stride_b +
                                 (KC_EXPR_MASK_READS_H ? h : 0) * p.tile_class_stride_h +
                                 mtile * kClassRows * p.tile_class_stride_m;
    for (int t = tid; t < n_kv_tiles; t += kThreads) {
      int c = 1;
      if (row != nullptr) {
        c = static_cast<int>(row[t]);
#pragma unroll
        for (int r = 1; r < kClassRows; ++r) {
          if (r < class_rows && static_cast<int>(row[r * p.tile_class_stride_m + t]) != c) c = 1;
        }
      }
      tile_list[t] = static_cast<unsigned short>(c < 0 ? 1 : (c > 2 ? 1 : c));
    }
  }
#endif
  if (use_list) {
    __syncthreads();
    if (warp == 0) {
      int count = 0;
      for (int base = 0; base < n_kv_tiles; base += 32) {
        const int t = base + lane;
        int c = t < n_kv_tiles ? tile_list[t] : 0;
        if (c == 2 && t * kBN + kBN > kv_len) c = 1;
        const unsigned bal = __ballot_sync(0xffffffffu, c != 0);
        const int pos = count + __popc(bal & ((1u << lane) - 1u));
        __syncwarp();
        if (c != 0) tile_list[pos] = static_cast<unsigned short>(t | (c << 14));
        count += __popc(bal);
        __syncwarp();
      }
      // The gathered own tile last, always partial (its room: the
      // n_kv_tiles bound on `gather` above).
      if (gather && lane == 0) {
        tile_list[count] = static_cast<unsigned short>(kOwnTile | (1 << 14));
      }
      if (gather) ++count;
      if (lane == 0) misc[0] = count;
    }
    __syncthreads();
    n_iter = misc[0];
  } else {
    n_iter = n_kv_tiles;  // every tile, each treated as partial
  }
#endif

  // K and/or V (parts: 1 K, 2 V, 3 both) of key tile t into the stage at
  // (dk, dv), by kLoadThreads threads (ltid: this thread's index among them).
  auto load_kv = [&](int t, unsigned dk, unsigned dv, int ltid, int parts) {
#if KC_MASK == KC_MASK_DRAFTER
    if (kOwnGather && t == kOwnTile) {  // row c: the own key of tile row c's block
      // Block j's own keys: rowdata[].z of its rows (whole blocks: q_len is
      // a multiple of the block when permuted).
      auto own_run = [&](int j) -> int {
        return j * KC_DRAFTER_BLOCK <= mlast - m0 ? rowdata[j * KC_DRAFTER_BLOCK].z : -1;
      };
      if (parts & 1) {
        load_tile_runs<kBN, kDQK, KC_DRAFTER_BLOCK, kLoadThreads, kWgmma, true>(
            dk, kg, p.k_stride_s, own_run, ltid, kv_len);
      }
      if (parts & 2) {
        load_tile_runs<kBN, kDV, KC_DRAFTER_BLOCK, kLoadThreads, kWgmma, true>(
            dv, vg, p.v_stride_s, own_run, ltid, kv_len);
      }
      return;
    }
#endif
    if (parts & 1) load_tile<kBN, kDQK, kLoadThreads>(dk, kg, p.k_stride_s, t * kBN, kv_len, ltid);
    if (parts & 2) load_tile<kBN, kDV, kLoadThreads>(dv, vg, p.v_stride_s, t * kBN, kv_len, ltid);
  };

  // ------------------------------------------------------------------------
  // Prologue of the K/V pipeline: tiles 0 .. kPrefetch - 1, one group each.
  // ------------------------------------------------------------------------
#if KC_WGMMA_HEAD_DIMS
  // Ping-pong: K and V of stage s complete on kfull[s] / vfull[s] once the
  // producer's copies landed (one arrival per producer thread), and are free
  // again on kempty[s] / vempty[s] (one arrival per compute warp) once S /
  // P V of the tile there is waited: K of tile i + 2 can land while P V of
  // tile i still reads V.
  const unsigned bar_kfull = sQ + kBarOff;
  const unsigned bar_vfull = bar_kfull + 16;
  const unsigned bar_kempty = bar_vfull + 16;
  const unsigned bar_vempty = bar_kempty + 16;
  if constexpr (kPingpong) {
    if (tid == 0) {
      for (int i = 0; i < 8; ++i) mbar_init(bar_kfull + 8 * i, i < 4 ? kLoadThreads : kNW);
    }
    __syncthreads();
    if (producer) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
      const int ptid = tid_real - kThreads;
      // Tile i sits in stage i & 1.
      for (int i = 0; i < n_iter; ++i) {
        const int st = i & 1;
        const int t = use_list ? (tile_list[i] & 0x3fff) : first + i;
        // K(i) after V(i - 1): a thread's kfull arrival then also means
        // that its V(i - 1) landed (the compute loop relies on it).
        if (i >= 2) mbar_wait(bar_kempty + 8 * st, ((i >> 1) - 1) & 1);
        load_kv(t, sK + st * kKBytes, sV + st * kVBytes, ptid, 1);
        mbar_arrive_cp_async(bar_kfull + 8 * st);
        if (i >= 2) mbar_wait(bar_vempty + 8 * st, ((i >> 1) - 1) & 1);
        load_kv(t, sK + st * kKBytes, sV + st * kVBytes, ptid, 2);
        mbar_arrive_cp_async(bar_vfull + 8 * st);
      }
      cp_async_wait<0>();
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
  } else
#endif
#pragma unroll
    for (int s = 0; s < kPrefetch; ++s) {
      if (s < n_iter) {
        load_kv(use_list ? (tile_list[s] & 0x3fff) : first + s, sK + s * kKBytes, sV + s * kVBytes,
                tid, 3);
      }
      cp_async_commit();
    }

  // Per-lane ldmatrix addressing. Row r's swizzle key is r & 7, which is
  // lane & 7 for every fragment below, so chunk c of a lane's row sits at
  // ((c ^ (lane & 7)) << 4) = (c << 4) ^ key: one XOR with a constant per use.
  const int l7 = lane & 7;
  const unsigned qkey = static_cast<unsigned>(l7 ^ (lane >> 4)) << 4;         // Q (A), V (B, trans)
  const unsigned kkey = static_cast<unsigned>(l7 ^ ((lane >> 3) & 1)) << 4;   // K (B)
  const unsigned q_row_addr0 = sQ + (warp * kWM + (lane & 15)) * (kDQK * 2);  // + mt * 16 rows
  const unsigned k_lane_base = sK + (l7 + ((lane >> 4) << 3)) * (kDQK * 2);
  const unsigned v_lane_base = sV + (l7 + (((lane >> 3) & 1) << 3)) * (kDV * 2);

  unsigned qreg[kQInRegs ? kMT : 1][kQInRegs ? kKQ : 1][4];
  if constexpr (kQInRegs) {
    cp_async_wait<kPrefetch>();  // the Q group
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int kk = 0; kk < kKQ; ++kk) {
        ldsm_x4(q_row_addr0 + mt * (16 * kDQK * 2) + ((kk * 32) ^ qkey), qreg[mt][kk][0],
                qreg[mt][kk][1], qreg[mt][kk][2], qreg[mt][kk][3]);
      }
    }
  }

  float o[kMT][kDT][4];
  float m_run[kMT][2];
  float l_run[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      m_run[mt][hh] = neg_inf();
      l_run[mt][hh] = 0.f;
    }
  }
  const int row_base = m0 + warp * kWM + g;  // + mt * 16 + hh * 8
#if KC_MASK == KC_MASK_DRAFTER
  // Query index of the tile's row r where the rows are permuted (q_len: none).
  auto permuted_q = [&](int r) -> int {
    return r <= mlast - m0 ? rowdata[r].z - ctx_len + r % KC_DRAFTER_BLOCK : q_len;
  };
#endif
  // Query index of this thread's row (mt, hh): drafter rows may be permuted.
  auto q_of = [&](int mt, int hh) -> int {
#if KC_MASK == KC_MASK_DRAFTER
    if (kDrafterSort && permute) {
      const int r = warp * kWM + mt * 16 + g + hh * 8;
      return permuted_q(r);
    }
#endif
    return row_base + mt * 16 + hh * 8;
  };
#if KC_SCORE_MOD == KC_SCORE_ALIBI
  const float alibi_slope = p.alibi_slopes[h];
#endif

  // ---- the pieces of one iteration (lambdas, inlined) ----------------------
  constexpr int kElems = kMT * kNT * 4;
  constexpr int kVW = (kElems + 31) / 32;

  // Tile index and CTA-level class (0 empty, 1 partial, 2 full) of iteration i.
  auto tile_of = [&](int i, int& tile, int& cls) {
    if (use_list) {
      const int e = tile_list[i];
      tile = e & 0x3fff;
      cls = e >> 14;
    } else {
      tile = first + i;
#if KC_MASK == KC_MASK_NONE
      cls = tile * kBN + kBN <= kv_len ? 2 : 1;
#elif KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
      const int n0 = tile * kBN;
      const bool full = n0 + kBN <= kv_len && (kWinLeft < 0 || n0 >= mlast + off - kWinLeft) &&
                        (kWinRight < 0 || n0 + kBN - 1 <= m0 + off + kWinRight);
      cls = full ? 2 : 1;
#else
      cls = 1;
#endif
    }
  };

  // Keys a real tile may show: with the own keys gathered, those past the
  // context are the own tile's alone (a tile straddling the context's end
  // would count them twice).
#if KC_MASK == KC_MASK_DRAFTER
  const int kv_end = gather ? imin(kv_len, ctx_len) : kv_len;
#else
  const int kv_end = kv_len;
#endif
  // Interval masks: a row sees at most two key intervals below kv_end (the
  // drafter's [x, y) and [z, w) of its row data; causal and sliding windows
  // one, from the row's query index). With whole 32-bit words of 8 n8 tiles
  // each, a row's bits come from interval arithmetic: per column parity c,
  // the n8 tiles whose column n0 + 8 nt + 2 t4 + c falls in an interval are
  // one run of bits, then spread to the layout below (bit (mt kNT + nt) 4 +
  // hh 2 + c). A quarter of the per-element test's instructions, which were
  // a fifth of the drafter forward's code (NVRTC time).
  constexpr bool kSpans = kNT % 8 == 0 && kNT < 32 &&
                          (KC_MASK == KC_MASK_DRAFTER || KC_MASK == KC_MASK_CAUSAL ||
                           KC_MASK == KC_MASK_SLIDING_WINDOW);
  static_assert(!kOwnGather || kSpans, "the gathered own tile's bits are spans");
  // own: the gathered own tile (kOwnGather), whose row r sees one run of
  // columns, those of its own block: from (r / kBlk) kBlk, kBlk of them
  // (causal: r % kBlk + 1), none for dropped blocks and rows past q_len
  // (z == w), and only keys below kv_len (own key z + column % kBlk).
  auto span_bits = [&](int n0, unsigned(&vbits)[kVW], bool own) {
    // n8 tiles nt in [0, kNT) with lo <= base + 8 nt < hi, as bits. The
    // bounds are clamped to the tile's columns before any subtraction, so
    // that no length the contract allows (int32) overflows.
    auto run = [](int base, int lo, int hi) -> unsigned {
      const int a = (imin(imax(lo, base), base + 8 * kNT) - base + 7) >> 3;
      const int e = (imin(imax(hi, base), base + 8 * kNT) - base + 7) >> 3;
      return ((1u << e) - 1u) & ~((1u << a) - 1u);
    };
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
#if KC_MASK == KC_MASK_DRAFTER
        const int r = warp * kWM + mt * 16 + g + hh * 8;
        int4 iv = rowdata[r];
        if (kOwnGather && own) {
          constexpr int kBlk = KC_DRAFTER_BLOCK;
          const int lo = r - r % kBlk;
          int len = iv.z < iv.w ? (KC_DRAFTER_CAUSAL ? r % kBlk + 1 : kBlk) : 0;
          len = imin(len, imax(0, kv_len - iv.z));
          iv = make_int4(lo, lo + len, 0, 0);
        }
#elif KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
        // kv - (q + off) within [-left, right]; no bound: the int range.
        const int q = row_base + mt * 16 + hh * 8;
        const int4 iv = make_int4(kWinLeft >= 0 ? q + off - kWinLeft : -0x7fffffff - 1,
                                  kWinRight >= 0 ? q + off + kWinRight + 1 : 0x7fffffff, 0, 0);
#else
        const int4 iv = make_int4(0, 0, 0, 0);
#endif
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int base = n0 + 2 * t4 + c;
          const unsigned m = (run(base, iv.x, iv.y) | run(base, iv.z, iv.w)) &
                             run(base, base, kOwnGather && own ? base + 8 * kNT : kv_end);
#pragma unroll
          for (int w8 = 0; w8 < kNT / 8; ++w8) {
            // 8 bits -> bits 0, 4, ..., 28.
            unsigned x = (m >> (8 * w8)) & 0xffu;
            x = (x | (x << 12)) & 0x000f000fu;
            x = (x | (x << 6)) & 0x03030303u;
            x = (x | (x << 3)) & 0x11111111u;
            vbits[(mt * kNT) / 8 + w8] |= x << (hh * 2 + c);
          }
        }
      }
    }
  };
  // Visibility of a partial tile, per element, before any MMA: bits of this
  // thread's elements. Returns the warp's class: 0 when none of its rows
  // sees the tile (mma.sync skips it; wgmma, collective over the warpgroup,
  // takes part in the MMAs but skips the softmax and adds P = 0), 2 when all
  // see all of it.
  auto visibility = [&](int n0, unsigned(&vbits)[kVW]) -> int {
#pragma unroll
    for (int w = 0; w < kVW; ++w) vbits[w] = 0u;
    if (kSpans) {
      const bool own = kOwnGather && gather && n0 == kOwnTile * kBN;
      span_bits(own ? 0 : n0, vbits, own);
    } else {
      // Row data of this thread's rows (list masks that need it).
#if KC_MASK_ROW_DATA
      int4 rd[kMT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) rd[mt][hh] = rowdata[warp * kWM + mt * 16 + g + hh * 8];
      }
#endif
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int kv = n0 + nt * 8 + 2 * t4 + c;
#if KC_MASK == KC_MASK_DOCUMENT
          const int kv_id = kv < kv_len ? kv_ids[kv] : 0;
#endif
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int q = row_base + mt * 16 + hh * 8;
              bool vis = kv < kv_end;
#if KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
              // kv - (q + off) within [-left, right]; written as bounds on kv.
              if (kWinLeft >= 0) vis = vis && kv >= q + off - kWinLeft;
              if (kWinRight >= 0) vis = vis && kv <= q + off + kWinRight;
#elif KC_MASK == KC_MASK_DOCUMENT
              vis = vis && kv_id == rd[mt][hh].x && (!KC_DOC_CAUSAL || kv <= q);
#elif KC_MASK == KC_MASK_DRAFTER
              vis = vis && ((kv >= rd[mt][hh].x && kv < rd[mt][hh].y) ||
                            (kv >= rd[mt][hh].z && kv < rd[mt][hh].w));
#elif KC_MASK == KC_MASK_EXPR && KC_EXPR_MASK_ROW
              vis = vis && kc_expr_mask_rd(rd[mt][hh], b, h, q, kv, p);
#elif KC_MASK == KC_MASK_EXPR
              vis = vis && kc_expr_mask(b, h, q, kv, p);
#endif
              (void)q;
              const int bit = (mt * kNT + nt) * 4 + hh * 2 + c;
              if (vis) vbits[bit >> 5] |= 1u << (bit & 31);
            }
          }
        }
      }
    }
    bool any = false, all = true;
#pragma unroll
    for (int w = 0; w < kVW; ++w) {
      const unsigned full = (w + 1) * 32 <= kElems ? 0xffffffffu : (1u << (kElems - w * 32)) - 1u;
      any = any || vbits[w] != 0u;
      all = all && vbits[w] == full;
    }
    any = __any_sync(0xffffffffu, any);
    all = __all_sync(0xffffffffu, all);
    const int wcls = any ? (all ? 2 : 1) : 0;
    return wcls;
  };

  // Score modification (to the log2 domain unless folded) and the mask.
  auto score_and_mask = [&](float(&s)[kMT][kNT][4], int n0, int wcls, const unsigned(&vbits)[kVW]) {
    (void)n0;
#if KC_SCORE_MOD != KC_SCORE_NONE
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = q_of(mt, e >> 1);
          const int kv = n0 + nt * 8 + 2 * t4 + (e & 1);
          float x = s[mt][nt][e] * kScale;
#if KC_SCORE_MOD == KC_SCORE_SOFTCAP
          x = KC_SOFTCAP * tanhf(x * (1.f / KC_SOFTCAP));
          (void)q;
          (void)kv;
#elif KC_SCORE_MOD == KC_SCORE_ALIBI
          x += alibi_slope * static_cast<float>(kv - q);
#elif KC_SCORE_MOD == KC_SCORE_EXPR
          x = kc_expr_score(x, b, h, q, kv, p);
#endif
          s[mt][nt][e] = x * kLog2e;
        }
      }
    }
#endif
    if (wcls == 1) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int bit = (mt * kNT + nt) * 4 + e;
            if (!((vbits[bit >> 5] >> (bit & 31)) & 1u)) s[mt][nt][e] = neg_inf();
          }
        }
      }
    }
  };

  // Online softmax in the log2 domain: S -> P in place; alpha rescales O.
  // Returns whether O must be rescaled by alpha (false: every alpha is 1).
  auto softmax = [&](float(&s)[kMT][kNT][4], float(&alpha)[kMT][2]) -> bool {
    float mx[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float m = neg_inf();
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          m = fmaxf(m, fmaxf(s[mt][nt][hh * 2], s[mt][nt][hh * 2 + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        mx[mt][hh] = m * kMul;
      }
    }
    bool rescale = true;
    if constexpr (kRescaleSlack > 0) {
      bool grow = false;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) grow |= mx[mt][hh] > m_run[mt][hh] + kRescaleSlack;
      }
      rescale = __any_sync(0xffffffffu, grow);
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float m_new = rescale ? fmaxf(m_run[mt][hh], mx[mt][hh]) : m_run[mt][hh];
        // A row with nothing visible yet keeps m = -inf; subtract 0 then,
        // so that exp2 gives 0 rather than NaN.
        const float m_use = m_new == neg_inf() ? 0.f : m_new;
        alpha[mt][hh] = rescale ? exp2_approx(m_run[mt][hh] - m_use) : 1.f;
        m_run[mt][hh] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float pv = exp2_approx(fmaf(s[mt][nt][hh * 2 + c], kMul, -m_use));
            s[mt][nt][hh * 2 + c] = pv;
            sum += pv;
          }
        }
        l_run[mt][hh] = rescale ? l_run[mt][hh] * alpha[mt][hh] + sum : l_run[mt][hh] + sum;
      }
    }
    return rescale;
  };

  auto rescale_o = [&](const float(&alpha)[kMT][2]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        o[mt][dt][0] *= alpha[mt][0];
        o[mt][dt][1] *= alpha[mt][0];
        o[mt][dt][2] *= alpha[mt][1];
        o[mt][dt][3] *= alpha[mt][1];
      }
    }
  };

  // K and V of iteration ip into stage st.
  auto prefetch = [&](int ip, int st) {
    load_kv(use_list ? (tile_list[ip] & 0x3fff) : first + ip, sK + st * kKBytes, sV + st * kVBytes,
            tid, 3);
  };

  // mma.sync: S = Q K^T and O += P V for the tile in `stage`.
  auto qk_mma_sync = [&](float(&s)[kMT][kNT][4], int stage) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
      }
    }
    const unsigned k_base = k_lane_base + stage * kKBytes;
#pragma unroll
    for (int kk = 0; kk < kKQ; ++kk) {
      unsigned qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mt][e] = qreg[mt][kk][e];
        } else {
          ldsm_x4(q_row_addr0 + mt * (16 * kDQK * 2) + ((kk * 32) ^ qkey), qa[mt][0], qa[mt][1],
                  qa[mt][2], qa[mt][3]);
        }
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        unsigned b0, b1, b2, b3;
        ldsm_x4(k_base + np * 16 * (kDQK * 2) + ((kk * 32) ^ kkey), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma16816(s[mt][2 * np], qa[mt], b0, b1);
          mma16816(s[mt][2 * np + 1], qa[mt], b2, b3);
        }
      }
    }
  };
  auto pv_mma_sync = [&](float(&s)[kMT][kNT][4], int stage) {
    const unsigned v_base = v_lane_base + stage * kVBytes;
#pragma unroll
    for (int kk = 0; kk < kKV; ++kk) {
      unsigned pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        unsigned b0, b1, b2, b3;
        ldsm_x4_t(v_base + kk * 16 * (kDV * 2) + ((dp * 32) ^ qkey), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma16816(o[mt][2 * dp], pa[mt], b0, b1);
          mma16816(o[mt][2 * dp + 1], pa[mt], b2, b3);
        }
      }
    }
  };

#if KC_WGMMA_HEAD_DIMS
  // Broadcast from lane 0: ptxas then knows the warpgroup is warp-uniform and keeps
  // Q's descriptor in uniform registers, instead of rebuilding it in vector registers
  // and moving it over (R2UR) before every wgmma.
  const int wg_uniform = __shfl_sync(0xffffffffu, warp >> 2, 0);
  // wgmma: S = Q K^T issued (not waited) for the tile in `stage`.
  auto qk_wgmma = [&](float(&s)[kMT][kNT][4], int stage) {
    // Q rows of this warpgroup: [D/64][kBM][64] -> rows 64 * (warp / 4).
    const unsigned q_wg = sQ + wg_uniform * (64 * 128);
    const unsigned long long dq0 = smem_desc(q_wg, 16, 1024);
    const unsigned long long dk0 = smem_desc(sK + stage * kKBytes, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKQ; ++kk) {
      // k16 step kk: 64-column block kk / 4, 32-byte offset (kk % 4) in it.
      const unsigned long long dq = dq0 + ((((kk >> 2) * kBM * 128) + (kk & 3) * 32) >> 4);
      const unsigned long long dk = dk0 + ((((kk >> 2) * kBN * 128) + (kk & 3) * 32) >> 4);
      wgmma_ss(s[0], dq, dk, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  auto pack_p = [&](const float(&s)[kMT][kNT][4], unsigned(&pa)[kKV][4]) {
#pragma unroll
    for (int kk = 0; kk < kKV; ++kk) {
      pa[kk][0] = pack2(s[0][2 * kk][0], s[0][2 * kk][1]);
      pa[kk][1] = pack2(s[0][2 * kk][2], s[0][2 * kk][3]);
      pa[kk][2] = pack2(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
      pa[kk][3] = pack2(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
    }
  };
  // O += P V issued (not waited). V: [D/64][kBN][64] read N-major
  // (transposed): LBO steps 64 columns of d, SBO steps 8 keys. P is packed
  // before the first wgmma: registers written between wgmmas would make
  // ptxas insert a warpgroup.arrive before each one.
  auto pv_wgmma = [&](const unsigned(&pa)[kKV][4], int stage) {
    const unsigned long long dv0 = smem_desc(sV + stage * kVBytes, kBN * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKV; ++kk) wgmma_rs(o[0], pa[kk], dv0 + ((kk * 16 * 128) >> 4));
    wgmma_commit();
  };
  // P as the A operand of P V: zeros when this warp sees none of the tile.
  auto zero_p = [&](unsigned(&pa)[kKV][4]) {
#pragma unroll
    for (int kk = 0; kk < kKV; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
  };
  // One key tile's masked online softmax (O rescaled to match), packed as P.
  auto softmax_to_p = [&](float(&s)[kMT][kNT][4], float(&alpha)[kMT][2], unsigned(&pa)[kKV][4],
                          int n0, int wcls, const unsigned(&vbits)[kVW]) {
    if (wcls != 0) {
      score_and_mask(s, n0, wcls, vbits);
      if (softmax(s, alpha)) rescale_o(alpha);
      pack_p(s, pa);
    } else {
      zero_p(pa);
    }
  };
#endif

  // ---- epilogue: O = acc / l (0 where nothing was visible), LSE ----------
  // Run after the walk (below); lambdas because written out there the direct
  // path compiled with a branch inverted, and the measured SASS is kept.
  auto o_base = [&]() { return static_cast<elem_t*>(p.o) + b * p.o_stride_b + h * p.o_stride_h; };
  // The row sum of this thread's row (mt, hh) over its quad.
  auto row_l = [&](int mt, int hh) {
    float l = l_run[mt][hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    return l;
  };
  auto write_lse = [&](int q, int mt, int hh, float l) {
#if KC_RETURN_LSE
    if (t4 == 0 && p.lse != nullptr) {
      p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q] =
          l > 0.f ? (m_run[mt][hh] + log2f(l)) * kLn2 : neg_inf();
    }
#else
    (void)q, (void)mt, (void)hh, (void)l;
#endif
  };
  auto write_out = [&]() {
    elem_t* og = o_base();
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float l = row_l(mt, hh);
        const int q = q_of(mt, hh);
        if (q < q_len) {
          const float inv = l > 0.f ? 1.f / l : 0.f;
          unsigned* orow = reinterpret_cast<unsigned*>(og + q * p.o_stride_s + 2 * t4);
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt) {
            orow[dt * 4] = pack2(o[mt][dt][hh * 2] * inv, o[mt][dt][hh * 2 + 1] * inv);
          }
          write_lse(q, mt, hh, l);
        }
      }
    }
  };

#if KC_WGMMA_HEAD_DIMS
  // kOStage (above): this warp's 16 rows through its own rows of the Q tile.
  auto write_out_staged = [&]() {
    elem_t* og = o_base();
    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float l = row_l(0, hh);
      inv[hh] = l > 0.f ? 1.f / l : 0.f;
      const int q = q_of(0, hh);
      if (q < q_len) write_lse(q, 0, hh, l);
    }
    // Lane L addresses row L & 15 of the warp's 16, chunk dt + L / 16:
    // matrices (rows 0-7, dt), (8-15, dt), (0-7, dt + 1), (8-15, dt + 1).
    const int r_st = warp * 16 + (lane & 15);
#pragma unroll
    for (int dt = 0; dt < kDT; dt += 2) {
      stsm_x4(tile_chunk_addr<kBM, kDQK, true>(sQ, r_st, dt + (lane >> 4)),
              pack2(o[0][dt][0] * inv[0], o[0][dt][1] * inv[0]),
              pack2(o[0][dt][2] * inv[1], o[0][dt][3] * inv[1]),
              pack2(o[0][dt + 1][0] * inv[0], o[0][dt + 1][1] * inv[0]),
              pack2(o[0][dt + 1][2] * inv[1], o[0][dt + 1][3] * inv[1]));
    }
    __syncwarp();  // each warp reads back only its own rows
    constexpr int kRowChunks = kDV / 8;
    constexpr int kRowsPerPass = 32 / kRowChunks;
    const int c = lane % kRowChunks;
#pragma unroll
    for (int i = 0; i < 16 / kRowsPerPass; ++i) {
      const int r = warp * 16 + i * kRowsPerPass + lane / kRowChunks;
      int q = m0 + r;
#if KC_MASK == KC_MASK_DRAFTER
      if (kDrafterSort && permute) q = permuted_q(r);
#endif
      const uint4 v = lds_u4(tile_chunk_addr<kBM, kDQK, true>(sQ, r, c));
      if (q < q_len) stg_u4(og + q * p.o_stride_s + c * 8, v);
    }
  };
#endif

#if KC_WGMMA_HEAD_DIMS
  if constexpr (kPingpong) {
    // Named barriers kBarTurn + w order the warpgroups' wgmma issues:
    // warpgroup w waits on its own, then lets the next go (arrive on w + 1's,
    // round robin; two warpgroups take part in each, kTurnThreads). Warpgroup
    // 0 starts; the last arrival of the last warpgroup is skipped so that
    // none is left pending at exit. kBarCompute: the compute warps alone.
    const int wg = warp >> 2;
    // (Written out at each use, not held in registers: the two-warpgroup
    // build then compiles as it did before three existed.)
    auto next_turn = [&]() { return kNWG == 2 ? 2 - wg : kBarTurn + (wg + 1) % kNWG; };
    cp_async_wait<0>();  // Q
    fence_proxy_async();
    named_bar_sync(kBarCompute, kThreads);  // the compute warps: Q landed
    // Turn i of a warpgroup issues S of tile i and then P V of tile i - 1;
    // it waits for S alone (wgmma groups complete in order), so the softmax
    // of tile i runs under that P V, and O is rescaled once P V is waited.
    // Tile 0's turn has no P V and one more turn issues the last one, both
    // outside the loop: a wgmma under a branch serializes them all (C7518).
    // Measured (H200, kernels/NOTES.md, session 20): causal B4 H32 S4096
    // D128 1.11-1.17 -> 0.98-1.08 ms, no mask 2.24-2.26 -> 1.95-2.02,
    // drafter -8..-10 %, against the copies on the compute warps and a turn
    // per GEMM.
    unsigned pa_prev[kKV][4];  // P of the tile before, for the next turn's P V
    auto tile_front = [&](int i, int& n0, int& wcls, unsigned(&vbits)[kVW]) {
      // K of tile i landed, and V of tile i - 1 with it (the producer
      // issues V(i - 1) before K(i)).
      mbar_wait(bar_kfull + 8 * (i & 1), (i >> 1) & 1);
      fence_proxy_async();  // the producer's cp.async writes -> this thread's wgmma
      int tile, cls;
      tile_of(i, tile, cls);
      n0 = tile * kBN;
      wcls = cls == 2 ? 2 : visibility(n0, vbits);
    };
    // S waited: K of tile i is free.
    auto release_k = [&](int i) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_kempty + 8 * (i & 1));
    };
    if (n_iter > 0 && wg == kNWG - 1) named_bar_arrive(kBarTurn, kTurnThreads);
    if (n_iter > 0) {
      int n0, wcls;
      unsigned vbits[kVW];
      tile_front(0, n0, wcls, vbits);
      float s[kMT][kNT][4];
      float alpha[kMT][2];
      named_bar_sync(kBarTurn + wg, kTurnThreads);
      qk_wgmma(s, 0);
      named_bar_arrive(next_turn(), kTurnThreads);
      wgmma_wait<0>();
      fence_regs(s[0]);
      release_k(0);
      softmax_to_p(s, alpha, pa_prev, n0, wcls, vbits);  // O is 0: its rescale is moot
    }
    for (int i = 1; i < n_iter; ++i) {
      const int stage = i & 1;
      int n0, wcls;
      unsigned vbits[kVW];
      tile_front(i, n0, wcls, vbits);
      float s[kMT][kNT][4];
      float alpha[kMT][2];
      named_bar_sync(kBarTurn + wg, kTurnThreads);
      qk_wgmma(s, stage);
      pv_wgmma(pa_prev, stage ^ 1);
      named_bar_arrive(next_turn(), kTurnThreads);
      wgmma_wait<1>();
      fence_regs(s[0]);
      release_k(i);
      // P stays in s until P V(i - 1) is waited: the compiler sees pa_prev
      // dead once the wgmma that reads it asynchronously is issued, so
      // packing before the wait could reuse its registers (ptxas then
      // serializes every wgmma, C7513).
      bool rescale = false;
      if (wcls != 0) {
        score_and_mask(s, n0, wcls, vbits);
        rescale = softmax(s, alpha);
      }
      wgmma_wait<0>();
      fence_regs(o[0]);
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_vempty + 8 * (stage ^ 1));  // V of tile i - 1 is free
      if (rescale) rescale_o(alpha);
      if (wcls != 0) {
        pack_p(s, pa_prev);
      } else {
        zero_p(pa_prev);
      }
    }
    if (n_iter > 0) {  // the last tile's P V
      const int last = n_iter - 1;
      mbar_wait(bar_vfull + 8 * (last & 1), (last >> 1) & 1);
      fence_proxy_async();
      named_bar_sync(kBarTurn + wg, kTurnThreads);
      pv_wgmma(pa_prev, last & 1);
      if (kNWG == 2 ? wg == 0 : wg != kNWG - 1)
        named_bar_arrive(next_turn(), kTurnThreads);  // none left pending at exit
      wgmma_wait<0>();
      fence_regs(o[0]);
    }
  } else
#endif
      if constexpr (!kOverlap) {
    // Stage of iteration i and of the tile prefetched in it (i + kPrefetch).
    int stage = 0;
    int pstage = kPrefetch;
    for (int i = 0; i < n_iter; ++i) {
      if constexpr (kStages == 2) {
        stage = i & 1;
        pstage = stage ^ 1;
      }
      cp_async_wait<kPrefetch - 1>();
#if KC_WGMMA_HEAD_DIMS
      if constexpr (kWgmma) fence_proxy_async();  // cp.async writes -> wgmma reads
#endif
      __syncthreads();
      if (i + kPrefetch < n_iter) prefetch(i + kPrefetch, pstage);
      cp_async_commit();

      int tile, cls;
      tile_of(i, tile, cls);
      const int n0 = tile * kBN;
      unsigned vbits[kVW];
      const int wcls = cls == 2 ? 2 : visibility(n0, vbits);
      if (kWgmma || wcls != 0) {
        float s[kMT][kNT][4];
        float alpha[kMT][2];
#if KC_WGMMA_HEAD_DIMS
        if constexpr (kWgmma) {
          qk_wgmma(s, stage);
          wgmma_wait<0>();
          fence_regs(s[0]);
          unsigned pa[kKV][4];
          softmax_to_p(s, alpha, pa, n0, wcls, vbits);
          pv_wgmma(pa, stage);
          wgmma_wait<0>();
          fence_regs(o[0]);
        } else
#endif
        {
          qk_mma_sync(s, stage);
          score_and_mask(s, n0, wcls, vbits);
          if (softmax(s, alpha)) rescale_o(alpha);
          pv_mma_sync(s, stage);
        }
      }
      if constexpr (kStages != 2) {
        stage = stage + 1 == kStages ? 0 : stage + 1;
        pstage = pstage + 1 == kStages ? 0 : pstage + 1;
      }
    }
  } else {
#if KC_WGMMA_HEAD_DIMS
    // sm_90a, 3+ stages: softmax of tile i overlaps the P V wgmma of tile
    // i - 1 (FlashAttention-3's intra-warpgroup pipelining). O is rescaled
    // once that wgmma is done; the stage of tile i - 1 stays resident until
    // then, hence a prefetch distance of kStages - 2.
    unsigned pa[kKV][4];
    int stage = 0;
    int pstage = kPrefetch;
    int prev_stage = 0;
    for (int i = 0; i < n_iter; ++i) {
      cp_async_wait<kPrefetch - 1>();
      fence_proxy_async();
      __syncthreads();
      if (i + kPrefetch < n_iter) prefetch(i + kPrefetch, pstage);
      cp_async_commit();

      int tile, cls;
      tile_of(i, tile, cls);
      const int n0 = tile * kBN;
      unsigned vbits[kVW];
      const int wcls = cls == 2 ? 2 : visibility(n0, vbits);
      float s[kMT][kNT][4];
      float alpha[kMT][2];
      qk_wgmma(s, stage);
      if (i > 0) {
        pv_wgmma(pa, prev_stage);
        wgmma_wait<1>();  // S of tile i; P V of tile i - 1 may still run
      } else {
        wgmma_wait<0>();
      }
      fence_regs(s[0]);
      bool rescale = false;
      if (wcls != 0) {
        score_and_mask(s, n0, wcls, vbits);
        rescale = softmax(s, alpha);
      }
      if (i > 0) {
        wgmma_wait<0>();
        fence_regs(o[0]);
      }
      if (wcls != 0) {
        if (rescale) rescale_o(alpha);
        pack_p(s, pa);
      } else {
        zero_p(pa);
      }
      prev_stage = stage;
      stage = stage + 1 == kStages ? 0 : stage + 1;
      pstage = pstage + 1 == kStages ? 0 : pstage + 1;
    }
    if (n_iter > 0) {
      pv_wgmma(pa, prev_stage);
      wgmma_wait<0>();
      fence_regs(o[0]);
    }
#endif
  }
  cp_async_wait<0>();
#if KC_WGMMA_HEAD_DIMS
  if constexpr (kOStage) {
    if (((reinterpret_cast<unsigned long long>(o_base()) | (p.o_stride_s * sizeof(elem_t))) & 15) ==
        0) {
      write_out_staged();
      return;
    }
  }
#endif
  write_out();
}
#endif  // !KC_OMIT_FWD

#if KC_MASK == KC_MASK_EXPR
namespace kcache {
namespace attn_fwd {
// Tile classification for expression masks: for each (batch, head, query
// tile of BM rows) writes one byte per key tile of BN into p.tile_class (0
// empty, 1 partial, 2 full). Rows past q_len and keys past kv_len are
// ignored (the kernels bound them themselves). Grid (ceil(q_len / BM),
// num_q_heads, batch), 128 threads; the backward's tiles use it too.
//
// Cost (issue 28): a mask that does not read h (b) is classified for
// h = 0 (b = 0) only and every reader takes that row (KC_EXPR_MASK_READS_*;
// the other CTAs share its tiles; classify_expr_tiles).
constexpr int kClassifySub = 8;  // sub-block side of the second interval pass

// The generated interval evaluation kc_expr_mask_tile settles most tiles
// (empty or full) in one evaluation over the whole tile. A tile it cannot
// settle is cut by one warp (settle_expr_tile) into kClassifySub-square
// sub-blocks, 32 interval evaluations at a time: over fewer rows and keys the
// intervals are tight (a `%` whose range does not wrap, a comparison near
// the diagonal), so most sub-blocks settle, and one settled empty with one
// settled full already make the tile partial. Only sub-blocks still unsettled
// evaluate kc_expr_mask per element, two elements a lane, until the tile is
// seen to be partial. Before this pass a partial tile was scanned element by
// element from its first row: 87 us for the 48x48 neighbourhood mask's 324
// tiles (H200, 2026-12-02), most of it in tiles whose first rows see nothing.
#if KC_EXPR_MASK_TILE
// One out-of-line copy of the generated interval evaluation for both passes
// below: each inlined copy costs NVRTC time (the drafter expression's module
// took 3.6 s of CPU with it inlined in an unrolled loop, 2.2 s before the
// second pass), and a call is nothing beside the evaluation.
__device__ __noinline__ int classify_interval(int b, int h, int q0, int q1, int kv0, int kv1,
                                              const AttentionParams& p) {
  return kc_expr_mask_tile(b, h, q0, q1, kv0, kv1, p);
}
#endif

#if KC_EXPR_MASK_TILE
// A tile the interval evaluation over the whole of it left open (class 1), by
// one warp; returns its class.
__device__ __forceinline__ int settle_expr_tile(const AttentionParams& p, int b, int h, int m0,
                                                int m1, int n0, int n1, int lane) {
  constexpr int kSub = kClassifySub;
  const int sr = (m1 - m0 + kSub) / kSub, sc = (n1 - n0 + kSub) / kSub;
  const int ns = sr * sc;
  bool seen_t = false, seen_f = false;
#pragma unroll 1
  for (int s0 = 0; s0 < ns; s0 += 32) {
    const int s = s0 + lane;
    const bool live = s < ns;
    int sc_ = 0;
    if (live) {
      const int r0 = m0 + (s / sc) * kSub, c0 = n0 + (s % sc) * kSub;
      sc_ = classify_interval(b, h, r0, imin(r0 + kSub - 1, m1), c0, imin(c0 + kSub - 1, n1), p);
    }
    seen_t = seen_t || __any_sync(0xffffffffu, live && sc_ == 2);
    seen_f = seen_f || __any_sync(0xffffffffu, live && sc_ == 0);
    if (seen_t && seen_f) return 1;
    unsigned open = __ballot_sync(0xffffffffu, live && sc_ == 1);
    while (open != 0u) {  // warp-uniform: every lane holds the same ballot
      const int u = s0 + __ffs(open) - 1;
      open &= open - 1u;
      const int r0 = m0 + (u / sc) * kSub, c0 = n0 + (u % sc) * kSub;
#pragma unroll 1
      for (int e = lane; e < kSub * kSub; e += 32) {
        const int q = r0 + e / kSub, kv = c0 + e % kSub;
        const bool in = q <= m1 && kv <= n1;
        const bool v = in && kc_expr_mask(b, h, q, kv, p);
        seen_t = seen_t || __any_sync(0xffffffffu, v);
        seen_f = seen_f || __any_sync(0xffffffffu, in && !v);
      }
      if (seen_t && seen_f) return 1;
    }
  }
  return seen_t ? (seen_f ? 1 : 2) : 0;
}
#else
// No interval evaluation generated for this mask: every element of the tile,
// 32 at a time, by one warp, stopping once the tile is seen to be partial.
__device__ __forceinline__ int scan_expr_tile(const AttentionParams& p, int b, int h, int m0,
                                              int m1, int n0, int n1, int lane) {
  const int cols = n1 - n0 + 1;
  const int n = (m1 - m0 + 1) * cols;
  bool any = false, all = true;
  for (int e0 = 0; e0 < n; e0 += 32) {
    const int e = e0 + lane;
    const bool in = e < n;
    const bool v = in && kc_expr_mask(b, h, m0 + e / cols, n0 + e % cols, p);
    any = any || __any_sync(0xffffffffu, v);
    all = all && __all_sync(0xffffffffu, !in || v);
    if (any && !all) break;  // warp-uniform
  }
  return any ? (all ? 2 : 1) : 0;
}
#endif

// One row of tile classes (query tile blockIdx.x). A predicate that does not
// read h (b) is classified for h = 0 (b = 0) only, and the CTAs of the other
// heads (batches) share that row's tiles instead of returning: warp w of the
// CTA of rank r among the row's sharers takes tiles w + 4 r, w + 4 (r + n),
// ... Each tile is then one warp's few microseconds of work, not a
// sequence of them (the 2-D neighbourhood's 18 rows were 18 busy CTAs).
// With an interval evaluation, a warp's tiles are first evaluated one per
// lane, all at once, and only those left open are settled by the whole warp
// in turn: one evaluation's latency instead of one per tile (the per-head
// window's rows are 64 tiles, 8 per warp; session 11).
template <int BM, int BN>
__device__ __forceinline__ void classify_expr_tiles(const AttentionParams& p) {
  const int mtile = blockIdx.x;
  const int h = KC_EXPR_MASK_READS_H ? static_cast<int>(blockIdx.y) : 0;
  const int b = KC_EXPR_MASK_READS_B ? static_cast<int>(blockIdx.z) : 0;
  const int share_h = KC_EXPR_MASK_READS_H ? 1 : static_cast<int>(gridDim.y);
  const int share_b = KC_EXPR_MASK_READS_B ? 1 : static_cast<int>(gridDim.z);
  const int rank = (KC_EXPR_MASK_READS_H ? 0 : static_cast<int>(blockIdx.y)) +
                   (KC_EXPR_MASK_READS_B ? 0 : static_cast<int>(blockIdx.z)) * share_h;
  const int m0 = mtile * BM;
  const int m1 = imin(m0 + BM, p.q_len) - 1;
  const int n_kv_tiles = (p.kv_len + BN - 1) / BN;
  kc_i8* row = p.tile_class + b * p.tile_class_stride_b + h * p.tile_class_stride_h +
               mtile * p.tile_class_stride_m;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int first = warp + 4 * rank, step = 4 * share_h * share_b;
#if KC_EXPR_MASK_TILE
  for (int j0 = 0; first + j0 * step < n_kv_tiles; j0 += 32) {
    const int t = first + (j0 + lane) * step;
    int c = 0;
    if (t < n_kv_tiles) {
      const int n0 = t * BN;
      c = classify_interval(b, h, m0, m1, n0, imin(n0 + BN, p.kv_len) - 1, p);
      if (c != 1) row[t] = static_cast<kc_i8>(c);
    }
    unsigned open = __ballot_sync(0xffffffffu, t < n_kv_tiles && c == 1);
    while (open != 0u) {  // warp-uniform
      const int u = first + (j0 + __ffs(open) - 1) * step;
      open &= open - 1u;
      const int n0 = u * BN;
      const int cu = settle_expr_tile(p, b, h, m0, m1, n0, imin(n0 + BN, p.kv_len) - 1, lane);
      if (lane == 0) row[u] = static_cast<kc_i8>(cu);
    }
  }
#else
  for (int t = first; t < n_kv_tiles; t += step) {
    const int n0 = t * BN;
    const int c = scan_expr_tile(p, b, h, m0, m1, n0, imin(n0 + BN, p.kv_len) - 1, lane);
    if (lane == 0) row[t] = static_cast<kc_i8>(c);
  }
#endif
}
}  // namespace attn_fwd
}  // namespace kcache

#if !KC_OMIT_FWD
extern "C" __global__ void __launch_bounds__(128)
    kcache_attn_mask_build(const __grid_constant__ kcache::AttentionParams p) {
  kcache::attn_fwd::classify_expr_tiles<KC_CLASS_BLOCK_M, KC_BLOCK_N>(p);
}
#endif
#endif
