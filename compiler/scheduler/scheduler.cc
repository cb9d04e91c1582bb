// The per-device compile scheduler; the contract is in scheduler.h.
//
// Jobs and waiters are plain structs whose mutable fields are all guarded by
// Scheduler::mu_ (the analysis cannot name a mutex of another object, so this
// comment stands in for the annotations). Progress events are queued on the
// waiter under mu_ and delivered after it is released, by whichever thread
// finds the waiter idle, so that callbacks run in order and without the lock.
// A callback waiter's DoneFn travels the same way, after its progress events.
#include "compiler/scheduler/scheduler.h"

#include <algorithm>
#include <deque>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "compiler/cuda/compile.h"

namespace kcache {

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kQueued:
      return "queued";
    case Phase::kCompiling:
      return "compiling";
    case Phase::kVerifying:
      return "verifying";
    case Phase::kDone:
      return "done";
    case Phase::kFailed:
      return "failed";
  }
  return "unknown";
}

struct Scheduler::Queue {
  explicit Queue(std::string n) : name(std::move(n)) {}
  const std::string name;
  // Queued (not running) jobs by (priority, arrival sequence): begin() runs next.
  std::map<std::pair<int, uint64_t>, std::shared_ptr<Job>> queued;
  bool busy = false;
  QueueStats stats;  // counters only; depth/busy/name are filled in by Stats()
};

struct Scheduler::Job {
  enum class State { kQueued, kRunning, kFinished };

  std::string key;
  Queue* queue = nullptr;
  JobFn fn;
  State state = State::kQueued;
  Priority priority = Priority::kInteractive;
  std::pair<int, uint64_t> order;  // key in queue->queued while queued
  bool pinned = false;             // a prefetch asked for it: never dropped
  Phase phase = Phase::kQueued;
  int last_position = -1;  // last queue position announced to its waiters
  std::vector<std::shared_ptr<Waiter>> waiters;
  std::optional<CompileResult> result;  // set when kFinished
};

struct Ticket::Waiter {
  std::shared_ptr<Scheduler::Job> job;
  absl::Time deadline;
  ProgressFn progress;
  std::deque<ProgressEvent> pending;  // events not yet delivered
  bool delivering = false;            // a thread is running `progress` or `done`
  std::thread::id delivering_on;      // ... this one
  bool left = false;                  // no longer counted on the job
  bool cancelled = false;
  // Callback waiters (Ticket::OnDone): `done` until Deliver takes it to run
  // it; `resolved` once the outcome is known, in `done_outcome` until then.
  DoneFn done;
  bool resolved = false;
  std::optional<CompileResult> done_outcome;
  bool timed = false;  // `timer` is its entry in Scheduler::timers_
  std::multimap<absl::Time, std::shared_ptr<Waiter>>::iterator timer;
  // Written and read only by the thread in Wait (one at a time, per contract).
  std::optional<CompileResult> outcome;
};

// ---------------------------------------------------------------------------
// Ticket and CancelToken

Ticket::~Ticket() {
  if (!waiter_->outcome.has_value()) scheduler_->CancelWaiter(waiter_, /*abandon=*/true);
}

CompileResult Ticket::Wait() { return *scheduler_->WaitFor(waiter_, absl::InfiniteFuture()); }

std::optional<CompileResult> Ticket::WaitUntil(absl::Time until) {
  return scheduler_->WaitFor(waiter_, until);
}

void Ticket::Cancel() { scheduler_->CancelWaiter(waiter_, /*abandon=*/false); }

void Ticket::OnDone(DoneFn done) { scheduler_->SetDone(waiter_, std::move(done)); }

void CancelToken::Cancel() {
  absl::MutexLock l(&mu_);
  cancelled_ = true;
  // Under mu_ so that a ticket cannot be detached and destroyed meanwhile.
  for (Ticket* t : tickets_) t->Cancel();
  tickets_.clear();
}

bool CancelToken::cancelled() const {
  absl::MutexLock l(&mu_);
  return cancelled_;
}

