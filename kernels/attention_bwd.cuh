// Attention backward, FlashAttention-2 style, compiled by NVRTC after the
// generated prelude and attention_fwd.cuh (docs/kernel-contract.md,
// "Backward"). Portable mma.sync m16n8k16 (sm_80..sm_90, also run on
// sm_90a), reusing the forward's PTX wrappers.
//
// The forward's log-sum-exp is the only state it reads. With s the raw
// Q.K^T, x = s * scale, y = score_mod(x) and P = exp(y - lse):
//   dV = P^T dO,  dP = dO V^T,  dY = P * (dP - delta),  delta = rowsum(dO * O),
//   dS = dY * dy/dx * scale,  dQ = dS K,  dK = dS^T Q.
// dy/dx is exact: 1 - tanh^2 for the soft-cap (tanh recomputed from x), 1
// for ALiBi, and the generated kc_expr_score_grad for expressions.
//
// Kernels, in launch order:
//   kcache_attn_bwd_preprocess  delta per row; zeroes dq_accum (atomic mode).
//   kcache_attn_bwd_dkdv        one CTA per (key tile of 128, kv head,
//                               batch), keeping the tile's dK and dV in
//                               registers while it walks every (query head
//                               of the GQA group, query step of 64) that
//                               sees the key tile, so GQA sums need no
//                               atomics. Unless deterministic, dQ partials
//                               go to dq_accum with fp32 reductions (dS
//                               staged in shared memory, each warp adding a
//                               32 x 32 block; vector reductions on sm_90;
//                               sm_90a: one bulk reduction per warpgroup and
//                               query step, in the accumulator's order).
//                               Warp layout: FlashAttention-2's on sm_90
//                               (kFa2), 16 keys per warp on sm_80.
//   kcache_attn_bwd_dq          deterministic mode: one CTA per (128 query
//                               rows, query head, batch) recomputes P and
//                               dP over its visible key steps and writes dQ
//                               once, with no atomics.
//   kcache_attn_bwd_dq_convert  atomic mode: dq = dq_accum in the dtype
//                               (undoing sm_90a's order of whole steps).
// Block sparsity mirrors the forward: causal and sliding-window masks walk
// an analytic range of tiles; document, drafter and expression masks build
// a list of non-empty tiles (the dK/dV kernel's list is transposed: query
// tiles per key tile); full tiles skip the per-element mask.
#pragma once

#include "attention_fwd.cuh"

#ifndef KC_BWD_BLOCK_M
#error "attention_bwd.cuh needs KC_BWD_BLOCK_M/N and KC_BWD_NUM_WARPS (KC_BACKWARD prelude)"
#endif

namespace kcache {
namespace attn_bwd {

using attn_fwd::cp_async16;
using attn_fwd::cp_async_commit;
using attn_fwd::cp_async_wait;
using attn_fwd::elem_t;
using attn_fwd::exp2_approx;
using attn_fwd::imax;
using attn_fwd::imin;
using attn_fwd::launch_order;
using attn_fwd::ldsm_x4;
using attn_fwd::ldsm_x4_t;
using attn_fwd::mma16816;
using attn_fwd::neg_inf;
using attn_fwd::pack2;
using attn_fwd::smem_u32;

constexpr int kBM = KC_BWD_BLOCK_M;
constexpr int kBN = KC_BWD_BLOCK_N;
constexpr int kNW = KC_BWD_NUM_WARPS;
constexpr int kThreads = kNW * 32;
constexpr int kDQK = KC_HEAD_DIM_QK;
constexpr int kDV = KC_HEAD_DIM_V;
// dK/dV kernel: kBN keys per CTA (16 per warp), query steps of kBM = 64.
// dQ kernel: kBN query rows per CTA (16 per warp), key steps of kBM.
static_assert(kBN == 16 * kNW && kBM == 64 && kNW % 4 == 0,
              "backward tiles: block_n = 16 * num_warps, block_m = 64");
constexpr int kDqRows = kBN;  // dQ kernel: query rows per CTA
constexpr int kDqKeys = kBM;  // dQ kernel: keys per step
static_assert((kDQK == 64 || kDQK == 128) && (kDV == 64 || kDV == 128),
              "backward head dims: 64 or 128");
constexpr int kKQ = kDQK / 16;  // k16 steps over the Q/K head dim
constexpr int kKV = kDV / 16;   // k16 steps over the V head dim
constexpr int kNT = kBM / 8;    // n8 tiles over a query step (dK/dV) or key step (dQ)
constexpr int kDTQ = kDQK / 8;  // n8 tiles of dK / dQ
constexpr int kDTV = kDV / 8;   // n8 tiles of dV
constexpr int kList = kAttnBwdMaxList;

// sm_90a (KC_BWD_WGMMA, chosen by the code generator: AttentionBwdWgmma):
// the dK/dV kernel's products run as wgmma. Two warpgroups, warpgroup w
// owning keys 64 w + [0, 64) of the CTA's 128 (the same rows per warp as the
// 16-keys-per-warp mma.sync layout, so the elementwise code is shared):
//   S^T = K Q^T and dP^T = V dO^T: A = K / V rows, B = Q / dO (both K-major),
//   dV += P^T dO and dK += dS^T Q: A = P^T / dS^T from registers, B = dO / Q
//     read N-major (transposed),
//   dQ = dS K (unless deterministic): A = dS^T in shared memory read
//     M-major, B = K N-major, over all 128 keys, one step late (kWgDqLag);
//     head dim 128: warpgroup w computes columns 64 w + [0, 64); head dim
//     64: one warpgroup per step, alternating, all 64 columns. Each 64 x 64
//     block goes to dq_accum as one bulk reduction (wg_dq).
// K, V, Q and dO live in wgmma's 128-byte-swizzled layout; the deterministic
// mode's dQ kernel stays mma.sync.
#ifndef KC_BWD_WGMMA
#define KC_BWD_WGMMA 0
#endif
#if KC_BWD_WGMMA && !KC_WGMMA_HEAD_DIMS
#error "KC_BWD_WGMMA needs sm_90a and head dims the wgmma helpers support"
#endif
constexpr bool kWg = KC_BWD_WGMMA;
// kWg without a score modification: the step's elementwise work split around
// the dP and dV wgmmas; with one, the plain synchronous order.
constexpr bool kWgSplit = kWg && KC_SCORE_MOD == KC_SCORE_NONE;
// kSplitBar (kWg, not deterministic, head dim 128): the barrier at the top of
// each step after the first waits only for the other warpgroup's dS^T of the
// previous step, not for the end of its step. Each warpgroup arrives
// (bar.arrive) on its own barrier right after storing its dS^T and syncs on the
// other's before the dQ that reads it, so that one warpgroup's dQ follows the
// other's dK into the tensor pipe instead of both waiting out both dKs (dK/dV on
// an H100: causal B4 H32 S4096 D128 2.91 -> 2.76 ms, no mask 5.74 -> 5.36, sorted
// drafter 2.74 -> 2.62; head dim 64, where one warpgroup computes a step's whole
// dQ, 1.03 -> 1.05, so it keeps the CTA barrier). Barriers 5 + 2 wg + (step & 1):
// a warpgroup cannot arrive twice on one before the other has synced on it (its
// arrive of step it + 2 follows its sync on the other's barrier of step it + 1,
// which follows the other's sync of step it).
constexpr bool kSplitBar = kWg && !KC_DETERMINISTIC && kDQK == 128;
// kWgSplit: a step's LSEs are read from shared memory before S^T is waited,
// not after it, where ~6 % of the no-mask dK/dV's stall samples sat on the
// multiplies waiting for those loads (ncu, H100). dK/dV on an H100: causal B4
// H32 S4096 D128 2.77-2.89 -> 2.47-2.56 ms, no mask 5.39-5.61 -> 5.10-5.20. Not
// where rows carry data (drafter, document: the 16 registers spill there, sorted
// drafter +1..+7 %), at head dim 64 (1.04 -> 1.05) or deterministic (not timed).
constexpr bool kLseEarly = kWg && !KC_DETERMINISTIC && kDQK == 128 && !KC_MASK_ROW_DATA;
// kWg (not deterministic): the dQ of query step it is computed at the start
// of step it + 1, right after that step's CTA barrier, which then also covers
// dS^T(it) (kept in the second dS^T buffer): one CTA barrier per step instead
// of two (causal B4 H32 S4096 D128 dK/dV 3.70 -> 3.38 ms, D64 1.36 -> 1.14,
// drafter training shape 5.82 -> 5.14 ms on an H200).
constexpr bool kWgDqLag = kWg && !KC_DETERMINISTIC;
// kWg (not deterministic): a third warpgroup, the producer (threads kThreads +
// [0, 128), AttentionBwdDkdvThreads), issues every query step's Q, dO, LSE
// and delta copies and writes its row data, on full / empty mbarriers per
// stage, with its registers given to the two compute warpgroups (setmaxnreg).
// Issued by the compute warps, the copies held them ~600 of a ~5200-clock
// step with the tensor pipe idle, and moving them elsewhere in the step cost
// as much or more (causal B4 H32 S4096 D128 dK/dV + preprocess + dQ convert
// 3.52 -> 3.32 ms, no mask 6.56 -> 6.01 ms on an H200; kernels/NOTES.md,
// session 19).
constexpr bool kProducer = kWgDqLag;
constexpr int kProdThreads = kAttnBwdProducerThreads;
static_assert(!kProducer ||
                  kThreads + kProdThreads == AttentionBwdDkdvThreads(KC_BWD_NUM_WARPS, true, false),
              "dK/dV threads out of step with attention_tiles.h");
static_assert(!kWg || (kNW == 8 && kBN == 128 && kBM == 64), "KC_BWD_WGMMA: 64 x 128 x 8w");
// Drafter mask, kWg: a dK/dV CTA over context keys walks query steps of
// drafter blocks sorted by anchor (attn_fwd::drafter_rank_blocks, as the
// forward's query tiles), not of consecutive blocks. A context key tile is
// seen by the blocks whose anchor lies past it (with a window, not too far
// past): in anchor order one run of ranks. With random anchors a step of
// kBM / block consecutive blocks misses a key tile at fraction u of the
// context only with probability u^4 (block 16), so the CTA visited ~80 % of
// the steps against the ~50 % that see it. A step gathers its blocks' Q, dO,
// LSE and delta rows and hands its dQ partials back as one bulk reduction
// per 16 rows (a warp's accumulator rows, one block's), hence a block of a
// multiple of 16 rows dividing the step. Keys past the context (the blocks'
// own keys) keep consecutive blocks: a key tile's own queries are
// consecutive. Score modifications that read the query index keep the
// identity order, as in the forward.
constexpr int kBwdBlk = KC_DRAFTER_BLOCK > 0 ? KC_DRAFTER_BLOCK : 16;
constexpr int kBwdBlocksPerStep = kBM / kBwdBlk > 0 ? kBM / kBwdBlk : 1;
constexpr bool kBwdDrafterSort =
    KC_MASK == KC_MASK_DRAFTER && kWg && kBwdBlk % 16 == 0 && kBM % kBwdBlk == 0 &&
    (KC_SCORE_MOD == KC_SCORE_NONE || KC_SCORE_MOD == KC_SCORE_SOFTCAP);
// Blocks the order holds (2 bytes each; AttentionBwdDkdvSmemBytes).
constexpr int kBwdSortCap = kAttnBwdMaxList;

constexpr float kScale = KC_SOFTMAX_SCALE;
constexpr float kLog2e = 1.4426950408889634f;
// No score modification: x * log2(e) folds into one multiply of s.
constexpr bool kFold = KC_SCORE_MOD == KC_SCORE_NONE;

constexpr bool kListMask =
    KC_MASK == KC_MASK_DOCUMENT || KC_MASK == KC_MASK_DRAFTER || KC_MASK == KC_MASK_EXPR;
constexpr bool kRowData = KC_MASK_ROW_DATA;

#if KC_MASK == KC_MASK_CAUSAL
constexpr int kWinLeft = -1;
constexpr int kWinRight = 0;
#elif KC_MASK == KC_MASK_SLIDING_WINDOW
constexpr int kWinLeft = KC_WINDOW_LEFT;
constexpr int kWinRight = KC_WINDOW_RIGHT;
#else
constexpr int kWinLeft = -1;
constexpr int kWinRight = -1;
#endif

__device__ __forceinline__ float to_float(elem_t x) {
#if KC_DTYPE_BF16
  return __uint_as_float(static_cast<unsigned>(x) << 16);
#else
  float f;
  asm("{\n.reg .b16 h;\nmov.b16 h, %1;\ncvt.f32.f16 %0, h;\n}\n" : "=f"(f) : "h"(x));
  return f;
#endif
}

__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool pred) {
  const int n = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}

// dst[0..3] += v, as one vector reduction in L2 (sm_90+).
__device__ __forceinline__ void red_add_v4(float* dst, const float (&v)[4]) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(v[0]), "f"(v[1]),
               "f"(v[2]), "f"(v[3])
               : "memory");
}

// Bulk (TMA-unit) reduction of `bytes` from shared memory into global fp32,
// tracked by this thread's bulk async-group (sm_90).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, int bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst),
      "r"(src), "r"(bytes)
      : "memory");
}
// This thread's bulk groups have read their shared memory (it may be reused).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk groups are complete.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void st_shared_v4(unsigned addr, const float (&v)[4]) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v[0]), "f"(v[1]),
               "f"(v[2]), "f"(v[3])
               : "memory");
}

