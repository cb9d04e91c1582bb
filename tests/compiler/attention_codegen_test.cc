// Code generation for attention specs: the prelude and entry points
// (forward and backward), the lowering of expressions and of
// kc_expr_score_grad, and real NVRTC compiles of the generated translation
// units for a representative set of forward variants and a covering set of
// backward ones (the full cross-products with KCACHE_ATTENTION_FULL_MATRIX=1).
// NVRTC tests skip themselves when NVRTC cannot be loaded; no GPU is needed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/attention/codegen.h"
#include "compiler/attention/expr_lower.h"
#include "compiler/attention/spec_normalize.h"
#include "compiler/attention/spec_validate.h"
#include "compiler/cuda/nvrtc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/embedded.h"
#include "tests/compiler/attention_test_util.h"

namespace kcache::attention {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace ::kcache::attention::testing;  // NOLINT: test helpers
using B = v1::BinaryExpr;
using U = v1::UnaryExpr;

absl::StatusOr<GeneratedSource> Gen(const v1::AttentionSpec& spec, const char* arch) {
  const absl::Status valid = ValidateAttentionSpec(spec);
  if (!valid.ok()) return valid;
  return GenerateAttentionSource(NormalizeAttentionSpec(spec), arch);
}

TEST(LiteralsTest, HexFloatsAndInts) {
  EXPECT_EQ(HexFloatLiteral(3.0f), "0x1.8p+1f");
  EXPECT_EQ(HexFloatLiteral(-0.5f), "-0x1p-1f");
  EXPECT_EQ(HexFloatLiteral(0.0f), "0x0p+0f");
  EXPECT_EQ(HexFloatLiteral(static_cast<float>(1.0 / std::sqrt(128.0))), "0x1.6a09e6p-4f");
  EXPECT_EQ(HexFloatLiteral(std::numeric_limits<float>::denorm_min()), "0x1p-149f");
  EXPECT_EQ(IntLiteral(7), "7");
  EXPECT_EQ(IntLiteral(-7), "(-7)");
  EXPECT_EQ(IntLiteral(std::numeric_limits<int>::min()), "(-2147483647 - 1)");
}

TEST(CodegenTest, ArchStrings) {
  EXPECT_EQ(ParseAttentionArch("sm_90a")->sm, 90);
  EXPECT_TRUE(ParseAttentionArch("sm_90a")->sm90a);
  EXPECT_FALSE(ParseAttentionArch("sm_90")->sm90a);
  EXPECT_EQ(ParseAttentionArch("sm_86")->sm, 86);
  for (const char* bad : {"sm_75", "sm_100", "compute_90", "", "sm_90a\n#define"}) {
    EXPECT_EQ(ParseAttentionArch(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CodegenTest, PreludeFollowsTheContract) {
  v1::AttentionSpec s = BaseSpec();
  s.mutable_mask()->mutable_causal()->set_alignment(v1::CAUSAL_ALIGNMENT_BOTTOM_RIGHT);
  s.mutable_score_mod()->mutable_softcap()->set_cap(30);
  s.set_return_lse(true);
  absl::StatusOr<GeneratedSource> g = Gen(s, "sm_90a");
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string& src = g->source;
  for (const char* line :
       {"#define KC_ARCH 90\n", "#define KC_ARCH_SM90A 1\n", "#define KC_DTYPE_BF16 1\n",
        "#define KC_HEAD_DIM_QK 128\n", "#define KC_HEAD_DIM_V 128\n", "#define KC_MASK 1\n",
        "#define KC_MASK_BOTTOM_RIGHT 1\n", "#define KC_SCORE_MOD 1\n",
        "#define KC_SOFTCAP 0x1.ep+4f\n", "#define KC_SOFTMAX_SCALE 0x1.6a09e6p-4f\n",
        "#define KC_RETURN_LSE 1\n", "#define KC_BACKWARD 0\n", "#include \"attention_params.h\"\n",
        "#include \"attention_fwd.cuh\"\n"}) {
    EXPECT_THAT(src, HasSubstr(line));
  }
  EXPECT_LT(src.find("KC_DETERMINISTIC"), src.find("#include"));
  ASSERT_EQ(g->entry_points.size(), 1u);
  const v1::EntryPoint& fwd = g->entry_points[0];
  EXPECT_EQ(fwd.name(), "kcache_attn_fwd");
  EXPECT_EQ(fwd.role(), v1::ENTRY_ROLE_FORWARD);
  const AttentionTiles t =
      SelectAttentionTiles(90, 128, 128, KC_MASK_CAUSAL, false, /*sm90a=*/true);
  // sm_90a head dim 128: the ping-pong's two warpgroups and a producer warpgroup.
  EXPECT_EQ(t.num_warps, 8);
  EXPECT_EQ(fwd.threads(), 384u);
  EXPECT_EQ(fwd.dynamic_smem_bytes(), static_cast<uint32_t>(t.smem_bytes));
  EXPECT_EQ(fwd.block_m(), static_cast<uint32_t>(t.block_m));
  EXPECT_EQ(fwd.block_n(), static_cast<uint32_t>(t.block_n));
  EXPECT_EQ(g->program_name, "kcache_attention.cu");
}

TEST(CodegenTest, ExprMaskAddsMaskBuildAndNeverPrintsClientStrings) {
  v1::AttentionSpec s = BaseSpec();
  *s.add_buffers() = Buffer("zz_secret_doc_ids", v1::ELEM_TYPE_INT32, 2);
  *s.add_buffers() = Buffer("aa_secret_bias", v1::ELEM_TYPE_FLOAT32, 1);
  *s.mutable_mask()->mutable_expr()->mutable_predicate() =
      Bin(B::OP_EQ, Read("zz_secret_doc_ids", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_Q_IDX)}),
          Read("zz_secret_doc_ids", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_KV_IDX)}));
  *s.mutable_score_mod()->mutable_expr()->mutable_value() =
      Bin(B::OP_ADD, Score(), Read("aa_secret_bias", {Idx(v1::INDEX_VAR_H)}));
  absl::StatusOr<GeneratedSource> g = Gen(s, "sm_80");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->source, Not(HasSubstr("secret")));
  // Sorted by name: aa_secret_bias is slot 0, zz_secret_doc_ids slot 1.
  EXPECT_THAT(g->source, HasSubstr("float kc_read_0(const kcache::AttentionParams& p, int i0)"));
  EXPECT_THAT(g->source,
              HasSubstr("int kc_read_1(const kcache::AttentionParams& p, int i0, int i1)"));
  EXPECT_THAT(g->source, HasSubstr("bool kc_expr_mask("));
  EXPECT_THAT(g->source, HasSubstr("float kc_expr_score(float score"));
  ASSERT_EQ(g->entry_points.size(), 2u);
  EXPECT_EQ(g->entry_points[1].name(), "kcache_attn_mask_build");
  EXPECT_EQ(g->entry_points[1].role(), v1::ENTRY_ROLE_MASK_BUILD);
  EXPECT_EQ(g->entry_points[1].threads(), 128u);
  // Forward only: classes per forward tile.
  EXPECT_EQ(g->entry_points[1].block_m(), static_cast<uint32_t>(g->tiles.block_m));
}

