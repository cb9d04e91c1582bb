// Reference forward attention for the numeric check before serve (issue 28):
// one thread per (batch, head, query row), fp32 throughout, no tiles, no
// tile classes, no shared memory. The mask and the score modification are
// the plain definitions of docs/kernel-contract.md (built-in kinds) or the
// generated kc_expr_mask / kc_expr_score of the same prelude (expressions),
// so that it computes the same function as kcache_attn_fwd another way.
//
// Compiled on its own beside the kernel under check: the generated prelude
// (defines, expression functions) followed by this file instead of
// attention_fwd.cuh. Its params are the kernel's, except that p.o points to
// an fp32 output [batch, num_q_heads, q_len, head_dim_v] (strides p.o_stride_*,
// elements) and p.lse (may be null) takes the natural-log LSE. A row that
// sees no key gets O = 0 and LSE = -inf.
#pragma once

#include "attention_params.h"

namespace kcache {
namespace attn_ref {

__device__ __forceinline__ float load_elem(const void* base, kc_i64 i) {
  const unsigned short u = static_cast<const unsigned short*>(base)[i];
#if KC_DTYPE_BF16
  return __uint_as_float(static_cast<unsigned>(u) << 16);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(u));
  return f;
#endif
}

__device__ __forceinline__ bool visible(const AttentionParams& p, int b, int h, int q, int kv) {
  (void)p;
  (void)b;
  (void)h;
#if KC_MASK == KC_MASK_CAUSAL || KC_MASK == KC_MASK_SLIDING_WINDOW
  const int off = KC_MASK_BOTTOM_RIGHT ? p.kv_len - p.q_len : 0;
  const int d = kv - (q + off);
  return (KC_WINDOW_LEFT < 0 || d >= -KC_WINDOW_LEFT) &&
         (KC_WINDOW_RIGHT < 0 || d <= KC_WINDOW_RIGHT);
#elif KC_MASK == KC_MASK_DOCUMENT
  return p.q_seq_id[b * p.q_seq_id_stride_b + q] == p.kv_seq_id[b * p.kv_seq_id_stride_b + kv] &&
         (!KC_DOC_CAUSAL || kv <= q);
#elif KC_MASK == KC_MASK_DRAFTER
  const int j = q / KC_DRAFTER_BLOCK;
  if (j >= p.drafter_num_blocks) return false;
  if (p.drafter_keep != nullptr && p.drafter_keep[b * p.drafter_stride_b + j] == 0) return false;
  const int s = p.drafter_context_len;
  const int a = p.drafter_anchor[b * p.drafter_stride_b + j];
  const bool ctx = kv < s && kv < a && (KC_DRAFTER_WINDOW <= 0 || kv >= a - KC_DRAFTER_WINDOW);
  const int own0 = s + j * KC_DRAFTER_BLOCK;
  const bool own = kv >= own0 && (KC_DRAFTER_CAUSAL ? kv <= s + q : kv < own0 + KC_DRAFTER_BLOCK);
  return ctx || own;
#elif KC_MASK == KC_MASK_EXPR
  return kc_expr_mask(b, h, q, kv, p);
#else
  (void)q;
  (void)kv;
  return true;
#endif
}

__device__ __forceinline__ float score_mod(const AttentionParams& p, float x, int b, int h, int q,
                                           int kv) {
  (void)p;
  (void)b;
  (void)h;
  (void)q;
  (void)kv;
#if KC_SCORE_MOD == KC_SCORE_SOFTCAP
  return KC_SOFTCAP * tanhf(x / KC_SOFTCAP);
#elif KC_SCORE_MOD == KC_SCORE_ALIBI
  return x + p.alibi_slopes[h] * static_cast<float>(kv - q);
#elif KC_SCORE_MOD == KC_SCORE_EXPR
  return kc_expr_score(x, b, h, q, kv, p);
#else
  return x;
#endif
}

}  // namespace attn_ref
}  // namespace kcache

// Grid (ceil(q_len / 128), num_q_heads, batch), 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    kcache_attn_ref_fwd(const __grid_constant__ kcache::AttentionParams p) {
  using namespace kcache::attn_ref;
  const int q = static_cast<int>(blockIdx.x * 128 + threadIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  if (q >= p.q_len) return;
  const int hk = h / (p.num_q_heads / p.num_kv_heads);
  const kc_i64 qo = b * p.q_stride_b + h * p.q_stride_h + q * p.q_stride_s;
  float m = -__int_as_float(0x7f800000);  // -inf
  float l = 0.f;
  float acc[KC_HEAD_DIM_V];
  for (int d = 0; d < KC_HEAD_DIM_V; ++d) acc[d] = 0.f;
  for (int kv = 0; kv < p.kv_len; ++kv) {
    if (!visible(p, b, h, q, kv)) continue;
    const kc_i64 ko = b * p.k_stride_b + hk * p.k_stride_h + kv * p.k_stride_s;
    float s = 0.f;
    for (int d = 0; d < KC_HEAD_DIM_QK; ++d) s += load_elem(p.q, qo + d) * load_elem(p.k, ko + d);
    const float x = score_mod(p, s * KC_SOFTMAX_SCALE, b, h, q, kv);
    const float m_new = fmaxf(m, x);
    const float c = expf(m - m_new);  // 0 on the first visible key (m = -inf)
    const float e = expf(x - m_new);
    l = l * c + e;
    const kc_i64 vo = b * p.v_stride_b + hk * p.v_stride_h + kv * p.v_stride_s;
    for (int d = 0; d < KC_HEAD_DIM_V; ++d) acc[d] = acc[d] * c + e * load_elem(p.v, vo + d);
    m = m_new;
  }
  float* o = static_cast<float*>(p.o) + b * p.o_stride_b + h * p.o_stride_h + q * p.o_stride_s;
  for (int d = 0; d < KC_HEAD_DIM_V; ++d) o[d] = l > 0.f ? acc[d] / l : 0.f;
  if (p.lse != nullptr) {
    p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q] = l > 0.f ? m + logf(l) : m;
  }
}
