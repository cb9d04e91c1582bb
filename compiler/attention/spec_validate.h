// Validation of attention specs received from clients. Every spec that
// reaches normalization, the key or code generation has passed
// ValidateAttentionSpec; the rules are listed below. Thread-safe (pure
// functions).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kcache/v1/spec.pb.h"

namespace kcache::attention {

// Limits a daemon enforces on client specs. The defaults are what kcached
// uses; tests may tighten them.
struct Limits {
  uint32_t max_heads = 1024;            // num_q_heads (and num_kv_heads) upper bound
  int max_expr_depth = 32;              // per tree; the root is depth 1
  int max_expr_nodes = 256;             // per tree
  int max_buffers = 8;                  // clamped to kcache::kMaxExprBuffers
  int32_t max_window_extent = 1 << 30;  // sliding-window extents, drafter context_window
};

// Returns OK or InvalidArgument("<field path>: <reason>"), e.g.
//   "spec.num_kv_heads: 5 does not divide num_q_heads 32"
//   "spec.mask.expr.predicate.binary.lhs: type int, expected bool"
// The first problem found is reported. Rules (summary):
//  - no unknown fields anywhere (a newer client's field would otherwise be
//    silently ignored and the wrong kernel served); enum values known;
//  - dtype set; head_dim_qk in {64,128,256}; head_dim_v in {0,64,128,256};
//  - 1 <= num_q_heads <= max_heads; num_kv_heads 0 or divides num_q_heads;
//  - softmax_scale 0 (default) or finite and > 0;
//  - sliding window: extents in [-1, max_window_extent], -1 = unbounded,
//    not both unbounded (that is mask.none);
//  - drafter: block_size a power of two in [1, 256] (so that it and every
//    tile height 64/128 divide one another), context_window in
//    [0, max_window_extent] (0 = unbounded);
//  - softcap: cap finite and > 0;
//  - expressions: every node set; types check; mask predicate bool, score
//    value float; `score` only in score modifications; float constants
//    finite; reads name declared buffers with one int index per dimension;
//    depth <= max_expr_depth and nodes <= max_expr_nodes per tree;
//  - buffers: at most max_buffers; names [a-z_][a-z0-9_]{0,31}, unique;
//    element type set; rank 1..4; every declared buffer is read by the mask
//    or score expression (so that one kernel has one spec); trainable only
//    for float32 buffers read by the score expression;
//  - backward: head_dim_qk and head_dim_v in {64,128} (whether an
//    architecture has the shared memory for 128 is code generation's
//    check); no trainable buffer with deterministic (the deterministic
//    backward has no atomics, and buffer gradients are added with them).
//    Without backward, deterministic and trainable are accepted and
//    ignored: normalization clears them, so such a spec has the key of the
//    same spec without them;
//  - tuning: each field 0 (compiler chooses) or in its coarse range
//    (block_m, block_n in {16,32,64,128,256}; num_warps in {1,2,4,8,16};
//    stages 1..8). Legality for an architecture is checked by code
//    generation (ChooseAttentionTiles in codegen.h).
absl::Status ValidateAttentionSpec(const v1::AttentionSpec& spec, const Limits& limits = Limits());

}  // namespace kcache::attention
