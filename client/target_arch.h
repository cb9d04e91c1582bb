// The compilation target a device gets from its compute capability, the one
// rule for the C++ client (client.cc, a request with no target) and the
// daemon (service/kernel_backend.cc, a request naming a device). Header-only
// so that the daemon includes it without linking the client library. The
// Python client's kcache.arch_for_capability follows the same rule;
// tests/client/target_arch_table.txt is checked against both.
#pragma once

#include <string>

namespace kcache {

// "sm_<major><minor>", plus 'a' from compute capability 9 on: (8, 6) ->
// "sm_86", (9, 0) -> "sm_90a". The arch-specific variant is what wgmma
// needs, and a cubin built for it loads only on exactly that compute
// capability: right for a kernel loaded on the device it was asked for.
inline std::string TargetArchForCapability(int major, int minor) {
  std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
  if (major >= 9) arch += 'a';
  return arch;
}

}  // namespace kcache
