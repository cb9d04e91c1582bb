// The kernel store on RocksDB (see store.h for the contract and the layout).
#include "cache/store.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cache/bundle.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/record_codec.h"
#include "cache/rocks_status.h"
#include "cache/string_view_compat.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/merge_operator.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace kcache {
namespace {

constexpr char kCfRecords[] = "records";
constexpr char kCfBlobs[] = "blobs";
constexpr char kCfRefs[] = "refs";
constexpr char kCfStats[] = "stats";
constexpr char kCfPins[] = "pins";
constexpr char kCfQuarantine[] = "quarantine";
constexpr char kMetaFormatKey[] = "kcache.store_format";
constexpr char kStoreFormat[] = "1";
// Entries removed per WriteBatch by evict/invalidate, bounding latch sets and
// batch memory.
constexpr size_t kRemoveBatch = 1000;

rocksdb::Slice S(std::string_view v) { return rocksdb::Slice(v.data(), v.size()); }
std::string_view V(const rocksdb::Slice& s) { return std::string_view(s.data(), s.size()); }
bool StartsWith(std::string_view s, std::string_view prefix) { return s.starts_with(prefix); }

// Access statistics merge: hits add, last use is the latest. Operands and
// values are both serialized AccessStats, so an associative operator fits;
// recording hits then never needs a read.
class AccessStatsMerge : public rocksdb::AssociativeMergeOperator {
 public:
  bool Merge(const rocksdb::Slice& key, const rocksdb::Slice* existing, const rocksdb::Slice& value,
             std::string* new_value, rocksdb::Logger* logger) const override {
    v1::AccessStats a, b;
    // An unreadable value counts as empty rather than failing reads of it.
    if (existing != nullptr) (void)a.ParseFromArray(existing->data(), existing->size());
    (void)b.ParseFromArray(value.data(), value.size());
    a.set_hits(a.hits() + b.hits());
    a.set_last_used_unix_ms(std::max(a.last_used_unix_ms(), b.last_used_unix_ms()));
    *new_value = a.SerializeAsString();
    return true;
  }
  const char* Name() const override { return "kcache.AccessStatsMerge"; }
};

rocksdb::CompressionType Pick(std::initializer_list<rocksdb::CompressionType> wanted) {
  auto supported = rocksdb::GetSupportedCompressions();
  for (auto c : wanted) {
    if (std::find(supported.begin(), supported.end(), c) != supported.end()) return c;
  }
  return rocksdb::kNoCompression;
}

rocksdb::ColumnFamilyOptions CfOptions(const std::shared_ptr<rocksdb::Cache>& cache,
                                       rocksdb::CompressionType compression, bool bloom) {
  rocksdb::ColumnFamilyOptions o;
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = cache;
  if (bloom) t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  o.compression = compression;
  return o;
}

std::string RefKey(std::string_view digest, std::string_view key) {
  std::string r(digest);
  r += key;
  return r;
}

absl::Status ReadOnlyError(std::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(AbslView(what), ": the store is open read-only"));
}

}  // namespace

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

Store::Store(std::string path, StoreOptions options)
    : path_(std::move(path)), options_(std::move(options)), hot_(options_.hot_cache_bytes) {}

Store::~Store() { (void)Close(); }

int64_t Store::Now() const {
  return options_.now_unix_ms ? options_.now_unix_ms() : absl::ToUnixMillis(absl::Now());
}

