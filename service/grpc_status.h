// The one adapter from absl::Status to grpc::Status in the daemon. Codes map
// one to one; a retry hint (RESOURCE_EXHAUSTED) travels as trailing metadata
// "retry-after-ms".
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace kcache {

grpc::Status ToGrpcStatus(const absl::Status& status);

// Adds the retry hint for RESOURCE_EXHAUSTED / UNAVAILABLE answers.
void SetRetryHint(grpc::ServerContextBase* context, int retry_after_ms);

}  // namespace kcache
