// Property tests for attention expression trees: random valid trees from
// fixed seeds validate, normalize, lower and compile with NVRTC (in one
// batched translation unit, plus a few through the full templates); random
// invalid mutations and corrupted wire bytes are rejected or handled, never
// crash. Score trees are also lowered with the backward (kc_expr_score_grad,
// trainable float buffers) and compiled in the same unit.
// KCACHE_ATTENTION_FUZZ_SEEDS=N runs N specs instead of 48.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/attention/codegen.h"
#include "compiler/attention/expr.h"
#include "compiler/attention/expr_lower.h"
#include "compiler/attention/spec_canonical.h"
#include "compiler/attention/spec_normalize.h"
#include "compiler/attention/spec_validate.h"
#include "compiler/cuda/nvrtc.h"
#include "gtest/gtest.h"
#include "kernels/embedded.h"
#include "tests/compiler/attention_test_util.h"

namespace kcache::attention {
namespace {

using namespace ::kcache::attention::testing;  // NOLINT: test helpers
using B = v1::BinaryExpr;
using U = v1::UnaryExpr;

class TreeGen {
 public:
  TreeGen(uint32_t seed, const std::vector<v1::BufferDecl>* buffers, bool allow_score)
      : rng_(seed), buffers_(buffers), allow_score_(allow_score) {}

  v1::Expr Gen(ExprType t, int depth) {
    --budget_;
    if (depth <= 1 || budget_ < 12 || Pick(4) == 0) return Leaf(t, depth);
    switch (t) {
      case ExprType::kInt:
        switch (Pick(5)) {
          case 0:
            return Un(Pick(2) ? U::OP_NEG : U::OP_ABS, Gen(t, depth - 1));
          case 1: {
            static const B::Op ops[] = {B::OP_ADD, B::OP_SUB, B::OP_MUL,
                                        B::OP_MOD, B::OP_MIN, B::OP_MAX};
            return Bin(ops[Pick(6)], Gen(t, depth - 1), Gen(t, depth - 1));
          }
          case 2:
            return Sel(Gen(ExprType::kBool, depth - 1), Gen(t, depth - 1), Gen(t, depth - 1));
          default:
            return Leaf(t, depth);
        }
      case ExprType::kFloat:
        switch (Pick(5)) {
          case 0: {
            static const U::Op ops[] = {U::OP_NEG, U::OP_ABS, U::OP_EXP, U::OP_TANH};
            return Un(ops[Pick(4)], Gen(t, depth - 1));
          }
          case 1:
            return Un(U::OP_TO_FLOAT, Gen(ExprType::kInt, depth - 1));
          case 2: {
            static const B::Op ops[] = {B::OP_ADD, B::OP_SUB, B::OP_MUL,
                                        B::OP_DIV, B::OP_MIN, B::OP_MAX};
            return Bin(ops[Pick(6)], Gen(t, depth - 1), Gen(t, depth - 1));
          }
          case 3:
            return Sel(Gen(ExprType::kBool, depth - 1), Gen(t, depth - 1), Gen(t, depth - 1));
          default:
            return Leaf(t, depth);
        }
      case ExprType::kBool:
        switch (Pick(5)) {
          case 0:
            return Un(U::OP_NOT, Gen(t, depth - 1));
          case 1: {
            static const B::Op ops[] = {B::OP_EQ, B::OP_NE, B::OP_LT, B::OP_LE, B::OP_GT, B::OP_GE};
            const ExprType ct = Pick(2) ? ExprType::kInt : ExprType::kFloat;
            return Bin(ops[Pick(6)], Gen(ct, depth - 1), Gen(ct, depth - 1));
          }
          case 2:
            return Bin(Pick(2) ? B::OP_AND : B::OP_OR, Gen(t, depth - 1), Gen(t, depth - 1));
          case 3:
            return Sel(Gen(t, depth - 1), Gen(t, depth - 1), Gen(t, depth - 1));
          default:
            return Leaf(t, depth);
        }
    }
    return Bool(true);
  }

  uint32_t Pick(uint32_t n) { return static_cast<uint32_t>(rng_() % n); }

