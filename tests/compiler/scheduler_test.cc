// Tests of the compile scheduler with fake devices (named queues) and a fake
// compile job whose start and end the test controls through gates; time is a
// FakeClock. No test sleeps: threads meet on latches, notifications and
// conditions over the fake's state.
#include "compiler/scheduler/scheduler.h"

#include <atomic>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "compiler/cuda/compile.h"
#include "compiler/scheduler/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace kcache {

// Found by argument-dependent lookup, so it lives beside ProgressEvent.
void PrintTo(const ProgressEvent& e, std::ostream* os) {
  *os << PhaseName(e.phase) << "(" << e.queue_position << ", " << e.queue << ")";
}

namespace {

using ::kcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fake compiler. Each job counts its compiles, records the order in which
// jobs start, checks that its queue never runs two jobs at once, and blocks
// on its key's gate until the test opens it (gates are open unless closed).
class FakeCompiler {
 public:
  void Close(const std::string& key) {
    absl::MutexLock l(&mu_);
    closed_.insert(key);
  }
  void Open(const std::string& key) {
    absl::MutexLock l(&mu_);
    closed_.erase(key);
  }
  // Closes every gate, for keys not seen yet too, until ReleaseAll.
  void HoldAll() {
    absl::MutexLock l(&mu_);
    hold_all_ = true;
  }
  void ReleaseAll() {
    absl::MutexLock l(&mu_);
    hold_all_ = false;
    closed_.clear();
  }

  // Makes the job function for `key`, to be submitted on `queue`. With an
  // error, the job fails with it; otherwise it returns a fresh kernel, so
  // that two compiles of one key would give two different pointers.
  JobFn Job(const std::string& key, const std::string& queue,
            absl::Status error = absl::OkStatus()) {
    return [this, key, queue, error = std::move(error)](const ReportFn& report) -> CompileResult {
      std::atomic<int>& in_flight = InFlight(queue);
      if (in_flight.fetch_add(1) != 0) overlaps_.fetch_add(1);
      const int total = running_.fetch_add(1) + 1;
      int seen = max_running_.load();
      while (total > seen && !max_running_.compare_exchange_weak(seen, total)) {
      }
      {
        absl::MutexLock l(&mu_);
        ++compiles_[key];
        started_.push_back(key);
        auto open = [this, &key]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !hold_all_ && !closed_.contains(key);
        };
        mu_.Await(absl::Condition(&open));
      }
      report(Phase::kVerifying);
      running_.fetch_sub(1);
      in_flight.fetch_sub(1);
      {
        absl::MutexLock l(&mu_);
        ++finished_[key];
      }
      if (!error.ok()) return error;
      auto kernel = std::make_shared<CompiledKernel>();
      kernel->record.set_key(key);
      kernel->record.set_arch(queue);
      kernel->cubin = "cubin of " + key;
      return std::shared_ptr<const CompiledKernel>(std::move(kernel));
    };
  }

  // Blocks until the job of `key` has started `n` times / finished `n` times.
  void WaitStarted(const std::string& key, int n = 1) {
    absl::MutexLock l(&mu_);
    auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return Count(compiles_, key) >= n; };
    mu_.Await(absl::Condition(&done));
  }
  void WaitFinished(const std::string& key, int n = 1) {
    absl::MutexLock l(&mu_);
    auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return Count(finished_, key) >= n; };
    mu_.Await(absl::Condition(&done));
  }

  int compiles(const std::string& key) {
    absl::MutexLock l(&mu_);
    return Count(compiles_, key);
  }
  int total_compiles() {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const auto& [k, c] : compiles_) n += c;
    return n;
  }
  std::vector<std::string> started() {
    absl::MutexLock l(&mu_);
    return started_;
  }
  int overlaps() const { return overlaps_.load(); }
  int max_running() const { return max_running_.load(); }

 private:
  static int Count(const std::map<std::string, int>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? 0 : it->second;
  }
  std::atomic<int>& InFlight(const std::string& queue) {
    absl::MutexLock l(&mu_);
    auto& slot = in_flight_[queue];
    if (slot == nullptr) slot = std::make_unique<std::atomic<int>>(0);
    return *slot;
  }

  absl::Mutex mu_;
  std::set<std::string> closed_ ABSL_GUARDED_BY(mu_);
  bool hold_all_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, int> compiles_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> finished_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> started_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<std::atomic<int>>> in_flight_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> overlaps_{0};
  std::atomic<int> running_{0};
  std::atomic<int> max_running_{0};
};

