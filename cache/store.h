// The persistent, content-addressed kernel store on RocksDB: records by key,
// cubins by digest, access statistics, pins and a quarantine, with a bounded
// in-memory layer for hot hits.
//
// Implementation, one idea a file: store.cc (open, repair, close),
// store_core.cc (Publish, Lookup, quarantine), store_access_stats.cc,
// store_admin.cc (List, Inspect, Stats, Verify, pins), store_removal.cc
// (Evict, Invalidate, CollectGarbage), store_bundle.cc (Export, Import).
//
// Thread-safety: a Store is safe for concurrent use from any number of
// threads without external synchronization (like rocksdb::DB). No internal
// mutex is held across RocksDB I/O; per-key and per-digest logical latches
// (cache/latch.h) order the few read-check-write sequences. Lock order:
// key latches (sorted) before digest latches.
//
// Layout (column families):
//   default     store meta ("kcache.store_format" = "1")
//   records     key (cache/key.h) -> KernelRecord (no cubin; cubin_sha256 names it)
//   blobs       SHA-256 (32 bytes) -> cubin bytes (zstd-compressed blocks)
//   refs        SHA-256 + key -> "" : reverse index, one per record naming the blob
//   stats       key -> AccessStats (merge operator: hits add, last_used max)
//   pins        key -> PinInfo
//   quarantine  key -> QuarantineInfo
//
// Blob garbage collection ("recompute by index"): a record and its refs row
// are written and deleted in the same WriteBatch, so refs is exact up to
// leaks (a refs row whose record is gone), never up to a missing row. A blob
// is deleted only when no refs row names it, checked while holding that
// digest's latch exclusively; publishers hold it shared across their write.
// So a blob can leak after a crash or a racing invalidation (CollectGarbage
// removes it), but a record can never lose its blob to GC. Publish always
// (re)writes the blob under its digest: storage is deduplicated by digest,
// and a republish heals a blob that was deleted as corrupt.
//
// Integrity: every path that returns or exports cubin bytes re-hashes them
// against record.cubin_sha256 (the in-memory layer holds only entries checked
// this way). A mismatch or a missing blob is never served: the entry moves to
// the quarantine (record, time, reason), its bad blob is deleted, and the
// lookup answers "not found" so that the caller recompiles.
//
// Damage (see docs/ops.md, "A damaged store"): a record or statistics row
// that RocksDB cannot read (a failed block checksum) is a miss as well: the
// key is quarantined (a tombstone hides the damaged bytes) and the next
// publish overwrites it. Scans step over ranges they cannot read, report
// them in `unreadable` and finish. A compaction that meets a damaged table
// file leaves it in place (the store stays writable) and the store says so
// in damage(); `kcache repair` (Store::Repair) removes such files for good.
// A directory that holds a store is never opened with create_if_missing: a
// lost CURRENT or MANIFEST is refused with a message naming the repair. A
// full disk makes writes fail with Unavailable while reads go on; a store
// that cannot be opened for writing because the disk is full is opened
// read-only (read_only_reason() says why). RocksDB's info log goes through
// a logger that drops lines it cannot write, never through RocksDB's own
// file writer (which asserts when reused after a failed write).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/entry.h"
#include "cache/hot_cache.h"
#include "cache/latch.h"
#include "kcache/v1/record.pb.h"
#include "kcache/v1/service.pb.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
class Cache;
class Env;
}  // namespace rocksdb