TEST(CodegenTest, TuningOverridesAndArchLegality) {
  v1::AttentionSpec s = BaseSpec();
  s.mutable_tuning()->set_block_m(64);
  absl::StatusOr<GeneratedSource> g = Gen(s, "sm_80");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->tiles.block_m, 64);
  EXPECT_THAT(g->source, HasSubstr("#define KC_BLOCK_M 64\n"));
  // 4 stages of 128-wide d256 K/V tiles exceed every architecture's shared memory.
  s.set_head_dim_qk(256);
  s.mutable_tuning()->set_block_n(128);
  s.mutable_tuning()->set_stages(4);
  g = Gen(s, "sm_90");
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("spec.tuning: "));
}

TEST(CodegenTest, RejectsWhatItCannotBuild) {
  v1::AttentionSpec s = BaseSpec();
  EXPECT_EQ(Gen(s, "sm_75").status().code(), absl::StatusCode::kInvalidArgument);
  // The backward has no d128 tiles where shared memory is small, and none
  // for d256 anywhere (refused by validation, which codegen runs too).
  s.set_backward(true);
  for (const char* arch : {"sm_86", "sm_89"}) {
    absl::StatusOr<GeneratedSource> g = Gen(s, arch);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << arch;
    EXPECT_THAT(std::string(g.status().message()),
                HasSubstr("spec.head_dim_qk: the backward has no tiles for head dims 128/128"));
  }
  s.set_head_dim_qk(256);
  EXPECT_EQ(GenerateAttentionSource(NormalizeAttentionSpec(s), "sm_90").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(GenerateAttentionSource(NormalizeAttentionSpec(s), "sm_90").status().message()),
      HasSubstr("spec.head_dim_qk"));
  // The backward's tile selection itself, without validation in front.
  v1::AttentionSpec d256 = NormalizeAttentionSpec(BaseSpec());
  d256.set_head_dim_qk(256);
  d256.set_head_dim_v(256);
  absl::StatusOr<AttentionBwdTiles> t = ChooseAttentionBwdTiles(d256, AttentionArch{90, true});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("spec.head_dim_qk: the backward has no tiles for head dims 256/256"));
  v1::AttentionSpec bad = BaseSpec();
  bad.set_num_kv_heads(5);
  EXPECT_EQ(GenerateAttentionSource(bad, "sm_90").status().code(),
            absl::StatusCode::kInvalidArgument);
}

v1::AttentionSpec BackwardSpec(bool deterministic, bool expr_mask) {
  v1::AttentionSpec s = BaseSpec();
  s.set_backward(true);
  s.set_deterministic(deterministic);
  if (expr_mask) {
    *s.add_buffers() = Buffer("doc", v1::ELEM_TYPE_INT32, 2);
    *s.mutable_mask()->mutable_expr()->mutable_predicate() =
        Bin(B::OP_EQ, Read("doc", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_Q_IDX)}),
            Read("doc", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_KV_IDX)}));
  } else {
    s.mutable_mask()->mutable_causal();
  }
  return s;
}

struct ExpectedEntry {
  std::string name;
  v1::EntryRole role;
  uint32_t threads, smem, block_m, block_n;
};

void ExpectEntries(const GeneratedSource& g, const std::vector<ExpectedEntry>& want) {
  ASSERT_EQ(g.entry_points.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const v1::EntryPoint& e = g.entry_points[i];
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(e.name(), want[i].name);
    EXPECT_EQ(e.role(), want[i].role);
    EXPECT_EQ(e.threads(), want[i].threads);
    EXPECT_EQ(e.dynamic_smem_bytes(), want[i].smem);
    EXPECT_EQ(e.block_m(), want[i].block_m);
    EXPECT_EQ(e.block_n(), want[i].block_n);
  }
}

TEST(CodegenBackwardTest, EntryPointsRolesAndTilesFollowTheContract) {
  for (const char* arch : {"sm_80", "sm_90", "sm_90a"}) {
    for (bool det : {false, true}) {
      for (bool expr : {false, true}) {
        SCOPED_TRACE(absl::StrCat(arch, det ? " deterministic" : "", expr ? " expr" : ""));
        absl::StatusOr<GeneratedSource> g = Gen(BackwardSpec(det, expr), arch);
        ASSERT_TRUE(g.ok()) << g.status();
        const AttentionArch a = *ParseAttentionArch(arch);
        const AttentionBwdTiles t = SelectAttentionBwdTiles(
            a.sm, 128, 128, expr ? KC_MASK_EXPR : KC_MASK_CAUSAL, false, a.sm90a);
        ASSERT_GT(t.block_m, 0);
        EXPECT_EQ(g->bwd_tiles.block_m, t.block_m);
        EXPECT_EQ(g->bwd_tiles.smem_dkdv, t.smem_dkdv);
        const auto u = [](int v) { return static_cast<uint32_t>(v); };
        // sm_90a head dim 128: the forward's ping-pong has a producer warpgroup.
        const uint32_t fwd_threads = u(g->tiles.num_warps * 32 + (a.sm90a ? 128 : 0));
        std::vector<ExpectedEntry> want = {{"kcache_attn_fwd", v1::ENTRY_ROLE_FORWARD, fwd_threads,
                                            u(g->tiles.smem_bytes), u(g->tiles.block_m),
                                            u(g->tiles.block_n)}};
        if (expr) {
          // One classification for forward and backward where the backward's
          // tiles refine the forward's: sm_90a head dim 128 (128 x 128 forward
          // tiles, 64 x 128 backward); the portable forward's 128 x 32 do not.
          const uint32_t class_m = u(AttentionClassBlockM(g->tiles, t, true));
          EXPECT_EQ(class_m, a.sm90a ? u(t.block_m) : u(g->tiles.block_m));
          EXPECT_THAT(g->source,
                      HasSubstr(absl::StrCat("#define KC_CLASS_BLOCK_M ", class_m, "\n")));
          want.push_back({"kcache_attn_mask_build", v1::ENTRY_ROLE_MASK_BUILD, 128, 0, class_m,
                          u(g->tiles.block_n)});
          want.push_back({"kcache_attn_bwd_mask_build", v1::ENTRY_ROLE_BACKWARD_MASK_BUILD, 128, 0,
                          u(t.block_m), u(t.block_n)});
        }
        want.push_back({"kcache_attn_bwd_preprocess", v1::ENTRY_ROLE_BACKWARD_PREPROCESS,
                        u(kAttnBwdAuxThreads), 0, u(kAttnBwdRowsPerCta), 0});
        // sm_90a's wgmma dK/dV has a producer warpgroup beside the compute
        // warps, outside the deterministic mode.
        const uint32_t dkdv_threads = u(t.num_warps * 32 + (a.sm90a && !det ? 128 : 0));
        want.push_back({"kcache_attn_bwd_dkdv", v1::ENTRY_ROLE_BACKWARD, dkdv_threads,
                        u(t.smem_dkdv), u(t.block_m), u(t.block_n)});
        if (det) {
          // Its CTA owns block_n query rows (attention_tiles.h): the entry's
          // block_m is the rows per CTA.
          want.push_back({"kcache_attn_bwd_dq", v1::ENTRY_ROLE_BACKWARD_DQ, u(t.num_warps * 32),
                          u(t.smem_dq), u(t.block_n), u(t.block_m)});
        } else {
          want.push_back({"kcache_attn_bwd_dq_convert", v1::ENTRY_ROLE_BACKWARD_POSTPROCESS,
                          u(kAttnBwdAuxThreads), 0, u(kAttnBwdRowsPerCta), 0});
        }
        ExpectEntries(*g, want);

        const std::string& src = g->source;
        for (const std::string& line :
             {std::string("#define KC_BACKWARD 1\n"),
              absl::StrCat("#define KC_DETERMINISTIC ", det ? 1 : 0, "\n"),
              std::string("#define KC_RETURN_LSE 1\n"),
              absl::StrCat("#define KC_BWD_BLOCK_M ", t.block_m, "\n"),
              absl::StrCat("#define KC_BWD_BLOCK_N ", t.block_n, "\n"),
              absl::StrCat("#define KC_BWD_NUM_WARPS ", t.num_warps, "\n")}) {
          EXPECT_THAT(src, HasSubstr(line));
        }
        // The backward template after the forward's, after every macro.
        const size_t fwd = src.find("#include \"attention_fwd.cuh\"\n");
        const size_t bwd = src.find("#include \"attention_bwd.cuh\"\n");
        ASSERT_NE(bwd, std::string::npos);
        EXPECT_LT(fwd, bwd);
        EXPECT_LT(src.find("KC_BWD_NUM_WARPS"), src.find("#include"));
        EXPECT_THAT(g->headers, ::testing::ElementsAre("attention_params.h", "attention_fwd.cuh",
                                                       "attention_bwd.cuh"));
        // Two units: the forward's (no backward include), the backward's
        // (the whole text under KC_OMIT_FWD).
        ASSERT_EQ(g->units.size(), 2u);
        EXPECT_EQ(g->units[0], src.substr(0, bwd));
        EXPECT_EQ(g->units[1], "#define KC_OMIT_FWD 1\n" + src);
      }
    }
  }
}

