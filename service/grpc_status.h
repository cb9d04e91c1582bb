// The one adapter from absl::Status to grpc::Status in the daemon. Codes map
// one to one; a retry hint (RESOURCE_EXHAUSTED) travels as trailing metadata
// "retry-after-ms".
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace kcache {

grpc::Status ToGrpcStatus(const absl::Status& status);

// Adds the retry hint for RESOURCE_EXHAUSTED / UNAVAILABLE answers.
void SetRetryHint(grpc::ServerContextBase* context, int retry_after_ms);

// A service handler's answer for `status`: ToGrpcStatus, plus the retry hint
// (500 ms) for UNAVAILABLE and RESOURCE_EXHAUSTED, except a compile worker's
// limit (compiler/cuda/compile.h), which is not transient. KernelService and
// AdminService both answer through this.
grpc::Status Reply(grpc::ServerContextBase* context, const absl::Status& status);

// For ServerBuilder::experimental().SetInterceptorCreators: a call to a
// method of a kcache service that gRPC refused itself because it could not
// parse the request (INTERNAL with an empty message: the synchronous
// AdminService methods; KernelService parses its own requests) is answered
// INVALID_ARGUMENT "request: not a valid kcache.v1.StatsRequest (malformed
// protobuf, ...)" instead. Every status kcached's own handlers send has a
// message, so an empty one is gRPC's. UNIMPLEMENTED (a service this
// listener does not serve) is left alone.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
MalformedRequestInterceptors();

}  // namespace kcache
