// Lowering of expression trees to CUDA (semantics in expr_lower.h). Each
// operation becomes one SSA-style `const T tN = ...;` line, so the output
// is flat however deep the tree is.
#include "compiler/attention/expr_lower.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "compiler/attention/expr.h"

namespace kcache::attention {
namespace {

// A lowered value: a C++ expression of type `type` that is a leaf (a
// parameter name, a literal or a temporary).
struct Value {
  std::string text;
  ExprType type;
  int temp = -1;       // tN: N, the index of the node in the tape; -1 otherwise
  bool score = false;  // the `score` parameter
  unsigned deps = 0;   // kDep* bits: the index variables (and score) it depends on
};

// Dependencies of a lowered value (Value::deps).
constexpr unsigned kDepB = 1, kDepH = 2, kDepQ = 4, kDepKv = 8, kDepScore = 16;

// What reverse-mode differentiation needs to know of one emitted temporary.
// Everything that is not a float operation with a derivative is kNone
// (ints, bools, comparisons, TO_FLOAT, constants): no gradient flows
// through it.
enum class DiffOp {
  kNone,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kNeg,
  kAbs,
  kExp,
  kTanh,
  kMin,
  kMax,
  kSelect,  // args: cond, if_true, if_false
  kRead,    // float buffer read; args: the indices
};

struct TapeNode {
  DiffOp op = DiffOp::kNone;
  std::vector<Value> args;
  int slot = -1;  // kRead: the buffer slot
};

// One emitted temporary of the Lowerer: its `const T tN = ...;` line, its
// dependencies (kDep* bits) and the temporaries its right-hand side reads.
struct Node {
  std::string line;
  ExprType type;
  unsigned deps;
  std::vector<int> uses;
};

const char* CType(ExprType t) {
  switch (t) {
    case ExprType::kInt:
      return "int";
    case ExprType::kFloat:
      return "float";
    case ExprType::kBool:
      return "bool";
  }
  return "int";
}

std::string Wrap(const std::string& op, const Value& a, const Value& b) {
  // Wrapping int arithmetic through unsigned: defined behaviour for every
  // input.
  return absl::StrCat("static_cast<int>(static_cast<unsigned>(", a.text, ") ", op,
                      " static_cast<unsigned>(", b.text, "))");
}

class Lowerer {
 public:
  Lowerer(const ExprBufferTable* buffers, bool score_allowed)
      : buffers_(buffers), score_allowed_(score_allowed) {}

  absl::StatusOr<Value> Lower(const v1::Expr& e) {
    switch (e.node_case()) {
      case v1::Expr::kIndex:
        switch (e.index()) {
          case v1::INDEX_VAR_B:
            reads_b_ = true;
            return Value{"b", ExprType::kInt, -1, false, kDepB};
          case v1::INDEX_VAR_H:
            reads_h_ = true;
            return Value{"h", ExprType::kInt, -1, false, kDepH};
          case v1::INDEX_VAR_Q_IDX:
            return Value{"q_idx", ExprType::kInt, -1, false, kDepQ};
          case v1::INDEX_VAR_KV_IDX:
            return Value{"kv_idx", ExprType::kInt, -1, false, kDepKv};
          default:
            return Bad("unknown index variable");
        }
      case v1::Expr::kIntConst:
        return Value{IntLiteral(e.int_const()), ExprType::kInt};
      case v1::Expr::kFloatConst:
        if (!std::isfinite(e.float_const())) return Bad("non-finite constant");
        return Value{std::signbit(e.float_const())
                         ? absl::StrCat("(", HexFloatLiteral(e.float_const()), ")")
                         : HexFloatLiteral(e.float_const()),
                     ExprType::kFloat};
      case v1::Expr::kBoolConst:
        return Value{e.bool_const() ? "true" : "false", ExprType::kBool};
      case v1::Expr::kScore:
        if (!score_allowed_) return Bad("score outside a score modification");
        return Value{"score", ExprType::kFloat, -1, /*score=*/true, kDepScore};
      case v1::Expr::kUnary:
        return LowerUnary(e.unary());
      case v1::Expr::kBinary:
        return LowerBinary(e.binary());
      case v1::Expr::kSelect: {
        absl::StatusOr<Value> c = Lower(e.select().cond());
        if (!c.ok()) return c.status();
        absl::StatusOr<Value> t = Lower(e.select().if_true());
        if (!t.ok()) return t.status();
        absl::StatusOr<Value> f = Lower(e.select().if_false());
        if (!f.ok()) return f.status();
        if (c->type != ExprType::kBool || t->type != f->type) return Bad("select types");
        return Emit(t->type, absl::StrCat(c->text, " ? ", t->text, " : ", f->text), {*c, *t, *f},
                    t->type == ExprType::kFloat ? DiffOp::kSelect : DiffOp::kNone);
      }
      case v1::Expr::kRead:
        return LowerRead(e.read());
      case v1::Expr::NODE_NOT_SET:
        break;
    }
    return Bad("empty node");
  }

  // Every temporary's line, in order: the body of the lowered function.
  std::string body() const {
    std::string out;
    for (const Node& n : nodes_) out += n.line;
    return out;
  }
  bool uses_imod() const { return uses_imod_; }
  bool uses_ifloordiv() const { return uses_ifloordiv_; }
  // Whether the tree reads the batch / head index anywhere (tile classes
  // of a mask that does not are shared across batch / heads).
  bool reads_b() const { return reads_b_; }
  bool reads_h() const { return reads_h_; }
  // One entry per temporary: tape()[N] describes tN.
  const std::vector<TapeNode>& tape() const { return tape_; }
  // One entry per temporary: nodes()[N] is tN's line and dependencies.
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  static absl::Status Bad(absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("expression does not type-check (", what, "); validate the spec first"));
  }

  // One temporary `tN = rhs` of `type` computed from `operands` (the values
  // rhs reads, which give its dependencies); op and slot for differentiation.
  Value Emit(ExprType type, const std::string& rhs, std::vector<Value> operands,
             DiffOp op = DiffOp::kNone, int slot = -1) {
    const int n = static_cast<int>(tape_.size());
    std::string name = absl::StrCat("t", n);
    std::string line = absl::StrCat("  const ", CType(type), " ", name, " = ", rhs, ";\n");
    unsigned deps = 0;
    std::vector<int> uses;
    for (const Value& v : operands) {
      deps |= v.deps;
      if (v.temp >= 0) uses.push_back(v.temp);
    }
    nodes_.push_back(Node{std::move(line), type, deps, std::move(uses)});
    // The tape keeps the operands of differentiable operations and reads
    // (ReverseSweep's inputs) only.
    const bool keep = op != DiffOp::kNone || slot >= 0;
    tape_.push_back(TapeNode{op, keep ? std::move(operands) : std::vector<Value>{}, slot});
    return Value{name, type, n, /*score=*/false, deps};
  }

