// libFuzzer target for the `kcache warm` manifest parser (ParseManifest):
// no input may crash it, hang it or make it allocate without bound (a YAML
// alias bomb, deep nesting, invalid UTF-8, non-scalar keys). Whatever
// parses must name an architecture for every item.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "absl/strings/match.h"
#include "tools/kcache/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto items = kcache::tools::ParseManifest(text);
  if (items.ok()) {
    if (items->empty()) std::abort();
    for (const auto& item : *items) {
      if (!absl::StartsWith(item.arch, "sm_")) std::abort();
    }
  }
  return 0;
}
