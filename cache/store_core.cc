// The store's kernel path: Publish (one WriteBatch per entry or batch) and
// Lookup, with the digest check on every read and the quarantine of what
// fails it (see store.h, "Integrity").
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/record_codec.h"
#include "cache/rocks_status.h"
#include "cache/store.h"
#include "cache/store_internal.h"
#include "cache/string_view_compat.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace kcache {
namespace store_internal {

// A record read under `key`: decodes, and names that key (a record moved
// under another key must not be served for it).
absl::StatusOr<v1::KernelRecord> DecodeRecordAt(std::string_view key, std::string_view raw) {
  auto r = DecodeRecord(raw);
  if (!r.ok()) return r;
  if (r->key() != key) {
    return absl::DataLossError(absl::StrCat("record: stored under key ", KeyToHex(key),
                                            " but names key ", ToHex(r->key())));
  }
  return r;
}

}  // namespace store_internal

using store_internal::DecodeRecordAt;
using store_internal::RefKey;
using store_internal::S;

// --- Publish -----------------------------------------------------------------

absl::StatusOr<Store::Prepared> Store::Prepare(v1::KernelRecord record, std::string cubin) const {
  if (cubin.empty()) return absl::InvalidArgumentError("cubin: empty");
  Prepared p;
  p.digest = std::string(AsBytes(Sha256(cubin)));
  if (!record.cubin_sha256().empty() && record.cubin_sha256() != p.digest) {
    return absl::InvalidArgumentError("cubin_sha256: does not match the cubin's SHA-256");
  }
  record.set_cubin_sha256(p.digest);
  record.set_cubin_size(cubin.size());
  if (record.format_version() == 0) record.set_format_version(kRecordFormatVersion);
  if (record.toolchain().id().empty()) {
    record.mutable_toolchain()->set_id(ToolchainIdHex(record.toolchain()));
  }
  if (record.created_unix_ms() == 0) record.set_created_unix_ms(Now());
  if (auto s = ValidateRecord(record); !s.ok()) return s;
  p.record_bytes = record.SerializeAsString();
  p.record = std::move(record);
  p.owned_cubin = std::move(cubin);
  return p;
}

absl::Status Store::WritePrepared(std::vector<Prepared>& items, bool sync) {
  std::vector<std::string> keys, digests;
  keys.reserve(items.size());
  digests.reserve(items.size());
  for (const auto& p : items) {
    keys.push_back(p.record.key());
    digests.push_back(p.digest);
  }
  std::vector<std::string> replaced_digests;
  {
    ExclusiveLatches key_hold(key_latches_, keys);
    SharedLatches digest_hold(digest_latches_, digests);
    rocksdb::WriteBatch batch;
    v1::AccessStats initial;  // hits 0, never used: merged so a republish keeps its hits
    const std::string initial_bytes = initial.SerializeAsString();
    for (const auto& p : items) {
      const std::string& key = p.record.key();
      // A replaced record may name another blob: drop its refs row.
      std::string old;
      auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &old);
      if (rs.ok()) {
        v1::KernelRecord prev;
        if (prev.ParseFromString(old) && prev.cubin_sha256() != p.digest) {
          batch.Delete(cf_refs_, RefKey(prev.cubin_sha256(), key));
          replaced_digests.push_back(prev.cubin_sha256());
        }
      } else if (!rs.IsNotFound() && !rs.IsCorruption()) {
        // (A damaged previous record is simply overwritten; the refs row of
        // the blob it named, if any, is left for CollectGarbage.)
        return FromRocks(rs, "publish: read the previous record");
      }
      batch.Put(cf_records_, S(key), p.record_bytes);
      batch.Put(cf_blobs_, S(p.digest), S(p.cubin()));
      batch.Put(cf_refs_, RefKey(p.digest, key), rocksdb::Slice());
      batch.Merge(cf_stats_, S(key), initial_bytes);
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync;
    if (auto st = FromRocks(db_->Write(wo, &batch), "publish"); !st.ok()) return st;
  }
  if (!replaced_digests.empty()) {
    if (auto freed = CollectBlobs(std::move(replaced_digests)); !freed.ok()) return freed.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<EntryRef> Store::Publish(v1::KernelRecord record, std::string cubin) {
  if (auto s = CheckWritable("publish"); !s.ok()) return s;
  auto prepared = Prepare(std::move(record), std::move(cubin));
  if (!prepared.ok()) return prepared.status();
  const uint64_t gen = hot_.Generation();
  std::vector<Prepared> items;
  items.push_back(*std::move(prepared));
  if (auto s = WritePrepared(items, /*sync=*/true); !s.ok()) return s;
  auto entry = std::make_shared<Entry>();
  entry->record = std::move(items[0].record);
  entry->cubin = std::move(items[0].owned_cubin);
  EntryRef ref = std::move(entry);
  hot_.Insert(ref->record.key(), ref, gen);
  return ref;
}

absl::Status Store::PublishBatch(std::vector<PublishItem> items, bool sync) {
  if (auto s = CheckWritable("publish"); !s.ok()) return s;
  std::vector<Prepared> prepared;
  prepared.reserve(items.size());
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    auto p = Prepare(std::move(items[i].record), std::move(items[i].cubin));
    if (!p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("item ", i, ": ", p.status().message()));
    }
    if (!seen.insert(p->record.key()).second) {
      return absl::InvalidArgumentError(absl::StrCat("item ", i, ": key: duplicate in batch"));
    }
    prepared.push_back(*std::move(p));
  }
  hot_.EraseIf([&](std::string_view key, const Entry&) { return seen.contains(AbslView(key)); });
  return WritePrepared(prepared, sync);
}

