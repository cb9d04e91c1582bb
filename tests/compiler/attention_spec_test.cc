// Validation, normalization and canonical bytes of attention specs.
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "compiler/attention/spec_canonical.h"
#include "compiler/attention/spec_normalize.h"
#include "compiler/attention/spec_validate.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/compiler/attention_test_util.h"

namespace kcache::attention {
namespace {

using ::testing::HasSubstr;
using namespace ::kcache::attention::testing;  // NOLINT: test helpers
using B = v1::BinaryExpr;
using U = v1::UnaryExpr;

// ---------------------------------------------------------------------------
// Validation: one row per rule.
// ---------------------------------------------------------------------------

struct InvalidCase {
  std::string name;
  std::function<void(v1::AttentionSpec*)> mutate;
  std::string message;  // expected substring (field path and reason)
};

void SetMaskExpr(v1::AttentionSpec* s, v1::Expr e) {
  *s->mutable_mask()->mutable_expr()->mutable_predicate() = std::move(e);
}
void SetScoreExpr(v1::AttentionSpec* s, v1::Expr e) {
  *s->mutable_score_mod()->mutable_expr()->mutable_value() = std::move(e);
}
v1::Expr Causal() { return Bin(B::OP_GE, Idx(v1::INDEX_VAR_Q_IDX), Idx(v1::INDEX_VAR_KV_IDX)); }
v1::Expr Deep(int depth) {  // a chain of NOTs over `true`, `depth` nodes deep
  v1::Expr e = Bool(true);
  for (int i = 1; i < depth; ++i) e = Un(U::OP_NOT, e);
  return e;
}

std::vector<InvalidCase> InvalidCases() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {
      {"dtype_unset", [](auto* s) { s->set_dtype(v1::DTYPE_UNSPECIFIED); }, "spec.dtype: must be"},
      {"dtype_unknown", [](auto* s) { s->set_dtype(static_cast<v1::DType>(7)); }, "spec.dtype"},
      {"head_dim_qk_0", [](auto* s) { s->set_head_dim_qk(0); }, "spec.head_dim_qk: 0 is not 64"},
      {"head_dim_qk_96", [](auto* s) { s->set_head_dim_qk(96); }, "spec.head_dim_qk: 96"},
      {"head_dim_v_32", [](auto* s) { s->set_head_dim_v(32); }, "spec.head_dim_v: 32"},
      {"q_heads_0", [](auto* s) { s->set_num_q_heads(0); },
       "spec.num_q_heads: 0 is not in [1, 1024]"},
      {"q_heads_big",
       [](auto* s) {
         s->set_num_q_heads(4096);
         s->set_num_kv_heads(0);
       },
       "spec.num_q_heads: 4096"},
      {"kv_not_divide", [](auto* s) { s->set_num_kv_heads(5); },
       "spec.num_kv_heads: 5 does not divide num_q_heads 32"},
      {"kv_exceeds", [](auto* s) { s->set_num_kv_heads(64); }, "spec.num_kv_heads: 64 exceeds"},
      {"scale_negative", [](auto* s) { s->set_softmax_scale(-1.0f); }, "spec.softmax_scale"},
      {"scale_inf", [inf](auto* s) { s->set_softmax_scale(inf); }, "spec.softmax_scale"},
      {"scale_nan", [nan](auto* s) { s->set_softmax_scale(nan); }, "spec.softmax_scale"},
      {"causal_alignment_unknown",
       [](auto* s) {
         s->mutable_mask()->mutable_causal()->set_alignment(static_cast<v1::CausalAlignment>(9));
       },
       "spec.mask.causal.alignment: unknown alignment value 9"},
      {"window_left_below",
       [](auto* s) { s->mutable_mask()->mutable_sliding_window()->set_left(-2); },
       "spec.mask.sliding_window.left: -2 is not in [-1,"},
      {"window_right_huge",
       [](auto* s) { s->mutable_mask()->mutable_sliding_window()->set_right(2000000000); },
       "spec.mask.sliding_window.right"},
      {"window_both_unbounded",
       [](auto* s) {
         s->mutable_mask()->mutable_sliding_window()->set_left(-1);
         s->mutable_mask()->mutable_sliding_window()->set_right(-1);
       },
       "spec.mask.sliding_window: both extents unbounded"},
      {"window_alignment_unknown",
       [](auto* s) {
         s->mutable_mask()->mutable_sliding_window()->set_alignment(
             static_cast<v1::CausalAlignment>(3));
       },
       "spec.mask.sliding_window.alignment"},
      {"drafter_block_0", [](auto* s) { s->mutable_mask()->mutable_drafter(); },
       "spec.mask.drafter.block_size: 0 is not a power of two"},
      {"drafter_block_24",
       [](auto* s) { s->mutable_mask()->mutable_drafter()->set_block_size(24); },
       "spec.mask.drafter.block_size: 24"},
      {"drafter_block_512",
       [](auto* s) { s->mutable_mask()->mutable_drafter()->set_block_size(512); },
       "spec.mask.drafter.block_size: 512"},
      {"drafter_window_negative",
       [](auto* s) {
         s->mutable_mask()->mutable_drafter()->set_block_size(16);
         s->mutable_mask()->mutable_drafter()->set_context_window(-1);
       },
       "spec.mask.drafter.context_window: -1"},
      {"softcap_zero", [](auto* s) { s->mutable_score_mod()->mutable_softcap(); },
       "spec.score_mod.softcap.cap"},
      {"softcap_inf", [inf](auto* s) { s->mutable_score_mod()->mutable_softcap()->set_cap(inf); },
       "spec.score_mod.softcap.cap"},
      {"softcap_negative", [](auto* s) { s->mutable_score_mod()->mutable_softcap()->set_cap(-30); },
       "spec.score_mod.softcap.cap"},
      {"mask_expr_missing", [](auto* s) { s->mutable_mask()->mutable_expr(); },
       "spec.mask.expr.predicate: missing"},
      {"score_expr_missing", [](auto* s) { s->mutable_score_mod()->mutable_expr(); },
       "spec.score_mod.expr.value: missing"},
      {"expr_node_empty", [](auto* s) { SetMaskExpr(s, Bin(B::OP_AND, Causal(), v1::Expr())); },
       "spec.mask.expr.predicate.binary.rhs: empty expression node"},
      {"expr_operand_missing",
       [](auto* s) {
         v1::Expr e;
         e.mutable_binary()->set_op(B::OP_AND);
         *e.mutable_binary()->mutable_lhs() = Causal();
         SetMaskExpr(s, e);
       },
       "spec.mask.expr.predicate.binary.rhs: missing operand"},
      {"expr_type_mismatch",
       [](auto* s) { SetMaskExpr(s, Bin(B::OP_AND, Idx(v1::INDEX_VAR_Q_IDX), Bool(true))); },
       "spec.mask.expr.predicate.binary.lhs: type int, expected bool"},
      {"expr_root_type", [](auto* s) { SetMaskExpr(s, Idx(v1::INDEX_VAR_Q_IDX)); },
       "spec.mask.expr.predicate: type int, expected bool"},
      {"score_root_type", [](auto* s) { SetScoreExpr(s, Bool(true)); },
       "spec.score_mod.expr.value: type bool, expected float"},
      {"expr_mixed_operands", [](auto* s) { SetScoreExpr(s, Bin(B::OP_ADD, Score(), Int(1))); },
       "spec.score_mod.expr.value.binary.rhs: type int, expected float"},
      {"expr_int_div",
       [](auto* s) { SetMaskExpr(s, Bin(B::OP_EQ, Bin(B::OP_DIV, Int(4), Int(2)), Int(2))); },
       "binary.lhs.binary.lhs: type int, expected float (OP_DIV is float only)"},
      {"expr_float_mod", [](auto* s) { SetScoreExpr(s, Bin(B::OP_MOD, Score(), Flt(2))); },
       "OP_MOD is int only"},
      {"expr_float_floordiv",
       [](auto* s) { SetScoreExpr(s, Bin(B::OP_FLOORDIV, Score(), Flt(2))); },
       "OP_FLOORDIV is int only"},
      {"expr_compare_bool", [](auto* s) { SetMaskExpr(s, Bin(B::OP_EQ, Bool(true), Bool(false))); },
       "spec.mask.expr.predicate.binary.lhs: type bool, expected int or float"},
      {"expr_unary_unknown",
       [](auto* s) { SetMaskExpr(s, Un(static_cast<U::Op>(42), Bool(true))); },
       "spec.mask.expr.predicate.unary.op: unknown unary operator 42"},
      {"expr_binary_unspecified",
       [](auto* s) { SetMaskExpr(s, Bin(B::OP_UNSPECIFIED, Bool(true), Bool(true))); },
       "spec.mask.expr.predicate.binary.op: unknown binary operator 0"},
      {"expr_not_int", [](auto* s) { SetMaskExpr(s, Un(U::OP_NOT, Int(1))); },
       "spec.mask.expr.predicate.unary.arg: type int, expected bool"},
      {"expr_exp_int", [](auto* s) { SetScoreExpr(s, Un(U::OP_EXP, Int(1))); },
       "spec.score_mod.expr.value.unary.arg: type int, expected float"},
      {"expr_to_float_float", [](auto* s) { SetScoreExpr(s, Un(U::OP_TO_FLOAT, Score())); },
       "unary.arg: type float, expected int"},
      {"expr_neg_bool", [](auto* s) { SetMaskExpr(s, Un(U::OP_NEG, Bool(true))); },
       "unary.arg: type bool, expected int or float"},
      {"expr_select_cond", [](auto* s) { SetMaskExpr(s, Sel(Int(1), Bool(true), Bool(false))); },
       "spec.mask.expr.predicate.select.cond: type int, expected bool"},
      {"expr_select_branches", [](auto* s) { SetScoreExpr(s, Sel(Bool(true), Score(), Int(0))); },
       "spec.score_mod.expr.value.select.if_false: type int, expected float"},
      {"expr_index_unknown",
       [](auto* s) { SetMaskExpr(s, Bin(B::OP_GE, Idx(static_cast<v1::IndexVar>(17)), Int(0))); },
       "binary.lhs.index: unknown index variable 17"},
      {"expr_index_unspecified",
       [](auto* s) { SetMaskExpr(s, Bin(B::OP_GE, Idx(v1::INDEX_VAR_UNSPECIFIED), Int(0))); },
       "binary.lhs.index: unknown index variable 0"},
      {"expr_const_inf", [inf](auto* s) { SetScoreExpr(s, Bin(B::OP_ADD, Score(), Flt(inf))); },
       "spec.score_mod.expr.value.binary.rhs.float_const: constant is not finite"},
      {"expr_const_nan", [nan](auto* s) { SetScoreExpr(s, Bin(B::OP_ADD, Score(), Flt(nan))); },
       "float_const: constant is not finite"},
      {"score_in_mask", [](auto* s) { SetMaskExpr(s, Bin(B::OP_GT, Score(), Flt(0))); },
       "spec.mask.expr.predicate.binary.lhs.score: `score` is only available in score"},
      {"expr_too_deep", [](auto* s) { SetMaskExpr(s, Deep(33)); },
       "expression deeper than the limit of 32"},
      {"expr_too_many_nodes",
       [](auto* s) {
         v1::Expr e = Bool(true);  // balanced tree: depth 9, 511 nodes
         for (int i = 1; i < 9; ++i) e = Bin(B::OP_AND, e, e);
         SetMaskExpr(s, e);
       },
       "expression has more than the limit of 256 nodes"},
      {"read_undeclared", [](auto* s) { SetMaskExpr(s, Read("nope", {Idx(v1::INDEX_VAR_B)})); },
       "spec.mask.expr.predicate.read.buffer: buffer 'nope' is not declared"},
      {"read_undeclared_odd_name",
       [](auto* s) { SetMaskExpr(s, Read("\"; system(", {Idx(v1::INDEX_VAR_B)})); },
       "read.buffer: names no declared buffer"},
      {"read_wrong_rank",
       [](auto* s) {
         *s->add_buffers() = Buffer("keep", v1::ELEM_TYPE_BOOL, 2);
         SetMaskExpr(s, Read("keep", {Idx(v1::INDEX_VAR_B)}));
       },
       "spec.mask.expr.predicate.read.index: 1 indices for buffer 'keep' of rank 2"},
      {"read_float_index",
       [](auto* s) {
         *s->add_buffers() = Buffer("keep", v1::ELEM_TYPE_BOOL, 1);
         SetMaskExpr(s, Read("keep", {Flt(1)}));
       },
       "spec.mask.expr.predicate.read.index[0]: type float, expected int (buffer index)"},
      {"buffers_too_many",
       [](auto* s) {
         for (int i = 0; i < 9; ++i)
           *s->add_buffers() = Buffer("b" + std::to_string(i), v1::ELEM_TYPE_INT32, 1);
       },
       "spec.buffers: 9 buffers, the limit is 8"},
      {"buffer_name_bad",
       [](auto* s) { *s->add_buffers() = Buffer("Seq", v1::ELEM_TYPE_INT32, 1); },
       "spec.buffers[0].name: name must match"},
      {"buffer_name_digit_first",
       [](auto* s) { *s->add_buffers() = Buffer("1a", v1::ELEM_TYPE_INT32, 1); },
       "spec.buffers[0].name"},
      {"buffer_name_long",
       [](auto* s) { *s->add_buffers() = Buffer(std::string(33, 'a'), v1::ELEM_TYPE_INT32, 1); },
       "spec.buffers[0].name"},
      {"buffer_name_empty", [](auto* s) { *s->add_buffers() = Buffer("", v1::ELEM_TYPE_INT32, 1); },
       "spec.buffers[0].name"},
      {"buffer_duplicate",
       [](auto* s) {
         *s->add_buffers() = Buffer("a", v1::ELEM_TYPE_INT32, 1);
         *s->add_buffers() = Buffer("a", v1::ELEM_TYPE_FLOAT32, 1);
       },
       "spec.buffers[1].name: buffer 'a' is declared twice"},
      {"buffer_type_unset",
       [](auto* s) { *s->add_buffers() = Buffer("a", v1::ELEM_TYPE_UNSPECIFIED, 1); },
       "spec.buffers[0].type"},
      {"buffer_rank_0", [](auto* s) { *s->add_buffers() = Buffer("a", v1::ELEM_TYPE_INT32, 0); },
       "spec.buffers[0].rank: 0 is not in [1, 4]"},
      {"buffer_rank_5", [](auto* s) { *s->add_buffers() = Buffer("a", v1::ELEM_TYPE_INT32, 5); },
       "spec.buffers[0].rank: 5"},
      {"buffer_unused",
       [](auto* s) {
         *s->add_buffers() = Buffer("a", v1::ELEM_TYPE_INT32, 1);
         s->mutable_mask()->mutable_causal();
       },
       "spec.buffers[0]: buffer 'a' is not read"},
      {"trainable_int",
       [](auto* s) { *s->add_buffers() = Buffer("a", v1::ELEM_TYPE_INT32, 1, true); },
       "spec.buffers[0].trainable: only FLOAT32"},
      {"trainable_mask_only",
       [](auto* s) {
         *s->add_buffers() = Buffer("bias", v1::ELEM_TYPE_FLOAT32, 1, true);
         SetMaskExpr(s, Bin(B::OP_GT, Read("bias", {Idx(v1::INDEX_VAR_H)}), Flt(0)));
       },
       "spec.buffers[0].trainable: buffer 'bias' is not read by the score expression"},
      {"backward_d256",
       [](auto* s) {
         s->set_head_dim_qk(256);
         s->set_backward(true);
       },
       "spec.head_dim_qk: 256 has no backward (the backward supports head dims 64 and 128)"},
      {"backward_dv256",
       [](auto* s) {
         s->set_head_dim_v(256);
         s->set_backward(true);
       },
       "spec.head_dim_v: 256 has no backward"},
      {"trainable_deterministic",
       [](auto* s) {
         *s->add_buffers() = Buffer("bias", v1::ELEM_TYPE_FLOAT32, 1, true);
         SetScoreExpr(s, Bin(B::OP_ADD, Score(), Read("bias", {Idx(v1::INDEX_VAR_H)})));
         s->set_backward(true);
         s->set_deterministic(true);
       },
       "spec.deterministic: buffer 'bias' is trainable: deterministic backward has no atomics; "
       "trainable buffer gradients need them"},
      {"trainable_bool_with_backward",
       [](auto* s) {
         *s->add_buffers() = Buffer("keep", v1::ELEM_TYPE_BOOL, 1, true);
         SetMaskExpr(s, Read("keep", {Idx(v1::INDEX_VAR_H)}));
         s->set_backward(true);
       },
       "spec.buffers[0].trainable: only FLOAT32 buffers can be trainable"},
      {"tuning_block_m", [](auto* s) { s->mutable_tuning()->set_block_m(100); },
       "spec.tuning.block_m: 100"},
      {"tuning_block_n", [](auto* s) { s->mutable_tuning()->set_block_n(512); },
       "spec.tuning.block_n: 512"},
      {"tuning_block_n_step", [](auto* s) { s->mutable_tuning()->set_block_n(100); },
       "spec.tuning.block_n: 100 is not 0 (compiler chooses) or a multiple of 16"},
      {"tuning_warps", [](auto* s) { s->mutable_tuning()->set_num_warps(3); },
       "spec.tuning.num_warps: 3"},
      {"tuning_warps_16", [](auto* s) { s->mutable_tuning()->set_num_warps(16); },
       "spec.tuning.num_warps: 16 is not 0 (compiler chooses) or a multiple of 4 in [4, 12]"},
      {"tuning_stages", [](auto* s) { s->mutable_tuning()->set_stages(9); },
       "spec.tuning.stages: 9"},
      {"unknown_field",
       [](auto* s) { s->GetReflection()->MutableUnknownFields(s)->AddVarint(99, 1); },
       "spec: unknown field number 99"},
      {"unknown_field_nested",
       [](auto* s) {
         auto* c = s->mutable_mask()->mutable_causal();
         c->GetReflection()->MutableUnknownFields(c)->AddVarint(5, 1);
       },
       "spec.mask.causal: unknown field number 5"},
  };
}

class InvalidSpecTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidSpecTest, RejectedWithFieldAndReason) {
  v1::AttentionSpec spec = BaseSpec();
  GetParam().mutate(&spec);
  const absl::Status s = ValidateAttentionSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(Rules, InvalidSpecTest, ::testing::ValuesIn(InvalidCases()),
                         [](const auto& info) { return info.param.name; });

TEST(ValidateTest, NodeLimitNamesTheTree) {
  v1::AttentionSpec spec = BaseSpec();
  Limits limits;
  limits.max_expr_nodes = 8;
  v1::Expr e = Causal();             // 3 nodes
  e = Bin(B::OP_AND, e, Causal());   // 7
  e = Bin(B::OP_OR, e, Bool(true));  // 9
  SetMaskExpr(&spec, e);
  const absl::Status s = ValidateAttentionSpec(spec, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than the limit of 8 nodes"));
}

TEST(ValidateTest, VeryDeepTreeBuiltInMemoryIsRejectedNotOverflowed) {
  v1::AttentionSpec spec = BaseSpec();
  v1::Expr* e = spec.mutable_mask()->mutable_expr()->mutable_predicate();
  for (int i = 0; i < 100000; ++i) {  // built in place: Deep() would copy O(n^2)
    e->mutable_unary()->set_op(U::OP_NOT);
    e = e->mutable_unary()->mutable_arg();
  }
  e->set_bool_const(true);
  const absl::Status s = ValidateAttentionSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nested too deeply"));
}

TEST(ValidateTest, DepthLimitIsInclusive) {
  v1::AttentionSpec spec = BaseSpec();
  SetMaskExpr(&spec, Deep(32));
  EXPECT_TRUE(ValidateAttentionSpec(spec).ok());
  SetMaskExpr(&spec, Deep(33));
  EXPECT_EQ(ValidateAttentionSpec(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateTest, ValidSpecsPass) {
  std::vector<v1::AttentionSpec> ok;
  ok.push_back(BaseSpec());
  {
    v1::AttentionSpec s = BaseSpec();
    s.set_head_dim_qk(256);
    s.set_head_dim_v(64);
    s.set_softmax_scale(0.125f);
    s.set_num_kv_heads(0);
    s.mutable_mask()->mutable_sliding_window()->set_left(-1);
    s.mutable_mask()->mutable_sliding_window()->set_right(0);
    s.mutable_score_mod()->mutable_softcap()->set_cap(30);
    ok.push_back(s);
  }
  {
    v1::AttentionSpec s = BaseSpec();
    s.mutable_mask()->mutable_drafter()->set_block_size(16);
    s.mutable_mask()->mutable_drafter()->set_context_window(4096);
    s.set_backward(true);
    s.set_deterministic(true);
    ok.push_back(s);
  }
  {
    v1::AttentionSpec s = BaseSpec();
    *s.add_buffers() = Buffer("bias", v1::ELEM_TYPE_FLOAT32, 2, true);
    *s.add_buffers() = Buffer("doc", v1::ELEM_TYPE_INT32, 2);
    SetMaskExpr(&s, Bin(B::OP_EQ, Read("doc", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_Q_IDX)}),
                        Read("doc", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_KV_IDX)})));
    SetScoreExpr(&s,
                 Bin(B::OP_ADD, Score(),
                     Read("bias", {Idx(v1::INDEX_VAR_H), Bin(B::OP_SUB, Idx(v1::INDEX_VAR_KV_IDX),
                                                             Idx(v1::INDEX_VAR_Q_IDX))})));
    s.set_backward(true);
    ok.push_back(s);
  }
  {
    v1::AttentionSpec s = BaseSpec();
    s.mutable_score_mod()->mutable_alibi();
    s.mutable_mask()->mutable_document()->set_causal(true);
    s.mutable_tuning()->set_block_m(64);
    s.mutable_tuning()->set_num_warps(4);
    ok.push_back(s);
  }
  for (const v1::AttentionSpec& s : ok) {
    EXPECT_TRUE(ValidateAttentionSpec(s).ok()) << ValidateAttentionSpec(s) << "\n"
                                               << s.DebugString();
  }
}