  absl::StatusOr<Value> LowerUnary(const v1::UnaryExpr& u) {
    absl::StatusOr<Value> a = Lower(u.arg());
    if (!a.ok()) return a.status();
    const bool is_int = a->type == ExprType::kInt;
    const bool is_float = a->type == ExprType::kFloat;
    switch (u.op()) {
      case v1::UnaryExpr::OP_NEG:
        if (is_int) {
          return Emit(ExprType::kInt,
                      absl::StrCat("static_cast<int>(0u - static_cast<unsigned>(", a->text, "))"),
                      {*a});
        }
        if (is_float) return Emit(ExprType::kFloat, absl::StrCat("-", a->text), {*a}, DiffOp::kNeg);
        break;
      case v1::UnaryExpr::OP_ABS:
        if (is_int) {
          return Emit(ExprType::kInt,
                      absl::StrCat(a->text, " < 0 ? static_cast<int>(0u - static_cast<unsigned>(",
                                   a->text, ")) : ", a->text),
                      {*a});
        }
        if (is_float) {
          return Emit(ExprType::kFloat, absl::StrCat("fabsf(", a->text, ")"), {*a}, DiffOp::kAbs);
        }
        break;
      case v1::UnaryExpr::OP_NOT:
        if (a->type == ExprType::kBool)
          return Emit(ExprType::kBool, absl::StrCat("!", a->text), {*a});
        break;
      case v1::UnaryExpr::OP_EXP:
        if (is_float) {
          return Emit(ExprType::kFloat, absl::StrCat("expf(", a->text, ")"), {*a}, DiffOp::kExp);
        }
        break;
      case v1::UnaryExpr::OP_TANH:
        if (is_float) {
          return Emit(ExprType::kFloat, absl::StrCat("tanhf(", a->text, ")"), {*a}, DiffOp::kTanh);
        }
        break;
      case v1::UnaryExpr::OP_TO_FLOAT:
        if (is_int) {
          return Emit(ExprType::kFloat, absl::StrCat("static_cast<float>(", a->text, ")"), {*a});
        }
        break;
      default:
        break;
    }
    return Bad("unary operator");
  }

  absl::StatusOr<Value> LowerBinary(const v1::BinaryExpr& bin) {
    absl::StatusOr<Value> a = Lower(bin.lhs());
    if (!a.ok()) return a.status();
    absl::StatusOr<Value> b = Lower(bin.rhs());
    if (!b.ok()) return b.status();
    if (a->type != b->type) return Bad("operand types differ");
    const ExprType t = a->type;
    const auto cmp = [&](const char* op) -> absl::StatusOr<Value> {
      if (t == ExprType::kBool) return Bad("comparison of bools");
      return Emit(ExprType::kBool, absl::StrCat(a->text, " ", op, " ", b->text), {*a, *b});
    };
    using Op = v1::BinaryExpr;
    switch (bin.op()) {
      case Op::OP_ADD:
      case Op::OP_SUB:
      case Op::OP_MUL: {
        const char* op = bin.op() == Op::OP_ADD ? "+" : bin.op() == Op::OP_SUB ? "-" : "*";
        const DiffOp d = bin.op() == Op::OP_ADD   ? DiffOp::kAdd
                         : bin.op() == Op::OP_SUB ? DiffOp::kSub
                                                  : DiffOp::kMul;
        if (t == ExprType::kInt) return Emit(t, Wrap(op, *a, *b), {*a, *b});
        if (t == ExprType::kFloat) {
          return Emit(t, absl::StrCat(a->text, " ", op, " ", b->text), {*a, *b}, d);
        }
        break;
      }
      case Op::OP_DIV:
        if (t == ExprType::kFloat) {
          return Emit(t, absl::StrCat(a->text, " / ", b->text), {*a, *b}, DiffOp::kDiv);
        }
        break;
      case Op::OP_MOD:
        if (t == ExprType::kInt) {
          uses_imod_ = true;
          return Emit(t, absl::StrCat("kc_imod(", a->text, ", ", b->text, ")"), {*a, *b});
        }
        break;
      case Op::OP_FLOORDIV:
        if (t == ExprType::kInt) {
          uses_ifloordiv_ = true;
          return Emit(t, absl::StrCat("kc_ifloordiv(", a->text, ", ", b->text, ")"), {*a, *b});
        }
        break;
      case Op::OP_MIN:
        if (t == ExprType::kInt) {
          return Emit(t, absl::StrCat(a->text, " < ", b->text, " ? ", a->text, " : ", b->text),
                      {*a, *b});
        }
        if (t == ExprType::kFloat) {
          return Emit(t, absl::StrCat("fminf(", a->text, ", ", b->text, ")"), {*a, *b},
                      DiffOp::kMin);
        }
        break;
      case Op::OP_MAX:
        if (t == ExprType::kInt) {
          return Emit(t, absl::StrCat(a->text, " > ", b->text, " ? ", a->text, " : ", b->text),
                      {*a, *b});
        }
        if (t == ExprType::kFloat) {
          return Emit(t, absl::StrCat("fmaxf(", a->text, ", ", b->text, ")"), {*a, *b},
                      DiffOp::kMax);
        }
        break;
      case Op::OP_EQ:
        return cmp("==");
      case Op::OP_NE:
        return cmp("!=");
      case Op::OP_LT:
        return cmp("<");
      case Op::OP_LE:
        return cmp("<=");
      case Op::OP_GT:
        return cmp(">");
      case Op::OP_GE:
        return cmp(">=");
      case Op::OP_AND:
      case Op::OP_OR:
        if (t == ExprType::kBool) {
          return Emit(t, absl::StrCat(a->text, bin.op() == Op::OP_AND ? " && " : " || ", b->text),
                      {*a, *b});
        }
        break;
      default:
        break;
    }
    return Bad("binary operator");
  }