TEST(CodegenBackwardTest, ForwardOnlySpecsHaveNoBackwardMacrosOrEntries) {
  absl::StatusOr<GeneratedSource> g = Gen(BaseSpec(), "sm_90a");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->source, Not(HasSubstr("KC_BWD_")));
  EXPECT_THAT(g->source, Not(HasSubstr("attention_bwd.cuh")));
  EXPECT_THAT(g->source, Not(HasSubstr("kc_expr_score_grad")));
  EXPECT_EQ(g->bwd_tiles.block_m, 0);
  EXPECT_THAT(g->headers, ::testing::ElementsAre("attention_params.h", "attention_fwd.cuh"));
  EXPECT_THAT(g->units, ::testing::ElementsAre(g->source));
}

// ---------------------------------------------------------------------------
// kc_expr_score_grad: the text of the reverse sweep.
// ---------------------------------------------------------------------------

std::string Lowered(const v1::AttentionSpec& s) {
  EXPECT_TRUE(ValidateAttentionSpec(s).ok()) << ValidateAttentionSpec(s);
  absl::StatusOr<std::string> code = LowerSpecExpressions(NormalizeAttentionSpec(s));
  EXPECT_TRUE(code.ok()) << code.status();
  return code.ok() ? *code : std::string();
}

// The text of one generated function, from its signature to the closing
// brace at the start of a line.
std::string Function(const std::string& code, const std::string& signature_start) {
  const size_t at = code.find(signature_start);
  if (at == std::string::npos) return "";
  const size_t end = code.find("\n}\n", at);
  return code.substr(at, end == std::string::npos ? std::string::npos : end + 3 - at);
}

v1::AttentionSpec ScoreSpec(v1::Expr value, bool backward) {
  v1::AttentionSpec s = BaseSpec();
  *s.mutable_score_mod()->mutable_expr()->mutable_value() = std::move(value);
  s.set_backward(backward);
  return s;
}

TEST(LowerGradTest, SoftcapLikeExpression) {
  // 30 * tanh(score / 30): t0 = score / 30, t1 = tanh, t2 = 30 * t1.
  const v1::Expr softcap =
      Bin(B::OP_MUL, Flt(30), Un(U::OP_TANH, Bin(B::OP_DIV, Score(), Flt(30))));
  EXPECT_THAT(Lowered(ScoreSpec(softcap, false)), Not(HasSubstr("kc_expr_score_grad")));
  const std::string code = Lowered(ScoreSpec(softcap, true));
  const std::string fwd = Function(code, "__device__ __forceinline__ float kc_expr_score(");
  const std::string grad = Function(code, "__device__ __forceinline__ float kc_expr_score_grad(");
  ASSERT_FALSE(grad.empty()) << code;
  EXPECT_THAT(grad, HasSubstr("kc_expr_score_grad(float score, float grad, int b, int h,\n"));
  EXPECT_THAT(grad, HasSubstr("const kcache::AttentionParams& p,\n"));
  EXPECT_THAT(grad, HasSubstr("bool buffer_grads) {\n"));
  // The forward's body, verbatim.
  const std::string body =
      "  const float t0 = score / 0x1.ep+4f;\n"
      "  const float t1 = tanhf(t0);\n"
      "  const float t2 = 0x1.ep+4f * t1;\n";
  EXPECT_THAT(fwd, HasSubstr(body));
  EXPECT_THAT(grad, HasSubstr(body));
  EXPECT_THAT(grad, HasSubstr("  float ds = 0.0f;\n"
                              "  float a0 = 0.0f;\n"
                              "  float a1 = 0.0f;\n"
                              "  const float a2 = grad;\n"
                              "  a1 += a2 * 0x1.ep+4f;\n"
                              "  a0 += a1 * (1.0f - t1 * t1);\n"
                              "  ds += a0 / 0x1.ep+4f;\n"
                              "  return ds;\n}\n"));
  // Constants get no adjoint.
  EXPECT_THAT(grad, Not(HasSubstr("-= a0 / 0x1.ep+4f * t0")));
}