absl::Status Store::CheckWritable(std::string_view what) const {
  return options_.read_only ? ReadOnlyError(what) : absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path, StoreOptions options) {
  namespace fs = std::filesystem;
  const bool ro = options.read_only;
  std::unique_ptr<Store> s(new Store(path, std::move(options)));
  std::error_code ec;
  if (ro) {
    if (!fs::exists(fs::path(path) / "CURRENT", ec)) {
      return absl::NotFoundError(absl::StrCat("open ", path, " read-only: no store there"));
    }
  } else {
    fs::create_directories(path, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("open ", path, ": cannot create the directory: ", ec.message()));
    }
  }

  rocksdb::DBOptions dbo;
  dbo.create_if_missing = !ro;
  dbo.create_missing_column_families = !ro;
  dbo.max_background_jobs = 2;
  dbo.keep_log_file_num = 4;
  dbo.max_open_files = -1;
  // Bounds WAL replay at open: column families whose unflushed data sits in
  // old logs get flushed once the logs exceed this.
  dbo.max_total_wal_size = uint64_t{64} << 20;

  s->block_cache_ = rocksdb::NewLRUCache(std::max<size_t>(s->options_.block_cache_bytes, 1 << 20));
  const auto light = Pick({rocksdb::kLZ4Compression, rocksdb::kSnappyCompression});
  const auto heavy = Pick({rocksdb::kZSTD, rocksdb::kLZ4Compression});
  auto stats_opts = CfOptions(s->block_cache_, light, true);
  stats_opts.merge_operator = std::make_shared<AccessStatsMerge>();
  auto blob_opts = CfOptions(s->block_cache_, heavy, true);
  std::vector<rocksdb::ColumnFamilyDescriptor> descs = {
      {rocksdb::kDefaultColumnFamilyName, CfOptions(s->block_cache_, light, false)},
      {kCfRecords, CfOptions(s->block_cache_, light, true)},
      {kCfBlobs, blob_opts},
      {kCfRefs, CfOptions(s->block_cache_, light, false)},
      {kCfStats, stats_opts},
      {kCfPins, CfOptions(s->block_cache_, light, false)},
      {kCfQuarantine, CfOptions(s->block_cache_, light, false)},
  };
  rocksdb::Status rs;
  if (ro) {
    rs = rocksdb::DB::OpenForReadOnly(dbo, path, descs, &s->handles_, &s->db_);
  } else {
    rs = rocksdb::DB::Open(dbo, path, descs, &s->handles_, &s->db_);
  }
  if (auto st = FromRocks(rs, absl::StrCat("open ", path)); !st.ok()) return st;
  s->cf_default_ = s->handles_[0];
  s->cf_records_ = s->handles_[1];
  s->cf_blobs_ = s->handles_[2];
  s->cf_refs_ = s->handles_[3];
  s->cf_stats_ = s->handles_[4];
  s->cf_pins_ = s->handles_[5];
  s->cf_quarantine_ = s->handles_[6];

  std::string format;
  rs = s->db_->Get(rocksdb::ReadOptions(), s->cf_default_, kMetaFormatKey, &format);
  if (rs.IsNotFound()) {
    if (!ro) {
      rocksdb::WriteOptions wo;
      wo.sync = true;
      rs = s->db_->Put(wo, s->cf_default_, kMetaFormatKey, kStoreFormat);
      if (auto st = FromRocks(rs, "write store format"); !st.ok()) return st;
    }
  } else if (auto st = FromRocks(rs, "read store format"); !st.ok()) {
    return st;
  } else if (format != kStoreFormat) {
    return absl::FailedPreconditionError(absl::StrCat("open ", path, ": store format '", format,
                                                      "' is not supported (this build reads ",
                                                      kStoreFormat, ")"));
  }

  if (!ro && s->options_.stats_flush_interval > absl::ZeroDuration()) {
    s->flusher_ = std::thread([p = s.get()] { p->FlusherLoop(); });
  }
  return s;
}

absl::Status Store::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  {
    absl::MutexLock l(&flusher_mu_);
    stop_ = true;
  }
  if (flusher_.joinable()) flusher_.join();
  absl::Status result;
  if (db_ != nullptr) {
    if (!options_.read_only) {
      result.Update(FlushAccessStats());
      // A clean shutdown leaves no WAL to replay: the next open is fast.
      result.Update(FromRocks(db_->Flush(rocksdb::FlushOptions(), handles_), "flush at close"));
    }
    for (auto* h : handles_) result.Update(FromRocks(db_->DestroyColumnFamilyHandle(h), "close"));
    handles_.clear();
    result.Update(FromRocks(db_->Close(), absl::StrCat("close ", path_)));
    delete db_;
    db_ = nullptr;
  }
  return result;
}

