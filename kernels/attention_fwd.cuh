// Attention forward (FlashAttention-2 style) compiled by NVRTC after the
// generated prelude (docs/kernel-contract.md). SKELETON: the entry point and
// its signature are final; the body is being written.
#pragma once

#include "attention_params.h"
#include "attention_tiles.h"

static_assert(kcache::AttentionTilesLegal(
                  kcache::AttentionTiles{KC_BLOCK_M, KC_BLOCK_N, KC_NUM_WARPS, KC_STAGES, 0},
                  KC_ARCH, KC_HEAD_DIM_QK, KC_HEAD_DIM_V),
              "illegal tile configuration for this architecture and head dims");

extern "C" __global__ void __launch_bounds__(KC_NUM_WARPS * 32)
    kcache_attn_fwd(const __grid_constant__ kcache::AttentionParams p) {
  (void)p;
}