TEST(LowerGradTest, SelectMinDivAndIntsCarryGradientsOnlyWhereTheyShould) {
  // select(q_idx >= kv_idx, min(score, 5), exp(score) - to_float(h)) / score
  const v1::Expr e =
      Bin(B::OP_DIV,
          Sel(Bin(B::OP_GE, Idx(v1::INDEX_VAR_Q_IDX), Idx(v1::INDEX_VAR_KV_IDX)),
              Bin(B::OP_MIN, Score(), Flt(5)),
              Bin(B::OP_SUB, Un(U::OP_EXP, Score()), Un(U::OP_TO_FLOAT, Idx(v1::INDEX_VAR_H)))),
          Score());
  const std::string grad =
      Function(Lowered(ScoreSpec(e, true)), "__device__ __forceinline__ float kc_expr_score_grad(");
  // t0 = q >= kv (bool), t1 = fminf(score, 5), t2 = expf(score),
  // t3 = to_float(h) (no gradient), t4 = t2 - t3, t5 = select, t6 = t5 / score.
  EXPECT_THAT(grad, HasSubstr("  const float t1 = fminf(score, 0x1.4p+2f);\n"));
  EXPECT_THAT(grad, HasSubstr("  (void)t6;\n"
                              "  // reverse sweep: aN = d(result)/d(tN) * grad, ds = "
                              "d(result)/d(score) * grad\n"
                              "  float ds = 0.0f;\n"
                              "  float a1 = 0.0f;\n"
                              "  float a2 = 0.0f;\n"
                              "  float a4 = 0.0f;\n"
                              "  float a5 = 0.0f;\n"
                              "  const float a6 = grad;\n"
                              "  a5 += a6 / score;\n"
                              "  ds -= a6 / score * t6;\n"
                              "  a1 += t0 ? a5 : 0.0f;\n"
                              "  a4 += t0 ? 0.0f : a5;\n"
                              "  a2 += a4;\n"
                              "  ds += a2 * t2;\n"
                              "  ds += t1 == score ? a1 : 0.0f;\n"
                              "  return ds;\n}\n"));
  EXPECT_THAT(grad, Not(HasSubstr("a0")));
  EXPECT_THAT(grad, Not(HasSubstr("a3")));
}

TEST(LowerGradTest, AbsNegMaxAndConstantResults) {
  // max(-|score|, 2 * score): the adjoint goes to the operand fmaxf returned.
  std::string grad = Function(
      Lowered(ScoreSpec(
          Bin(B::OP_MAX, Un(U::OP_NEG, Un(U::OP_ABS, Score())), Bin(B::OP_MUL, Flt(2), Score())),
          true)),
      "__device__ __forceinline__ float kc_expr_score_grad(");
  EXPECT_THAT(grad, HasSubstr("  const float a3 = grad;\n"
                              "  a1 += t3 == t1 ? a3 : 0.0f;\n"
                              "  a2 += t3 == t1 ? 0.0f : a3;\n"
                              "  ds += a2 * 0x1p+1f;\n"
                              "  a0 -= a1;\n"
                              "  ds += score > 0.0f ? a0 : (score < 0.0f ? -a0 : 0.0f);\n"));
  // The identity: the score's adjoint is grad itself.
  grad = Function(Lowered(ScoreSpec(Score(), true)),
                  "__device__ __forceinline__ float kc_expr_score_grad(");
  EXPECT_THAT(grad, HasSubstr("  float ds = 0.0f;\n  ds += grad;\n  return ds;\n"));
  // No dependence on the score: 0.
  grad = Function(Lowered(ScoreSpec(Un(U::OP_EXP, Un(U::OP_TO_FLOAT, Idx(v1::INDEX_VAR_H))), true)),
                  "__device__ __forceinline__ float kc_expr_score_grad(");
  EXPECT_THAT(grad, HasSubstr("  float ds = 0.0f;\n  return ds;\n"));
}

TEST(LowerGradTest, TrainableReadsAddIntoBufferGradsAtTheReadElement) {
  v1::AttentionSpec s = BaseSpec();
  *s.add_buffers() = Buffer("zz_secret_bias", v1::ELEM_TYPE_FLOAT32, 2, /*trainable=*/true);
  *s.add_buffers() = Buffer("aa_secret_scale", v1::ELEM_TYPE_FLOAT32, 1, /*trainable=*/false);
  // score * scale[h] + bias[h, kv_idx - q_idx]
  *s.mutable_score_mod()->mutable_expr()->mutable_value() =
      Bin(B::OP_ADD, Bin(B::OP_MUL, Score(), Read("aa_secret_scale", {Idx(v1::INDEX_VAR_H)})),
          Read("zz_secret_bias", {Idx(v1::INDEX_VAR_H), Bin(B::OP_SUB, Idx(v1::INDEX_VAR_KV_IDX),
                                                            Idx(v1::INDEX_VAR_Q_IDX))}));
  s.set_backward(true);
  const std::string code = Lowered(s);
  EXPECT_THAT(code, Not(HasSubstr("secret")));
  // Slot 1 (zz_secret_bias) is trainable: its gradient helper has the read
  // helper's conditions and offset.
  const std::string read = Function(code, "__device__ __forceinline__ float kc_read_1(");
  const std::string grad1 = Function(code, "__device__ __forceinline__ void kc_grad_1(");
  ASSERT_FALSE(grad1.empty()) << code;
  EXPECT_THAT(code, Not(HasSubstr("kc_grad_0")));
  EXPECT_THAT(grad1, HasSubstr("(const kcache::AttentionParams& p, float g, int i0, int i1) {\n"
                               "  const kcache::KcBuffer& buf = p.buffers[1];\n"
                               "  float* const dst = p.buffer_grads[1];\n"
                               "  if (g == 0.0f || dst == nullptr || buf.ptr == nullptr || "
                               "buf.rank != 2) return;\n"));
  for (const char* shared :
       {"  if (i0 < 0 || static_cast<kc_i64>(i0) >= buf.extent[0]) return",
        "  if (i1 < 0 || static_cast<kc_i64>(i1) >= buf.extent[1]) return",
        "  const kc_i64 off = static_cast<kc_i64>(i0) * buf.stride[0] + static_cast<kc_i64>(i1) * "
        "buf.stride[1];\n"}) {
    EXPECT_THAT(read, HasSubstr(shared));
    EXPECT_THAT(grad1, HasSubstr(shared));
  }
  EXPECT_THAT(grad1, HasSubstr("  atomicAdd(dst + off, g);\n"));
  const std::string grad = Function(code, "__device__ __forceinline__ float kc_expr_score_grad(");
  EXPECT_THAT(grad, HasSubstr("  const float t3 = kc_read_1(p, h, t2);\n"));
  EXPECT_THAT(grad, HasSubstr("  const float a4 = grad;\n"
                              "  a1 += a4;\n"
                              "  a3 += a4;\n"
                              "  if (buffer_grads) kc_grad_1(p, a3, h, t2);\n"
                              "  ds += a1 * t0;\n"
                              "  return ds;\n"));

  // Not trainable, or no backward: no gradient helper, no atomics.
  s.mutable_buffers(0)->set_trainable(false);
  EXPECT_THAT(Lowered(s), Not(HasSubstr("kc_grad_")));
  EXPECT_THAT(Lowered(s), Not(HasSubstr("atomicAdd")));
  s.mutable_buffers(0)->set_trainable(true);
  s.set_backward(false);
  EXPECT_THAT(Lowered(s), Not(HasSubstr("kc_grad_")));
  EXPECT_THAT(Lowered(s), Not(HasSubstr("kc_expr_score_grad")));
}

