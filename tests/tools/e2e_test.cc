// End-to-end tests of the kcache CLI with real compile-only daemons (no
// GPU), real NVRTC and the kcache binary: CI pre-population (warm, export,
// import into a fresh store, all hits on a new daemon), per-spec warm
// failures, and two toolchains on one store.
#include <sys/mount.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/tools/processes.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::RunTool;
using ::kcache::testing::SlowWorkerScript;
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

// `kcache warm` shows a compile that takes more than a couple of seconds
// while it runs (issue 19): a worker that sleeps 4 s before compiling makes
// the one kernel of the manifest slow; off a terminal the wait is a plain
// line on stderr, before the kernel's own result line.
TEST(KcacheE2E, WarmShowsALongCompileWhileItRuns) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--worker_path", SlowWorkerScript(dir.path(), 4)});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  ToolRun warm = RunTool(dir.path(), {"--socket", d.socket(), "warm",
                                      KCACHE_SOURCE_DIR "/tests/tools/one-kernel.yaml"});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);
  const size_t waiting = warm.err.find("[0/1] waiting  tiny sm_80 (");
  ASSERT_NE(waiting, std::string::npos) << Describe(warm);
  EXPECT_THAT(warm.err, HasSubstr("s so far; 1 outstanding)"));
  EXPECT_GT(warm.err.find("[1/1] compiled tiny sm_80"), waiting) << Describe(warm);
  // A hit answers at once: nothing to wait for.
  ToolRun again = RunTool(dir.path(), {"--socket", d.socket(), "warm",
                                       KCACHE_SOURCE_DIR "/tests/tools/one-kernel.yaml"});
  ASSERT_EQ(again.exit_code, 0) << Describe(again);
  EXPECT_THAT(again.err, Not(HasSubstr("waiting")));
  EXPECT_EQ(d.Stop(), 0);
}

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

// --- The daemon under damage (issue 17): a full disk, SIGKILL at random ----------

// A manifest of `n` small, distinct kernels (sm_80), named k0..k{n-1}.
std::string SmallManifest(int first, int n) {
  std::string m = "archs: [sm_80]\nspecs:\n";
  for (int i = first; i < first + n; ++i) {
    absl::StrAppend(&m, "  - name: k", i, "\n    spec: {dtype: DTYPE_FP16, head_dim_qk: 64, ",
                    "num_q_heads: ", i + 1, ", mask: {causal: {}}}\n");
  }
  return m;
}

// Issue 17.1: on a full disk the daemon aborted (RocksDB's info log) and a
// restart on the still-full disk aborted at open. Now: publishes answer
// UNAVAILABLE, hits are served, and a daemon started on the full disk serves
// its store read-only.
TEST(KcacheE2E, OnAFullDiskHitsAreServedPublishesAreUnavailableAndARestartServes) {
  TempDir dir;
  const std::string mnt = dir.Sub("mnt");
  std::filesystem::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=8m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); tests/cache/damage_test.cc covers a full disk without one";
  }
  struct Unmount {
    std::string p;
    ~Unmount() { umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string one = dir.Sub("one.yaml"), more = dir.Sub("more.yaml");
  WriteFile(one, SmallManifest(0, 1));
  WriteFile(more, SmallManifest(1, 2));
  DaemonProcess d({.store_path = mnt + "/store", .socket_path = dir.Sub("d.sock")});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  ToolRun warm = RunTool(dir.path(), {"--socket", d.socket(), "warm", one});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);

  {  // Fill the disk.
    std::ofstream filler(mnt + "/filler", std::ios::binary);
    std::string mb(1 << 20, 'x');
    for (int i = 0; i < 16 && filler; ++i) filler.write(mb.data(), mb.size());
  }
  for (int round = 0; round < 3; ++round) {
    ToolRun full = RunTool(dir.path(), {"--socket", d.socket(), "--json", "warm", more});
    EXPECT_EQ(full.exit_code, 3) << Describe(full);  // every failure UNAVAILABLE
    EXPECT_THAT(full.err, HasSubstr("No space left on device")) << Describe(full);
    ToolRun hit = RunTool(dir.path(), {"--socket", d.socket(), "--json", "warm", one});
    ASSERT_EQ(hit.exit_code, 0) << Describe(hit) << ReadFileOrEmpty(d.log_path());
    EXPECT_EQ(ParseJson(hit)["cached"], 1);
  }
  // Killed (or restarted by systemd) while the disk is still full.
  d.Kill();
  ASSERT_NO_FATAL_FAILURE(d.Start());
  ToolRun hit = RunTool(dir.path(), {"--socket", d.socket(), "--json", "warm", one});
  ASSERT_EQ(hit.exit_code, 0) << Describe(hit);
  EXPECT_EQ(ParseJson(hit)["cached"], 1);
  ToolRun ro = RunTool(dir.path(), {"--socket", d.socket(), "warm", more});
  EXPECT_EQ(ro.exit_code, 3) << Describe(ro);
  EXPECT_THAT(ro.err, HasSubstr("free space and restart kcached")) << Describe(ro);
  EXPECT_THAT(ReadFileOrEmpty(d.log_path()), HasSubstr("the disk was full when it was opened"));

  // Space back, restart: everything is there and new kernels are stored.
  std::filesystem::remove(mnt + "/filler");
  EXPECT_EQ(d.Stop(), 0);
  ASSERT_NO_FATAL_FAILURE(d.Start());
  ToolRun ok = RunTool(dir.path(), {"--socket", d.socket(), "--json", "warm", more});
  ASSERT_EQ(ok.exit_code, 0) << Describe(ok);
  ToolRun all = RunTool(dir.path(), {"--socket", d.socket(), "verify"});
  EXPECT_EQ(all.exit_code, 0) << Describe(all);
  EXPECT_THAT(all.out, HasSubstr("checked 3 entries, 0 corrupt"));
}

