// KernelService, the trainers' gRPC face of the daemon: a thin adapter over
// KernelBackend. GetKernel uses the callback API: a hit (or a refusal) is
// answered on the gRPC thread that read the request, with no hand-off to a
// sync server thread (that hand-off cost more than the rest of a hit;
// bench/service). Its response is written as raw bytes whose cubin part
// points into the store's shared entry, so the cubin is not copied on its way
// to the socket. A GetKernel or GetKernelStream that waits for a compile
// holds no thread: its reactor is finished by the scheduler's completion
// callback (Ticket::OnDone) on the thread that ends the wait,
// GetKernelStream's progress events are written from the scheduler's
// ProgressFn, and client cancellation reaches either through the reactor's
// OnCancel. Prefetch (lookups and queueing, no waiting) is answered on the
// gRPC thread too.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "kcache/v1/service.grpc.pb.h"
#include "service/kernel_backend.h"
#include "service/request_parse.h"
#include "service/serving_state.h"

namespace kcache {

// Who may send raw kernels (GetKernelRequest.raw): nobody unless enabled;
// then only calls carrying the admin token (service/admin_token.h; raw input is
// code: the Unix socket's file mode admits every trainer, and that is not
// enough), and only on a listener where admin calls are accepted too (the
// Unix socket, or TCP with TLS): the token never counts on plaintext TCP,
// where it would cross the network in the clear (issue 17, item 6).
struct RawKernelPolicy {
  bool enabled = false;
  std::string token;              // the admin token; non-empty when enabled
  uint64_t max_source_bytes = 0;  // RawKernel.source limit
  // False on a plaintext TCP listener: raw requests are refused there,
  // token or not.
  bool token_accepted_here = true;
};

// The wire phase of a scheduler phase (compiler/scheduler/scheduler.h), for
// GetKernelStream's progress events.
v1::Progress::Phase ToProtoPhase(Phase phase);

// Register one instance with one server (a callback method's handler is
// bound to the server that registered it). The destructor waits until every
// GetKernel / GetKernelStream call that waited for a compile has ended (its
// reactor done, its Ticket released), so that none touches anything after
// it; destroy the server first. The Scheduler behind `backend` must outlive
// this object.
//
// Every method takes its request as bytes and parses it itself
// (service/request_parse.h): bounded by `limits` before anything is
// allocated for it, and refused with INVALID_ARGUMENT and a message when
// malformed (gRPC's own parse would allocate first and answer INTERNAL or
// UNIMPLEMENTED with no message).
class KernelServiceImpl final
    : public v1::KernelService::WithRawCallbackMethod_GetKernel<
          v1::KernelService::WithRawCallbackMethod_GetKernelStream<
              v1::KernelService::WithRawCallbackMethod_Prefetch<v1::KernelService::Service>>> {
  using Base = v1::KernelService::WithRawCallbackMethod_GetKernel<
      v1::KernelService::WithRawCallbackMethod_GetKernelStream<
          v1::KernelService::WithRawCallbackMethod_Prefetch<v1::KernelService::Service>>>;

 public:
  KernelServiceImpl(KernelBackend* backend, const ServingState* state, uint64_t max_spec_bytes,
                    absl::Duration default_deadline, RawKernelPolicy raw = {},
                    RequestLimits limits = {})
      : backend_(backend),
        state_(state),
        max_spec_bytes_(max_spec_bytes),
        default_deadline_(default_deadline),
        raw_(std::move(raw)),
        limits_(limits) {}
  ~KernelServiceImpl() override;

  // The base's synchronous GetKernel is disabled (it aborts); this is the
  // one: a GetKernelRequest in, a GetKernelResponse out, both as bytes.
  using Base::GetKernel;
  grpc::ServerUnaryReactor* GetKernel(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  // Progress events while the request waits for a compile, then one result
  // event (or an error status), each a serialized GetKernelEvent. Likewise
  // callback-based; the synchronous version is disabled.
  using Base::GetKernelStream;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetKernelStream(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override;
  // A PrefetchRequest in, a PrefetchResponse out, answered on the gRPC
  // thread that read it (lookups and queueing only: compiles run later).
  using Base::Prefetch;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

  // Answers every GetKernel / GetKernelStream call waiting for a compile
  // UNAVAILABLE ("its compile was abandoned, retry", with the retry hint),
  // now and any that starts waiting later. For shutdown, once the
  // scheduler's grace for running compiles has ended (so that clients retry
  // against the restarted daemon instead of being cancelled when the
  // servers' own shutdown deadline passes). Thread-safe; calls into gRPC with
  // no lock held.
  void AbandonWaits();

  // Waits until exactly `n` calls (both methods) are waiting for a compile
  // (for tests, which must not sleep).
  void AwaitWaitingCalls(int n) const;

 private:
  class TicketWait;
  class WaitingCall;
  class StreamingCall;
  // The calls waiting for a compile (their TicketWait part). Shared with
  // them, so that a call's last touch (leaving the set) never outlives the
  // service.
  struct Waiting {
    mutable absl::Mutex mu;
    bool abandoned ABSL_GUARDED_BY(mu) = false;
    absl::flat_hash_set<TicketWait*> calls ABSL_GUARDED_BY(mu);
  };

  // The request's bytes, bounded and parsed (service/request_parse.h).
  absl::StatusOr<v1::GetKernelRequest> ParseRequest(const grpc::ByteBuffer& request) const;
  absl::Status Admit(grpc::CallbackServerContext* ctx, const v1::GetKernelRequest& req) const;
  // For a request with `raw`: FailedPrecondition when raw kernels are off,
  // PermissionDenied without the admin token, InvalidArgument over the size
  // limit. `field` prefixes messages ("raw", "requests[2].raw").
  absl::Status AdmitRaw(grpc::CallbackServerContext* ctx, const v1::GetKernelRequest& req,
                        const std::string& field) const;
  absl::Time DeadlineOf(grpc::ServerContextBase* ctx) const;

  KernelBackend* backend_;
  const ServingState* state_;
  const uint64_t max_spec_bytes_;
  const absl::Duration default_deadline_;
  const RawKernelPolicy raw_;
  const RequestLimits limits_;
  const std::shared_ptr<Waiting> waiting_ = std::make_shared<Waiting>();
};

}  // namespace kcache
