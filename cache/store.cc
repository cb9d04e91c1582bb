// The kernel store on RocksDB: open (column families, options, the format
// row), repair and close. See store.h for the contract and the layout; the
// other parts of Store are in store_*.cc, one idea each.
#include "cache/store.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/rocks_status.h"
#include "cache/store_internal.h"
#include "cache/string_view_compat.h"
#include "cache/tolerant_logger.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/listener.h"
#include "rocksdb/merge_operator.h"
#include "rocksdb/table.h"

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

// RocksDB options shared by Open and Repair.
rocksdb::DBOptions DbOptions(rocksdb::Env* env) {
  rocksdb::DBOptions dbo;
  if (env != nullptr) dbo.env = env;
  dbo.max_background_jobs = 2;
  dbo.keep_log_file_num = 4;
  dbo.max_open_files = -1;
  // Bounds WAL replay at open: column families whose unflushed data sits in
  // old logs get flushed once the logs exceed this.
  dbo.max_total_wal_size = uint64_t{64} << 20;
  return dbo;
}

std::vector<rocksdb::ColumnFamilyDescriptor> Descriptors(
    const std::shared_ptr<rocksdb::Cache>& cache) {
  const auto light = Pick({rocksdb::kLZ4Compression, rocksdb::kSnappyCompression});
  const auto heavy = Pick({rocksdb::kZSTD, rocksdb::kLZ4Compression});
  auto stats_opts = CfOptions(cache, light, true);
  stats_opts.merge_operator = std::make_shared<AccessStatsMerge>();
  return {
      {rocksdb::kDefaultColumnFamilyName, CfOptions(cache, light, false)},
      {kCfRecords, CfOptions(cache, light, true)},
      {kCfBlobs, CfOptions(cache, heavy, true)},
      {kCfRefs, CfOptions(cache, light, false)},
      {kCfStats, stats_opts},
      {kCfPins, CfOptions(cache, light, false)},
      {kCfQuarantine, CfOptions(cache, light, false)},
  };
}

absl::Status ReadOnlyError(std::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(AbslView(what), ": the store is open read-only"));
}

// ENOSPC, also where RocksDB rewrapped it and kept only the message.
bool IsDiskFull(const rocksdb::Status& s) {
  return s.IsNoSpace() ||
         (s.IsIOError() && absl::StrContains(s.ToString(), "No space left on device"));
}

// What a store directory holds, by RocksDB's file names.
struct DirFiles {
  bool current = false;
  int manifests = 0, tables = 0, logs = 0, options = 0;
  bool any_store_file() const { return manifests + tables + logs + options > 0; }
  std::string Describe() const {
    return absl::StrCat(tables, " table files, ", logs, " write-ahead logs, ", manifests,
                        " MANIFEST files");
  }
};

DirFiles ListDir(const std::string& path) {
  namespace fs = std::filesystem;
  DirFiles d;
  std::error_code ec;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n == "CURRENT") d.current = true;
    if (n.starts_with("MANIFEST-")) ++d.manifests;
    if (n.ends_with(".sst")) ++d.tables;
    if (n.ends_with(".log")) ++d.logs;
    if (n.starts_with("OPTIONS-")) ++d.options;
  }
  return d;
}

std::string RecoverHint(const std::string& path) {
  return absl::StrCat(
      "nothing was changed. Recover with `kcache repair --store ", path,
      "` (stop kcached first; it rebuilds the store's metadata from its files, moving "
      "unreadable ones to ",
      path,
      "/lost/), or move the directory away and restore a backup or import a bundle "
      "(docs/ops.md, \"A damaged store\")");
}

}  // namespace

// Keeps the store writable when a compaction meets a damaged table file:
// RocksDB would otherwise stop all writes for good (paranoid_checks). The
// damaged entries read as misses and are overwritten; `kcache repair`
// removes the file. Remembers the first such error for damage().
class Store::DamageListener final : public rocksdb::EventListener {
 public:
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason, rocksdb::Status* error) override {
    if (reason != rocksdb::BackgroundErrorReason::kCompaction || !error->IsCorruption()) return;
    {
      absl::MutexLock l(&mu_);
      if (first_.empty()) {
        first_ = absl::StrCat(
            "a compaction met a damaged table file (", error->ToString(),
            "); the entries in it read as misses and are recompiled; run `kcache repair` to "
            "remove the file");
        std::fprintf(stderr, "kcache store: %s\n", first_.c_str());
      }
    }
    *error = rocksdb::Status::OK();
  }
  std::string first() const {
    absl::MutexLock l(&mu_);
    return first_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string first_ ABSL_GUARDED_BY(mu_);
};

Store::Store(std::string path, StoreOptions options)
    : path_(std::move(path)),
      options_(std::move(options)),
      read_only_(options_.read_only),
      hot_(options_.hot_cache_bytes) {}

Store::~Store() { (void)Close(); }

int64_t Store::Now() const {
  return options_.now_unix_ms ? options_.now_unix_ms() : absl::ToUnixMillis(absl::Now());
}

