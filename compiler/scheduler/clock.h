// Time for the compile scheduler (and whoever else needs deadlines that tests
// control): Clock is read with Now() and waited on with AwaitWithDeadline();
// FakeClock lets a test move time by hand and wakes the waiters it passes, so
// that deadline and TTL tests never sleep.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kcache {

// Thread-safe. Implementations must be usable from any thread at once.
class Clock {
 public:
  virtual ~Clock() = default;

  virtual absl::Time Now() const = 0;

  // Blocks until `cond` holds or Now() >= `deadline`, whichever comes first,
  // and returns whether `cond` holds. `mu` must be held on entry and is held
  // on return; it may be released while blocked (as absl::Mutex::Await does),
  // so `cond` must be re-checked state, not an event. `cond` is evaluated with
  // `mu` held. absl::InfiniteFuture() waits for `cond` alone.
  virtual bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // The process-wide wall clock (absl::Now, absl::Mutex deadlines). Never
  // destroyed.
  static Clock& Real();
};

// A clock that only moves when told to. Advance()/SetTime() wake every thread
// blocked in AwaitWithDeadline on this clock so that it re-checks its deadline.
//
// Lock order: FakeClock's own mutex is taken before the waiters' mutexes
// (Advance locks each registered `mu` while holding it); a waiter never takes
// it while holding `mu` (registration releases `mu` first).
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000));

  absl::Time Now() const override;
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Advance(absl::Duration d);
  void SetTime(absl::Time t);

  // Blocks (without a timeout) until at least `n` threads are blocked in
  // AwaitWithDeadline on this clock: lets a test advance time only once the
  // thread it means to time out is really waiting.
  void BlockUntilWaiters(int n);
  int waiters() const;

 private:
  void WakeAll();

  // Atomic, not under mu_: Now() is called inside waiters' conditions, with
  // their mutex held, while Advance() holds mu_ and locks those mutexes.
  std::atomic<int64_t> now_ns_;
  mutable absl::Mutex mu_;
  // Mutexes that have a thread blocked on them, with how many.
  std::map<absl::Mutex*, int> registered_ ABSL_GUARDED_BY(mu_);
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kcache
