// Real and fake clocks; see clock.h.
#include "compiler/scheduler/clock.h"

namespace kcache {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu.AwaitWithDeadline(cond, deadline);
  }
};

}  // namespace

Clock& Clock::Real() {
  static RealClock* const clock = new RealClock();
  return *clock;
}

FakeClock::FakeClock(absl::Time start) : now_ns_(absl::ToUnixNanos(start)) {}

absl::Time FakeClock::Now() const {
  return absl::FromUnixNanos(now_ns_.load(std::memory_order_acquire));
}

// The analysis cannot follow the release and re-acquisition of `mu` around
// registration (done so that this clock's mutex is never taken under `mu`).
bool FakeClock::AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                                  absl::Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  struct State {
    const absl::Condition* cond;
    const FakeClock* clock;
    absl::Time deadline;
    bool operator()() const { return cond->Eval() || clock->Now() >= deadline; }
  } state{&cond, this, deadline};
  if (state()) return cond.Eval();

  mu.Unlock();
  {
    absl::MutexLock l(&mu_);
    ++registered_[&mu];
    ++waiters_;
  }
  mu.Lock();
  mu.Await(absl::Condition(&state));
  const bool result = cond.Eval();
  mu.Unlock();
  {
    absl::MutexLock l(&mu_);
    if (--registered_[&mu] == 0) registered_.erase(&mu);
    --waiters_;
  }
  mu.Lock();
  // `mu` was released above, so the condition may have changed since; the
  // caller re-checks its state anyway, but report the current truth.
  return result || cond.Eval();
}

void FakeClock::Advance(absl::Duration d) {
  now_ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_acq_rel);
  WakeAll();
}

void FakeClock::SetTime(absl::Time t) {
  now_ns_.store(absl::ToUnixNanos(t), std::memory_order_release);
  WakeAll();
}

void FakeClock::WakeAll() {
  absl::MutexLock l(&mu_);
  // Releasing an absl::Mutex re-evaluates the conditions of its waiters, so a
  // lock/unlock pair makes each of them look at the new time. Holding mu_
  // keeps every registered mutex alive (a waiter unregisters before leaving).
  for (auto& [m, n] : registered_) {
    m->Lock();
    m->Unlock();
  }
}

void FakeClock::BlockUntilWaiters(int n) {
  struct Arg {
    const FakeClock* clock;
    int n;
  } arg{this, n};
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->clock->waiters_ >= a->n; }, &arg));
}

int FakeClock::waiters() const {
  absl::MutexLock l(&mu_);
  return waiters_;
}

}  // namespace kcache