// ---------------------------------------------------------------------------
// Normalization and canonical bytes.
// ---------------------------------------------------------------------------

std::string Key(const v1::AttentionSpec& s) {
  EXPECT_TRUE(ValidateAttentionSpec(s).ok()) << ValidateAttentionSpec(s);
  return CanonicalSpecBytes(NormalizeAttentionSpec(s));
}

TEST(NormalizeTest, FillsDefaults) {
  v1::AttentionSpec n = NormalizeAttentionSpec(BaseSpec());
  EXPECT_EQ(n.head_dim_v(), 128u);
  EXPECT_EQ(n.num_kv_heads(), 8u);
  EXPECT_EQ(n.softmax_scale(), static_cast<float>(1.0 / std::sqrt(128.0)));
  EXPECT_TRUE(n.mask().has_none());
  EXPECT_TRUE(n.score_mod().has_none());
  EXPECT_FALSE(n.has_tuning());

  v1::AttentionSpec s = BaseSpec();
  s.set_num_kv_heads(0);
  s.mutable_mask()->mutable_causal();
  s.set_backward(true);
  n = NormalizeAttentionSpec(s);
  EXPECT_EQ(n.num_kv_heads(), 32u);
  EXPECT_EQ(n.mask().causal().alignment(), v1::CAUSAL_ALIGNMENT_TOP_LEFT);
  EXPECT_TRUE(n.return_lse());
}