// Records one waiter's progress events.
class Recorder {
 public:
  ProgressFn Fn() {
    return [this](const ProgressEvent& e) {
      absl::MutexLock l(&mu_);
      events_.push_back(e);
    };
  }
  std::vector<ProgressEvent> events() {
    absl::MutexLock l(&mu_);
    return events_;
  }
  // Blocks until `n` events have arrived.
  void WaitFor(size_t n) {
    absl::MutexLock l(&mu_);
    auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return events_.size() >= n; };
    mu_.Await(absl::Condition(&done));
  }

 private:
  absl::Mutex mu_;
  std::vector<ProgressEvent> events_ ABSL_GUARDED_BY(mu_);
};

ProgressEvent Queued(int position, const std::string& queue) {
  return ProgressEvent{Phase::kQueued, position, queue};
}
ProgressEvent At(Phase phase, const std::string& queue) { return ProgressEvent{phase, 0, queue}; }

Request Req(FakeCompiler& fake, const std::string& key, const std::string& queue,
            Priority priority = Priority::kInteractive,
            absl::Time deadline = absl::InfiniteFuture()) {
  Request r;
  r.key = key;
  r.queue = queue;
  r.priority = priority;
  r.deadline = deadline;
  r.job = fake.Job(key, queue);
  return r;
}

QueueStats StatsOf(const Scheduler& s, const std::string& queue) {
  for (const QueueStats& q : s.Stats()) {
    if (q.name == queue) return q;
  }
  ADD_FAILURE() << "no queue " << queue;
  return {};
}

Scheduler::Options OneThread(Clock* clock = nullptr) {
  Scheduler::Options o;
  o.compile_threads = 1;
  o.clock = clock;
  return o;
}

// Submits `r` with its key's gate closed and returns once its job runs: the
// queue stays busy until the test opens the gate.
absl::StatusOr<std::unique_ptr<Ticket>> SubmitRunning(Scheduler& scheduler, FakeCompiler& fake,
                                                      Request r) {
  const std::string key = r.key;
  fake.Close(key);
  auto ticket = scheduler.Submit(std::move(r));
  if (ticket.ok()) fake.WaitStarted(key);
  return ticket;
}

// The same through SubmitPrefetch.
absl::Status PrefetchRunning(Scheduler& scheduler, FakeCompiler& fake, Request r) {
  const std::string key = r.key;
  fake.Close(key);
  absl::Status submitted = scheduler.SubmitPrefetch(std::move(r));
  if (submitted.ok()) fake.WaitStarted(key);
  return submitted;
}

// ---------------------------------------------------------------------------

TEST(SchedulerTest, ManyThreadsManyDevicesShareOneCompilePerKey) {
  // 4 devices of two architectures; the store key includes the architecture,
  // so 8 kernels make 16 distinct keys, each asked for by 4 threads from 2
  // devices.
  const std::vector<std::string> queues = {"gpu0", "gpu1", "gpu2", "gpu3"};
  const std::vector<std::string> arch = {"sm_90a", "sm_90a", "sm_80", "sm_80"};
  constexpr int kThreads = 64;
  FakeCompiler fake;
  fake.HoldAll();  // every compile blocks until all 64 requests are in
  Scheduler::Options options;
  options.compile_threads = 4;
  Scheduler scheduler(options);

  std::latch start(kThreads);
  std::latch submitted(kThreads);
  std::vector<CompileResult> results(kThreads, absl::UnknownError("unset"));
  std::vector<std::string> keys(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    const int device = i % 4;
    keys[i] = absl::StrCat("kernel", (i / 4) % 8, "@", arch[device]);
    threads.emplace_back([&, i, device] {
      Request r = Req(fake, keys[i], queues[device]);
      start.arrive_and_wait();
      auto ticket = scheduler.Submit(std::move(r));
      submitted.count_down();
      if (!ticket.ok()) {
        results[i] = ticket.status();
        return;
      }
      results[i] = (*ticket)->Wait();
    });
  }
  submitted.wait();
  fake.ReleaseAll();  // every request is registered: let the compiles run
  for (auto& t : threads) t.join();

  EXPECT_EQ(fake.total_compiles(), 16);
  std::map<std::string, const CompiledKernel*> kernel_of;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(fake.compiles(keys[i]), 1) << keys[i];
    EXPECT_EQ((*results[i])->record.key(), keys[i]);
    EXPECT_EQ((*results[i])->cubin, "cubin of " + keys[i]);
    auto [it, inserted] = kernel_of.emplace(keys[i], results[i]->get());
    EXPECT_EQ(it->second, results[i]->get()) << "two objects for " << keys[i];
  }
  EXPECT_EQ(kernel_of.size(), 16u);
  EXPECT_EQ(fake.overlaps(), 0) << "two compiles at once in one queue";
  EXPECT_LE(fake.max_running(), 4);
  uint64_t run = 0, dedup = 0, failed = 0;
  for (const QueueStats& q : scheduler.Stats()) {
    run += q.jobs_run;
    dedup += q.deduplicated;
    failed += q.jobs_failed;
    EXPECT_EQ(q.depth, 0);
    EXPECT_FALSE(q.busy);
  }
  EXPECT_EQ(run, 16u);
  EXPECT_EQ(dedup, 48u);
  EXPECT_EQ(failed, 0u);
}

