// libFuzzer target for the store's decoders: bundles (DecodeBundle) and
// stored records (DecodeRecord). The first byte picks the decoder so that one
// corpus covers both. Neither may crash, hang or read out of bounds on any
// input; a bundle that decodes must describe consistent entries.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "cache/bundle.h"
#include "cache/digest.h"
#include "cache/record_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] == 'B') {
    auto entries = kcache::DecodeBundle(in);
    if (entries.ok()) {
      for (const auto& e : *entries) {
        if (kcache::AsBytes(kcache::Sha256(e.cubin)) != e.record.cubin_sha256()) std::abort();
      }
    }
  } else {
    auto r = kcache::DecodeRecord(in);
    if (r.ok()) (void)kcache::MaskKind(*r);
  }
  return 0;
}