TEST(LowerGradTest, ReadUnderAConditionOnlyHasNoGradient) {
  // select(bias[h] > 0, score, 0): bias is trainable but only decides the
  // branch, so it gets no gradient (and no atomics are emitted for it).
  v1::AttentionSpec s = BaseSpec();
  *s.add_buffers() = Buffer("bias", v1::ELEM_TYPE_FLOAT32, 1, /*trainable=*/true);
  *s.mutable_score_mod()->mutable_expr()->mutable_value() =
      Sel(Bin(B::OP_GT, Read("bias", {Idx(v1::INDEX_VAR_H)}), Flt(0)), Score(), Flt(0));
  s.set_backward(true);
  const std::string grad =
      Function(Lowered(s), "__device__ __forceinline__ float kc_expr_score_grad(");
  EXPECT_THAT(grad, Not(HasSubstr("kc_grad_0(")));
  EXPECT_THAT(grad, HasSubstr("  ds += t1 ? a2 : 0.0f;\n"));
}

TEST(LowerTest, IntSemanticsAreWrappingAndModIsTotal) {
  v1::AttentionSpec s = BaseSpec();
  *s.mutable_mask()->mutable_expr()->mutable_predicate() =
      Bin(B::OP_GE,
          Bin(B::OP_MOD, Bin(B::OP_ADD, Idx(v1::INDEX_VAR_Q_IDX), Int(-3)), Un(U::OP_NEG, Int(4))),
          Int(std::numeric_limits<int>::min()));
  absl::StatusOr<std::string> code = LowerSpecExpressions(NormalizeAttentionSpec(s));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(*code, HasSubstr("static_cast<unsigned>(q_idx) + static_cast<unsigned>((-3))"));
  EXPECT_THAT(*code, HasSubstr("kc_imod("));
  EXPECT_THAT(*code, HasSubstr("int kc_imod(int a, int m)"));
  EXPECT_THAT(*code, HasSubstr("(-2147483647 - 1)"));
}

TEST(LowerTest, MaskSaysWhichIndicesItReadsAndHasATileEvaluation) {
  // (kv // 16 == q // 16) | (kv < anchors[b, q // 16]): reads b, not h.
  v1::AttentionSpec s = BaseSpec();
  *s.add_buffers() = Buffer("anchors", v1::ELEM_TYPE_INT32, 2, /*trainable=*/false);
  const v1::Expr j = Bin(B::OP_FLOORDIV, Idx(v1::INDEX_VAR_Q_IDX), Int(16));
  *s.mutable_mask()->mutable_expr()->mutable_predicate() =
      Bin(B::OP_OR, Bin(B::OP_EQ, Bin(B::OP_FLOORDIV, Idx(v1::INDEX_VAR_KV_IDX), Int(16)), j),
          Bin(B::OP_LT, Idx(v1::INDEX_VAR_KV_IDX), Read("anchors", {Idx(v1::INDEX_VAR_B), j})));
  absl::StatusOr<std::string> code = LowerSpecExpressions(NormalizeAttentionSpec(s));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(*code, HasSubstr("#define KC_EXPR_MASK_READS_B 1\n"));
  EXPECT_THAT(*code, HasSubstr("#define KC_EXPR_MASK_READS_H 0\n"));
  EXPECT_THAT(*code, HasSubstr("#define KC_EXPR_MASK_TILE 1\n"));
  EXPECT_THAT(*code, HasSubstr("int kc_ifloordiv(int a, int d)"));
  EXPECT_THAT(*code, HasSubstr("kc_read_range_0(p, "));
  EXPECT_THAT(*code, HasSubstr("__device__ __forceinline__ int kc_expr_mask_tile("));
  // A score modification alone has no tile evaluation.
  v1::AttentionSpec t = BaseSpec();
  *t.mutable_score_mod()->mutable_expr()->mutable_value() = Score();
  absl::StatusOr<std::string> score_only = LowerSpecExpressions(NormalizeAttentionSpec(t));
  ASSERT_TRUE(score_only.ok());
  EXPECT_THAT(*score_only, Not(HasSubstr("KC_EXPR_MASK_")));
}

TEST(LowerTest, MaskRowOnlyPartIsComputedOncePerRow) {
  // (kv <= q) & (q - kv < window[h]): window[h] reads nothing of kv, so it
  // moves to kc_expr_mask_row and kc_expr_mask_rd takes it from the int4.
  v1::AttentionSpec s = BaseSpec();
  *s.add_buffers() = Buffer("window", v1::ELEM_TYPE_INT32, 1, /*trainable=*/false);
  const v1::Expr q = Idx(v1::INDEX_VAR_Q_IDX), kv = Idx(v1::INDEX_VAR_KV_IDX);
  *s.mutable_mask()->mutable_expr()->mutable_predicate() =
      Bin(B::OP_AND, Bin(B::OP_LE, kv, q),
          Bin(B::OP_LT, Bin(B::OP_SUB, q, kv), Read("window", {Idx(v1::INDEX_VAR_H)})));
  absl::StatusOr<std::string> code = LowerSpecExpressions(NormalizeAttentionSpec(s));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(*code, HasSubstr("#define KC_EXPR_MASK_ROW 1\n"));
  const std::string row = Function(*code, "__device__ __forceinline__ int4 kc_expr_mask_row(");
  EXPECT_THAT(row, HasSubstr("kc_read_0(p, h)"));
  EXPECT_THAT(row, Not(HasSubstr("kv_idx <=")));
  const std::string rd = Function(*code, "__device__ __forceinline__ bool kc_expr_mask_rd(");
  EXPECT_THAT(rd, Not(HasSubstr("kc_read_0(")));
  EXPECT_THAT(rd, HasSubstr(" = r.x;\n"));
  // The unsplit predicate stays (the reference kernel and classification use it).
  EXPECT_THAT(Function(*code, "__device__ __forceinline__ bool kc_expr_mask("),
              HasSubstr("kc_read_0(p, h)"));

  // Nothing row-only to hoist (the predicate reads kv in every node): no split.
  v1::AttentionSpec t = BaseSpec();
  *t.mutable_mask()->mutable_expr()->mutable_predicate() = Bin(B::OP_LT, kv, Int(100));
  absl::StatusOr<std::string> plain = LowerSpecExpressions(NormalizeAttentionSpec(t));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(*plain, HasSubstr("#define KC_EXPR_MASK_ROW 0\n"));
  EXPECT_THAT(*plain, Not(HasSubstr("kc_expr_mask_row(")));

  // Five row-only values read by the per-key part do not fit the int4: no split.
  v1::AttentionSpec u = BaseSpec();
  v1::Expr pred = Bin(B::OP_LT, kv, Bin(B::OP_FLOORDIV, q, Int(2)));
  for (int d = 3; d <= 6; ++d) {
    pred = Bin(B::OP_AND, pred, Bin(B::OP_LT, kv, Bin(B::OP_FLOORDIV, q, Int(d))));
  }
  *u.mutable_mask()->mutable_expr()->mutable_predicate() = pred;
  absl::StatusOr<std::string> wide = LowerSpecExpressions(NormalizeAttentionSpec(u));
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_THAT(*wide, HasSubstr("#define KC_EXPR_MASK_ROW 0\n"));
}