__device__ __forceinline__ float4 ld_shared_v4(unsigned addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ void st_shared_u32(unsigned addr, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Rows [row0, row0 + ROWS) of a [len, D] matrix into a swizzled tile (chunk c
// of row r at r * 2D + ((c ^ (r & 7)) << 4), the forward's mma.sync layout;
// WG: wgmma's [D / 64][ROWS][64] 128-byte-swizzled layout); rows at or past
// `len` are zero-filled.
template <int ROWS, int D, bool WG = false>
__device__ __forceinline__ void load_rows(unsigned sdst, const elem_t* g, long long stride,
                                          int row0, int len, int tid) {
  attn_fwd::load_tile<ROWS, D, kThreads, WG>(sdst, g, stride, row0, len, tid);
}

// Per-query mask data: document -> x = sequence id; drafter -> visible keys
// [x, y) U [z, w); expression -> kc_expr_mask_row of (b, h, q) (as the
// forward's rowdata). Zeros past q_len.
struct RowRaw {
  int a;   // document: sequence id; drafter: anchor
  int k;   // drafter: keep
  int4 e;  // expression mask: its row-only part
};
__device__ __forceinline__ RowRaw row_raw(const AttentionParams& p, int b, int h, int q) {
  RowRaw r{0, 0, make_int4(0, 0, 0, 0)};
  if (q >= p.q_len) return r;
#if KC_MASK == KC_MASK_DOCUMENT
  r.a = p.q_seq_id[b * p.q_seq_id_stride_b + q];
  r.k = 1;
#elif KC_MASK == KC_MASK_DRAFTER
  const int j = q / KC_DRAFTER_BLOCK;
  if (j < p.drafter_num_blocks) {
    r.k = p.drafter_keep == nullptr || p.drafter_keep[b * p.drafter_stride_b + j] != 0;
    r.a = p.drafter_anchor[b * p.drafter_stride_b + j];
  }
#elif KC_MASK == KC_MASK_EXPR && KC_EXPR_MASK_ROW
  r.e = kc_expr_mask_row(b, h, q, p);
#else
  (void)p;
  (void)b;
#endif
  (void)h;
  return r;
}
__device__ __forceinline__ int4 row_data(const AttentionParams& p, int q, RowRaw r) {
  int4 rd = make_int4(0, 0, 0, 0);
#if KC_MASK == KC_MASK_DOCUMENT
  rd.x = r.a;
  (void)p;
  (void)q;
#elif KC_MASK == KC_MASK_DRAFTER
  if (r.k) {
    const int ctx_len = p.drafter_context_len;
    const int j = q / KC_DRAFTER_BLOCK;
    rd.y = imax(0, imin(r.a, ctx_len));
    rd.x = KC_DRAFTER_WINDOW > 0 ? imin(imax(r.a - KC_DRAFTER_WINDOW, 0), rd.y) : 0;
    rd.z = ctx_len + j * KC_DRAFTER_BLOCK;
    rd.w = KC_DRAFTER_CAUSAL ? ctx_len + q + 1 : ctx_len + (j + 1) * KC_DRAFTER_BLOCK;
  }
#elif KC_MASK == KC_MASK_EXPR && KC_EXPR_MASK_ROW
  rd = r.e;
  (void)p;
  (void)q;
#else
  (void)p;
  (void)q;
  (void)r;
#endif
  return rd;
}

// Whether query q sees key kv (the forward's per-element rule, bounds
// included). rd: q's row data; kv_id: the document id of kv.
__device__ __forceinline__ bool visible(const AttentionParams& p, int b, int h, int q, int kv,
                                        int q_len, int kv_len, int off, int4 rd, int kv_id) {
  bool vis = q < q_len && kv < kv_len;
#if KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
  if (kWinLeft >= 0) vis = vis && kv >= q + off - kWinLeft;
  if (kWinRight >= 0) vis = vis && kv <= q + off + kWinRight;
#elif KC_MASK == KC_MASK_DOCUMENT
  vis = vis && kv_id == rd.x && (!KC_DOC_CAUSAL || kv <= q);
#elif KC_MASK == KC_MASK_DRAFTER
  vis = vis && ((kv >= rd.x && kv < rd.y) || (kv >= rd.z && kv < rd.w));
#elif KC_MASK == KC_MASK_EXPR && KC_EXPR_MASK_ROW
  vis = vis && kc_expr_mask_rd(rd, b, h, q, kv, p);
#elif KC_MASK == KC_MASK_EXPR
  vis = vis && kc_expr_mask(b, h, q, kv, p);
#endif
  (void)p;
  (void)b;
  (void)h;
  (void)off;
  (void)rd;
  (void)kv_id;
  return vis;
}

#if KC_MASK == KC_MASK_DRAFTER
// Rows [q, qe) of one drafter block against keys [n0, n1): folds whether any
// and whether all of the pairs are visible into any / all.
__device__ __forceinline__ void drafter_rows_class(const AttentionParams& p, int b, int q, int qe,
                                                   int n0, int n1, bool& any, bool& all) {
  const RowRaw r = row_raw(p, b, /*h=*/0, q);  // the drafter's rows do not read h
  if (r.k) {
    const int4 f = row_data(p, q, r);  // the block's first row
    const int w_last = KC_DRAFTER_CAUSAL ? p.drafter_context_len + qe : f.w;  // its last sees most
    any = any || (n0 < f.y && n1 > f.x) || (n0 < w_last && n1 > f.z);
    all = all && ((n0 >= f.x && n1 <= f.y) || (n0 >= f.z && n1 <= f.w));
  } else {
    all = false;
  }
}
#endif

// Class of the tile pair (queries [m0, m0 + rows), keys [n0, n0 + cols))
// for the masks decided per thread (none, causal, window, drafter): 0
// empty, 1 partial, 2 full. Document and expression masks are classified by
// the callers.
__device__ __forceinline__ int classify_pair(const AttentionParams& p, int b, int m0, int rows,
                                             int n0, int cols, int q_len, int kv_len, int off) {
  const int m1 = imin(m0 + rows, q_len);
  const int n1 = imin(n0 + cols, kv_len);
  if (m1 <= m0 || n1 <= n0) return 0;
  const bool inb = m1 - m0 == rows && n1 - n0 == cols;
#if KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
  // kv - q ranges over [dmin, dmax]; visible where it is in [lo, hi].
  const int dmin = n0 - (m1 - 1), dmax = (n1 - 1) - m0;
  const bool lo_ok_any = kWinLeft < 0 || dmax >= off - kWinLeft;
  const bool hi_ok_any = kWinRight < 0 || dmin <= off + kWinRight;
  const bool lo_ok_all = kWinLeft < 0 || dmin >= off - kWinLeft;
  const bool hi_ok_all = kWinRight < 0 || dmax <= off + kWinRight;
  (void)p;
  (void)b;
  if (!(lo_ok_any && hi_ok_any)) return 0;
  return inb && lo_ok_all && hi_ok_all ? 2 : 1;
#elif KC_MASK == KC_MASK_DRAFTER
  (void)off;
  constexpr int kBlk = KC_DRAFTER_BLOCK;
  bool any = false, all = inb;
  for (int q = m0; q < m1;) {
    const int qe = imin(m1, (q / kBlk + 1) * kBlk);  // rows [q, qe) are one block
    drafter_rows_class(p, b, q, qe, n0, n1, any, all);
    q = qe;
  }
  return any ? (all ? 2 : 1) : 0;
#else
  (void)p;
  (void)b;
  (void)off;
  return inb ? 2 : 1;
#endif
}

// Min and max of ids[lo, hi) over a warp (document masks).
__device__ __forceinline__ void warp_id_range(const int* ids, int lo, int hi, int lane, int& mn,
                                              int& mx) {
  mn = 0x7fffffff;
  mx = -0x7fffffff - 1;
  for (int i = lo + lane; i < hi; i += 32) {
    const int id = ids[i];
    mn = imin(mn, id);
    mx = imax(mx, id);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) {
    mn = imin(mn, __shfl_xor_sync(0xffffffffu, mn, s));
    mx = imax(mx, __shfl_xor_sync(0xffffffffu, mx, s));
  }
}

// Document-mask class of a tile pair from the id ranges of both tiles.
__device__ __forceinline__ int classify_doc(int qmin, int qmax, int kmin, int kmax, int m0, int m1,
                                            int n0, int n1, bool inb) {
  if (m1 <= m0 || n1 <= n0 || kmax < qmin || kmin > qmax) return 0;
  if (KC_DOC_CAUSAL && n0 > m1 - 1) return 0;
  const bool one = qmin == qmax && kmin == kmax && qmin == kmin;
  const bool causal_full = !KC_DOC_CAUSAL || n1 - 1 <= m0;
  return inb && one && causal_full ? 2 : 1;
}

// Compacts classes list[0, n) (0/1/2) in place into entries
// (index | class << 30) of the non-empty ones; returns the count. Warp 0
// only; the caller synchronizes before and after.
__device__ __forceinline__ int compact_list(unsigned* list, int n, int lane) {
  int count = 0;
  for (int base = 0; base < n; base += 32) {
    const int t = base + lane;
    const unsigned c = t < n ? list[t] : 0u;
    const unsigned bal = __ballot_sync(0xffffffffu, c != 0u);
    const int pos = count + __popc(bal & ((1u << lane) - 1u));
    __syncwarp();
    if (c != 0u) list[pos] = static_cast<unsigned>(t) | (c << 30);
    count += __popc(bal);
    __syncwarp();
  }
  return count;
}

// The tile list's end: compacts classes list[0, n) and returns the count
// to every thread. All threads call it, after writing their classes.
__device__ __forceinline__ int finish_list(unsigned* list, int n, int* misc, int warp, int lane) {
  __syncthreads();
  if (warp == 0) {
    const int c = compact_list(list, n, lane);
    if (lane == 0) misc[0] = c;
  }
  __syncthreads();
  return misc[0];
}

// Document-mask classes of one side's fixed rows [f0, f1) against tile t
// (rows [t * tile, + tile) clipped to len) of the other side, into list[t]:
// warp w takes tiles w, w + kNW, ... FIXED_Q: the fixed rows are queries.
// A pair is full only with the whole fixed block (f_rows) and a whole tile.
template <bool FIXED_Q>
__device__ __forceinline__ void doc_tile_classes(unsigned* list, const int* fixed_ids, int f0,
                                                 int f1, int f_rows, const int* other_ids, int tile,
                                                 int n_tiles, int len, int warp, int lane) {
  int fmin, fmax;
  warp_id_range(fixed_ids, f0, f1, lane, fmin, fmax);
  for (int t = warp; t < n_tiles; t += kNW) {
    const int o0 = t * tile, o1 = imin(o0 + tile, len);
    int omin, omax;
    warp_id_range(other_ids, o0, o1, lane, omin, omax);
    const bool full = f1 - f0 == f_rows && o1 - o0 == tile;
    if (lane == 0) {
      list[t] = static_cast<unsigned>(
          FIXED_Q ? classify_doc(fmin, fmax, omin, omax, f0, f1, o0, o1, full)
                  : classify_doc(omin, omax, fmin, fmax, o0, o1, f0, f1, full));
    }
  }
}

// Score modification of x = s * scale, and its derivative dy/dx.
struct ScoreCtx {
  float alibi_slope;
};
__device__ __forceinline__ float score_mod(float x, const ScoreCtx& sc, int b, int h, int q, int kv,
                                           const AttentionParams& p, float& dydx) {
  dydx = 1.f;
#if KC_SCORE_MOD == KC_SCORE_SOFTCAP
  const float t = tanhf(x * (1.f / KC_SOFTCAP));
  dydx = 1.f - t * t;
  (void)sc;
  (void)b;
  (void)h;
  (void)q;
  (void)kv;
  (void)p;
  return KC_SOFTCAP * t;
#elif KC_SCORE_MOD == KC_SCORE_ALIBI
  (void)b;
  (void)h;
  (void)p;
  return x + sc.alibi_slope * static_cast<float>(kv - q);
#elif KC_SCORE_MOD == KC_SCORE_EXPR
  (void)sc;
  return kc_expr_score(x, b, h, q, kv, p);
#else
  (void)sc;
  (void)b;
  (void)h;
  (void)q;
  (void)kv;
  (void)p;
  return x;
#endif
}

// Launch order. CTAs of a few (batch, head) pairs at a time run together,
// so that their Q, dO and dQ accumulators stay in L2 (one pair at a time
// spreads the heavy tiles to the end of the grid; every pair at once
// spills L2: causal B4 H32 S4096 D128 dK/dV 8.1 ms against 6.9 on an
// H200); within such a chunk the tile index (blockIdx.x's role) varies
// slowest, so that the heavy tiles of the chunk start first. Under GQA a
// dK/dV CTA walks every query head of its group, so the heavy ones are
// `group` times longer: they go first across all pairs (the drafter
// training shape: 6.3 ms against 7.6 with chunks of 4).
// On sm_90+ (two dS^T buffers, AttentionBwdDsBuffers) the dQ of a query
// step runs at the start of the next one: its dS^T is complete at that
// step's barrier, so the step needs one barrier instead of two and the dQ
// reductions drain while the next S and dP run (causal B4 H32 S4096 D128
// dK/dV 6.70 -> 6.56 ms, drafter training shape 9.92 -> 9.45 ms on an H200).
constexpr int kDsBufs = AttentionBwdDsBuffers(KC_ARCH);
// sm_90+ (kFa2, without KC_BWD_WGMMA): FlashAttention-2's warp layout. S and
// dP as 2 x 4 warps of 32 queries x 32 keys, P and dS through shared memory
// ([query][key], the two dS^T buffers' space), dV and dK as 4 x 2 warps of
// 32 keys x D/2 with A read transposed: about 15 % fewer shared-memory bytes
// per step than 16 keys x 64 queries per warp, and each warp's dQ
// reductions spread over dK's k loop (causal B4 H32 S4096 D128 dK/dV 5.73
// -> 5.26 ms on an H200). sm_80 cannot hold both P and dS beside two Q/dO
// stages at D128 (171 KB > 163 KB) and keeps the 16-keys-per-warp layout.
constexpr bool kFa2 = KC_ARCH >= 90 && !KC_BWD_WGMMA;
static_assert(!kFa2 || (kDsBufs == 2 && kNW == 8 && kBN == 128), "kFa2: sm_90+, 64 x 128 x 8w");
static_assert(!(kFa2 && kWg), "kFa2 and KC_BWD_WGMMA exclude each other");
constexpr bool kDqLag = kDsBufs == 2 && !kFa2 && !kWg;
// (batch, head) pairs per chunk of the launch order (launch_order).
constexpr int kHeadChunk = 4;
// The wgmma dK/dV's launch order under GQA (launch_order_bands): the first
// `lead` key tiles of every (batch, key head) pair key-tile-major, so that the
// heavy tiles (the first: causal, the drafter's context) start at once, then
// the rest in bands of `band` tiles, pair-major within a band. The SMs that
// free up together then take CTAs of one pair, which walk its query steps in
// the same order (item_of) and share its Q, dO and dQ rows in L2; in
// key-tile-major order they took one CTA of each pair, and each read its rows
// from DRAM again (bench/attention/bwd_launch_model.py models this).
// Measured on an H100, dK/dV ms (sessions 28-29; sorted / random drafter):
// - B2 (16 pairs): key-tile-major 3.25 / 3.70; lead 8, bands of 4 2.66-2.76 /
//   3.25-3.42, which beat no lead (2.77-2.79 / 3.25-3.41; causal GQA 1.51-1.55
//   against 1.58-1.60) in three runs, though both launch the same CTAs first;
//   bands of 8 or 16 were slower on the random drafter and causal GQA.
// - B4 / B8: a lead of 8 tiles spans more than one wave; no lead was faster
//   (B4 6.10 -> 5.66 / 7.11 -> 6.93), and wider bands more so: B4 bands of 8
//   5.45 / 6.46, B8 bands of 16 11.06 / 13.23 against 13.41 / 15.19.
// So the lead is kept while it fits one wave, and bands widen with the pairs,
// so that each pair running holds 8-16 CTAs that walk together (B4: ~16 pairs
// of 8 in a wave, B8: ~8 of 16).
// KC_BWD_LEAD and KC_BWD_BAND (measurement switches) fix either.
#ifndef KC_BWD_LEAD
#define KC_BWD_LEAD -1
#endif
#ifndef KC_BWD_BAND
#define KC_BWD_BAND -1
#endif
constexpr int kBwdLeadTiles = 8;
// One wave: the SMs of an H100 or H200 SXM, one dK/dV CTA each.
constexpr int kBwdWaveCtas = 132;
__device__ __forceinline__ void bands_for(int pairs, int& lead, int& band) {
  lead =
      KC_BWD_LEAD >= 0 ? KC_BWD_LEAD : (pairs * kBwdLeadTiles <= kBwdWaveCtas ? kBwdLeadTiles : 0);
  band = KC_BWD_BAND > 0 ? KC_BWD_BAND : imin(16, imax(4, pairs / 4));
}
__device__ __forceinline__ void launch_order_bands(int& tile, int& y, int& z, int lead, int band) {
  const int nt = gridDim.x, ny = gridDim.y, nyz = gridDim.y * gridDim.z;
  int lin = blockIdx.x + nt * (blockIdx.y + ny * blockIdx.z);
  lead = imin(lead, nt);
  int yz;
  if (lin < lead * nyz) {
    tile = lin / nyz;
    yz = lin % nyz;
  } else {
    lin -= lead * nyz;
    const int t0 = lead + lin / (band * nyz) * band;  // this band's first tile
    const int w = imin(band, nt - t0);
    const int in = lin - (t0 - lead) * nyz;
    yz = in / w;
    tile = t0 + in % w;
  }
  y = yz % ny;
  z = yz / ny;
}

// kTileCopies: the elementwise loop of a step is written as
//   #pragma unroll
//   for (int full = 1; full >= 0; --full) {
//     if (kTileCopies ? full != (cls == 2) : full) continue; ...
// i.e. two copies, one for full tiles (class 2) with no per-element mask test
// at all. A test per element made ptxas wrap each element in its own branch
// and serialize the exponentials (about a fifth of the causal dK/dV kernel's
// stall samples on an H200). Only without a score modification: with one,
// the straight-line copy holds too many values at once (softcap and ALiBi
// spilled 150-240 B), so those keep one copy, tested per element.
constexpr bool kTileCopies = kFold;

// lse (natural log) -> log2 domain; a row that saw nothing (-inf) gets +inf
// so that P = exp2(y - inf) = 0 rather than NaN.
__device__ __forceinline__ float lse_log2(float l) {
  return l == neg_inf() ? __int_as_float(0x7f800000) : l * kLog2e;
}

// The elementwise core shared by both kernels: from the raw score s and
// dP of one element, P (returned through pexp) and dS (the gradient of s,
// scale included). Masked elements give zeros. Without a score
// modification it has no branch (a select drops masked elements, so their
// values, NaN or not, never reach P or dS), and ptxas can overlap the
// exponentials of a whole fragment; a score modification is evaluated on
// visible elements only (an expression may read buffers at any index).
__device__ __forceinline__ void element_grad(float s, float dp, float lse2, float delta, bool vis,
                                             const ScoreCtx& sc, int b, int h, int q, int kv,
                                             const AttentionParams& p, bool buffer_grads,
                                             float& pexp, float& ds) {
  if constexpr (kFold) {
    const float pe = exp2_approx(fmaf(s, kScale * kLog2e, -lse2));
    const float d = pe * (dp - delta) * kScale;
    pexp = vis ? pe : 0.f;
    ds = vis ? d : 0.f;
    (void)sc, (void)b, (void)h, (void)q, (void)kv, (void)p, (void)buffer_grads;
  } else {
    if (!vis) {
      pexp = 0.f;
      ds = 0.f;
      return;
    }
    const float x = s * kScale;
    float dydx;
    const float y = score_mod(x, sc, b, h, q, kv, p, dydx);
    pexp = exp2_approx(fmaf(y, kLog2e, -lse2));
    const float dy = pexp * (dp - delta);
#if KC_SCORE_MOD == KC_SCORE_EXPR
    (void)dydx;
    ds = kc_expr_score_grad(x, dy, b, h, q, kv, p, buffer_grads) * kScale;
#else
    (void)buffer_grads;
    ds = dy * dydx * kScale;
#endif
  }
}

// dS^T for dQ: the k16 step kk of this thread's dS fragment (keys row0 and
// row0 + 8) into the swizzled [key][query] tile at ds_t.
__device__ __forceinline__ void store_ds_t(unsigned ds_t, int row0, int kk, int t4,
                                           const unsigned (&sa)[4]) {
  const int r0 = row0, r1 = row0 + 8;
  st_shared_u32(ds_t + r0 * (kBM * 2) + (((2 * kk) ^ (r0 & 7)) << 4) + t4 * 4, sa[0]);
  st_shared_u32(ds_t + r1 * (kBM * 2) + (((2 * kk) ^ (r1 & 7)) << 4) + t4 * 4, sa[1]);
  st_shared_u32(ds_t + r0 * (kBM * 2) + (((2 * kk + 1) ^ (r0 & 7)) << 4) + t4 * 4, sa[2]);
  st_shared_u32(ds_t + r1 * (kBM * 2) + (((2 * kk + 1) ^ (r1 & 7)) << 4) + t4 * 4, sa[3]);
}

#if KC_BWD_WGMMA
using attn_fwd::fence_proxy_async;
using attn_fwd::fence_regs;
using attn_fwd::named_bar_sync;
using attn_fwd::smem_desc;
using attn_fwd::wgmma_commit;
using attn_fwd::wgmma_fence;
using attn_fwd::wgmma_rs;
using attn_fwd::wgmma_ss;
using attn_fwd::wgmma_wait;
// D (64 x 64) (+)= A B with A and B both read from shared memory transposed
// (M-major A, N-major B): dQ = dS K from dS^T [key][query] and K [key][d].
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[8][4], unsigned long long da,
                                            unsigned long long db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." KC_WG_T "." KC_WG_T
      " "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
      "%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(accumulate));
}
#endif

// ---- the warp-level GEMM steps both kernels are made of ------------------
// Per-lane ldmatrix addressing (see the forward): A rows lane & 15 with
// chunk 2k + (lane >> 4) (key `akey`); B rows brow = l7 + 8 * (lane >> 4)
// with chunk 2k + ((lane >> 3) & 1) (key `bkey`), or transposed rows
// trow = l7 + 8 * ((lane >> 3) & 1) with chunk 2n + (lane >> 4) (`akey`).
struct Lane {
  unsigned akey, bkey;
  int brow, trow;
};
__device__ __forceinline__ Lane lane_addressing(int lane) {
  const int l7 = lane & 7;
  return Lane{static_cast<unsigned>(l7 ^ (lane >> 4)) << 4,
              static_cast<unsigned>(l7 ^ ((lane >> 3) & 1)) << 4, l7 + ((lane >> 4) << 3),
              l7 + (((lane >> 3) & 1) << 3)};
}

// acc = A B^T over D columns for MT m16 tiles of A (rows a_row + 16 mt:
// a_row is this lane's row of the first) and NT n8 tiles of B (the rows at
// b_tile); both [rows][D] swizzled tiles. Each B fragment serves every m16
// tile.
template <int D, int MT, int NT>
__device__ __forceinline__ void gemm_abt_mn(float (&acc)[MT][NT][4], unsigned a_row,
                                            unsigned b_tile, const Lane& ln) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      ldsm_x4(a_row + mt * 16 * (D * 2) + ((kk * 32) ^ ln.akey), a[mt][0], a[mt][1], a[mt][2],
              a[mt][3]);
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned b0, b1, b2, b3;
      ldsm_x4(b_tile + (np * 16 + ln.brow) * (D * 2) + ((kk * 32) ^ ln.bkey), b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816(acc[mt][2 * np], a[mt], b0, b1);
        mma16816(acc[mt][2 * np + 1], a[mt], b2, b3);
      }
    }
  }
}