void Store::FlusherLoop() {
  flusher_mu_.Lock();
  while (!stop_) {
    flusher_mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.stats_flush_interval);
    if (stop_) break;
    flusher_mu_.Unlock();
    // Errors here are retried at the next interval and reported by Close.
    (void)FlushAccessStats();
    flusher_mu_.Lock();
  }
  flusher_mu_.Unlock();
}

rocksdb::ColumnFamilyHandle* Store::column_family_for_testing(std::string_view name) {
  for (auto* h : handles_) {
    if (h->GetName() == name) return h;
  }
  return nullptr;
}

// --- Access statistics -------------------------------------------------------

void Store::RecordHit(std::string_view key) {
  if (options_.read_only) return;
  const int64_t now = Now();
  absl::MutexLock l(&stats_mu_);
  auto& p = pending_[AbslView(key)];
  ++p.hits;
  p.last_used_ms = std::max(p.last_used_ms, now);
}

absl::Status Store::FlushAccessStats() {
  if (options_.read_only || db_ == nullptr) return absl::OkStatus();
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
  } else if (!rs.IsNotFound()) {
    return FromRocks(rs, "read access statistics");
  }
  absl::MutexLock l(&stats_mu_);
  if (auto it = pending_.find(AbslView(key)); it != pending_.end()) {
    a.set_hits(a.hits() + it->second.hits);
    a.set_last_used_unix_ms(std::max(a.last_used_unix_ms(), it->second.last_used_ms));
  }
  return a;
}

absl::StatusOr<bool> Store::IsPinned(std::string_view key) {
  std::string v;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_pins_, S(key), &v);
  if (rs.IsNotFound()) return false;
  if (auto st = FromRocks(rs, "read pin"); !st.ok()) return st;
  return true;
}

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
      } else if (!rs.IsNotFound()) {
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
  if (options_.read_only) return;
  const std::string& digest = record.cubin_sha256();
  {
    ExclusiveLatches key_hold(key_latches_, {std::string(key)});
    // Only if the record still names the bad blob: a concurrent publish may
    // have replaced it with a good one.
    std::string raw;
    auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
    if (!rs.ok()) return;  // gone already (or unreadable: retried at the next read)
    auto now_rec = DecodeRecord(raw);
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
    (void)db_->Write(wo, &batch);
    if (digest_held) digest_latches_.ReleaseExclusive(digest);
  }
  {
    absl::MutexLock l(&stats_mu_);
    pending_.erase(AbslView(key));
  }
  hot_.Erase(key);
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
  if (auto st = FromRocks(rs, "lookup"); !st.ok()) return st;
  auto record = DecodeRecord(raw);
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

absl::StatusOr<v1::VerifyResponse> Store::Verify() {
  v1::VerifyResponse out;
  auto scanned = ScanRecords({}, {}, [](const v1::KernelRecord&) { return true; });
  if (!scanned.ok()) return scanned.status();
  // One hash per distinct blob; the verdict is shared by every record naming it.
  absl::flat_hash_map<std::string, std::string> bad;  // digest -> reason
  absl::flat_hash_set<std::string> good;
  for (auto& e : *scanned) {
    out.set_checked(out.checked() + 1);
    std::string reason;
    if (!e.decoded) {
      reason = "record does not decode";
    } else if (good.contains(e.record.cubin_sha256())) {
      continue;
    } else if (auto it = bad.find(e.record.cubin_sha256()); it != bad.end()) {
      reason = it->second;
    } else {
      auto cubin = ReadVerifiedBlob(e.record);
      if (cubin.ok()) {
        good.insert(e.record.cubin_sha256());
        continue;
      }
      if (!absl::IsDataLoss(cubin.status())) return cubin.status();
      reason = std::string(cubin.status().message());
      bad.emplace(e.record.cubin_sha256(), reason);
    }
    out.set_corrupt(out.corrupt() + 1);
    out.add_quarantined_keys(e.key);
    Quarantine(e.key, e.decoded ? e.record : v1::KernelRecord(), reason);
  }
  return out;
}

// --- Scans, listing, stats ---------------------------------------------------

absl::StatusOr<std::vector<Store::Scanned>> Store::ScanRecords(
    std::string_view begin, std::string_view end,
    absl::FunctionRef<bool(const v1::KernelRecord&)> pred) {
  std::vector<Scanned> out;
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper = S(end);
  if (!end.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf_records_));
  for (begin.empty() ? it->SeekToFirst() : it->Seek(S(begin)); it->Valid(); it->Next()) {
    Scanned s;
    s.key = std::string(V(it->key()));
    s.raw = std::string(V(it->value()));
    auto r = DecodeRecord(s.raw);
    if (r.ok()) {
      s.decoded = true;
      s.record = *std::move(r);
      if (!pred(s.record)) continue;
    }
    out.push_back(std::move(s));
  }
  if (auto st = FromRocks(it->status(), "scan records"); !st.ok()) return st;
  return out;
}

