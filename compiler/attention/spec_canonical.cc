// The canonical encoding of normalized attention specs (layout in
// spec_canonical.h). Tags are the proto field numbers, which proto's own
// compatibility rules already keep stable; the order below is fixed and is
// part of kCanonicalSpecVersion.
#include "compiler/attention/spec_canonical.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace kcache::attention {
namespace {

void PutU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A message body under construction.
class Body {
 public:
  void Field(uint16_t tag, char kind, absl::string_view payload) {
    PutU16(&out_, tag);
    out_.push_back(kind);
    PutU32(&out_, static_cast<uint32_t>(payload.size()));
    out_.append(payload.data(), payload.size());
  }
  void U32(uint16_t tag, uint32_t v) {
    std::string p;
    PutU32(&p, v);
    Field(tag, 'u', p);
  }
  void Enum(uint16_t tag, int v) { U32(tag, static_cast<uint32_t>(v)); }
  void I32(uint16_t tag, int32_t v) {
    std::string p;
    PutU32(&p, static_cast<uint32_t>(v));
    Field(tag, 'i', p);
  }
  void F32(uint16_t tag, float v) {
    uint32_t bits;
    static_assert(sizeof(bits) == sizeof(v));
    std::memcpy(&bits, &v, sizeof(bits));
    std::string p;
    PutU32(&p, bits);
    Field(tag, 'f', p);
  }
  void Bool(uint16_t tag, bool v) { Field(tag, 'b', absl::string_view(v ? "\x01" : "\x00", 1)); }
  void Str(uint16_t tag, absl::string_view v) { Field(tag, 's', v); }
  void Msg(uint16_t tag, const Body& b) { Field(tag, 'm', b.out_); }
  // A oneof: the set member's tag (0 if none), then the member as a field.
  void Oneof(uint16_t tag, uint16_t member_tag, const Body& member) {
    std::string p;
    PutU16(&p, member_tag);
    if (member_tag != 0) {
      Body m;
      m.Msg(member_tag, member);
      p.append(m.out_);
    }
    Field(tag, 'o', p);
  }
  void Repeated(uint16_t tag, const std::vector<Body>& elems) {
    std::string p;
    PutU32(&p, static_cast<uint32_t>(elems.size()));
    for (const Body& e : elems) {
      Body w;
      w.Msg(0, e);
      p.append(w.out_);
    }
    Field(tag, 'r', p);
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

// A scalar oneof member is wrapped in a one-field body with tag 1.
Body Scalar(auto put) {
  Body b;
  put(b);
  return b;
}

Body EncodeExpr(const v1::Expr& e);

Body EncodeOptionalExpr(bool has, const v1::Expr& e) {
  // Validation guarantees presence; an absent operand encodes as an empty
  // node so that the encoding stays total.
  return has ? EncodeExpr(e) : EncodeExpr(v1::Expr());
}

Body EncodeExpr(const v1::Expr& e) {
  Body node;
  uint16_t member = static_cast<uint16_t>(e.node_case());
  switch (e.node_case()) {
    case v1::Expr::kIndex:
      node = Scalar([&](Body& b) { b.Enum(1, e.index()); });
      break;
    case v1::Expr::kIntConst:
      node = Scalar([&](Body& b) { b.I32(1, e.int_const()); });
      break;
    case v1::Expr::kFloatConst:
      node = Scalar([&](Body& b) { b.F32(1, e.float_const()); });
      break;
    case v1::Expr::kBoolConst:
      node = Scalar([&](Body& b) { b.Bool(1, e.bool_const()); });
      break;
    case v1::Expr::kScore:
      // The value is ignored by the kernel, so it is not part of the key.
      break;
    case v1::Expr::kUnary:
      node.Enum(1, e.unary().op());
      node.Msg(2, EncodeOptionalExpr(e.unary().has_arg(), e.unary().arg()));
      break;
    case v1::Expr::kBinary:
      node.Enum(1, e.binary().op());
      node.Msg(2, EncodeOptionalExpr(e.binary().has_lhs(), e.binary().lhs()));
      node.Msg(3, EncodeOptionalExpr(e.binary().has_rhs(), e.binary().rhs()));
      break;
    case v1::Expr::kSelect:
      node.Msg(1, EncodeOptionalExpr(e.select().has_cond(), e.select().cond()));
      node.Msg(2, EncodeOptionalExpr(e.select().has_if_true(), e.select().if_true()));
      node.Msg(3, EncodeOptionalExpr(e.select().has_if_false(), e.select().if_false()));
      break;
    case v1::Expr::kRead: {
      node.Str(1, e.read().buffer());
      std::vector<Body> idx;
      for (const v1::Expr& i : e.read().index()) idx.push_back(EncodeExpr(i));
      node.Repeated(2, idx);
      break;
    }
    case v1::Expr::NODE_NOT_SET:
      member = 0;
      break;
  }
  Body out;
  out.Oneof(1, member, node);
  return out;
}

Body EncodeMask(const v1::MaskSpec& m) {
  Body kind;
  switch (m.kind_case()) {
    case v1::MaskSpec::kNone:
    case v1::MaskSpec::KIND_NOT_SET:
      break;
    case v1::MaskSpec::kCausal:
      kind.Enum(1, m.causal().alignment());
      break;
    case v1::MaskSpec::kSlidingWindow:
      kind.I32(1, m.sliding_window().left());
      kind.I32(2, m.sliding_window().right());
      kind.Enum(3, m.sliding_window().alignment());
      break;
    case v1::MaskSpec::kDocument:
      kind.Bool(1, m.document().causal());
      break;
    case v1::MaskSpec::kDrafter:
      kind.U32(1, m.drafter().block_size());
      kind.Bool(2, m.drafter().causal_within_block());
      kind.I32(3, m.drafter().context_window());
      break;
    case v1::MaskSpec::kExpr:
      kind.Msg(1, EncodeOptionalExpr(m.expr().has_predicate(), m.expr().predicate()));
      break;
  }
  Body out;
  // Unset and none are one kernel: both encode as none (normalization also
  // fills none in).
  const uint16_t member = m.kind_case() == v1::MaskSpec::KIND_NOT_SET
                              ? static_cast<uint16_t>(v1::MaskSpec::kNone)
                              : static_cast<uint16_t>(m.kind_case());
  out.Oneof(1, member, kind);
  return out;
}

Body EncodeScoreMod(const v1::ScoreMod& s) {
  Body kind;
  switch (s.kind_case()) {
    case v1::ScoreMod::kNone:
    case v1::ScoreMod::KIND_NOT_SET:
    case v1::ScoreMod::kAlibi:
      break;
    case v1::ScoreMod::kSoftcap:
      kind.F32(1, s.softcap().cap());
      break;
    case v1::ScoreMod::kExpr:
      kind.Msg(1, EncodeOptionalExpr(s.expr().has_value(), s.expr().value()));
      break;
  }
  Body out;
  const uint16_t member = s.kind_case() == v1::ScoreMod::KIND_NOT_SET
                              ? static_cast<uint16_t>(v1::ScoreMod::kNone)
                              : static_cast<uint16_t>(s.kind_case());
  out.Oneof(1, member, kind);
  return out;
}

}  // namespace

std::string CanonicalSpecBytes(const v1::AttentionSpec& s) {
  Body spec;
  spec.Enum(1, s.dtype());
  spec.U32(2, s.head_dim_qk());
  spec.U32(3, s.head_dim_v());
  spec.U32(4, s.num_q_heads());
  spec.U32(5, s.num_kv_heads());
  spec.F32(6, s.softmax_scale());
  spec.Msg(7, EncodeMask(s.mask()));
  spec.Msg(8, EncodeScoreMod(s.score_mod()));
  std::vector<Body> buffers;
  for (const v1::BufferDecl& d : s.buffers()) {
    Body b;
    b.Str(1, d.name());
    b.Enum(2, d.type());
    b.U32(3, d.rank());
    b.Bool(4, d.trainable());
    buffers.push_back(std::move(b));
  }
  spec.Repeated(9, buffers);
  spec.Bool(10, s.backward());
  spec.Bool(11, s.return_lse());
  spec.Bool(12, s.deterministic());
  Body tuning;
  tuning.U32(1, s.tuning().block_m());
  tuning.U32(2, s.tuning().block_n());
  tuning.U32(3, s.tuning().num_warps());
  tuning.U32(4, s.tuning().stages());
  spec.Msg(13, tuning);

  std::string out = "kcspec";
  PutU32(&out, kCanonicalSpecVersion);
  out.append(spec.bytes());
  return out;
}

}  // namespace kcache::attention