// One warp's 16 rows of A against the kBM (kNT n8 tiles) rows of B.
template <int D>
__device__ __forceinline__ void gemm_abt(float (&acc)[kNT][4], unsigned a_row, unsigned b_tile,
                                         const Lane& ln) {
  gemm_abt_mn<D, 1, kNT>(*reinterpret_cast<float(*)[1][kNT][4]>(&acc), a_row, b_tile, ln);
}

// The k16 step kk of an accumulator as an A fragment (bf16/fp16 pairs).
__device__ __forceinline__ void pack_a(const float (&acc)[kNT][4], int kk, unsigned (&a)[4]) {
  a[0] = pack2(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack2(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// acc += A B for one k16 step: MT m16 tiles of A from registers, B rows
// kk * 16 .. + 16 of b_tile ([rows][D] swizzled) read transposed, columns
// [16 dp0, 16 dp0 + 8 N); each B fragment serves every m16 tile.
template <int D, int MT, int N>
__device__ __forceinline__ void gemm_step_ab_mn(float (&acc)[MT][N][4], const unsigned (&a)[MT][4],
                                                unsigned b_tile, int kk, int dp0, const Lane& ln) {
#pragma unroll
  for (int j = 0; j < N / 2; ++j) {
    unsigned b0, b1, b2, b3;
    ldsm_x4_t(b_tile + (kk * 16 + ln.trow) * (D * 2) + (((dp0 + j) * 32) ^ ln.akey), b0, b1, b2,
              b3);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma16816(acc[mt][2 * j], a[mt], b0, b1);
      mma16816(acc[mt][2 * j + 1], a[mt], b2, b3);
    }
  }
}

// No per-step work beside a GEMM's k loop.
struct NoHook {
  __device__ __forceinline__ void operator()(int) const {}
};

// acc += X^T B over the kBM queries (kFa2's dV and dK): X is a [query][key]
// tile (P or dS, kBN keys a row, swizzled) read transposed as A for keys
// 32 wk + [0, 32), B the [query][D] tile at b_tile, columns from dp0.
// hook(kk) runs after k step kk's MMAs (other work spread over the loop).
template <int D, int N, typename Hook = NoHook>
__device__ __forceinline__ void gemm_tn_keys(float (&acc)[2][N][4], unsigned x_tile,
                                             unsigned b_tile, int wk, int dp0, const Lane& ln,
                                             int lane, Hook hook = Hook()) {
#pragma unroll
  for (int kk = 0; kk < kBM / 16; ++kk) {
    unsigned a[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int chunk = wk * 4 + 2 * mt + ((lane >> 3) & 1);
      ldsm_x4_t(x_tile + (kk * 16 + ln.brow) * (kBN * 2) + ((chunk ^ (lane & 7)) << 4), a[mt][0],
                a[mt][1], a[mt][2], a[mt][3]);
    }
    gemm_step_ab_mn<D>(acc, a, b_tile, kk, dp0, ln);
    hook(kk);
  }
}

// One m16 tile, all D columns.
template <int D>
__device__ __forceinline__ void gemm_step_ab(float (&acc)[D / 8][4], const unsigned (&a)[4],
                                             unsigned b_tile, int kk, const Lane& ln) {
  gemm_step_ab_mn<D, 1, D / 8>(*reinterpret_cast<float(*)[1][D / 8][4]>(&acc),
                               *reinterpret_cast<const unsigned(*)[1][4]>(&a), b_tile, kk, 0, ln);
}

// Row `row` of an accumulator (hh: its g or g + 8 half) in the dtype.
template <int D>
__device__ __forceinline__ void store_row(elem_t* row, const float (&acc)[D / 8][4], int hh,
                                          int t4) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    *reinterpret_cast<unsigned*>(row + dt * 8 + 2 * t4) =
        pack2(acc[dt][hh * 2], acc[dt][hh * 2 + 1]);
  }
}

}  // namespace attn_bwd
}  // namespace kcache