// ---------------------------------------------------------------------------
// Real NVRTC compiles.
// ---------------------------------------------------------------------------

const Nvrtc& SharedNvrtc() {
  static const Nvrtc* nvrtc = new Nvrtc();
  return *nvrtc;
}

std::map<std::string, std::string> TemplateHeaders() {
  std::map<std::string, std::string> h;
  for (const kernels::TemplateFile& f : kernels::TemplateFiles()) {
    h.emplace(std::string(f.name), std::string(f.contents));
  }
  return h;
}

absl::Status CompileGenerated(const GeneratedSource& g, const std::string& arch) {
  // As the daemon compiles it: each unit into an image of its own.
  CompileInput in;
  in.source = g.units.front();
  in.more_units.assign(g.units.begin() + 1, g.units.end());
  in.program_name = g.program_name;
  in.headers = TemplateHeaders();
  in.arch = arch;
  absl::StatusOr<CompileOutput> out = CompileUnits(SharedNvrtc(), in, absl::InfiniteFuture());
  if (!out.ok()) return out.status();
  // No kernel in two units (KC_OMIT_FWD leaves the forward's out of the backward's).
  std::set<std::string> names;
  for (const KernelReport& k : out->kernels) {
    if (!names.insert(k.name).second) {
      return absl::InternalError(absl::StrCat("kernel ", k.name, " is in two units"));
    }
  }
  for (const v1::EntryPoint& e : g.entry_points) {
    bool found = false;
    for (const KernelReport& k : out->kernels) found |= k.name == e.name();
    if (!found) return absl::NotFoundError(absl::StrCat("entry point ", e.name(), " not in cubin"));
  }
  return absl::OkStatus();
}

struct Variant {
  std::string name;
  v1::AttentionSpec spec;
};

std::vector<std::pair<std::string, v1::MaskSpec>> AllMasks() {
  std::vector<std::pair<std::string, v1::MaskSpec>> m;
  v1::MaskSpec x;
  x.mutable_none();
  m.emplace_back("none", x);
  x.mutable_causal();
  m.emplace_back("causal", x);
  x.mutable_causal()->set_alignment(v1::CAUSAL_ALIGNMENT_BOTTOM_RIGHT);
  m.emplace_back("causal_br", x);
  x.mutable_sliding_window()->set_left(256);
  x.mutable_sliding_window()->set_right(0);
  m.emplace_back("window", x);
  x.mutable_sliding_window()->set_alignment(v1::CAUSAL_ALIGNMENT_BOTTOM_RIGHT);
  x.mutable_sliding_window()->set_right(-1);
  m.emplace_back("window_br_right_unbounded", x);
  x.mutable_document();
  m.emplace_back("document", x);
  x.mutable_document()->set_causal(true);
  m.emplace_back("document_causal", x);
  x.mutable_drafter()->set_block_size(16);
  m.emplace_back("drafter", x);
  x.mutable_drafter()->set_causal_within_block(true);
  x.mutable_drafter()->set_context_window(1024);
  m.emplace_back("drafter_causal_window", x);
  x.mutable_expr();  // filled by WithExpressions
  m.emplace_back("expr", x);
  return m;
}

std::vector<std::pair<std::string, v1::ScoreMod>> AllScoreMods() {
  std::vector<std::pair<std::string, v1::ScoreMod>> m;
  v1::ScoreMod x;
  x.mutable_none();
  m.emplace_back("none", x);
  x.mutable_softcap()->set_cap(30);
  m.emplace_back("softcap", x);
  x.mutable_alibi();
  m.emplace_back("alibi", x);
  x.mutable_expr();
  m.emplace_back("expr", x);
  return m;
}

// Representative trees: a document-style mask over two buffers and a
// bias/tanh score modification using every unary kind.
void WithExpressions(v1::AttentionSpec* s) {
  if (s->mask().has_expr()) {
    *s->add_buffers() = Buffer("doc", v1::ELEM_TYPE_INT32, 2);
    *s->add_buffers() = Buffer("keep", v1::ELEM_TYPE_BOOL, 1);
    *s->mutable_mask()->mutable_expr()->mutable_predicate() =
        Bin(B::OP_AND,
            Bin(B::OP_EQ, Read("doc", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_Q_IDX)}),
                Read("doc", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_KV_IDX)})),
            Bin(B::OP_OR, Read("keep", {Idx(v1::INDEX_VAR_H)}),
                Bin(B::OP_GE, Bin(B::OP_MOD, Idx(v1::INDEX_VAR_Q_IDX), Int(16)),
                    Bin(B::OP_MOD, Idx(v1::INDEX_VAR_KV_IDX), Int(16)))));
  }
  if (s->score_mod().has_expr()) {
    *s->add_buffers() = Buffer("bias", v1::ELEM_TYPE_FLOAT32, 2);
    *s->mutable_score_mod()->mutable_expr()->mutable_value() = Sel(
        Bin(B::OP_LT,
            Un(U::OP_ABS, Bin(B::OP_SUB, Idx(v1::INDEX_VAR_Q_IDX), Idx(v1::INDEX_VAR_KV_IDX))),
            Int(1024)),
        Bin(B::OP_ADD, Bin(B::OP_MUL, Flt(30), Un(U::OP_TANH, Bin(B::OP_DIV, Score(), Flt(30)))),
            Read("bias", {Idx(v1::INDEX_VAR_H),
                          Bin(B::OP_SUB, Idx(v1::INDEX_VAR_KV_IDX), Idx(v1::INDEX_VAR_Q_IDX))})),
        Bin(B::OP_MAX, Un(U::OP_NEG, Un(U::OP_EXP, Un(U::OP_TO_FLOAT, Idx(v1::INDEX_VAR_H)))),
            Score()));
  }
}