TEST(SchedulerTest, InteractiveBeforePrefetchFifoWithinPriorityAndPromotion) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  auto blocker = SubmitRunning(scheduler, fake, Req(fake, "blocker", "gpu0"));
  ASSERT_TRUE(blocker.ok());

  ASSERT_TRUE(scheduler.SubmitPrefetch(Req(fake, "p1", "gpu0", Priority::kPrefetch)).ok());
  ASSERT_TRUE(scheduler.SubmitPrefetch(Req(fake, "p2", "gpu0", Priority::kPrefetch)).ok());
  auto i1 = scheduler.Submit(Req(fake, "i1", "gpu0"));
  auto i2 = scheduler.Submit(Req(fake, "i2", "gpu0"));
  ASSERT_TRUE(scheduler.SubmitPrefetch(Req(fake, "p3", "gpu0", Priority::kPrefetch)).ok());
  // A trainer now wants p2: it moves ahead of the other prefetch work,
  // behind the interactive work that was already waiting.
  auto p2 = scheduler.Submit(Req(fake, "p2", "gpu0"));
  ASSERT_TRUE(i1.ok() && i2.ok() && p2.ok());
  EXPECT_EQ(StatsOf(scheduler, "gpu0").depth, 5);

  fake.Open("blocker");
  EXPECT_TRUE((*p2)->Wait().ok());
  EXPECT_TRUE((*i1)->Wait().ok());
  EXPECT_TRUE((*i2)->Wait().ok());
  EXPECT_TRUE((*blocker)->Wait().ok());
  fake.WaitFinished("p1");
  fake.WaitFinished("p3");
  EXPECT_THAT(fake.started(), ElementsAre("blocker", "i1", "i2", "p2", "p1", "p3"));
  EXPECT_EQ(fake.compiles("p2"), 1);
  EXPECT_EQ(StatsOf(scheduler, "gpu0").deduplicated, 1u);
}

TEST(SchedulerTest, ScarceThreadsServeInteractiveFirstAcrossQueues) {
  // One compile thread for two queues: the thread takes the most urgent head.
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  ASSERT_TRUE(PrefetchRunning(scheduler, fake, Req(fake, "blocker", "gpu0")).ok());
  ASSERT_TRUE(scheduler.SubmitPrefetch(Req(fake, "p", "gpu1", Priority::kPrefetch)).ok());
  auto i = scheduler.Submit(Req(fake, "i", "gpu2"));
  ASSERT_TRUE(i.ok());
  fake.Open("blocker");
  EXPECT_TRUE((*i)->Wait().ok());
  fake.WaitFinished("p");
  EXPECT_THAT(fake.started(), ElementsAre("blocker", "i", "p"));
}

TEST(SchedulerTest, DeadlinePassesWhileQueuedWaiterLeavesAndJobIsDropped) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler scheduler(OneThread(&clock));
  auto blocker = SubmitRunning(scheduler, fake, Req(fake, "blocker", "gpu0"));
  ASSERT_TRUE(blocker.ok());

  auto late = scheduler.Submit(
      Req(fake, "late", "gpu0", Priority::kInteractive, clock.Now() + absl::Seconds(10)));
  ASSERT_TRUE(late.ok());
  CompileResult result = absl::UnknownError("unset");
  std::thread waiter([&] { result = (*late)->Wait(); });
  clock.BlockUntilWaiters(1);
  clock.Advance(absl::Seconds(9));
  EXPECT_EQ(StatsOf(scheduler, "gpu0").depth, 1);  // still waiting
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kDeadlineExceeded));

  QueueStats stats = StatsOf(scheduler, "gpu0");
  EXPECT_EQ(stats.depth, 0);
  EXPECT_EQ(stats.dropped, 1u);
  // The blocker finishes; a job queued behind it runs next, and "late" never
  // does (had it stayed queued, it would have run first).
  fake.Open("blocker");
  EXPECT_TRUE((*blocker)->Wait().ok());
  EXPECT_TRUE(scheduler.Run(Req(fake, "next", "gpu0")).ok());
  EXPECT_EQ(fake.compiles("late"), 0);
  EXPECT_THAT(fake.started(), ElementsAre("blocker", "next"));
}