namespace kcache {

struct StoreOptions {
  // Open with DB::OpenForReadOnly (for the ops tool while a daemon holds the
  // store). Mutating calls then return FailedPrecondition; lookups still
  // verify digests but cannot quarantine (they answer "not found").
  bool read_only = false;
  // When a writable open fails because the disk is full, open read-only
  // instead: hits are served, mutating calls return Unavailable saying why.
  bool read_only_when_disk_full = true;
  // For tests: the Env RocksDB uses (null = the default), e.g. one whose
  // files fail writes with "no space left". Not owned.
  rocksdb::Env* env = nullptr;
  // The in-memory layer's budget; 0 disables it.
  size_t hot_cache_bytes = size_t{256} << 20;
  // RocksDB block cache shared by all column families.
  size_t block_cache_bytes = size_t{64} << 20;
  // Access statistics are kept in memory and written every interval (by a
  // background thread) and on Close / FlushAccessStats. <= 0: no thread.
  absl::Duration stats_flush_interval = absl::Seconds(5);
  // Evict never removes an entry used (or created) more recently than this.
  absl::Duration eviction_grace_period = absl::Minutes(10);
  // Wall clock in Unix milliseconds; null = the system clock. Tests use a
  // controlled clock.
  std::function<int64_t()> now_unix_ms;
  // Told of each entry the store removes, once the write that removed it is
  // done: `kind` is "quarantined" (its record or cubin failed a check;
  // `detail` says why), "evicted" or "invalidated" (`detail` empty). For the
  // daemon's log. Runs on the calling thread with no store lock or latch
  // held; it must not call back into the store. Null: nobody is told.
  std::function<void(std::string_view kind, std::string_view key, std::string_view detail)>
      on_removed;
};

// One entry to write, for PublishBatch.
struct PublishItem {
  v1::KernelRecord record;
  std::string cubin;
};

struct ImportOptions {
  // Hex id (16 digits) of the caller's current toolchain. Entries of any
  // other toolchain are refused unless allow_foreign_toolchain is set.
  std::string expected_toolchain_id;
  bool allow_foreign_toolchain = false;
};

struct ExportResult {
  uint64_t exported = 0;
  // Entries left out because their blob failed the digest check (now quarantined).
  std::vector<std::string> quarantined_keys;
  // Key ranges of the records that could not be read (damaged table files).
  std::vector<std::string> unreadable;
};

// What Store::Repair did.
struct RepairResult {
  // Files RepairDB could not use, moved to DIR/lost/ (their entries are gone
  // and are recompiled on demand).
  std::vector<std::string> moved_to_lost;
  uint64_t entries = 0;      // readable entries after the repair
  uint64_t quarantined = 0;  // entries whose blob was lost with a damaged file
  uint64_t freed_bytes = 0;  // blobs no entry names any more
};

class Store {
 public:
  // Opens (creating when absent, unless read_only) the store in directory
  // `path`, creating the directory and the column families. Errors:
  // FailedPrecondition when another process holds the store open for
  // writing (message says so) or the store format is unknown; NotFound when
  // read_only and no store exists; otherwise the mapped RocksDB error.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path, StoreOptions options);

  // Rebuilds the store's metadata (CURRENT, MANIFEST) from its table files
  // and logs with RocksDB's RepairDB, moving files it cannot read to
  // `path`/lost/, then opens the store, collects garbage and verifies every
  // entry (quarantining those whose blob was lost). The store must not be
  // open anywhere (FailedPrecondition naming the lock otherwise). NotFound
  // when `path` holds no store files.
  static absl::StatusOr<RepairResult> Repair(const std::string& path);

  // Why the store is read-only when it was opened writable (disk full at
  // open); empty otherwise.
  const std::string& read_only_reason() const { return read_only_reason_; }
  // Damage found in the background (a compaction that met a table file it
  // cannot read), as a message for people; empty when none was seen.
  std::string damage() const;

  // Closes on destruction (errors are then dropped; call Close to see them).
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Stops the flusher, writes pending access statistics, flushes memtables
  // (so that the next Open replays no log), closes the DB.
  // Idempotent. No other call may run concurrently with or after Close.
  absl::Status Close();

  // --- Kernel path ---------------------------------------------------------

  // The verified entry under `key`, or nullptr (with OK) when the store has
  // none. "Not found" is a normal answer, not an error: it is also the answer
  // when the stored blob is missing or fails its digest check (the entry is
  // then quarantined, so that the caller recompiles and publishes again).
  // Records a hit (in memory; flushed later). Errors: InvalidArgument for a
  // malformed key; Unavailable/DataLoss/Internal from RocksDB.
  absl::StatusOr<EntryRef> Lookup(std::string_view key);

  // Stores `record` with `cubin` in ONE synced WriteBatch (record, blob by
  // digest, refs row, initial access statistics): once Publish returns OK
  // the entry survives a crash; on a crash before, it is absent, never torn.
  // Fills record.cubin_sha256 (when empty), cubin_size, format_version (when
  // 0) and toolchain.id (when empty). A record already under the key is
  // replaced (same key = same kernel); its hit count is kept.
  // InvalidArgument naming the field: malformed key, key not of the record's
  // toolchain, cubin_sha256 set but not the cubin's digest, empty cubin.
  // Returns the entry as stored (also placed in the in-memory layer).
  absl::StatusOr<EntryRef> Publish(v1::KernelRecord record, std::string cubin);

