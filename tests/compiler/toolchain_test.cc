// The toolchain fingerprint: known ids for known fields, sensitive to every
// field, and the real NVRTC's fields and id.
#include "compiler/toolchain.h"

#include <cstdint>
#include <string>
#include <string_view>

#include "cache/digest.h"
#include "cache/key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kcache {
namespace {

using ::testing::ElementsAreArray;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

// The id as the store defines it (cache/key.h), written out here rather than
// called: hex of the first 8 bytes of SHA-256 over compiler, version, build,
// the option count in decimal, then each option, each field preceded by its
// length as 8 little-endian bytes.
std::string ReferenceId(const v1::Toolchain& t) {
  std::string bytes;
  auto field = [&](std::string_view f) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(uint64_t{f.size()} >> (8 * i)));
    bytes.append(f);
  };
  field(t.compiler());
  field(t.version());
  field(t.build());
  field(std::to_string(t.options_size()));
  for (const std::string& o : t.options()) field(o);
  return ToHex(Sha256(bytes)).substr(0, 16);
}

// Known inputs, known ids (computed apart from this code, with Python's
// hashlib). The id is the prefix of every store key: if one of these changes,
// every cached kernel is orphaned, so the change must come with a new key
// format version.
TEST(ToolchainTest, KnownFieldsGiveKnownIds) {
  EXPECT_EQ(MakeToolchain("nvrtc", "13.0", "sha256:ab", {"-std=c++17"}).id(), "4f82d9cd545601c1");
  EXPECT_EQ(MakeToolchain("nvrtc", "13.0", "b", {"x", "y"}).id(), "ce19a3e78c7ca8e2");
  EXPECT_EQ(MakeToolchain("", "", "", {}).id(), "3168e664f255d7a8");
  v1::Toolchain t = MakeToolchain("nvrtc", "13.0", "sha256:ab", {"-std=c++17"});
  EXPECT_EQ(t.id(), ReferenceId(t));
  // The id field is an output, never an input.
  t.set_id("0000000000000000");
  EXPECT_EQ(ToolchainIdHex(t), "4f82d9cd545601c1");
}

TEST(ToolchainTest, EveryFieldChangesTheId) {
  const std::string base = MakeToolchain("nvrtc", "13.0", "b", {"x", "y"}).id();
  EXPECT_NE(base, MakeToolchain("nvrtc2", "13.0", "b", {"x", "y"}).id());
  EXPECT_NE(base, MakeToolchain("nvrtc", "13.1", "b", {"x", "y"}).id());
  EXPECT_NE(base, MakeToolchain("nvrtc", "13.0", "c", {"x", "y"}).id());
  EXPECT_NE(base, MakeToolchain("nvrtc", "13.0", "b", {"y", "x"}).id());
  EXPECT_NE(base, MakeToolchain("nvrtc", "13.0", "b", {"xy"}).id());
  EXPECT_NE(base, MakeToolchain("nvrtc", "13.0", "b", {"x", "y", ""}).id());
}

TEST(ToolchainTest, OfRealNvrtc) {
  Nvrtc nvrtc;
  absl::StatusOr<v1::Toolchain> t = NvrtcToolchain(nvrtc);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->compiler(), "nvrtc");
  EXPECT_THAT(t->version(), MatchesRegex("[0-9]+\\.[0-9]+"));
  EXPECT_THAT(t->build(), StartsWith("sha256:"));
  EXPECT_EQ(t->build().size(), 7u + 64u);
  EXPECT_THAT(t->options(), ElementsAreArray(CanonicalNvrtcOptions()));
  EXPECT_EQ(t->id(), ReferenceId(*t));
  // Stable across calls (and, with the same library bytes, across machines).
  absl::StatusOr<v1::Toolchain> again = NvrtcToolchain(nvrtc);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id(), t->id());
}

TEST(ToolchainTest, MissingNvrtcIsUnavailable) {
  Nvrtc nvrtc("/nonexistent/libnvrtc.so");
  EXPECT_EQ(NvrtcToolchain(nvrtc).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kcache
