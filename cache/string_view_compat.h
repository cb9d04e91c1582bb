// Debian's abseil is built with its own absl::string_view (not an alias of
// std::string_view), so heterogeneous lookups in absl hash containers need
// an explicit conversion.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace kcache {
inline absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
}  // namespace kcache