TEST(NormalizeTest, IsIdempotent) {
  v1::AttentionSpec s = BaseSpec();
  *s.add_buffers() = Buffer("z", v1::ELEM_TYPE_INT32, 1);
  *s.add_buffers() = Buffer("a", v1::ELEM_TYPE_INT32, 1);
  SetMaskExpr(&s, Bin(B::OP_EQ, Read("z", {Idx(v1::INDEX_VAR_Q_IDX)}),
                      Read("a", {Idx(v1::INDEX_VAR_KV_IDX)})));
  const v1::AttentionSpec once = NormalizeAttentionSpec(s);
  const v1::AttentionSpec twice = NormalizeAttentionSpec(once);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(once, twice));
  EXPECT_EQ(once.buffers(0).name(), "a");
  EXPECT_EQ(CanonicalSpecBytes(once), CanonicalSpecBytes(twice));
}

TEST(CanonicalTest, DefaultsExplicitOrImplicitGiveOneKey) {
  v1::AttentionSpec implicit = BaseSpec();
  v1::AttentionSpec explicit_ = BaseSpec();
  explicit_.set_head_dim_v(128);
  explicit_.set_softmax_scale(static_cast<float>(1.0 / std::sqrt(128.0)));
  explicit_.mutable_mask()->mutable_none();
  explicit_.mutable_score_mod()->mutable_none();
  explicit_.mutable_tuning();  // present, all zero
  EXPECT_EQ(Key(implicit), Key(explicit_));

  v1::AttentionSpec c1 = BaseSpec(), c2 = BaseSpec();
  c1.mutable_mask()->mutable_causal();
  c2.mutable_mask()->mutable_causal()->set_alignment(v1::CAUSAL_ALIGNMENT_TOP_LEFT);
  EXPECT_EQ(Key(c1), Key(c2));

  v1::AttentionSpec g1 = BaseSpec(), g2 = BaseSpec();
  g1.set_num_kv_heads(0);
  g2.set_num_kv_heads(32);
  EXPECT_EQ(Key(g1), Key(g2));
}

