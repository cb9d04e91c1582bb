// The daemon's kernel path, independent of gRPC: resolve a request (validate
// and normalize the spec, choose the architecture and the queue, compute the
// key), answer from the store, or compile through the scheduler (generate,
// compile in a worker, verify on a device when there is one, publish) so that
// every waiter of one key receives the same finished kernel.
//
// Thread-safe. Holds no lock across the store, the compiler or the driver.
// Does not own its dependencies, which must outlive it.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/remote/shared_tier.h"
#include "cache/store.h"
#include "compiler/attention_compile.h"
#include "compiler/cuda/compile.h"
#include "compiler/cuda/cuda_driver.h"
#include "compiler/numeric_check.h"
#include "compiler/raw_kernel.h"
#include "compiler/scheduler/scheduler.h"
#include "kcache/v1/daemon_config.pb.h"
#include "kcache/v1/service.pb.h"
#include "service/metrics.h"

namespace kcache {

struct BackendDeps {
  Store* store = nullptr;
  Scheduler* scheduler = nullptr;
  Compiler* compiler = nullptr;
  Devices* devices = nullptr;  // null or unavailable: compile-only mode
  // Runs the numeric check before serve (compiler/numeric_check.h) on the
  // verifying device; null: attention kernels are published "unchecked".
  NumericRunner* numeric_runner = nullptr;
  v1::Toolchain toolchain;  // id filled
  // Not OK when NVRTC could not be loaded: kernel requests answer with it.
  absl::Status toolchain_status;
  // The raw-kernel toolchain (compiler/toolchain.h RawToolchain), when raw
  // kernels are enabled; otherwise raw_toolchain_status says why not.
  // Whether a caller may send raw kernels at all is the service's check
  // (kernel_service.h), made before the backend sees the request.
  v1::Toolchain raw_toolchain;
  absl::Status raw_toolchain_status = absl::FailedPreconditionError("raw kernels are disabled");
  v1::DaemonConfig config;
  MetricsRegistry* metrics = nullptr;
  // The shared remote tier (issue 16), or null: asked after a local miss,
  // before compiling (service/remote_hook.h); published to after a compile.
  SharedTier* remote = nullptr;
};

// A request resolved to its kernel identity and where it compiles.
struct ResolvedRequest {
  AttentionIdentity id;                    // normalized spec, arch, key (raw: arch and key only)
  std::shared_ptr<const RawIdentity> raw;  // set for a raw kernel
  std::string queue;                       // "gpu0", or the arch in compile-only mode
  int device = -1;                         // device that verifies, or -1
};

// What a GetKernel answers: the record and cubin, shared and immutable
// (the store's entry, whether it was a hit or the result of a compile).
struct KernelAnswer {
  EntryRef entry;
  bool hit = false;
  const v1::KernelRecord& record() const { return entry->record; }
  const std::string& cubin() const { return entry->cubin; }
};

class KernelBackend {
 public:
  explicit KernelBackend(BackendDeps deps);

  // InvalidArgument naming the field ("spec.num_kv_heads: ...",
  // "target.arch: ...", "target.device: ...", "raw.kernel_names[0]: ...").
  absl::StatusOr<ResolvedRequest> Resolve(const v1::GetKernelRequest& request) const;

  // A request under way: answered from the store (`ticket` null, `answer`
  // set), or waiting for a compile shared with every concurrent request for
  // the key (`ticket` set; give it a Ticket::OnDone callback, as the gRPC
  // service does, or Wait on it; destroy it to abandon). There is no
  // blocking Get: the daemon's callers must not hold a thread per waiter.
  struct Pending {
    KernelAnswer answer;
    std::unique_ptr<Ticket> ticket;
    // Set (before the ticket's outcome) when this request's own job ran the
    // compile; false at the outcome: it joined another request's compile, or
    // got another node's result. For the latency histogram's outcome.
    std::shared_ptr<const std::atomic<bool>> compiled_here;
  };
  // `progress` (optional) receives the scheduler's events for this waiter.
  absl::StatusOr<Pending> Begin(const v1::GetKernelRequest& request, absl::Time deadline,
                                ProgressFn progress = nullptr);
  // Turns a finished ticket's result into an answer.
  static absl::StatusOr<KernelAnswer> Answer(CompileResult result);

  // How a GetKernel call ended, for kcache_get_kernel_seconds{outcome}: a
  // hit; a miss whose compile this call started ("compiled") or joined
  // ("waited"); anything else, refusals included ("failed").
  enum class Outcome { kHit, kCompiled, kWaited, kFailed };
  // Records one call's latency (from its arrival to its answer).
  void ObserveRequest(Outcome outcome, absl::Duration latency);

  v1::PrefetchResponse Prefetch(const v1::PrefetchRequest& request);

  // Daemon counters for the admin Stats RPC.
  void FillCounters(v1::StatsResponse* stats) const;

  const v1::Toolchain& toolchain() const { return deps_.toolchain; }
  bool compile_only() const { return devices_.empty(); }
  const std::vector<DeviceInfo>& devices() const { return devices_; }

 private:
  // Compiles, verifies and publishes one resolved request; runs as a
  // scheduler job. Re-checks the store first: a request that missed just
  // before another compile of the key was published must not compile again.
  // Sets `*compiled` (when given) once it starts compiling for real.
  CompileResult Compile(const ResolvedRequest& r, absl::Time compile_deadline,
                        const ReportFn& report, std::atomic<bool>* compiled);
  JobFn MakeJob(std::shared_ptr<const ResolvedRequest> r, absl::Time compile_deadline,
                std::shared_ptr<std::atomic<bool>> compiled = nullptr);

  const BackendDeps deps_;
  std::vector<DeviceInfo> devices_;  // empty in compile-only mode

  Counter* requests_;
  Counter* hits_;
  Counter* misses_;
  Counter* compiles_;
  Counter* compile_failures_;
  Counter* invalid_;
  Histogram* compile_seconds_;
  Counter* numeric_failures_;
  Histogram* numeric_check_seconds_;
  Histogram* request_seconds_[4];  // by Outcome
};

}  // namespace kcache
