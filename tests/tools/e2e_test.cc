// End-to-end tests of the kcache CLI with real compile-only daemons (no
// GPU), real NVRTC and the kcache binary: CI pre-population (warm, export,
// import into a fresh store, all hits on a new daemon), per-spec warm
// failures, and two toolchains on one store.
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/tools/processes.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::RunTool;
using ::kcache::testing::TempDir;
using ::kcache::testing::ToolRun;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kSampleManifest = KCACHE_SOURCE_DIR "/docker/warm-manifest.yaml";
constexpr int kSampleKernels = 6;  // 4 specs; two for both archs

std::string Describe(const ToolRun& r) {
  return absl::StrCat("exit ", r.exit_code, "\nstdout:\n", r.out, "\nstderr:\n", r.err);
}

json ParseJson(const ToolRun& r) {
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << Describe(r);
  return j;
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The pipeline of docs/ops.md "CI pre-population", step by step.
TEST(KcacheE2E, WarmExportImportThenANewDaemonServesEveryEntryAsAHit) {
  TempDir dir;
  // 1. CI: a compile-only daemon (no GPU) and `kcache warm`.
  DaemonProcess ci({.store_path = dir.Sub("ci-store"), .socket_path = dir.Sub("ci.sock")});
  ASSERT_NO_FATAL_FAILURE(ci.Start());
  ToolRun warm = RunTool(dir.path(), {"--socket", ci.socket(), "warm", kSampleManifest});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);
  EXPECT_THAT(warm.out, HasSubstr(absl::StrCat(kSampleKernels, " kernels: ", kSampleKernels,
                                               " compiled, 0 cached, 0 failed")));
  // Not a terminal: one plain line per kernel, no bar.
  EXPECT_THAT(warm.err, AllOf(HasSubstr("[6/6]"), Not(HasSubstr("\r"))));
  EXPECT_EQ(ci.Stats().compiles(), static_cast<uint64_t>(kSampleKernels));

  // 2. Export everything.
  const std::string bundle = dir.Sub("kernels.kcb");
  ToolRun exp = RunTool(dir.path(), {"--socket", ci.socket(), "export", "--out", bundle});
  ASSERT_EQ(exp.exit_code, 0) << Describe(exp);
  EXPECT_THAT(exp.out, HasSubstr(absl::StrCat("exported ", kSampleKernels, " entries")));
  EXPECT_EQ(ci.Stop(), 0);

  // 3. Import into a fresh store directly (no daemon on the node yet).
  const std::string node_store = dir.Sub("node-store");
  ToolRun imp = RunTool(dir.path(), {"--store", node_store, "import", bundle});
  ASSERT_EQ(imp.exit_code, 0) << Describe(imp);
  EXPECT_THAT(imp.out, HasSubstr(absl::StrCat("imported ", kSampleKernels, " entries")));

  // 4. A daemon on that store serves every manifest entry as a hit.
  DaemonProcess node({.store_path = node_store, .socket_path = dir.Sub("node.sock")});
  ASSERT_NO_FATAL_FAILURE(node.Start());
  ToolRun again =
      RunTool(dir.path(), {"--socket", node.socket(), "--json", "warm", kSampleManifest});
  ASSERT_EQ(again.exit_code, 0) << Describe(again);
  json j = ParseJson(again);
  EXPECT_EQ(j["cached"], kSampleKernels);
  EXPECT_EQ(j["compiled"], 0);
  v1::StatsResponse stats = node.Stats();
  EXPECT_EQ(stats.compiles(), 0u);
  EXPECT_EQ(stats.hits(), static_cast<uint64_t>(kSampleKernels));
  EXPECT_EQ(stats.entries(), static_cast<uint64_t>(kSampleKernels));

  ToolRun verify = RunTool(dir.path(), {"--socket", node.socket(), "verify"});
  EXPECT_EQ(verify.exit_code, 0) << Describe(verify);
  EXPECT_THAT(verify.out,
              HasSubstr(absl::StrCat("checked ", kSampleKernels, " entries, 0 corrupt")));
}