// ---------------------------------------------------------------------------
// delta = rowsum(dO * O) per row; zeroes dq_accum rows in atomic mode.
// Grid (ceil(q_len / 64), num_q_heads, batch), 256 threads: 4 per row.
// ---------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kcache::kAttnBwdAuxThreads)
    kcache_attn_bwd_preprocess(const __grid_constant__ kcache::AttentionParams p) {
  using namespace kcache;
  using namespace kcache::attn_bwd;
  static_assert(kAttnBwdAuxThreads == 4 * kAttnBwdRowsPerCta, "4 threads per row");
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int m0 = blockIdx.x * kAttnBwdRowsPerCta;
  const int r = threadIdx.x >> 2;
  const int part = threadIdx.x & 3;
  const int q = m0 + r;
  float sum = 0.f;
  if (q < p.q_len) {
    const elem_t* o =
        static_cast<const elem_t*>(p.o) + b * p.o_stride_b + h * p.o_stride_h + q * p.o_stride_s;
    const elem_t* d = static_cast<const elem_t*>(p.dout) + b * p.do_stride_b + h * p.do_stride_h +
                      q * p.do_stride_s;
    auto dot2 = [](unsigned ov, unsigned dv, float acc) {
      acc = fmaf(to_float(static_cast<elem_t>(ov & 0xffffu)),
                 to_float(static_cast<elem_t>(dv & 0xffffu)), acc);
      return fmaf(to_float(static_cast<elem_t>(ov >> 16)), to_float(static_cast<elem_t>(dv >> 16)),
                  acc);
    };
    // o's rows need only be 4-byte aligned (docs/kernel-contract.md); where
    // both rows are 16-byte aligned (the usual case), the 4 threads of a row
    // read its 16-byte chunks interleaved (chunk part + 4 j), so that a warp's
    // load covers 8 whole 64-byte runs instead of 32 scattered words.
    constexpr int kChunks = kDV / 8;
    const bool vec =
        kChunks % 4 == 0 &&
        ((reinterpret_cast<unsigned long long>(o) | reinterpret_cast<unsigned long long>(d)) &
         15u) == 0;
    if (vec) {
#pragma unroll
      for (int j = 0; j < kChunks / 4; ++j) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + 8 * (part + 4 * j));
        const uint4 dv = *reinterpret_cast<const uint4*>(d + 8 * (part + 4 * j));
        sum = dot2(ov.x, dv.x, sum);
        sum = dot2(ov.y, dv.y, sum);
        sum = dot2(ov.z, dv.z, sum);
        sum = dot2(ov.w, dv.w, sum);
      }
    } else {
      constexpr int kPer = kDV / 4;
#pragma unroll 8
      for (int c = part * kPer; c < (part + 1) * kPer; c += 2) {
        sum = dot2(*reinterpret_cast<const unsigned*>(o + c),
                   *reinterpret_cast<const unsigned*>(d + c), sum);
      }
    }
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  const long long row = (static_cast<long long>(b) * p.num_q_heads + h) * p.q_len;
  if (part == 0 && q < p.q_len) p.delta[row + q] = sum;
#if !KC_DETERMINISTIC
  const int rows = imin(kAttnBwdRowsPerCta, p.q_len - m0);
  float4* acc = reinterpret_cast<float4*>(p.dq_accum + (row + m0) * kDQK);
  for (int i = threadIdx.x; i < rows * kDQK / 4; i += kAttnBwdAuxThreads) {
    acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#endif
}

#if !KC_DETERMINISTIC
// dq = dq_accum in the dtype (the wgmma split path's dS leaves the softmax scale to this
// kernel; the other paths accumulate dQ already scaled). Grid as the preprocess.
extern "C" __global__ void __launch_bounds__(kcache::kAttnBwdAuxThreads)
    kcache_attn_bwd_dq_convert(const __grid_constant__ kcache::AttentionParams p) {
  using namespace kcache;
  using namespace kcache::attn_bwd;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int m0 = blockIdx.x * kAttnBwdRowsPerCta;
  const int rows = imin(kAttnBwdRowsPerCta, p.q_len - m0);
  const long long row = (static_cast<long long>(b) * p.num_q_heads + h) * p.q_len + m0;
  const float2* acc = reinterpret_cast<const float2*>(p.dq_accum + row * kDQK);
  elem_t* dq = static_cast<elem_t*>(p.dq) + b * p.dq_stride_b + h * p.dq_stride_h;
  if constexpr (kWg) {
    if (rows == kAttnBwdRowsPerCta) {
      // A whole query step, in the wgmma dK/dV kernel's staging order (wg_dq,
      // dq_stage_off): float4 f = (64-column half, warp w, n8 block nt, lane)
      // holds rows r, r + 8 x columns c, c + 1 of the accumulator fragment. Read in that order and
      // written row-major through shared memory, so that both sides are coalesced (rows padded by 8
      // floats: the 8 rows of a warp's stores fall on different banks).
      static_assert(!kWg || kAttnBwdRowsPerCta == kBM, "one dq_convert CTA per query step");
      constexpr int kPad = kDQK + 8;
      __shared__ __align__(16) float tile[kAttnBwdRowsPerCta * kPad];
      const float4* acc4 = reinterpret_cast<const float4*>(acc);
      for (int f = threadIdx.x; f < rows * kDQK / 4; f += kAttnBwdAuxThreads) {
        const int half = f >> 10, w = (f >> 8) & 3, nt = (f >> 5) & 7, ln = f & 31;
        const int r = 16 * w + (ln >> 2);
        const int c = 64 * half + 8 * nt + 2 * (ln & 3);
        float4 v = acc4[f];
        if constexpr (kWgSplit)
          v = make_float4(v.x * kScale, v.y * kScale, v.z * kScale, v.w * kScale);
        *reinterpret_cast<float2*>(tile + r * kPad + c) = make_float2(v.x, v.y);
        *reinterpret_cast<float2*>(tile + (r + 8) * kPad + c) = make_float2(v.z, v.w);
      }
      __syncthreads();
      for (int i = threadIdx.x; i < rows * kDQK / 4; i += kAttnBwdAuxThreads) {
        const int r = i / (kDQK / 4);
        const int c = (i % (kDQK / 4)) * 4;
        const float4 v = *reinterpret_cast<const float4*>(tile + r * kPad + c);
        *reinterpret_cast<uint2*>(dq + (m0 + r) * p.dq_stride_s + c) =
            make_uint2(pack2(v.x, v.y), pack2(v.z, v.w));
      }
      return;
    }
  }
  for (int i = threadIdx.x; i < rows * kDQK / 2; i += kAttnBwdAuxThreads) {
    const int r = i / (kDQK / 2);
    const int c = (i % (kDQK / 2)) * 2;
    float2 v = acc[i];
    if constexpr (kWgSplit) v = make_float2(v.x * kScale, v.y * kScale);
    *reinterpret_cast<unsigned*>(dq + (m0 + r) * p.dq_stride_s + c) = pack2(v.x, v.y);
  }
}
#endif

#if KC_MASK == KC_MASK_EXPR
// Tile classification with the backward's tiles (query tiles of
// KC_BWD_BLOCK_M, key tiles of KC_BWD_BLOCK_N). Grid
// (ceil(q_len / KC_BWD_BLOCK_M), num_q_heads, batch), 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    kcache_attn_bwd_mask_build(const __grid_constant__ kcache::AttentionParams p) {
  kcache::attn_fwd::classify_expr_tiles<KC_BWD_BLOCK_M, KC_BWD_BLOCK_N>(p);
}
#endif

#if KC_BWD_WGMMA && !KC_DETERMINISTIC
// A partial last query step's dQ partials (wg_dq), staged at `stage` (this
// thread's float4 j at stage + dq_stage_off(0, j)), added row-major into `dst` (the step's
// first row, this warpgroup's columns): lanes t4 and t4 ^ 1 swap halves (as
// dq_swap), so each adds four consecutive columns of row r0 + 8 (t4 & 1),
// columns 8 j + 2 (t4 & ~1) + [0, 4); rows at or past `rows` clamp to the
// last (their dS is 0). Out of line: the common path (bulk) then keeps the
// registers that this rarely taken one would hold (the softcap dK/dV spilled
// 56 B with it inlined).
namespace kcache {
namespace attn_bwd {
// Staging order of a warpgroup's 64 x 64 fp32 dQ block, which is also
// dq_accum's order of a whole query step (per 64-column half): thread t's
// float4 of n8 block nt (rows r, r + 8, columns c, c + 1 of its wgmma
// fragment) at [t / 32][nt][t % 32], so that a warp's 16 rows are 4 KB in one
// piece and a warp's stores are 512 contiguous bytes.
__device__ __forceinline__ unsigned dq_stage_off(int t, int nt) {
  return static_cast<unsigned>(((t >> 5) * 8 + nt) * 32 + (t & 31)) * 16;
}
__device__ __noinline__ void dq_add_rows(float* dst, unsigned stage, int r0, int rows, int t4) {
  const int odd = t4 & 1;
  const int r = imin(r0 + 8 * odd, rows - 1);
  float* const d = dst + r * kDQK + 2 * (t4 & ~1);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 v = ld_shared_v4(stage + dq_stage_off(0, j));
    const float x0 = __shfl_xor_sync(0xffffffffu, odd ? v.x : v.z, 1);
    const float x1 = __shfl_xor_sync(0xffffffffu, odd ? v.y : v.w, 1);
    const float w[4] = {odd ? x0 : v.x, odd ? x1 : v.y, odd ? v.z : x0, odd ? v.w : x1};
    red_add_v4(d + j * 8, w);
  }
}
}  // namespace attn_bwd
}  // namespace kcache
#endif

