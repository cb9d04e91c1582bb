// The store's bounded in-memory layer: recently used, verified entries kept
// by store key, evicted least-recently-used by bytes. A hit here costs no
// disk read and no hash. Thread-safe (one internal mutex, never held across
// I/O; entries are immutable shared_ptrs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "cache/entry.h"

namespace kcache {

class HotCache {
 public:
  // capacity_bytes == 0 disables the layer (Get misses, Insert drops).
  explicit HotCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The entry, or nullptr when absent.
  EntryRef Get(std::string_view key) ABSL_LOCKS_EXCLUDED(mu_);

  // Invalidations bump the generation. A reader takes Generation() before it
  // reads the disk and passes it to Insert, which drops the entry when an
  // invalidation happened meanwhile (so a deleted entry cannot come back).
  uint64_t Generation() ABSL_LOCKS_EXCLUDED(mu_);
  void Insert(std::string_view key, EntryRef entry, uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes one key / every key `pred` accepts; bumps the generation.
  void Erase(std::string_view key) ABSL_LOCKS_EXCLUDED(mu_);
  void EraseIf(absl::FunctionRef<bool(std::string_view key, const Entry&)> pred)
      ABSL_LOCKS_EXCLUDED(mu_);

  size_t bytes() ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() ABSL_LOCKS_EXCLUDED(mu_);

  // The bytes an entry is charged for.
  static size_t Charge(const Entry& e);

 private:
  struct Node {
    std::string key;
    EntryRef entry;
    size_t charge;
  };
  using List = std::list<Node>;

  void EraseLocked(List::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  absl::Mutex mu_;
  List lru_ ABSL_GUARDED_BY(mu_);  // front = most recently used
  absl::flat_hash_map<std::string, List::iterator> index_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kcache