absl::StatusOr<v1::ListResponse> Store::List(const v1::Filter& filter, uint32_t page_size,
                                             std::string_view page_token) {
  if (page_size == 0) page_size = 100;
  page_size = std::min<uint32_t>(page_size, 1000);
  std::string begin, end;
  auto narrow = [&](std::string b, std::string e) {
    begin = std::max(begin, b);
    if (!e.empty() && (end.empty() || e < end)) end = e;
  };
  if (!filter.toolchain_id().empty()) {
    auto raw = ParseToolchainIdHex(filter.toolchain_id());
    if (!raw.ok())
      return absl::InvalidArgumentError(absl::StrCat("filter.", raw.status().message()));
    auto r = ToolchainRange(*raw);
    narrow(r.begin, r.end);
  }
  if (!filter.key_prefix().empty()) {
    narrow(filter.key_prefix(), PrefixSuccessor(filter.key_prefix()));
  }
  if (!page_token.empty()) {
    if (auto s = ValidateKey(page_token); !s.ok()) {
      return absl::InvalidArgumentError("page_token: not a token from a previous page");
    }
    narrow(std::string(page_token) + '\0', "");
  }
  if (!end.empty() && begin >= end) return v1::ListResponse();

  v1::ListResponse out;
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper = S(end);
  if (!end.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf_records_));
  for (begin.empty() ? it->SeekToFirst() : it->Seek(S(begin)); it->Valid(); it->Next()) {
    auto r = DecodeRecord(V(it->value()));
    if (!r.ok()) continue;  // undecodable records are Verify's business
    if (!filter.arch().empty() && r->arch() != filter.arch()) continue;
    if (!filter.mask_kind().empty() && MaskKind(*r) != filter.mask_kind()) continue;
    if (filter.created_before_unix_ms() != 0 &&
        r->created_unix_ms() >= filter.created_before_unix_ms()) {
      continue;
    }
    auto pinned_or = IsPinned(V(it->key()));
    if (!pinned_or.ok()) return pinned_or.status();
    const bool pinned = *pinned_or;
    if (filter.pinned() == v1::Filter::PINNED_ONLY && !pinned) continue;
    if (filter.pinned() == v1::Filter::PINNED_NONE && pinned) continue;
    auto stats = ReadAccessStats(V(it->key()));
    if (!stats.ok()) return stats.status();
    if (filter.unused_since_unix_ms() != 0 &&
        stats->last_used_unix_ms() >= filter.unused_since_unix_ms()) {
      continue;
    }
    if (static_cast<uint32_t>(out.entries_size()) == page_size) {
      // One more match exists: the page is full and another follows.
      out.set_next_page_token(out.entries(out.entries_size() - 1).record().key());
      break;
    }
    auto* e = out.add_entries();
    *e->mutable_record() = *std::move(r);
    *e->mutable_access() = *std::move(stats);
    e->set_pinned(pinned);
  }
  if (auto st = FromRocks(it->status(), "list"); !st.ok()) return st;
  return out;
}

