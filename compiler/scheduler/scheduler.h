// The per-device compile scheduler: named queues (one per GPU, or one per
// target architecture without a GPU), at most one compile in flight per queue,
// single-flight by store key across all queues, interactive before prefetch,
// per-waiter deadlines and cancellation, progress events, a short memory of
// failed compiles, and a bounded depth per queue.
//
// It is generic: it knows nothing of NVRTC, the store or the driver. The
// daemon checks the store first and, on a miss, hands the scheduler a JobFn
// that compiles, verifies and publishes; the scheduler decides when and where
// that function runs and who receives its result.
//
// Thread safety: Scheduler, Ticket::Cancel and CancelToken are safe to use from
// any thread. A Ticket's Wait/WaitUntil are for one thread at a time; a waiter
// that must not hold a thread (a gRPC callback handler) uses Ticket::OnDone
// instead.
//
// Locking: one mutex (Scheduler::mu_) guards all scheduler state; it is never
// held across a JobFn, a ProgressFn or a DoneFn. Lock order where others take part:
// CancelToken::mu_ -> Scheduler::mu_; FakeClock::mu_ -> Scheduler::mu_.
// Scheduler::join_mu_ (joining the compile threads) is never held with mu_.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "compiler/scheduler/clock.h"
#include "compiler/scheduler/compiled_kernel.h"

namespace kcache {

// Interactive work (a trainer is blocked on the kernel) always runs before
// prefetch work (pre-population) that is queued on the same queue; when
// compile threads are scarce, also across queues. FIFO within a priority.
enum class Priority { kInteractive = 0, kPrefetch = 1 };

// Matches v1::Progress::Phase (PHASE_QUEUED ... PHASE_FAILED).
enum class Phase { kQueued, kCompiling, kVerifying, kDone, kFailed };
const char* PhaseName(Phase phase);

struct ProgressEvent {
  Phase phase = Phase::kQueued;
  // For kQueued: jobs ahead of this one in its queue (0 = next to run).
  // Otherwise 0.
  int queue_position = 0;
  // The queue the job runs on: the queue of the request that created it,
  // which is not necessarily the queue this waiter asked for.
  std::string queue;

  friend bool operator==(const ProgressEvent&, const ProgressEvent&) = default;
};

// Called for each progress event of one waiter, in order, never two at once
// for the same waiter, never with a scheduler lock held, and never after that
// waiter's Wait/WaitUntil has returned a result or its Ticket is destroyed.
// It may run on a compile thread, so it must be quick and must not block on
// the scheduler (in particular it must not call Ticket::Wait).
using ProgressFn = std::function<void(const ProgressEvent&)>;

using CompileResult = absl::StatusOr<std::shared_ptr<const CompiledKernel>>;

// Receives one waiter's outcome (see Ticket::OnDone).
using DoneFn = std::function<void(CompileResult)>;

// Reports the phase of a running job (kCompiling is implied when it starts;
// call with kVerifying when verification begins). Calls outside the job's
// run are ignored.
using ReportFn = std::function<void(Phase)>;

// The work for one key: compile, verify, publish to the store. Runs on a
// compile thread with no scheduler lock held. Its result goes to every waiter;
// if it returns an error (a compile error: FailedPrecondition with the log),
// the error may be remembered for Options::error_ttl (see
// Options::memoize_error). Returning OK with a null pointer is reported as
// Internal. An error that says the compile hit a worker's resource limit
// (IsCompileLimitExceeded) gets "key <hex of Request::key>: " put before its
// message, for every waiter and the memo. Once started, a job always runs to
// completion, even when every waiter has gone: it must bound its own running
// time (compiles run in worker processes that are killed at their deadline).
using JobFn = std::function<CompileResult(const ReportFn& report)>;

struct Request {
  std::string key;    // opaque (the store key); single-flight identity
  std::string queue;  // e.g. "gpu0" or "sm_90a"; created on first use
  Priority priority = Priority::kInteractive;
  // When the waiter gives up (DeadlineExceeded). Ignored by SubmitPrefetch.
  absl::Time deadline = absl::InfiniteFuture();
  // Used only if this request creates the job; a request that joins a job
  // already queued or running shares that job's function and result.
  JobFn job;
  ProgressFn progress;  // optional; ignored by SubmitPrefetch
};

// Per-queue figures for the admin Stats RPC and Prometheus. Counters are
// totals since the scheduler started.
struct QueueStats {
  std::string name;
  int depth = 0;              // jobs queued, not counting the one running
  bool busy = false;          // a job of this queue is running
  uint64_t jobs_run = 0;      // job functions that returned (ok or not)
  uint64_t jobs_failed = 0;   // ... of which returned an error
  uint64_t deduplicated = 0;  // requests that joined a queued/running job or
                              // got a remembered error: no compile of their own
  uint64_t memo_hits = 0;     // ... of which got a remembered error
  uint64_t dropped = 0;       // queued jobs dropped: every waiter had left
  uint64_t rejected = 0;      // Submit refused with ResourceExhausted
};

class Scheduler;

// One waiter's claim on a job. Destroying a Ticket that has not returned a
// result abandons the wait (as Cancel does). The Scheduler must outlive its
// Tickets.
class Ticket {
 public:
  ~Ticket();
  Ticket(const Ticket&) = delete;
  Ticket& operator=(const Ticket&) = delete;

