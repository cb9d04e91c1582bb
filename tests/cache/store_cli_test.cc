// kcache-store command line: each subcommand on a real store, one-line errors
// and exit status 2 on bad arguments.
#include "cache/tools/store_cli.h"

#include <sstream>

#include "cache/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::IsOk;
using ::kcache::testing::MakeCubin;
using ::kcache::testing::MakeRecord;
using ::kcache::testing::MakeToolchain;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

struct Result {
  int rc;
  std::string out, err;
};

Result RunCli(std::vector<std::string> args) {
  std::ostringstream out, err;
  int rc = RunStoreCli(args, out, err);
  return {rc, out.str(), err.str()};
}

TEST(StoreCliTest, Subcommands) {
  TempDir dir;
  const std::string flag = "--store=" + dir.Sub("store");
  {
    StoreOptions o;
    o.stats_flush_interval = absl::ZeroDuration();
    auto s = Store::Open(dir.Sub("store"), o);
    ASSERT_THAT(s, IsOk());
    for (int i = 0; i < 3; ++i)
      ASSERT_THAT((*s)->Publish(MakeRecord(i), MakeCubin(1000, i)), IsOk());
  }
  auto r = RunCli({flag, "stats"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("entries 3"));
  r = RunCli({flag, "--json", "stats"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"entries\":\"3\""));
  r = RunCli({flag, "ls"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3);
  r = RunCli({flag, "verify"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("corrupt 0"));
  const std::string bundle = dir.Sub("b.kcb");
  r = RunCli({flag, "export", "--out", bundle});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exported 3"));
  const std::string other = "--store=" + dir.Sub("other");
  r = RunCli({other, "import", bundle, "--toolchain=" + ToolchainIdHex(MakeToolchain())});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("imported 3"));
  r = RunCli({other, "import", bundle, "--toolchain=0000000000000000"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("allow_foreign_toolchain"));
  r = RunCli({other, "gc", "--max-bytes=0", "--grace-ms=0"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("evicted 3"));
}

TEST(StoreCliTest, BadArgumentsAreOneLineErrorsWithExitStatus2) {
  TempDir dir;
  const std::string flag = "--store=" + dir.Sub("store");
  for (const auto& args : std::vector<std::vector<std::string>>{{},
                                                                {"stats"},
                                                                {flag, "frobnicate"},
                                                                {flag, "stats", "--bogus"},
                                                                {flag, "gc"},
                                                                {flag, "gc", "--max-bytes=lots"},
                                                                {flag, "export"},
                                                                {flag, "import"},
                                                                {flag, "import", "f.kcb"}}) {
    auto r = RunCli(args);
    EXPECT_EQ(r.rc, 2) << ::testing::PrintToString(args);
    if (!args.empty()) {
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
  }
  auto r = RunCli({flag, "import", dir.Sub("missing.kcb"), "--allow-foreign-toolchain"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot open"));
}

}  // namespace
}  // namespace kcache