TEST(SchedulerTest, StartedJobFinishesAndPublishesAfterItsWaitersLeave) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler scheduler(OneThread(&clock));
  auto slow = SubmitRunning(
      scheduler, fake,
      Req(fake, "slow", "gpu0", Priority::kInteractive, clock.Now() + absl::Seconds(5)));
  ASSERT_TRUE(slow.ok());
  CompileResult result = absl::UnknownError("unset");
  std::thread waiter([&] { result = (*slow)->Wait(); });
  clock.BlockUntilWaiters(1);
  clock.Advance(absl::Seconds(5));
  waiter.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(StatsOf(scheduler, "gpu0").busy);

  fake.Open("slow");
  fake.WaitFinished("slow");  // the job's side effects (the store publish) happen
  // A request after the job is done is not single-flighted any more (the
  // daemon finds the result in the store first).
  EXPECT_TRUE(scheduler.Run(Req(fake, "after", "gpu0")).ok());
  QueueStats stats = StatsOf(scheduler, "gpu0");
  EXPECT_EQ(stats.jobs_run, 2u);
  EXPECT_EQ(stats.dropped, 0u);
}

TEST(SchedulerTest, PrefetchJobIsNotDroppedWhenItsWaitersLeave) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  ASSERT_TRUE(PrefetchRunning(scheduler, fake, Req(fake, "blocker", "gpu0")).ok());
  ASSERT_TRUE(scheduler.SubmitPrefetch(Req(fake, "warm", "gpu0", Priority::kPrefetch)).ok());
  {
    auto joined = scheduler.Submit(Req(fake, "warm", "gpu0"));
    ASSERT_TRUE(joined.ok());
    (*joined)->Cancel();
    EXPECT_THAT((*joined)->Wait(), StatusIs(absl::StatusCode::kCancelled));
  }
  // And a job that a prefetch joined is kept too.
  auto interactive = scheduler.Submit(Req(fake, "wanted", "gpu0"));
  ASSERT_TRUE(interactive.ok());
  ASSERT_TRUE(scheduler.SubmitPrefetch(Req(fake, "wanted", "gpu0", Priority::kPrefetch)).ok());
  interactive->reset();  // abandons the wait
  EXPECT_EQ(StatsOf(scheduler, "gpu0").depth, 2);

  fake.Open("blocker");
  fake.WaitFinished("warm");
  fake.WaitFinished("wanted");
  EXPECT_EQ(StatsOf(scheduler, "gpu0").dropped, 0u);
}

TEST(SchedulerTest, CancelTokenAbandonsRunAndDropsTheQueuedJob) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  ASSERT_TRUE(PrefetchRunning(scheduler, fake, Req(fake, "blocker", "gpu0")).ok());

  CancelToken token;
  Recorder recorder;
  Request r = Req(fake, "gone", "gpu0");
  r.progress = recorder.Fn();
  CompileResult result = absl::UnknownError("unset");
  std::thread client([&] { result = scheduler.Run(std::move(r), &token); });
  recorder.WaitFor(1);  // it is queued and waiting
  token.Cancel();
  client.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(StatsOf(scheduler, "gpu0").dropped, 1u);
  EXPECT_EQ(StatsOf(scheduler, "gpu0").depth, 0);
  // A token cancelled before Run cancels at once.
  EXPECT_THAT(scheduler.Run(Req(fake, "gone2", "gpu0"), &token),
              StatusIs(absl::StatusCode::kCancelled));
  fake.Open("blocker");
}

