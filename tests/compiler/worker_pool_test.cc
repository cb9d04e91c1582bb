// Compile workers: real NVRTC in real kcache-compile-worker processes, with
// the test faults (crash, hang) enabled. The hang test's 2 s is a deadline
// the pool enforces, not a sleep.
#include "compiler/worker/worker_pool.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "compiler/cuda/cubin_images.h"
#include "compiler/cuda/nvrtc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/compiler/test_kernels.h"

namespace kcache {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

WorkerPoolOptions TestOptions(int max_workers = 2) {
  WorkerPoolOptions o;
  o.worker_path = KCACHE_TEST_WORKER_PATH;
  o.max_workers = max_workers;
  o.enable_test_faults = true;
  return o;
}

CompileInput Tiny(const std::string& arch = "sm_90a") {
  CompileInput in;
  in.source = testing::TinyKernelSource();
  in.program_name = "tiny.cu";
  in.arch = arch;
  return in;
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

TEST(WorkerPoolTest, CompilesInAWorkerAndReusesIt) {
  WorkerPool pool(TestOptions());
  for (const char* arch : {"sm_80", "sm_90a"}) {
    absl::StatusOr<CompileOutput> out = pool.Compile(Tiny(arch), In(absl::Seconds(60)));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->cubin.compare(0, 4,
                                 "\x7f"
                                 "ELF"),
              0);
    ASSERT_THAT(out->kernels, SizeIs(1));
    EXPECT_EQ(out->kernels[0].name, "kc_tiny");
    EXPECT_EQ(out->kernels[0].static_smem_bytes, 512);
    EXPECT_THAT(out->log, HasSubstr("Used"));
  }
  EXPECT_EQ(pool.live_workers(), 1);  // sequential requests share one worker
}

TEST(WorkerPoolTest, SameOutputAsInProcess) {
  WorkerPool pool(TestOptions());
  Nvrtc nvrtc;
  InProcessCompiler local(&nvrtc);
  absl::StatusOr<CompileOutput> a = pool.Compile(Tiny(), In(absl::Seconds(60)));
  absl::StatusOr<CompileOutput> b = local.Compile(Tiny(), In(absl::Seconds(60)));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(a->cubin, b->cubin);  // NVRTC is deterministic for one input
  ASSERT_THAT(a->kernels, SizeIs(1));
  ASSERT_THAT(b->kernels, SizeIs(1));
  EXPECT_EQ(a->kernels[0].registers, b->kernels[0].registers);
  // (The logs differ only in ptxas's "Compile time = ..." line.)
}

// A module of two units crosses the worker protocol whole: the worker
// compiles both and answers both images, as in process.
TEST(WorkerPoolTest, ModuleOfTwoUnitsCompilesInTheWorker) {
  WorkerPool pool(TestOptions());
  Nvrtc nvrtc;
  InProcessCompiler local(&nvrtc);
  CompileInput in = Tiny("sm_90a");
  in.more_units = {testing::TinyKernelSource("kc_tiny_second")};
  absl::StatusOr<CompileOutput> a = pool.Compile(in, In(absl::Seconds(60)));
  absl::StatusOr<CompileOutput> b = local.Compile(in, In(absl::Seconds(60)));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(a->cubin, b->cubin);
  absl::StatusOr<std::vector<std::string_view>> images = SplitCubinImages(a->cubin);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_THAT(*images, SizeIs(2));
  ASSERT_THAT(a->kernels, SizeIs(2));
  EXPECT_EQ(a->kernels[1].name, "kc_tiny_second");
}

TEST(WorkerPoolTest, CompileErrorComesBackWithItsLog) {
  WorkerPool pool(TestOptions());
  CompileInput in = Tiny();
  in.source = "extern \"C\" __global__ void k() { no_such_fn(); }\n";
  absl::StatusOr<CompileOutput> out = pool.Compile(in, In(absl::Seconds(60)));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("no_such_fn"));
  EXPECT_EQ(pool.live_workers(), 1);  // a compile error is not a worker failure
  EXPECT_EQ(pool.retried_compiles(), 0);
}

// Blocks until the worker (a child of this process) has exited, every
// thread of it, without reaping it: that stays the pool's job.
void AwaitExit(pid_t pid) {
  siginfo_t info;
  while (waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0) {
    ASSERT_EQ(errno, EINTR) << "waitid " << pid << ": " << strerror(errno);
  }
}

