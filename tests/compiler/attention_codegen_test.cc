// Code generation for attention specs: the prelude and entry points, the
// lowering of expressions, and real NVRTC compiles of the generated
// translation units for a representative set of variants (the full
// cross-product with KCACHE_ATTENTION_FULL_MATRIX=1). NVRTC tests skip
// themselves when NVRTC cannot be loaded; no GPU is needed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
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
#include "compiler/nvrtc.h"
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
  const AttentionTiles t = SelectAttentionTiles(90, 128, 128, KC_MASK_CAUSAL, false, /*sm90a=*/true);
  EXPECT_EQ(fwd.threads(), static_cast<uint32_t>(t.num_warps * 32));
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
  s.set_backward(true);
  EXPECT_EQ(Gen(s, "sm_90").status().code(), absl::StatusCode::kUnimplemented);
  v1::AttentionSpec bad = BaseSpec();
  bad.set_num_kv_heads(5);
  EXPECT_EQ(GenerateAttentionSource(bad, "sm_90").status().code(),
            absl::StatusCode::kInvalidArgument);
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
  CompileInput in;
  in.source = g.source;
  in.program_name = g.program_name;
  in.headers = TemplateHeaders();
  in.arch = arch;
  absl::StatusOr<CompileOutput> out = SharedNvrtc().Compile(in);
  if (!out.ok()) return out.status();
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

TEST(AttentionCompileTest, EveryVariantCompilesWithNvrtc) {
  if (absl::Status s = SharedNvrtc().Load(); !s.ok()) GTEST_SKIP() << "NVRTC unavailable: " << s;
  const char* env = std::getenv("KCACHE_ATTENTION_FULL_MATRIX");
  const bool full = env != nullptr && std::string(env) == "1";
  const std::vector<Variant> variants = Variants(full);
  const std::vector<std::string> archs =
      full ? std::vector<std::string>{"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}
           : std::vector<std::string>{"sm_80", "sm_90a"};
  struct Job {
    std::string label;
    GeneratedSource source;
    std::string arch;
    absl::Status result;
  };
  std::vector<Job> jobs;
  int skipped = 0;
  const auto start = std::chrono::steady_clock::now();
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
  // NVRTC is thread-safe for distinct programs: compile on a few threads.
  const char* threads_env = std::getenv("KCACHE_ATTENTION_COMPILE_THREADS");
  const int nthreads = threads_env != nullptr ? std::max(1, std::atoi(threads_env)) : 2;
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
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
  const int compiled = static_cast<int>(jobs.size());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("compiled %d variants (%d without tiles) in %.1f s on %d threads%s\n", compiled,
              skipped, secs, nthreads, full ? " (full matrix)" : "");
}

}  // namespace
}  // namespace kcache::attention
