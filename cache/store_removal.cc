// The store's removals: eviction by recency within a byte budget,
// invalidation (by toolchain, arch, age or key) and garbage collection of
// blobs, refs rows and statistics nobody names (see store.h, "Blob garbage
// collection", for why a record can never lose its blob).
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cache/key.h"
#include "cache/rocks_status.h"
#include "cache/skipping_scan.h"
#include "cache/store.h"
#include "cache/store_internal.h"
#include "cache/string_view_compat.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace kcache {

using store_internal::kRemoveBatch;
using store_internal::RefKey;
using store_internal::S;
using store_internal::StartsWith;
using store_internal::V;

absl::StatusOr<uint64_t> Store::CollectBlobs(std::vector<std::string> digests) {
  std::sort(digests.begin(), digests.end());
  digests.erase(std::unique(digests.begin(), digests.end()), digests.end());
  uint64_t freed = 0;
  for (size_t start = 0; start < digests.size(); start += kRemoveBatch) {
    std::vector<std::string> held;
    rocksdb::WriteBatch batch;
    absl::Status status;
    for (size_t i = start; i < std::min(digests.size(), start + kRemoveBatch); ++i) {
      const std::string& d = digests[i];
      // A publisher holding the digest shared is about to reference it.
      if (!digest_latches_.TryAcquireExclusive(d)) continue;
      held.push_back(d);
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_refs_));
      it->Seek(S(d));
      // Refs that cannot be read (a damaged table file) may name the blob: keep it.
      const bool damaged = it->status().IsCorruption();
      const bool referenced = damaged || (it->Valid() && StartsWith(V(it->key()), d));
      if (!damaged) status.Update(FromRocks(it->status(), "collect blobs"));
      if (referenced || !status.ok()) continue;
      rocksdb::PinnableSlice blob;
      auto rs = db_->Get(rocksdb::ReadOptions(), cf_blobs_, S(d), &blob);
      if (rs.IsNotFound()) continue;
      freed += blob.size();
      batch.Delete(cf_blobs_, S(d));
    }
    if (status.ok() && batch.Count() > 0) {
      status = FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "collect blobs");
    }
    for (const auto& d : held) digest_latches_.ReleaseExclusive(d);
    if (!status.ok()) return status;
  }
  return freed;
}

absl::StatusOr<v1::InvalidateResponse> Store::RemoveKeys(std::vector<std::string> keys,
                                                         bool keep_pinned,
                                                         int64_t protect_after_ms) {
  v1::InvalidateResponse out;
  std::vector<std::string> digests;
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  for (size_t start = 0; start < keys.size(); start += kRemoveBatch) {
    std::vector<std::string> chunk(keys.begin() + start,
                                   keys.begin() + std::min(keys.size(), start + kRemoveBatch));
    std::vector<std::string> removed;
    {
      // Waits for busy keys (sorted order, so no deadlock with a batch
      // publish): a publish holds a key only for one write.
      ExclusiveLatches hold(key_latches_, chunk);
      rocksdb::WriteBatch batch;
      for (const auto& key : chunk) {
        std::string raw;
        auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
        if (rs.IsNotFound()) continue;
        if (auto st = FromRocks(rs, "remove"); !st.ok()) return st;
        if (keep_pinned) {
          auto pinned = IsPinned(key);
          if (!pinned.ok()) return pinned.status();
          if (*pinned) continue;
          v1::KernelRecord r;
          (void)r.ParseFromString(raw);
          auto stats = ReadAccessStats(key);
          if (!stats.ok()) return stats.status();
          if (std::max(stats->last_used_unix_ms(), r.created_unix_ms()) >= protect_after_ms) {
            continue;  // used since the candidates were chosen
          }
        }
        v1::KernelRecord r;
        if (r.ParseFromString(raw) && r.cubin_sha256().size() == 32) {
          batch.Delete(cf_refs_, RefKey(r.cubin_sha256(), key));
          digests.push_back(r.cubin_sha256());
        }
        batch.Delete(cf_records_, S(key));
        batch.Delete(cf_stats_, S(key));
        if (!keep_pinned) batch.Delete(cf_pins_, S(key));
        removed.push_back(key);
      }
      rocksdb::WriteOptions wo;
      wo.sync = true;
      if (auto st = FromRocks(db_->Write(wo, &batch), "remove"); !st.ok()) return st;
    }
    absl::flat_hash_set<std::string> gone(removed.begin(), removed.end());
    hot_.EraseIf([&](std::string_view k, const Entry&) { return gone.contains(AbslView(k)); });
    {
      absl::MutexLock l(&stats_mu_);
      for (const auto& k : removed) pending_.erase(k);
    }
    out.set_removed_entries(out.removed_entries() + removed.size());
    if (options_.on_removed) {
      const char* kind = keep_pinned ? "evicted" : "invalidated";  // Evict keeps pins
      for (const auto& k : removed) options_.on_removed(kind, k, "");
    }
  }
  auto freed = CollectBlobs(std::move(digests));
  if (!freed.ok()) return freed.status();
  out.set_freed_bytes(*freed);
  return out;
}

