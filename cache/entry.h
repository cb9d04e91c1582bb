// What a lookup returns: one immutable, verified record with its cubin.
#pragma once

#include <memory>
#include <string>

#include "kcache/v1/record.pb.h"

namespace kcache {

// Immutable once built. Shared (through EntryRef) between the store's
// in-memory layer and every caller that looked it up; safe to read from any
// thread. The cubin's SHA-256 equals record.cubin_sha256 (checked before the
// entry was built).
struct Entry {
  v1::KernelRecord record;
  std::string cubin;
};
using EntryRef = std::shared_ptr<const Entry>;

}  // namespace kcache