absl::StatusOr<std::optional<v1::EntrySummary>> Store::Inspect(std::string_view key) {
  if (auto s = ValidateKey(key); !s.ok()) return s;
  std::string raw;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
  if (rs.IsNotFound()) return std::optional<v1::EntrySummary>();
  if (auto st = FromRocks(rs, "inspect"); !st.ok()) return st;
  auto r = DecodeRecord(raw);
  if (!r.ok()) return r.status();
  v1::EntrySummary e;
  *e.mutable_record() = *std::move(r);
  auto stats = ReadAccessStats(key);
  if (!stats.ok()) return stats.status();
  *e.mutable_access() = *std::move(stats);
  auto pinned = IsPinned(key);
  if (!pinned.ok()) return pinned.status();
  e.set_pinned(*pinned);
  return std::optional<v1::EntrySummary>(std::move(e));
}

absl::StatusOr<std::string> Store::ResolveKeyPrefix(std::string_view hex_prefix) {
  auto prefix = ParseHexKeyPrefix(hex_prefix);
  if (!prefix.ok()) return prefix.status();
  std::vector<std::string> found;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_records_));
  for (it->Seek(S(prefix->bytes)); it->Valid() && found.size() < 2; it->Next()) {
    std::string_view k = V(it->key());
    if (!StartsWith(k, prefix->bytes)) break;
    if (prefix->Matches(k)) found.emplace_back(k);
  }
  if (auto st = FromRocks(it->status(), "resolve key prefix"); !st.ok()) return st;
  if (found.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no entry has a key starting with ", AbslView(hex_prefix)));
  }
  if (found.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("key prefix ", AbslView(hex_prefix),
                                                   " is ambiguous (matches several entries)"));
  }
  return found[0];
}

absl::StatusOr<v1::StatsResponse> Store::Stats() {
  v1::StatsResponse out;
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> groups;
  absl::flat_hash_map<std::string, uint64_t> blobs;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_records_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto r = DecodeRecord(V(it->value()));
      if (!r.ok()) continue;
      out.set_entries(out.entries() + 1);
      auto& g = groups[{ToHex(KeyToolchainId(r->key())), r->arch()}];
      g.first += 1;
      g.second += r->cubin_size();
      blobs.emplace(r->cubin_sha256(), r->cubin_size());
    }
    if (auto st = FromRocks(it->status(), "stats"); !st.ok()) return st;
  }
  for (const auto& [d, size] : blobs) out.set_blob_bytes(out.blob_bytes() + size);
  out.set_blobs(blobs.size());
  for (const auto& [k, v] : groups) {
    auto* g = out.add_groups();
    g->set_toolchain_id(k.first);
    g->set_arch(k.second);
    g->set_entries(v.first);
    g->set_bytes(v.second);
  }
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_pins_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      std::string v;
      auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, it->key(), &v);
      if (rs.ok()) out.set_pinned(out.pinned() + 1);
    }
    if (auto st = FromRocks(it->status(), "stats"); !st.ok()) return st;
  }
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_quarantine_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) out.set_quarantined(out.quarantined() + 1);
    if (auto st = FromRocks(it->status(), "stats"); !st.ok()) return st;
  }
  return out;
}

// --- Pins --------------------------------------------------------------------

absl::Status Store::Pin(std::string_view key, std::string_view reason) {
  if (auto s = CheckWritable("pin"); !s.ok()) return s;
  if (auto s = ValidateKey(key); !s.ok()) return s;
  // Under the key latch, so that an eviction cannot remove the entry between
  // the check and the pin (evict re-reads pins under the same latch).
  ExclusiveLatches hold(key_latches_, {std::string(key)});
  std::string raw;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
  if (rs.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("pin: no entry ", KeyToHex(key)));
  }
  if (auto st = FromRocks(rs, "pin"); !st.ok()) return st;
  v1::PinInfo p;
  p.set_pinned_unix_ms(Now());
  p.set_reason(std::string(reason));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Put(wo, cf_pins_, S(key), p.SerializeAsString()), "pin");
}

