// Issue 19 (running kcached like a well-kept service) against a real
// compile-only kcached: its log (one line per compile, failure and
// invalidation, levels, --log_level), FAILED_PRECONDITION from a daemon
// that cannot compile, the Prometheus endpoint (names, clean bucket bounds,
// HEAD, the GetKernel latency histogram by outcome, kcache_build_info).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cache/key.h"
#include "cache/store.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"
#include "rocksdb/db.h"
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
using ::kcache::testing::SlowWorkerScript;
using ::kcache::testing::Sm80;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Binary() { return ::kcache::testing::TestKcachedPath(); }

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
  EXPECT_THAT(compiled, HasSubstr(absl::StrCat("compile key=", key,
                                               " arch=sm_80 queue=sm_80 "
                                               "kind=attention outcome=compiled duration=")));
  EXPECT_THAT(compiled,
              ContainsRegex("duration=[0-9]+\\.[0-9]{3}s cubin_bytes=[0-9]+ verified=no"));

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

// One HTTP/1.0 request to the daemon's metrics port (read from its log).
std::string Http(const DaemonProcess& d, const std::string& method, const std::string& path) {
  const std::string line = AwaitLogLine(d, "metrics port ");
  const size_t at = line.rfind("metrics port ");
  if (at == std::string::npos) return "";
  const int port = std::atoi(line.c_str() + at + 13);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = absl::StrCat(method, " ", path, " HTTP/1.0\r\n\r\n");
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

TEST(OpsE2E, MetricsFollowPrometheusConventions) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--metrics_address", "127.0.0.1:0", "--worker_path",
                               SlowWorkerScript(dir.path(), 2)});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  // Two calls at once for one cold kernel: one compiles, one joins it.
  std::barrier start(2);
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      auto client = NewClient(d);
      start.arrive_and_wait();
      auto r = client->Fetch(DistinctSpec(2), Sm80(), absl::Minutes(5));
      EXPECT_TRUE(r.ok()) << r.status();
    });
  }
  for (auto& t : threads) t.join();
  auto client = NewClient(d);
  EXPECT_TRUE(client->Fetch(DistinctSpec(2), Sm80(), absl::Minutes(1)).ok());  // a hit
  v1::Target old_arch;
  old_arch.set_arch("sm_75");
  EXPECT_FALSE(client->Fetch(DistinctSpec(2), old_arch, absl::Minutes(1)).ok());  // refused

  const std::string m = Http(d, "GET", "/metrics");
  EXPECT_THAT(m, HasSubstr("HTTP/1.0 200 OK"));
  for (const char* outcome : {"hit", "compiled", "waited", "failed"}) {
    EXPECT_THAT(m, HasSubstr(absl::StrCat("kcache_get_kernel_seconds_count{outcome=\"", outcome,
                                          "\"} 1\n")))
        << m;
  }
  EXPECT_THAT(m, HasSubstr("# TYPE kcache_get_kernel_seconds histogram"));
  EXPECT_THAT(m, HasSubstr("kcache_get_kernel_seconds_bucket{outcome=\"hit\",le=\"0.1\"} "));
  EXPECT_THAT(m, HasSubstr("kcache_compile_seconds_bucket{le=\"0.1\"} "));
  EXPECT_THAT(m, Not(HasSubstr("000000")));  // no 0.10000000000000001
  EXPECT_THAT(m, ContainsRegex("kcache_build_info\\{version=\"[0-9]+\\.[0-9]+\\.[0-9]+\","
                               "cuda=\"[0-9]+\\.[0-9]+\",nvrtc=\"[0-9.]+\"\\} 1\n"));
  EXPECT_THAT(m, HasSubstr("kcache_store_entries 1\n"));
  EXPECT_THAT(m, ContainsRegex("kcache_store_bytes [1-9][0-9]*\n"));
  EXPECT_THAT(m, HasSubstr("kcache_store_quarantined_entries 0\n"));
  EXPECT_THAT(m, HasSubstr("# TYPE kcache_compile_worker_retries_total counter\n"));
  EXPECT_THAT(m, HasSubstr("# TYPE kcache_compile_limit_exceeded_total counter\n"));
  // No count under a _bytes name.
  EXPECT_THAT(m, Not(HasSubstr("kcache_store_bytes{")));

  const std::string head = Http(d, "HEAD", "/metrics");
  EXPECT_THAT(head, HasSubstr("HTTP/1.0 200 OK\r\n"));
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << head;  // headers only
}

