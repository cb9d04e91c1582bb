// JSON parsing and one-line descriptions of attention specs. The protobuf
// JSON error type is converted to absl::Status here and nowhere else.
#include "compiler/attention/spec_json.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace kcache::attention {
namespace {

const char* AlignmentName(v1::CausalAlignment a) {
  return a == v1::CAUSAL_ALIGNMENT_BOTTOM_RIGHT ? "bottom-right" : "top-left";
}

std::string Extent(int v) { return v < 0 ? std::string("inf") : absl::StrCat(v); }

// %g-like shortest form, enough for a human.
std::string Num(float v) { return absl::StrCat(v); }

bool PrintableName(const std::string& n) {
  if (n.empty() || n.size() > 32) return false;
  for (char c : n) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::AttentionSpec> ParseSpecJson(absl::string_view json) {
  v1::AttentionSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec JSON: ", status.message().ToString()));
  }
  return spec;
}

std::string SpecToJson(const v1::AttentionSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(spec, &out, options);
  if (!status.ok()) return absl::StrCat("{\"error\": \"", status.message().ToString(), "\"}");
  return out;
}

std::string DescribeSpec(const v1::AttentionSpec& s) {
  std::string out;
  switch (s.dtype()) {
    case v1::DTYPE_BF16:
      out = "bf16";
      break;
    case v1::DTYPE_FP16:
      out = "fp16";
      break;
    default:
      out = "dtype?";
  }
  const uint32_t dv = s.head_dim_v() != 0 ? s.head_dim_v() : s.head_dim_qk();
  absl::StrAppend(&out, " d", s.head_dim_qk());
  if (dv != s.head_dim_qk()) absl::StrAppend(&out, "/", dv);
  const uint32_t kv = s.num_kv_heads() != 0 ? s.num_kv_heads() : s.num_q_heads();
  absl::StrAppend(&out, " h", s.num_q_heads());
  if (kv != s.num_q_heads()) absl::StrAppend(&out, "/", kv);

  const v1::MaskSpec& m = s.mask();
  switch (m.kind_case()) {
    case v1::MaskSpec::kCausal:
      absl::StrAppend(&out, " causal(", AlignmentName(m.causal().alignment()), ")");
      break;
    case v1::MaskSpec::kSlidingWindow:
      absl::StrAppend(&out, " window(", Extent(m.sliding_window().left()), ",",
                      Extent(m.sliding_window().right()), ",",
                      AlignmentName(m.sliding_window().alignment()), ")");
      break;
    case v1::MaskSpec::kDocument:
      absl::StrAppend(&out, m.document().causal() ? " document(causal)" : " document");
      break;
    case v1::MaskSpec::kDrafter:
      absl::StrAppend(&out, " drafter(block=", m.drafter().block_size());
      if (m.drafter().causal_within_block()) out += ",causal";
      if (m.drafter().context_window() > 0) {
        absl::StrAppend(&out, ",window=", m.drafter().context_window());
      }
      out += ")";
      break;
    case v1::MaskSpec::kExpr:
      out += " mask=expr";
      break;
    default:
      break;
  }
  const v1::ScoreMod& sm = s.score_mod();
  switch (sm.kind_case()) {
    case v1::ScoreMod::kSoftcap:
      absl::StrAppend(&out, " softcap=", Num(sm.softcap().cap()));
      break;
    case v1::ScoreMod::kAlibi:
      out += " alibi";
      break;
    case v1::ScoreMod::kExpr:
      out += " score=expr";
      break;
    default:
      break;
  }
  if (s.softmax_scale() != 0.0f && s.head_dim_qk() != 0 &&
      s.softmax_scale() !=
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim_qk())))) {
    absl::StrAppend(&out, " scale=", Num(s.softmax_scale()));
  }
  if (s.return_lse() || s.backward()) out += " lse";
  if (s.backward()) out += " bwd";
  if (s.backward() && s.deterministic()) out += " det";
  if (s.buffers_size() > 0) {
    out += " buffers=";
    for (int i = 0; i < s.buffers_size(); ++i) {
      const v1::BufferDecl& b = s.buffers(i);
      if (i > 0) out += ",";
      out += PrintableName(b.name()) ? b.name() : std::string("?");
      if (b.trainable()) out += "*";
    }
  }
  const v1::Tuning& t = s.tuning();
  if (t.block_m() || t.block_n() || t.num_warps() || t.stages()) {
    absl::StrAppend(&out, " tiles=", t.block_m(), "x", t.block_n(), "/w", t.num_warps(), "/s",
                    t.stages());
  }
  return out;
}

}  // namespace kcache::attention
