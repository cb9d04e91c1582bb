// Normalization of validated attention specs: two specs that mean the same
// kernel normalize to the same message (and so to the same canonical bytes
// and key). Thread-safe (pure function).
#pragma once

#include "kcache/v1/spec.pb.h"

namespace kcache::attention {

// Precondition: ValidateAttentionSpec(spec) is OK (on other input the result
// is some spec, never a crash, but it means nothing). What it does:
//  - head_dim_v 0 -> head_dim_qk; num_kv_heads 0 -> num_q_heads;
//  - softmax_scale 0 -> (float)(1 / sqrt(head_dim_qk)) (computed in double);
//  - mask / score_mod unset -> explicit none; causal and sliding-window
//    alignment UNSPECIFIED -> TOP_LEFT;
//  - return_lse forced on with backward; deterministic and buffers'
//    trainable cleared without backward (they only affect backward kernels);
//  - buffers sorted by name (their order is the launch-time slot order);
//  - `score` expression nodes set to true (their value is ignored);
//  - tuning with every field 0 cleared (= unset).
// Not done, on purpose: tuning equal to the tiles the compiler would choose
// is kept (that choice depends on arch and template version, which the key
// covers separately); sliding window (-1, 0) is not rewritten to causal (a
// different kernel path); unknown fields are dropped (validation rejects
// them first).
v1::AttentionSpec NormalizeAttentionSpec(const v1::AttentionSpec& spec);

}  // namespace kcache::attention