// ---------------------------------------------------------------------------
// dK, dV (and dQ by atomics unless deterministic).
// Grid (ceil(kv_len / KC_BWD_BLOCK_N), num_kv_heads, batch); AttentionBwdDkdvThreads threads
// (KC_BWD_NUM_WARPS * 32, and kProducer's warpgroup).
// ---------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kcache::AttentionBwdDkdvThreads(KC_BWD_NUM_WARPS,
                                                                             KC_BWD_WGMMA,
                                                                             KC_DETERMINISTIC),
                                             256 / (KC_BWD_NUM_WARPS * 32))
    kcache_attn_bwd_dkdv(const __grid_constant__ kcache::AttentionParams p) {
  using namespace kcache;
  using namespace kcache::attn_bwd;
  extern __shared__ __align__(128) unsigned char smem[];

  // kProducer: the producer warpgroup's threads take part in the prologue's
  // CTA barriers but none of its tid-strided work (their tid is past every
  // range), then leave for their own loop.
  const int tid_real = threadIdx.x;
  const bool producer = kProducer && tid_real >= kThreads;
  const int tid = producer ? tid_real + (1 << 20) : tid_real;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;
  const int l7 = lane & 7;
  // Heavy key tiles (the first: seen by every later query under causal
  // masks, and the drafter's context) start first within each chunk; under
  // GQA, the wgmma build's bands (launch_order_bands).
  int ktile, hkv, b;
  if (kWg && p.num_q_heads != p.num_kv_heads) {
    int lead, band;
    bands_for(gridDim.y * gridDim.z, lead, band);
    launch_order_bands(ktile, hkv, b, lead, band);
  } else {
    launch_order(ktile, hkv, b, p.num_q_heads != p.num_kv_heads ? 0x7fffffff : kHeadChunk);
  }
  const int n0 = ktile * kBN;
  const int q_len = p.q_len;
  const int kv_len = p.kv_len;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int off = KC_MASK_BOTTOM_RIGHT ? kv_len - q_len : 0;
  const int n_q_tiles = (q_len + kBM - 1) / kBM;

  // Shared memory (AttentionBwdDkdvSmemBytes).
  constexpr int kQB = kBM * kDQK * 2, kOB = kBM * kDV * 2;
  // kWg: the tiles start at the first 1024-byte boundary (wgmma's swizzle
  // atoms; AttentionBwdDkdvSmemBytes reserves the slack).
  const unsigned smem_raw = smem_u32(smem);
  const unsigned sK = kWg ? (smem_raw + 1023u) & ~1023u : smem_raw;
  unsigned char* const sbase = smem + (sK - smem_raw);
  const unsigned sV = sK + kBN * kDQK * 2;
  // Two stages of [Q | dO].
  const unsigned sQ = sV + kBN * kDV * 2;
  constexpr int kSB = kBN * kBM * 2;
  const unsigned sS = sQ + 2 * (kQB + kOB);  // kDsBufs dS^T [key][query] tiles
  // kWg: [2 warpgroups][4 warps][8 n8 blocks][32 lanes] float4 of dQ partials (dq_stage_off).
  const unsigned sDq = sS + kDsBufs * kSB;
  constexpr int kDqStage = AttentionBwdDqStageBytes(kBM, kWg);
  const unsigned sLse = sDq + kDqStage;  // [2][kBM] float, then delta [2][kBM]
  const unsigned sDel = sLse + 2 * kBM * 4;
  unsigned char* const base = sbase + (sDel + 2 * kBM * 4 - sK);
  int4* rowdata = reinterpret_cast<int4*>(base);  // [2][kBM]
  unsigned* list = reinterpret_cast<unsigned*>(base + 2 * kBM * 16);
  int* misc = reinterpret_cast<int*>(base + 2 * kBM * 16 + 4 * kList);
  // kBwdDrafterSort: query step qt holds blocks order[qt * kBwdBlocksPerStep + i].
  unsigned short* order = reinterpret_cast<unsigned short*>(base + 2 * kBM * 16 + 4 * kList + 16);
  // kWg: full[2] and empty[2] mbarriers of the producer's stages.
  const unsigned bar_full = smem_u32(order + kBwdSortCap);
  const unsigned bar_empty = bar_full + 16;
  static_assert(2 * kQB + 2 * kOB + kBN * (kDQK + kDV) * 2 + kDsBufs * kSB + 2 * kBM * 8 +
                        2 * kBM * 16 + 4 * kList + 16 + (kWg ? 1024 + 2 * kBwdSortCap + 32 : 0) +
                        kDqStage ==
                    AttentionBwdDkdvSmemBytes(KC_ARCH, kBM, kBN, kDQK, kDV, kWg),
                "shared-memory layout out of step with attention_tiles.h");
  static_assert(
      !kBwdDrafterSort || attn_fwd::drafter_rank_scratch_bytes(kBwdSortCap) <= 2 * (kQB + kOB),
      "the sort's scratch lives in the Q / dO stages");
  const float* lse_s = reinterpret_cast<const float*>(sbase + (sLse - sK));
  const float* del_s = reinterpret_cast<const float*>(sbase + (sDel - sK));

  const elem_t* kg = static_cast<const elem_t*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h;
  const elem_t* vg = static_cast<const elem_t*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h;
  if (!producer) {
    load_rows<kBN, kDQK, kWg>(sK, kg, p.k_stride_s, n0, kv_len, tid);
    load_rows<kBN, kDV, kWg>(sV, vg, p.v_stride_s, n0, kv_len, tid);
  }
  cp_async_commit();
#if KC_BWD_WGMMA && !KC_DETERMINISTIC
  // kProducer: full[2] (each producer thread arrives once its copies landed
  // and once for its row data) and empty[2] (each compute warp).
  if (tid_real == 0) {
    for (int i = 0; i < 2; ++i) {
      attn_fwd::mbar_init(bar_full + 8 * i, 2 * kProdThreads);
      attn_fwd::mbar_init(bar_empty + 8 * i, kNW);
    }
  }
  __syncthreads();
#endif

  bool permute = false;  // kBwdDrafterSort, this CTA: steps of sorted blocks
#if KC_MASK == KC_MASK_DRAFTER
  if constexpr (kBwdDrafterSort) {
    const int nb = p.drafter_num_blocks;
    permute = q_len == nb * kBwdBlk && q_len % kBM == 0 && nb <= kBwdSortCap &&
              n0 < p.drafter_context_len && n_q_tiles <= kList;
    if (permute) {
      // The sort's scratch in the Q / dO stages, unused until the first prefetch.
      permute = attn_fwd::drafter_rank_blocks<kThreads>(order, sbase + (sQ - sK), p, b, nb, tid);
    }
  }
#endif
  // Query index of the first row of block j of query step qt (permuted), and
  // of row r of query step qt.
  auto q_run = [&](int qt, int j) -> int {
    return static_cast<int>(order[qt * kBwdBlocksPerStep + j]) * kBwdBlk;
  };
  auto q_row = [&](int qt, int r) -> int {
    if (kBwdDrafterSort && permute) return q_run(qt, r / kBwdBlk) + r % kBwdBlk;
    return qt * kBM + r;
  };

  // ---- the walk: items (query head within the group, query tile, class) --
  int qt_lo = 0, qt_hi = n_q_tiles;
#if KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
  {
    // Query q sees key kv when kv - q is in [off - left, off + right].
    const int n1 = imin(n0 + kBN, kv_len);
    const int q_lo = kWinRight < 0 ? 0 : imax(0, n0 - off - kWinRight);
    const int q_hi = kWinLeft < 0 ? q_len : imin(q_len, n1 - 1 - off + kWinLeft + 1);
    if (q_hi > q_lo) {
      qt_lo = q_lo / kBM;
      qt_hi = (q_hi + kBM - 1) / kBM;
    } else {
      qt_hi = qt_lo;
    }
  }
#endif
  bool use_list = false;
  int count = 0;  // list entries (expression masks: over every head of the group)
  int n_items = group * (qt_hi - qt_lo);
#if KC_MASK == KC_MASK_DOCUMENT || KC_MASK == KC_MASK_DRAFTER || KC_MASK == KC_MASK_EXPR
#if KC_MASK == KC_MASK_EXPR
  const int n_class = group * n_q_tiles;
#else
  const int n_class = n_q_tiles;
#endif
  use_list = n_class <= kList;
  if (use_list) {
#if KC_MASK == KC_MASK_DOCUMENT
    doc_tile_classes<false>(list, p.kv_seq_id + b * p.kv_seq_id_stride_b, n0,
                            imin(n0 + kBN, kv_len), kBN, p.q_seq_id + b * p.q_seq_id_stride_b, kBM,
                            n_q_tiles, q_len, warp, lane);
#elif KC_MASK == KC_MASK_DRAFTER
    for (int qt = tid; qt < n_q_tiles; qt += kThreads) {
      int c;
      if (kBwdDrafterSort && permute) {  // whole steps of whole blocks
        const int n1 = imin(n0 + kBN, kv_len);
        bool any = false, all = n1 - n0 == kBN;
        for (int i = 0; i < kBwdBlocksPerStep; ++i) {
          const int q = q_row(qt, i * kBwdBlk);
          drafter_rows_class(p, b, q, q + kBwdBlk, n0, n1, any, all);
        }
        c = any ? (all ? 2 : 1) : 0;
      } else {
        c = classify_pair(p, b, qt * kBM, kBM, n0, kBN, q_len, kv_len, off);
      }
      list[qt] = static_cast<unsigned>(c);
    }
#else
    const bool kv_inb = n0 + kBN <= kv_len;
    for (int e = tid; e < n_class; e += kThreads) {
      const int hh = e / n_q_tiles, qt = e % n_q_tiles;
      int c = 1;
      if (p.tile_class != nullptr) {
        c = p.tile_class[(KC_EXPR_MASK_READS_B ? b : 0) * p.tile_class_stride_b +
                         (KC_EXPR_MASK_READS_H ? hkv * group + hh : 0) * p.tile_class_stride_h +
                         qt * p.tile_class_stride_m + ktile];
        c = c < 0 || c > 2 ? 1 : c;
      }
      if (c == 2 && !(kv_inb && qt * kBM + kBM <= q_len)) c = 1;
      list[e] = static_cast<unsigned>(c);
    }
#endif
    count = finish_list(list, n_class, misc, warp, lane);
    n_items = KC_MASK == KC_MASK_EXPR ? count : group * count;
  }
#endif
  // Item it -> (hh, qt, cls). With several query heads per key head (GQA),
  // the last query tile first and the group's heads inner: the CTAs of one
  // (batch, key head) start together (launch_order) and then read the same
  // Q / dO rows at about the same time, where each walking one head's tiles
  // upward from its own first visible tile drifted apart (sorted drafter
  // dK/dV -7 to -12 %, random -7 %, H100, session 26). One head per key head
  // keeps the ascending order: reversed alone, causal and no-mask measured 0
  // to +4 %. The wgmma builds only, where it was measured: the portable
  // kernels' registers (255, some spilling) moved with it.
  const bool heads_inner = kWg && group > 1;
  // The walk's position. The wgmma build's item it is (outer, inner) = (it /
  // group, it % group): with heads inner, the list position from the end and
  // the head; with one head per key head, (it, 0). Kept as counters (walk_next)
  // because a division per step put the software division's ~25 dependent
  // instructions (I2F, MUFU.RCP, F2I, fix-ups) between each step's CTA barrier
  // and its first wgmma. The portable build divides it as before.
  struct WalkPos {
    int it, outer, inner;
  };
  auto walk_next = [&](WalkPos w) {
    ++w.it;
    if (++w.inner == group) {
      w.inner = 0;
      ++w.outer;
    }
    return w;
  };
  auto item_of = [&](const WalkPos& w, int& hh, int& qt, int& cls) {
    const int it = w.it;
    if (use_list) {
      const int pos = !kWg ? it % count : heads_inner ? count - 1 - w.outer : w.outer;
      const unsigned e = list[KC_MASK == KC_MASK_EXPR ? it : pos];
      const int idx = static_cast<int>(e & 0x3fffffffu);
      cls = static_cast<int>(e >> 30);
      if (KC_MASK == KC_MASK_EXPR) {
        hh = idx / n_q_tiles;
        qt = idx % n_q_tiles;
      } else {
        hh = kWg ? w.inner : it / count;
        qt = idx;
      }
    } else {
      const int nr = qt_hi - qt_lo;
      hh = kWg ? w.inner : it / nr;
      qt = !kWg ? qt_lo + it % nr : heads_inner ? qt_hi - 1 - w.outer : qt_lo + w.outer;
      cls = kListMask ? 1 : classify_pair(p, b, qt * kBM, kBM, n0, kBN, q_len, kv_len, off);
    }
  };

  // Q, dO, LSE and delta of item it into stage st.
  // Query step it's source: its query tile and head, and where its Q and dO
  // rows start (the compute warps' prefetch and kProducer's loop share it).
  struct StepSrc {
    int qt, hq, m0;
    const elem_t* qg;
    const elem_t* og;
  };
  auto step_src = [&](const WalkPos& w) -> StepSrc {
    int hh, qt, cls;
    item_of(w, hh, qt, cls);
    const int hq = hkv * group + hh;
    return {qt, hq, qt * kBM,
            static_cast<const elem_t*>(p.q) + b * p.q_stride_b + hq * p.q_stride_h,
            static_cast<const elem_t*>(p.dout) + b * p.do_stride_b + hq * p.do_stride_h};
  };
  // Row r's LSE and delta of step src into stage st; returns its query index.
  auto copy_lse_delta = [&](const StepSrc& src, int st, int r) -> int {
    const int q = q_row(src.qt, r);
    const bool ok = q < q_len;
    const float* l = p.lse + b * p.lse_stride_b + src.hq * p.lse_stride_h + q;
    const float* d = p.delta + (static_cast<long long>(b) * p.num_q_heads + src.hq) * q_len + q;
    cp_async4(sLse + (st * kBM + r) * 4, ok ? l : p.lse, ok);
    cp_async4(sDel + (st * kBM + r) * 4, ok ? d : p.delta, ok);
    return q;
  };
  auto prefetch = [&](const WalkPos& w, int st) {
    const StepSrc src = step_src(w);
    const int qt = src.qt;
    if (kBwdDrafterSort && permute) {  // whole blocks, every row below q_len
      auto run_row = [&](int j) { return q_run(qt, j); };
      attn_fwd::load_tile_runs<kBM, kDQK, kBwdBlk, kThreads, kWg>(sQ + st * (kQB + kOB), src.qg,
                                                                  p.q_stride_s, run_row, tid);
      attn_fwd::load_tile_runs<kBM, kDV, kBwdBlk, kThreads, kWg>(
          sQ + st * (kQB + kOB) + kQB, src.og, p.do_stride_s, run_row, tid);
    } else {
      load_rows<kBM, kDQK, kWg>(sQ + st * (kQB + kOB), src.qg, p.q_stride_s, src.m0, q_len, tid);
      load_rows<kBM, kDV, kWg>(sQ + st * (kQB + kOB) + kQB, src.og, p.do_stride_s, src.m0, q_len,
                               tid);
    }
    if (tid < kBM) copy_lse_delta(src, st, tid);
  };

  // Keys of this thread's accumulator rows and their document ids.
  const int key_row0 = warp * 16 + g;  // + 8 * hh
  int kv_id[2] = {0, 0};
#if KC_MASK == KC_MASK_DOCUMENT
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int kv = n0 + key_row0 + 8 * hh;
    kv_id[hh] = kv < kv_len ? p.kv_seq_id[b * p.kv_seq_id_stride_b + kv] : 0;
  }
#endif

  if (n_items > 0 && !kProducer) {
    prefetch(WalkPos{0, 0, 0}, 0);
    if constexpr (kRowData) {
      if (tid < kBM) {
        int hh, qt, cls;
        item_of(WalkPos{0, 0, 0}, hh, qt, cls);
        const int q = q_row(qt, tid);
        rowdata[tid] = row_data(p, q, row_raw(p, b, hkv * group + hh, q));
      }
    }
  }
  cp_async_commit();

  const Lane ln = lane_addressing(lane);
  const unsigned akey = ln.akey;
  const int brow = ln.brow;
  const int trow = ln.trow;
  const unsigned k_a = sK + (warp * 16 + (lane & 15)) * (kDQK * 2);
  const unsigned v_a = sV + (warp * 16 + (lane & 15)) * (kDV * 2);