bool CancelToken::Attach(Ticket* ticket) {
  absl::MutexLock l(&mu_);
  if (cancelled_) return false;
  tickets_.push_back(ticket);
  return true;
}

void CancelToken::Detach(Ticket* ticket) {
  absl::MutexLock l(&mu_);
  tickets_.erase(std::remove(tickets_.begin(), tickets_.end(), ticket), tickets_.end());
}

// ---------------------------------------------------------------------------
// Scheduler

namespace {
bool DefaultMemoize(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) || absl::IsInvalidArgument(s) || IsCompileLimitExceeded(s);
}
// A compile that hit a worker's resource limit names its key (the store
// key's hex, as `kcache show` takes it) before the worker pool's message, so
// that an operator can find the kernel from any waiter's error or the memo.
absl::Status NameKeyOfLimitError(const absl::Status& s, const std::string& key) {
  if (!IsCompileLimitExceeded(s)) return s;
  return absl::Status(s.code(),
                      absl::StrCat("key ", absl::BytesToHexString(key), ": ", s.message()));
}
absl::Status CancelledWait() { return absl::CancelledError("wait for compile cancelled"); }
// A waiter's deadline passed before its job finished.
absl::Status DeadlineError(bool queued, const std::string& queue) {
  return absl::DeadlineExceededError(
      absl::StrCat("no compile result within the request deadline (job ",
                   queued ? "still queued" : "running", " on queue '", queue, "')"));
}
}  // namespace

Scheduler::Scheduler(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : Clock::Real()) {
  int n = options_.compile_threads;
  if (n <= 0) n = std::max(1u, std::thread::hardware_concurrency());
  absl::MutexLock l(&join_mu_);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  deadline_thread_ = std::thread([this] { DeadlineLoop(); });
}

Scheduler::~Scheduler() {
  Shutdown(absl::ZeroDuration()).IgnoreError();
  JoinThreads();
  {
    absl::MutexLock l(&mu_);
    timers_stop_ = true;
  }
  deadline_thread_.join();
}

Scheduler::Queue& Scheduler::GetQueue(const std::string& name) {
  auto it = queues_.find(name);
  if (it == queues_.end()) it = queues_.emplace(name, std::make_unique<Queue>(name)).first;
  return *it->second;
}

int Scheduler::PositionOf(const Job& job) const {
  int position = 0;
  for (const auto& [order, j] : job.queue->queued) {
    if (j.get() == &job) return position;
    ++position;
  }
  return position;
}

void Scheduler::Enqueue(Queue& queue, const std::shared_ptr<Job>& job, WaiterList* notify) {
  job->state = Job::State::kQueued;
  job->order = {static_cast<int>(job->priority), next_seq_++};
  queue.queued.emplace(job->order, job);
  PublishPositions(queue, notify);
}

void Scheduler::PublishPositions(Queue& queue, WaiterList* notify) {
  int position = 0;
  for (auto& [order, job] : queue.queued) {
    if (job->last_position != position) {
      job->last_position = position;
      Emit(*job, ProgressEvent{Phase::kQueued, position, queue.name}, notify);
    }
    ++position;
  }
}

void Scheduler::Emit(Job& job, const ProgressEvent& event, WaiterList* notify) {
  for (const auto& w : job.waiters) EmitTo(w, event, notify);
}

void Scheduler::EmitTo(const std::shared_ptr<Waiter>& waiter, const ProgressEvent& event,
                       WaiterList* notify) {
  if (!waiter->progress || waiter->left) return;
  waiter->pending.push_back(event);
  notify->push_back(waiter);
}

void Scheduler::Finish(Job& job, CompileResult result, WaiterList* notify) {
  const bool ok = result.ok();
  job.state = Job::State::kFinished;
  job.phase = ok ? Phase::kDone : Phase::kFailed;
  job.result = std::move(result);
  Emit(job, ProgressEvent{job.phase, 0, job.queue->name}, notify);
  for (const auto& w : job.waiters) Resolve(w, *job.result, notify);
}

