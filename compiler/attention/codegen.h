// Code generation for attention specs: one CUDA translation unit per
// (normalized spec, architecture), following docs/kernel-contract.md: a
// prelude of KC_* macros, generated device functions for expression masks
// and score modifications, then #includes of the kernel templates, which the
// caller hands to NVRTC as named headers (kcache::kernels::TemplateFiles()).
// Thread-safe (pure functions, apart from the test-only fault switch).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kcache/v1/record.pb.h"
#include "kcache/v1/spec.pb.h"
#include "kernels/attention_tiles.h"

namespace kcache::attention {

// An architecture the attention templates support: "sm_80", "sm_86",
// "sm_89", "sm_90" or "sm_90a".
struct AttentionArch {
  int sm = 0;          // KC_ARCH
  bool sm90a = false;  // KC_ARCH_SM90A
};
// InvalidArgument naming the accepted values for anything else.
absl::StatusOr<AttentionArch> ParseAttentionArch(absl::string_view arch);

// The tiles for a normalized spec on `arch`: SelectAttentionTiles'
// default, with each nonzero Tuning field overriding it. InvalidArgument
// ("spec.tuning: ...") when the result is not AttentionTilesLegal;
// InvalidArgument ("spec.head_dim_qk: ...") when the templates support no
// tiles for the head dims on that architecture.
absl::StatusOr<AttentionTiles> ChooseAttentionTiles(const v1::AttentionSpec& normalized,
                                                    const AttentionArch& arch);

// The backward's tiles for a normalized spec with backward on `arch`
// (SelectAttentionBwdTiles; the spec's Tuning applies to the forward only).
// InvalidArgument ("spec.head_dim_qk: ...") when the backward has no tiles
// there: head dims other than 64 and 128, or 128 on sm_86 / sm_89.
absl::StatusOr<AttentionBwdTiles> ChooseAttentionBwdTiles(const v1::AttentionSpec& normalized,
                                                          const AttentionArch& arch);

struct GeneratedSource {
  std::string program_name;  // name for nvrtcCreateProgram ("kcache_attention.cu")
  // The module as one translation unit (what `kcache-compile --source`
  // writes, and what the kernel tests read the launch facts from).
  std::string source;
  // What NVRTC compiles: without backward `source` alone; with backward two
  // units, each compiled into an image of its own (CompileUnits in
  // compiler/cuda/nvrtc.h; the cubin holds both, compiler/cuda/cubin_images.h),
  // so that NVRTC's CPU time per unit stays within issue 27's budget of 2 s
  // and the units compile in parallel: `source` without the backward's
  // include (the forward's kernels), then `source` under KC_OMIT_FWD (the
  // backward's kernels; kernels/attention_fwd.cuh). Not linked: relocatable
  // code ran 10-30 % slower on the H200 (kernels/NOTES.md). The same cut as
  // tests/kernels/kc_attn.py's module_units; the key covers it through the
  // template digest (a change of the cut must change it).
  std::vector<std::string> units;
  // Template headers the source #includes directly, by the names used in
  // #include; they include others among kcache::kernels::TemplateFiles(),
  // so callers hand NVRTC all of those.
  std::vector<std::string> headers;
  std::vector<v1::EntryPoint> entry_points;  // without resources (filled after compile)
  AttentionTiles tiles{};
  AttentionBwdTiles bwd_tiles{};  // all zero without backward
  AttentionArch arch;
  // The numeric check's reference (issue 28): the same prelude and
  // generated functions, then kernels/attention_ref.cuh instead of the
  // attention templates; entry point kcache_attn_ref_fwd (128 threads, grid
  // (ceil(q_len / 128), num_q_heads, batch)). Never served.
  std::string reference_source;
};

// Test-only fault injection (issue 28): while set, GenerateAttentionSource
// emits a wrong kernel on purpose (KC_SOFTMAX_SCALE off by 25 % in `source`
// only; `reference_source` stays right), so that tests can show the numeric
// check refusing it. No shipped binary calls this; off by default.
// Thread-safe (an atomic).
void SetWrongKernelFaultForTesting(bool on);

// `normalized` should come from NormalizeAttentionSpec of a spec that passed
// ValidateAttentionSpec; as a backstop it is validated (InvalidArgument
// otherwise) and normalized again here. With spec.backward the source also
// defines KC_BWD_BLOCK_M/N and KC_BWD_NUM_WARPS, includes attention_bwd.cuh
// after attention_fwd.cuh, and the entry points are, after the forward's:
// kcache_attn_bwd_mask_build (expression masks), kcache_attn_bwd_preprocess,
// kcache_attn_bwd_dkdv, then kcache_attn_bwd_dq (deterministic) or
// kcache_attn_bwd_dq_convert (default), in launch order. Errors:
// InvalidArgument for an unsupported arch, illegal tuning or head dims
// without (backward) tiles; FailedPrecondition when a template the source
// needs is not embedded in this binary.
absl::StatusOr<GeneratedSource> GenerateAttentionSource(const v1::AttentionSpec& normalized,
                                                        absl::string_view arch);

}  // namespace kcache::attention