#if !KC_DETERMINISTIC
  // dQ = dS K for a query step, in pieces: warp w computes a 32 x 32 block
  // (rows 32 * (w % 2), columns c0 = 32 * (w / 2) + k * 32 * kNW / 2): two
  // m16 tiles share each K fragment and two n8 pairs share each dS fragment.
  // dS comes from dS^T (transposed) or, with kFa2, from dS [query][key]; K
  // transposed.
  constexpr int kColGroups = kNW / 2;
  const int r0w = (warp & 1) * 32;
  auto dq_gemm = [&](float(&acc)[2][4][4], unsigned ds_t, int c0) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      unsigned da[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        if constexpr (kFa2) {  // dS [query][key]
          ldsm_x4(ds_t + (r0w + mt * 16 + (lane & 15)) * (kBN * 2) + ((kk * 32) ^ akey), da[mt][0],
                  da[mt][1], da[mt][2], da[mt][3]);
        } else {  // dS^T [key][query]
          const int ds_chunk = (r0w >> 3) + 2 * mt + ((lane >> 3) & 1);
          ldsm_x4_t(ds_t + (kk * 16 + brow) * (kBM * 2) + ((ds_chunk ^ l7) << 4), da[mt][0],
                    da[mt][1], da[mt][2], da[mt][3]);
        }
      }
      gemm_step_ab_mn<kDQK>(acc, da, sK, kk, c0 / 16, ln);
    }
  };
  // sm_90+ (vector reductions): lanes t4 and t4 ^ 1 swap halves so that each
  // adds four consecutive columns of one row (even t4: row g, odd: row g + 8),
  // a quarter of the scalar reductions. Afterwards acc[mt][dt] holds columns
  // 8 dt + [0, 4) from dq_dst(.., mt) on.
  const int odd = t4 & 1;
  auto dq_swap = [&](float(&acc)[2][4][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int dt = 0; dt < 4; ++dt) {
        const float s0 = odd ? acc[mt][dt][0] : acc[mt][dt][2];
        const float s1 = odd ? acc[mt][dt][1] : acc[mt][dt][3];
        const float x0 = __shfl_xor_sync(0xffffffffu, s0, 1);
        const float x1 = __shfl_xor_sync(0xffffffffu, s1, 1);
        if (odd) {
          acc[mt][dt][0] = x0;
          acc[mt][dt][1] = x1;
        } else {
          acc[mt][dt][2] = x0;
          acc[mt][dt][3] = x1;
        }
      }
    }
  };
  // Where the swapped acc[mt] goes. Rows past q_len are clamped to the last
  // row: their dS rows are exactly zero (masked), so they add zeros there,
  // and the reductions need neither a branch nor a predicate (ptxas turned
  // a predicated one into a branch per reduction).
  auto dq_dst = [&](int hq, int m0, int c0, int mt) {
    const int r = imin(r0w + mt * 16 + g + 8 * odd, q_len - 1 - m0);
    return p.dq_accum + ((static_cast<long long>(b) * p.num_q_heads + hq) * q_len + m0 + r) * kDQK +
           c0 + 2 * (t4 & ~1);
  };
  // The whole dQ partial of the item at (query head hq, rows m0) from its dS at ds_t.
  auto dq_step = [&](int hq, int m0, unsigned ds_t) {
#pragma unroll
    for (int c0 = (warp >> 1) * 32; c0 < kDQK; c0 += 32 * kColGroups) {
      float acc[2][4][4];
      dq_gemm(acc, ds_t, c0);
#if KC_ARCH >= 90
      dq_swap(acc);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        float* dst = dq_dst(hq, m0, c0, mt);
#pragma unroll
        for (int dt = 0; dt < 4; ++dt) red_add_v4(dst + dt * 8, acc[mt][dt]);
      }
#else
      float* acc_row =
          p.dq_accum + ((static_cast<long long>(b) * p.num_q_heads + hq) * q_len + m0) * kDQK;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int hh2 = 0; hh2 < 2; ++hh2) {
          const int r = r0w + mt * 16 + g + 8 * hh2;
          if (m0 + r < q_len) {
            float* dst = acc_row + r * kDQK + c0 + 2 * t4;
#pragma unroll
            for (int dt = 0; dt < 4; ++dt) {
              atomicAdd(dst + dt * 8, acc[mt][dt][hh2 * 2]);
              atomicAdd(dst + dt * 8 + 1, acc[mt][dt][hh2 * 2 + 1]);
            }
          }
        }
      }
#endif
    }
  };
  int prev_hq = 0, prev_m0 = 0;  // the item before `it`
#endif

#if KC_BWD_WGMMA
  // kWg (see kWg above): warpgroup wg owns keys 64 wg + [0, 64); its
  // accumulators have the 16-keys-per-warp mma.sync layout (rows
  // 16 (warp % 4) + g (+ 8) of the warpgroup, i.e. key_row0).
  // Broadcast from lane 0: ptxas then knows wg is warp-uniform and keeps the K / V
  // descriptors in uniform registers, instead of rebuilding each in vector registers
  // and moving it over (R2UR) before every wgmma.
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);
  // S^T = K Q^T and dP^T = V dO^T of the stage at q_s / o_s, waited.
  auto wg_sdp = [&](float(&s)[kNT][4], float(&dp)[kNT][4], unsigned q_s, unsigned o_s) {
    const unsigned long long dk0 = smem_desc(sK + wg * (64 * 128), 16, 1024);
    const unsigned long long dq0 = smem_desc(q_s, 16, 1024);
    const unsigned long long dv0 = smem_desc(sV + wg * (64 * 128), 16, 1024);
    const unsigned long long do0 = smem_desc(o_s, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKQ; ++kk) {
      // k16 step kk: 64-column block kk / 4, 32-byte offset (kk % 4) in it.
      wgmma_ss(s, dk0 + ((((kk >> 2) * kBN * 128) + (kk & 3) * 32) >> 4),
               dq0 + ((((kk >> 2) * kBM * 128) + (kk & 3) * 32) >> 4), kk > 0 ? 1 : 0);
    }
#pragma unroll
    for (int kk = 0; kk < kKV; ++kk) {
      wgmma_ss(dp, dv0 + ((((kk >> 2) * kBN * 128) + (kk & 3) * 32) >> 4),
               do0 + ((((kk >> 2) * kBM * 128) + (kk & 3) * 32) >> 4), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    fence_regs(dp);
  };
  // The same, not waited: S^T and dP^T as two commit groups (kWgSplit).
  auto wg_sdp_issue = [&](float(&s)[kNT][4], float(&dp)[kNT][4], unsigned q_s, unsigned o_s) {
    const unsigned long long dk0 = smem_desc(sK + wg * (64 * 128), 16, 1024);
    const unsigned long long dq0 = smem_desc(q_s, 16, 1024);
    const unsigned long long dv0 = smem_desc(sV + wg * (64 * 128), 16, 1024);
    const unsigned long long do0 = smem_desc(o_s, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKQ; ++kk) {
      wgmma_ss(s, dk0 + ((((kk >> 2) * kBN * 128) + (kk & 3) * 32) >> 4),
               dq0 + ((((kk >> 2) * kBM * 128) + (kk & 3) * 32) >> 4), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kKV; ++kk) {
      wgmma_ss(dp, dv0 + ((((kk >> 2) * kBN * 128) + (kk & 3) * 32) >> 4),
               do0 + ((((kk >> 2) * kBM * 128) + (kk & 3) * 32) >> 4), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
#endif

#if KC_BWD_WGMMA && !KC_DETERMINISTIC
  // kWg: dQ = dS K of a query step, issued in the next step from the dS^T
  // tile both warpgroups wrote, then added to dq_accum. A whole query step's
  // rows are one contiguous block of dq_accum: a warpgroup stages its 64 x 64
  // fp32 block in shared memory in the accumulator's own order (dq_stage_off:
  // no bank conflicts, a warp's 16 rows contiguous) and one thread hands it to the TMA
  // unit as a single bulk reduction, which drains while the step runs on
  // (kcache_attn_bwd_dq_convert reads that order back). A last, partial step
  // (q_len not a multiple of 64) adds its rows row-major with vector
  // reductions instead. Head dim 64: one warpgroup per step, alternating,
  // computes the whole 64 x 64 dQ over all kBN keys, so that a step adds one
  // block to dq_accum rather than one per warpgroup over its own keys (causal
  // B8 H32 S2048 D64 dK/dV 1.570 -> 1.338 ms on an H200).
  const int wtid = tid & 127;
  // dQ of query step j (at query head hq, rows m0) from its dS^T tile (buffer
  // j % 2), by both warpgroups (head dim 128: columns 64 wg + [0, 64)) or by
  // warpgroup j % 2 (head dim 64: all 64 columns), over all kBN keys: dS^T
  // [key][query] is A read M-major (one 64-query block), K is B read N-major.
  // Waited, then staged in this warpgroup's half of sDq (free: bulk_wait_read
  // before the last CTA barrier) and handed on.
  auto wg_dq = [&](int j, int hq, int m0) {
    if (kDQK == 64 && wg != (j & 1)) return;
    constexpr int kDqK16 = kBN / 16;
    const unsigned b0 = sK + (kDQK == 128 ? wg * (kBN * 128) : 0);
    const unsigned long long da = smem_desc(sS + (j & 1) * kSB, 64 * 128, 1024);
    const unsigned long long db = smem_desc(b0, kBN * 128, 1024);
    float qa[8][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqK16; ++kk) {
      wgmma_ss_tt(qa, da + ((kk * 16 * 128) >> 4), db + ((kk * 16 * 128) >> 4), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(qa);
    const unsigned stage = sDq + wg * (kDqStage / 2);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) st_shared_v4(stage + dq_stage_off(wtid, nt), qa[nt]);
    const bool whole = m0 + kBM <= q_len;
    if (whole) fence_proxy_async();  // the staged partials -> the bulk reduction
    named_bar_sync(3 + wg, 128);
    float* const head =
        p.dq_accum + (static_cast<long long>(b) * p.num_q_heads + hq) * q_len * kDQK;
    float* const tile = head + static_cast<long long>(m0) * kDQK;
    if (kBwdDrafterSort && permute) {
      // Gathered rows (whole steps): warp w4's 16 rows are 16 consecutive rows
      // of one block, 4 KB of the staging order, whose place in dq_accum's
      // whole-step order is the same 4 KB of the step that holds them: four
      // bulk reductions (32 of 512 bytes in the previous order cost the
      // random drafter dK/dV ~0.55 ms of 4.07 on an H200).
      if (wtid < 4) {
        const int q = q_row(m0 / kBM, 16 * wtid);
        float* dst = head + static_cast<long long>(q & ~(kBM - 1)) * kDQK +
                     (kDQK == 128 ? wg * 64 * 64 : 0) +
                     dq_stage_off(32 * ((q & (kBM - 1)) >> 4), 0) / 4;  // its warp's place
        bulk_reduce_add_f32(dst, stage + dq_stage_off(32 * wtid, 0), dq_stage_off(32, 0));
      }
    } else if (whole) {
      if (wtid == 0)
        bulk_reduce_add_f32(tile + (kDQK == 128 ? wg * 64 * 64 : 0), stage, kDqStage / 2);
    } else {
      dq_add_rows(tile + (kDQK == 128 ? 64 * wg : 0), stage + dq_stage_off(wtid, 0),
                  (warp & 3) * 16 + g, q_len - m0, t4);
    }
  };
#endif

#if KC_BWD_WGMMA && !KC_DETERMINISTIC
  // kSplitBar: this warpgroup's dS^T of step j stored (fenced for wgmma's reads).
  auto ds_bar_arrive = [&](int j) {
    if constexpr (kSplitBar) {
      fence_proxy_async();
      attn_fwd::named_bar_arrive(5 + 2 * wg + (j & 1), kThreads);
    }
  };
  // Before dQ(j) reads both warpgroups' dS^T(j): kSplitBar, the other's arrive;
  // otherwise the compute warps' barrier.
  auto ds_bar_sync = [&](int j) {
    if constexpr (kSplitBar) {
      named_bar_sync(5 + 2 * (wg ^ 1) + (j & 1), kThreads);
    } else {
      named_bar_sync(1, kThreads);
    }
  };
#endif
  float dk[kDTQ][4];
  float dv[kDTV][4];
#pragma unroll
  for (int i = 0; i < kDTQ; ++i) dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.f;
#pragma unroll
  for (int i = 0; i < kDTV; ++i) dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.f;
  // kFa2: dK and dV of keys 32 (warp / 2) + [0, 32), columns (warp % 2) D / 2 + [0, D / 2)
  // (unused, and left out by the compiler, otherwise).
  float dk2[2][kDQK / 16][4];
  float dv2[2][kDV / 16][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int i = 0; i < kDQK / 16; ++i)
      dk2[mt][i][0] = dk2[mt][i][1] = dk2[mt][i][2] = dk2[mt][i][3] = 0.f;
#pragma unroll
    for (int i = 0; i < kDV / 16; ++i)
      dv2[mt][i][0] = dv2[mt][i][1] = dv2[mt][i][2] = dv2[mt][i][3] = 0.f;
  }
  // kFa2: the document ids of this thread's 8 S columns (keys 32 (warp / 2) + 8 nt + 2 t4 + c).
  int kv_id8[8] = {};
#if KC_MASK == KC_MASK_DOCUMENT
  if constexpr (kFa2) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int kv = n0 + (warp >> 1) * 32 + (i >> 1) * 8 + 2 * t4 + (i & 1);
      kv_id8[i] = kv < kv_len ? p.kv_seq_id[b * p.kv_seq_id_stride_b + kv] : 0;
    }
  }
#endif

#if KC_BWD_WGMMA && !KC_DETERMINISTIC  // kProducer
  if (producer) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    const int ptid = tid_real - kThreads;
    for (WalkPos w{0, 0, 0}; w.it < n_items; w = walk_next(w)) {
      const int it = w.it;
      const int st = it & 1;
      if (it >= 2) attn_fwd::mbar_wait(bar_empty + 8 * st, ((it >> 1) - 1) & 1);
      const StepSrc src = step_src(w);
      const int qt = src.qt;
      const unsigned qd = sQ + st * (kQB + kOB), od = qd + kQB;
      // The copies of prefetch (above) by this warpgroup's threads.
      if (kBwdDrafterSort && permute) {
        auto run_row = [&](int j) { return q_run(qt, j); };
        attn_fwd::load_tile_runs<kBM, kDQK, kBwdBlk, kProdThreads, kWg>(qd, src.qg, p.q_stride_s,
                                                                        run_row, ptid);
        attn_fwd::load_tile_runs<kBM, kDV, kBwdBlk, kProdThreads, kWg>(od, src.og, p.do_stride_s,
                                                                       run_row, ptid);
      } else {
        attn_fwd::load_tile<kBM, kDQK, kProdThreads, kWg>(qd, src.qg, p.q_stride_s, src.m0, q_len,
                                                          ptid);
        attn_fwd::load_tile<kBM, kDV, kProdThreads, kWg>(od, src.og, p.do_stride_s, src.m0, q_len,
                                                         ptid);
      }
      if (ptid < kBM) {
        const int q = copy_lse_delta(src, st, ptid);
        if constexpr (kRowData) rowdata[st * kBM + ptid] = row_data(p, q, row_raw(p, b, src.hq, q));
      }
      attn_fwd::mbar_arrive_cp_async(bar_full + 8 * st);  // once the copies landed
      attn_fwd::mbar_arrive(bar_full + 8 * st);           // the row data (release)
    }
    // Leave only once the compute warps are done with every stage.
    for (int it = n_items - 2 > 0 ? n_items - 2 : 0; it < n_items; ++it)
      attn_fwd::mbar_wait(bar_empty + 8 * (it & 1), (it >> 1) & 1);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
#endif
  for (WalkPos w{0, 0, 0}; w.it < n_items; w = walk_next(w)) {
    const int it = w.it;
    const int st = it & 1;
    cp_async_wait<0>();
#if KC_BWD_WGMMA
    if constexpr (kProducer) attn_fwd::mbar_wait(bar_full + 8 * st, (it >> 1) & 1);
    fence_proxy_async();  // cp.async writes (and kWgDqLag's dS^T stores) -> wgmma reads
#if !KC_DETERMINISTIC
    if (wtid < 32) bulk_wait_read();  // sDq free for dQ(it - 1) (the threads that issued)
#endif
#endif
#if KC_BWD_WGMMA && !KC_DETERMINISTIC
    // item it landed; everyone is done with item it - 1 (kProducer: the
    // compute warps only). kSplitBar after the first step: the other
    // warpgroup's dS^T(it - 1) is stored (the first also covers K and V).
    if (kSplitBar && it > 0) {
      ds_bar_sync(it - 1);
    } else {
      named_bar_sync(1, kThreads);
    }
#else
    __syncthreads();
#endif
    RowRaw next_raw{0, 0, make_int4(0, 0, 0, 0)};
    int next_q = 0;
    if (!kProducer && it + 1 < n_items) {
      const WalkPos next = walk_next(w);
      prefetch(next, st ^ 1);
      if constexpr (kRowData) {
        if (tid < kBM) {
          int hh, qt, cls;
          item_of(next, hh, qt, cls);
          next_q = q_row(qt, tid);
          next_raw = row_raw(p, b, hkv * group + hh, next_q);
        }
      }
    }
    cp_async_commit();

    int hh, qt, cls;
    item_of(w, hh, qt, cls);
    const int hq = hkv * group + hh;
    const int m0 = qt * kBM;
    const unsigned q_s = sQ + st * (kQB + kOB);
    const unsigned o_s = q_s + kQB;
#if !KC_DETERMINISTIC
    if constexpr (kDqLag) {
      if (it > 0) dq_step(prev_hq, prev_m0, sS + (st ^ 1) * kSB);
    }
#endif
#if KC_BWD_WGMMA && !KC_DETERMINISTIC
    // kWgDqLag: dQ of the previous step, waited before this step's S^T and
    // dP^T are issued (issued ahead of them and stored while they ran: the
    // same time on dense masks, 7 % slower on the drafter's).
    if (it > 0) wg_dq(it - 1, prev_hq, prev_m0);
#endif

    if constexpr (kWgSplit) {
#if KC_BWD_WGMMA
      // kWg without a score modification: S^T and dP^T committed as two
      // groups; P is computed while dP^T runs, and dV += P^T dO is issued
      // before dS is computed, so that the dP and dV wgmmas overlap the
      // elementwise work (masked P is exactly 0, so dS = P (dP - delta) needs
      // no second select).
      float s[kNT][4], dp[kNT][4];
      wg_sdp_issue(s, dp, q_s, o_s);
      const float* lse_st = lse_s + st * kBM;
      const float* del_st = del_s + st * kBM;
      const int4* rd_st = rowdata + st * kBM;
      // kLseEarly: this thread's 2 kNT log2-domain LSEs read while S^T runs.
      float l2s[kLseEarly ? kNT : 1][2];
      if constexpr (kLseEarly) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) l2s[nt][c] = lse_st[nt * 8 + 2 * t4 + c] * kLog2e;
        }
      }
      wgmma_wait<1>();  // S^T
      fence_regs(s);
#pragma unroll
      for (int full = 1; full >= 0; --full) {
        if (full != (cls == 2)) continue;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int qi = nt * 8 + 2 * t4 + c;
            // lse_log2 without its -inf test: a row whose LSE is -inf saw no key, so
            // each of its elements is invisible and the select below drops its P (+inf).
            const float l2 = kLseEarly ? l2s[kLseEarly ? nt : 0][c] : lse_st[qi] * kLog2e;
            int4 rd = make_int4(0, 0, 0, 0);
            if constexpr (kRowData) rd = rd_st[qi];
#pragma unroll
            for (int hh2 = 0; hh2 < 2; ++hh2) {
              const int kv = n0 + key_row0 + 8 * hh2;
              const bool vis =
                  full || visible(p, b, hq, m0 + qi, kv, q_len, kv_len, off, rd, kv_id[hh2]);
              const float pe = exp2_approx(fmaf(s[nt][hh2 * 2 + c], kScale * kLog2e, -l2));
              s[nt][hh2 * 2 + c] = vis ? pe : 0.f;
            }
          }
        }
      }
      unsigned pa[kNT / 2][4];
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) pack_a(s, kk, pa[kk]);
      {
        const unsigned long long bo = smem_desc(o_s, kBM * 128, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kNT / 2; ++kk) wgmma_rs(dv, pa[kk], bo + ((kk * 16 * 128) >> 4));
        wgmma_commit();
      }
      wgmma_wait<1>();  // dP^T (dV may still run)
      fence_regs(dp);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float del = del_st[nt * 8 + 2 * t4 + c];