 private:
  v1::Expr Leaf(ExprType t, int depth) {
    // A buffer read of the right type, when one is declared and depth allows.
    std::vector<const v1::BufferDecl*> fit;
    for (const v1::BufferDecl& b : *buffers_) {
      ExprType bt;
      if (ElemTypeToExprType(b.type(), &bt) && bt == t) fit.push_back(&b);
    }
    if (!fit.empty() && depth > 1 && Pick(3) == 0) {
      const v1::BufferDecl* b = fit[Pick(static_cast<uint32_t>(fit.size()))];
      std::vector<v1::Expr> idx;
      for (uint32_t i = 0; i < b->rank(); ++i) idx.push_back(Leaf(ExprType::kInt, 1));
      return Read(b->name(), idx);
    }
    switch (t) {
      case ExprType::kInt: {
        if (Pick(2)) return Idx(static_cast<v1::IndexVar>(1 + Pick(4)));
        static const int consts[] = {0,
                                     1,
                                     -1,
                                     7,
                                     16,
                                     1 << 20,
                                     std::numeric_limits<int>::min(),
                                     std::numeric_limits<int>::max()};
        return Int(Pick(3) ? consts[Pick(8)] : static_cast<int>(rng_()));
      }
      case ExprType::kFloat: {
        if (allow_score_ && Pick(2)) return Score();
        static const float consts[] = {0.0f, -0.0f, 1.0f, -2.5f, 1e-40f, 3.4e38f, 0.1f, 30.0f};
        if (Pick(2)) return Flt(consts[Pick(8)]);
        uint32_t bits = static_cast<uint32_t>(rng_());
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        return Flt(std::isfinite(f) ? f : 0.5f);
      }
      case ExprType::kBool:
        return Bool(Pick(2) == 0);
    }
    return Bool(false);
  }

