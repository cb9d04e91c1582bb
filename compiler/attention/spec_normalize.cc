// Normalization of attention specs (see spec_normalize.h for the rules).
#include "compiler/attention/spec_normalize.h"

#include <algorithm>
#include <cmath>

namespace kcache::attention {
namespace {

void NormalizeAlignment(v1::CausalAlignment* a) {
  if (*a == v1::CAUSAL_ALIGNMENT_UNSPECIFIED) *a = v1::CAUSAL_ALIGNMENT_TOP_LEFT;
}

void NormalizeExpr(v1::Expr* e) {
  switch (e->node_case()) {
    case v1::Expr::kScore:
      e->set_score(true);
      break;
    case v1::Expr::kUnary:
      if (e->unary().has_arg()) NormalizeExpr(e->mutable_unary()->mutable_arg());
      break;
    case v1::Expr::kBinary:
      if (e->binary().has_lhs()) NormalizeExpr(e->mutable_binary()->mutable_lhs());
      if (e->binary().has_rhs()) NormalizeExpr(e->mutable_binary()->mutable_rhs());
      break;
    case v1::Expr::kSelect: {
      v1::SelectExpr* s = e->mutable_select();
      if (s->has_cond()) NormalizeExpr(s->mutable_cond());
      if (s->has_if_true()) NormalizeExpr(s->mutable_if_true());
      if (s->has_if_false()) NormalizeExpr(s->mutable_if_false());
      break;
    }
    case v1::Expr::kRead:
      for (v1::Expr& i : *e->mutable_read()->mutable_index()) NormalizeExpr(&i);
      break;
    default:
      break;
  }
}

}  // namespace

v1::AttentionSpec NormalizeAttentionSpec(const v1::AttentionSpec& spec) {
  v1::AttentionSpec n = spec;
  n.DiscardUnknownFields();
  if (n.head_dim_v() == 0) n.set_head_dim_v(n.head_dim_qk());
  if (n.num_kv_heads() == 0) n.set_num_kv_heads(n.num_q_heads());
  if (n.softmax_scale() == 0.0f && n.head_dim_qk() != 0) {
    n.set_softmax_scale(static_cast<float>(1.0 / std::sqrt(static_cast<double>(n.head_dim_qk()))));
  }

  v1::MaskSpec* mask = n.mutable_mask();
  switch (mask->kind_case()) {
    case v1::MaskSpec::KIND_NOT_SET:
      mask->mutable_none();
      break;
    case v1::MaskSpec::kCausal: {
      v1::CausalAlignment a = mask->causal().alignment();
      NormalizeAlignment(&a);
      mask->mutable_causal()->set_alignment(a);
      break;
    }
    case v1::MaskSpec::kSlidingWindow: {
      v1::CausalAlignment a = mask->sliding_window().alignment();
      NormalizeAlignment(&a);
      mask->mutable_sliding_window()->set_alignment(a);
      break;
    }
    case v1::MaskSpec::kExpr:
      if (mask->expr().has_predicate()) NormalizeExpr(mask->mutable_expr()->mutable_predicate());
      break;
    default:
      break;
  }

  v1::ScoreMod* score = n.mutable_score_mod();
  switch (score->kind_case()) {
    case v1::ScoreMod::KIND_NOT_SET:
      score->mutable_none();
      break;
    case v1::ScoreMod::kExpr:
      if (score->expr().has_value()) NormalizeExpr(score->mutable_expr()->mutable_value());
      break;
    default:
      break;
  }

  if (n.backward()) {
    n.set_return_lse(true);
  } else {
    n.set_deterministic(false);
    for (v1::BufferDecl& b : *n.mutable_buffers()) b.set_trainable(false);
  }
  std::stable_sort(
      n.mutable_buffers()->begin(), n.mutable_buffers()->end(),
      [](const v1::BufferDecl& a, const v1::BufferDecl& b) { return a.name() < b.name(); });

  const v1::Tuning& t = n.tuning();
  if (t.block_m() == 0 && t.block_n() == 0 && t.num_warps() == 0 && t.stages() == 0) {
    n.clear_tuning();
  }
  return n;
}

}  // namespace kcache::attention