// Issue 17 item 8: a worker that died while idle (OOM killer, a stray kill)
// used to fail the next, unrelated compile with INTERNAL.
TEST(WorkerPoolTest, DeadIdleWorkerIsReplacedWithoutFailingTheNextCompile) {
  WorkerPool pool(TestOptions());
  ASSERT_TRUE(pool.Compile(Tiny(), In(absl::Seconds(60))).ok());
  std::vector<pid_t> idle = pool.idle_worker_pids();
  ASSERT_THAT(idle, SizeIs(1));
  ASSERT_EQ(kill(idle[0], SIGKILL), 0);
  ASSERT_NO_FATAL_FAILURE(AwaitExit(idle[0]));

  absl::StatusOr<CompileOutput> out = pool.Compile(Tiny("sm_80"), In(absl::Seconds(60)));
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(pool.live_workers(), 1);
  EXPECT_EQ(pool.retried_compiles(), 0);  // replaced before use, not retried
  std::vector<pid_t> now = pool.idle_worker_pids();
  ASSERT_THAT(now, SizeIs(1));
  EXPECT_NE(now[0], idle[0]);
}

// Issue 17 item 8: a worker crash under a compile used to fail it (and every
// request waiting on it); the pool now retries it once on a fresh worker.
TEST(WorkerPoolTest, CompileWhoseWorkerDiedIsRetriedOnceOnAFreshWorker) {
  testing::TempDir dir;
  WorkerPool pool(TestOptions());
  CompileInput in = Tiny();
  in.extra_options = {"kcache-test-crash-once=" + dir.Sub("crashed")};
  absl::StatusOr<CompileOutput> out = pool.Compile(in, In(absl::Seconds(60)));
  EXPECT_TRUE(out.ok()) << out.status();
  struct stat st;
  EXPECT_EQ(stat(dir.Sub("crashed").c_str(), &st), 0);  // the first worker did crash
  EXPECT_EQ(pool.retried_compiles(), 1);
  EXPECT_EQ(pool.live_workers(), 1);
}

TEST(WorkerPoolTest, CrashIsContainedAndTheNextRequestServed) {
  WorkerPool pool(TestOptions());
  CompileInput crash = Tiny();
  crash.extra_options = {"kcache-test-crash"};
  absl::StatusOr<CompileOutput> out = pool.Compile(crash, In(absl::Seconds(60)));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("compile worker crashed with signal 6"));
  EXPECT_THAT(out.status().message(), HasSubstr("test fault: crashing"));  // its output
  // It crashes every worker: retried once, on a fresh one, and no more.
  EXPECT_THAT(out.status().message(), HasSubstr("retried once on a fresh compile worker"));
  EXPECT_EQ(pool.retried_compiles(), 1);
  EXPECT_EQ(pool.live_workers(), 0);

  absl::StatusOr<CompileOutput> next = pool.Compile(Tiny(), In(absl::Seconds(60)));
  EXPECT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(pool.live_workers(), 1);
}

TEST(WorkerPoolTest, HangIsKilledAtItsDeadlineAndTheNextRequestServed) {
  WorkerPool pool(TestOptions());
  CompileInput hang = Tiny();
  hang.extra_options = {"kcache-test-hang"};
  const absl::Time start = absl::Now();
  absl::StatusOr<CompileOutput> out = pool.Compile(hang, start + absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDeadlineExceeded) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("killed"));
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_EQ(pool.live_workers(), 0);
  EXPECT_EQ(pool.retried_compiles(), 0);  // a deadline is not retried

  absl::StatusOr<CompileOutput> next = pool.Compile(Tiny(), In(absl::Seconds(60)));
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST(WorkerPoolTest, TestFaultsAreInertWithoutTheFlag) {
  WorkerPoolOptions o = TestOptions();
  o.enable_test_faults = false;
  WorkerPool pool(o);
  CompileInput crash = Tiny();
  crash.extra_options = {"kcache-test-crash"};
  absl::StatusOr<CompileOutput> out = pool.Compile(crash, In(absl::Seconds(60)));
  // Reaches NVRTC, which rejects the unknown option; the worker lives on.
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_EQ(pool.live_workers(), 1);
}

TEST(WorkerPoolTest, ConcurrentCompilesStayWithinTheBound) {
  WorkerPool pool(TestOptions(/*max_workers=*/2));
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(6);
  threads.reserve(results.size());
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      CompileInput in = Tiny(i % 2 ? "sm_80" : "sm_90a");
      in.source = testing::TinyKernelSource("kc_tiny_" + std::to_string(i));
      results[i] = pool.Compile(in, In(absl::Seconds(120))).status();
      EXPECT_LE(pool.live_workers(), 2);
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_LE(pool.live_workers(), 2);
}

