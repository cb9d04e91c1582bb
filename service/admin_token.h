// The admin token check, the one authentication kcached does: AdminService
// calls over TCP and raw kernels on KernelService both need
// "authorization: Bearer <token>" in the call's metadata. Stateless and
// thread-safe.
#pragma once

#include <grpcpp/support/string_ref.h>

#include <map>
#include <string_view>

namespace kcache {

// Whether an "authorization" metadata value is "Bearer <token>". Its time
// depends on the lengths only, not on where the value first differs.
// `token` must not be empty.
bool BearerTokenMatches(std::string_view authorization, std::string_view token);

// Whether a call's metadata (ServerContext::client_metadata()) carries
// "authorization: Bearer <token>" (its first "authorization" entry). `token`
// must not be empty. The caller words the refusal: what needs the token
// differs by call.
bool CarriesAdminToken(const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata,
                       std::string_view token);

}  // namespace kcache