TEST(SchedulerTest, CompileErrorIsSharedRememberedAndRetriedAfterTtl) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler::Options options = OneThread(&clock);
  options.error_ttl = absl::Seconds(30);
  Scheduler scheduler(options);
  const absl::Status compile_error =
      absl::FailedPreconditionError("nvrtc: kernel.cu(12): error: identifier \"q\" is undefined");
  auto bad = [&] {
    Request r = Req(fake, "bad", "gpu0");
    r.job = fake.Job("bad", "gpu0", compile_error);
    return r;
  };

  // A storm of identical bad requests while the first compile runs.
  constexpr int kStorm = 16;
  fake.Close("bad");
  std::latch submitted(kStorm);
  std::vector<CompileResult> results(kStorm, absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  threads.reserve(kStorm);
  for (int i = 0; i < kStorm; ++i) {
    threads.emplace_back([&, i] {
      auto t = scheduler.Submit(bad());
      submitted.count_down();
      results[i] = t.ok() ? (*t)->Wait() : CompileResult(t.status());
    });
  }
  submitted.wait();
  fake.Open("bad");
  for (auto& t : threads) t.join();
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(r.status().message(), HasSubstr("identifier"));
  }
  EXPECT_EQ(fake.compiles("bad"), 1);

  // Within the TTL: the remembered error, no compile.
  clock.Advance(absl::Seconds(29));
  EXPECT_THAT(scheduler.Run(bad()), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(scheduler.SubmitPrefetch(bad()), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(fake.compiles("bad"), 1);
  QueueStats stats = StatsOf(scheduler, "gpu0");
  EXPECT_EQ(stats.jobs_run, 1u);
  EXPECT_EQ(stats.jobs_failed, 1u);
  EXPECT_EQ(stats.memo_hits, 2u);
  EXPECT_EQ(stats.deduplicated, kStorm - 1 + 2u);

  // After the TTL: compiled again.
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(scheduler.Run(bad()), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(fake.compiles("bad"), 2);
}

TEST(SchedulerTest, TransientErrorsAreNotRemembered) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  auto flaky = [&] {
    Request r = Req(fake, "flaky", "gpu0");
    r.job = fake.Job("flaky", "gpu0", absl::UnavailableError("device lost"));
    return r;
  };
  EXPECT_THAT(scheduler.Run(flaky()), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(scheduler.Run(flaky()), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(fake.compiles("flaky"), 2);
}

// Issue 26: a compile that hit a worker's resource limit names its key (hex)
// as well as the limit, for the waiter that started it, one that joined, and
// a later request answered from the memo; other errors are left as they are.
TEST(SchedulerTest, LimitErrorNamesTheKeyForEveryWaiterAndTheMemo) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler scheduler(OneThread(&clock));
  const std::string key("\x01\xab\xcd\x00\x7f", 5);  // opaque bytes, as store keys are
  const absl::Status limit_error = absl::ResourceExhaustedError(
      absl::StrCat("compile of raw kernel for sm_80 ", kCompileLimitExceeded,
                   " CPU-time limit (2 s per compile); limit=cpu_time"));
  auto req = [&] {
    Request r = Req(fake, key, "sm_80");
    r.job = fake.Job(key, "sm_80", limit_error);
    return r;
  };
  fake.Close(key);
  auto first = scheduler.Submit(req());
  ASSERT_TRUE(first.ok()) << first.status();
  fake.WaitStarted(key);
  auto joined = scheduler.Submit(req());
  ASSERT_TRUE(joined.ok()) << joined.status();
  fake.Open(key);
  for (const CompileResult& r : {(*first)->Wait(), (*joined)->Wait(), scheduler.Run(req())}) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(r.status().message(), HasSubstr("key 01abcd007f: compile of raw kernel"));
    EXPECT_THAT(r.status().message(), HasSubstr("limit=cpu_time"));
  }
  EXPECT_EQ(fake.compiles(key), 1);

  // A queue that is full is ResourceExhausted too, but not a worker limit.
  auto other = [&] {
    Request r = Req(fake, "other", "sm_80");
    r.job = fake.Job("other", "sm_80", absl::ResourceExhaustedError("out of disk quota"));
    return r;
  };
  CompileResult r = scheduler.Run(other());
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(r.status().message(), "out of disk quota");
}

TEST(SchedulerTest, FullQueueRefusesNewJobsButLetsRequestsJoin) {
  FakeCompiler fake;
  Scheduler::Options options = OneThread();
  options.max_queue_depth = 2;
  Scheduler scheduler(options);
  // Running: not counted in the depth.
  ASSERT_TRUE(PrefetchRunning(scheduler, fake, Req(fake, "blocker", "gpu0")).ok());
  ASSERT_TRUE(scheduler.SubmitPrefetch(Req(fake, "a", "gpu0", Priority::kPrefetch)).ok());
  auto b = scheduler.Submit(Req(fake, "b", "gpu0"));
  ASSERT_TRUE(b.ok());

  EXPECT_THAT(scheduler.SubmitPrefetch(Req(fake, "c", "gpu0", Priority::kPrefetch)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  auto c = scheduler.Submit(Req(fake, "c", "gpu0"));
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(c.status().message(), HasSubstr("gpu0"));
  auto join = scheduler.Submit(Req(fake, "a", "gpu0"));  // joins: no new job
  EXPECT_TRUE(join.ok());
  fake.Close("elsewhere");
  auto elsewhere = scheduler.Submit(Req(fake, "elsewhere", "gpu1"));  // another queue
  EXPECT_TRUE(elsewhere.ok());

  QueueStats stats = StatsOf(scheduler, "gpu0");
  EXPECT_EQ(stats.depth, 2);
  EXPECT_EQ(stats.rejected, 2u);
  fake.ReleaseAll();
  EXPECT_TRUE((*b)->Wait().ok());
  EXPECT_TRUE((*join)->Wait().ok());
}

TEST(SchedulerTest, ShutdownFailsQueuedJobsAndWaitsForRunningOnesUpToGrace) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler scheduler(OneThread(&clock));
  auto running = SubmitRunning(scheduler, fake, Req(fake, "running", "gpu0"));
  ASSERT_TRUE(running.ok());
  Recorder recorder;
  Request q = Req(fake, "queued", "gpu0");
  q.progress = recorder.Fn();
  auto queued = scheduler.Submit(std::move(q));
  ASSERT_TRUE(queued.ok());
  ASSERT_TRUE(scheduler.SubmitPrefetch(Req(fake, "prefetch", "gpu0", Priority::kPrefetch)).ok());

  absl::Status shutdown = absl::UnknownError("unset");
  std::thread stopper([&] { shutdown = scheduler.Shutdown(absl::Seconds(5)); });
  EXPECT_THAT((*queued)->Wait(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(recorder.events(), ElementsAre(Queued(0, "gpu0"), At(Phase::kFailed, "gpu0")));
  EXPECT_THAT(scheduler.Submit(Req(fake, "new", "gpu0")), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(scheduler.SubmitPrefetch(Req(fake, "new", "gpu0")),
              StatusIs(absl::StatusCode::kUnavailable));

  clock.BlockUntilWaiters(1);  // the stopper waits for the running compile
  clock.Advance(absl::Seconds(5));
  stopper.join();
  EXPECT_THAT(shutdown, StatusIs(absl::StatusCode::kDeadlineExceeded));

  // The running compile still completes and reaches its waiter.
  fake.Open("running");
  EXPECT_TRUE((*running)->Wait().ok());
  EXPECT_EQ(fake.compiles("queued"), 0);
  EXPECT_EQ(fake.compiles("prefetch"), 0);
  EXPECT_TRUE(scheduler.Shutdown(absl::ZeroDuration()).ok());  // idle now: joins
}

TEST(SchedulerTest, ShutdownReturnsOkWhenRunningJobsFinishWithinGrace) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler scheduler(OneThread(&clock));
  ASSERT_TRUE(PrefetchRunning(scheduler, fake, Req(fake, "running", "gpu0")).ok());
  absl::Status shutdown = absl::UnknownError("unset");
  std::thread stopper([&] { shutdown = scheduler.Shutdown(absl::Seconds(5)); });
  clock.BlockUntilWaiters(1);
  clock.Advance(absl::Seconds(4));
  fake.Open("running");
  stopper.join();
  EXPECT_TRUE(shutdown.ok()) << shutdown;
  EXPECT_EQ(fake.compiles("running"), 1);
}

TEST(SchedulerTest, ProgressEventsInOrderWithQueuePosition) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  ASSERT_TRUE(PrefetchRunning(scheduler, fake, Req(fake, "blocker", "gpu0")).ok());

  Recorder first, second, joiner, failing;
  Request r1 = Req(fake, "k1", "gpu0");
  r1.progress = first.Fn();
  Request r2 = Req(fake, "k2", "gpu0");
  r2.progress = second.Fn();
  Request r3 = Req(fake, "k2", "gpu1");  // another device joins k2 on gpu0
  r3.progress = joiner.Fn();
  Request r4 = Req(fake, "k3", "gpu0");
  r4.job = fake.Job("k3", "gpu0", absl::FailedPreconditionError("bad"));
  r4.progress = failing.Fn();
  auto t1 = scheduler.Submit(std::move(r1));
  auto t2 = scheduler.Submit(std::move(r2));
  auto t3 = scheduler.Submit(std::move(r3));
  auto t4 = scheduler.Submit(std::move(r4));
  ASSERT_TRUE(t1.ok() && t2.ok() && t3.ok() && t4.ok());
  fake.Open("blocker");
  EXPECT_TRUE((*t1)->Wait().ok());
  EXPECT_TRUE((*t2)->Wait().ok());
  EXPECT_TRUE((*t3)->Wait().ok());
  EXPECT_THAT((*t4)->Wait(), StatusIs(absl::StatusCode::kFailedPrecondition));

  // Wait() returns only once its waiter's events are all delivered.
  EXPECT_THAT(first.events(), ElementsAre(Queued(0, "gpu0"), At(Phase::kCompiling, "gpu0"),
                                          At(Phase::kVerifying, "gpu0"), At(Phase::kDone, "gpu0")));
  EXPECT_THAT(second.events(),
              ElementsAre(Queued(1, "gpu0"), Queued(0, "gpu0"), At(Phase::kCompiling, "gpu0"),
                          At(Phase::kVerifying, "gpu0"), At(Phase::kDone, "gpu0")));
  EXPECT_THAT(joiner.events(),
              ElementsAre(Queued(1, "gpu0"), Queued(0, "gpu0"), At(Phase::kCompiling, "gpu0"),
                          At(Phase::kVerifying, "gpu0"), At(Phase::kDone, "gpu0")));
  EXPECT_THAT(failing.events(),
              ElementsAre(Queued(2, "gpu0"), Queued(1, "gpu0"), Queued(0, "gpu0"),
                          At(Phase::kCompiling, "gpu0"), At(Phase::kVerifying, "gpu0"),
                          At(Phase::kFailed, "gpu0")));
}

TEST(SchedulerTest, WaitUntilReturnsNothingYetAndKeepsWaiting) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler scheduler(OneThread(&clock));
  fake.Close("k");
  auto t = scheduler.Submit(Req(fake, "k", "gpu0"));
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->WaitUntil(clock.Now()).has_value());
  fake.Open("k");
  auto r = (*t)->WaitUntil(absl::InfiniteFuture());
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->ok());
  EXPECT_EQ((*t)->Wait()->get(), r->value().get());  // same outcome again
}

