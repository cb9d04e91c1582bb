// The toolchain fingerprint: stable, sensitive to every field, overridable.
#include "compiler/toolchain.h"

#include "cache/key.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kcache {
namespace {

using ::testing::ElementsAreArray;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

TEST(ToolchainTest, IdIsSixteenHexDigitsAndDeterministic) {
  v1::Toolchain a = MakeToolchain("nvrtc", "13.0", "sha256:ab", {"-std=c++17"});
  v1::Toolchain b = MakeToolchain("nvrtc", "13.0", "sha256:ab", {"-std=c++17"});
  EXPECT_THAT(a.id(), MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(ComputeToolchainId(a), a.id());
  EXPECT_EQ(a.id(), ToolchainIdHex(a));  // the store's key prefix
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
  EXPECT_EQ(t->id(), ComputeToolchainId(*t));
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