  // Blocks until the job's result, the request's deadline (DeadlineExceeded)
  // or Cancel() (Cancelled), and returns it. All progress events of this
  // waiter have been delivered when it returns. Calling it again returns the
  // same outcome.
  CompileResult Wait();

  // As Wait, but also returns std::nullopt, still waiting, when `until` (on
  // the scheduler's clock) comes first: for callers that poll something else,
  // e.g. grpc::ServerContext::IsCancelled() in a synchronous handler.
  std::optional<CompileResult> WaitUntil(absl::Time until);

  // Abandons the wait from any thread: a blocked Wait returns Cancelled (unless
  // the result is already there). If this was the job's last waiter and the
  // job is still queued and not a prefetch, the job is dropped. Idempotent.
  void Cancel();

  // Waits without a thread: `done` is called exactly once with this waiter's
  // outcome, the same one Wait would return (the job's result; Cancelled
  // after Cancel(); DeadlineExceeded at the request's deadline, timed by one
  // scheduler thread shared by all such waiters). It runs on the thread that
  // produces the outcome: a compile thread, the caller of Shutdown or Cancel,
  // the deadline thread, or this caller before OnDone returns when the
  // outcome is already known. Never with a scheduler lock held, never at the
  // same time as this waiter's ProgressFn, and after the progress events
  // queued before the outcome. It must be quick and must not block on the
  // scheduler. It is never called after the Ticket is destroyed: destroying
  // the Ticket on another thread while `done` runs blocks until it returns,
  // and destroying it without an outcome discards `done` uncalled; `done`
  // itself may destroy the Ticket (as std::stop_callback allows).
  // Call at most once per Ticket, and not together with Wait/WaitUntil.
  void OnDone(DoneFn done);

 private:
  friend class Scheduler;
  struct Waiter;
  Ticket(Scheduler* scheduler, std::shared_ptr<Waiter> waiter)
      : scheduler_(scheduler), waiter_(std::move(waiter)) {}

  Scheduler* const scheduler_;
  const std::shared_ptr<Waiter> waiter_;
};

// Cancels the Scheduler::Run calls it is passed to, from any thread (e.g. a
// gRPC callback on client disconnect). Once cancelled it stays cancelled.
class CancelToken {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class Scheduler;
  // Returns false (and does not attach) if already cancelled.
  bool Attach(Ticket* ticket);
  void Detach(Ticket* ticket);

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Ticket*> tickets_ ABSL_GUARDED_BY(mu_);
};

class Scheduler {
 public:
  struct Options {
    // Compile threads: how many queues may run a job at once. 0 = the core
    // count.
    int compile_threads = 0;
    // Queued jobs per queue beyond which a request that would create a new
    // job is refused with ResourceExhausted. Joining an existing job is
    // always allowed.
    int max_queue_depth = 256;
    // How long a failed compile's error is returned to new requests for the
    // same key without compiling again. Zero disables the memory.
    absl::Duration error_ttl = absl::Seconds(30);
    // Which job errors are remembered. Default: FailedPrecondition (compile
    // error) and InvalidArgument, i.e. errors that a retry would repeat.
    std::function<bool(const absl::Status&)> memoize_error;
    // Not owned; must outlive the Scheduler. Null = Clock::Real().
    Clock* clock = nullptr;
  };

  explicit Scheduler(Options options);
  // Shuts down with zero grace if not done yet, then joins the compile
  // threads and the deadline thread: it blocks until running jobs return.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Registers a waiter for request.key and returns its Ticket at once:
  // joins the job queued or running for that key, or creates one on
  // request.queue. An interactive request that joins a queued prefetch job
  // promotes it. The ticket's first progress event is the job's current state.
  // Errors:
  //   InvalidArgument    empty key or queue, or no job function;
  //   DeadlineExceeded   the deadline has already passed;
  //   ResourceExhausted  a new job is needed and the queue is full;
  //   Unavailable        the scheduler is shutting down.
  // A key whose compile failed within error_ttl gets a Ticket that is already
  // resolved with that error (no compile).
  absl::StatusOr<std::unique_ptr<Ticket>> Submit(Request request);

