// Logical latches on byte-string ids (store keys, blob digests), so that
// read-check-write sequences on one id do not interleave, without holding a
// mutex across RocksDB I/O: the internal mutex guards only the holder table;
// a latch is held across I/O, a mutex never is. Thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace kcache {

class LatchTable {
 public:
  // Blocks while another holder has `id` exclusively, then holds it shared.
  void AcquireShared(std::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseShared(std::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until nobody holds `id`, then holds it exclusively. Callers that
  // take several ids must take them in sorted order (no deadlock).
  void AcquireExclusive(std::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `id` exclusively only if nobody holds it; never blocks.
  bool TryAcquireExclusive(std::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseExclusive(std::string_view id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // > 0: that many shared holders; -1: one exclusive holder. Absent: free.
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> holders_ ABSL_GUARDED_BY(mu_);
};

// RAII exclusive hold of a sorted, de-duplicated set of ids.
class ExclusiveLatches {
 public:
  ExclusiveLatches(LatchTable& table, std::vector<std::string> ids);
  ~ExclusiveLatches();
  ExclusiveLatches(const ExclusiveLatches&) = delete;
  ExclusiveLatches& operator=(const ExclusiveLatches&) = delete;

 private:
  LatchTable& table_;
  std::vector<std::string> ids_;
};

// RAII shared hold of a set of ids (any order: shared holders only wait for
// exclusive ones, and exclusive holders that wait hold nothing else).
class SharedLatches {
 public:
  SharedLatches(LatchTable& table, std::vector<std::string> ids);
  ~SharedLatches();
  SharedLatches(const SharedLatches&) = delete;
  SharedLatches& operator=(const SharedLatches&) = delete;

 private:
  LatchTable& table_;
  std::vector<std::string> ids_;
};

}  // namespace kcache