  absl::StatusOr<Value> LowerRead(const v1::BufferRead& r) {
    auto it = buffers_->find(r.buffer());
    if (it == buffers_->end()) return Bad("undeclared buffer");
    const ExprBuffer& buf = it->second;
    ExprType type;
    if (!ElemTypeToExprType(buf.type, &type)) return Bad("buffer element type");
    if (static_cast<uint32_t>(r.index_size()) != buf.rank) return Bad("buffer rank");
    std::string call = absl::StrCat("kc_read_", buf.slot, "(p");
    std::vector<Value> index;
    for (const v1::Expr& i : r.index()) {
      absl::StatusOr<Value> v = Lower(i);
      if (!v.ok()) return v.status();
      if (v->type != ExprType::kInt) return Bad("buffer index type");
      absl::StrAppend(&call, ", ", v->text);
      index.push_back(*std::move(v));
    }
    call += ")";
    return Emit(type, call, std::move(index),
                type == ExprType::kFloat ? DiffOp::kRead : DiffOp::kNone, buf.slot);
  }

  const ExprBufferTable* buffers_;
  const bool score_allowed_;
  std::vector<TapeNode> tape_;
  std::vector<Node> nodes_;
  bool uses_imod_ = false;
  bool uses_ifloordiv_ = false;
  bool reads_b_ = false;
  bool reads_h_ = false;
};

// Interval lowering of a mask predicate for kc_expr_mask_tile: the same
// tree evaluated over a whole tile (q_idx in [q0, q1], kv_idx in [kv0, kv1],
// b and h fixed). Ints become kc_ir intervals, bools kc_br (may be true,
// may be false), floats are not tracked (a comparison of floats may be
// either). Every rule is sound: the value at any pair of the tile lies in
// the interval, so "cannot be false" means the tile is fully visible and
// "cannot be true" that it is empty; anything else is left to the
// per-element evaluation.
class RangeLowerer {
 public:
  explicit RangeLowerer(const ExprBufferTable* buffers) : buffers_(buffers) {}

  absl::StatusOr<Value> Lower(const v1::Expr& e) {
    switch (e.node_case()) {
      case v1::Expr::kIndex:
        switch (e.index()) {
          case v1::INDEX_VAR_B:
            return Emit(ExprType::kInt, "kc_ir_c(b)");
          case v1::INDEX_VAR_H:
            return Emit(ExprType::kInt, "kc_ir_c(h)");
          case v1::INDEX_VAR_Q_IDX:
            return Emit(ExprType::kInt, "kc_ir{q0, q1}");
          case v1::INDEX_VAR_KV_IDX:
            return Emit(ExprType::kInt, "kc_ir{kv0, kv1}");
          default:
            return Bad();
        }
      case v1::Expr::kIntConst:
        return Emit(ExprType::kInt, absl::StrCat("kc_ir_c(", IntLiteral(e.int_const()), ")"));
      case v1::Expr::kFloatConst:
      case v1::Expr::kScore:
        return Float();
      case v1::Expr::kBoolConst:
        return Emit(ExprType::kBool, e.bool_const() ? "kc_br{true, false}" : "kc_br{false, true}");
      case v1::Expr::kUnary: {
        absl::StatusOr<Value> a = Lower(e.unary().arg());
        if (!a.ok()) return a.status();
        switch (e.unary().op()) {
          case v1::UnaryExpr::OP_NEG:
            if (a->type == ExprType::kInt) return Emit(a->type, Call("kc_ir_neg", *a));
            return Float();
          case v1::UnaryExpr::OP_ABS:
            if (a->type == ExprType::kInt) return Emit(a->type, Call("kc_ir_abs", *a));
            return Float();
          case v1::UnaryExpr::OP_NOT:
            return Emit(ExprType::kBool, absl::StrCat("kc_br{", a->text, ".f, ", a->text, ".t}"));
          default:  // EXP, TANH, TO_FLOAT
            return Float();
        }
      }
      case v1::Expr::kBinary:
        return LowerBinary(e.binary());
      case v1::Expr::kSelect: {
        absl::StatusOr<Value> c = Lower(e.select().cond());
        if (!c.ok()) return c.status();
        absl::StatusOr<Value> t = Lower(e.select().if_true());
        if (!t.ok()) return t.status();
        absl::StatusOr<Value> f = Lower(e.select().if_false());
        if (!f.ok()) return f.status();
        if (t->type == ExprType::kFloat) return Float();
        return Emit(t->type, absl::StrCat(t->type == ExprType::kInt ? "kc_ir_sel(" : "kc_br_sel(",
                                          c->text, ", ", t->text, ", ", f->text, ")"));
      }
      case v1::Expr::kRead:
        return LowerRead(e.read());
      default:
        return Bad();
    }
  }

  const std::string& body() const { return body_; }
  // Slots whose range helper (kc_read_range_<slot>) the body calls.
  const std::vector<int>& range_reads() const { return range_reads_; }

 private:
  static absl::Status Bad() {
    return absl::InvalidArgumentError(
        "mask expression does not type-check; validate the spec first");
  }
  static Value Float() { return Value{"", ExprType::kFloat}; }
  static std::string Call(const char* f, const Value& a) {
    return absl::StrCat(f, "(", a.text, ")");
  }
  static std::string Call(const char* f, const Value& a, const Value& b) {
    return absl::StrCat(f, "(", a.text, ", ", b.text, ")");
  }

  Value Emit(ExprType type, const std::string& rhs) {
    std::string name = absl::StrCat("r", n_++);
    absl::StrAppend(&body_, "  const ", type == ExprType::kInt ? "kc_ir " : "kc_br ", name, " = ",
                    rhs, ";\n");
    return Value{name, type};
  }

