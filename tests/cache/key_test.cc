// Store keys: layout, determinism, toolchain ranges, hex forms.
#include "cache/key.h"

#include "cache/digest.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::MakeToolchain;
using ::kcache::testing::StatusIs;

KeyParts Parts(const v1::Toolchain& t, std::string_view spec = "spec",
               std::string_view arch = "sm_90a") {
  static const std::string digest = ToHex(Sha256("templates"));
  return KeyParts{spec, digest, &t, arch};
}

TEST(KeyTest, LayoutIsVersionToolchainIdHash) {
  auto t = MakeToolchain();
  auto key = ComputeKey(Parts(t));
  ASSERT_TRUE(key.ok()) << key.status();
  ASSERT_EQ(key->size(), kKeySize);
  EXPECT_EQ(static_cast<uint8_t>((*key)[0]), kKeyFormatVersion);
  EXPECT_EQ(KeyToolchainId(*key), ToolchainId(t));
  EXPECT_EQ(ToolchainIdHex(t).size(), 16u);
  EXPECT_TRUE(ValidateKey(*key).ok());
}

TEST(KeyTest, DeterministicAndSensitiveToEveryInput) {
  auto t = MakeToolchain();
  std::string base = *ComputeKey(Parts(t));
  EXPECT_EQ(base, *ComputeKey(Parts(t)));
  EXPECT_NE(base, *ComputeKey(Parts(t, "spec2")));
  EXPECT_NE(base, *ComputeKey(Parts(t, "spec", "sm_90")));
  auto t2 = t;
  t2.add_options("-lineinfo");
  EXPECT_NE(base, *ComputeKey(Parts(t2)));
  EXPECT_NE(ToolchainId(t), ToolchainId(t2));
  auto t3 = t;
  t3.set_version("12.8");
  EXPECT_NE(ToolchainId(t), ToolchainId(t3));
  // The id field is an output, not an input.
  auto t4 = t;
  t4.set_id("ffff");
  EXPECT_EQ(base, *ComputeKey(Parts(t4)));
  // Field boundaries matter: ("ab","c") != ("a","bc").
  v1::Toolchain a = t, b = t;
  a.set_version("1");
  a.set_build("23");
  b.set_version("12");
  b.set_build("3");
  EXPECT_NE(ToolchainId(a), ToolchainId(b));
  v1::Toolchain c = t, d = t;
  c.clear_options();
  c.add_options("ab");
  d.clear_options();
  d.add_options("a");
  d.add_options("b");
  EXPECT_NE(ToolchainId(c), ToolchainId(d));
}

TEST(KeyTest, RejectsBadInputsNamingTheField) {
  auto t = MakeToolchain();
  KeyParts p = Parts(t);
  p.spec_canonical = "";
  EXPECT_THAT(ComputeKey(p), StatusIs(absl::StatusCode::kInvalidArgument));
  p = Parts(t);
  p.template_digest = "abc";
  auto s = ComputeKey(p);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("template_digest"));
  p = Parts(t, "spec", "sm 90");
  EXPECT_THAT(ComputeKey(p), StatusIs(absl::StatusCode::kInvalidArgument));
  p = Parts(t);
  p.toolchain = nullptr;
  EXPECT_THAT(ComputeKey(p), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(KeyTest, ToolchainRangeHoldsExactlyItsKeys) {
  auto t = MakeToolchain("13.0");
  auto other = MakeToolchain("12.8");
  KeyRange r = ToolchainRange(ToolchainId(t));
  for (int i = 0; i < 50; ++i) {
    std::string spec = "spec" + std::to_string(i);
    std::string k = *ComputeKey(Parts(t, spec));
    EXPECT_TRUE(k >= r.begin && k < r.end);
    std::string o = *ComputeKey(Parts(other, spec));
    EXPECT_FALSE(o >= r.begin && o < r.end);
  }
  EXPECT_EQ(PrefixSuccessor(std::string("\x01\xff", 2)), std::string("\x02"));
  EXPECT_EQ(PrefixSuccessor(std::string("\xff\xff", 2)), "");
}

TEST(KeyTest, HexRoundTripAndPrefixes) {
  auto t = MakeToolchain();
  std::string k = *ComputeKey(Parts(t));
  std::string hex = KeyToHex(k);
  EXPECT_EQ(hex.size(), 2 * kKeySize);
  EXPECT_EQ(*FromHex(hex), k);
  EXPECT_THAT(FromHex("zz"), StatusIs(absl::StatusCode::kInvalidArgument));
  // Hex of what is not a key of this format: too short, another key version.
  EXPECT_THAT(ValidateKey(*FromHex(hex.substr(2))), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateKey(*FromHex("02" + hex.substr(2))),
              StatusIs(absl::StatusCode::kInvalidArgument));
  for (size_t n : {1u, 2u, 7u, 18u, 82u}) {
    auto p = ParseHexKeyPrefix(hex.substr(0, n));
    ASSERT_TRUE(p.ok()) << n;
    EXPECT_TRUE(p->Matches(k)) << n;
  }
  auto p = ParseHexKeyPrefix(hex.substr(0, 11));
  std::string other = k;
  other[5] ^= 0x10;  // differs in the high nibble of byte 5 = the 11th hex digit
  EXPECT_FALSE(p->Matches(other));
  EXPECT_THAT(ParseHexKeyPrefix(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseHexKeyPrefix("xy"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseToolchainIdHex("abc"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(*ParseToolchainIdHex(ToolchainIdHex(t)), ToolchainId(t));
}

}  // namespace
}  // namespace kcache