absl::Status Store::Unpin(std::string_view key) {
  if (auto s = CheckWritable("unpin"); !s.ok()) return s;
  if (auto s = ValidateKey(key); !s.ok()) return s;
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Delete(wo, cf_pins_, S(key)), "unpin");
}

// --- Removal: evict, invalidate, garbage collection --------------------------

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
      const bool referenced = it->Valid() && StartsWith(V(it->key()), d);
      status.Update(FromRocks(it->status(), "collect blobs"));
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
  }
  auto freed = CollectBlobs(std::move(digests));
  if (!freed.ok()) return freed.status();
  out.set_freed_bytes(*freed);
  return out;
}

absl::StatusOr<v1::InvalidateResponse> Store::RemoveWhere(
    absl::FunctionRef<bool(const v1::KernelRecord&)> pred) {
  if (auto s = CheckWritable("invalidate"); !s.ok()) return s;
  auto scanned = ScanRecords({}, {}, pred);
  if (!scanned.ok()) return scanned.status();
  std::vector<std::string> keys;
  for (auto& s : *scanned) {
    if (s.decoded) keys.push_back(std::move(s.key));
  }
  return RemoveKeys(std::move(keys), /*keep_pinned=*/false, 0);
}

absl::StatusOr<v1::EvictResponse> Store::Evict(uint64_t max_bytes,
                                               std::optional<absl::Duration> grace) {
  if (auto s = CheckWritable("evict"); !s.ok()) return s;
  if (auto s = FlushAccessStats(); !s.ok()) return s;
  const int64_t protect_after =
      Now() - absl::ToInt64Milliseconds(grace.value_or(options_.eviction_grace_period));
  auto scanned = ScanRecords({}, {}, [](const v1::KernelRecord&) { return true; });
  if (!scanned.ok()) return scanned.status();

  absl::flat_hash_set<std::string> pinned;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_pins_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) pinned.emplace(V(it->key()));
    if (auto st = FromRocks(it->status(), "evict"); !st.ok()) return st;
  }
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
    if (pinned.contains(s.key)) continue;
    auto stats = ReadAccessStats(s.key);
    if (!stats.ok()) return stats.status();
    int64_t recency = std::max(stats->last_used_unix_ms(), s.record.created_unix_ms());
    if (recency >= protect_after) continue;
    candidates.push_back({recency, i});
  }
  v1::EvictResponse out;
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
  auto scanned = ScanRecords(range.begin, range.end, [](const v1::KernelRecord&) { return true; });
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
  auto freed = CollectBlobs(std::move(digests));
  if (!freed.ok()) return freed.status();
  v1::InvalidateResponse out;
  out.set_removed_entries(scanned->size());
  out.set_freed_bytes(*freed);
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
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_refs_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
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
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_stats_));
    std::vector<std::string> orphans;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
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
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_blobs_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      refs->Seek(it->key());
      if (!refs->Valid() || !StartsWith(V(refs->key()), V(it->key()))) {
        candidates.emplace_back(V(it->key()));
      }
    }
    if (auto st = FromRocks(it->status(), "gc"); !st.ok()) return st;
  }
  return CollectBlobs(std::move(candidates));
}

// --- Export / import ---------------------------------------------------------