TEST(WorkerPoolTest, MissingWorkerBinaryIsUnavailable) {
  WorkerPoolOptions o = TestOptions();
  o.worker_path = "/nonexistent/kcache-compile-worker";
  WorkerPool pool(o);
  absl::StatusOr<CompileOutput> out = pool.Compile(Tiny(), In(absl::Seconds(10)));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("/nonexistent/kcache-compile-worker"));
  EXPECT_EQ(pool.live_workers(), 0);
}

TEST(WorkerPoolTest, MissingNvrtcInTheWorkerIsUnavailable) {
  WorkerPoolOptions o = TestOptions();
  o.nvrtc_path = "/nonexistent/libnvrtc.so.13";
  WorkerPool pool(o);
  absl::StatusOr<CompileOutput> out = pool.Compile(Tiny(), In(absl::Seconds(10)));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("/nonexistent/libnvrtc.so.13"));
}

// Issue 26: small limits so that the faults hit them fast.
WorkerPoolOptions LimitedOptions() {
  WorkerPoolOptions o = TestOptions(/*max_workers=*/2);
  o.limit_as_bytes = uint64_t{512} << 20;
  o.limit_cpu_seconds = 1;
  return o;
}

TEST(WorkerPoolTest, MemoryLimitFailsResourceExhaustedAndIsNotRetried) {
  WorkerPool pool(LimitedOptions());
  // A healthy worker first, which stays healthy and idle.
  ASSERT_TRUE(pool.Compile(Tiny("sm_80"), In(absl::Seconds(60))).ok());
  CompileInput hog = Tiny();
  hog.program_name = "hog.cu";
  hog.extra_options = {"kcache-test-alloc"};
  absl::StatusOr<CompileOutput> out = pool.Compile(hog, In(absl::Seconds(60)));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("address-space (memory) limit"));
  EXPECT_THAT(out.status().message(), HasSubstr("limit=address_space"));
  EXPECT_THAT(out.status().message(), HasSubstr("'hog.cu'"));
  EXPECT_EQ(pool.retried_compiles(), 0);
  EXPECT_EQ(pool.limit_exceeded(WorkerPool::kAddressSpace), 1);
  EXPECT_EQ(pool.limit_exceeded(WorkerPool::kCpuTime), 0);

  absl::StatusOr<CompileOutput> next = pool.Compile(Tiny(), In(absl::Seconds(60)));
  EXPECT_TRUE(next.ok()) << next.status();
  EXPECT_LE(pool.live_workers(), 2);
}

TEST(WorkerPoolTest, CpuTimeLimitFailsResourceExhaustedAndIsNotRetried) {
  WorkerPool pool(LimitedOptions());
  CompileInput spin = Tiny();
  spin.program_name = "spin.cu";
  spin.extra_options = {"kcache-test-spin"};
  const absl::Time start = absl::Now();
  absl::StatusOr<CompileOutput> out = pool.Compile(spin, In(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // the limit, not the deadline
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("CPU-time limit (1 s per compile"));
  EXPECT_THAT(out.status().message(), HasSubstr("limit=cpu_time"));
  EXPECT_THAT(out.status().message(), HasSubstr("'spin.cu'"));
  EXPECT_EQ(pool.retried_compiles(), 0);
  EXPECT_EQ(pool.limit_exceeded(WorkerPool::kCpuTime), 1);
  EXPECT_EQ(pool.live_workers(), 0);

  // The budget is per compile: a worker that has compiled several times
  // (more than 1 s of CPU in all, possibly) keeps compiling.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<CompileOutput> next =
        pool.Compile(Tiny(i % 2 ? "sm_80" : "sm_90a"), In(absl::Seconds(60)));
    EXPECT_TRUE(next.ok()) << next.status();
  }
  EXPECT_EQ(pool.live_workers(), 1);
}

TEST(WorkerPoolTest, DefaultLimitsLetRealCompilesThrough) {
  WorkerPoolOptions o = TestOptions();
  EXPECT_EQ(o.limit_as_bytes, uint64_t{4} << 30);
  EXPECT_EQ(o.limit_cpu_seconds, 120u);
  EXPECT_EQ(o.limit_fsize_bytes, uint64_t{256} << 20);
  WorkerPool pool(o);
  EXPECT_TRUE(pool.Compile(Tiny(), In(absl::Seconds(60))).ok());
}

TEST(WorkerPoolTest, PassedDeadlineFailsFast) {
  WorkerPool pool(TestOptions());
  EXPECT_EQ(pool.Compile(Tiny(), absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace kcache