  absl::StatusOr<Value> LowerBinary(const v1::BinaryExpr& bin) {
    absl::StatusOr<Value> a = Lower(bin.lhs());
    if (!a.ok()) return a.status();
    absl::StatusOr<Value> b = Lower(bin.rhs());
    if (!b.ok()) return b.status();
    using Op = v1::BinaryExpr;
    const bool is_int = a->type == ExprType::kInt;
    const bool is_float = a->type == ExprType::kFloat;
    const auto cmp = [&](const char* f) -> Value {
      if (is_float) return Emit(ExprType::kBool, "kc_br{true, true}");
      return Emit(ExprType::kBool, Call(f, *a, *b));
    };
    switch (bin.op()) {
      case Op::OP_ADD:
        return is_int ? Emit(ExprType::kInt, Call("kc_ir_add", *a, *b)) : Float();
      case Op::OP_SUB:
        return is_int ? Emit(ExprType::kInt, Call("kc_ir_sub", *a, *b)) : Float();
      case Op::OP_MUL:
        return is_int ? Emit(ExprType::kInt, Call("kc_ir_mul", *a, *b)) : Float();
      case Op::OP_DIV:
        return Float();
      case Op::OP_MOD:
        return Emit(ExprType::kInt, Call("kc_ir_mod", *a, *b));
      case Op::OP_FLOORDIV:
        return Emit(ExprType::kInt, Call("kc_ir_floordiv", *a, *b));
      case Op::OP_MIN:
        return is_int ? Emit(ExprType::kInt, Call("kc_ir_min", *a, *b)) : Float();
      case Op::OP_MAX:
        return is_int ? Emit(ExprType::kInt, Call("kc_ir_max", *a, *b)) : Float();
      case Op::OP_EQ:
        return cmp("kc_ir_eq");
      case Op::OP_NE:
        return cmp("kc_ir_ne");
      case Op::OP_LT:
        return cmp("kc_ir_lt");
      case Op::OP_LE:
        return cmp("kc_ir_le");
      case Op::OP_GT:
        if (is_float) return cmp("");
        return Emit(ExprType::kBool, Call("kc_ir_lt", *b, *a));
      case Op::OP_GE:
        if (is_float) return cmp("");
        return Emit(ExprType::kBool, Call("kc_ir_le", *b, *a));
      case Op::OP_AND:
        return Emit(ExprType::kBool, absl::StrCat("kc_br{", a->text, ".t && ", b->text, ".t, ",
                                                  a->text, ".f || ", b->text, ".f}"));
      case Op::OP_OR:
        return Emit(ExprType::kBool, absl::StrCat("kc_br{", a->text, ".t || ", b->text, ".t, ",
                                                  a->text, ".f && ", b->text, ".f}"));
      default:
        return Bad();
    }
  }

  absl::StatusOr<Value> LowerRead(const v1::BufferRead& r) {
    auto it = buffers_->find(r.buffer());
    if (it == buffers_->end()) return Bad();
    const ExprBuffer& buf = it->second;
    ExprType type;
    if (!ElemTypeToExprType(buf.type, &type)) return Bad();
    std::vector<Value> index;
    for (const v1::Expr& i : r.index()) {
      absl::StatusOr<Value> v = Lower(i);
      if (!v.ok()) return v.status();
      index.push_back(*std::move(v));
    }
    if (type == ExprType::kFloat) return Float();
    if (std::find(range_reads_.begin(), range_reads_.end(), buf.slot) == range_reads_.end()) {
      range_reads_.push_back(buf.slot);
    }
    std::string call = absl::StrCat("kc_read_range_", buf.slot, "(p");
    for (const Value& v : index) absl::StrAppend(&call, ", ", v.text);
    return Emit(type, call + ")");
  }

  const ExprBufferTable* buffers_;
  std::string body_;
  int n_ = 0;
  std::vector<int> range_reads_;
};

// The interval helpers kc_expr_mask_tile's body calls.
constexpr const char* kRangeHelpers =
    R"(// Interval arithmetic for kc_expr_mask_tile (compiler/attention/expr_lower.cc).
struct kc_ir { kc_i64 lo, hi; };  // int32 values in [lo, hi]
struct kc_br { bool t, f; };      // may be true, may be false
__device__ __forceinline__ kc_ir kc_ir_fit(kc_i64 lo, kc_i64 hi) {
  // A value that may leave int32 wraps: then it may be anything.
  if (lo < -2147483648LL || hi > 2147483647LL) return kc_ir{-2147483648LL, 2147483647LL};
  return kc_ir{lo, hi};
}
__device__ __forceinline__ kc_ir kc_ir_c(kc_i64 v) { return kc_ir{v, v}; }
__device__ __forceinline__ kc_i64 kc_i64_min(kc_i64 a, kc_i64 b) { return a < b ? a : b; }
__device__ __forceinline__ kc_i64 kc_i64_max(kc_i64 a, kc_i64 b) { return a > b ? a : b; }
__device__ __forceinline__ kc_i64 kc_fdiv64(kc_i64 a, kc_i64 d) {  // d != 0
  const kc_i64 q = a / d;
  return (a % d != 0 && ((a < 0) != (d < 0))) ? q - 1 : q;
}
__device__ __forceinline__ kc_ir kc_ir_add(kc_ir a, kc_ir b) { return kc_ir_fit(a.lo + b.lo, a.hi + b.hi); }
__device__ __forceinline__ kc_ir kc_ir_sub(kc_ir a, kc_ir b) { return kc_ir_fit(a.lo - b.hi, a.hi - b.lo); }
__device__ __forceinline__ kc_ir kc_ir_mul(kc_ir a, kc_ir b) {
  const kc_i64 p0 = a.lo * b.lo, p1 = a.lo * b.hi, p2 = a.hi * b.lo, p3 = a.hi * b.hi;
  return kc_ir_fit(kc_i64_min(kc_i64_min(p0, p1), kc_i64_min(p2, p3)),
                   kc_i64_max(kc_i64_max(p0, p1), kc_i64_max(p2, p3)));
}
__device__ __forceinline__ kc_ir kc_ir_neg(kc_ir a) { return kc_ir_fit(-a.hi, -a.lo); }
__device__ __forceinline__ kc_ir kc_ir_abs(kc_ir a) {
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return kc_ir_fit(-a.hi, -a.lo);
  return kc_ir_fit(0, kc_i64_max(-a.lo, a.hi));
}
__device__ __forceinline__ kc_ir kc_ir_min(kc_ir a, kc_ir b) { return kc_ir{kc_i64_min(a.lo, b.lo), kc_i64_min(a.hi, b.hi)}; }
__device__ __forceinline__ kc_ir kc_ir_max(kc_ir a, kc_ir b) { return kc_ir{kc_i64_max(a.lo, b.lo), kc_i64_max(a.hi, b.hi)}; }
__device__ __forceinline__ kc_ir kc_ir_mod(kc_ir a, kc_ir m) {  // kc_imod: in [0, |m|), 0 for m == 0
  if (m.lo == m.hi) {
    const kc_i64 um = m.lo < 0 ? -m.lo : m.lo;
    if (um == 0) return kc_ir_c(0);
    const kc_i64 ql = kc_fdiv64(a.lo, um), qh = kc_fdiv64(a.hi, um);
    if (ql == qh) return kc_ir{a.lo - ql * um, a.hi - ql * um};
    return kc_ir{0, um - 1};
  }
  const kc_i64 um = kc_i64_max(m.lo < 0 ? -m.lo : m.lo, m.hi < 0 ? -m.hi : m.hi);
  return kc_ir{0, kc_i64_max(um - 1, 0)};
}
__device__ __forceinline__ kc_ir kc_ir_floordiv(kc_ir a, kc_ir d) {  // kc_ifloordiv
  if (d.lo != d.hi) return kc_ir{-2147483648LL, 2147483647LL};
  if (d.lo == 0) return kc_ir_c(0);
  if (d.lo > 0) return kc_ir_fit(kc_fdiv64(a.lo, d.lo), kc_fdiv64(a.hi, d.lo));
  return kc_ir_fit(kc_fdiv64(a.hi, d.lo), kc_fdiv64(a.lo, d.lo));
}
__device__ __forceinline__ kc_br kc_ir_lt(kc_ir a, kc_ir b) { return kc_br{a.lo < b.hi, a.hi >= b.lo}; }
__device__ __forceinline__ kc_br kc_ir_le(kc_ir a, kc_ir b) { return kc_br{a.lo <= b.hi, a.hi > b.lo}; }
__device__ __forceinline__ kc_br kc_ir_eq(kc_ir a, kc_ir b) {
  return kc_br{a.lo <= b.hi && b.lo <= a.hi, !(a.lo == a.hi && b.lo == b.hi && a.lo == b.lo)};
}
__device__ __forceinline__ kc_br kc_ir_ne(kc_ir a, kc_ir b) { const kc_br e = kc_ir_eq(a, b); return kc_br{e.f, e.t}; }
__device__ __forceinline__ kc_ir kc_ir_sel(kc_br c, kc_ir x, kc_ir y) {
  if (!c.f) return x;
  if (!c.t) return y;
  return kc_ir{kc_i64_min(x.lo, y.lo), kc_i64_max(x.hi, y.hi)};
}
__device__ __forceinline__ kc_br kc_br_sel(kc_br c, kc_br x, kc_br y) {
  if (!c.f) return x;
  if (!c.t) return y;
  return kc_br{x.t || y.t, x.f || y.f};
}
)";