void Scheduler::Resolve(const std::shared_ptr<Waiter>& waiter, const CompileResult& outcome,
                        WaiterList* notify) {
  if (!waiter->done || waiter->resolved) return;
  waiter->resolved = true;
  waiter->done_outcome = outcome;
  if (waiter->timed) {
    timers_.erase(waiter->timer);
    waiter->timed = false;
  }
  notify->push_back(waiter);
}

void Scheduler::Leave(const std::shared_ptr<Waiter>& waiter, WaiterList* notify) {
  if (waiter->left) return;
  waiter->left = true;
  Job& job = *waiter->job;
  job.waiters.erase(std::remove(job.waiters.begin(), job.waiters.end(), waiter), job.waiters.end());
  if (job.state != Job::State::kQueued || !job.waiters.empty() || job.pinned) return;
  // Nobody wants this compile any more and it has not started: drop it.
  Queue& queue = *job.queue;
  queue.queued.erase(job.order);
  auto it = jobs_.find(job.key);
  if (it != jobs_.end() && it->second.get() == &job) jobs_.erase(it);
  ++queue.stats.dropped;
  job.state = Job::State::kFinished;
  job.result = absl::CancelledError("compile dropped: every waiter left");
  PublishPositions(queue, notify);
}

void Scheduler::Deliver(const WaiterList& waiters) {
  for (const auto& w : waiters) {
    for (;;) {
      std::deque<ProgressEvent> batch;
      DoneFn done;
      std::optional<CompileResult> outcome;
      {
        absl::MutexLock l(&mu_);
        // A thread already delivering to this waiter takes what is queued.
        if (w->delivering) break;
        if (!w->pending.empty()) {
          batch.swap(w->pending);
        } else if (w->done && w->done_outcome.has_value()) {
          done = std::move(w->done);
          w->done = nullptr;
          outcome = std::move(w->done_outcome);
          w->done_outcome.reset();
        } else {
          break;
        }
        w->delivering = true;
        w->delivering_on = std::this_thread::get_id();
      }
      if (done) {
        // It may destroy its Ticket; `w` is kept alive by `waiters`.
        done(*std::move(outcome));
        done = nullptr;  // its captures go with no lock held
      } else {
        for (const ProgressEvent& e : batch) w->progress(e);
      }
      absl::MutexLock l(&mu_);
      w->delivering = false;
    }
  }
}

void Scheduler::Report(const std::shared_ptr<Job>& job, Phase phase) {
  if (phase != Phase::kCompiling && phase != Phase::kVerifying) return;
  WaiterList notify;
  {
    absl::MutexLock l(&mu_);
    if (job->state != Job::State::kRunning || job->phase == phase) return;
    job->phase = phase;
    Emit(*job, ProgressEvent{phase, 0, job->queue->name}, &notify);
  }
  Deliver(notify);
}

