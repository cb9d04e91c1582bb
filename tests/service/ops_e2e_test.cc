// Issue 19 (running kcached like a well-kept service) against a real
// compile-only kcached: its log (one line per compile, failure and
// invalidation, levels, --log_level), and FAILED_PRECONDITION from a daemon
// that cannot compile.
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cache/key.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_client.h"
#include "tests/common/daemon_process.h"
#include "tests/common/distinct_spec.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::DistinctSpec;
using ::kcache::testing::NewClient;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::Sm80;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Binary() {
  const char* env = std::getenv("KCACHE_TEST_KCACHED");  // as KcachedProcess
  return env != nullptr ? env : KCACHE_TEST_KCACHED_PATH;
}

// Runs kcached with `args` to its exit (60 s at most) and returns its exit
// status (or -1), its stdout and stderr in `*out`.
int RunKcached(const TempDir& dir, const std::vector<std::string>& args, std::string* out) {
  std::string cmd = absl::StrCat("timeout -s KILL 60 ", Binary());
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  const std::string file = dir.Sub("run.out");
  absl::StrAppend(&cmd, " >", file, " 2>&1 </dev/null");
  const int rc = std::system(cmd.c_str());
  *out = ReadFileOrEmpty(file);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The daemon writes its log from its own threads: wait (2 minutes at most)
// until a line contains `needle`, and return that line ("" if none came).
std::string AwaitLogLine(const DaemonProcess& d, const std::string& needle) {
  const absl::Time until = absl::Now() + absl::Minutes(2);
  do {
    for (absl::string_view line : absl::StrSplit(ReadFileOrEmpty(d.log_path()), '\n')) {
      if (absl::StrContains(line, needle)) return std::string(line);
    }
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < until);
  return "";
}

// A line of the daemon's log: "2026-12-02T09:31:07.412Z INFO file.cc:123] ...".
constexpr char kPrefix[] = R"(^20[0-9][0-9]-[01][0-9]-[0-3][0-9]T[0-9:.]+Z )";

TEST(OpsE2E, ColdCompileAndFailureEachLogOneLineWithKeyArchDurationAndOutcome) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto client = NewClient(d);
  ASSERT_NE(client, nullptr);

  auto ok = client->Fetch(DistinctSpec(0), Sm80(), absl::Minutes(5));
  ASSERT_TRUE(ok.ok()) << ok.status();
  const std::string key = KeyToHex((*ok)->record().key()).substr(0, 28);
  const std::string compiled = AwaitLogLine(d, "outcome=compiled");
  EXPECT_THAT(compiled, ContainsRegex(absl::StrCat(kPrefix, "INFO kernel_backend.cc:[0-9]+\\] ")));
  EXPECT_THAT(compiled, HasSubstr(absl::StrCat("compile key=", key, " arch=sm_80 queue=sm_80 "
                                               "kind=attention outcome=compiled duration=")));
  EXPECT_THAT(compiled, ContainsRegex("duration=[0-9]+\\.[0-9]{3}s cubin_bytes=[0-9]+ verified=no"));

  // A hit adds no line at the default level.
  ASSERT_TRUE(client->Fetch(DistinctSpec(0), Sm80(), absl::Minutes(1)).ok());

  // A failure: a compile whose deadline passes while it runs (its worker is
  // killed; an attention kernel takes NVRTC well over 100 ms) is logged at
  // WARNING with its code and reason.
  auto late = client->Fetch(DistinctSpec(1), Sm80(), absl::Milliseconds(100));
  EXPECT_FALSE(late.ok());
  const std::string failed = AwaitLogLine(d, "outcome=failed");
  EXPECT_THAT(failed, ContainsRegex(absl::StrCat(kPrefix, "WARNING kernel_backend.cc:[0-9]+\\] ")));
  EXPECT_THAT(failed, ContainsRegex("compile key=[0-9a-f]{28} arch=sm_80 queue=sm_80 "));
  EXPECT_THAT(failed, Not(HasSubstr(key)));  // another kernel
  EXPECT_THAT(failed, ContainsRegex("outcome=failed duration=[0-9.]+s code=DEADLINE_EXCEEDED "
                                    "error=\".+\""));

  // An invalidation names the key.
  auto admin = v1::AdminService::NewStub(
      grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::InvalidateRequest inv;
  inv.set_key((*ok)->record().key());
  v1::InvalidateResponse resp;
  ASSERT_TRUE(admin->Invalidate(&ctx, inv, &resp).ok());
  EXPECT_THAT(AwaitLogLine(d, "invalidate key="), HasSubstr(absl::StrCat("invalidate key=", key)));
  const std::string summary = AwaitLogLine(d, "invalidation ");
  EXPECT_THAT(summary, ContainsRegex("invalidation what=key entries=1 freed_bytes=[0-9]+ "
                                     "duration=[0-9.]+s"));

  // Start-up lines went through the same log; none is unlevelled.
  EXPECT_THAT(AwaitLogLine(d, "serving on unix:"),
              ContainsRegex(absl::StrCat(kPrefix, "INFO daemon.cc:[0-9]+\\] serving on unix:")));
  const std::string log = ReadFileOrEmpty(d.log_path());
  EXPECT_THAT(log, Not(HasSubstr("\nkcached: ")));
  EXPECT_EQ(d.Stop(SIGTERM), 0) << log;
  EXPECT_THAT(ReadFileOrEmpty(d.log_path()), HasSubstr("] stopped"));
}

TEST(OpsE2E, LogLevelWarningKeepsInfoLinesOut) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--log_level=warning"});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  EXPECT_EQ(d.Stop(SIGTERM), 0);
  const std::string log = ReadFileOrEmpty(d.log_path());
  EXPECT_THAT(log, Not(HasSubstr(" INFO "))) << log;
  EXPECT_THAT(log, Not(HasSubstr("serving on"))) << log;
}

TEST(OpsE2E, UnknownLogLevelIsAConfigurationError) {
  TempDir dir;
  std::string out;
  EXPECT_EQ(RunKcached(dir,
                       {"--store_path=" + dir.Sub("store"), "--socket_path=" + dir.Sub("s.sock"),
                        "--log_level=chatty"},
                       &out),
            2);
  EXPECT_THAT(out, HasSubstr("log_level: 'chatty' is not one of debug, info, warning, error"));
}

// Without NVRTC the daemon starts (admin calls work) and kernel requests are
// FAILED_PRECONDITION with the cause: retrying cannot help, so clients must
// not retry for their whole deadline.
TEST(OpsE2E, DaemonWithoutNvrtcAnswersFailedPrecondition) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--nvrtc_path=/nonexistent/libnvrtc.so.13"});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto client = NewClient(d);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  auto r = client->Fetch(DistinctSpec(0), Sm80(), absl::Minutes(10));
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(r.status().message(), HasSubstr("this daemon cannot compile"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(ReadFileOrEmpty(d.log_path()), HasSubstr("WARNING daemon.cc"));
}

}  // namespace
}  // namespace kcache