// The range-read helper of one int or bool buffer slot: the values
// kc_read_<slot> gives over a box of indices, read one by one when the box
// holds at most 64 elements (e.g. the anchors of the blocks a query tile
// spans), else every value the type has.
std::string RangeReadHelper(int slot, ExprType type, uint32_t rank) {
  const bool is_bool = type == ExprType::kBool;
  std::string params, sizes, idx, args;
  for (uint32_t d = 0; d < rank; ++d) {
    absl::StrAppend(&params, ", kc_ir i", d);
    absl::StrAppend(&sizes, "  const kc_i64 n", d, " = i", d, ".hi - i", d, ".lo + 1;\n", "  if (n",
                    d, " > 64) return ",
                    is_bool ? "kc_br{true, true}" : "kc_ir{-2147483648LL, 2147483647LL}", ";\n",
                    "  n *= n", d, ";\n");
    absl::StrAppend(&sizes, "  const int m", d, " = static_cast<int>(n", d, ");\n");
  }
  for (uint32_t d = rank; d-- > 0;) {
    absl::StrAppend(&idx, "    const int j", d, " = static_cast<int>(i", d, ".lo) + rem % m", d,
                    ";\n    rem /= m", d, ";\n");
  }
  for (uint32_t d = 0; d < rank; ++d) absl::StrAppend(&args, ", j", d);
  return absl::StrCat(
      "__device__ __forceinline__ ", is_bool ? "kc_br" : "kc_ir", " kc_read_range_", slot,
      "(const kcache::AttentionParams& p", params, ") {\n", "  kc_i64 n = 1;\n", sizes,
      "  if (n > 64) return ", is_bool ? "kc_br{true, true}" : "kc_ir{-2147483648LL, 2147483647LL}",
      ";\n", is_bool ? "  kc_br r{false, false};\n" : "  kc_ir r{2147483647LL, -2147483648LL};\n",
      "  for (int k = 0; k < static_cast<int>(n); ++k) {\n    int rem = k;\n", idx,
      is_bool ? "    const bool v = kc_read_" : "    const kc_i64 v = kc_read_", slot, "(p", args,
      ");\n",
      is_bool ? "    r.t = r.t || v;\n    r.f = r.f || !v;\n"
              : "    r.lo = kc_i64_min(r.lo, v);\n    r.hi = kc_i64_max(r.hi, v);\n",
      "  }\n  return r;\n}\n");
}

// Parameters, bounds checks and element offset of a buffer access of
// `rank` indices, shared by the read and gradient helpers so that both
// address the same element under the same conditions.
struct IndexMath {
  std::string params;  // ", int i0, int i1"
  std::string checks;  // one early return per dimension
  std::string offset;  // the element offset, in elements
};
IndexMath MakeIndexMath(uint32_t rank, absl::string_view fail_return) {
  IndexMath m;
  for (uint32_t d = 0; d < rank; ++d) {
    absl::StrAppend(&m.params, ", int i", d);
    absl::StrAppend(&m.checks, "  if (i", d, " < 0 || static_cast<kc_i64>(i", d, ") >= buf.extent[",
                    d, "]) return", fail_return, ";\n");
    absl::StrAppend(&m.offset, d == 0 ? "" : " + ", "static_cast<kc_i64>(i", d, ") * buf.stride[",
                    d, "]");
  }
  return m;
}