absl::StatusOr<std::shared_ptr<Scheduler::Job>> Scheduler::Attach(Request& request, bool prefetch,
                                                                  WaiterList* notify) {
  if (request.key.empty()) return absl::InvalidArgumentError("Request.key: empty");
  if (request.queue.empty()) return absl::InvalidArgumentError("Request.queue: empty");
  if (!request.job) return absl::InvalidArgumentError("Request.job: no job function");
  if (!accepting_) return absl::UnavailableError("compile scheduler is shutting down");
  const absl::Time now = clock_.Now();
  if (!prefetch && request.deadline <= now) {
    return absl::DeadlineExceededError("Request.deadline: already passed");
  }
  Queue& queue = GetQueue(request.queue);

  if (auto it = jobs_.find(request.key); it != jobs_.end()) {
    std::shared_ptr<Job> job = it->second;
    ++queue.stats.deduplicated;
    if (prefetch) {
      job->pinned = true;
    } else if (request.priority == Priority::kInteractive && job->priority == Priority::kPrefetch &&
               job->state == Job::State::kQueued) {
      // A trainer now waits for it: it goes behind the interactive jobs
      // already queued, ahead of all prefetch work.
      Queue& job_queue = *job->queue;
      job_queue.queued.erase(job->order);
      job->priority = Priority::kInteractive;
      Enqueue(job_queue, job, notify);
    }
    return job;
  }

  if (auto it = memo_.find(request.key); it != memo_.end()) {
    if (now < it->second.expires) {
      ++queue.stats.deduplicated;
      ++queue.stats.memo_hits;
      auto job = std::make_shared<Job>();
      job->key = request.key;
      job->queue = &queue;
      job->state = Job::State::kFinished;
      job->phase = Phase::kFailed;
      job->result = it->second.error;
      return job;
    }
    memo_.erase(it);
  }

  if (static_cast<int>(queue.queued.size()) >= options_.max_queue_depth) {
    ++queue.stats.rejected;
    return absl::ResourceExhaustedError(absl::StrCat("compile queue '", queue.name, "' is full (",
                                                     queue.queued.size(),
                                                     " queued compiles); retry later"));
  }

  auto job = std::make_shared<Job>();
  job->key = request.key;
  job->queue = &queue;
  job->fn = std::move(request.job);
  job->priority = prefetch ? Priority::kPrefetch : request.priority;
  job->pinned = prefetch;
  jobs_.emplace(job->key, job);
  Enqueue(queue, job, notify);
  return job;
}

absl::StatusOr<std::unique_ptr<Ticket>> Scheduler::Submit(Request request) {
  WaiterList notify;
  auto waiter = std::make_shared<Waiter>();
  {
    absl::MutexLock l(&mu_);
    absl::StatusOr<std::shared_ptr<Job>> job = Attach(request, /*prefetch=*/false, &notify);
    if (!job.ok()) return job.status();
    waiter->job = *std::move(job);
    waiter->deadline = request.deadline;
    waiter->progress = std::move(request.progress);
    Job& j = *waiter->job;
    if (j.state != Job::State::kFinished) j.waiters.push_back(waiter);
    const int position = j.state == Job::State::kQueued ? PositionOf(j) : 0;
    EmitTo(waiter, ProgressEvent{j.phase, position, j.queue->name}, &notify);
  }
  Deliver(notify);
  return std::unique_ptr<Ticket>(new Ticket(this, std::move(waiter)));
}

CompileResult Scheduler::Run(Request request, CancelToken* cancel) {
  absl::StatusOr<std::unique_ptr<Ticket>> ticket = Submit(std::move(request));
  if (!ticket.ok()) return ticket.status();
  Ticket* t = ticket->get();
  if (cancel == nullptr) return t->Wait();
  if (!cancel->Attach(t)) {
    t->Cancel();
    return t->Wait();
  }
  CompileResult result = t->Wait();
  cancel->Detach(t);
  return result;
}

absl::Status Scheduler::SubmitPrefetch(Request request) {
  WaiterList notify;
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    absl::StatusOr<std::shared_ptr<Job>> job = Attach(request, /*prefetch=*/true, &notify);
    if (!job.ok()) {
      status = job.status();
    } else if ((*job)->state == Job::State::kFinished) {
      status = (*job)->result->status();  // a remembered compile error
    }
  }
  Deliver(notify);
  return status;
}

std::optional<CompileResult> Scheduler::WaitFor(const std::shared_ptr<Waiter>& waiter,
                                                absl::Time until) {
  if (waiter->outcome.has_value()) return waiter->outcome;
  WaiterList notify;
  {
    absl::MutexLock l(&mu_);
    const Waiter& w = *waiter;
    auto ready = [&w]() { return w.cancelled || w.job->state == Job::State::kFinished; };
    clock_.AwaitWithDeadline(mu_, absl::Condition(&ready), std::min(until, w.deadline));
    if (waiter->cancelled) {
      waiter->outcome = CancelledWait();
    } else if (waiter->job->state == Job::State::kFinished) {
      waiter->outcome = *waiter->job->result;
    } else if (clock_.Now() >= waiter->deadline) {
      waiter->outcome =
          DeadlineError(waiter->job->state == Job::State::kQueued, waiter->job->queue->name);
    } else {
      return std::nullopt;  // `until` came first; keep waiting later
    }
    Leave(waiter, &notify);
  }
  Deliver(notify);
  // Events queued before we left (e.g. kDone) go out before we return; if
  // another thread is delivering them, wait for it to finish.
  Deliver({waiter});
  absl::MutexLock l(&mu_);
  const Waiter& w = *waiter;
  auto quiet = [&w]() { return !w.delivering && w.pending.empty(); };
  mu_.Await(absl::Condition(&quiet));
  return waiter->outcome;
}

