// Prints the layout of kcache::AttentionParams and kcache::KcBuffer as the
// host compiler lays them out ("<name> <value>" per line), for
// test_params_layout.py to compare with the Python ctypes mirror.
#include <cstddef>
#include <cstdio>

#include "kernels/attention_params.h"

#define KC_OFF(S, f) std::printf("%s.%s %zu\n", #S, #f, offsetof(kcache::S, f))

int main() {
  std::printf("sizeof(AttentionParams) %zu\n", sizeof(kcache::AttentionParams));
  std::printf("sizeof(KcBuffer) %zu\n", sizeof(kcache::KcBuffer));
  std::printf("kAttentionAbiVersion %u\n", static_cast<unsigned>(kcache::kAttentionAbiVersion));
  KC_OFF(KcBuffer, ptr);
  KC_OFF(KcBuffer, rank);
  KC_OFF(KcBuffer, reserved);
  KC_OFF(KcBuffer, extent);
  KC_OFF(KcBuffer, stride);
  KC_OFF(AttentionParams, q);
  KC_OFF(AttentionParams, k);
  KC_OFF(AttentionParams, v);
  KC_OFF(AttentionParams, o);
  KC_OFF(AttentionParams, lse);
  KC_OFF(AttentionParams, q_stride_b);
  KC_OFF(AttentionParams, q_stride_h);
  KC_OFF(AttentionParams, q_stride_s);
  KC_OFF(AttentionParams, k_stride_b);
  KC_OFF(AttentionParams, k_stride_h);
  KC_OFF(AttentionParams, k_stride_s);
  KC_OFF(AttentionParams, v_stride_b);
  KC_OFF(AttentionParams, v_stride_h);
  KC_OFF(AttentionParams, v_stride_s);
  KC_OFF(AttentionParams, o_stride_b);
  KC_OFF(AttentionParams, o_stride_h);
  KC_OFF(AttentionParams, o_stride_s);
  KC_OFF(AttentionParams, lse_stride_b);
  KC_OFF(AttentionParams, lse_stride_h);
  KC_OFF(AttentionParams, batch);
  KC_OFF(AttentionParams, num_q_heads);
  KC_OFF(AttentionParams, num_kv_heads);
  KC_OFF(AttentionParams, q_len);
  KC_OFF(AttentionParams, kv_len);
  KC_OFF(AttentionParams, reserved0);
  KC_OFF(AttentionParams, dout);
  KC_OFF(AttentionParams, dq);
  KC_OFF(AttentionParams, dk);
  KC_OFF(AttentionParams, dv);
  KC_OFF(AttentionParams, dq_accum);
  KC_OFF(AttentionParams, delta);
  KC_OFF(AttentionParams, do_stride_b);
  KC_OFF(AttentionParams, do_stride_h);
  KC_OFF(AttentionParams, do_stride_s);
  KC_OFF(AttentionParams, dq_stride_b);
  KC_OFF(AttentionParams, dq_stride_h);
  KC_OFF(AttentionParams, dq_stride_s);
  KC_OFF(AttentionParams, dk_stride_b);
  KC_OFF(AttentionParams, dk_stride_h);
  KC_OFF(AttentionParams, dk_stride_s);
  KC_OFF(AttentionParams, dv_stride_b);
  KC_OFF(AttentionParams, dv_stride_h);
  KC_OFF(AttentionParams, dv_stride_s);
  KC_OFF(AttentionParams, q_seq_id);
  KC_OFF(AttentionParams, kv_seq_id);
  KC_OFF(AttentionParams, q_seq_id_stride_b);
  KC_OFF(AttentionParams, kv_seq_id_stride_b);
  KC_OFF(AttentionParams, drafter_anchor);
  KC_OFF(AttentionParams, drafter_keep);
  KC_OFF(AttentionParams, drafter_stride_b);
  KC_OFF(AttentionParams, drafter_context_len);
  KC_OFF(AttentionParams, drafter_num_blocks);
  KC_OFF(AttentionParams, alibi_slopes);
  KC_OFF(AttentionParams, buffers);
  KC_OFF(AttentionParams, buffer_grads);
  KC_OFF(AttentionParams, tile_class);
  KC_OFF(AttentionParams, tile_class_stride_b);
  KC_OFF(AttentionParams, tile_class_stride_h);
  KC_OFF(AttentionParams, tile_class_stride_m);
  return 0;
}
