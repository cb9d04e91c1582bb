// Issue 26 against a real kcached in compile-only mode: a compile that runs
// past the compile workers' memory limit and one that runs past their
// CPU-time limit each fail RESOURCE_EXHAUSTED naming the limit and the key,
// for every waiter and for a later request (the error is remembered), while
// another client keeps getting its hits, an unrelated compile succeeds, and
// the daemon's own memory stays small.
//
// The two limit faults are the worker's test hooks (compiler/worker/worker.h):
// raw kernels named kcache_test_alloc / kcache_test_spin, honoured only when
// KCACHE_TEST_RAW_FAULTS=1 is in the environment the daemon and its workers
// inherit; the raw path itself needs --enable_raw_kernels and the token.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iostream>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_process.h"
#include "tests/common/distinct_spec.h"
#include "tests/common/raw_fixtures.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::DistinctSpec;
using ::kcache::testing::RawFixture;
using ::kcache::testing::RawKernelFlags;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kToken[] = "limits-e2e-token";
// The daemon's resident memory must stay under this while its workers hit
// their limits (it peaks near 90 MB here, the hits' gRPC traffic included;
// a worker's allocations must never be the daemon's).
constexpr int64_t kDaemonRssLimitKb = int64_t{256} * 1024;
// CPU seconds per compile for this daemon: an attention compile takes 2-3 s
// of CPU; the spinning compile is stopped after this many.
constexpr int kCpuSeconds = 8;

struct Call {
  grpc::Status status;
  v1::GetKernelResponse response;
};

Call Get(const DaemonProcess& d, const v1::GetKernelRequest& req) {
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(3)));
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  Call c;
  c.status = stub->GetKernel(&ctx, req, &c.response);
  return c;
}

// A raw PTX kernel whose only name selects the worker's test fault; the arch
// gives it a compile queue of its own.
v1::GetKernelRequest Fault(const std::string& name, const std::string& arch) {
  v1::GetKernelRequest r;
  r.mutable_raw()->set_format(v1::RawKernel::FORMAT_PTX);
  r.mutable_raw()->set_source(RawFixture("vadd.ptx"));
  r.mutable_raw()->add_kernel_names(name);
  r.mutable_target()->set_arch(arch);
  return r;
}

v1::GetKernelRequest Attention(int i) {
  v1::GetKernelRequest r;
  *r.mutable_spec() = DistinctSpec(i);
  r.mutable_target()->set_arch("sm_80");
  return r;
}

// The key the daemon gives a request, and its answer to a Prefetch of it (a
// remembered error is answered at once, with no compile).
v1::PrefetchResult PrefetchOne(const DaemonProcess& d, const v1::GetKernelRequest& req) {
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  v1::PrefetchRequest p;
  *p.add_requests() = req;
  v1::PrefetchResponse resp;
  grpc::Status st = stub->Prefetch(&ctx, p, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp.results_size() == 1 ? resp.results(0) : v1::PrefetchResult();
}

// VmRSS of `pid` in kB, from /proc/<pid>/status; -1 if unreadable.
int64_t VmRssKb(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    if (absl::ConsumePrefix(&v, "VmRSS:")) {
      v = absl::StripAsciiWhitespace(v);
      absl::ConsumeSuffix(&v, " kB");
      int64_t kb = -1;
      return absl::SimpleAtoi(v, &kb) ? kb : -1;
    }
  }
  return -1;
}