absl::StatusOr<v1::InvalidateResponse> Store::RemoveWhere(
    absl::FunctionRef<bool(const v1::KernelRecord&)> pred) {
  if (auto s = CheckWritable("invalidate"); !s.ok()) return s;
  std::vector<std::string> unreadable;
  auto scanned = ScanRecords({}, {}, pred, &unreadable);
  if (!scanned.ok()) return scanned.status();
  std::vector<std::string> keys;
  for (auto& s : *scanned) {
    if (s.decoded) keys.push_back(std::move(s.key));
  }
  auto out = RemoveKeys(std::move(keys), /*keep_pinned=*/false, 0);
  if (out.ok()) {
    for (auto& u : unreadable) out->add_unreadable(std::move(u));
  }
  return out;
}

absl::StatusOr<v1::EvictResponse> Store::Evict(uint64_t max_bytes,
                                               std::optional<absl::Duration> grace) {
  if (auto s = CheckWritable("evict"); !s.ok()) return s;
  if (auto s = FlushAccessStats(); !s.ok()) return s;
  const int64_t protect_after =
      Now() - absl::ToInt64Milliseconds(grace.value_or(options_.eviction_grace_period));
  std::vector<std::string> unreadable;
  auto scanned = ScanRecords(
      {}, {}, [](const v1::KernelRecord&) { return true; }, &unreadable);
  if (!scanned.ok()) return scanned.status();

  absl::flat_hash_set<std::string> pinned;
  // Key ranges whose pins cannot be read: what falls in them counts as pinned.
  std::vector<std::pair<std::string, std::string>> unknown_pins;
  {
    SkippingScan it(db_, cf_pins_, "", "", &unreadable);
    for (it.Start(); it.Valid(); it.Next()) pinned.emplace(V(it.key()));
    if (auto st = FromRocks(it.status(), "evict"); !st.ok()) return st;
    unknown_pins = it.skipped();
  }
  auto maybe_pinned = [&](const std::string& key) {
    if (pinned.contains(key)) return true;
    for (const auto& [from, to] : unknown_pins) {
      if (key >= from && (to.empty() || key < to)) return true;
    }
    return false;
  };
  struct Candidate {
    int64_t recency;
    size_t index;
  };
  absl::flat_hash_map<std::string, std::pair<uint64_t, uint64_t>> refs;  // digest -> (count, size)
  uint64_t total = 0;
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < scanned->size(); ++i) {
    const auto& s = (*scanned)[i];
    if (!s.decoded) continue;
    auto& ref = refs[s.record.cubin_sha256()];
    if (ref.first++ == 0) {
      ref.second = s.record.cubin_size();
      total += ref.second;
    }
    if (maybe_pinned(s.key)) continue;
    auto stats = ReadAccessStats(s.key);
    if (!stats.ok()) return stats.status();
    int64_t recency = std::max(stats->last_used_unix_ms(), s.record.created_unix_ms());
    if (recency >= protect_after) continue;
    candidates.push_back({recency, i});
  }
  v1::EvictResponse out;
  for (auto& u : unreadable) out.add_unreadable(std::move(u));
  if (total <= max_bytes) return out;
  std::sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
    return a.recency != b.recency ? a.recency < b.recency
                                  : (*scanned)[a.index].key < (*scanned)[b.index].key;
  });
  std::vector<std::string> victims;
  for (const auto& c : candidates) {
    if (total <= max_bytes) break;
    const auto& s = (*scanned)[c.index];
    auto& ref = refs[s.record.cubin_sha256()];
    if (--ref.first == 0) total -= ref.second;
    victims.push_back(s.key);
  }
  auto removed = RemoveKeys(std::move(victims), /*keep_pinned=*/true, protect_after);
  if (!removed.ok()) return removed.status();
  out.set_evicted_entries(removed->removed_entries());
  out.set_freed_bytes(removed->freed_bytes());
  return out;
}