// The C++ client's ClientOptions::on_progress: a slow compile is reported
// after progress_after, then once more when it is done; a hit is not.
TEST(OpsE2E, ClientReportsProgressOfASlowCompile) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--worker_path", SlowWorkerScript(dir.path(), 3)});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  absl::Mutex mu;
  std::vector<CompileProgress> seen;
  std::vector<std::string> archs;  // from the request, which lives during the call only
  ClientOptions o;
  o.target = d.target();
  o.progress_after = absl::Milliseconds(500);
  o.on_progress = [&](const CompileProgress& p) {
    absl::MutexLock lock(&mu);
    seen.push_back(p);
    seen.back().request = nullptr;
    archs.push_back(p.request->target().arch());
  };
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto r = (*client)->Fetch(DistinctSpec(3), Sm80(), absl::Minutes(5));
  ASSERT_TRUE(r.ok()) << r.status();
  {
    absl::MutexLock lock(&mu);
    ASSERT_GE(seen.size(), 2u);
    EXPECT_EQ(seen.front().phase, v1::Progress::PHASE_COMPILING);
    EXPECT_EQ(seen.front().queue, "sm_80");
    EXPECT_GE(seen.front().elapsed, absl::Milliseconds(500));
    EXPECT_FALSE(seen.front().finished);
    EXPECT_EQ(archs.front(), "sm_80");
    EXPECT_TRUE(seen.back().finished);
    EXPECT_TRUE(seen.back().status.ok()) << seen.back().status;
    seen.clear();
  }
  // A second client: a hit, answered at once, is not reported.
  auto again = Client::Create(o);
  ASSERT_TRUE(again.ok());
  auto hit = (*again)->Fetch(DistinctSpec(3), Sm80(), absl::Minutes(1));
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_TRUE((*hit)->cache_hit());
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(seen.empty());
}

// A cubin damaged on disk is quarantined when read (never served), which the
// log says with the key, before the compile that replaces it.
TEST(OpsE2E, QuarantineIsLoggedWithTheKey) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  std::string key, digest, cubin;
  {
    auto client = NewClient(d);
    auto r = client->Fetch(DistinctSpec(4), Sm80(), absl::Minutes(5));
    ASSERT_TRUE(r.ok()) << r.status();
    key = (*r)->record().key();
    digest = (*r)->record().cubin_sha256();
    cubin = (*r)->cubin();
  }
  ASSERT_EQ(d.Stop(SIGTERM), 0);
  {
    auto store = Store::Open(d.store(), StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    cubin[cubin.size() / 2] ^= 0x5a;  // one flipped byte
    ASSERT_TRUE((*store)
                    ->raw_db_for_testing()
                    ->Put(rocksdb::WriteOptions(), (*store)->column_family_for_testing("blobs"),
                          digest, cubin)
                    .ok());
    ASSERT_TRUE((*store)->Close().ok());
  }
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto client = NewClient(d);
  auto again = client->Fetch(DistinctSpec(4), Sm80(), absl::Minutes(5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE((*again)->cache_hit());  // compiled again, not served damaged
  const std::string line = AwaitLogLine(d, "quarantine key=");
  EXPECT_THAT(line, ContainsRegex(absl::StrCat(kPrefix, "WARNING daemon.cc:[0-9]+\\] ")));
  EXPECT_THAT(
      line, HasSubstr(absl::StrCat("quarantine key=", KeyToHex(key).substr(0, 28), " reason=\"")));
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
