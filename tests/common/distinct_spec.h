// Eight attention specs that mean eight different kernels, shared by the
// daemon's end-to-end tests and its load benchmark (no gtest here).
#pragma once

#include "kcache/v1/spec.pb.h"

namespace kcache::testing {

// Spec `i` (0..7): dtype, head dim and GQA from its three low bits; causal.
// A non-zero `scale` sets softmax_scale (another kernel again).
inline v1::AttentionSpec DistinctSpec(int i, float scale = 0) {
  v1::AttentionSpec s;
  s.set_dtype(i & 1 ? v1::DTYPE_FP16 : v1::DTYPE_BF16);
  s.set_head_dim_qk(i & 2 ? 128 : 64);
  s.set_num_q_heads(8);
  s.set_num_kv_heads(i & 4 ? 2 : 8);
  s.mutable_mask()->mutable_causal();
  if (scale != 0) s.set_softmax_scale(scale);
  return s;
}

}  // namespace kcache::testing