TEST(CanonicalTest, BackwardOnlyFlagsIgnoredWithoutBackward) {
  v1::AttentionSpec a = BaseSpec(), b = BaseSpec();
  b.set_deterministic(true);
  EXPECT_EQ(Key(a), Key(b));
  v1::AttentionSpec c = BaseSpec(), d = BaseSpec();
  c.set_backward(true);
  d.set_backward(true);
  d.set_return_lse(true);
  EXPECT_EQ(Key(c), Key(d));
  d.set_deterministic(true);
  EXPECT_NE(Key(c), Key(d));
}

// Trainable without backward is accepted and ignored (spec_validate.h);
// with backward it is part of the key, and so are backward and
// deterministic; and a d256 spec may still ask for trainable / deterministic
// without backward.
TEST(CanonicalTest, TrainableIsPartOfTheKeyOnlyWithBackward) {
  const auto with_bias = [](bool trainable, bool backward) {
    v1::AttentionSpec s = BaseSpec();
    *s.add_buffers() = Buffer("bias", v1::ELEM_TYPE_FLOAT32, 1, trainable);
    SetScoreExpr(&s, Bin(B::OP_ADD, Score(), Read("bias", {Idx(v1::INDEX_VAR_H)})));
    s.set_backward(backward);
    return s;
  };
  EXPECT_EQ(Key(with_bias(true, false)), Key(with_bias(false, false)));
  EXPECT_NE(Key(with_bias(true, true)), Key(with_bias(false, true)));
  EXPECT_NE(Key(with_bias(false, true)), Key(with_bias(false, false)));
  EXPECT_FALSE(NormalizeAttentionSpec(with_bias(true, false)).buffers(0).trainable());
  EXPECT_TRUE(NormalizeAttentionSpec(with_bias(true, true)).buffers(0).trainable());

  v1::AttentionSpec d256 = BaseSpec();
  d256.set_head_dim_qk(256);
  d256.set_deterministic(true);
  EXPECT_TRUE(ValidateAttentionSpec(d256).ok());
  v1::AttentionSpec det_trainable_fwd = with_bias(true, false);
  det_trainable_fwd.set_deterministic(true);
  EXPECT_TRUE(ValidateAttentionSpec(det_trainable_fwd).ok());
  EXPECT_EQ(Key(det_trainable_fwd), Key(with_bias(false, false)));
}

