// Compile workers without network access (issue 26): a real
// kcache-compile-worker drops it at start by unsharing a user and a network
// namespace. What a worker reports is deterministic: the only interface it
// sees is the loopback ("interfaces lo") and a UDP connect to a non-loopback
// address (192.0.2.1, TEST-NET-1; a connect sends nothing) has no route.
// Where the platform refuses unprivileged user namespaces the tests skip,
// naming the reason the worker gave.
#include <grp.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "compiler/worker/worker.h"
#include "compiler/worker/worker_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/compiler/test_kernels.h"

namespace kcache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kDropped[] = "network dropped (own user and network namespace)";
constexpr char kNoNetwork[] = "interfaces lo; connect 192.0.2.1: Network is unreachable";

WorkerPoolOptions Options() {
  WorkerPoolOptions o;
  o.worker_path = KCACHE_TEST_WORKER_PATH;
  o.max_workers = 1;
  o.enable_test_faults = true;
  return o;
}

// Everything the child `pid` writes to `fd` until it closes it (then closed
// here), and the child's wait status in *status.
std::string ReadAllThenReap(int fd, pid_t pid, int* status) {
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  close(fd);
  waitpid(pid, status, 0);
  return text;
}

// Skips the test when this platform keeps the worker's network.
#define SKIP_IF_KEPT(report)                                                    \
  if (absl::StartsWith(report, "network kept")) {                               \
    GTEST_SKIP() << "the platform refuses the network drop here: " << (report); \
  }

TEST(WorkerSandboxTest, ProbeReportsNoNetworkButLoopback) {
  WorkerPool pool(Options());
  absl::StatusOr<std::string> report = pool.Probe();
  ASSERT_TRUE(report.ok()) << report.status();
  SKIP_IF_KEPT(*report);
  EXPECT_THAT(*report, StartsWith(kDropped));
  EXPECT_THAT(*report, HasSubstr(kNoNetwork));
}

// Not the probe only: the worker that compiles (the pool's own, which has
// already compiled once) answers the test fault with its protections.
TEST(WorkerSandboxTest, ServingWorkerHasNoNetworkAndStillCompiles) {
  WorkerPool pool(Options());
  CompileInput tiny;
  tiny.source = testing::TinyKernelSource();
  tiny.program_name = "tiny.cu";
  tiny.arch = "sm_80";
  absl::StatusOr<CompileOutput> out = pool.Compile(tiny, absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(out.ok()) << out.status();
  CompileInput ask = tiny;
  ask.extra_options = {"kcache-test-sandbox"};
  absl::StatusOr<CompileOutput> report = pool.Compile(ask, absl::Now() + absl::Seconds(60));
  ASSERT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition) << report.status();
  const std::string text(report.status().message());
  SKIP_IF_KEPT(text);
  EXPECT_THAT(text, StartsWith(kDropped));
  EXPECT_THAT(text, HasSubstr(kNoNetwork));
  EXPECT_EQ(pool.idle_worker_pids().size(), 1u);  // one worker did both
}

// The drop needs no privilege: as root, run the probe as nobody.
TEST(WorkerSandboxTest, UnprivilegedWorkerDropsTheNetworkToo) {
  if (geteuid() != 0) GTEST_SKIP() << "not root: the other tests ran unprivileged already";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      _exit(3);
    }
    execl(KCACHE_TEST_WORKER_PATH, KCACHE_TEST_WORKER_PATH, "--probe", nullptr);
    _exit(127);
  }
  close(out[1]);
  int status = 0;
  const std::string text = ReadAllThenReap(out[0], pid, &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "wait status " << status << ": " << text;
  SKIP_IF_KEPT(text);
  EXPECT_THAT(text, StartsWith(kDropped));
  EXPECT_THAT(text, HasSubstr(kNoNetwork));
}

// Where the platform refuses the drop, a worker says why and compiles all
// the same. The refusal is made here: in a user namespace of the test's own,
// whose max_user_namespaces is 0, unshare(CLONE_NEWUSER) fails (ENOSPC).
TEST(WorkerSandboxTest, RefusedDropIsReportedAndTheWorkerStillCompiles) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(out[0]);
    auto say = [&](const std::string& text, int code) {
      (void)!write(out[1], text.data(), text.size());
      _exit(code);
    };
    const uid_t uid = getuid();
    const gid_t gid = getgid();
    if (unshare(CLONE_NEWUSER) != 0) say("SKIP unshare: " + std::string(strerror(errno)), 0);
    auto put = [&](const char* path, const std::string& text) {
      std::FILE* f = std::fopen(path, "w");
      if (f == nullptr || std::fputs(text.c_str(), f) < 0 || std::fclose(f) != 0) {
        say(std::string("SKIP cannot write ") + path + ": " + strerror(errno), 0);
      }
    };
    put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1\n");
    put("/proc/self/setgroups", "deny\n");
    put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1\n");
    put("/proc/sys/user/max_user_namespaces", "0\n");
    std::string text;
    int code = 0;
    {
      WorkerPool pool(Options());  // its destructor reaps the worker
      absl::StatusOr<std::string> report = pool.Probe();
      text = report.ok() ? *report : "probe: " + report.status().ToString();
      CompileInput tiny;
      tiny.source = testing::TinyKernelSource();
      tiny.program_name = "tiny.cu";
      tiny.arch = "sm_80";
      absl::StatusOr<CompileOutput> compiled = pool.Compile(tiny, absl::Now() + absl::Seconds(60));
      if (!report.ok() || !compiled.ok()) {
        code = 1;
        text += "\ncompile: " + compiled.status().ToString();
      }
    }
    say(text, code);
  }
  close(out[1]);
  int status = 0;
  const std::string text = ReadAllThenReap(out[0], pid, &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "wait status " << status << ": " << text;
  if (absl::StartsWith(text, "SKIP ")) GTEST_SKIP() << "cannot make the refusal here: " << text;
  EXPECT_THAT(text, StartsWith("network kept (unshare(CLONE_NEWUSER|CLONE_NEWNET): "));
}

TEST(WorkerSandboxTest, KeepNetworkAndProbeArgumentsParse) {
  char prog[] = "kcache-compile-worker";
  char keep[] = "--keep-network";
  char probe[] = "--probe";
  char* argv[] = {prog, keep, probe, nullptr};
  absl::StatusOr<worker::ServeOptions> o = worker::ParseWorkerArgs(3, argv);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->drop_network);
  EXPECT_TRUE(o->probe);
  absl::StatusOr<worker::ServeOptions> d = worker::ParseWorkerArgs(1, argv);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->drop_network);  // the default
  EXPECT_FALSE(d->probe);
}

}  // namespace
}  // namespace kcache