void Scheduler::CancelWaiter(const std::shared_ptr<Waiter>& waiter, bool abandon) {
  WaiterList notify;
  DoneFn discarded;  // destroyed with no lock held
  {
    absl::MutexLock l(&mu_);
    waiter->cancelled = true;
    Leave(waiter, &notify);
    if (abandon) {
      // The ticket is going away: its callbacks must not run again. One
      // running on another thread is waited for; one running on this thread
      // is the caller (a DoneFn may destroy its own Ticket).
      waiter->pending.clear();
      discarded = std::move(waiter->done);
      waiter->done = nullptr;
      waiter->done_outcome.reset();
      if (waiter->timed) {
        timers_.erase(waiter->timer);
        waiter->timed = false;
      }
      const Waiter& w = *waiter;
      const std::thread::id self = std::this_thread::get_id();
      auto idle = [&w, self]() { return !w.delivering || w.delivering_on == self; };
      mu_.Await(absl::Condition(&idle));
    } else {
      Resolve(waiter, CancelledWait(), &notify);
    }
  }
  Deliver(notify);
}

void Scheduler::SetDone(const std::shared_ptr<Waiter>& waiter, DoneFn done) {
  WaiterList notify;
  {
    absl::MutexLock l(&mu_);
    waiter->done = std::move(done);
    const Job& job = *waiter->job;
    if (waiter->cancelled) {
      Resolve(waiter, CancelledWait(), &notify);
    } else if (job.state == Job::State::kFinished) {
      Resolve(waiter, *job.result, &notify);
    } else if (clock_.Now() >= waiter->deadline) {
      Resolve(waiter, DeadlineError(job.state == Job::State::kQueued, job.queue->name), &notify);
      Leave(waiter, &notify);
    } else if (waiter->deadline != absl::InfiniteFuture()) {
      waiter->timer = timers_.emplace(waiter->deadline, waiter);
      waiter->timed = true;
      ++timers_changed_;
    }
  }
  Deliver(notify);
}

void Scheduler::DeadlineLoop() {
  for (;;) {
    WaiterList notify;
    {
      absl::MutexLock l(&mu_);
      // With no timers it waits on mu_ alone, not on the clock: a FakeClock
      // counts only threads that wait for a time.
      auto armed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return timers_stop_ || !timers_.empty();
      };
      mu_.Await(absl::Condition(&armed));
      if (timers_stop_) return;
      const uint64_t seen = timers_changed_;
      auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return timers_stop_ || timers_changed_ != seen;
      };
      clock_.AwaitWithDeadline(mu_, absl::Condition(&changed), timers_.begin()->first);
      if (timers_stop_) return;
      const absl::Time now = clock_.Now();
      while (!timers_.empty() && timers_.begin()->first <= now) {
        std::shared_ptr<Waiter> w = timers_.begin()->second;
        timers_.erase(timers_.begin());
        w->timed = false;
        const Job& job = *w->job;
        Resolve(w, DeadlineError(job.state == Job::State::kQueued, job.queue->name), &notify);
        Leave(w, &notify);
      }
    }
    Deliver(notify);
  }
}

bool Scheduler::HasRunnable() const {
  for (const auto& [name, q] : queues_) {
    if (!q->busy && !q->queued.empty()) return true;
  }
  return false;
}

bool Scheduler::WorkerShouldWake() const { return stopping_ || HasRunnable(); }