// The bounds-checked read helper of one buffer slot.
std::string ReadHelper(int slot, ExprType type, uint32_t rank) {
  const char* zero = type == ExprType::kBool ? "false" : "0";
  const IndexMath m = MakeIndexMath(rank, absl::StrCat(" ", zero));
  std::string load;
  switch (type) {
    case ExprType::kInt:
      load = "static_cast<const kc_i32*>(buf.ptr)[off]";
      break;
    case ExprType::kFloat:
      load = "static_cast<const float*>(buf.ptr)[off]";
      break;
    case ExprType::kBool:
      load = "static_cast<const kc_i8*>(buf.ptr)[off] != 0";
      break;
  }
  return absl::StrCat("__device__ __forceinline__ ", CType(type), " kc_read_", slot,
                      "(const kcache::AttentionParams& p", m.params, ") {\n",
                      "  const kcache::KcBuffer& buf = p.buffers[", slot, "];\n",
                      "  if (buf.ptr == nullptr || buf.rank != ", rank, ") return ", zero, ";\n",
                      m.checks, "  const kc_i64 off = ", m.offset, ";\n", "  return ", load,
                      ";\n}\n");
}

// The gradient helper of one trainable float buffer: adds g into
// p.buffer_grads[slot] at the element kc_read_<slot> reads, exactly when
// that read is in range (a read that gives 0 has no gradient), and not at
// all for g == 0 (masked or saturated elements cost no atomic).
std::string GradHelper(int slot, uint32_t rank) {
  const IndexMath m = MakeIndexMath(rank, "");
  return absl::StrCat("__device__ __forceinline__ void kc_grad_", slot,
                      "(const kcache::AttentionParams& p, float g", m.params, ") {\n",
                      "  const kcache::KcBuffer& buf = p.buffers[", slot, "];\n",
                      "  float* const dst = p.buffer_grads[", slot, "];\n",
                      "  if (g == 0.0f || dst == nullptr || buf.ptr == nullptr || buf.rank != ",
                      rank, ") return;\n", m.checks, "  const kc_i64 off = ", m.offset, ";\n",
                      "  atomicAdd(dst + off, g);\n}\n");
}

// Reverse-mode differentiation of a lowered score expression: the statements
// that follow the forward body (the temporaries tN) in kc_expr_score_grad.
// The adjoint of tN is aN, that of `score` is ds; the root's adjoint is
// `grad`. Only temporaries on a differentiable path from the root to
// `score` or a trainable read get an adjoint. Rules: + - * / neg as usual;
// abs: sign (0 at 0); exp: the value; tanh: 1 - t^2; min/max: all to the
// operand the forward returned (the left one on ties); select: to the
// branch taken; reads of trainable buffers: kc_grad_<slot>; everything else
// (ints, bools, TO_FLOAT, constants, select conditions, indices) carries
// no gradient.
std::string ReverseSweep(const std::vector<TapeNode>& tape, const Value& root,
                         const std::vector<bool>& trainable_slot) {
  const size_t n = tape.size();
  std::vector<bool> varying(n, false);
  const auto is_varying = [&](const Value& v) {
    return v.score || (v.temp >= 0 && varying[static_cast<size_t>(v.temp)]);
  };
  // The operands a node's adjoint flows to.
  const auto diff_args = [](const TapeNode& t) -> std::vector<const Value*> {
    std::vector<const Value*> out;
    switch (t.op) {
      case DiffOp::kNone:
      case DiffOp::kRead:
        break;
      case DiffOp::kSelect:
        out = {&t.args[1], &t.args[2]};
        break;
      default:
        for (const Value& a : t.args) out.push_back(&a);
        break;
    }
    return out;
  };
  for (size_t k = 0; k < n; ++k) {
    const TapeNode& t = tape[k];
    if (t.op == DiffOp::kRead) {
      varying[k] = t.slot >= 0 && static_cast<size_t>(t.slot) < trainable_slot.size() &&
                   trainable_slot[static_cast<size_t>(t.slot)];
      continue;
    }
    for (const Value* a : diff_args(t)) varying[k] = varying[k] || is_varying(*a);
  }
  std::vector<bool> active(n, false);
  if (root.temp >= 0)
    active[static_cast<size_t>(root.temp)] = varying[static_cast<size_t>(root.temp)];
  for (size_t k = n; k-- > 0;) {
    if (!active[k]) continue;
    for (const Value* a : diff_args(tape[k])) {
      if (a->temp >= 0 && is_varying(*a)) active[static_cast<size_t>(a->temp)] = true;
    }
  }

  std::string out =
      "  // reverse sweep: aN = d(result)/d(tN) * grad, ds = d(result)/d(score) * grad\n";
  out += "  float ds = 0.0f;\n";
  if (root.score) out += "  ds += grad;\n";
  for (size_t k = 0; k < n; ++k) {
    if (!active[k]) continue;
    if (static_cast<int>(k) == root.temp) {
      absl::StrAppend(&out, "  const float a", k, " = grad;\n");
    } else {
      absl::StrAppend(&out, "  float a", k, " = 0.0f;\n");
    }
  }
  // `target op= rhs` for an operand that takes a gradient.
  const auto acc = [&](const Value& v, absl::string_view op, const std::string& rhs) {
    if (!is_varying(v)) return;
    absl::StrAppend(&out, "  ", v.score ? std::string("ds") : absl::StrCat("a", v.temp), " ", op,
                    " ", rhs, ";\n");
  };
  for (size_t k = n; k-- > 0;) {
    if (!active[k]) continue;
    const TapeNode& t = tape[k];
    const std::string g = absl::StrCat("a", k);
    const std::string tk = absl::StrCat("t", k);
    const auto arg = [&](size_t i) -> const Value& { return t.args[i]; };
    switch (t.op) {
      case DiffOp::kAdd:
        acc(arg(0), "+=", g);
        acc(arg(1), "+=", g);
        break;
      case DiffOp::kSub:
        acc(arg(0), "+=", g);
        acc(arg(1), "-=", g);
        break;
      case DiffOp::kMul:
        acc(arg(0), "+=", absl::StrCat(g, " * ", arg(1).text));
        acc(arg(1), "+=", absl::StrCat(g, " * ", arg(0).text));
        break;
      case DiffOp::kDiv:
        acc(arg(0), "+=", absl::StrCat(g, " / ", arg(1).text));
        acc(arg(1), "-=", absl::StrCat(g, " / ", arg(1).text, " * ", tk));
        break;
      case DiffOp::kNeg:
        acc(arg(0), "-=", g);
        break;
      case DiffOp::kAbs:
        acc(arg(0), "+=",
            absl::StrCat(arg(0).text, " > 0.0f ? ", g, " : (", arg(0).text, " < 0.0f ? -", g,
                         " : 0.0f)"));
        break;
      case DiffOp::kExp:
        acc(arg(0), "+=", absl::StrCat(g, " * ", tk));
        break;
      case DiffOp::kTanh:
        acc(arg(0), "+=", absl::StrCat(g, " * (1.0f - ", tk, " * ", tk, ")"));
        break;
      case DiffOp::kMin:
      case DiffOp::kMax:
        // fminf/fmaxf return one of their operands (the other one when one
        // is NaN): the gradient goes to the one returned.
        acc(arg(0), "+=", absl::StrCat(tk, " == ", arg(0).text, " ? ", g, " : 0.0f"));
        acc(arg(1), "+=", absl::StrCat(tk, " == ", arg(0).text, " ? 0.0f : ", g));
        break;
      case DiffOp::kSelect:
        acc(arg(1), "+=", absl::StrCat(arg(0).text, " ? ", g, " : 0.0f"));
        acc(arg(2), "+=", absl::StrCat(arg(0).text, " ? 0.0f : ", g));
        break;
      case DiffOp::kRead: {
        absl::StrAppend(&out, "  if (buffer_grads) kc_grad_", t.slot, "(p, ", g);
        for (const Value& i : t.args) absl::StrAppend(&out, ", ", i.text);
        out += ");\n";
        break;
      }
      case DiffOp::kNone:
        break;
    }
  }
  out += "  return ds;\n";
  return out;
}

