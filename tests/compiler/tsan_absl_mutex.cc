// Only in ThreadSanitizer builds: teaches TSan that absl::Mutex is a mutex
// and that absl::Status's shared representation is reference-counted.
//
// Debian's abseil is built without -fsanitize=thread, so its Mutex carries no
// TSan annotations and TSan reports every access guarded by one as a race.
// This file interposes the Mutex entry points the executable uses (and those
// libabsl calls through its PLT), forwards to the real ones found with
// dlsym(RTLD_NEXT), and wraps them in TSan's public mutex annotations, as
// abseil does itself when built with TSan. Between pre_unlock and post_unlock
// TSan ignores accesses, which covers the conditions that absl evaluates for
// other threads while releasing the lock.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace {

template <typename Fn>
Fn Real(const char* mangled) {
  void* p = dlsym(RTLD_NEXT, mangled);
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found\n", mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

// Mangled names of Debian's abseil 20220623 (inline namespace debian3).
#define KC_REAL(var, type, name) static const auto var = Real<type>(name)

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  KC_REAL(real, void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

bool Mutex::TryLock() {
  KC_REAL(real, bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this, ok ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed, 0);
  return ok;
}

void Mutex::Unlock() {
  KC_REAL(real, void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderLock() {
  KC_REAL(real, void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
}

void Mutex::ReaderUnlock() {
  KC_REAL(real, void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

void Mutex::LockWhen(const Condition& cond) {
  KC_REAL(real, void (*)(Mutex*, const Condition&),
          "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  __tsan_mutex_post_lock(this, 0, 0);
}

// Await releases and re-acquires the lock: a release, then (with accesses
// ignored while absl evaluates the condition) an acquire.
void Mutex::Await(const Condition& cond) {
  KC_REAL(real, void (*)(Mutex*, const Condition&),
          "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_mutex_pre_unlock(this, 0);
  real(this, cond);
  __tsan_mutex_post_unlock(this, 0);
  __tsan_mutex_pre_lock(this, 0);
  __tsan_mutex_post_lock(this, 0, 0);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  KC_REAL(real, bool (*)(Mutex*, const Condition&, absl::Time),
          "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_mutex_pre_unlock(this, 0);
  const bool ok = real(this, cond, deadline);
  __tsan_mutex_post_unlock(this, 0);
  __tsan_mutex_pre_lock(this, 0);
  __tsan_mutex_post_lock(this, 0, 0);
  return ok;
}

// absl::Status shares its heap representation between copies; the last
// owner deletes it after an acq_rel decrement in libabsl_status, where TSan
// cannot see it. The same code as absl's, compiled here with TSan.
void Status::UnrefNonInlined(uintptr_t rep) {
  status_internal::StatusRep* r = RepToPointer(rep);
  if (r->ref.load(std::memory_order_acquire) == 1 ||
      r->ref.fetch_sub(1, std::memory_order_acq_rel) - 1 == 0) {
    delete r;
  }
}

ABSL_NAMESPACE_END
}  // namespace absl
