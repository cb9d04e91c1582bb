// The kernel store on RocksDB (see store.h for the contract and the layout).
#include "cache/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/bundle.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/record_codec.h"
#include "cache/rocks_status.h"
#include "cache/string_view_compat.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/listener.h"
#include "rocksdb/merge_operator.h"
#include "rocksdb/metadata.h"
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

std::string RefKey(std::string_view digest, std::string_view key) {
  std::string r(digest);
  r += key;
  return r;
}

absl::Status ReadOnlyError(std::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(AbslView(what), ": the store is open read-only"));
}

// RocksDB's info log. RocksDB's own file logger writes through a
// WritableFileWriter, which asserts (aborting the daemon) when it is used
// again after a failed write, e.g. "no space left" during the very recovery
// from a full disk. This one writes each line with write(2) and drops what
// it cannot write. Lines go to `path` (rotated to path.old past 16 MiB) when
// given, and errors also to stderr (at most one a second).
class TolerantLogger final : public rocksdb::Logger {
 public:
  explicit TolerantLogger(std::string path)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), path_(std::move(path)) {
    Reopen();
  }
  ~TolerantLogger() override {
    if (fd_ >= 0) ::close(fd_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    static const char* const kNames[] = {"DEBUG", "INFO", "WARN", "ERROR", "FATAL", "HEADER"};
    char buf[2048];
    const absl::Time now = absl::Now();
    int n = std::snprintf(buf, sizeof(buf), "%s [%s] ",
                          absl::FormatTime("%Y/%m/%d-%H:%M:%E6S", now, absl::LocalTimeZone()).c_str(),
                          kNames[std::min<int>(level, 5)]);
    if (n < 0) return;
    va_list copy;
    va_copy(copy, ap);
    int m = std::vsnprintf(buf + n, sizeof(buf) - static_cast<size_t>(n) - 1, format, copy);
    va_end(copy);
    if (m < 0) return;
    size_t len = std::min(sizeof(buf) - 2, static_cast<size_t>(n) + static_cast<size_t>(m));
    if (buf[len - 1] != '\n') buf[len++] = '\n';
    Write(buf, len);
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL && level != rocksdb::InfoLogLevel::HEADER_LEVEL) {
      const int64_t sec = absl::ToUnixSeconds(now);
      if (last_stderr_sec_.exchange(sec) != sec) {
        (void)!::write(2, "kcache store (rocksdb): ", 24);
        (void)!::write(2, buf + n, len - static_cast<size_t>(n));
      }
    }
  }

 private:
  void Reopen() {
    if (path_.empty()) return;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat st {};
    written_ = fd_ >= 0 && ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  void Write(const char* p, size_t n) {
    absl::MutexLock l(&mu_);
    if (fd_ < 0) return;
    if (written_ > (uint64_t{16} << 20)) {
      ::close(fd_);
      fd_ = -1;
      (void)std::rename(path_.c_str(), (path_ + ".old").c_str());
      Reopen();
      if (fd_ < 0) return;
    }
    ssize_t w = ::write(fd_, p, n);  // a failed line is dropped
    if (w > 0) written_ += static_cast<uint64_t>(w);
  }

  const std::string path_;
  absl::Mutex mu_;
  int fd_ = -1;
  uint64_t written_ = 0;
  std::atomic<int64_t> last_stderr_sec_{0};
};

// The file number in a RocksDB corruption message ("... in /s/000123.sst
// offset 0 size 4096"); 0 when there is none.
uint64_t SstNumberIn(std::string_view msg) {
  size_t pos = msg.find(".sst");
  if (pos == std::string_view::npos) return 0;
  size_t b = pos;
  while (b > 0 && msg[b - 1] >= '0' && msg[b - 1] <= '9') --b;
  uint64_t n = 0;
  if (b == pos || !absl::SimpleAtoi(AbslView(msg.substr(b, pos - b)), &n)) return 0;
  return n;
}

uint64_t SstNumberOfName(const std::string& name) { return SstNumberIn(name); }

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

