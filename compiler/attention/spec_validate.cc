// Validation of attention specs: the rules are in spec_validate.h. Errors
// name the offending field by its path from "spec".
#include "compiler/attention/spec_validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/attention/expr.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "kernels/attention_params.h"

namespace kcache::attention {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

absl::Status Invalid(absl::string_view path, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", reason));
}

// Rejects unknown fields anywhere in the message tree. A field this daemon
// does not know (a newer client's option) would otherwise be dropped
// silently and the wrong kernel served under a key that ignores it.
absl::Status CheckNoUnknownFields(const Message& m, const std::string& path, int nesting = 0) {
  // Protobuf's parsers stop at 100 levels; a spec built in memory could be
  // deeper, and this walk runs before the expression depth limit.
  if (nesting > 128) return Invalid(path, "messages nested too deeply");
  const Reflection* r = m.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = r->GetUnknownFields(m);
  if (!unknown.empty()) {
    return Invalid(path, absl::StrCat("unknown field number ", unknown.field(0).number(),
                                      " (a newer client? this daemon does not know it)"));
  }
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        absl::Status s =
            CheckNoUnknownFields(r->GetRepeatedMessage(m, f, i),
                                 absl::StrCat(path, ".", f->name(), "[", i, "]"), nesting + 1);
        if (!s.ok()) return s;
      }
    } else {
      absl::Status s = CheckNoUnknownFields(r->GetMessage(m, f), absl::StrCat(path, ".", f->name()),
                                            nesting + 1);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

bool ValidBufferName(const std::string& n) {
  if (n.empty() || n.size() > 32) return false;
  const auto lower = [](char c) { return c >= 'a' && c <= 'z'; };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (!lower(n[0]) && n[0] != '_') return false;
  return std::all_of(n.begin() + 1, n.end(),
                     [&](char c) { return lower(c) || digit(c) || c == '_'; });
}

absl::Status CheckAlignment(v1::CausalAlignment a, absl::string_view path) {
  if (!v1::CausalAlignment_IsValid(a)) {
    return Invalid(path, absl::StrCat("unknown alignment value ", static_cast<int>(a)));
  }
  return absl::OkStatus();
}

// Which tree is being checked: decides whether `score` is allowed and
// where buffer uses are recorded.
struct TreeContext {
  const ExprBufferTable* buffers;
  const Limits* limits;
  bool allow_score;
  int nodes = 0;
  absl::flat_hash_set<std::string>* used;  // buffer names read by this tree
};

class ExprChecker {
 public:
  explicit ExprChecker(TreeContext* ctx) : ctx_(ctx) {}

  // Type-checks `e` (at `path`, depth `depth`, the root being 1) and stores
  // its type in *type.
  absl::Status Check(const v1::Expr& e, const std::string& path, int depth, ExprType* type) {
    if (depth > ctx_->limits->max_expr_depth) {
      return Invalid(
          path, absl::StrCat("expression deeper than the limit of ", ctx_->limits->max_expr_depth));
    }
    if (++ctx_->nodes > ctx_->limits->max_expr_nodes) {
      return Invalid(path, absl::StrCat("expression has more than the limit of ",
                                        ctx_->limits->max_expr_nodes, " nodes"));
    }
    switch (e.node_case()) {
      case v1::Expr::NODE_NOT_SET:
        return Invalid(path, "empty expression node (no oneof member set)");
      case v1::Expr::kIndex:
        if (e.index() == v1::INDEX_VAR_UNSPECIFIED || !v1::IndexVar_IsValid(e.index())) {
          return Invalid(absl::StrCat(path, ".index"),
                         absl::StrCat("unknown index variable ", static_cast<int>(e.index())));
        }
        *type = ExprType::kInt;
        return absl::OkStatus();
      case v1::Expr::kIntConst:
        *type = ExprType::kInt;
        return absl::OkStatus();
      case v1::Expr::kFloatConst:
        if (!std::isfinite(e.float_const())) {
          return Invalid(absl::StrCat(path, ".float_const"), "constant is not finite");
        }
        *type = ExprType::kFloat;
        return absl::OkStatus();
      case v1::Expr::kBoolConst:
        *type = ExprType::kBool;
        return absl::OkStatus();
      case v1::Expr::kScore:
        if (!ctx_->allow_score) {
          return Invalid(absl::StrCat(path, ".score"),
                         "`score` is only available in score modifications");
        }
        *type = ExprType::kFloat;
        return absl::OkStatus();
      case v1::Expr::kUnary:
        return CheckUnary(e.unary(), absl::StrCat(path, ".unary"), depth, type);
      case v1::Expr::kBinary:
        return CheckBinary(e.binary(), absl::StrCat(path, ".binary"), depth, type);
      case v1::Expr::kSelect:
        return CheckSelect(e.select(), absl::StrCat(path, ".select"), depth, type);
      case v1::Expr::kRead:
        return CheckRead(e.read(), absl::StrCat(path, ".read"), depth, type);
    }
    return Invalid(path, "unknown expression node");
  }

 private:
  absl::Status Expect(const v1::Expr& e, const std::string& path, int depth, ExprType want,
                      absl::string_view why) {
    ExprType got;
    absl::Status s = Check(e, path, depth, &got);
    if (!s.ok()) return s;
    if (got != want) {
      return Invalid(path,
                     absl::StrCat("type ", ExprTypeName(got), ", expected ", ExprTypeName(want),
                                  why.empty() ? "" : " (", why, why.empty() ? "" : ")"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckUnary(const v1::UnaryExpr& u, const std::string& path, int depth,
                          ExprType* type) {
    const std::string arg_path = absl::StrCat(path, ".arg");
    if (!u.has_arg()) return Invalid(arg_path, "missing operand");
    const std::string op = v1::UnaryExpr_Op_Name(u.op());
    switch (u.op()) {
      case v1::UnaryExpr::OP_NEG:
      case v1::UnaryExpr::OP_ABS: {
        ExprType t;
        absl::Status s = Check(u.arg(), arg_path, depth + 1, &t);
        if (!s.ok()) return s;
        if (t == ExprType::kBool) {
          return Invalid(arg_path, absl::StrCat("type bool, expected int or float for ", op));
        }
        *type = t;
        return absl::OkStatus();
      }
      case v1::UnaryExpr::OP_NOT:
        *type = ExprType::kBool;
        return Expect(u.arg(), arg_path, depth + 1, ExprType::kBool, op);
      case v1::UnaryExpr::OP_EXP:
      case v1::UnaryExpr::OP_TANH:
        *type = ExprType::kFloat;
        return Expect(u.arg(), arg_path, depth + 1, ExprType::kFloat, op);
      case v1::UnaryExpr::OP_TO_FLOAT:
        *type = ExprType::kFloat;
        return Expect(u.arg(), arg_path, depth + 1, ExprType::kInt, op);
      default:
        return Invalid(absl::StrCat(path, ".op"),
                       absl::StrCat("unknown unary operator ", static_cast<int>(u.op())));
    }
  }

  absl::Status CheckBinary(const v1::BinaryExpr& b, const std::string& path, int depth,
                           ExprType* type) {
    const std::string lhs_path = absl::StrCat(path, ".lhs");
    const std::string rhs_path = absl::StrCat(path, ".rhs");
    using Op = v1::BinaryExpr;
    const v1::BinaryExpr_Op op = b.op();
    if (op == Op::OP_UNSPECIFIED || !v1::BinaryExpr_Op_IsValid(op)) {
      return Invalid(absl::StrCat(path, ".op"),
                     absl::StrCat("unknown binary operator ", static_cast<int>(op)));
    }
    if (!b.has_lhs()) return Invalid(lhs_path, "missing operand");
    if (!b.has_rhs()) return Invalid(rhs_path, "missing operand");
    const std::string name = v1::BinaryExpr_Op_Name(op);
    if (op == Op::OP_AND || op == Op::OP_OR) {
      absl::Status s = Expect(b.lhs(), lhs_path, depth + 1, ExprType::kBool, name);
      if (!s.ok()) return s;
      *type = ExprType::kBool;
      return Expect(b.rhs(), rhs_path, depth + 1, ExprType::kBool, name);
    }
    ExprType lt, rt;
    absl::Status s = Check(b.lhs(), lhs_path, depth + 1, &lt);
    if (!s.ok()) return s;
    s = Check(b.rhs(), rhs_path, depth + 1, &rt);
    if (!s.ok()) return s;
    if (lt == ExprType::kBool) {
      return Invalid(lhs_path, absl::StrCat("type bool, expected int or float for ", name));
    }
    if (rt != lt) {
      return Invalid(rhs_path,
                     absl::StrCat("type ", ExprTypeName(rt), ", expected ", ExprTypeName(lt), " (",
                                  name, " needs both operands of one type)"));
    }
    switch (op) {
      case Op::OP_DIV:
        if (lt != ExprType::kFloat) {
          return Invalid(lhs_path, "type int, expected float (OP_DIV is float only)");
        }
        *type = lt;
        return absl::OkStatus();
      case Op::OP_MOD:
      case Op::OP_FLOORDIV:
        if (lt != ExprType::kInt) {
          return Invalid(lhs_path,
                         absl::StrCat("type float, expected int (", name, " is int only)"));
        }
        *type = lt;
        return absl::OkStatus();
      case Op::OP_ADD:
      case Op::OP_SUB:
      case Op::OP_MUL:
      case Op::OP_MIN:
      case Op::OP_MAX:
        *type = lt;
        return absl::OkStatus();
      default:  // comparisons
        *type = ExprType::kBool;
        return absl::OkStatus();
    }
  }

  absl::Status CheckSelect(const v1::SelectExpr& sel, const std::string& path, int depth,
                           ExprType* type) {
    const std::string cond_path = absl::StrCat(path, ".cond");
    const std::string t_path = absl::StrCat(path, ".if_true");
    const std::string f_path = absl::StrCat(path, ".if_false");
    if (!sel.has_cond()) return Invalid(cond_path, "missing operand");
    if (!sel.has_if_true()) return Invalid(t_path, "missing operand");
    if (!sel.has_if_false()) return Invalid(f_path, "missing operand");
    absl::Status s = Expect(sel.cond(), cond_path, depth + 1, ExprType::kBool, "");
    if (!s.ok()) return s;
    ExprType tt;
    s = Check(sel.if_true(), t_path, depth + 1, &tt);
    if (!s.ok()) return s;
    *type = tt;
    return Expect(sel.if_false(), f_path, depth + 1, tt, "the type of if_true");
  }

  absl::Status CheckRead(const v1::BufferRead& r, const std::string& path, int depth,
                         ExprType* type) {
    auto it = ctx_->buffers->find(r.buffer());
    if (it == ctx_->buffers->end()) {
      // The name is client text: quote it only when it is a valid name, so
      // that error messages never carry arbitrary bytes.
      return Invalid(absl::StrCat(path, ".buffer"),
                     ValidBufferName(r.buffer())
                         ? absl::StrCat("buffer '", r.buffer(), "' is not declared in spec.buffers")
                         : std::string("names no declared buffer"));
    }
    const ExprBuffer& buf = it->second;
    if (static_cast<uint32_t>(r.index_size()) != buf.rank) {
      return Invalid(absl::StrCat(path, ".index"),
                     absl::StrCat(r.index_size(), " indices for buffer '", r.buffer(), "' of rank ",
                                  buf.rank));
    }
    for (int i = 0; i < r.index_size(); ++i) {
      absl::Status s = Expect(r.index(i), absl::StrCat(path, ".index[", i, "]"), depth + 1,
                              ExprType::kInt, "buffer index");
      if (!s.ok()) return s;
    }
    if (!ElemTypeToExprType(buf.type, type)) {
      return Invalid(absl::StrCat(path, ".buffer"), "buffer has no element type");
    }
    ctx_->used->insert(r.buffer());
    return absl::OkStatus();
  }

  TreeContext* ctx_;
};

absl::Status CheckTree(const v1::Expr& root, const std::string& path, ExprType want,
                       bool allow_score, const ExprBufferTable& buffers, const Limits& limits,
                       absl::flat_hash_set<std::string>* used) {
  TreeContext ctx{&buffers, &limits, allow_score, 0, used};
  ExprChecker checker(&ctx);
  ExprType got;
  absl::Status s = checker.Check(root, path, 1, &got);
  if (!s.ok()) return s;
  if (got != want) {
    return Invalid(path,
                   absl::StrCat("type ", ExprTypeName(got), ", expected ", ExprTypeName(want)));
  }
  return absl::OkStatus();
}

absl::Status CheckTuningField(uint32_t v, absl::string_view path, uint32_t lo, uint32_t hi,
                              bool pow2, uint32_t multiple_of = 1) {
  if (v == 0) return absl::OkStatus();
  if (v < lo || v > hi || (pow2 && !IsPowerOfTwo(v)) || v % multiple_of != 0) {
    return Invalid(
        path, absl::StrCat(v, " is not 0 (compiler chooses) or ", pow2 ? "a power of two " : "",
                           multiple_of > 1 ? absl::StrCat("a multiple of ", multiple_of, " ") : "",
                           "in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckBuffersDeclared(const v1::AttentionSpec& spec, const Limits& limits) {
  const int max_buffers = std::min(limits.max_buffers, kcache::kMaxExprBuffers);
  if (spec.buffers_size() > max_buffers) {
    return Invalid("spec.buffers",
                   absl::StrCat(spec.buffers_size(), " buffers, the limit is ", max_buffers));
  }
  absl::flat_hash_set<std::string> names;
  for (int i = 0; i < spec.buffers_size(); ++i) {
    const v1::BufferDecl& d = spec.buffers(i);
    const std::string p = absl::StrCat("spec.buffers[", i, "]");
    if (!ValidBufferName(d.name())) {
      return Invalid(absl::StrCat(p, ".name"), "name must match [a-z_][a-z0-9_]{0,31}");
    }
    if (!names.insert(d.name()).second) {
      return Invalid(absl::StrCat(p, ".name"),
                     absl::StrCat("buffer '", d.name(), "' is declared twice"));
    }
    ExprType t;
    if (!ElemTypeToExprType(d.type(), &t)) {
      return Invalid(absl::StrCat(p, ".type"),
                     absl::StrCat("element type must be INT32, FLOAT32 or BOOL, got ",
                                  static_cast<int>(d.type())));
    }
    if (d.rank() < 1 || d.rank() > 4) {
      return Invalid(absl::StrCat(p, ".rank"), absl::StrCat(d.rank(), " is not in [1, 4]"));
    }
    if (d.trainable() && d.type() != v1::ELEM_TYPE_FLOAT32) {
      return Invalid(absl::StrCat(p, ".trainable"), "only FLOAT32 buffers can be trainable");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMask(const v1::AttentionSpec& spec, const ExprBufferTable& buffers,
                       const Limits& limits, absl::flat_hash_set<std::string>* used) {
  const v1::MaskSpec& m = spec.mask();
  switch (m.kind_case()) {
    case v1::MaskSpec::KIND_NOT_SET:
    case v1::MaskSpec::kNone:
      return absl::OkStatus();
    case v1::MaskSpec::kCausal:
      return CheckAlignment(m.causal().alignment(), "spec.mask.causal.alignment");
    case v1::MaskSpec::kSlidingWindow: {
      const v1::SlidingWindowMask& w = m.sliding_window();
      for (auto [v, name] : {std::pair{w.left(), "left"}, std::pair{w.right(), "right"}}) {
        if (v < -1 || v > limits.max_window_extent) {
          return Invalid(
              absl::StrCat("spec.mask.sliding_window.", name),
              absl::StrCat(v, " is not in [-1, ", limits.max_window_extent, "] (-1 = unbounded)"));
        }
      }
      if (w.left() == -1 && w.right() == -1) {
        return Invalid("spec.mask.sliding_window",
                       "both extents unbounded (-1): that is no mask, use mask.none");
      }
      return CheckAlignment(w.alignment(), "spec.mask.sliding_window.alignment");
    }
    case v1::MaskSpec::kDocument:
      return absl::OkStatus();
    case v1::MaskSpec::kDrafter: {
      const v1::DrafterMask& d = m.drafter();
      if (!IsPowerOfTwo(d.block_size()) || d.block_size() > 256) {
        return Invalid("spec.mask.drafter.block_size",
                       absl::StrCat(d.block_size(), " is not a power of two in [1, 256]"));
      }
      if (d.context_window() < 0 || d.context_window() > limits.max_window_extent) {
        return Invalid("spec.mask.drafter.context_window",
                       absl::StrCat(d.context_window(), " is not in [0, ", limits.max_window_extent,
                                    "] (0 = unbounded)"));
      }
      return absl::OkStatus();
    }
    case v1::MaskSpec::kExpr:
      if (!m.expr().has_predicate()) {
        return Invalid("spec.mask.expr.predicate", "missing (an expression mask needs one)");
      }
      return CheckTree(m.expr().predicate(), "spec.mask.expr.predicate", ExprType::kBool,
                       /*allow_score=*/false, buffers, limits, used);
  }
  return Invalid("spec.mask", "unknown mask kind");
}

absl::Status CheckScoreMod(const v1::AttentionSpec& spec, const ExprBufferTable& buffers,
                           const Limits& limits, absl::flat_hash_set<std::string>* used) {
  const v1::ScoreMod& s = spec.score_mod();
  switch (s.kind_case()) {
    case v1::ScoreMod::KIND_NOT_SET:
    case v1::ScoreMod::kNone:
    case v1::ScoreMod::kAlibi:
      return absl::OkStatus();
    case v1::ScoreMod::kSoftcap:
      if (!std::isfinite(s.softcap().cap()) || !(s.softcap().cap() > 0.0f)) {
        return Invalid("spec.score_mod.softcap.cap",
                       absl::StrCat(s.softcap().cap(), " is not finite and > 0"));
      }
      return absl::OkStatus();
    case v1::ScoreMod::kExpr:
      if (!s.expr().has_value()) {
        return Invalid("spec.score_mod.expr.value",
                       "missing (an expression score modification needs one)");
      }
      return CheckTree(s.expr().value(), "spec.score_mod.expr.value", ExprType::kFloat,
                       /*allow_score=*/true, buffers, limits, used);
  }
  return Invalid("spec.score_mod", "unknown score modification kind");
}

}  // namespace

absl::Status ValidateAttentionSpec(const v1::AttentionSpec& spec, const Limits& limits) {
  if (absl::Status s = CheckNoUnknownFields(spec, "spec"); !s.ok()) return s;

  if (spec.dtype() == v1::DTYPE_UNSPECIFIED || !v1::DType_IsValid(spec.dtype())) {
    return Invalid("spec.dtype", absl::StrCat("must be DTYPE_BF16 or DTYPE_FP16, got ",
                                              static_cast<int>(spec.dtype())));
  }
  const auto head_dim_ok = [](uint32_t d) { return d == 64 || d == 128 || d == 256; };
  if (!head_dim_ok(spec.head_dim_qk())) {
    return Invalid("spec.head_dim_qk", absl::StrCat(spec.head_dim_qk(), " is not 64, 128 or 256"));
  }
  if (spec.head_dim_v() != 0 && !head_dim_ok(spec.head_dim_v())) {
    return Invalid("spec.head_dim_v",
                   absl::StrCat(spec.head_dim_v(), " is not 0 (= head_dim_qk), 64, 128 or 256"));
  }
  if (spec.num_q_heads() < 1 || spec.num_q_heads() > limits.max_heads) {
    return Invalid("spec.num_q_heads",
                   absl::StrCat(spec.num_q_heads(), " is not in [1, ", limits.max_heads, "]"));
  }
  if (spec.num_kv_heads() != 0) {
    if (spec.num_kv_heads() > spec.num_q_heads()) {
      return Invalid("spec.num_kv_heads", absl::StrCat(spec.num_kv_heads(), " exceeds num_q_heads ",
                                                       spec.num_q_heads()));
    }
    if (spec.num_q_heads() % spec.num_kv_heads() != 0) {
      return Invalid(
          "spec.num_kv_heads",
          absl::StrCat(spec.num_kv_heads(), " does not divide num_q_heads ", spec.num_q_heads()));
    }
  }
  // 0 is the default; -0.0 compares equal to 0 and is the default too.
  if (spec.softmax_scale() != 0.0f &&
      (!std::isfinite(spec.softmax_scale()) || !(spec.softmax_scale() > 0.0f))) {
    return Invalid("spec.softmax_scale",
                   absl::StrCat(spec.softmax_scale(), " is not 0 (default) or finite and > 0"));
  }

  if (absl::Status s = CheckBuffersDeclared(spec, limits); !s.ok()) return s;
  const ExprBufferTable buffers = BuildBufferTable(spec);
  absl::flat_hash_set<std::string> used_by_mask, used_by_score;
  if (absl::Status s = CheckMask(spec, buffers, limits, &used_by_mask); !s.ok()) return s;
  if (absl::Status s = CheckScoreMod(spec, buffers, limits, &used_by_score); !s.ok()) return s;
  for (int i = 0; i < spec.buffers_size(); ++i) {
    const v1::BufferDecl& d = spec.buffers(i);
    const bool by_score = used_by_score.contains(d.name());
    if (!by_score && !used_by_mask.contains(d.name())) {
      return Invalid(
          absl::StrCat("spec.buffers[", i, "]"),
          absl::StrCat("buffer '", d.name(), "' is not read by the mask or score expression"));
    }
    if (d.trainable() && !by_score) {
      return Invalid(absl::StrCat("spec.buffers[", i, "].trainable"),
                     absl::StrCat("buffer '", d.name(),
                                  "' is not read by the score expression, so it has no gradient"));
    }
  }

  // Backward-only rules. Without backward, deterministic and trainable are
  // ignored (normalization clears them), so they are not checked here.
  if (spec.backward()) {
    const auto bwd_dim_ok = [](uint32_t d) { return d == 64 || d == 128; };
    if (!bwd_dim_ok(spec.head_dim_qk())) {
      return Invalid("spec.head_dim_qk",
                     absl::StrCat(spec.head_dim_qk(),
                                  " has no backward (the backward supports head dims 64 and 128)"));
    }
    if (spec.head_dim_v() != 0 && !bwd_dim_ok(spec.head_dim_v())) {
      return Invalid("spec.head_dim_v",
                     absl::StrCat(spec.head_dim_v(),
                                  " has no backward (the backward supports head dims 64 and 128)"));
    }
    if (spec.deterministic()) {
      for (int i = 0; i < spec.buffers_size(); ++i) {
        if (spec.buffers(i).trainable()) {
          return Invalid("spec.deterministic",
                         absl::StrCat("buffer '", spec.buffers(i).name(),
                                      "' is trainable: deterministic backward has no atomics; "
                                      "trainable buffer gradients need them"));
        }
      }
    }
  }

  const v1::Tuning& t = spec.tuning();
  // Not only powers of two: sm_90a's ping-pong takes block_n 176, and 12
  // warps over block_m 192 (AttentionTilesLegal decides per target).
  if (absl::Status s = CheckTuningField(t.block_m(), "spec.tuning.block_m", 16, 256, false, 16);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTuningField(t.block_n(), "spec.tuning.block_n", 16, 256, false, 16);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTuningField(t.num_warps(), "spec.tuning.num_warps", 4, 12, false, 4);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTuningField(t.stages(), "spec.tuning.stages", 1, 8, false); !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

}  // namespace kcache::attention