  // Publishes several entries in one WriteBatch (atomic: all or none).
  // `sync` = false skips the fsync: only for bulk loading (benchmarks,
  // tests), where losing the batch on a crash is acceptable.
  absl::Status PublishBatch(std::vector<PublishItem> items, bool sync = true);

  // --- Admin path ----------------------------------------------------------

  // A page of entries that match `filter` (Filter fields: toolchain_id hex,
  // arch, mask_kind, created_before_unix_ms, unused_since_unix_ms (last use
  // before it, or never used), pinned, key_prefix), in key order.
  // page_size 0 -> 100, capped at 1000. page_token: empty to start, then the
  // previous page's next_page_token (empty at the end). Does not read blobs.
  absl::StatusOr<v1::ListResponse> List(const v1::Filter& filter, uint32_t page_size = 0,
                                        std::string_view page_token = {});

  // The entry summary under `key` (record, access stats, pinned), or nullopt.
  absl::StatusOr<std::optional<v1::EntrySummary>> Inspect(std::string_view key);

  // Resolves a hex key or a unique hex prefix of one to the whole binary key.
  // NotFound when nothing matches; InvalidArgument when not hex or when
  // the prefix is ambiguous (the message says so).
  absl::StatusOr<std::string> ResolveKeyPrefix(std::string_view hex_prefix);

  // Store-side fields of StatsResponse: entries, blob_bytes (uncompressed
  // bytes of distinct referenced cubins), blobs (distinct referenced
  // cubins), pinned, quarantined, groups (by toolchain id and arch; bytes =
  // sum of cubin sizes). Scans the records: O(entries), no blob reads.
  absl::StatusOr<v1::StatsResponse> Stats();

  // Pins an existing entry (NotFound if absent); a pinned entry is never
  // evicted. Pins survive quarantine (a republished kernel stays pinned) and
  // are removed by invalidation. Unpin of an unpinned key is OK.
  absl::Status Pin(std::string_view key, std::string_view reason);
  absl::Status Unpin(std::string_view key);

  // Evicts least-recently-used entries (recency = max(last use, creation))
  // until the distinct referenced blob bytes fit in `max_bytes`, never
  // evicting pinned entries or ones used within `grace` (default: options'
  // eviction_grace_period). Flushes pending access statistics first. May stop
  // above the budget when only protected entries are left.
  absl::StatusOr<v1::EvictResponse> Evict(uint64_t max_bytes,
                                          std::optional<absl::Duration> grace = std::nullopt);

  // Removes every entry of a toolchain (hex id): one DeleteRange over its
  // key range in records, stats and pins, refs rows of the removed records,
  // then collection of blobs nobody references. Pinned entries go too.
  absl::StatusOr<v1::InvalidateResponse> InvalidateToolchain(std::string_view toolchain_id_hex);
  // Removes every entry for `arch` / created before the time / one key
  // (NotFound when the key is absent), likewise with blob collection.
  absl::StatusOr<v1::InvalidateResponse> InvalidateArch(std::string_view arch);
  absl::StatusOr<v1::InvalidateResponse> InvalidateCreatedBefore(int64_t unix_ms);
  absl::StatusOr<v1::InvalidateResponse> InvalidateKey(std::string_view key);
  // Dispatches on the request's oneof; InvalidArgument when none is set.
  absl::StatusOr<v1::InvalidateResponse> Invalidate(const v1::InvalidateRequest& request);

  // Re-hashes every entry's blob (each distinct blob once); quarantines
  // mismatches and missing blobs; reports them.
  absl::StatusOr<v1::VerifyResponse> Verify();

  // Deletes refs rows whose record is gone or names another blob, access
  // statistics with no record, and blobs no refs row names. Safe to run at
  // any time, concurrently with everything else. Returns freed blob bytes.
  absl::StatusOr<uint64_t> CollectGarbage();

  // Writes the entries matching `filter` as one bundle (cache/bundle.h) to
  // `sink`, in pieces. Every blob is digest-checked first; a bad one is
  // quarantined and left out (listed in the result).
  absl::StatusOr<ExportResult> Export(const v1::Filter& filter,
                                      absl::FunctionRef<absl::Status(std::string_view)> sink);
  // The same into a file, written to `path`.tmp then renamed.
  absl::StatusOr<ExportResult> ExportToFile(const v1::Filter& filter, const std::string& path);

