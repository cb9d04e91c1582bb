// What the store's source files (cache/store*.cc) share and nothing else
// may use: the slice helpers, the refs row key, the record check on read,
// and the private types of Store. The contract is in cache/store.h.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/store.h"
#include "kcache/v1/record.pb.h"
#include "rocksdb/slice.h"

namespace kcache {
namespace store_internal {

// Entries removed per WriteBatch by evict/invalidate, bounding latch sets and
// batch memory.
inline constexpr size_t kRemoveBatch = 1000;

inline rocksdb::Slice S(std::string_view v) { return rocksdb::Slice(v.data(), v.size()); }
inline std::string_view V(const rocksdb::Slice& s) { return std::string_view(s.data(), s.size()); }
inline bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.starts_with(prefix);
}

// The refs row naming `digest`'s blob for `key` (see the GC note in store.h).
inline std::string RefKey(std::string_view digest, std::string_view key) {
  std::string r(digest);
  r += key;
  return r;
}

// A record read under `key`: decodes, and names that key (a record moved
// under another key must not be served for it).
absl::StatusOr<v1::KernelRecord> DecodeRecordAt(std::string_view key, std::string_view raw);

}  // namespace store_internal

struct Store::Prepared {
  v1::KernelRecord record;
  std::string owned_cubin;
  std::string_view external_cubin;  // when the bytes live elsewhere (import)
  bool external = false;
  std::string digest;
  std::string record_bytes;
  std::string_view cubin() const { return external ? external_cubin : owned_cubin; }
};

struct Store::Scanned {
  std::string key;
  std::string raw;  // the stored record bytes, to detect a concurrent rewrite
  v1::KernelRecord record;
  bool decoded = false;
};

}  // namespace kcache