TEST(SchedulerTest, RejectsInvalidRequests) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler scheduler(OneThread(&clock));
  EXPECT_THAT(scheduler.Submit(Req(fake, "", "gpu0")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(scheduler.Submit(Req(fake, "k", "")), StatusIs(absl::StatusCode::kInvalidArgument));
  Request no_job = Req(fake, "k", "gpu0");
  no_job.job = nullptr;
  EXPECT_THAT(scheduler.Submit(std::move(no_job)), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(scheduler.Submit(Req(fake, "k", "gpu0", Priority::kInteractive, clock.Now())),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  Request null_kernel = Req(fake, "k", "gpu0");
  null_kernel.job = [](const ReportFn&) -> CompileResult { return nullptr; };
  EXPECT_THAT(scheduler.Run(std::move(null_kernel)), StatusIs(absl::StatusCode::kInternal));
}

// ---------------------------------------------------------------------------
// Callback waiters (Ticket::OnDone): no thread blocks per waiter.

// Collects DoneFn outcomes and the threads they ran on.
class Outcomes {
 public:
  DoneFn Fn(int i) {
    return [this, i](CompileResult r) {
      absl::MutexLock l(&mu_);
      results_.emplace(i, std::move(r));
      threads_.insert(std::this_thread::get_id());
      ++calls_;
    };
  }
  void WaitFor(int n) {
    absl::MutexLock l(&mu_);
    auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return calls_ >= n; };
    mu_.Await(absl::Condition(&done));
  }
  int calls() {
    absl::MutexLock l(&mu_);
    return calls_;
  }
  std::map<int, CompileResult> results() {
    absl::MutexLock l(&mu_);
    return results_;
  }
  std::set<std::thread::id> threads() {
    absl::MutexLock l(&mu_);
    return threads_;
  }

 private:
  absl::Mutex mu_;
  std::map<int, CompileResult> results_ ABSL_GUARDED_BY(mu_);
  std::set<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(SchedulerTest, OnDoneAnswersManyWaitersOfOneKeyFromTheCompileThread) {
  constexpr int kWaiters = 500;
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  fake.Close("k");
  Outcomes outcomes;
  std::vector<std::unique_ptr<Ticket>> tickets;
  for (int i = 0; i < kWaiters; ++i) {
    auto t = scheduler.Submit(Req(fake, "k", "gpu0"));
    ASSERT_TRUE(t.ok()) << t.status();
    (*t)->OnDone(outcomes.Fn(i));
    tickets.push_back(*std::move(t));
  }
  EXPECT_EQ(outcomes.calls(), 0);
  fake.Open("k");
  outcomes.WaitFor(kWaiters);
  EXPECT_EQ(fake.compiles("k"), 1);
  auto results = outcomes.results();
  ASSERT_EQ(results.size(), static_cast<size_t>(kWaiters));
  for (const auto& [i, r] : results) {
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    EXPECT_EQ(r->get(), results.begin()->second->get()) << i;
  }
  // All on the one compile thread, none on this one.
  EXPECT_EQ(outcomes.threads().size(), 1u);
  EXPECT_FALSE(outcomes.threads().contains(std::this_thread::get_id()));
  EXPECT_EQ(StatsOf(scheduler, "gpu0").deduplicated, static_cast<uint64_t>(kWaiters - 1));
  tickets.clear();
  EXPECT_EQ(outcomes.calls(), kWaiters);  // exactly once each
}

TEST(SchedulerTest, OnDoneRunsAtOnceWhenTheOutcomeIsKnown) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  auto first = scheduler.Submit(Req(fake, "k", "gpu0"));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Wait().ok());
  // A remembered failure resolves its ticket before OnDone is called.
  Request bad = Req(fake, "bad", "gpu0");
  bad.job = fake.Job("bad", "gpu0", absl::FailedPreconditionError("compile error"));
  EXPECT_THAT(scheduler.Run(std::move(bad)), StatusIs(absl::StatusCode::kFailedPrecondition));
  auto t = scheduler.Submit(Req(fake, "bad", "gpu0"));
  ASSERT_TRUE(t.ok());
  std::optional<CompileResult> got;
  std::thread::id on;
  (*t)->OnDone([&](CompileResult r) {
    got = std::move(r);
    on = std::this_thread::get_id();
  });
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(on, std::this_thread::get_id());
}

TEST(SchedulerTest, CancelRunsOnDoneWithCancelledAndDropsTheQueuedJob) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  auto blocker = SubmitRunning(scheduler, fake, Req(fake, "blocker", "gpu0"));
  ASSERT_TRUE(blocker.ok());
  auto t = scheduler.Submit(Req(fake, "queued", "gpu0"));
  ASSERT_TRUE(t.ok());
  Outcomes outcomes;
  (*t)->OnDone(outcomes.Fn(0));
  (*t)->Cancel();  // runs the callback on this thread, before it returns
  ASSERT_EQ(outcomes.calls(), 1);
  EXPECT_THAT(outcomes.results().at(0), StatusIs(absl::StatusCode::kCancelled));
  (*t)->Cancel();  // idempotent
  EXPECT_EQ(StatsOf(scheduler, "gpu0").dropped, 1u);
  EXPECT_EQ(StatsOf(scheduler, "gpu0").depth, 0);
  fake.Open("blocker");
  EXPECT_TRUE((*blocker)->Wait().ok());
  EXPECT_EQ(fake.compiles("queued"), 0);
  EXPECT_EQ(outcomes.calls(), 1);
}