TEST(CanonicalTest, BufferOrderDoesNotMatter) {
  v1::AttentionSpec a = BaseSpec();
  *a.add_buffers() = Buffer("q_doc", v1::ELEM_TYPE_INT32, 2);
  *a.add_buffers() = Buffer("kv_doc", v1::ELEM_TYPE_INT32, 2);
  SetMaskExpr(&a, Bin(B::OP_EQ, Read("q_doc", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_Q_IDX)}),
                      Read("kv_doc", {Idx(v1::INDEX_VAR_B), Idx(v1::INDEX_VAR_KV_IDX)})));
  v1::AttentionSpec b = a;
  b.mutable_buffers()->SwapElements(0, 1);
  EXPECT_EQ(Key(a), Key(b));
}

TEST(CanonicalTest, ScoreNodeValueIgnored) {
  v1::AttentionSpec a = BaseSpec();
  SetScoreExpr(&a, Bin(B::OP_MUL, Score(), Flt(2)));
  v1::AttentionSpec b = a;
  b.mutable_score_mod()
      ->mutable_expr()
      ->mutable_value()
      ->mutable_binary()
      ->mutable_lhs()
      ->set_score(false);
  EXPECT_EQ(Key(a), Key(b));
}

TEST(CanonicalTest, MeaningfulDifferencesChangeTheKey) {
  const v1::AttentionSpec base = BaseSpec();
  std::vector<std::function<void(v1::AttentionSpec*)>> changes = {
      [](auto* s) { s->set_dtype(v1::DTYPE_FP16); },
      [](auto* s) { s->set_head_dim_qk(64); },
      [](auto* s) { s->set_head_dim_v(64); },
      [](auto* s) { s->set_num_q_heads(16); },
      [](auto* s) { s->set_num_kv_heads(4); },
      [](auto* s) { s->set_softmax_scale(0.1f); },
      [](auto* s) { s->mutable_mask()->mutable_causal(); },
      [](auto* s) {
        s->mutable_mask()->mutable_causal()->set_alignment(v1::CAUSAL_ALIGNMENT_BOTTOM_RIGHT);
      },
      [](auto* s) { s->mutable_mask()->mutable_sliding_window()->set_left(128); },
      [](auto* s) { s->mutable_mask()->mutable_sliding_window()->set_right(128); },
      [](auto* s) { s->mutable_mask()->mutable_document(); },
      [](auto* s) { s->mutable_mask()->mutable_document()->set_causal(true); },
      [](auto* s) { s->mutable_mask()->mutable_drafter()->set_block_size(16); },
      [](auto* s) { s->mutable_mask()->mutable_drafter()->set_block_size(32); },
      [](auto* s) {
        s->mutable_mask()->mutable_drafter()->set_block_size(16);
        s->mutable_mask()->mutable_drafter()->set_causal_within_block(true);
      },
      [](auto* s) {
        s->mutable_mask()->mutable_drafter()->set_block_size(16);
        s->mutable_mask()->mutable_drafter()->set_context_window(64);
      },
      [](auto* s) { SetMaskExpr(s, Causal()); },
      [](auto* s) {
        SetMaskExpr(s, Bin(B::OP_GT, Idx(v1::INDEX_VAR_Q_IDX), Idx(v1::INDEX_VAR_KV_IDX)));
      },
      [](auto* s) { s->mutable_score_mod()->mutable_softcap()->set_cap(30); },
      [](auto* s) { s->mutable_score_mod()->mutable_softcap()->set_cap(50); },
      [](auto* s) { s->mutable_score_mod()->mutable_alibi(); },
      [](auto* s) { SetScoreExpr(s, Score()); },
      [](auto* s) { SetScoreExpr(s, Flt(0.0f)); },
      [](auto* s) { SetScoreExpr(s, Flt(-0.0f)); },
      [](auto* s) { s->set_return_lse(true); },
      [](auto* s) { s->set_backward(true); },
      [](auto* s) { s->mutable_tuning()->set_block_m(64); },
      [](auto* s) { s->mutable_tuning()->set_block_n(64); },
      [](auto* s) { s->mutable_tuning()->set_num_warps(8); },
      [](auto* s) { s->mutable_tuning()->set_stages(3); },
  };
  std::set<std::string> keys = {Key(base)};
  for (size_t i = 0; i < changes.size(); ++i) {
    v1::AttentionSpec s = base;
    changes[i](&s);
    EXPECT_TRUE(keys.insert(Key(s)).second) << "change " << i << " collides";
  }
}