// --- Lookup and integrity ----------------------------------------------------

absl::StatusOr<std::string> Store::ReadVerifiedBlob(const v1::KernelRecord& record) {
  std::string cubin;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_blobs_, S(record.cubin_sha256()), &cubin);
  if (rs.IsNotFound()) {
    return absl::DataLossError(absl::StrCat("blob ", ToHex(record.cubin_sha256()), " is missing"));
  }
  // A RocksDB checksum failure (Corruption) maps to DataLoss: quarantined too.
  if (auto st = FromRocks(rs, "read blob"); !st.ok()) return st;
  if (cubin.size() != record.cubin_size() || AsBytes(Sha256(cubin)) != record.cubin_sha256()) {
    return absl::DataLossError(absl::StrCat("blob ", ToHex(record.cubin_sha256()),
                                            " does not match its SHA-256 (", cubin.size(),
                                            " bytes, record says ", record.cubin_size(), ")"));
  }
  return cubin;
}

void Store::Quarantine(std::string_view key, const v1::KernelRecord& record,
                       std::string_view reason) {
  hot_.Erase(key);
  if (read_only_) return;
  const std::string& digest = record.cubin_sha256();
  bool quarantined = false;
  {
    ExclusiveLatches key_hold(key_latches_, {std::string(key)});
    // Only if the record still names the bad blob: a concurrent publish may
    // have replaced it with a good one.
    std::string raw;
    auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
    // Gone already, or an I/O error (retried at the next read). A record
    // RocksDB cannot read (damaged block) is quarantined as undecodable: the
    // tombstone written below hides the damaged bytes from every later read.
    if (!rs.ok() && !rs.IsCorruption()) return;
    if (!rs.ok()) raw.clear();
    auto now_rec = rs.ok() ? DecodeRecordAt(key, raw)
                           : absl::StatusOr<v1::KernelRecord>(absl::DataLossError("unreadable"));
    const bool caller_decoded = !record.key().empty();
    if (caller_decoded != now_rec.ok()) return;
    if (caller_decoded && now_rec->cubin_sha256() != digest) return;

    rocksdb::WriteBatch batch;
    v1::QuarantineInfo q;
    if (caller_decoded) {
      *q.mutable_record() = *now_rec;
    } else {
      (void)q.mutable_record()->ParseFromString(raw);  // best effort, for inspection
    }
    q.set_quarantined_unix_ms(Now());
    q.set_reason(std::string(reason));
    batch.Put(cf_quarantine_, S(key), q.SerializeAsString());
    batch.Delete(cf_records_, S(key));
    batch.Delete(cf_stats_, S(key));
    bool digest_held = false;
    if (digest.size() == 32) {
      batch.Delete(cf_refs_, RefKey(digest, key));
      // Drop the bad bytes too (other records naming them are bad as well and
      // are quarantined when read), unless a publisher holds the digest: it is
      // rewriting good bytes right now. Re-checked under the latch.
      digest_held = digest_latches_.TryAcquireExclusive(digest);
      if (digest_held) {
        std::string blob;
        auto brs = db_->Get(rocksdb::ReadOptions(), cf_blobs_, S(digest), &blob);
        if (!brs.IsNotFound() && (!brs.ok() || AsBytes(Sha256(blob)) != digest)) {
          batch.Delete(cf_blobs_, S(digest));
        }
      }
    }
    rocksdb::WriteOptions wo;
    wo.sync = true;
    // Best effort: if this write fails the entry stays, and the next read
    // finds it bad again; it is never served either way.
    quarantined = db_->Write(wo, &batch).ok();
    if (digest_held) digest_latches_.ReleaseExclusive(digest);
  }
  {
    absl::MutexLock l(&stats_mu_);
    pending_.erase(AbslView(key));
  }
  hot_.Erase(key);
  if (quarantined && options_.on_removed) options_.on_removed("quarantined", key, reason);
}

absl::StatusOr<EntryRef> Store::Lookup(std::string_view key) {
  if (auto s = ValidateKey(key); !s.ok()) return s;
  if (EntryRef hot = hot_.Get(key)) {
    RecordHit(key);
    return hot;
  }
  const uint64_t gen = hot_.Generation();
  std::string raw;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
  if (rs.IsNotFound()) return EntryRef();
  if (rs.IsCorruption()) {
    // A damaged record is a miss: quarantined, recompiled, overwritten.
    Quarantine(key, v1::KernelRecord(), absl::StrCat("record unreadable: ", rs.ToString()));
    return EntryRef();
  }
  if (auto st = FromRocks(rs, "lookup"); !st.ok()) return st;
  auto record = DecodeRecordAt(key, raw);
  if (!record.ok()) {
    v1::KernelRecord unknown;  // empty key: quarantine whatever is stored
    Quarantine(key, unknown, std::string(record.status().message()));
    return EntryRef();
  }
  auto cubin = ReadVerifiedBlob(*record);
  if (!cubin.ok()) {
    if (absl::IsDataLoss(cubin.status())) {
      Quarantine(key, *record, std::string(cubin.status().message()));
      return EntryRef();
    }
    return cubin.status();
  }
  auto entry = std::make_shared<Entry>();
  entry->record = *std::move(record);
  entry->cubin = *std::move(cubin);
  EntryRef ref = std::move(entry);
  hot_.Insert(key, ref, gen);
  RecordHit(key);
  return ref;
}

}  // namespace kcache