absl::Status Store::CheckWritable(std::string_view what) const {
  if (!read_only_) return absl::OkStatus();
  if (!read_only_reason_.empty()) {
    return absl::UnavailableError(absl::StrCat(AbslView(what), ": ", read_only_reason_));
  }
  return ReadOnlyError(what);
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path, StoreOptions options) {
  namespace fs = std::filesystem;
  const bool ro = options.read_only;
  std::unique_ptr<Store> s(new Store(path, std::move(options)));
  std::error_code ec;
  const DirFiles files = ListDir(path);
  // A directory that already holds a store is never opened with
  // create_if_missing: without CURRENT, RocksDB would start an empty store
  // there and delete the old one's files.
  if (!files.current && files.any_store_file()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "open ", path, ": the directory holds a kcache store whose CURRENT file is missing (",
        files.Describe(), "); refusing to create a new, empty store over it; ", RecoverHint(path)));
  }
  if (ro) {
    if (!files.current) {
      return absl::NotFoundError(absl::StrCat("open ", path, " read-only: no store there"));
    }
  } else {
    fs::create_directories(path, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("open ", path, ": cannot create the directory: ", ec.message()));
    }
  }

  rocksdb::DBOptions dbo = DbOptions(s->options_.env);
  dbo.create_if_missing = !ro && !files.current;
  dbo.create_missing_column_families = !ro;
  // Read-only opens (the ops tool beside a daemon) write no log file.
  dbo.info_log = NewTolerantLogger(ro ? "" : (fs::path(path) / "LOG").string());
  s->damage_ = std::make_shared<DamageListener>();
  dbo.listeners.push_back(s->damage_);

  s->block_cache_ = rocksdb::NewLRUCache(std::max<size_t>(s->options_.block_cache_bytes, 1 << 20));
  std::vector<rocksdb::ColumnFamilyDescriptor> descs = Descriptors(s->block_cache_);
  rocksdb::Status rs;
  if (ro) {
    rs = rocksdb::DB::OpenForReadOnly(dbo, path, descs, &s->handles_, &s->db_);
  } else {
    rs = rocksdb::DB::Open(dbo, path, descs, &s->handles_, &s->db_);
    if (IsDiskFull(rs) && s->options_.read_only_when_disk_full) {
      // Serve what is there: hits need no space.
      auto rs2 = rocksdb::DB::OpenForReadOnly(dbo, path, descs, &s->handles_, &s->db_);
      if (rs2.ok()) {
        s->read_only_ = true;
        s->read_only_reason_ =
            absl::StrCat("the store is read-only: the disk was full when it was opened (",
                         rs.ToString(), "); free space and restart kcached");
        std::fprintf(stderr, "kcache store %s: %s\n", path.c_str(), s->read_only_reason_.c_str());
        rs = rs2;
      }
    }
  }
  if (!rs.ok() && files.current && !IsDiskFull(rs) &&
      (rs.IsCorruption() || rs.IsPathNotFound() || rs.IsNotFound())) {
    return absl::FailedPreconditionError(
        absl::StrCat("open ", path, ": the store is damaged and cannot be opened (", rs.ToString(),
                     "); ", RecoverHint(path)));
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
  if (rs.IsCorruption()) {
    // The format row sits in a damaged block. The column families are this
    // store's own, so it is of this format: rewrite the row (when writable).
    std::fprintf(stderr, "kcache store %s: the store format row is unreadable (%s); rewriting it\n",
                 path.c_str(), rs.ToString().c_str());
    rs = rocksdb::Status::NotFound();
  }
  if (rs.IsNotFound()) {
    if (!s->read_only_) {
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

  if (!s->read_only_ && s->options_.stats_flush_interval > absl::ZeroDuration()) {
    s->flusher_ = std::thread([p = s.get()] { p->FlusherLoop(); });
  }
  return s;
}

std::string Store::damage() const { return damage_ ? damage_->first() : std::string(); }

absl::StatusOr<RepairResult> Store::Repair(const std::string& path) {
  namespace fs = std::filesystem;
  const DirFiles files = ListDir(path);
  if (!files.current && !files.any_store_file()) {
    return absl::NotFoundError(absl::StrCat("repair ", path, ": no kcache store there"));
  }
  auto lost_files = [&] {
    std::set<std::string> out;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(fs::path(path) / "lost", ec), end; !ec && it != end;
         it.increment(ec)) {
      if (it->is_regular_file(ec)) out.insert(it->path().string());
    }
    return out;
  };
  const std::set<std::string> lost_before = lost_files();
  {
    rocksdb::DBOptions dbo = DbOptions(nullptr);
    dbo.info_log = NewTolerantLogger((fs::path(path) / "LOG").string());
    auto cache = rocksdb::NewLRUCache(8 << 20);
    std::vector<rocksdb::ColumnFamilyDescriptor> descs = Descriptors(cache);
    rocksdb::Status rs = rocksdb::RepairDB(path, dbo, descs);
    if (auto st = FromRocks(rs, absl::StrCat("repair ", path)); !st.ok()) return st;
  }
  RepairResult out;
  // (RepairDB also moves the old MANIFEST and the logs it converted into
  // tables there; only table files it could not read lose entries.)
  for (const auto& f : lost_files()) {
    if (!lost_before.contains(f) && f.ends_with(".sst")) out.moved_to_lost.push_back(f);
  }
  StoreOptions so;
  so.hot_cache_bytes = 0;
  so.stats_flush_interval = absl::ZeroDuration();
  so.read_only_when_disk_full = false;
  auto store = Open(path, so);
  if (!store.ok()) return store.status();
  auto freed = (*store)->CollectGarbage();
  if (!freed.ok()) return freed.status();
  auto verified = (*store)->Verify();
  if (!verified.ok()) return verified.status();
  auto freed2 = (*store)->CollectGarbage();
  if (!freed2.ok()) return freed2.status();
  auto stats = (*store)->Stats();
  if (!stats.ok()) return stats.status();
  out.freed_bytes = *freed + *freed2;
  out.quarantined = verified->corrupt();
  out.entries = stats->entries();
  if (auto st = (*store)->Close(); !st.ok()) return st;
  return out;
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
    if (!read_only_) {
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

}  // namespace kcache
