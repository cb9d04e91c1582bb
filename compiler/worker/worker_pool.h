// Compiles in isolated, reused worker processes (kcache-compile-worker), so
// that an NVRTC crash or hang costs one compile, not the daemon.
//
// Thread-safe. At most `max_workers` processes exist; a Compile waits (up to
// its deadline) for a free one. Workers start lazily and are reused; one
// that crashes, hangs past its deadline or breaks the protocol is killed,
// reaped, and replaced by a fresh one on a later request. An idle worker
// found dead is replaced before it is used (the request never sees it), and
// a compile whose worker died under it (a crash, the OOM killer) is retried
// once on a fresh worker; one that ran past its deadline or was answered (a
// compile error included) is not. No lock is held while a worker compiles.
//
// The process must not set SIGCHLD to SIG_IGN (workers are reaped with
// waitpid). Workers exit when the daemon does (they watch their socket).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "compiler/cuda/compile.h"

namespace kcache {

struct WorkerPoolOptions {
  // Empty: "kcache-compile-worker" in the directory of /proc/self/exe (the
  // daemon and the worker are installed side by side).
  std::string worker_path;
  std::string nvrtc_path;      // passed to the worker; empty = default search
  std::string nvjitlink_path;  // likewise, for raw kernels
  int max_workers = 2;
  // Per-compile resource limits, set by each worker on itself (see
  // worker::ServeOptions); core dumps are always off. 0 = unlimited. The
  // defaults fit the largest kernels of the test suites (~150 MB, ~3 s CPU)
  // with a wide margin.
  uint64_t limit_as_bytes = uint64_t{4} << 30;       // RLIMIT_AS
  uint64_t limit_cpu_seconds = 120;                  // RLIMIT_CPU, per compile
  uint64_t limit_fsize_bytes = uint64_t{256} << 20;  // RLIMIT_FSIZE
  // Tests only: start workers with --enable-test-faults (see worker.h).
  bool enable_test_faults = false;
};

class WorkerPool : public Compiler {
 public:
  explicit WorkerPool(WorkerPoolOptions options);
  // Closes every worker's socket (idle workers exit on end of stream) and
  // reaps them. No Compile may be in flight.
  ~WorkerPool() override;
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // See Compiler (compiler/cuda/compile.h) for the codes. Besides those:
  //   Internal          "compile worker crashed with signal N (...)" or
  //                     "... exited with status N", with the tail of the
  //                     worker's stderr, when the retry's worker died too
  //                     (the message then says so); the worker is replaced;
  //   DeadlineExceeded  no free worker before the deadline, or the compile
  //                     ran past it: the worker was SIGKILLed and replaced;
  //   Unavailable       a worker could not be started (path in the message);
  //   ResourceExhausted the compile hit a worker limit (address space, CPU
  //                     time, output size; named in the message with the
  //                     program and arch). Not retried: the same input would
  //                     hit it again. The worker is replaced.
  absl::StatusOr<CompileOutput> Compile(const CompileInput& input, absl::Time deadline) override;

  // Starts one worker with --probe: it applies the protections a compile
  // worker runs under (network drop, resource limits) and describes them on
  // one line (worker::DescribeSandbox: "network dropped (...); interfaces
  // lo; ..." or "network kept (<why the platform refused>); ..."), which
  // this returns. For kcached's start-up lines. Unavailable when the worker
  // cannot be started, or did not answer within 10 s (it is then killed).
  absl::StatusOr<std::string> Probe() const;

  // Worker processes alive now (idle or busy). For tests and metrics.
  int live_workers() const;
  // Compiles retried on a fresh worker after their worker died (since
  // construction). For tests and metrics.
  int64_t retried_compiles() const;
  // Compiles that hit each limit (since construction). For tests and metrics.
  enum Limit { kAddressSpace = 0, kCpuTime = 1, kOutputSize = 2, kNumLimits = 3 };
  static const char* LimitName(Limit l);  // "address_space", "cpu_time", "output_size"
  int64_t limit_exceeded(Limit l) const;
  // Process ids of the idle workers. For tests.
  std::vector<pid_t> idle_worker_pids() const;

 private:
  struct Worker;
  // One request on one worker. kAnswered: the worker replied (`result` is
  // its answer, success or compile error) and may be reused. Otherwise the
  // worker has been reaped: kDied when it ended on its own (crash, exit),
  // kFailed when it was killed (deadline, protocol error), kLimit when it
  // ended on one of its resource limits (`limit` says which).
  struct Attempt {
    enum Outcome { kAnswered, kDied, kFailed, kLimit } outcome;
    absl::StatusOr<CompileOutput> result;
    Limit limit = kAddressSpace;
  };
  Attempt RunOnce(Worker& w, const CompileInput& input, absl::Time deadline) const;
  // `probe`: start it with --probe (see Probe).
  absl::StatusOr<std::unique_ptr<Worker>> Spawn(bool probe = false) const;
  // Kills (if needed) and reaps `w`; returns how it ended, as a message.
  // `wait_status`, when set, receives waitpid's status (0 if unknown).
  static std::string Reap(Worker& w, bool kill_first, int* wait_status = nullptr);
  bool WorkerAvailable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerPoolOptions options_;
  const std::string worker_path_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Worker>> idle_ ABSL_GUARDED_BY(mu_);
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retried_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t limit_exceeded_[kNumLimits] ABSL_GUARDED_BY(mu_) = {};
};

}  // namespace kcache