// SIGKILL of the daemon at random moments while `kcache warm` runs: every
// kernel the daemon answered before the kill is a hit after a restart,
// nothing is corrupt, and the daemon serves again.
TEST(KcacheE2E, SigkillOfTheDaemonAtRandomMomentsLosesNoAnsweredKernel) {
  TempDir dir;
  constexpr int kKernels = 4;
  const std::string manifest = dir.Sub("m.yaml");
  WriteFile(manifest, SmallManifest(0, kKernels));
  DaemonProcess d({.store_path = dir.Sub("store"), .socket_path = dir.Sub("d.sock")});
  std::mt19937 rng(17);
  std::set<std::string> answered;
  // "[i/N] compiled k3 sm_80 (...)" or "cached": answered before the kill.
  auto answers = [](const std::string& err) {
    std::set<std::string> out;
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);) {
      for (std::string what : {"] compiled ", "] cached   "}) {
        if (auto p = line.find(what); p != std::string::npos) {
          const size_t b = p + what.size();
          out.insert(line.substr(b, line.find(' ', b) - b));
        }
      }
    }
    return out;
  };
  for (int round = 0; round < 3; ++round) {
    ASSERT_NO_FATAL_FAILURE(d.Start());
    const std::string out = dir.Sub("warm.out"), err = dir.Sub("warm.err");
    std::remove(err.c_str());
    pid_t warm = ::kcache::testing::Spawn(
        {KCACHE_TEST_KCACHE_PATH, "--socket", d.socket(), "warm", "--jobs", "1", manifest}, out,
        err);
    ASSERT_GT(warm, 0);
    // Wait for a random number of new answers (0..2), then kill after a
    // random delay (0..1.5 s): mid-compile, mid-publish or between kernels.
    const size_t want = answered.size() + rng() % 3;
    for (absl::Time until = absl::Now() + absl::Seconds(120); absl::Now() < until;) {
      std::set<std::string> now = answers(ReadFileOrEmpty(err));
      now.insert(answered.begin(), answered.end());
      if (now.size() >= std::min<size_t>(want, kKernels)) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::SleepFor(absl::Milliseconds(rng() % 1500));
    d.Kill();
    int status = 0;
    waitpid(warm, &status, 0);
    for (const auto& name : answers(ReadFileOrEmpty(err))) answered.insert(name);
  }
  // (Kills land from before the first answer to after the last; some rounds
  // must have had answers for the check below to mean anything.)
  EXPECT_FALSE(answered.empty());
  std::cout << answered.size() << " of " << kKernels << " kernels answered before a kill\n";
  ASSERT_NO_FATAL_FAILURE(d.Start());
  ToolRun verify = RunTool(dir.path(), {"--socket", d.socket(), "verify"});
  EXPECT_EQ(verify.exit_code, 0) << Describe(verify);
  ToolRun again = RunTool(dir.path(), {"--socket", d.socket(), "--json", "warm", manifest});
  ASSERT_EQ(again.exit_code, 0) << Describe(again);
  json j = ParseJson(again);
  for (const auto& r : j["results"]) {
    if (answered.contains(r["name"].get<std::string>())) {
      EXPECT_EQ(r["result"], "cached") << r.dump() << " was answered before a kill";
    }
  }
  EXPECT_EQ(ParseJson(RunTool(dir.path(), {"--socket", d.socket(), "--json", "stats"}))["entries"],
            kKernels);
}

}  // namespace
}  // namespace kcache