constexpr const char* kImodHelper =
    "// Mathematical modulus in [0, |m|); 0 when m == 0. Unsigned arithmetic:\n"
    "// defined for INT_MIN too.\n"
    "__device__ __forceinline__ int kc_imod(int a, int m) {\n"
    "  const unsigned um = m < 0 ? 0u - static_cast<unsigned>(m) : static_cast<unsigned>(m);\n"
    "  if (um == 0u) return 0;\n"
    "  if (a >= 0) return static_cast<int>(static_cast<unsigned>(a) % um);\n"
    "  const unsigned r = (0u - static_cast<unsigned>(a)) % um;\n"
    "  return r == 0u ? 0 : static_cast<int>(um - r);\n"
    "}\n";

constexpr const char* kIfloordivHelper =
    "// Floor division (Python's //); 0 when d == 0; INT_MIN // -1 wraps to\n"
    "// INT_MIN. 32-bit only (a constant divisor becomes a multiply and shift).\n"
    "__device__ __forceinline__ int kc_ifloordiv(int a, int d) {\n"
    "  if (d == 0) return 0;\n"
    "  if (d == -1) return static_cast<int>(0u - static_cast<unsigned>(a));\n"
    "  const int q = a / d;\n"
    "  return (q * d != a && ((a < 0) != (d < 0))) ? q - 1 : q;\n"
    "}\n";

}  // namespace

// The mask predicate split for the kernels' per-row data (KC_EXPR_MASK_ROW):
// kc_expr_mask_row computes the temporaries that depend on the query row
// alone (b, h, q_idx: buffer reads such as window[h] or anchors[b, q / 16],
// divisions of q_idx) once per row and packs those the rest reads into an
// int4; kc_expr_mask_rd finishes the predicate for one key from it. The
// kernels evaluate a partial tile per element, and without the split every
// element repeated the row's buffer reads (the compiler does not merge
// loads across the tile's inline assembly). Empty (no split) when nothing
// row-only is read or more than four values would need packing.
// kc_expr_mask, the unsplit predicate, stays for every other caller and as
// the reference the split is tested against.
std::string MaskRowFunctions(const std::vector<Node>& nodes, const Value& root,
                             absl::string_view unused) {
  if (root.temp < 0) return "";
  const auto row_only = [&](int t) {
    return (nodes[static_cast<size_t>(t)].deps & (kDepKv | kDepScore)) == 0;
  };
  std::vector<int> packed;
  const auto pack = [&](int t) {
    if (std::find(packed.begin(), packed.end(), t) == packed.end()) packed.push_back(t);
  };
  for (int t = 0; t < static_cast<int>(nodes.size()); ++t) {
    if (row_only(t)) continue;
    for (int u : nodes[static_cast<size_t>(t)].uses) {
      if (row_only(u)) pack(u);
    }
  }
  if (row_only(root.temp)) pack(root.temp);
  if (packed.empty() || packed.size() > 4) return "";
  std::sort(packed.begin(), packed.end());
  std::string row, rd, fields[4] = {"0", "0", "0", "0"};
  static constexpr const char* kLane[4] = {"x", "y", "z", "w"};
  for (int t = 0; t < static_cast<int>(nodes.size()); ++t) {
    if (row_only(t) && t <= packed.back())
      absl::StrAppend(&row, nodes[static_cast<size_t>(t)].line);
  }
  for (size_t i = 0; i < packed.size(); ++i) {
    const Node& n = nodes[static_cast<size_t>(packed[i])];
    const std::string name = absl::StrCat("t", packed[i]);
    const std::string lane = absl::StrCat("r.", kLane[i]);
    switch (n.type) {
      case ExprType::kInt:
        fields[i] = name;
        absl::StrAppend(&rd, "  const int ", name, " = ", lane, ";\n");
        break;
      case ExprType::kBool:
        fields[i] = absl::StrCat(name, " ? 1 : 0");
        absl::StrAppend(&rd, "  const bool ", name, " = ", lane, " != 0;\n");
        break;
      case ExprType::kFloat:
        fields[i] = absl::StrCat("__float_as_int(", name, ")");
        absl::StrAppend(&rd, "  const float ", name, " = __int_as_float(", lane, ");\n");
        break;
    }
  }
  for (int t = 0; t < static_cast<int>(nodes.size()); ++t) {
    if (!row_only(t)) absl::StrAppend(&rd, nodes[static_cast<size_t>(t)].line);
  }
  return absl::StrCat(
      "__device__ __forceinline__ int4 kc_expr_mask_row(int b, int h, int q_idx,\n"
      "                                                 const kcache::AttentionParams& p) {\n"
      "  (void)b; (void)h; (void)q_idx; (void)p;\n",
      row, "  return int4{", fields[0], ", ", fields[1], ", ", fields[2], ", ", fields[3],
      "};\n}\n",
      "__device__ __forceinline__ bool kc_expr_mask_rd(int4 r, int b, int h, int q_idx, int "
      "kv_idx,\n"
      "                                                const kcache::AttentionParams& p) {\n",
      unused, rd, "  return ", root.text, ";\n}\n");
}

std::string HexFloatLiteral(float v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%af", static_cast<double>(v));
  return buf;
}

