// Code generation for attention specs (see codegen.h and
// docs/kernel-contract.md). The prelude is written in the contract's order;
// floats are hex-float literals so that the source is exact and stable.
#include "compiler/attention/codegen.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "compiler/attention/expr_lower.h"
#include "compiler/attention/spec_normalize.h"
#include "compiler/attention/spec_validate.h"
#include "kernels/attention_params.h"
#include "kernels/embedded.h"

namespace kcache::attention {
namespace {

constexpr absl::string_view kParamsHeader = "attention_params.h";
constexpr absl::string_view kForwardHeader = "attention_fwd.cuh";
constexpr absl::string_view kReferenceHeader = "attention_ref.cuh";
std::atomic<bool> g_wrong_kernel_fault{false};
constexpr absl::string_view kBackwardHeader = "attention_bwd.cuh";

int MaskKind(const v1::MaskSpec& m) {
  switch (m.kind_case()) {
    case v1::MaskSpec::kCausal:
      return KC_MASK_CAUSAL;
    case v1::MaskSpec::kSlidingWindow:
      return KC_MASK_SLIDING_WINDOW;
    case v1::MaskSpec::kDocument:
      return KC_MASK_DOCUMENT;
    case v1::MaskSpec::kDrafter:
      return KC_MASK_DRAFTER;
    case v1::MaskSpec::kExpr:
      return KC_MASK_EXPR;
    default:
      return KC_MASK_NONE;
  }
}

int ScoreKind(const v1::ScoreMod& s) {
  switch (s.kind_case()) {
    case v1::ScoreMod::kSoftcap:
      return KC_SCORE_SOFTCAP;
    case v1::ScoreMod::kAlibi:
      return KC_SCORE_ALIBI;
    case v1::ScoreMod::kExpr:
      return KC_SCORE_EXPR;
    default:
      return KC_SCORE_NONE;
  }
}

bool TemplateEmbedded(absl::string_view name) {
  for (const kernels::TemplateFile& f : kernels::TemplateFiles()) {
    if (f.name.size() == name.size() && std::equal(name.begin(), name.end(), f.name.begin())) {
      return true;
    }
  }
  return false;
}

void Define(std::string* out, absl::string_view name, absl::string_view value) {
  absl::StrAppend(out, "#define ", name, " ", value, "\n");
}
void Define(std::string* out, absl::string_view name, int value) {
  Define(out, name, IntLiteral(value));
}

// The target as the spec's caller wrote it ("sm_90a" when sm90a).
std::string ArchName(const AttentionArch& arch) {
  return absl::StrCat("sm_", arch.sm, arch.sm90a ? "a" : "");
}

}  // namespace

absl::StatusOr<AttentionArch> ParseAttentionArch(absl::string_view arch) {
  if (arch == "sm_80") return AttentionArch{80, false};
  if (arch == "sm_86") return AttentionArch{86, false};
  if (arch == "sm_89") return AttentionArch{89, false};
  if (arch == "sm_90") return AttentionArch{90, false};
  if (arch == "sm_90a") return AttentionArch{90, true};
  return absl::InvalidArgumentError(
      "target.arch: attention kernels support sm_80, sm_86, sm_89, sm_90 and sm_90a");
}

absl::StatusOr<AttentionTiles> ChooseAttentionTiles(const v1::AttentionSpec& spec,
                                                    const AttentionArch& arch) {
  const int dqk = static_cast<int>(spec.head_dim_qk());
  const int dv = static_cast<int>(spec.head_dim_v() != 0 ? spec.head_dim_v() : spec.head_dim_qk());
  AttentionTiles t = SelectAttentionTiles(arch.sm, dqk, dv, MaskKind(spec.mask()),
                                          spec.dtype() == v1::DTYPE_FP16, arch.sm90a);
  if (t.block_m == 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.head_dim_qk: head dims ", dqk, "/", dv,
                                                   " have no attention tiles on ", ArchName(arch)));
  }
  const v1::Tuning& u = spec.tuning();
  if (u.block_m() == 0 && u.block_n() == 0 && u.num_warps() == 0 && u.stages() == 0) return t;
  const int bm = u.block_m() ? static_cast<int>(u.block_m()) : t.block_m;
  const int bn = u.block_n() ? static_cast<int>(u.block_n()) : t.block_n;
  const int st = u.stages() ? static_cast<int>(u.stages()) : t.stages;
  int nw = static_cast<int>(u.num_warps());
  if (nw == 0) {
    // Unset: keep the default's rows per warp if that is legal for the new
    // block_m (the default may be a warpgroup shape), else 32 or 16 rows.
    nw = t.num_warps;
    for (int rows : {t.block_m / t.num_warps, 32, 16}) {
      if (rows > 0 && bm % rows == 0 &&
          AttentionTilesLegal(MakeAttentionTiles(bm, bn, bm / rows, st, dqk, dv), arch.sm, dqk, dv,
                              arch.sm90a)) {
        nw = bm / rows;
        break;
      }
    }
  }
  const AttentionTiles over = MakeAttentionTiles(bm, bn, nw, st, dqk, dv);
  if (!AttentionTilesLegal(over, arch.sm, dqk, dv, arch.sm90a)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.tuning: block_m=", bm, " block_n=", bn, " num_warps=", nw, " stages=", st,
        " is not a legal tile configuration for d", dqk, "/", dv, " on ", ArchName(arch),
        " (rows per warp 16 or 32, 2..4 stages, registers and shared memory within limits; "
        "4 or 8 warps; block_n 32, 64 or 128. sm_90a's ping-pong, 2 stages, also takes "
        "block_n 176 with block_m 128, 8 warps and head dim QK 128 (V 64..128), and "
        "12 warps with block_m 192, block_n 128 and head dims 64/64)"));
  }
  return over;
}