absl::StatusOr<ExportResult> Store::Export(const v1::Filter& filter,
                                           absl::FunctionRef<absl::Status(std::string_view)> sink) {
  ExportResult result;
  BundleWriter writer([&](std::string_view piece) { return sink(piece); });
  if (auto s = writer.Begin(); !s.ok()) return s;
  std::string token;
  do {
    auto page = List(filter, 1000, token);
    if (!page.ok()) return page.status();
    for (const auto& e : page->entries()) {
      auto cubin = ReadVerifiedBlob(e.record());
      if (!cubin.ok()) {
        if (!absl::IsDataLoss(cubin.status())) return cubin.status();
        Quarantine(e.record().key(), e.record(), std::string(cubin.status().message()));
        result.quarantined_keys.push_back(e.record().key());
        continue;
      }
      if (auto s = writer.Add(e.record(), *cubin); !s.ok()) return s;
    }
    token = page->next_page_token();
  } while (!token.empty());
  if (auto s = writer.Finish(); !s.ok()) return s;
  result.exported = writer.count();
  return result;
}

absl::StatusOr<ExportResult> Store::ExportToFile(const v1::Filter& filter,
                                                 const std::string& path) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("export: cannot create ", tmp));
  }
  auto result = Export(filter, [&](std::string_view piece) {
    if (std::fwrite(piece.data(), 1, piece.size(), f) != piece.size()) {
      return absl::UnavailableError(absl::StrCat("export: write to ", tmp, " failed"));
    }
    return absl::OkStatus();
  });
  const bool closed = std::fclose(f) == 0;
  if (result.ok() && !closed) result = absl::UnavailableError("export: closing the file failed");
  if (result.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    result = absl::UnavailableError(absl::StrCat("export: cannot rename ", tmp, " to ", path));
  }
  if (!result.ok()) std::remove(tmp.c_str());
  return result;
}

absl::StatusOr<v1::ImportResponse> Store::Import(std::string_view bundle,
                                                 const ImportOptions& options) {
  if (auto s = CheckWritable("import"); !s.ok()) return s;
  std::string expected;
  if (!options.allow_foreign_toolchain) {
    if (options.expected_toolchain_id.empty()) {
      return absl::InvalidArgumentError(
          "import: expected_toolchain_id is required unless allow_foreign_toolchain is set");
    }
    auto raw = ParseToolchainIdHex(options.expected_toolchain_id);
    if (!raw.ok()) return raw.status();
    expected = *std::move(raw);
  }
  // Validate everything before writing anything.
  auto entries = DecodeBundle(bundle);
  if (!entries.ok()) return entries.status();
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < entries->size(); ++i) {
    const auto& r = (*entries)[i].record;
    if (!expected.empty() && KeyToolchainId(r.key()) != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "import: bundle entry ", i, " belongs to toolchain ", ToHex(KeyToolchainId(r.key())),
          ", not the current ", options.expected_toolchain_id,
          " (set allow_foreign_toolchain to import it anyway)"));
    }
    if (!seen.insert(r.key()).second) {
      return absl::DataLossError(
          absl::StrCat("bundle: entry ", i, ": duplicate key ", KeyToHex(r.key())));
    }
  }
  v1::ImportResponse out;
  std::vector<Prepared> items;
  for (auto& e : *entries) {
    std::string raw;
    auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(e.record.key()), &raw);
    if (rs.ok()) {
      v1::KernelRecord cur;
      if (cur.ParseFromString(raw) && cur.cubin_sha256() == e.record.cubin_sha256()) {
        out.set_already_present(out.already_present() + 1);
        continue;
      }
    } else if (!rs.IsNotFound()) {
      return FromRocks(rs, "import");
    }
    Prepared p;
    p.digest = e.record.cubin_sha256();
    p.record_bytes = e.record.SerializeAsString();
    p.record = std::move(e.record);
    p.external = true;
    p.external_cubin = e.cubin;
    items.push_back(std::move(p));
  }
  if (!items.empty()) {
    hot_.EraseIf([&](std::string_view k, const Entry&) { return seen.contains(AbslView(k)); });
    if (auto s = WritePrepared(items, /*sync=*/true); !s.ok()) return s;
  }
  out.set_imported(items.size());
  return out;
}

absl::StatusOr<v1::ImportResponse> Store::ImportFile(const std::string& path,
                                                     const ImportOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("import: cannot open ", path));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::UnavailableError(absl::StrCat("import: cannot read ", path));
  return Import(data, options);
}

}  // namespace kcache