TEST(SchedulerTest, OnDoneGetsDeadlineExceededFromTheDeadlineThread) {
  FakeClock clock;
  FakeCompiler fake;
  Scheduler scheduler(OneThread(&clock));
  auto t = SubmitRunning(
      scheduler, fake,
      Req(fake, "slow", "gpu0", Priority::kInteractive, clock.Now() + absl::Seconds(10)));
  ASSERT_TRUE(t.ok());
  Outcomes outcomes;
  (*t)->OnDone(outcomes.Fn(0));
  clock.BlockUntilWaiters(1);  // the deadline thread waits for the deadline
  clock.Advance(absl::Seconds(9));
  EXPECT_EQ(outcomes.calls(), 0);  // 1 s early: nothing may have fired (checked again below)
  clock.Advance(absl::Seconds(1));
  outcomes.WaitFor(1);
  EXPECT_THAT(outcomes.results().at(0), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_FALSE(outcomes.threads().contains(std::this_thread::get_id()));
  fake.Open("slow");
  fake.WaitFinished("slow");
  t->reset();
  EXPECT_EQ(outcomes.calls(), 1);
}

TEST(SchedulerTest, ShutdownAnswersQueuedCallbackWaitersUnavailable) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  auto running = SubmitRunning(scheduler, fake, Req(fake, "running", "gpu0"));
  ASSERT_TRUE(running.ok());
  auto queued = scheduler.Submit(Req(fake, "queued", "gpu0"));
  ASSERT_TRUE(queued.ok());
  Outcomes outcomes;
  (*queued)->OnDone(outcomes.Fn(0));
  (*running)->OnDone(outcomes.Fn(1));
  std::thread stopper([&] { scheduler.Shutdown(absl::InfiniteDuration()).IgnoreError(); });
  outcomes.WaitFor(1);
  EXPECT_THAT(outcomes.results().at(0), StatusIs(absl::StatusCode::kUnavailable));
  fake.Open("running");
  outcomes.WaitFor(2);
  EXPECT_TRUE(outcomes.results().at(1).ok());
  stopper.join();
}