TEST(LimitsE2E, MemoryAndCpuLimitsFailNamingLimitAndKeyWhileHitsAndOtherCompilesCarryOn) {
  TempDir dir;
  std::vector<std::string> args = RawKernelFlags(dir.path(), kToken);
  // One queue per arch here (compile-only): the two faults and the
  // unrelated compile run at the same time. The memory limit is the default.
  args.insert(args.end(), {"--compile_threads=3", "--compile_workers=3",
                           absl::StrCat("--compile_limit_cpu_seconds=", kCpuSeconds),
                           // remembered past the end of the test
                           "--error_memo_ms=600000"});
  DaemonProcess d(dir.path(), args);
  setenv("KCACHE_TEST_RAW_FAULTS", "1", 1);  // inherited by kcached and its workers
  d.Start();
  unsetenv("KCACHE_TEST_RAW_FAULTS");
  if (HasFatalFailure()) return;
  const std::string log_at_start = ReadFileOrEmpty(d.log_path());
  EXPECT_THAT(log_at_start, HasSubstr("] compile worker limits: address space"));
  EXPECT_THAT(log_at_start, HasSubstr("] compile worker sandbox: network "));

  // A kernel to hit while the limits are hit.
  Call warm = Get(d, Attention(0));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message() << "\n"
                                << ReadFileOrEmpty(d.log_path());

  // The daemon's memory, sampled until the end.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> max_rss_kb{VmRssKb(d.pid())};
  std::thread sampler([&] {
    while (!stop.load()) {
      const int64_t kb = VmRssKb(d.pid());
      int64_t seen = max_rss_kb.load();
      while (kb > seen && !max_rss_kb.compare_exchange_weak(seen, kb)) {
      }
      absl::SleepFor(absl::Milliseconds(20));  // a sampling period, not a wait for an event
    }
  });
  // The concurrent client: the same hit, over and over, on its own channel.
  std::atomic<int> hits{0};
  std::vector<std::string> hit_errors;
  std::thread hitter([&] {
    auto stub = v1::KernelService::NewStub(
        grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
    while (!stop.load()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      v1::GetKernelResponse resp;
      grpc::Status st = stub->GetKernel(&ctx, Attention(0), &resp);
      if (!st.ok() || !resp.cache_hit()) {
        hit_errors.push_back(st.ok() ? "not a cache hit" : st.error_message());
        break;
      }
      hits.fetch_add(1);
      absl::SleepFor(absl::Milliseconds(5));  // a trainer's pace, not a wait for an event
    }
  });

  // Two waiters on each fault, and the unrelated compile, all at once.
  const v1::GetKernelRequest alloc = Fault("kcache_test_alloc", "sm_89");
  const v1::GetKernelRequest spin = Fault("kcache_test_spin", "sm_90a");
  constexpr int kCalls = 5;
  const v1::GetKernelRequest* reqs[kCalls] = {&alloc, &alloc, &spin, &spin, nullptr};
  const v1::GetKernelRequest unrelated = Attention(1);
  reqs[4] = &unrelated;
  std::vector<Call> calls(kCalls);
  std::latch go(kCalls);
  std::vector<std::thread> threads;
  threads.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] {
      go.arrive_and_wait();
      calls[i] = Get(d, *reqs[i]);
    });
  }
  for (auto& t : threads) t.join();
  const int hits_during = hits.load();
  stop.store(true);
  hitter.join();
  sampler.join();

  const std::string log = ReadFileOrEmpty(d.log_path());
  // The unrelated compile.
  EXPECT_TRUE(calls[4].status.ok()) << calls[4].status.error_message() << "\n" << log;
  EXPECT_FALSE(calls[4].response.cache_hit());
  EXPECT_FALSE(calls[4].response.cubin().empty());
  // The faults: every waiter gets RESOURCE_EXHAUSTED naming the limit and
  // the key the daemon gives that request.
  struct Expect {
    const v1::GetKernelRequest* req;
    int first_call;
    std::string limit;
    std::string what;
  };
  for (const Expect& e : {Expect{&alloc, 0, "limit=address_space", "address-space (memory) limit"},
                          Expect{&spin, 2, "limit=cpu_time", "CPU-time limit"}}) {
    SCOPED_TRACE(e.limit);
    // Asked again (by Prefetch, which also returns the key): the remembered
    // error, no second compile.
    const v1::PrefetchResult again = PrefetchOne(d, *e.req);
    ASSERT_EQ(again.key().size(), 41u);
    const std::string key_hex = absl::BytesToHexString(again.key());
    EXPECT_EQ(again.state(), v1::PrefetchResult::STATE_REJECTED);
    EXPECT_THAT(again.error(), HasSubstr(absl::StrCat("key ", key_hex, ": ")));
    EXPECT_THAT(again.error(), HasSubstr(e.limit));
    for (int i = e.first_call; i < e.first_call + 2; ++i) {
      EXPECT_EQ(calls[i].status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << calls[i].status.error_message();
      EXPECT_THAT(calls[i].status.error_message(), HasSubstr(absl::StrCat("key ", key_hex, ": ")));
      EXPECT_THAT(calls[i].status.error_message(), HasSubstr(e.limit));
      EXPECT_THAT(calls[i].status.error_message(), HasSubstr(e.what));
    }
  }
  // The hits went on throughout (the spin alone takes kCpuSeconds).
  EXPECT_TRUE(hit_errors.empty()) << absl::StrJoin(hit_errors, "; ");
  EXPECT_GE(hits_during, 100);
  // Bounded memory: the workers' allocations are theirs, not the daemon's.
  EXPECT_GT(max_rss_kb.load(), 0);
  EXPECT_LT(max_rss_kb.load(), kDaemonRssLimitKb)
      << "kcached VmRSS peaked at " << max_rss_kb.load() << " kB";
  // Each limit hit once (the second waiter joined, the Prefetch got the
  // memo), counted by limit.
  v1::StatsResponse stats = d.Stats();
  EXPECT_EQ(stats.compile_failures(), 2u) << log;
  std::cout << "memory: " << calls[0].status.error_message()
            << "\ncpu: " << calls[2].status.error_message() << "\n";
  std::cout << "kcached VmRSS peak " << max_rss_kb.load() << " kB; " << hits_during
            << " hits during the limit hits\n";
  // And the daemon still answers.
  Call after = Get(d, Attention(0));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_TRUE(after.response.cache_hit());
}

}  // namespace
}  // namespace kcache
