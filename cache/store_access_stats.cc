// The store's access statistics: hits counted in memory and merged into
// the stats column family by the flusher; reads add what is still pending.
#include <algorithm>

#include "cache/rocks_status.h"
#include "cache/store.h"
#include "cache/store_internal.h"
#include "cache/string_view_compat.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace kcache {

using store_internal::S;

void Store::RecordHit(std::string_view key) {
  if (read_only_) return;
  const int64_t now = Now();
  absl::MutexLock l(&stats_mu_);
  auto& p = pending_[AbslView(key)];
  ++p.hits;
  p.last_used_ms = std::max(p.last_used_ms, now);
}

absl::Status Store::FlushAccessStats() {
  if (read_only_ || db_ == nullptr) return absl::OkStatus();
  absl::flat_hash_map<std::string, PendingHit> taken;
  {
    absl::MutexLock l(&stats_mu_);
    taken.swap(pending_);
  }
  if (taken.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (const auto& [key, p] : taken) {
    v1::AccessStats a;
    a.set_hits(p.hits);
    a.set_last_used_unix_ms(p.last_used_ms);
    batch.Merge(cf_stats_, S(key), a.SerializeAsString());
  }
  // Not synced: losing the last interval of hit counts in a crash is fine.
  return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "flush access statistics");
}

absl::StatusOr<v1::AccessStats> Store::ReadAccessStats(std::string_view key) {
  v1::AccessStats a;
  std::string v;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_stats_, S(key), &v);
  if (rs.ok()) {
    (void)a.ParseFromString(v);
  } else if (!rs.IsNotFound() && !rs.IsCorruption()) {
    // (Damaged statistics count as none: they only order eviction.)
    return FromRocks(rs, "read access statistics");
  }
  absl::MutexLock l(&stats_mu_);
  if (auto it = pending_.find(AbslView(key)); it != pending_.end()) {
    a.set_hits(a.hits() + it->second.hits);
    a.set_last_used_unix_ms(std::max(a.last_used_unix_ms(), it->second.last_used_ms));
  }
  return a;
}

}  // namespace kcache