// The encoding is part of every key: a change to it must bump
// kCanonicalSpecVersion (and then this golden value).
TEST(CanonicalTest, GoldenBytes) {
  v1::AttentionSpec s = BaseSpec();
  s.mutable_mask()->mutable_causal();
  s.mutable_score_mod()->mutable_softcap()->set_cap(30);
  const std::string bytes = CanonicalSpecBytes(NormalizeAttentionSpec(s));
  EXPECT_EQ(bytes.substr(0, 10), std::string("kcspec\x01\x00\x00\x00", 10));
  std::string hex;
  for (unsigned char c : bytes) {
    static const char* d = "0123456789abcdef";
    hex.push_back(d[c >> 4]);
    hex.push_back(d[c & 15]);
  }
  EXPECT_EQ(hex,
            "6b63737065630100000001007504000000010000000200750400000080000000"
            "0300750400000080000000040075040000002000000005007504000000080000"
            "0006006604000000f304b53d07006d1b00000001006f14000000020002006d0b"
            "000000010075040000000100000008006d1b00000001006f1400000002000200"
            "6d0b000000010066040000000000f04109007204000000000000000a00620100"
            "0000000b006201000000000c006201000000000d006d2c000000010075040000"
            "0000000000020075040000000000000003007504000000000000000400750400"
            "000000000000")
      << hex;
}