namespace {

// Big-endian midpoint floor((a + b) / 2) of two byte strings of one length.
std::string Midpoint(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  std::vector<unsigned> sum(n + 1, 0);
  unsigned carry = 0;
  for (size_t i = n; i-- > 0;) {
    unsigned v = static_cast<unsigned char>(a[i]) + static_cast<unsigned char>(b[i]) + carry;
    sum[i + 1] = v & 0xff;
    carry = v >> 8;
  }
  sum[0] = carry;
  std::string out(n, '\0');
  unsigned rem = 0;
  for (size_t i = 0; i <= n; ++i) {
    unsigned v = rem * 256 + sum[i];
    if (i > 0) out[i - 1] = static_cast<char>(v / 2);
    rem = v % 2;
  }
  return out;
}

// Iterates one column family over [begin, end) (end empty = to the last
// key), stepping over what RocksDB cannot read: on a corruption error the
// scan resumes at the first key after the damaged block (found by bisection
// between the last key read and the damaged table file's largest key: a
// Seek fails exactly while it lands in the damaged block), and the skipped
// range is described in `unreadable`. Other errors end the scan (status()).
class SkippingScan {
 public:
  SkippingScan(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cf, std::string begin,
               std::string end, std::vector<std::string>* unreadable)
      : db_(db), cf_(cf), begin_(std::move(begin)), end_(std::move(end)), unreadable_(unreadable) {
    upper_ = rocksdb::Slice(end_);
    if (!end_.empty()) ro_.iterate_upper_bound = &upper_;
    it_.reset(db_->NewIterator(ro_, cf_));
  }
  void Start() {
    begin_.empty() ? it_->SeekToFirst() : it_->Seek(begin_);
    Settle();
  }
  bool Valid() const { return it_->Valid(); }
  void Next() {
    it_->Next();
    Settle();
  }
  rocksdb::Slice key() const { return it_->key(); }
  rocksdb::Slice value() const { return it_->value(); }
  // Non-corruption errors; OK when the scan ended normally or stepped over damage.
  const rocksdb::Status& status() const { return error_; }
  // The skipped key ranges [from, to) ("to" empty: to the end).
  const std::vector<std::pair<std::string, std::string>>& skipped() const { return skipped_; }

 private:
  void Settle() {
    while (!it_->Valid() && !it_->status().ok()) {
      const rocksdb::Status st = it_->status();
      if (!st.IsCorruption() || skipped_.size() > 1000) {
        error_ = st;
        return;
      }
      std::string resume = ResumeAfter(st);
      const std::string from = have_last_ ? last_ + '\0' : begin_;
      skipped_.emplace_back(from, resume);
      if (unreadable_ != nullptr) {
        unreadable_->push_back(absl::StrCat(
            cf_->GetName(), ": keys ",
            have_last_ ? absl::StrCat("after ", ToHex(last_)) : std::string("from the start"), " ",
            resume.empty() ? std::string("to the end") : absl::StrCat("up to ", ToHex(resume)),
            ": ", st.ToString()));
      }
      if (resume.empty()) return;  // the rest cannot be read
      it_.reset(db_->NewIterator(ro_, cf_));
      it_->Seek(resume);
    }
    if (it_->Valid()) {
      last_.assign(it_->key().data(), it_->key().size());
      have_last_ = true;
    }
  }

  // True when Seek(k) fails on damage. A fresh iterator each time: one that
  // failed may answer a later Seek from the state of the failed one.
  bool Damaged(const std::string& k) {
    std::unique_ptr<rocksdb::Iterator> probe(db_->NewIterator(ro_, cf_));
    probe->Seek(k);
    return !probe->Valid() && probe->status().IsCorruption();
  }

  // The first key after the damaged block; empty when none can be found
  // (the rest of the range is then unreadable).
  std::string ResumeAfter(const rocksdb::Status& st) {
    std::string hi;  // a key past the damage
    if (const uint64_t bad = SstNumberIn(st.ToString()); bad != 0) {
      std::vector<rocksdb::LiveFileMetaData> files;
      db_->GetLiveFilesMetaData(&files);
      for (const auto& f : files) {
        if (f.column_family_name == cf_->GetName() && SstNumberOfName(f.name) == bad) {
          hi = f.largestkey + '\0';
        }
      }
    }
    if (hi.empty() || Damaged(hi)) {
      hi = std::string(std::max<size_t>(64, last_.size() + 1), '\xff');
      if (Damaged(hi)) return "";
    }
    std::string lo = have_last_ ? last_ : begin_;
    const size_t n = std::max(lo.size(), hi.size());
    lo.resize(n, '\0');
    hi.resize(n, '\0');
    if (!(lo < hi)) return "";
    // Invariant: Seek(lo) lands in the damage (or lo is the last key read);
    // Seek(hi) does not.
    for (;;) {
      std::string mid = Midpoint(lo, hi);
      if (mid == lo) break;
      (Damaged(mid) ? lo : hi) = std::move(mid);
    }
    if (!end_.empty() && hi >= end_) return "";
    return hi;
  }

  rocksdb::DB* db_;
  rocksdb::ColumnFamilyHandle* cf_;
  std::string begin_, end_;
  rocksdb::Slice upper_;
  rocksdb::ReadOptions ro_;
  std::unique_ptr<rocksdb::Iterator> it_;
  std::vector<std::string>* unreadable_;
  std::string last_;
  bool have_last_ = false;
  rocksdb::Status error_;
  std::vector<std::pair<std::string, std::string>> skipped_;
};

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
        files.Describe(), "); refusing to create a new, empty store over it; ",
        RecoverHint(path)));
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
  dbo.info_log = std::make_shared<TolerantLogger>(ro ? "" : (fs::path(path) / "LOG").string());
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
        s->read_only_reason_ = absl::StrCat(
            "the store is read-only: the disk was full when it was opened (", rs.ToString(),
            "); free space and restart kcached");
        std::fprintf(stderr, "kcache store %s: %s\n", path.c_str(), s->read_only_reason_.c_str());
        rs = rs2;
      }
    }
  }
  if (!rs.ok() && files.current && !IsDiskFull(rs) &&
      (rs.IsCorruption() || rs.IsPathNotFound() || rs.IsNotFound())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "open ", path, ": the store is damaged and cannot be opened (", rs.ToString(), "); ",
        RecoverHint(path)));
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
    dbo.info_log = std::make_shared<TolerantLogger>((fs::path(path) / "LOG").string());
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