#pragma unroll
          for (int hh2 = 0; hh2 < 2; ++hh2) {
            // The softmax scale left out of dS (one multiply per element): dK takes it
            // once in the epilogue, dQ in kcache_attn_bwd_dq_convert.
            dp[nt][hh2 * 2 + c] = s[nt][hh2 * 2 + c] * (dp[nt][hh2 * 2 + c] - del);
          }
        }
      }
      unsigned sa[kNT / 2][4];
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        pack_a(dp, kk, sa[kk]);
#if !KC_DETERMINISTIC
        store_ds_t(sS + st * kSB, key_row0, kk, t4, sa[kk]);
#endif
      }
#if !KC_DETERMINISTIC
      ds_bar_arrive(it);
#endif
      {
        const unsigned long long bq = smem_desc(q_s, kBM * 128, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kNT / 2; ++kk) wgmma_rs(dk, sa[kk], bq + ((kk * 16 * 128) >> 4));
        wgmma_commit();
      }
      wgmma_wait<0>();  // dV / dK: their A registers, the Q / dO stage
#endif
    } else if constexpr (kFa2) {
      // S = Q K^T and dP = dO V^T: warp (wm, wn) = (warp % 2, warp / 2) owns
      // queries 32 wm + [0, 32) x keys 32 wn + [0, 32).
      const int wm = warp & 1, wn = warp >> 1;
      float s[2][4][4], dp[2][4][4];
      const unsigned q_a = q_s + (wm * 32 + (lane & 15)) * (kDQK * 2);
      const unsigned o_a = o_s + (wm * 32 + (lane & 15)) * (kDV * 2);
      gemm_abt_mn<kDQK, 2, 4>(s, q_a, sK + wn * 32 * (kDQK * 2), ln);
      gemm_abt_mn<kDV, 2, 4>(dp, o_a, sV + wn * 32 * (kDV * 2), ln);
      ScoreCtx sc{0.f};
#if KC_SCORE_MOD == KC_SCORE_ALIBI
      sc.alibi_slope = p.alibi_slopes[hq];
#endif
      const unsigned sP = sS, sDs = sS + kSB;  // [query][key], 16-byte chunks swizzled
#pragma unroll
      for (int full = 1; full >= 0; --full) {  // kTileCopies
        if (kTileCopies ? full != (cls == 2) : full) continue;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int hh2 = 0; hh2 < 2; ++hh2) {
            const int qi = wm * 32 + mt * 16 + g + 8 * hh2;
            const float l2 = lse_log2(lse_s[st * kBM + qi]);
            const float del = del_s[st * kBM + qi];
            int4 rd = make_int4(0, 0, 0, 0);
            if constexpr (kRowData) rd = rowdata[st * kBM + qi];
            const int q = m0 + qi;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int kv = n0 + wn * 32 + nt * 8 + 2 * t4 + c;
                const bool vis =
                    full || visible(p, b, hq, q, kv, q_len, kv_len, off, rd, kv_id8[nt * 2 + c]);
                float pe, ds;
                element_grad(s[mt][nt][hh2 * 2 + c], dp[mt][nt][hh2 * 2 + c], l2, del, vis, sc, b,
                             hq, q, kv, p, true, pe, ds);
                s[mt][nt][hh2 * 2 + c] = pe;
                dp[mt][nt][hh2 * 2 + c] = ds;
              }
              const unsigned off_b = qi * (kBN * 2) + (((wn * 4 + nt) ^ (qi & 7)) << 4) + t4 * 4;
              st_shared_u32(sP + off_b, pack2(s[mt][nt][hh2 * 2], s[mt][nt][hh2 * 2 + 1]));
              st_shared_u32(sDs + off_b, pack2(dp[mt][nt][hh2 * 2], dp[mt][nt][hh2 * 2 + 1]));
            }
          }
        }
      }
      __syncthreads();  // P and dS complete
      // dV += P^T dO, then dQ = dS K, then dK += dS^T Q with dQ's
      // reductions spread over its k loop: warp (wk, wd) = (warp / 2, warp % 2) owns keys
      // 32 wk + [0, 32) x columns wd D / 2 + [0, D / 2). A (P^T, dS^T) is read
      // transposed from the [query][key] tiles.
      const int wk = warp >> 1, wd = warp & 1;
      gemm_tn_keys<kDV>(dv2, sP, o_s, wk, wd * (kDV / 32), ln, lane);
#if !KC_DETERMINISTIC
      // This warp's dQ block (at most one: 8 warps, D <= 128), its
      // reductions two per k step of dK, so that they leave the LSU queue at
      // the MMAs' pace rather than as a burst of 8 (whose source registers
      // then held up dK's first ldmatrix: causal D128 dK/dV 5.35 -> 5.26 ms).
      const int c0 = (warp >> 1) * 32;
      const bool has = kDQK >= 32 * kColGroups || c0 < kDQK;
      float dacc[2][4][4];
      if (has) {
        dq_gemm(dacc, sDs, c0);
        dq_swap(dacc);
      }
      float* const dst0 = dq_dst(hq, m0, c0, 0);
      float* const dst1 = dq_dst(hq, m0, c0, 1);
      gemm_tn_keys<kDQK>(dk2, sDs, q_s, wk, wd * (kDQK / 32), ln, lane, [&](int kk) {
        if (has) {
#pragma unroll
          for (int j = 2 * kk; j < 2 * kk + 2; ++j) {
            red_add_v4((j < 4 ? dst0 : dst1) + (j & 3) * 8, dacc[j >> 2][j & 3]);
          }
        }
      });
#else
      gemm_tn_keys<kDQK>(dk2, sDs, q_s, wk, wd * (kDQK / 32), ln, lane);
#endif
    } else {
      // S^T = K Q^T and dP^T = V dO^T: 16 keys x 64 queries per warp.
      float s[kNT][4], dp[kNT][4];
#if KC_BWD_WGMMA
      wg_sdp(s, dp, q_s, o_s);
#else
      gemm_abt<kDQK>(s, k_a, q_s, ln);
      gemm_abt<kDV>(dp, v_a, o_s, ln);
#endif

      // P and dS in place (s <- P, dp <- dS), per element.
      {
        ScoreCtx sc{0.f};
#if KC_SCORE_MOD == KC_SCORE_ALIBI
        sc.alibi_slope = p.alibi_slopes[hq];
#endif
        const float* lse_st = lse_s + st * kBM;
        const float* del_st = del_s + st * kBM;
        const int4* rd_st = rowdata + st * kBM;
#pragma unroll
        for (int full = 1; full >= 0; --full) {  // kTileCopies
          if (kTileCopies ? full != (cls == 2) : full) continue;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int qi = nt * 8 + 2 * t4 + c;
              const float l2 = lse_log2(lse_st[qi]);
              const float del = del_st[qi];
              int4 rd = make_int4(0, 0, 0, 0);
              if constexpr (kRowData) rd = rd_st[qi];
#pragma unroll
              for (int hh2 = 0; hh2 < 2; ++hh2) {
                const int kv = n0 + key_row0 + 8 * hh2;
                const int q = m0 + qi;
                const bool vis =
                    full || visible(p, b, hq, q, kv, q_len, kv_len, off, rd, kv_id[hh2]);
                float pe, ds;
                element_grad(s[nt][hh2 * 2 + c], dp[nt][hh2 * 2 + c], l2, del, vis, sc, b, hq, q,
                             kv, p, true, pe, ds);
                s[nt][hh2 * 2 + c] = pe;
                dp[nt][hh2 * 2 + c] = ds;
              }
            }
          }
        }
      }

      // P and dS as A fragments (all packed before the GEMMs: the drafter
      // variants spill 40-60 B otherwise), dS^T to shared memory for dQ, then
      // dV += P^T dO and dK += dS^T Q (B = dO / Q transposed).
      unsigned pa[kNT / 2][4], sa[kNT / 2][4];
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        pack_a(s, kk, pa[kk]);
        pack_a(dp, kk, sa[kk]);
#if !KC_DETERMINISTIC
        store_ds_t(sS + (kDqLag || kWgDqLag ? st * kSB : 0), key_row0, kk, t4, sa[kk]);
#endif
      }
#if KC_BWD_WGMMA
#if !KC_DETERMINISTIC
      ds_bar_arrive(it);
#endif
      // dV += P^T dO and dK += dS^T Q (B read N-major: LBO steps 64 columns
      // of d, SBO 8 queries), issued; then dQ = dS K over the dS^T tile.
      {
        const unsigned long long bo = smem_desc(o_s, kBM * 128, 1024);
        const unsigned long long bq = smem_desc(q_s, kBM * 128, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kNT / 2; ++kk) wgmma_rs(dv, pa[kk], bo + ((kk * 16 * 128) >> 4));
#pragma unroll
        for (int kk = 0; kk < kNT / 2; ++kk) wgmma_rs(dk, sa[kk], bq + ((kk * 16 * 128) >> 4));
        wgmma_commit();
      }
      wgmma_wait<0>();  // dV / dK: their A registers, the Q / dO stage