TEST(KcacheE2E, WarmListsEverySpecThatFailedAndWhyAndExitsOne) {
  TempDir dir;
  DaemonProcess d({.store_path = dir.Sub("store"), .socket_path = dir.Sub("d.sock")});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  WriteFile(dir.Sub("bad.yaml"), R"(
archs: [sm_80]
specs:
  - name: bad-head-dim
    spec: {dtype: DTYPE_BF16, head_dim_qk: 96, num_q_heads: 8}
  - name: bad-gqa
    spec: {dtype: DTYPE_FP16, head_dim_qk: 64, num_q_heads: 8, num_kv_heads: 3}
  - name: old-arch
    archs: [sm_70]
    spec: {dtype: DTYPE_FP16, head_dim_qk: 64, num_q_heads: 8}
)");
  ToolRun r = RunTool(dir.path(), {"--socket", d.socket(), "warm", dir.Sub("bad.yaml")});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("3 kernels: 0 compiled, 0 cached, 3 failed"));
  EXPECT_THAT(r.err, HasSubstr("failed: bad-head-dim sm_80: spec.head_dim_qk"));
  EXPECT_THAT(r.err, HasSubstr("failed: bad-gqa sm_80: spec.num_kv_heads"));
  EXPECT_THAT(r.err, HasSubstr("failed: old-arch sm_70: target.arch"));
  EXPECT_EQ(d.Stats().compiles(), 0u);

  // A manifest that does not parse is a usage error, and nothing is asked.
  WriteFile(dir.Sub("broken.yaml"), "specs:\n  - spec: {dtype: DTYPE_BF16, head_dim: 64}\n");
  r = RunTool(dir.path(), {"--socket", d.socket(), "warm", dir.Sub("broken.yaml")});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("specs[0]"));
  EXPECT_EQ(d.Stats().requests(), 3u);

  // No daemon: exit 3.
  r = RunTool(dir.path(), {"--socket", dir.Sub("nobody.sock"), "warm", kSampleManifest});
  EXPECT_EQ(r.exit_code, 3) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no kcache daemon"));
}

std::set<std::string> ToolchainIds(const json& status) {
  std::set<std::string> out;
  for (const auto& t : status["toolchains"]) out.insert(t["toolchain_id"].get<std::string>());
  return out;
}

TEST(KcacheE2E, TwoToolchainsOnOneStoreThenInvalidateTheOldOne) {
  TempDir dir;
  WriteFile(dir.Sub("one.yaml"),
            "archs: [sm_80]\nspecs:\n  - name: one\n    spec: {dtype: DTYPE_BF16, head_dim_qk: 64, "
            "num_q_heads: 4, mask: {causal: {}}}\n");
  const std::string store = dir.Sub("store");
  std::string old_id, new_id;
  {
    DaemonProcess d({.store_path = store,
                     .socket_path = dir.Sub("d.sock"),
                     .extra_args = {"--toolchain_salt=old"}});
    ASSERT_NO_FATAL_FAILURE(d.Start());
    old_id = d.Stats().toolchain().id();
    ToolRun r = RunTool(dir.path(), {"--socket", d.socket(), "warm", dir.Sub("one.yaml")});
    ASSERT_EQ(r.exit_code, 0) << Describe(r);
    EXPECT_EQ(d.Stop(), 0);
  }
  DaemonProcess d({.store_path = store,
                   .socket_path = dir.Sub("d.sock"),
                   .extra_args = {"--toolchain_salt=new"}});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  new_id = d.Stats().toolchain().id();
  ASSERT_NE(old_id, new_id);
  // The old toolchain's entry is never served: the same spec compiles again.
  ToolRun r = RunTool(dir.path(), {"--socket", d.socket(), "--json", "warm", dir.Sub("one.yaml")});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(ParseJson(r)["compiled"], 1);
  EXPECT_EQ(d.Stats().compiles(), 1u);

  r = RunTool(dir.path(), {"--socket", d.socket(), "--json", "status"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  json status = ParseJson(r);
  EXPECT_EQ(ToolchainIds(status), (std::set<std::string>{old_id, new_id}));
  for (const auto& t : status["toolchains"]) {
    EXPECT_EQ(t["entries"], 1);
    EXPECT_EQ(t["current"], t["toolchain_id"] == new_id);
  }
  r = RunTool(dir.path(), {"--socket", d.socket(), "status"});
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("kcache invalidate --toolchain ", old_id)));

  // While the daemon holds the store: direct reads work (read-only),
  // direct changes are refused with exit 3 and change nothing.
  r = RunTool(dir.path(), {"--store", store, "ls", "--toolchain", old_id});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr(old_id));
  r = RunTool(dir.path(), {"--store", store, "invalidate", "--toolchain", old_id});
  EXPECT_EQ(r.exit_code, 3) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("held by a running daemon"));

  // Keep the old entries in a bundle, then free them.
  const std::string old_bundle = dir.Sub("old.kcb");
  r = RunTool(dir.path(),
              {"--socket", d.socket(), "export", "--toolchain", old_id, "--out", old_bundle});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("exported 1 entries"));
  r = RunTool(dir.path(), {"--socket", d.socket(), "invalidate", "--toolchain", old_id});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("removed 1 entries"));
  r = RunTool(dir.path(), {"--socket", d.socket(), "--json", "status"});
  EXPECT_EQ(ToolchainIds(ParseJson(r)), (std::set<std::string>{new_id}));

  // A bundle of another toolchain is refused unless allowed.
  r = RunTool(dir.path(), {"--socket", d.socket(), "import", old_bundle});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--allow-foreign-toolchain"));
  r = RunTool(dir.path(), {"--socket", d.socket(), "--json", "status"});
  EXPECT_EQ(ToolchainIds(ParseJson(r)), (std::set<std::string>{new_id}));
  r = RunTool(dir.path(),
              {"--socket", d.socket(), "import", "--allow-foreign-toolchain", old_bundle});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("imported 1 entries"));
  EXPECT_EQ(d.Stats().compiles(), 1u);
}

}  // namespace
}  // namespace kcache