// --- Access statistics -------------------------------------------------------

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

absl::StatusOr<bool> Store::IsPinned(std::string_view key) {
  std::string v;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_pins_, S(key), &v);
  if (rs.IsNotFound()) return false;
  // A pin that cannot be read counts as a pin: eviction must not guess.
  if (rs.IsCorruption()) return true;
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

absl::StatusOr<v1::VerifyResponse> Store::Verify() {
  v1::VerifyResponse out;
  std::vector<std::string> unreadable;
  auto scanned = ScanRecords({}, {}, [](const v1::KernelRecord&) { return true; }, &unreadable);
  if (!scanned.ok()) return scanned.status();
  for (auto& u : unreadable) out.add_unreadable(std::move(u));
  // One hash per distinct blob; the verdict is shared by every record naming it.
  absl::flat_hash_map<std::string, std::string> bad;  // digest -> reason
  absl::flat_hash_set<std::string> good;
  for (auto& e : *scanned) {
    out.set_checked(out.checked() + 1);
    std::string reason;
    if (!e.decoded) {
      reason = std::string(DecodeRecordAt(e.key, e.raw).status().message());
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
    absl::FunctionRef<bool(const v1::KernelRecord&)> pred, std::vector<std::string>* unreadable) {
  std::vector<Scanned> out;
  SkippingScan it(db_, cf_records_, std::string(begin), std::string(end), unreadable);
  for (it.Start(); it.Valid(); it.Next()) {
    Scanned s;
    s.key = std::string(V(it.key()));
    s.raw = std::string(V(it.value()));
    auto r = DecodeRecordAt(s.key, s.raw);
    if (r.ok()) {
      s.decoded = true;
      s.record = *std::move(r);
      if (!pred(s.record)) continue;
    }
    out.push_back(std::move(s));
  }
  if (auto st = FromRocks(it.status(), "scan records"); !st.ok()) return st;
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
  std::vector<std::string> unreadable;
  SkippingScan scan(db_, cf_records_, begin, end, &unreadable);
  SkippingScan* it = &scan;
  for (it->Start(); it->Valid(); it->Next()) {
    auto r = DecodeRecordAt(V(it->key()), V(it->value()));
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
  for (auto& u : unreadable) out.add_unreadable(std::move(u));
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
  SkippingScan scan(db_, cf_records_, prefix->bytes, PrefixSuccessor(prefix->bytes), nullptr);
  SkippingScan* it = &scan;
  for (it->Start(); it->Valid() && found.size() < 2; it->Next()) {
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
  std::vector<std::string> unreadable;
  {
    SkippingScan it(db_, cf_records_, "", "", &unreadable);
    for (it.Start(); it.Valid(); it.Next()) {
      auto r = DecodeRecordAt(V(it.key()), V(it.value()));
      if (!r.ok()) continue;
      out.set_entries(out.entries() + 1);
      auto& g = groups[{ToHex(KeyToolchainId(r->key())), r->arch()}];
      g.first += 1;
      g.second += r->cubin_size();
      blobs.emplace(r->cubin_sha256(), r->cubin_size());
    }
    if (auto st = FromRocks(it.status(), "stats"); !st.ok()) return st;
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
    SkippingScan it(db_, cf_pins_, "", "", &unreadable);
    for (it.Start(); it.Valid(); it.Next()) {
      std::string v;
      auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, it.key(), &v);
      if (rs.ok()) out.set_pinned(out.pinned() + 1);
    }
    if (auto st = FromRocks(it.status(), "stats"); !st.ok()) return st;
  }
  {
    SkippingScan it(db_, cf_quarantine_, "", "", &unreadable);
    for (it.Start(); it.Valid(); it.Next()) out.set_quarantined(out.quarantined() + 1);
    if (auto st = FromRocks(it.status(), "stats"); !st.ok()) return st;
  }
  for (auto& u : unreadable) out.add_unreadable(std::move(u));
  out.set_store_damage(damage());
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
  auto scanned = ScanRecords({}, {}, [](const v1::KernelRecord&) { return true; }, &unreadable);
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
  auto scanned = ScanRecords(range.begin, range.end, [](const v1::KernelRecord&) { return true; },
                             &unreadable);
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
    for (const auto& u : page->unreadable()) result.unreadable.push_back(u);
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
  auto data = ReadBundleFile(path);
  if (!data.ok()) {
    return absl::Status(data.status().code(), absl::StrCat("import: ", data.status().message()));
  }
  return Import(*data, options);
}

}  // namespace kcache
