// Helpers shared by the attention spec tests: building specs and expression
// trees tersely.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/text_format.h"
#include "kcache/v1/spec.pb.h"

namespace kcache::attention::testing {

// Parses text-format proto; aborts the test binary on a typo.
inline v1::AttentionSpec SpecFromText(const std::string& text) {
  v1::AttentionSpec s;
  if (!google::protobuf::TextFormat::ParseFromString(text, &s)) {
    std::abort();
  }
  return s;
}

inline v1::Expr Idx(v1::IndexVar v) {
  v1::Expr e;
  e.set_index(v);
  return e;
}
inline v1::Expr Int(int v) {
  v1::Expr e;
  e.set_int_const(v);
  return e;
}
inline v1::Expr Flt(float v) {
  v1::Expr e;
  e.set_float_const(v);
  return e;
}
inline v1::Expr Bool(bool v) {
  v1::Expr e;
  e.set_bool_const(v);
  return e;
}
inline v1::Expr Score() {
  v1::Expr e;
  e.set_score(true);
  return e;
}
inline v1::Expr Un(v1::UnaryExpr::Op op, v1::Expr a) {
  v1::Expr e;
  e.mutable_unary()->set_op(op);
  *e.mutable_unary()->mutable_arg() = std::move(a);
  return e;
}
inline v1::Expr Bin(v1::BinaryExpr::Op op, v1::Expr a, v1::Expr b) {
  v1::Expr e;
  e.mutable_binary()->set_op(op);
  *e.mutable_binary()->mutable_lhs() = std::move(a);
  *e.mutable_binary()->mutable_rhs() = std::move(b);
  return e;
}
inline v1::Expr Sel(v1::Expr c, v1::Expr t, v1::Expr f) {
  v1::Expr e;
  *e.mutable_select()->mutable_cond() = std::move(c);
  *e.mutable_select()->mutable_if_true() = std::move(t);
  *e.mutable_select()->mutable_if_false() = std::move(f);
  return e;
}
inline v1::Expr Read(const std::string& name, std::vector<v1::Expr> index) {
  v1::Expr e;
  e.mutable_read()->set_buffer(name);
  for (v1::Expr& i : index) *e.mutable_read()->add_index() = std::move(i);
  return e;
}

// bf16, d128, 32/8 heads, no mask.
inline v1::AttentionSpec BaseSpec() {
  v1::AttentionSpec s;
  s.set_dtype(v1::DTYPE_BF16);
  s.set_head_dim_qk(128);
  s.set_num_q_heads(32);
  s.set_num_kv_heads(8);
  return s;
}

inline v1::BufferDecl Buffer(const std::string& name, v1::ElemType type, int rank,
                             bool trainable = false) {
  v1::BufferDecl d;
  d.set_name(name);
  d.set_type(type);
  d.set_rank(rank);
  d.set_trainable(trainable);
  return d;
}

}  // namespace kcache::attention::testing
