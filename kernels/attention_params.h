// The launch-parameter struct shared by the attention kernels (compiled by
// NVRTC), the daemon and the clients. Plain data only: it must compile both
// as host C++ and under NVRTC with no host headers. Any change to the layout,
// or to how a record's cubin is loaded, bumps kAttentionAbiVersion, which
// every record carries. 2: a cubin may hold several images, each loaded as
// its own module (compiler/cuda/cubin_images.h; a module with backward has
// two).
#pragma once

#if defined(__CUDACC_RTC__)
typedef signed char kc_i8;
typedef int kc_i32;
typedef unsigned int kc_u32;
typedef long long kc_i64;
#else
#include <cstdint>
typedef std::int8_t kc_i8;
typedef std::int32_t kc_i32;
typedef std::uint32_t kc_u32;
typedef std::int64_t kc_i64;
#endif

namespace kcache {

constexpr kc_u32 kAttentionAbiVersion = 2;
constexpr int kMaxExprBuffers = 8;

// A launch-time buffer read by an expression mask or score modification.
// Buffers are numbered in the normalized spec's order (sorted by name).
// Reads outside [0, extent) in any dimension yield 0 / 0.0f / false.
struct KcBuffer {
  const void* ptr;  // device pointer; element type fixed by the spec
  kc_i32 rank;      // 1..4, must match the spec
  kc_i32 reserved;
  kc_i64 extent[4];  // elements per dimension
  kc_i64 stride[4];  // in elements
};

// Tensor strides are in elements; the last (head) dimension is contiguous.
// BHSD and BSHD layouts are both expressed through the strides.
struct AttentionParams {
  // --- forward inputs and outputs -------------------------------------
  const void* q;  // [batch, num_q_heads, q_len, head_dim_qk]
  const void* k;  // [batch, num_kv_heads, kv_len, head_dim_qk]
  const void* v;  // [batch, num_kv_heads, kv_len, head_dim_v]
  void* o;        // [batch, num_q_heads, q_len, head_dim_v]
  float* lse;     // [batch, num_q_heads, q_len], natural log; may be null
  kc_i64 q_stride_b, q_stride_h, q_stride_s;
  kc_i64 k_stride_b, k_stride_h, k_stride_s;
  kc_i64 v_stride_b, v_stride_h, v_stride_s;
  kc_i64 o_stride_b, o_stride_h, o_stride_s;
  kc_i64 lse_stride_b, lse_stride_h;  // lse is contiguous along q

  kc_i32 batch;
  kc_i32 num_q_heads;
  kc_i32 num_kv_heads;  // num_q_heads % num_kv_heads == 0
  kc_i32 q_len;
  kc_i32 kv_len;
  kc_i32 reserved0;

  // --- backward (unused by the forward) --------------------------------
  const void* dout;  // like o
  void* dq;          // like q
  void* dk;          // like k
  void* dv;          // like v
  float* dq_accum;   // fp32 scratch of batch * num_q_heads * q_len * head_dim_qk (kernels' order)
  float* delta;      // fp32 scratch [batch, num_q_heads, q_len]: rowsum(dO*O)
  kc_i64 do_stride_b, do_stride_h, do_stride_s;
  kc_i64 dq_stride_b, dq_stride_h, dq_stride_s;
  kc_i64 dk_stride_b, dk_stride_h, dk_stride_s;
  kc_i64 dv_stride_b, dv_stride_h, dv_stride_s;

  // --- built-in mask inputs --------------------------------------------
  const kc_i32* q_seq_id;   // document mask: [batch, q_len]
  const kc_i32* kv_seq_id;  // document mask: [batch, kv_len]
  kc_i64 q_seq_id_stride_b;
  kc_i64 kv_seq_id_stride_b;
  const kc_i32* drafter_anchor;  // [batch, num_blocks]
  const kc_i8* drafter_keep;     // [batch, num_blocks], 0 or 1; null = all kept
  kc_i64 drafter_stride_b;
  kc_i32 drafter_context_len;  // S: keys [0, S) are context
  kc_i32 drafter_num_blocks;   // N: q_len == N * block_size
  const float* alibi_slopes;   // [num_q_heads]

  // --- expression masks and score modifications ------------------------
  KcBuffer buffers[kMaxExprBuffers];
  float* buffer_grads[kMaxExprBuffers];  // trainable buffers' gradients (fp32, like the buffer)

  // Tile classification written by the mask-building kernel for
  // expression masks: one byte per (batch, head, q tile, kv tile):
  // 0 = empty, 1 = partial, 2 = full.
  kc_i8* tile_class;
  kc_i64 tile_class_stride_b, tile_class_stride_h, tile_class_stride_m;
};

}  // namespace kcache

// Values of KC_MASK and KC_SCORE_MOD in the generated prelude
// (docs/kernel-contract.md).
#define KC_MASK_NONE 0
#define KC_MASK_CAUSAL 1
#define KC_MASK_SLIDING_WINDOW 2
#define KC_MASK_DOCUMENT 3
#define KC_MASK_DRAFTER 4
#define KC_MASK_EXPR 5
#define KC_SCORE_NONE 0
#define KC_SCORE_SOFTCAP 1
#define KC_SCORE_ALIBI 2
#define KC_SCORE_EXPR 3