std::string IntLiteral(int v) {
  if (v == INT_MIN) return "(-2147483647 - 1)";
  if (v < 0) return absl::StrCat("(", v, ")");
  return absl::StrCat(v);
}

absl::StatusOr<std::string> LowerSpecExpressions(const v1::AttentionSpec& spec) {
  const bool mask_expr = spec.mask().has_expr();
  const bool score_expr = spec.score_mod().has_expr();
  if (!mask_expr && !score_expr) return std::string();
  const ExprBufferTable buffers = BuildBufferTable(spec);
  // Slots whose reads get a gradient: float32 buffers declared trainable,
  // in a spec with the backward pass.
  std::vector<bool> trainable_slot(static_cast<size_t>(spec.buffers_size()), false);
  for (int i = 0; i < spec.buffers_size(); ++i) {
    trainable_slot[static_cast<size_t>(i)] = spec.backward() && score_expr &&
                                             spec.buffers(i).trainable() &&
                                             spec.buffers(i).type() == v1::ELEM_TYPE_FLOAT32;
  }

  std::string functions;
  std::string defines;
  std::string range;
  bool uses_imod = false;
  bool uses_ifloordiv = false;
  const char* kUnused = "  (void)b; (void)h; (void)q_idx; (void)kv_idx; (void)p;\n";
  if (mask_expr) {
    Lowerer l(&buffers, /*score_allowed=*/false);
    absl::StatusOr<Value> v = l.Lower(spec.mask().expr().predicate());
    if (!v.ok()) return v.status();
    if (v->type != ExprType::kBool) {
      return absl::InvalidArgumentError("mask expression is not bool; validate the spec first");
    }
    uses_imod |= l.uses_imod();
    uses_ifloordiv |= l.uses_ifloordiv();
    // Tile classes of a mask that does not read b (h) are computed for
    // b = 0 (h = 0) only and shared (kernels/attention_fwd.cuh).
    const std::string row_functions = MaskRowFunctions(l.nodes(), *v, kUnused);
    absl::StrAppend(&defines, "#define KC_EXPR_MASK_READS_B ", l.reads_b() ? 1 : 0, "\n",
                    "#define KC_EXPR_MASK_READS_H ", l.reads_h() ? 1 : 0, "\n",
                    "#define KC_EXPR_MASK_TILE 1\n", "#define KC_EXPR_MASK_ROW ",
                    row_functions.empty() ? 0 : 1, "\n");
    RangeLowerer rl(&buffers);
    absl::StatusOr<Value> rv = rl.Lower(spec.mask().expr().predicate());
    if (!rv.ok()) return rv.status();
    range = kRangeHelpers;
    for (int slot : rl.range_reads()) {
      ExprType t;
      if (!ElemTypeToExprType(spec.buffers(slot).type(), &t)) {
        return absl::InvalidArgumentError("buffer without element type; validate the spec first");
      }
      absl::StrAppend(&range, RangeReadHelper(slot, t, spec.buffers(slot).rank()));
    }
    absl::StrAppend(
        &range,
        "// 0: the mask is false on every pair of the tile q in [q0, q1], kv in\n"
        "// [kv0, kv1]; 2: true on every pair; 1: not known without evaluating it\n"
        "// per element.\n"
        "__device__ __forceinline__ int kc_expr_mask_tile(int b, int h, int q0, int q1, int kv0,\n"
        "                                                 int kv1, const kcache::AttentionParams& "
        "p) {\n"
        "  (void)b; (void)h; (void)q0; (void)q1; (void)kv0; (void)kv1; (void)p;\n",
        rl.body(), "  return !", rv->text, ".f ? 2 : (!", rv->text, ".t ? 0 : 1);\n}\n");
    absl::StrAppend(&functions,
                    "__device__ __forceinline__ bool kc_expr_mask(int b, int h, int q_idx, "
                    "int kv_idx,\n"
                    "                                             const kcache::AttentionParams& "
                    "p) {\n",
                    kUnused, l.body(), "  return ", v->text, ";\n}\n", row_functions);
  }
  if (score_expr) {
    Lowerer l(&buffers, /*score_allowed=*/true);
    absl::StatusOr<Value> v = l.Lower(spec.score_mod().expr().value());
    if (!v.ok()) return v.status();
    if (v->type != ExprType::kFloat) {
      return absl::InvalidArgumentError("score expression is not float; validate the spec first");
    }
    uses_imod |= l.uses_imod();
    absl::StrAppend(&functions,
                    "__device__ __forceinline__ float kc_expr_score(float score, int b, int h, "
                    "int q_idx, int kv_idx,\n"
                    "                                               const "
                    "kcache::AttentionParams& p) {\n",
                    "  (void)score;\n", kUnused, l.body(), "  return ", v->text, ";\n}\n");
    if (spec.backward()) {
      // The forward body again, verbatim (so values agree with
      // kc_expr_score bit for bit), then the reverse sweep.
      absl::StrAppend(
          &functions,
          "__device__ __forceinline__ float kc_expr_score_grad(float score, float grad, "
          "int b, int h,\n"
          "                                                    int q_idx, int kv_idx,\n"
          "                                                    const "
          "kcache::AttentionParams& p,\n"
          "                                                    bool buffer_grads) {\n",
          "  (void)score; (void)grad; (void)buffer_grads;\n", kUnused, l.body());
      if (v->temp >= 0) absl::StrAppend(&functions, "  (void)", v->text, ";\n");
      absl::StrAppend(&functions, ReverseSweep(l.tape(), *v, trainable_slot), "}\n");
    }
  }

  std::string out = "// --- generated from the spec's expression trees ---\n" + defines;
  for (int i = 0; i < spec.buffers_size(); ++i) {
    ExprType t;
    if (!ElemTypeToExprType(spec.buffers(i).type(), &t)) {
      return absl::InvalidArgumentError("buffer without element type; validate the spec first");
    }
    absl::StrAppend(&out, ReadHelper(i, t, spec.buffers(i).rank()));
    if (trainable_slot[static_cast<size_t>(i)]) {
      absl::StrAppend(&out, GradHelper(i, spec.buffers(i).rank()));
    }
  }
  if (uses_imod) out += kImodHelper;
  if (uses_ifloordiv) out += kIfloordivHelper;
  out += functions;
  out += range;
  return out;
}

}  // namespace kcache::attention