absl::StatusOr<AttentionBwdTiles> ChooseAttentionBwdTiles(const v1::AttentionSpec& spec,
                                                          const AttentionArch& arch) {
  const int dqk = static_cast<int>(spec.head_dim_qk());
  const int dv = static_cast<int>(spec.head_dim_v() != 0 ? spec.head_dim_v() : spec.head_dim_qk());
  const AttentionBwdTiles t = SelectAttentionBwdTiles(arch.sm, dqk, dv, MaskKind(spec.mask()),
                                                      spec.dtype() == v1::DTYPE_FP16, arch.sm90a);
  if (t.block_m == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.head_dim_qk: the backward has no tiles for head dims ", dqk, "/", dv,
                     " on ", ArchName(arch),
                     " (it supports head dims 64 and 128, and 128 only where shared memory allows: "
                     "not on sm_86 or sm_89)"));
  }
  return t;
}

void SetWrongKernelFaultForTesting(bool on) {
  g_wrong_kernel_fault.store(on, std::memory_order_relaxed);
}

absl::StatusOr<GeneratedSource> GenerateAttentionSource(const v1::AttentionSpec& input,
                                                        absl::string_view arch_name) {
  absl::StatusOr<AttentionArch> arch = ParseAttentionArch(arch_name);
  if (!arch.ok()) return arch.status();
  if (absl::Status s = ValidateAttentionSpec(input); !s.ok()) return s;
  // Idempotent and cheap: a caller that forgot to normalize still gets the
  // kernel its spec means (never, say, KC_HEAD_DIM_V 0).
  const v1::AttentionSpec spec = NormalizeAttentionSpec(input);
  const bool backward = spec.backward();
  std::vector<std::string> headers = {std::string(kParamsHeader), std::string(kForwardHeader)};
  if (backward) headers.emplace_back(kBackwardHeader);
  absl::StatusOr<AttentionTiles> tiles = ChooseAttentionTiles(spec, *arch);
  if (!tiles.ok()) return tiles.status();
  AttentionBwdTiles bwd{};
  if (backward) {
    absl::StatusOr<AttentionBwdTiles> b = ChooseAttentionBwdTiles(spec, *arch);
    if (!b.ok()) return b.status();
    bwd = *b;
  }
  for (const std::string& h : headers) {
    if (!TemplateEmbedded(h)) {
      return absl::FailedPreconditionError(
          absl::StrCat("kernel template ", h, " is not embedded in this binary"));
    }
  }
  absl::StatusOr<std::string> functions = LowerSpecExpressions(spec);
  if (!functions.ok()) return functions.status();

  const int mask = MaskKind(spec.mask());
  const int score = ScoreKind(spec.score_mod());
  const v1::MaskSpec& m = spec.mask();
  const bool bottom_right =
      (m.has_causal() && m.causal().alignment() == v1::CAUSAL_ALIGNMENT_BOTTOM_RIGHT) ||
      (m.has_sliding_window() &&
       m.sliding_window().alignment() == v1::CAUSAL_ALIGNMENT_BOTTOM_RIGHT);
  // Causal is the window (unbounded left, 0 right); other masks do not read
  // the extents.
  int win_left = -1, win_right = 0;
  if (m.has_sliding_window()) {
    win_left = m.sliding_window().left();
    win_right = m.sliding_window().right();
  }
  const float softcap = spec.score_mod().has_softcap() ? spec.score_mod().softcap().cap() : 0.0f;
  const float scale = spec.softmax_scale();

  std::string src =
      "// Generated by kcache (compiler/attention/codegen.cc) from a normalized attention\n"
      "// spec; see docs/kernel-contract.md.\n";
  Define(&src, "KC_ARCH", arch->sm);
  Define(&src, "KC_ARCH_SM90A", arch->sm90a ? 1 : 0);
  Define(&src, "KC_DTYPE_BF16", spec.dtype() == v1::DTYPE_BF16 ? 1 : 0);
  Define(&src, "KC_HEAD_DIM_QK", static_cast<int>(spec.head_dim_qk()));
  Define(&src, "KC_HEAD_DIM_V", static_cast<int>(spec.head_dim_v()));
  Define(&src, "KC_BLOCK_M", tiles->block_m);
  Define(&src, "KC_BLOCK_N", tiles->block_n);
  Define(&src, "KC_NUM_WARPS", tiles->num_warps);
  Define(&src, "KC_STAGES", tiles->stages);
  Define(&src, "KC_MASK", mask);
  Define(&src, "KC_MASK_BOTTOM_RIGHT", bottom_right ? 1 : 0);
  Define(&src, "KC_WINDOW_LEFT", win_left);
  Define(&src, "KC_WINDOW_RIGHT", win_right);
  Define(&src, "KC_DOC_CAUSAL", m.has_document() && m.document().causal() ? 1 : 0);
  Define(&src, "KC_DRAFTER_BLOCK",
         m.has_drafter() ? static_cast<int>(m.drafter().block_size()) : 0);
  Define(&src, "KC_DRAFTER_CAUSAL", m.has_drafter() && m.drafter().causal_within_block() ? 1 : 0);
  Define(&src, "KC_DRAFTER_WINDOW", m.has_drafter() ? m.drafter().context_window() : 0);
  Define(&src, "KC_SCORE_MOD", score);
  Define(&src, "KC_SOFTCAP", HexFloatLiteral(softcap));
  Define(&src, "KC_SOFTMAX_SCALE", HexFloatLiteral(scale));
  Define(&src, "KC_RETURN_LSE", spec.return_lse() ? 1 : 0);
  Define(&src, "KC_BACKWARD", spec.backward() ? 1 : 0);
  Define(&src, "KC_DETERMINISTIC", spec.deterministic() ? 1 : 0);
  // Expression masks: the forward's classification serves the backward too
  // where the tiles allow (kernels/attention_tiles.h).
  const int class_block_m = AttentionClassBlockM(*tiles, bwd, backward);
  if (mask == KC_MASK_EXPR) Define(&src, "KC_CLASS_BLOCK_M", class_block_m);
  if (backward) {
    Define(&src, "KC_BWD_BLOCK_M", bwd.block_m);
    Define(&src, "KC_BWD_BLOCK_N", bwd.block_n);
    Define(&src, "KC_BWD_NUM_WARPS", bwd.num_warps);
    // sm_90a: the dK/dV kernel on wgmma where it supports the spec
    // (AttentionBwdWgmma: head dims 64/128, every mask and score
    // modification); the portable mma.sync path everywhere else.
    const int dqk = static_cast<int>(spec.head_dim_qk());
    const int dv = static_cast<int>(spec.head_dim_v());
    Define(&src, "KC_BWD_WGMMA", AttentionBwdWgmma(arch->sm, arch->sm90a, dqk, dv) ? 1 : 0);
  }
  absl::StrAppend(&src, "#include \"", kParamsHeader, "\"\n");
  src += *functions;
  std::string reference = absl::StrCat(src, "#include \"", kReferenceHeader, "\"\n");
  if (g_wrong_kernel_fault.load(std::memory_order_relaxed)) {
    const std::string right = absl::StrCat("#define KC_SOFTMAX_SCALE ", HexFloatLiteral(scale));
    const size_t at = src.find(right);
    if (at != std::string::npos) {
      src.replace(at, right.size(),
                  absl::StrCat("#define KC_SOFTMAX_SCALE ", HexFloatLiteral(scale * 1.25f)));
    }
  }
  absl::StrAppend(&src, "#include \"", kForwardHeader, "\"\n");
  std::vector<std::string> units = {src};
  if (backward) {
    absl::StrAppend(&src, "#include \"", kBackwardHeader, "\"\n");
    units.push_back(absl::StrCat("#define KC_OMIT_FWD 1\n", src));
  }

  GeneratedSource out;
  out.program_name = "kcache_attention.cu";
  out.source = std::move(src);
  out.units = std::move(units);
  out.reference_source = std::move(reference);
  out.headers = std::move(headers);
  out.tiles = *tiles;
  out.bwd_tiles = bwd;
  out.arch = *arch;

  v1::EntryPoint fwd;
  fwd.set_name("kcache_attn_fwd");
  fwd.set_role(v1::ENTRY_ROLE_FORWARD);
  fwd.set_threads(static_cast<uint32_t>(AttentionFwdThreads(*tiles, arch->sm90a,
                                                            static_cast<int>(spec.head_dim_qk()),
                                                            static_cast<int>(spec.head_dim_v()))));
  fwd.set_dynamic_smem_bytes(static_cast<uint32_t>(tiles->smem_bytes));
  fwd.set_block_m(static_cast<uint32_t>(tiles->block_m));
  fwd.set_block_n(static_cast<uint32_t>(tiles->block_n));
  out.entry_points.push_back(fwd);
  if (mask == KC_MASK_EXPR) {
    v1::EntryPoint build;
    build.set_name("kcache_attn_mask_build");
    build.set_role(v1::ENTRY_ROLE_MASK_BUILD);
    build.set_threads(128);
    build.set_dynamic_smem_bytes(0);
    build.set_block_m(static_cast<uint32_t>(class_block_m));
    build.set_block_n(static_cast<uint32_t>(tiles->block_n));
    out.entry_points.push_back(build);
  }
  if (backward) {
    // In launch order (docs/kernel-contract.md, "Backward").
    const auto entry = [&](const char* name, v1::EntryRole role, int threads, int smem, int bm,
                           int bn) {
      v1::EntryPoint e;
      e.set_name(name);
      e.set_role(role);
      e.set_threads(static_cast<uint32_t>(threads));
      e.set_dynamic_smem_bytes(static_cast<uint32_t>(smem));
      e.set_block_m(static_cast<uint32_t>(bm));
      e.set_block_n(static_cast<uint32_t>(bn));
      out.entry_points.push_back(e);
    };
    const int bwd_threads = bwd.num_warps * 32;
    if (mask == KC_MASK_EXPR) {
      entry("kcache_attn_bwd_mask_build", v1::ENTRY_ROLE_BACKWARD_MASK_BUILD, 128, 0, bwd.block_m,
            bwd.block_n);
    }
    // The elementwise kernels cover kAttnBwdRowsPerCta query rows per CTA
    // and have no key tiles (block_n 0).
    entry("kcache_attn_bwd_preprocess", v1::ENTRY_ROLE_BACKWARD_PREPROCESS, kAttnBwdAuxThreads, 0,
          kAttnBwdRowsPerCta, 0);
    entry("kcache_attn_bwd_dkdv", v1::ENTRY_ROLE_BACKWARD,
          AttentionBwdDkdvThreads(
              bwd.num_warps,
              AttentionBwdWgmma(arch->sm, arch->sm90a, static_cast<int>(spec.head_dim_qk()),
                                static_cast<int>(spec.head_dim_v())),
              spec.deterministic()),
          bwd.smem_dkdv, bwd.block_m, bwd.block_n);
    if (spec.deterministic()) {
      // A dQ CTA owns block_n query rows and steps over block_m keys
      // (kernels/attention_tiles.h): the entry says so in its own terms, so
      // that its grid is ceil(q_len / entry.block_m) like every query-side
      // entry's.
      entry("kcache_attn_bwd_dq", v1::ENTRY_ROLE_BACKWARD_DQ, bwd_threads, bwd.smem_dq, bwd.block_n,
            bwd.block_m);
    } else {
      entry("kcache_attn_bwd_dq_convert", v1::ENTRY_ROLE_BACKWARD_POSTPROCESS, kAttnBwdAuxThreads,
            0, kAttnBwdRowsPerCta, 0);
    }
  }
  return out;
}

}  // namespace kcache::attention