std::vector<Variant> Variants(bool full) {
  std::vector<Variant> out;
  const std::vector<std::pair<uint32_t, uint32_t>> dims =
      full ? std::vector<std::pair<uint32_t, uint32_t>>{{64, 64},   {64, 128},  {128, 64},
                                                        {128, 128}, {128, 256}, {256, 128},
                                                        {256, 256}, {256, 64},  {64, 256}}
           : std::vector<std::pair<uint32_t, uint32_t>>{{64, 64}, {256, 256}, {128, 64}};
  for (v1::DType dt : {v1::DTYPE_BF16, v1::DTYPE_FP16}) {
    for (const auto& [mname, mask] : AllMasks()) {
      for (const auto& [sname, score] : AllScoreMods()) {
        for (bool lse : {false, true}) {
          // Representative: lse alternates over the (mask, score) grid and
          // fp16 gets only every other score modification.
          if (!full && lse != ((mname.size() + sname.size()) % 2 == 0)) continue;
          if (!full && dt == v1::DTYPE_FP16 && (sname == "alibi" || sname == "softcap")) continue;
          v1::AttentionSpec s = BaseSpec();
          s.set_dtype(dt);
          *s.mutable_mask() = mask;
          *s.mutable_score_mod() = score;
          s.set_return_lse(lse);
          WithExpressions(&s);
          out.push_back({absl::StrCat(dt == v1::DTYPE_BF16 ? "bf16" : "fp16", "_d128_", mname, "_",
                                      sname, lse ? "_lse" : ""),
                         s});
        }
      }
    }
  }
  for (const auto& [dqk, dv] : dims) {
    for (const char* mname : {"causal", "drafter", "expr"}) {
      if (!full && std::string(mname) != "causal" && dqk != 256) continue;
      v1::AttentionSpec s = BaseSpec();
      s.set_head_dim_qk(dqk);
      s.set_head_dim_v(dv);
      for (const auto& [n, m] : AllMasks()) {
        if (n == mname) *s.mutable_mask() = m;
      }
      WithExpressions(&s);
      out.push_back({absl::StrCat("bf16_d", dqk, "_", dv, "_", mname), s});
    }
  }
  {
    v1::AttentionSpec s = BaseSpec();
    s.mutable_tuning()->set_block_m(64);
    s.mutable_tuning()->set_block_n(32);
    s.mutable_tuning()->set_stages(3);
    s.mutable_mask()->mutable_causal();
    out.push_back({"bf16_d128_causal_tuned_64x32x3", s});
  }
  return out;
}

struct Job {
  std::string label;
  GeneratedSource source;
  std::string arch;
  absl::Status result;
};

// Compiles every job, on KCACHE_ATTENTION_COMPILE_THREADS threads (2 by
// default: NVRTC is thread-safe for distinct programs), and reports each
// failure with its source.
void CompileAll(std::vector<Job>& jobs, int skipped, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  const char* threads_env = std::getenv("KCACHE_ATTENTION_COMPILE_THREADS");
  const int nthreads = threads_env != nullptr ? std::max(1, std::atoi(threads_env)) : 2;
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(nthreads));
  for (int t = 0; t < nthreads; ++t) {
    pool.emplace_back([&] {
      for (size_t j = next++; j < jobs.size(); j = next++) {
        jobs[j].result = CompileGenerated(jobs[j].source, jobs[j].arch);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (const Job& j : jobs) {
    EXPECT_TRUE(j.result.ok()) << j.label << ": " << j.result << "\n--- source ---\n"
                               << j.source.source;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("compiled %d %s (%d without tiles) in %.1f s on %d threads\n",
              static_cast<int>(jobs.size()), what, skipped, secs, nthreads);
}

bool FullMatrix() {
  const char* env = std::getenv("KCACHE_ATTENTION_FULL_MATRIX");
  return env != nullptr && std::string(env) == "1";
}

// block_n 176 (FlashAttention-3's key tile for head dim 128) exists only on
// sm_90a's ping-pong forward: elsewhere it is a clear tuning error, and
// where it is legal it compiles.
TEST(CodegenTest, KeyTile176OnlyOnThePingpong) {
  v1::AttentionSpec s = BaseSpec();
  s.mutable_tuning()->set_block_n(176);
  const bool nvrtc = SharedNvrtc().Load().ok();
  // Head dim 128: the forward launches the ping-pong's 384 threads with its
  // shared memory (Q, two stages of 176-key K and V, the list, row data,
  // barriers and alignment), and compiles.
  absl::StatusOr<GeneratedSource> g = Gen(s, "sm_90a");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->tiles.block_n, 176);
  EXPECT_THAT(g->source, HasSubstr("#define KC_BLOCK_N 176\n"));
  ASSERT_FALSE(g->entry_points.empty());
  EXPECT_EQ(g->entry_points[0].name(), "kcache_attn_fwd");
  EXPECT_EQ(g->entry_points[0].threads(), 384u);
  EXPECT_EQ(g->entry_points[0].dynamic_smem_bytes(),
            static_cast<uint32_t>(AttentionSmemBytes(128, 176, 2, 128, 128, 2)));
  if (nvrtc) {
    const absl::Status built = CompileGenerated(*g, "sm_90a");
    EXPECT_TRUE(built.ok()) << built;
  }
  for (const char* arch : {"sm_90", "sm_80"}) {
    absl::StatusOr<GeneratedSource> bad = Gen(s, arch);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << arch;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("block_n=176")) << arch;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(absl::StrCat(" on ", arch, " ")))
        << arch;
  }
  s.mutable_tuning()->set_block_m(64);  // not the ping-pong's shape
  absl::StatusOr<GeneratedSource> bad = Gen(s, "sm_90a");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(" on sm_90a "));
  // Head dim 64 ping-pongs only on three warpgroups, which take 128 keys
  // (two measured 8 % slower than the plain wgmma path, session 23).
  s.mutable_tuning()->set_block_m(128);
  s.set_head_dim_qk(64);
  EXPECT_EQ(Gen(s, "sm_90a").status().code(), absl::StatusCode::kInvalidArgument);
  s.set_head_dim_v(128);
  EXPECT_EQ(Gen(s, "sm_90a").status().code(), absl::StatusCode::kInvalidArgument);
}