// Census: when spec.proto grows a field, CanonicalSpecBytes (and
// normalization, validation, DescribeSpec) must learn it; this test fails
// first to say so.
TEST(CanonicalTest, FieldCensus) {
  const std::vector<std::pair<const google::protobuf::Descriptor*, int>> expected = {
      {v1::AttentionSpec::descriptor(), 13}, {v1::MaskSpec::descriptor(), 6},
      {v1::CausalMask::descriptor(), 1},     {v1::SlidingWindowMask::descriptor(), 3},
      {v1::DocumentMask::descriptor(), 1},   {v1::DrafterMask::descriptor(), 3},
      {v1::ExprMask::descriptor(), 1},       {v1::NoMask::descriptor(), 0},
      {v1::ScoreMod::descriptor(), 4},       {v1::SoftCapScoreMod::descriptor(), 1},
      {v1::AlibiScoreMod::descriptor(), 0},  {v1::NoScoreMod::descriptor(), 0},
      {v1::ExprScoreMod::descriptor(), 1},   {v1::Expr::descriptor(), 9},
      {v1::UnaryExpr::descriptor(), 2},      {v1::BinaryExpr::descriptor(), 3},
      {v1::SelectExpr::descriptor(), 3},     {v1::BufferRead::descriptor(), 2},
      {v1::BufferDecl::descriptor(), 4},     {v1::Tuning::descriptor(), 4},
  };
  for (const auto& [d, n] : expected) {
    EXPECT_EQ(d->field_count(), n)
        << d->full_name() << " changed: update compiler/attention/spec_canonical.cc";
  }
}

}  // namespace
}  // namespace kcache::attention
