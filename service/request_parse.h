// KernelService requests from their wire bytes: bounded before anything is
// allocated for them, parsed, and refused with InvalidArgument (naming the
// field or the limit) when malformed. Protobuf turns two bytes on the wire
// (an empty submessage) into an object of a hundred bytes or more, so a
// size limit on bytes alone does not bound memory: the fields the bytes
// would create are counted first, without allocating, and a request over
// its budget is refused before it is parsed (issue 17, item 4).
//
// Pure functions of their arguments: thread-safe. The fuzz target
// tests/service/fuzz_request.cc drives them with arbitrary bytes.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kcache/v1/service.pb.h"

namespace kcache {

struct RequestLimits {
  // One GetKernelRequest (alone, or one entry of a Prefetch), serialized.
  uint64_t max_request_bytes = 1u << 20;
  // Fields one GetKernelRequest may hold, nested ones included (a field of
  // a repeated or packed field counts once per element).
  uint64_t max_request_fields = 1u << 16;
  // PrefetchRequest.requests entries (max_prefetch_requests).
  uint64_t max_prefetch_requests = 1024;
  // Fields a whole PrefetchRequest may hold.
  uint64_t max_prefetch_fields = 1u << 18;
};

// Counts the fields `bytes` would create when parsed as a GetKernelRequest
// (or as a PrefetchRequest), without allocating. InvalidArgument naming the
// limit when over it ("requests: more than 1024 entries
// (max_prefetch_requests)"); OK otherwise, malformed bytes included (the
// parser refuses those).
absl::Status CheckGetKernelRequestBudget(absl::string_view bytes, const RequestLimits& limits);
absl::Status CheckPrefetchRequestBudget(absl::string_view bytes, const RequestLimits& limits);

// The budget check, then the parse. InvalidArgument when the bytes are not
// a valid message ("request: not a valid kcache.v1.GetKernelRequest ...")
// or carry a field this daemon does not know at the request's top level, in
// `target` or in `raw` ("target: unknown field number 9 ..."; inside `spec`
// the spec's own validation names it).
absl::StatusOr<v1::GetKernelRequest> ParseGetKernelRequest(absl::string_view bytes,
                                                           const RequestLimits& limits);
absl::StatusOr<v1::PrefetchRequest> ParsePrefetchRequest(absl::string_view bytes,
                                                         const RequestLimits& limits);

// Unknown fields of `request` outside its spec, as above; `path` prefixes
// the message ("" for a request alone, "requests[3]." in a Prefetch).
absl::Status CheckNoUnknownRequestFields(const v1::GetKernelRequest& request,
                                         const std::string& path);

}  // namespace kcache