absl::StatusOr<v1::InvalidateResponse> Store::InvalidateToolchain(
    std::string_view toolchain_id_hex) {
  if (auto s = CheckWritable("invalidate"); !s.ok()) return s;
  auto raw = ParseToolchainIdHex(toolchain_id_hex);
  if (!raw.ok()) return raw.status();
  const KeyRange range = ToolchainRange(*raw);
  std::vector<std::string> unreadable;
  auto scanned = ScanRecords(
      range.begin, range.end, [](const v1::KernelRecord&) { return true; }, &unreadable);
  if (!scanned.ok()) return scanned.status();
  rocksdb::WriteBatch batch;
  std::vector<std::string> digests;
  for (const auto& s : *scanned) {
    if (!s.decoded) continue;
    batch.Delete(cf_refs_, RefKey(s.record.cubin_sha256(), s.key));
    digests.push_back(s.record.cubin_sha256());
  }
  // One range delete per column family retires the whole toolchain. Refs
  // rows of records published into the range after the scan stay behind as
  // leaks (never as dangling records); CollectGarbage removes them.
  for (auto* cf : {cf_records_, cf_stats_, cf_pins_}) {
    batch.DeleteRange(cf, range.begin, range.end);
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  if (auto st = FromRocks(db_->Write(wo, &batch), "invalidate toolchain"); !st.ok()) return st;
  const std::string prefix = range.begin;
  hot_.EraseIf([&](std::string_view k, const Entry&) { return StartsWith(k, prefix); });
  {
    absl::MutexLock l(&stats_mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto cur = it++;
      if (StartsWith(cur->first, prefix)) pending_.erase(cur);
    }
  }
  if (options_.on_removed) {
    for (const auto& s : *scanned) options_.on_removed("invalidated", s.key, "");
  }
  auto freed = CollectBlobs(std::move(digests));
  if (!freed.ok()) return freed.status();
  v1::InvalidateResponse out;
  out.set_removed_entries(scanned->size());
  out.set_freed_bytes(*freed);
  // (The range delete removed the unreadable records of the range as well.)
  for (auto& u : unreadable) out.add_unreadable(std::move(u));
  return out;
}

absl::StatusOr<v1::InvalidateResponse> Store::InvalidateArch(std::string_view arch) {
  if (arch.empty()) return absl::InvalidArgumentError("arch: empty");
  return RemoveWhere([&](const v1::KernelRecord& r) { return r.arch() == arch; });
}

absl::StatusOr<v1::InvalidateResponse> Store::InvalidateCreatedBefore(int64_t unix_ms) {
  return RemoveWhere([&](const v1::KernelRecord& r) { return r.created_unix_ms() < unix_ms; });
}

absl::StatusOr<v1::InvalidateResponse> Store::InvalidateKey(std::string_view key) {
  if (auto s = CheckWritable("invalidate"); !s.ok()) return s;
  if (auto s = ValidateKey(key); !s.ok()) return s;
  auto out = RemoveKeys({std::string(key)}, /*keep_pinned=*/false, 0);
  if (out.ok() && out->removed_entries() == 0) {
    return absl::NotFoundError(absl::StrCat("invalidate: no entry ", KeyToHex(key)));
  }
  return out;
}

absl::StatusOr<v1::InvalidateResponse> Store::Invalidate(const v1::InvalidateRequest& request) {
  switch (request.what_case()) {
    case v1::InvalidateRequest::kToolchainId:
      return InvalidateToolchain(request.toolchain_id());
    case v1::InvalidateRequest::kArch:
      return InvalidateArch(request.arch());
    case v1::InvalidateRequest::kCreatedBeforeUnixMs:
      return InvalidateCreatedBefore(request.created_before_unix_ms());
    case v1::InvalidateRequest::kKey:
      return InvalidateKey(request.key());
    default:
      return absl::InvalidArgumentError(
          "what: none of toolchain_id, arch, created_before, key set");
  }
}

absl::StatusOr<uint64_t> Store::CollectGarbage() {
  if (auto s = CheckWritable("gc"); !s.ok()) return s;
  // 1. refs rows whose record is gone or names another blob.
  std::vector<std::pair<std::string, std::string>> stale;  // (digest, key)
  // Ranges that cannot be read are stepped over (nothing in them is collected).
  {
    SkippingScan scan(db_, cf_refs_, "", "", nullptr);
    SkippingScan* it = &scan;
    for (it->Start(); it->Valid(); it->Next()) {
      std::string_view rk = V(it->key());
      if (rk.size() != 32 + kKeySize) {
        stale.emplace_back(std::string(rk), "");
        continue;
      }
      std::string raw;
      auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(rk.substr(32)), &raw);
      v1::KernelRecord r;
      if (rs.IsNotFound() ||
          (rs.ok() && r.ParseFromString(raw) && r.cubin_sha256() != rk.substr(0, 32))) {
        stale.emplace_back(std::string(rk.substr(0, 32)), std::string(rk.substr(32)));
      }
    }
    if (auto st = FromRocks(it->status(), "gc"); !st.ok()) return st;
  }
  for (const auto& [digest, key] : stale) {
    if (key.empty()) {  // malformed row
      (void)db_->Delete(rocksdb::WriteOptions(), cf_refs_, S(digest));
      continue;
    }
    // Re-checked under the key latch: a publish may be writing this key now.
    ExclusiveLatches hold(key_latches_, {key});
    std::string raw;
    auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
    v1::KernelRecord r;
    if (rs.IsNotFound() || (rs.ok() && r.ParseFromString(raw) && r.cubin_sha256() != digest)) {
      auto st =
          FromRocks(db_->Delete(rocksdb::WriteOptions(), cf_refs_, RefKey(digest, key)), "gc");
      if (!st.ok()) return st;
    }
  }
  // 2. access statistics without a record.
  {
    SkippingScan scan(db_, cf_stats_, "", "", nullptr);
    SkippingScan* it = &scan;
    std::vector<std::string> orphans;
    for (it->Start(); it->Valid(); it->Next()) {
      std::string raw;
      if (db_->Get(rocksdb::ReadOptions(), cf_records_, it->key(), &raw).IsNotFound()) {
        orphans.emplace_back(V(it->key()));
      }
    }
    for (const auto& k : orphans) {
      ExclusiveLatches hold(key_latches_, {k});
      std::string raw;
      if (db_->Get(rocksdb::ReadOptions(), cf_records_, S(k), &raw).IsNotFound()) {
        (void)db_->Delete(rocksdb::WriteOptions(), cf_stats_, S(k));
      }
    }
  }
  // 3. blobs that no refs row names (reads the blob column family once).
  std::vector<std::string> candidates;
  {
    std::unique_ptr<rocksdb::Iterator> refs(db_->NewIterator(rocksdb::ReadOptions(), cf_refs_));
    SkippingScan scan(db_, cf_blobs_, "", "", nullptr);
    SkippingScan* it = &scan;
    for (it->Start(); it->Valid(); it->Next()) {
      refs->Seek(it->key());
      if (!refs->Valid() || !StartsWith(V(refs->key()), V(it->key()))) {
        candidates.emplace_back(V(it->key()));
      }
    }
    if (auto st = FromRocks(it->status(), "gc"); !st.ok()) return st;
  }
  return CollectBlobs(std::move(candidates));
}

}  // namespace kcache
