// AdminService, the operators' gRPC face of the daemon (stats, list,
// inspect, pin, evict, invalidate, verify, export, import): a thin adapter
// over Store and KernelBackend. Its methods are synchronous handlers, each
// holding a gRPC thread of its own while it runs.
#pragma once

#include <string>

#include "cache/store.h"
#include "kcache/v1/service.grpc.pb.h"
#include "service/kernel_backend.h"
#include "service/metrics.h"
#include "service/serving_state.h"

namespace kcache {

class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  // `token` non-empty: every call must carry "authorization: Bearer <token>"
  // (the TCP listener); empty: no check (the Unix socket, guarded by its
  // file mode).
  AdminServiceImpl(Store* store, KernelBackend* backend, const ServingState* state,
                   std::string token, MetricsRegistry* metrics)
      : store_(store),
        backend_(backend),
        state_(state),
        token_(std::move(token)),
        evicted_(metrics->GetCounter("kcache_evictions_total", "Entries evicted from the store")) {}

  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                     v1::StatsResponse* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const v1::ListRequest* req,
                    v1::ListResponse* resp) override;
  grpc::Status Inspect(grpc::ServerContext* ctx, const v1::InspectRequest* req,
                       v1::InspectResponse* resp) override;
  grpc::Status Pin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                   v1::PinResponse* resp) override;
  grpc::Status Unpin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                     v1::PinResponse* resp) override;
  grpc::Status Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                     v1::EvictResponse* resp) override;
  grpc::Status Invalidate(grpc::ServerContext* ctx, const v1::InvalidateRequest* req,
                          v1::InvalidateResponse* resp) override;
  grpc::Status Verify(grpc::ServerContext* ctx, const v1::VerifyRequest* req,
                      v1::VerifyResponse* resp) override;
  grpc::Status Export(grpc::ServerContext* ctx, const v1::ExportRequest* req,
                      grpc::ServerWriter<v1::BundleChunk>* writer) override;
  grpc::Status Import(grpc::ServerContext* ctx, grpc::ServerReader<v1::BundleChunk>* reader,
                      v1::ImportResponse* resp) override;

 private:
  absl::Status Authorize(grpc::ServerContext* ctx) const;
  absl::StatusOr<std::string> ResolveKey(const std::string& key_or_prefix);

  Store* store_;
  KernelBackend* backend_;
  const ServingState* state_;
  const std::string token_;
  Counter* evicted_;
};

}  // namespace kcache