  std::mt19937 rng_;
  const std::vector<v1::BufferDecl>* buffers_;
  bool allow_score_;
  int budget_ = 200;
};

// A random valid spec with an expression mask and/or score modification.
v1::AttentionSpec RandomSpec(uint32_t seed) {
  std::mt19937 rng(seed * 2654435761u + 1);
  v1::AttentionSpec s = BaseSpec();
  std::vector<v1::BufferDecl> decls;
  const int nbuf = static_cast<int>(rng() % 5);
  static const v1::ElemType types[] = {v1::ELEM_TYPE_INT32, v1::ELEM_TYPE_FLOAT32,
                                       v1::ELEM_TYPE_BOOL};
  for (int i = 0; i < nbuf; ++i) {
    std::string name = absl::StrCat(std::string(1, static_cast<char>('a' + rng() % 26)), "_", i);
    decls.push_back(Buffer(name, types[rng() % 3], 1 + static_cast<int>(rng() % 4)));
  }
  const uint32_t which = rng() % 3;  // 0 mask, 1 score, 2 both
  if (which != 1) {
    TreeGen g(seed, &decls, /*allow_score=*/false);
    *s.mutable_mask()->mutable_expr()->mutable_predicate() =
        g.Gen(ExprType::kBool, 2 + static_cast<int>(rng() % 7));
  }
  if (which != 0) {
    TreeGen g(seed + 7919, &decls, /*allow_score=*/true);
    *s.mutable_score_mod()->mutable_expr()->mutable_value() =
        g.Gen(ExprType::kFloat, 2 + static_cast<int>(rng() % 7));
  }
  // Keep only the buffers the trees read (validation rejects unused ones);
  // declare them in a random order.
  const std::string text = s.DebugString();
  for (const v1::BufferDecl& d : decls) {
    if (absl::StrContains(text, absl::StrCat("buffer: \"", d.name(), "\""))) {
      *s.add_buffers() = d;
    }
  }
  if (s.buffers_size() > 1) s.mutable_buffers()->SwapElements(0, s.buffers_size() - 1);
  return s;
}

int NumSeeds() {
  const char* env = std::getenv("KCACHE_ATTENTION_FUZZ_SEEDS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 48;
}

TEST(AttentionFuzzTest, RandomValidTreesValidateLowerAndCompile) {
  const int n = NumSeeds();
  std::string tu = "#include \"attention_params.h\"\n";
  std::string probe =
      "extern \"C\" __global__ void kc_probe(const __grid_constant__ kcache::AttentionParams p, "
      "float* out) {\n"
      "  const int b = blockIdx.z, h = blockIdx.y, q_idx = threadIdx.x, kv_idx = blockIdx.x;\n"
      "  float acc = 0.f;\n";
  for (int seed = 0; seed < n; ++seed) {
    const v1::AttentionSpec spec = RandomSpec(static_cast<uint32_t>(seed));
    const absl::Status valid = ValidateAttentionSpec(spec);
    ASSERT_TRUE(valid.ok()) << "seed " << seed << ": " << valid << "\n" << spec.DebugString();
    const v1::AttentionSpec norm = NormalizeAttentionSpec(spec);
    ASSERT_TRUE(ValidateAttentionSpec(norm).ok()) << "seed " << seed;
    EXPECT_EQ(CanonicalSpecBytes(norm), CanonicalSpecBytes(NormalizeAttentionSpec(norm)));
    absl::StatusOr<std::string> code = LowerSpecExpressions(norm);
    ASSERT_TRUE(code.ok()) << "seed " << seed << ": " << code.status();
    absl::StrAppend(&tu, "namespace kc_case_", seed, " {\n", *code, "}\n");
    if (norm.mask().has_expr()) {
      absl::StrAppend(&probe, "  acc += kc_case_", seed,
                      "::kc_expr_mask(b, h, q_idx, kv_idx, p) ? 1.f : 0.f;\n");
    }
    if (norm.score_mod().has_expr()) {
      absl::StrAppend(&probe, "  acc += kc_case_", seed,
                      "::kc_expr_score(0.5f, b, h, q_idx, kv_idx, p);\n");
      // The same tree with the backward: kc_expr_score_grad, and the
      // gradient helpers of every float buffer the score reads (trainable).
      v1::AttentionSpec bwd = spec;
      bwd.set_backward(true);
      const std::string score_text = spec.score_mod().DebugString();
      for (v1::BufferDecl& d : *bwd.mutable_buffers()) {
        d.set_trainable(d.type() == v1::ELEM_TYPE_FLOAT32 &&
                        absl::StrContains(score_text, absl::StrCat("buffer: \"", d.name(), "\"")));
      }
      const absl::Status bwd_valid = ValidateAttentionSpec(bwd);
      ASSERT_TRUE(bwd_valid.ok()) << "seed " << seed << ": " << bwd_valid;
      absl::StatusOr<std::string> grad = LowerSpecExpressions(NormalizeAttentionSpec(bwd));
      ASSERT_TRUE(grad.ok()) << "seed " << seed << ": " << grad.status();
      EXPECT_TRUE(absl::StrContains(*grad, "kc_expr_score_grad(")) << "seed " << seed;
      absl::StrAppend(&tu, "namespace kc_case_bwd_", seed, " {\n", *grad, "}\n");
      absl::StrAppend(&probe, "  acc += kc_case_bwd_", seed,
                      "::kc_expr_score_grad(0.5f, acc, b, h, q_idx, kv_idx, p, kv_idx > 3);\n");
    }
  }
  probe += "  out[threadIdx.x] = acc;\n}\n";
  tu += probe;

  Nvrtc nvrtc;
  if (absl::Status s = nvrtc.Load(); !s.ok()) GTEST_SKIP() << "NVRTC unavailable: " << s;
  std::map<std::string, std::string> headers;
  for (const kernels::TemplateFile& f : kernels::TemplateFiles()) {
    headers.emplace(std::string(f.name), std::string(f.contents));
  }
  for (const char* arch : {"sm_80", "sm_90a"}) {
    CompileInput in;
    in.source = tu;
    in.program_name = "kcache_attention_fuzz.cu";
    in.headers = headers;
    in.arch = arch;
    absl::StatusOr<CompileOutput> out = nvrtc.Compile(in);
    ASSERT_TRUE(out.ok()) << arch << ": " << out.status() << "\n--- source ---\n" << tu;
  }
  // A few through the full templates.
  for (int seed = 0; seed < 3; ++seed) {
    const v1::AttentionSpec norm = NormalizeAttentionSpec(RandomSpec(static_cast<uint32_t>(seed)));
    absl::StatusOr<GeneratedSource> g = GenerateAttentionSource(norm, "sm_90a");
    ASSERT_TRUE(g.ok()) << g.status();
    CompileInput in;
    in.source = g->source;
    in.program_name = g->program_name;
    in.headers = headers;
    in.arch = "sm_90a";
    absl::StatusOr<CompileOutput> out = nvrtc.Compile(in);
    EXPECT_TRUE(out.ok()) << "seed " << seed << ": " << out.status();
  }
}

void CollectNodes(v1::Expr* e, std::vector<v1::Expr*>* out) {
  out->push_back(e);
  switch (e->node_case()) {
    case v1::Expr::kUnary:
      CollectNodes(e->mutable_unary()->mutable_arg(), out);
      break;
    case v1::Expr::kBinary:
      CollectNodes(e->mutable_binary()->mutable_lhs(), out);
      CollectNodes(e->mutable_binary()->mutable_rhs(), out);
      break;
    case v1::Expr::kSelect:
      CollectNodes(e->mutable_select()->mutable_cond(), out);
      CollectNodes(e->mutable_select()->mutable_if_true(), out);
      CollectNodes(e->mutable_select()->mutable_if_false(), out);
      break;
    case v1::Expr::kRead:
      for (v1::Expr& i : *e->mutable_read()->mutable_index()) CollectNodes(&i, out);
      break;
    default:
      break;
  }
}

// Everything downstream of validation must cope with whatever validation
// lets through, and never crash on what it rejects.
void ExerciseEverything(const v1::AttentionSpec& spec, int* rejected) {
  const absl::Status s = ValidateAttentionSpec(spec);
  const v1::AttentionSpec norm = NormalizeAttentionSpec(spec);  // total, even when invalid
  (void)CanonicalSpecBytes(norm);
  // Generation re-validates what it is given: an invalid spec never
  // becomes source.
  absl::StatusOr<GeneratedSource> raw = GenerateAttentionSource(spec, "sm_80");
  if (!s.ok()) {
    ++*rejected;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(s.message(), "spec")) << s;
    EXPECT_EQ(raw.status().code(), absl::StatusCode::kInvalidArgument);
  } else {
    EXPECT_TRUE(raw.ok()) << raw.status();
    EXPECT_TRUE(GenerateAttentionSource(norm, "sm_80").ok());
  }
}

TEST(AttentionFuzzTest, InvalidMutationsAreRejectedNeverCrash) {
  std::mt19937 rng(12345);
  int rejected = 0, always_invalid = 0;
  const int n = NumSeeds() * 8;
  for (int i = 0; i < n; ++i) {
    v1::AttentionSpec spec = RandomSpec(static_cast<uint32_t>(i % NumSeeds()));
    std::vector<v1::Expr*> nodes;
    if (spec.mask().has_expr()) {
      CollectNodes(spec.mutable_mask()->mutable_expr()->mutable_predicate(), &nodes);
    }
    if (spec.score_mod().has_expr()) {
      CollectNodes(spec.mutable_score_mod()->mutable_expr()->mutable_value(), &nodes);
    }
    v1::Expr* e = nodes[rng() % nodes.size()];
    bool must_fail = true;
    switch (rng() % 9) {
      case 0:
        e->Clear();  // empty node
        break;
      case 1:
        e->mutable_unary()->set_op(static_cast<U::Op>(7 + rng() % 100));
        e->mutable_unary()->mutable_arg()->set_bool_const(true);
        break;
      case 2:
        e->mutable_binary()->set_op(static_cast<B::Op>(16 + rng() % 100));
        e->mutable_binary()->mutable_lhs()->set_int_const(1);
        e->mutable_binary()->mutable_rhs()->set_int_const(1);
        break;
      case 3:
        e->set_float_const(rng() % 2 ? std::numeric_limits<float>::infinity()
                                     : std::numeric_limits<float>::quiet_NaN());
        break;
      case 4:
        e->mutable_read()->set_buffer("not_declared");
        e->mutable_read()->add_index()->set_int_const(0);
        break;
      case 5:
        e->set_index(static_cast<v1::IndexVar>(5 + rng() % 50));
        break;
      case 6:  // a type change: may or may not still type-check
        must_fail = false;
        if (rng() % 3 == 0) {
          e->set_int_const(3);
        } else if (rng() % 2) {
          e->set_float_const(3.0f);
        } else {
          e->set_bool_const(true);
        }
        break;
      case 7: {  // a deep chain
        v1::Expr chain = Bool(true);
        for (int d = 0; d < 40; ++d) chain = Un(U::OP_NOT, chain);
        *e = chain;
        break;
      }
      case 8: {  // a score node in the mask, or a wrong-rank read
        must_fail = false;
        if (spec.mask().has_expr()) {
          spec.mutable_mask()->mutable_expr()->mutable_predicate()->mutable_binary()->set_op(
              B::OP_GT);
          *spec.mutable_mask()
               ->mutable_expr()
               ->mutable_predicate()
               ->mutable_binary()
               ->mutable_lhs() = Score();
          *spec.mutable_mask()
               ->mutable_expr()
               ->mutable_predicate()
               ->mutable_binary()
               ->mutable_rhs() = Flt(0);
          must_fail = true;
        }
        break;
      }
    }
    int before = rejected;
    ExerciseEverything(spec, &rejected);
    if (must_fail) {
      ++always_invalid;
      EXPECT_EQ(rejected, before + 1) << "mutation accepted:\n" << spec.DebugString();
    }
  }
  EXPECT_GT(always_invalid, n / 2);

  // Corrupted wire bytes: whatever parses must be handled.
  for (int i = 0; i < n; ++i) {
    std::string wire = RandomSpec(static_cast<uint32_t>(i % NumSeeds())).SerializeAsString();
    for (int k = 0; k < 3; ++k) wire[rng() % wire.size()] = static_cast<char>(rng());
    v1::AttentionSpec spec;
    if (!spec.ParseFromString(wire)) continue;
    int ignored = 0;
    ExerciseEverything(spec, &ignored);
  }
}

}  // namespace
}  // namespace kcache::attention