  // Submit and Wait. With `cancel`, cancelling the token makes it return
  // Cancelled at once (the job itself follows Ticket::Cancel's rule).
  CompileResult Run(Request request, CancelToken* cancel = nullptr);

  // Schedules a compile at prefetch priority with nobody waiting; returns at
  // once. Such a job is never dropped for lack of waiters (nor is a job that
  // a prefetch joined). Same errors as Submit, plus the remembered error of a
  // recent failed compile of this key.
  absl::Status SubmitPrefetch(Request request);

  // A snapshot, one entry per queue, sorted by name.
  std::vector<QueueStats> Stats() const;

  // Stops accepting (Submit returns Unavailable), fails every queued job with
  // Unavailable, then waits up to `grace` for running jobs to return and joins
  // the compile threads. Returns DeadlineExceeded if jobs are still running
  // after `grace` (their waiters still get their results; the destructor
  // joins). Idempotent; later calls wait again.
  absl::Status Shutdown(absl::Duration grace);

 private:
  friend class Ticket;
  struct Job;
  struct Queue;
  using Waiter = Ticket::Waiter;
  using WaiterList = std::vector<std::shared_ptr<Waiter>>;

  Queue& GetQueue(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The position of a queued job in its queue.
  int PositionOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Enqueue(Queue& queue, const std::shared_ptr<Job>& job, WaiterList* notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends kQueued events to waiters of jobs whose position changed.
  void PublishPositions(Queue& queue, WaiterList* notify) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Emit(Job& job, const ProgressEvent& event, WaiterList* notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitTo(const std::shared_ptr<Waiter>& waiter, const ProgressEvent& event, WaiterList* notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the job's result, wakes its waiters and sends them the final event.
  void Finish(Job& job, CompileResult result, WaiterList* notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a waiter from its job; drops the job if that leaves a queued,
  // non-prefetch job without waiters.
  void Leave(const std::shared_ptr<Waiter>& waiter, WaiterList* notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers queued progress events with no lock held.
  void Deliver(const WaiterList& waiters) ABSL_LOCKS_EXCLUDED(mu_);
  void Report(const std::shared_ptr<Job>& job, Phase phase) ABSL_LOCKS_EXCLUDED(mu_);

  // Finds or creates the job for request.key (promoting it or pinning it as
  // needed), or returns a finished job holding a remembered error.
  absl::StatusOr<std::shared_ptr<Job>> Attach(Request& request, bool prefetch, WaiterList* notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<CompileResult> WaitFor(const std::shared_ptr<Waiter>& waiter, absl::Time until)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `abandon`: the Ticket is being destroyed; also discard undelivered events
  // and the DoneFn, and wait for a delivery in progress on another thread to end.
  void CancelWaiter(const std::shared_ptr<Waiter>& waiter, bool abandon) ABSL_LOCKS_EXCLUDED(mu_);
  void SetDone(const std::shared_ptr<Waiter>& waiter, DoneFn done) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands a callback waiter its outcome (once; later calls do nothing) and
  // queues it for Deliver, which runs its DoneFn.
  void Resolve(const std::shared_ptr<Waiter>& waiter, const CompileResult& outcome,
               WaiterList* notify) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeadlineLoop();

  bool HasRunnable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WorkerShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop();
  void JoinThreads() ABSL_LOCKS_EXCLUDED(join_mu_, mu_);

  const Options options_;
  Clock& clock_;

  mutable absl::Mutex mu_;
  // std::map: stable addresses and Stats() sorted by name.
  std::map<std::string, std::unique_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
  // Jobs queued or running, by key.
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  struct Memo {
    absl::Status error;
    absl::Time expires;
  };
  absl::flat_hash_map<std::string, Memo> memo_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // compile threads exit when idle
  // Callback waiters (OnDone) with a finite deadline, by deadline, for the
  // deadline thread; timers_changed_ counts insertions, to wake it.
  std::multimap<absl::Time, std::shared_ptr<Waiter>> timers_ ABSL_GUARDED_BY(mu_);
  uint64_t timers_changed_ ABSL_GUARDED_BY(mu_) = 0;
  bool timers_stop_ ABSL_GUARDED_BY(mu_) = false;  // set by the destructor
  std::thread deadline_thread_;  // started by the constructor, joined by the destructor

  absl::Mutex join_mu_;  // serializes joining; never held with mu_
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace kcache
