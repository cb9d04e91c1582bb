#include "service/grpc_status.h"

#include <string>

namespace kcache {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

void SetRetryHint(grpc::ServerContextBase* context, int retry_after_ms) {
  context->AddTrailingMetadata("retry-after-ms", std::to_string(retry_after_ms));
}

}  // namespace kcache
