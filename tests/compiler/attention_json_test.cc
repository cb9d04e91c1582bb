// Specs as JSON and their one-line descriptions.
#include <string>

#include "absl/status/status.h"
#include "compiler/attention/spec_canonical.h"
#include "compiler/attention/spec_json.h"
#include "compiler/attention/spec_normalize.h"
#include "compiler/attention/spec_validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/compiler/attention_test_util.h"

namespace kcache::attention {
namespace {

using ::testing::HasSubstr;
using namespace ::kcache::attention::testing;  // NOLINT: test helpers

std::string KeyOf(const std::string& json) {
  absl::StatusOr<v1::AttentionSpec> s = ParseSpecJson(json);
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(ValidateAttentionSpec(*s).ok()) << ValidateAttentionSpec(*s);
  return CanonicalSpecBytes(NormalizeAttentionSpec(*s));
}

TEST(SpecJsonTest, FieldOrderNamesAndDefaultsDoNotChangeTheKey) {
  const std::string a = KeyOf(
      R"({"dtype":"DTYPE_BF16","head_dim_qk":128,"num_q_heads":32,"num_kv_heads":8,
          "mask":{"causal":{}},"score_mod":{"softcap":{"cap":30}}})");
  const std::string b = KeyOf(
      R"({"scoreMod":{"softcap":{"cap":30.0}},"mask":{"causal":{"alignment":"CAUSAL_ALIGNMENT_TOP_LEFT"}},
          "numKvHeads":8,"numQHeads":32,"headDimV":128,"headDimQk":128,"dtype":1,
          "softmaxScale":0,"backward":false,"tuning":{}})");
  EXPECT_EQ(a, b);
}

TEST(SpecJsonTest, BufferOrderInJsonDoesNotChangeTheKey) {
  const std::string mask =
      R"("mask":{"expr":{"predicate":{"binary":{"op":"OP_EQ",
          "lhs":{"read":{"buffer":"q_doc","index":[{"index":"INDEX_VAR_B"},{"index":"INDEX_VAR_Q_IDX"}]}},
          "rhs":{"read":{"buffer":"kv_doc","index":[{"index":"INDEX_VAR_B"},{"index":"INDEX_VAR_KV_IDX"}]}}}}}})";
  const std::string a = KeyOf(R"({"dtype":"DTYPE_FP16","head_dim_qk":64,"num_q_heads":8,)" + mask +
                              R"(,"buffers":[{"name":"q_doc","type":"ELEM_TYPE_INT32","rank":2},
                     {"name":"kv_doc","type":"ELEM_TYPE_INT32","rank":2}]})");
  const std::string b = KeyOf(
      R"({"buffers":[{"name":"kv_doc","type":"ELEM_TYPE_INT32","rank":2},
                     {"rank":2,"type":"ELEM_TYPE_INT32","name":"q_doc"}],
          "num_q_heads":8,"head_dim_qk":64,"dtype":"DTYPE_FP16",)" +
      mask + "}");
  EXPECT_EQ(a, b);
}

TEST(SpecJsonTest, ErrorsAreInvalidArgument) {
  for (const char* bad : {"", "{", R"({"dtype":"DTYPE_BF32"})", R"({"no_such_field":1})",
                          R"({"head_dim_qk":"many"})", "[1,2]"}) {
    absl::StatusOr<v1::AttentionSpec> s = ParseSpecJson(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("spec JSON: ")) << bad;
  }
}

TEST(SpecJsonTest, RoundTrip) {
  v1::AttentionSpec s = BaseSpec();
  s.mutable_mask()->mutable_drafter()->set_block_size(16);
  s.set_backward(true);
  absl::StatusOr<v1::AttentionSpec> back = ParseSpecJson(SpecToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), s.SerializeAsString());
}

TEST(DescribeSpecTest, OneLine) {
  v1::AttentionSpec s = BaseSpec();
  s.mutable_mask()->mutable_causal();
  s.mutable_score_mod()->mutable_softcap()->set_cap(30);
  s.set_return_lse(true);
  EXPECT_EQ(DescribeSpec(s), "bf16 d128 h32/8 causal(top-left) softcap=30 lse");
  EXPECT_EQ(DescribeSpec(NormalizeAttentionSpec(s)), DescribeSpec(s));

  v1::AttentionSpec d = BaseSpec();
  d.set_dtype(v1::DTYPE_FP16);
  d.set_head_dim_v(64);
  d.set_num_kv_heads(32);
  d.mutable_mask()->mutable_drafter()->set_block_size(16);
  d.mutable_mask()->mutable_drafter()->set_causal_within_block(true);
  d.set_backward(true);
  d.set_deterministic(true);
  d.set_softmax_scale(0.5f);
  EXPECT_EQ(DescribeSpec(d), "fp16 d128/64 h32 drafter(block=16,causal) scale=0.5 lse bwd det");

  v1::AttentionSpec w = BaseSpec();
  w.mutable_mask()->mutable_sliding_window()->set_left(-1);
  w.mutable_mask()->mutable_sliding_window()->set_right(128);
  *w.add_buffers() = Buffer("Bad\nName", v1::ELEM_TYPE_FLOAT32, 1);
  EXPECT_EQ(DescribeSpec(w), "bf16 d128 h32/8 window(inf,128,top-left) buffers=?");
}

}  // namespace
}  // namespace kcache::attention