  // Validates the whole bundle (format, version, every digest, count and
  // checksum, toolchains against `options`) and only then writes all its
  // entries in one synced WriteBatch. A damaged or foreign bundle is refused
  // with InvalidArgument (or DataLoss for a damaged one) naming the problem,
  // and nothing from it is written. Entries already present (same key and
  // digest) are counted as already_present and not rewritten.
  absl::StatusOr<v1::ImportResponse> Import(std::string_view bundle, const ImportOptions& options);
  absl::StatusOr<v1::ImportResponse> ImportFile(const std::string& path,
                                                const ImportOptions& options);

  // Writes pending in-memory access statistics now.
  absl::Status FlushAccessStats();

  // For tests: the raw DB and a column family by name ("blobs", ...), to
  // damage data behind the store's back. Null after Close.
  rocksdb::DB* raw_db_for_testing() { return db_; }
  rocksdb::ColumnFamilyHandle* column_family_for_testing(std::string_view name);
  HotCache& hot_cache_for_testing() { return hot_; }

 private:
  struct Prepared;
  struct Scanned;

  Store(std::string path, StoreOptions options);

  int64_t Now() const;
  absl::Status CheckWritable(std::string_view what) const;
  absl::StatusOr<Prepared> Prepare(v1::KernelRecord record, std::string cubin) const;
  absl::Status WritePrepared(std::vector<Prepared>& items, bool sync);
  void RecordHit(std::string_view key);
  // Moves `key` to the quarantine if its record still names `digest`.
  void Quarantine(std::string_view key, const v1::KernelRecord& record, std::string_view reason);
  // Reads and checks the blob; DataLoss with the reason when bad or missing.
  absl::StatusOr<std::string> ReadVerifiedBlob(const v1::KernelRecord& record);
  // Deletes `digests`' blobs that no refs row names (see the GC note above).
  absl::StatusOr<uint64_t> CollectBlobs(std::vector<std::string> digests);
  // Deletes the given entries (record, stats, pins, refs) and collects blobs.
  absl::StatusOr<v1::InvalidateResponse> RemoveWhere(
      absl::FunctionRef<bool(const v1::KernelRecord&)> pred);
  absl::StatusOr<v1::InvalidateResponse> RemoveKeys(std::vector<std::string> keys, bool keep_pinned,
                                                    int64_t protect_after_ms);
  // Records in [begin, end) (whole store when both are empty) for which
  // `pred` holds, plus those that do not decode (decoded = false). Ranges
  // that cannot be read are appended to `unreadable` (may be null).
  absl::StatusOr<std::vector<Scanned>> ScanRecords(
      std::string_view begin, std::string_view end,
      absl::FunctionRef<bool(const v1::KernelRecord&)> pred,
      std::vector<std::string>* unreadable = nullptr);
  absl::StatusOr<v1::AccessStats> ReadAccessStats(std::string_view key);
  absl::StatusOr<bool> IsPinned(std::string_view key);
  void FlusherLoop();

  const std::string path_;
  const StoreOptions options_;
  // options_.read_only, or true after a disk-full fallback (then the reason).
  bool read_only_ = false;
  std::string read_only_reason_;
  class DamageListener;
  std::shared_ptr<DamageListener> damage_;
  rocksdb::DB* db_ = nullptr;
  std::shared_ptr<rocksdb::Cache> block_cache_;
  rocksdb::ColumnFamilyHandle* cf_default_ = nullptr;
  rocksdb::ColumnFamilyHandle* cf_records_ = nullptr;
  rocksdb::ColumnFamilyHandle* cf_blobs_ = nullptr;
  rocksdb::ColumnFamilyHandle* cf_refs_ = nullptr;
  rocksdb::ColumnFamilyHandle* cf_stats_ = nullptr;
  rocksdb::ColumnFamilyHandle* cf_pins_ = nullptr;
  rocksdb::ColumnFamilyHandle* cf_quarantine_ = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;

  HotCache hot_;
  LatchTable key_latches_;
  LatchTable digest_latches_;

  struct PendingHit {
    uint64_t hits = 0;
    int64_t last_used_ms = 0;
  };
  absl::Mutex stats_mu_;
  absl::flat_hash_map<std::string, PendingHit> pending_ ABSL_GUARDED_BY(stats_mu_);

  absl::Mutex flusher_mu_;
  bool stop_ ABSL_GUARDED_BY(flusher_mu_) = false;
  std::thread flusher_;
  bool closed_ = false;
};

}  // namespace kcache