TEST(SchedulerTest, DestroyedTicketNeverRunsOnDoneAndOnDoneMayDestroyItsTicket) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  fake.Close("k");
  Outcomes outcomes;
  auto dropped = scheduler.Submit(Req(fake, "k", "gpu0"));
  ASSERT_TRUE(dropped.ok());
  (*dropped)->OnDone(outcomes.Fn(0));
  dropped->reset();  // abandoned: its callback is discarded

  auto kept = scheduler.Submit(Req(fake, "k", "gpu0"));
  ASSERT_TRUE(kept.ok());
  std::unique_ptr<Ticket> self = *std::move(kept);
  absl::Notification destroyed;
  self->OnDone([&](const CompileResult& r) {
    EXPECT_TRUE(r.ok()) << r.status();
    self.reset();  // its own Ticket, from inside the callback
    destroyed.Notify();
  });
  fake.Open("k");
  destroyed.WaitForNotification();
  EXPECT_EQ(outcomes.calls(), 0);
  EXPECT_EQ(fake.compiles("k"), 1);
}

// A Ticket destroyed on one thread while its callback runs on another waits
// for the callback to return.
TEST(SchedulerTest, DestroyingTheTicketWaitsForARunningOnDone) {
  FakeCompiler fake;
  Scheduler scheduler(OneThread());
  fake.Close("k");
  auto t = scheduler.Submit(Req(fake, "k", "gpu0"));
  ASSERT_TRUE(t.ok());
  absl::Notification entered, release;
  std::atomic<bool> returned{false};
  (*t)->OnDone([&](const CompileResult&) {
    entered.Notify();
    release.WaitForNotification();
    returned.store(true);
  });
  fake.Open("k");
  entered.WaitForNotification();
  std::thread destroyer([&] {
    t->reset();
    EXPECT_TRUE(returned.load());
  });
  // The destroyer cannot finish before the callback returns; let it go.
  release.Notify();
  destroyer.join();
}

}  // namespace
}  // namespace kcache