bool Scheduler::Idle() const { return running_ == 0; }

void Scheduler::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    JobFn fn;
    WaiterList notify;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Scheduler::WorkerShouldWake));
      // The most urgent head among idle queues: interactive first, then the
      // oldest, so that scarce compile threads follow the same order.
      Queue* best = nullptr;
      for (auto& [name, q] : queues_) {
        if (q->busy || q->queued.empty()) continue;
        if (best == nullptr || q->queued.begin()->first < best->queued.begin()->first) {
          best = q.get();
        }
      }
      if (best == nullptr) return;  // stopping, and nothing left to run
      auto head = best->queued.begin();
      job = std::move(head->second);
      best->queued.erase(head);
      best->busy = true;
      ++running_;
      job->state = Job::State::kRunning;
      job->phase = Phase::kCompiling;
      fn = std::move(job->fn);
      job->fn = nullptr;
      Emit(*job, ProgressEvent{Phase::kCompiling, 0, best->name}, &notify);
      PublishPositions(*best, &notify);
    }
    Deliver(notify);
    notify.clear();

    // No lock held: this is NVRTC, the driver and the store.
    const ReportFn report = [this, job](Phase phase) { Report(job, phase); };
    CompileResult result = fn(report);
    fn = nullptr;  // release its captures outside the lock
    if (result.ok() && *result == nullptr) {
      result = absl::InternalError("compile job returned OK without a kernel");
    }
    if (!result.ok()) result = NameKeyOfLimitError(result.status(), job->key);

    {
      absl::MutexLock l(&mu_);
      Queue& queue = *job->queue;
      queue.busy = false;
      --running_;
      ++queue.stats.jobs_run;
      auto it = jobs_.find(job->key);
      if (it != jobs_.end() && it->second == job) jobs_.erase(it);
      if (!result.ok()) {
        ++queue.stats.jobs_failed;
        const auto& memoize = options_.memoize_error ? options_.memoize_error : DefaultMemoize;
        if (options_.error_ttl > absl::ZeroDuration() && memoize(result.status())) {
          const absl::Time now = clock_.Now();
          if (memo_.size() >= 4096) {  // keep the memory bounded: drop expired entries
            for (auto m = memo_.begin(); m != memo_.end();) {
              if (m->second.expires <= now) {
                memo_.erase(m++);
              } else {
                ++m;
              }
            }
          }
          memo_[job->key] = Memo{result.status(), now + options_.error_ttl};
        }
      }
      Finish(*job, std::move(result), &notify);
    }
    Deliver(notify);
  }
}

std::vector<QueueStats> Scheduler::Stats() const {
  absl::MutexLock l(&mu_);
  std::vector<QueueStats> out;
  out.reserve(queues_.size());
  for (const auto& [name, q] : queues_) {
    QueueStats s = q->stats;
    s.name = name;
    s.depth = static_cast<int>(q->queued.size());
    s.busy = q->busy;
    out.push_back(std::move(s));
  }
  return out;
}

absl::Status Scheduler::Shutdown(absl::Duration grace) {
  WaiterList notify;
  {
    absl::MutexLock l(&mu_);
    accepting_ = false;
    for (auto& [name, q] : queues_) {
      for (auto& [order, job] : q->queued) {
        jobs_.erase(job->key);
        Finish(*job, absl::UnavailableError("compile scheduler is shutting down"), &notify);
      }
      q->queued.clear();
    }
  }
  Deliver(notify);
  int still_running = 0;
  {
    absl::MutexLock l(&mu_);
    clock_.AwaitWithDeadline(mu_, absl::Condition(this, &Scheduler::Idle), clock_.Now() + grace);
    stopping_ = true;
    still_running = running_;
  }
  if (still_running > 0) {
    return absl::DeadlineExceededError(
        absl::StrCat(still_running, " compile(s) still running after the shutdown grace period"));
  }
  JoinThreads();
  return absl::OkStatus();
}

void Scheduler::JoinThreads() {
  absl::MutexLock l(&join_mu_);
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace kcache