#else
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        gemm_step_ab<kDV>(dv, pa[kk], o_s, kk, ln);
        gemm_step_ab<kDQK>(dk, sa[kk], q_s, kk, ln);
      }
#endif
    }

#if !KC_DETERMINISTIC
    if constexpr (!kDqLag && !kFa2 && !kWg) {
      __syncthreads();  // dS^T complete
      dq_step(hq, m0, sS);
    }
    prev_hq = hq;
    prev_m0 = m0;
#endif
    if constexpr (kRowData) {
      if (!kProducer && it + 1 < n_items && tid < kBM)
        rowdata[(st ^ 1) * kBM + tid] = row_data(p, next_q, next_raw);
    }
#if KC_BWD_WGMMA && !KC_DETERMINISTIC
    // kProducer: stage st is free (the last wgmma reading it was waited).
    __syncwarp();
    if (lane == 0) attn_fwd::mbar_arrive(bar_empty + 8 * st);
#endif
  }
  cp_async_wait<0>();
#if KC_BWD_WGMMA && !KC_DETERMINISTIC
  if (n_items > 0) {  // the last step's dQ
    fence_proxy_async();
    if (wtid < 32) bulk_wait_read();
    ds_bar_sync(n_items - 1);  // its dS^T complete (kProducer: compute warps only)
    wg_dq(n_items - 1, prev_hq, prev_m0);
  }
  if (wtid < 32) bulk_wait_all();  // sDq read before the CTA's shared memory goes
#endif
#if !KC_DETERMINISTIC
  if constexpr (kDqLag) {
    if (n_items > 0) {
      __syncthreads();  // the last item's dS^T complete
      dq_step(prev_hq, prev_m0, sS + ((n_items - 1) & 1) * kSB);
    }
  }
#endif

  if constexpr (kFa2) {
    // dK and dV of keys 32 (warp / 2) + 16 mt + g + 8 hh2, this warp's half of the columns.
    const int wk = warp >> 1, wd = warp & 1;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int hh2 = 0; hh2 < 2; ++hh2) {
        const int kv = n0 + wk * 32 + mt * 16 + g + 8 * hh2;
        if (kv < kv_len) {
          store_row<kDQK / 2>(static_cast<elem_t*>(p.dk) + b * p.dk_stride_b + hkv * p.dk_stride_h +
                                  kv * p.dk_stride_s + wd * (kDQK / 2),
                              dk2[mt], hh2, t4);
          store_row<kDV / 2>(static_cast<elem_t*>(p.dv) + b * p.dv_stride_b + hkv * p.dv_stride_h +
                                 kv * p.dv_stride_s + wd * (kDV / 2),
                             dv2[mt], hh2, t4);
        }
      }
    }
    return;
  }
#if KC_BWD_WGMMA
  fence_regs(dk);  // the last wgmma_wait before any read
  fence_regs(dv);
  if constexpr (kWgSplit) {  // dS left the softmax scale out: dK takes it once here
#pragma unroll
    for (int i = 0; i < kDTQ; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) dk[i][j] *= kScale;
    }
  }
#endif
  // dK and dV of this thread's two keys, in the dtype.
#pragma unroll
  for (int hh2 = 0; hh2 < 2; ++hh2) {
    const int kv = n0 + key_row0 + 8 * hh2;
    if (kv < kv_len) {
      store_row<kDQK>(
          static_cast<elem_t*>(p.dk) + b * p.dk_stride_b + hkv * p.dk_stride_h + kv * p.dk_stride_s,
          dk, hh2, t4);
      store_row<kDV>(
          static_cast<elem_t*>(p.dv) + b * p.dv_stride_b + hkv * p.dv_stride_h + kv * p.dv_stride_s,
          dv, hh2, t4);
    }
  }
}

#if KC_DETERMINISTIC
// ---------------------------------------------------------------------------
// dQ without atomics: one CTA per (KC_BWD_BLOCK_N query rows, query head, batch).
// Grid (ceil(q_len / KC_BWD_BLOCK_N), num_q_heads, batch); KC_BWD_NUM_WARPS * 32 threads.
// ---------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(KC_BWD_NUM_WARPS * 32, 256 / (KC_BWD_NUM_WARPS * 32))
    kcache_attn_bwd_dq(const __grid_constant__ kcache::AttentionParams p) {
  using namespace kcache;
  using namespace kcache::attn_bwd;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;
  // Heavy query tiles (the last ones under causal masks) first within each
  // chunk of the launch order.
  int qt, h, b;
  launch_order(qt, h, b, kHeadChunk);
  qt = gridDim.x - 1 - qt;
  const int m0 = qt * kDqRows;
  const int q_len = p.q_len;
  const int kv_len = p.kv_len;
  const int hkv = h / (p.num_q_heads / p.num_kv_heads);
  const int off = KC_MASK_BOTTOM_RIGHT ? kv_len - q_len : 0;
  const int n_kv_tiles = (kv_len + kDqKeys - 1) / kDqKeys;
  const int mlast = imin(m0 + kDqRows, q_len) - 1;

  constexpr int kKB = kDqKeys * kDQK * 2, kVB = kDqKeys * kDV * 2;
  const unsigned sQ = smem_u32(smem);
  const unsigned sO = sQ + kDqRows * kDQK * 2;
  const unsigned sK = sO + kDqRows * kDV * 2;  // 2 stages
  const unsigned sV = sK + 2 * kKB;            // 2 stages
  unsigned char* const base = smem + (sV + 2 * kVB - sQ);
  int4* rowdata = reinterpret_cast<int4*>(base);
  unsigned* list = reinterpret_cast<unsigned*>(base + kDqRows * 16);
  int* misc = reinterpret_cast<int*>(base + kDqRows * 16 + 4 * kList);
  static_assert(kDqRows * (kDQK + kDV) * 2 + 2 * (kKB + kVB) + kDqRows * 16 + 4 * kList + 16 ==
                    AttentionBwdDqSmemBytes(kBM, kBN, kDQK, kDV),
                "shared-memory layout out of step with attention_tiles.h");

  const elem_t* kg = static_cast<const elem_t*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h;
  const elem_t* vg = static_cast<const elem_t*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h;
  load_rows<kDqRows, kDQK>(sQ,
                           static_cast<const elem_t*>(p.q) + b * p.q_stride_b + h * p.q_stride_h,
                           p.q_stride_s, m0, q_len, tid);
  load_rows<kDqRows, kDV>(
      sO, static_cast<const elem_t*>(p.dout) + b * p.do_stride_b + h * p.do_stride_h, p.do_stride_s,
      m0, q_len, tid);
  cp_async_commit();
  if constexpr (kRowData) {
    if (tid < kDqRows) rowdata[tid] = row_data(p, m0 + tid, row_raw(p, b, h, m0 + tid));
  }

  // ---- the walk over key tiles ---------------------------------------------
  int first = 0;
  int n_iter = n_kv_tiles;
#if KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
  {
    const int kv_lo = kWinLeft < 0 ? 0 : imax(0, m0 + off - kWinLeft);
    const int kv_hi = kWinRight < 0 ? kv_len : imin(kv_len, mlast + off + kWinRight + 1);
    n_iter = 0;
    if (kv_hi > kv_lo) {
      first = kv_lo / kDqKeys;
      n_iter = (kv_hi + kDqKeys - 1) / kDqKeys - first;
    }
  }
#endif
  bool use_list = false;
#if KC_MASK == KC_MASK_DOCUMENT || KC_MASK == KC_MASK_DRAFTER || KC_MASK == KC_MASK_EXPR
  use_list = n_kv_tiles <= kList;
  if (use_list) {
#if KC_MASK == KC_MASK_DOCUMENT
    doc_tile_classes<true>(list, p.q_seq_id + b * p.q_seq_id_stride_b, m0, mlast + 1, kDqRows,
                           p.kv_seq_id + b * p.kv_seq_id_stride_b, kDqKeys, n_kv_tiles, kv_len,
                           warp, lane);
#elif KC_MASK == KC_MASK_DRAFTER
    for (int t = tid; t < n_kv_tiles; t += kThreads) {
      list[t] = static_cast<unsigned>(
          classify_pair(p, b, m0, kDqRows, t * kDqKeys, kDqKeys, q_len, kv_len, off));
    }
#else
    // tile_class is per (query tile of kBM, key tile of kBN): this CTA's
    // rows are kDqRows / kBM query tiles, a key step is part of one key tile.
    const bool q_inb = m0 + kDqRows <= q_len;
    for (int t = tid; t < n_kv_tiles; t += kThreads) {
      bool any = false, all = true;
      for (int sub = 0; sub < kDqRows / kBM; ++sub) {
        const int qt64 = qt * (kDqRows / kBM) + sub;
        if (qt64 * kBM >= q_len) break;
        int c = 1;
        if (p.tile_class != nullptr) {
          c = p.tile_class[(KC_EXPR_MASK_READS_B ? b : 0) * p.tile_class_stride_b +
                           (KC_EXPR_MASK_READS_H ? h : 0) * p.tile_class_stride_h +
                           qt64 * p.tile_class_stride_m + (t * kDqKeys) / kBN];
          c = c < 0 || c > 2 ? 1 : c;
        }
        any = any || c != 0;
        all = all && c == 2;
      }
      int c = any ? (all ? 2 : 1) : 0;
      if (c == 2 && !(q_inb && t * kDqKeys + kDqKeys <= kv_len)) c = 1;
      list[t] = static_cast<unsigned>(c);
    }
#endif
    n_iter = finish_list(list, n_kv_tiles, misc, warp, lane);
  }
#endif
  auto tile_of = [&](int i, int& tile, int& cls) {
    if (use_list) {
      const unsigned e = list[i];
      tile = static_cast<int>(e & 0x3fffffffu);
      cls = static_cast<int>(e >> 30);
    } else {
      tile = first + i;
      cls = kListMask
                ? 1
                : classify_pair(p, b, m0, kDqRows, tile * kDqKeys, kDqKeys, q_len, kv_len, off);
    }
  };
  auto prefetch = [&](int i, int st) {
    int tile, cls;
    tile_of(i, tile, cls);
    load_rows<kDqKeys, kDQK>(sK + st * kKB, kg, p.k_stride_s, tile * kDqKeys, kv_len, tid);
    load_rows<kDqKeys, kDV>(sV + st * kVB, vg, p.v_stride_s, tile * kDqKeys, kv_len, tid);
  };
  if (n_iter > 0) prefetch(0, 0);
  cp_async_commit();

  // This thread's two rows: LSE, delta, row data.
  const int row0 = warp * 16 + g;  // + 8 * hh
  float l2[2], del[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int q = m0 + row0 + 8 * hh;
    const bool ok = q < q_len;
    l2[hh] = ok ? lse_log2(p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q]) : 0.f;
    del[hh] = ok ? p.delta[(static_cast<long long>(b) * p.num_q_heads + h) * q_len + q] : 0.f;
  }
  ScoreCtx sc{0.f};
#if KC_SCORE_MOD == KC_SCORE_ALIBI
  sc.alibi_slope = p.alibi_slopes[h];
#endif

  const Lane ln = lane_addressing(lane);
  const unsigned q_a = sQ + (warp * 16 + (lane & 15)) * (kDQK * 2);
  const unsigned o_a = sO + (warp * 16 + (lane & 15)) * (kDV * 2);

  float dq[kDTQ][4];
#pragma unroll
  for (int i = 0; i < kDTQ; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
  int4 rd[2] = {make_int4(0, 0, 0, 0), make_int4(0, 0, 0, 0)};

  for (int i = 0; i < n_iter; ++i) {
    const int st = i & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (i == 0 && kRowData) {
      rd[0] = rowdata[row0];
      rd[1] = rowdata[row0 + 8];
    }
    if (i + 1 < n_iter) prefetch(i + 1, st ^ 1);
    cp_async_commit();

    int tile, cls;
    tile_of(i, tile, cls);
    const int n0 = tile * kDqKeys;
    const unsigned k_s = sK + st * kKB;
    const unsigned v_s = sV + st * kVB;

    // S = Q K^T and dP = dO V^T: 16 queries x 64 keys per warp.
    float s[kNT][4], dp[kNT][4];
    gemm_abt<kDQK>(s, q_a, k_s, ln);
    gemm_abt<kDV>(dp, o_a, v_s, ln);

#pragma unroll
    for (int full = 1; full >= 0; --full) {  // kTileCopies
      if (kTileCopies ? full != (cls == 2) : full) continue;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int kv = n0 + nt * 8 + 2 * t4 + c;
          int kv_id = 0;
#if KC_MASK == KC_MASK_DOCUMENT
          if (!full && kv < kv_len) kv_id = p.kv_seq_id[b * p.kv_seq_id_stride_b + kv];
#endif
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int q = m0 + row0 + 8 * hh;
            const bool vis = full || visible(p, b, h, q, kv, q_len, kv_len, off, rd[hh], kv_id);
            float pe, ds;
            element_grad(s[nt][hh * 2 + c], dp[nt][hh * 2 + c], l2[hh], del[hh], vis, sc, b, h, q,
                         kv, p, false, pe, ds);
            dp[nt][hh * 2 + c] = ds;
          }
        }
      }
    }

    // dQ += dS K (A = dS from registers, B = K transposed).
#pragma unroll
    for (int kk = 0; kk < kNT / 2; ++kk) {
      unsigned sa[4];
      pack_a(dp, kk, sa);
      gemm_step_ab<kDQK>(dq, sa, k_s, kk, ln);
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int q = m0 + row0 + 8 * hh;
    if (q < q_len) {
      store_row<kDQK>(
          static_cast<elem_t*>(p.dq) + b * p.dq_stride_b + h * p.dq_stride_h + q * p.dq_stride_s,
          dq, hh, t4);
    }
  }
}
#endif  // KC_DETERMINISTIC
