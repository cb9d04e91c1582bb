#include "service/admin_token.h"

namespace kcache {

bool BearerTokenMatches(std::string_view authorization, std::string_view token) {
  constexpr std::string_view kBearer = "Bearer ";
  // Every byte of the value is compared, whatever the first difference; a
  // wrong length is only learnt at the end.
  const size_t expected = kBearer.size() + token.size();
  unsigned char diff = authorization.size() == expected ? 0 : 1;
  for (size_t i = 0; i < authorization.size(); ++i) {
    const char want = i < kBearer.size() ? kBearer[i]
                      : i < expected     ? token[i - kBearer.size()]
                                         : token[(i - kBearer.size()) % token.size()];
    diff |= static_cast<unsigned char>(authorization[i] ^ want);
  }
  // Keep the compiler from turning the loop into an early-exit compare.
  volatile unsigned char result = diff;
  return result == 0;
}

bool CarriesAdminToken(const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata,
                       std::string_view token) {
  auto it = client_metadata.find("authorization");
  return it != client_metadata.end() &&
         BearerTokenMatches(std::string_view(it->second.data(), it->second.size()), token);
}

}  // namespace kcache
