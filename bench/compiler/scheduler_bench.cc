// The compile scheduler's own overhead per request: Run() with a job that
// returns a prebuilt kernel at once, so that what is measured is queueing,
// the hand-off to a compile thread and back, and single-flight bookkeeping.
// Target: <= 10 us per request.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "benchmark/benchmark.h"
#include "compiler/scheduler/scheduler.h"

namespace kcache {
namespace {

std::shared_ptr<const CompiledKernel> Prebuilt() {
  static const auto* const kernel = new std::shared_ptr<const CompiledKernel>([] {
    auto k = std::make_shared<CompiledKernel>();
    k->record.set_arch("sm_90a");
    k->cubin.assign(4096, 'x');
    return k;
  }());
  return *kernel;
}

Scheduler* g_scheduler = nullptr;

Request Immediate(std::string key, std::string queue) {
  Request r;
  r.key = std::move(key);
  r.queue = std::move(queue);
  r.job = [kernel = Prebuilt()](const ReportFn&) -> CompileResult { return kernel; };
  return r;
}

// Each thread asks on its own queue (one per device), one request at a time:
// a miss that is compiled (instantly) and handed back.
void BM_RunImmediate(benchmark::State& state) {
  if (state.thread_index() == 0) {
    Scheduler::Options options;
    options.compile_threads = state.threads();
    g_scheduler = new Scheduler(options);
  }
  const std::string key = absl::StrCat("key", state.thread_index());
  const std::string queue = absl::StrCat("gpu", state.thread_index());
  for (auto _ : state) {
    CompileResult r = g_scheduler->Run(Immediate(key, queue));
    if (!r.ok()) state.SkipWithError("run failed");
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    delete g_scheduler;
    g_scheduler = nullptr;
  }
}
BENCHMARK(BM_RunImmediate)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// All threads on one queue with distinct keys: they contend for the queue
// (one compile at a time) and for the scheduler's lock.
void BM_RunImmediateOneQueue(benchmark::State& state) {
  if (state.thread_index() == 0) {
    Scheduler::Options options;
    options.compile_threads = 2;
    g_scheduler = new Scheduler(options);
  }
  const std::string key = absl::StrCat("key", state.thread_index());
  for (auto _ : state) {
    CompileResult r = g_scheduler->Run(Immediate(key, "gpu0"));
    if (!r.ok()) state.SkipWithError("run failed");
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    delete g_scheduler;
    g_scheduler = nullptr;
  }
}
BENCHMARK(BM_RunImmediateOneQueue)->Threads(4)->UseRealTime();

// The bookkeeping alone, without a thread hand-off: join a job that is
// running (held) and abandon the wait.
void BM_JoinAndAbandon(benchmark::State& state) {
  Scheduler::Options options;
  options.compile_threads = 1;
  Scheduler scheduler(options);
  absl::Notification release, started;
  Request held;
  held.key = "held";
  held.queue = "gpu0";
  held.job = [&](const ReportFn&) -> CompileResult {
    started.Notify();
    release.WaitForNotification();
    return Prebuilt();
  };
  if (!scheduler.SubmitPrefetch(std::move(held)).ok()) state.SkipWithError("submit failed");
  started.WaitForNotification();
  for (auto _ : state) {
    auto ticket = scheduler.Submit(Immediate("held", "gpu0"));
    if (!ticket.ok()) state.SkipWithError("submit failed");
    benchmark::DoNotOptimize(ticket);
  }
  state.SetItemsProcessed(state.iterations());
  release.Notify();
}
BENCHMARK(BM_JoinAndAbandon);

}  // namespace
}  // namespace kcache

BENCHMARK_MAIN();