// FlashAttention-3's head dim 64 shape: three compute warpgroups over 192
// rows (12 warps) with 128-key tiles, beside the producer: 512 threads. Only
// on sm_90a's ping-pong, only head dims 64 / 64, only 128 keys (S of 176
// keys spills at the 160 registers each of three warpgroups gets).
TEST(CodegenTest, ThreeWarpgroupsOnlyForHeadDim64) {
  v1::AttentionSpec s = BaseSpec();
  s.set_head_dim_qk(64);
  s.mutable_tuning()->set_block_m(192);
  s.mutable_tuning()->set_block_n(128);
  s.mutable_tuning()->set_num_warps(12);
  absl::StatusOr<GeneratedSource> g = Gen(s, "sm_90a");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->source, HasSubstr("#define KC_NUM_WARPS 12\n"));
  ASSERT_FALSE(g->entry_points.empty());
  EXPECT_EQ(g->entry_points[0].threads(), 512u);
  EXPECT_EQ(g->entry_points[0].dynamic_smem_bytes(),
            static_cast<uint32_t>(AttentionSmemBytes(192, 128, 2, 64, 64, 2)));
  if (SharedNvrtc().Load().ok()) {
    const absl::Status built = CompileGenerated(*g, "sm_90a");
    EXPECT_TRUE(built.ok()) << built;
  }
  EXPECT_EQ(Gen(s, "sm_90").status().code(), absl::StatusCode::kInvalidArgument);
  s.mutable_tuning()->set_block_n(176);
  EXPECT_EQ(Gen(s, "sm_90a").status().code(), absl::StatusCode::kInvalidArgument);
  s.mutable_tuning()->set_block_n(128);
  s.set_head_dim_qk(128);
  EXPECT_EQ(Gen(s, "sm_90a").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AttentionCompileTest, EveryVariantCompilesWithNvrtc) {
  if (absl::Status s = SharedNvrtc().Load(); !s.ok()) GTEST_SKIP() << "NVRTC unavailable: " << s;
  const bool full = FullMatrix();
  const std::vector<Variant> variants = Variants(full);
  const std::vector<std::string> archs =
      full ? std::vector<std::string>{"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}
           : std::vector<std::string>{"sm_80", "sm_90a"};
  std::vector<Job> jobs;
  int skipped = 0;
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    // Representative: each variant on one of the two architectures,
    // alternating; every architecture in the full matrix.
    for (size_t a = 0; a < archs.size(); ++a) {
      if (!full && a != i % archs.size()) continue;
      const std::string& arch = archs[a];
      absl::StatusOr<GeneratedSource> g = Gen(v.spec, arch.c_str());
      if (g.status().code() == absl::StatusCode::kInvalidArgument &&
          absl::StrContains(g.status().message(), "have no attention tiles")) {
        ++skipped;  // e.g. d256 where the tiles do not fit
        continue;
      }
      ASSERT_TRUE(g.ok()) << v.name << " " << arch << ": " << g.status();
      jobs.push_back({v.name + " " + arch, *std::move(g), arch, absl::OkStatus()});
    }
  }
  CompileAll(jobs, skipped, full ? "variants (full matrix)" : "variants");
}

// Backward specs (forward + backward entry points in one cubin). A
// covering set per architecture: every mask kind and every score
// modification, each at least once with both dtypes, both head dims and
// both deterministic settings; score expressions read a trainable buffer
// (not in deterministic mode, which refuses them). The full product with
// KCACHE_ATTENTION_FULL_MATRIX=1.
std::vector<Variant> BackwardVariants(bool full) {
  std::vector<Variant> out;
  const auto masks = AllMasks();
  const auto scores = AllScoreMods();
  // Covering: the four score modifications of one mask kind get the
  // (fp16, d64, det) combinations of even parity (odd for every other mask),
  // so that within every mask and within every score modification each
  // factor takes both values.
  constexpr int kEven[4] = {0b000, 0b011, 0b101, 0b110};
  for (size_t m = 0; m < masks.size(); ++m) {
    const auto& [mname, mask] = masks[m];
    for (size_t sc = 0; sc < scores.size(); ++sc) {
      const auto& [sname, score] = scores[sc];
      for (int combo = 0; combo < 8; ++combo) {
        if (!full && combo != (kEven[sc] ^ (m % 2 == 1 ? 0b111 : 0))) continue;
        const bool fp16 = (combo & 1) != 0;
        const bool d64 = (combo & 2) != 0;
        const bool det = (combo & 4) != 0;
        v1::AttentionSpec s = BaseSpec();
        s.set_dtype(fp16 ? v1::DTYPE_FP16 : v1::DTYPE_BF16);
        s.set_head_dim_qk(d64 ? 64 : 128);
        *s.mutable_mask() = mask;
        *s.mutable_score_mod() = score;
        s.set_backward(true);
        s.set_deterministic(det);
        WithExpressions(&s);
        if (!det) {
          for (v1::BufferDecl& b : *s.mutable_buffers()) b.set_trainable(b.name() == "bias");
        }
        out.push_back({absl::StrCat(fp16 ? "fp16" : "bf16", d64 ? "_d64_" : "_d128_", mname, "_",
                                    sname, det ? "_det" : ""),
                       s});
      }
    }
  }
  // Unequal head dims, both ways.
  for (auto [dqk, dv] : {std::pair{128u, 64u}, std::pair{64u, 128u}}) {
    v1::AttentionSpec s = BaseSpec();
    s.set_head_dim_qk(dqk);
    s.set_head_dim_v(dv);
    s.mutable_mask()->mutable_causal();
    s.mutable_score_mod()->mutable_none();
    s.set_backward(true);
    out.push_back({absl::StrCat("bf16_d", dqk, "_", dv, "_causal"), s});
  }
  return out;
}

TEST(AttentionCompileTest, EveryBackwardVariantCompilesWithNvrtc) {
  if (absl::Status s = SharedNvrtc().Load(); !s.ok()) GTEST_SKIP() << "NVRTC unavailable: " << s;
  const bool full = FullMatrix();
  const std::vector<Variant> variants = BackwardVariants(full);
  const std::vector<std::string> archs =
      full ? std::vector<std::string>{"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}
           : std::vector<std::string>{"sm_80", "sm_90a"};
  // Which factor values each architecture saw (the covering claim).
  std::map<std::string, std::set<std::string>> seen;
  std::vector<Job> jobs;
  int skipped = 0;
  for (const Variant& v : variants) {
    for (const std::string& arch : archs) {
      absl::StatusOr<GeneratedSource> g = Gen(v.spec, arch.c_str());
      if (g.status().code() == absl::StatusCode::kInvalidArgument &&
          absl::StrContains(g.status().message(), "the backward has no tiles")) {
        ++skipped;  // d128 on sm_86 / sm_89
        continue;
      }
      ASSERT_TRUE(g.ok()) << v.name << " " << arch << ": " << g.status();
      const v1::AttentionSpec& s = v.spec;
      for (const std::string& f :
           {absl::StrCat("dtype ", s.dtype()), absl::StrCat("dim ", s.head_dim_qk()),
            absl::StrCat("det ", s.deterministic())}) {
        seen[arch].insert(absl::StrCat("mask ", s.mask().kind_case(), " ", f));
        seen[arch].insert(absl::StrCat("score ", s.score_mod().kind_case(), " ", f));
      }
      jobs.push_back({v.name + " " + arch, *std::move(g), arch, absl::OkStatus()});
    }
  }
  for (const std::string& arch : {std::string("sm_80"), std::string("sm_90a")}) {
    // Every mask kind (6) and every score modification (4) with both values
    // of dtype, head dim and deterministic.
    EXPECT_EQ(seen[arch].size(), (6u + 4u) * 3u * 2u) << arch;
  }
  CompileAll(jobs, skipped, full ? "backward variants (full matrix)" : "backward variants");
}

}  // namespace
}  // namespace kcache::attention
