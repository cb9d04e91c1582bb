// Damage to the store on disk, the way it happens: a full disk (through a
// file system whose writes fail with ENOSPC, and a real small tmpfs where
// this process may mount one), one flipped byte in a table file of each
// column family, a lost CURRENT or MANIFEST, and a record moved under
// another key. After each: nothing acknowledged is lost unless its own bytes
// were destroyed, nothing damaged is served, and the store serves again.
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "cache/digest.h"
#include "cache/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/metadata.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

namespace fs = std::filesystem;
using ::kcache::testing::IsOk;
using ::kcache::testing::MakeCubin;
using ::kcache::testing::MakeRecord;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// --- A disk that fills up ------------------------------------------------------

// Forwards to the real file system; while `full` is set, every write to a
// file fails as a full disk does (IOStatus::NoSpace, what ENOSPC becomes).
class FullDiskFs final : public rocksdb::FileSystemWrapper {
 public:
  FullDiskFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FullDiskFs"; }
  std::atomic<bool> full{false};

  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> f, const std::atomic<bool>* full)
        : FSWritableFileOwnerWrapper(std::move(f)), full_(full) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
      if (*full_) return NoSpace();
      return FSWritableFileOwnerWrapper::Append(d, o, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v,
                             rocksdb::IODebugContext* dbg) override {
      if (*full_) return NoSpace();
      return FSWritableFileOwnerWrapper::Append(d, o, v, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& d, uint64_t off,
                                       const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
      if (*full_) return NoSpace();
      return FSWritableFileOwnerWrapper::PositionedAppend(d, off, o, dbg);
    }
    rocksdb::IOStatus Allocate(uint64_t off, uint64_t len, const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* dbg) override {
      if (*full_) return NoSpace();
      return FSWritableFileOwnerWrapper::Allocate(off, len, o, dbg);
    }

   private:
    static rocksdb::IOStatus NoSpace() {
      return rocksdb::IOStatus::NoSpace("write", "No space left on device");
    }
    const std::atomic<bool>* full_;
  };

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    return Wrap(target()->NewWritableFile(f, o, r, dbg), r);
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    return Wrap(target()->ReopenWritableFile(f, o, r, dbg), r);
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    return Wrap(target()->ReuseWritableFile(f, old, o, r, dbg), r);
  }

 private:
  rocksdb::IOStatus Wrap(rocksdb::IOStatus s, std::unique_ptr<rocksdb::FSWritableFile>* r) {
    if (s.ok()) *r = std::make_unique<File>(std::move(*r), &full);
    return s;
  }
};

StoreOptions Quiet() {
  StoreOptions o;
  o.stats_flush_interval = absl::ZeroDuration();
  o.hot_cache_bytes = 0;  // every hit reads the disk
  return o;
}

void ExpectServed(Store& store, int n) {
  auto e = store.Lookup(MakeRecord(n).key());
  ASSERT_THAT(e, IsOk()) << "entry " << n;
  ASSERT_NE(*e, nullptr) << "entry " << n << " is lost";
  EXPECT_EQ((*e)->cubin, MakeCubin(2000 + n, n)) << "entry " << n;
}

// Issue 17.1: publishes on a full disk failed a few times and then RocksDB's
// own info log, writing into the full directory during its recovery, hit an
// assertion and aborted the process; opening on a full disk aborted too.
TEST(DiskFull, PublishesFailUnavailableHitsGoOnAndAFullDiskOpensReadOnly) {
  TempDir dir;
  auto fsys = std::make_shared<FullDiskFs>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fsys);
  StoreOptions o = Quiet();
  o.env = env.get();
  {
    auto store = Store::Open(dir.Sub("store"), o);
    ASSERT_THAT(store, IsOk());
    for (int i = 0; i < 5; ++i) {
      ASSERT_THAT((*store)->Publish(MakeRecord(i), MakeCubin(2000 + i, i)), IsOk());
    }
    fsys->full = true;
    for (int i = 5; i < 40; ++i) {
      auto p = (*store)->Publish(MakeRecord(i), MakeCubin(2000 + i, i));
      ASSERT_THAT(p, StatusIs(absl::StatusCode::kUnavailable)) << "publish " << i;
      EXPECT_THAT(p.status().message(), HasSubstr("space")) << "publish " << i;
      // Hits keep being served (and record hits that cannot be written).
      for (int j = 0; j < 5; ++j) ExpectServed(**store, j);
      ASSERT_THAT((*store)->FlushAccessStats(), Not(IsOk()));
      absl::SleepFor(absl::Milliseconds(20));  // let RocksDB's recovery run and log
    }
    // Space comes back: RocksDB resumes writing by itself.
    fsys->full = false;
    absl::Status published = absl::UnknownError("not tried");
    for (int t = 0; t < 300 && !published.ok(); ++t) {
      published = (*store)->Publish(MakeRecord(40), MakeCubin(2040, 40)).status();
      if (!published.ok()) absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_THAT(published, IsOk());
    ExpectServed(**store, 40);
    fsys->full = true;
    ASSERT_THAT((*store)->Publish(MakeRecord(41), MakeCubin(2041, 41)),
                StatusIs(absl::StatusCode::kUnavailable));
    // Closing on a full disk reports the failed flush; it must not crash.
    (void)(*store)->Close();
  }
  {
    // Restart while the disk is still full: read-only, serving.
    auto store = Store::Open(dir.Sub("store"), o);
    ASSERT_THAT(store, IsOk());
    EXPECT_THAT((*store)->read_only_reason(), HasSubstr("disk was full"));
    for (int j = 0; j < 5; ++j) ExpectServed(**store, j);
    ExpectServed(**store, 40);
    auto p = (*store)->Publish(MakeRecord(7), MakeCubin(2007, 7));
    ASSERT_THAT(p, StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_THAT(p.status().message(), HasSubstr("free space and restart"));
    EXPECT_THAT((*store)->Stats(), IsOk());
    ASSERT_THAT((*store)->Close(), IsOk());
  }
  fsys->full = false;
  {
    auto store = Store::Open(dir.Sub("store"), o);
    ASSERT_THAT(store, IsOk());
    EXPECT_THAT((*store)->read_only_reason(), IsEmpty());
    for (int j = 0; j < 5; ++j) ExpectServed(**store, j);
    ASSERT_THAT((*store)->Publish(MakeRecord(7), MakeCubin(2007, 7)), IsOk());
    ExpectServed(**store, 7);
    auto v = (*store)->Verify();
    ASSERT_THAT(v, IsOk());
    EXPECT_EQ(v->corrupt(), 0u);
    ASSERT_THAT((*store)->Close(), IsOk());
  }
}

// The same on a real full file system: a 4 MiB tmpfs, where this process
// may mount one (CI runs as root); skipped, saying so, elsewhere. This is
// the test that aborted before the fix (RocksDB's info log is written
// through the real file system, which the wrapper above does not see).
// Checked again after a restart on the full disk, and after space is freed.
TEST(DiskFull, OnARealFullTmpfs) {
  TempDir dir;
  const std::string mnt = dir.Sub("mnt");
  fs::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=4m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); the fault-injecting file system test covers a full disk";
  }
  struct Unmount {
    std::string p;
    ~Unmount() { umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string path = mnt + "/store";
  {
    auto store = Store::Open(path, Quiet());
    ASSERT_THAT(store, IsOk());
    for (int i = 0; i < 3; ++i) {
      ASSERT_THAT((*store)->Publish(MakeRecord(i), MakeCubin(2000 + i, i)), IsOk());
    }
    // Fill the disk with something else, then keep publishing.
    {
      std::ofstream filler(mnt + "/filler", std::ios::binary);
      std::string mb(1 << 20, 'x');
      for (int i = 0; i < 8 && filler; ++i) filler.write(mb.data(), mb.size());
    }
    int unavailable = 0;
    for (int i = 3; i < 60; ++i) {
      auto p = (*store)->Publish(MakeRecord(i), MakeCubin(200'000 + i, i));
      if (!p.ok()) {
        ASSERT_THAT(p, StatusIs(absl::StatusCode::kUnavailable)) << "publish " << i;
        ++unavailable;
      }
      for (int j = 0; j < 3; ++j) ExpectServed(**store, j);
    }
    EXPECT_GT(unavailable, 20);
    (void)(*store)->Close();
  }
  {
    auto store = Store::Open(path, Quiet());
    ASSERT_THAT(store, IsOk());
    for (int j = 0; j < 3; ++j) ExpectServed(**store, j);
    (void)(*store)->Close();
  }
  fs::remove(mnt + "/filler");
  {
    auto store = Store::Open(path, Quiet());
    ASSERT_THAT(store, IsOk());
    EXPECT_THAT((*store)->read_only_reason(), IsEmpty());
    for (int j = 0; j < 3; ++j) ExpectServed(**store, j);
    ASSERT_THAT((*store)->Publish(MakeRecord(99), MakeCubin(2099, 99)), IsOk());
    ASSERT_THAT((*store)->Close(), IsOk());
  }
}

// --- Flipped bytes in table files ------------------------------------------------

constexpr int kEntries = 110;

// A store of kEntries entries (a few pinned, two quarantined), flushed to
// table files and closed. Returns the table files of each column family.
std::map<std::string, std::vector<std::string>> BuildStore(const std::string& path) {
  std::map<std::string, std::vector<std::string>> files;
  auto store = Store::Open(path, Quiet());
  EXPECT_THAT(store, IsOk());
  if (!store.ok()) return files;
  for (int i = 0; i < kEntries; ++i) {
    EXPECT_THAT((*store)->Publish(MakeRecord(i), MakeCubin(2000 + i, i)), IsOk());
    (void)(*store)->Lookup(MakeRecord(i).key());  // a hit, for the stats column family
  }
  for (int i = 0; i < kEntries; i += 10) {
    EXPECT_THAT((*store)->Pin(MakeRecord(i).key(), "keep"), IsOk());
  }
  // Two entries in the quarantine (blobs damaged behind the store's back).
  for (int i : {1000, 1001}) {
    EXPECT_THAT((*store)->Publish(MakeRecord(i), MakeCubin(2000 + i, i)), IsOk());
    auto* db = (*store)->raw_db_for_testing();
    EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), (*store)->column_family_for_testing("blobs"),
                        std::string(AsBytes(Sha256(MakeCubin(2000 + i, i)))), "bad")
                    .ok());
    EXPECT_EQ(*(*store)->Lookup(MakeRecord(i).key()), nullptr);
  }
  EXPECT_THAT((*store)->FlushAccessStats(), IsOk());
  auto* db = (*store)->raw_db_for_testing();
  rocksdb::FlushOptions fo;
  for (const char* cf : {"default", "records", "blobs", "refs", "stats", "pins", "quarantine"}) {
    EXPECT_TRUE(db->Flush(fo, (*store)->column_family_for_testing(cf)).ok());
  }
  std::vector<rocksdb::LiveFileMetaData> live;
  db->GetLiveFilesMetaData(&live);
  for (const auto& f : live) files[f.column_family_name].push_back(path + f.name);
  EXPECT_THAT((*store)->Close(), IsOk());
  return files;
}

// Flips bit 3 of the byte at `offset` (inside the first data block).
void FlipByte(const std::string& file, size_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << file;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x08;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

class FlippedByte : public ::testing::TestWithParam<std::string> {};

// Issue 17.2: one flipped bit in the records table answered DATA_LOSS for
// its specs forever and failed every scan (ls, stats, verify, export, gc,
// invalidate); in the stats table it broke ls.
TEST_P(FlippedByte, DamageIsAMissScansSkipAndReportAndTheStoreHeals) {
  const std::string cf = GetParam();
  TempDir dir;
  const std::string path = dir.Sub("store");
  auto files = BuildStore(path);
  ASSERT_FALSE(files[cf].empty()) << "no table file for " << cf;
  for (const auto& f : files[cf]) FlipByte(f, 20);

  for (int round = 0; round < 2; ++round) {  // and again after a restart
    auto store = Store::Open(path, Quiet());
    ASSERT_THAT(store, IsOk()) << "round " << round;
    Store& s = **store;
    // Every lookup answers: the right bytes or a miss, never an error.
    std::vector<int> missed;
    for (int i = 0; i < kEntries; ++i) {
      auto e = s.Lookup(MakeRecord(i).key());
      ASSERT_THAT(e, IsOk()) << cf << ", entry " << i;
      if (*e == nullptr) {
        missed.push_back(i);
      } else {
        ASSERT_EQ((*e)->cubin, MakeCubin(2000 + i, i)) << cf << ", entry " << i;
      }
    }
    if (cf == "records" || cf == "blobs") {
      if (round == 0) EXPECT_THAT(missed, Not(IsEmpty())) << cf;
      EXPECT_LT(missed.size(), static_cast<size_t>(kEntries / 2)) << cf;
    } else {
      // Damage elsewhere costs no entry.
      EXPECT_THAT(missed, IsEmpty()) << cf;
    }
    // Every scan finishes.
    v1::ListResponse page;
    std::string token;
    do {
      auto p = s.List(v1::Filter(), 50, token);
      ASSERT_THAT(p, IsOk()) << cf;
      token = p->next_page_token();
    } while (!token.empty());
    ASSERT_THAT(s.Stats(), IsOk()) << cf;
    auto v = s.Verify();
    ASSERT_THAT(v, IsOk()) << cf;
    std::string bundle;
    auto x = s.Export(v1::Filter(), [&](std::string_view p) {
      bundle.append(p);
      return absl::OkStatus();
    });
    ASSERT_THAT(x, IsOk()) << cf;
    ASSERT_THAT(s.InvalidateArch("sm_does_not_exist"), IsOk()) << cf;
    ASSERT_THAT(s.InvalidateToolchain("0123456789abcdef"), IsOk()) << cf;
    ASSERT_THAT(s.Evict(uint64_t{1} << 40), IsOk()) << cf;
    ASSERT_THAT(s.CollectGarbage(), IsOk()) << cf;
    // The caller recompiles what missed; publishing it heals the entry.
    for (int i : missed) {
      ASSERT_THAT(s.Publish(MakeRecord(i), MakeCubin(2000 + i, i)), IsOk()) << cf << " " << i;
    }
    for (int i = 0; i < kEntries; ++i) ExpectServed(s, i);
    ASSERT_THAT(s.Close(), IsOk());
  }
}

INSTANTIATE_TEST_SUITE_P(EveryColumnFamily, FlippedByte,
                         ::testing::Values("default", "records", "blobs", "refs", "stats", "pins",
                                           "quarantine"));

TEST(FlippedByte, ScansReportTheRangesTheySkipped) {
  TempDir dir;
  const std::string path = dir.Sub("store");
  auto files = BuildStore(path);
  for (const auto& f : files["records"]) FlipByte(f, 20);
  auto store = Store::Open(path, Quiet());
  ASSERT_THAT(store, IsOk());
  auto list = (*store)->List(v1::Filter(), 1000);
  ASSERT_THAT(list, IsOk());
  EXPECT_THAT(list->unreadable(), Not(IsEmpty()));
  EXPECT_GT(list->entries_size(), kEntries / 2);
  auto stats = (*store)->Stats();
  ASSERT_THAT(stats, IsOk());
  ASSERT_THAT(stats->unreadable(), Not(IsEmpty()));
  EXPECT_THAT(stats->unreadable(0), HasSubstr("records: keys"));
  EXPECT_THAT(stats->unreadable(0), HasSubstr("checksum"));
  auto v = (*store)->Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_THAT(v->unreadable(), Not(IsEmpty()));
}

// A compaction that meets the damaged file used to stop every write for
// good (RocksDB's paranoid background error); the store stays writable.
TEST(FlippedByte, ACompactionOverDamageLeavesTheStoreWritable) {
  TempDir dir;
  const std::string path = dir.Sub("store");
  auto files = BuildStore(path);
  for (const auto& f : files["records"]) FlipByte(f, 20);
  auto store = Store::Open(path, Quiet());
  ASSERT_THAT(store, IsOk());
  auto* db = (*store)->raw_db_for_testing();
  rocksdb::CompactRangeOptions cro;
  cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  auto cs = db->CompactRange(cro, (*store)->column_family_for_testing("records"), nullptr, nullptr);
  EXPECT_TRUE(cs.IsCorruption()) << cs.ToString();
  EXPECT_THAT((*store)->damage(), HasSubstr("kcache repair"));
  ASSERT_THAT((*store)->Publish(MakeRecord(500), MakeCubin(2500, 500)), IsOk());
  ExpectServed(**store, 500);
  auto stats = (*store)->Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_THAT(stats->store_damage(), HasSubstr("damaged table file"));
  ASSERT_THAT((*store)->Close(), IsOk());

  // `kcache repair` removes the damaged file; what it held is recompiled.
  auto r = Store::Repair(path);
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->moved_to_lost, Not(IsEmpty()));
  store = Store::Open(path, Quiet());
  ASSERT_THAT(store, IsOk());
  for (int i = 0; i < kEntries; ++i) {
    auto e = (*store)->Lookup(MakeRecord(i).key());
    ASSERT_THAT(e, IsOk());
    if (*e == nullptr) {
      ASSERT_THAT((*store)->Publish(MakeRecord(i), MakeCubin(2000 + i, i)), IsOk());
    }
    ExpectServed(**store, i);
  }
  ExpectServed(**store, 500);
  cs = (*store)->raw_db_for_testing()->CompactRange(
      cro, (*store)->column_family_for_testing("records"), nullptr, nullptr);
  EXPECT_TRUE(cs.ok()) << cs.ToString();
  EXPECT_THAT((*store)->damage(), IsEmpty());
  auto v = (*store)->Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_THAT(v->unreadable(), IsEmpty());
  ASSERT_THAT((*store)->Close(), IsOk());
}

// A flipped byte in a table file's footer: RocksDB cannot open the file, so
// the store refuses to open (naming the repair) instead of serving without
// it; `repair` moves the file to lost/ and the store serves again.
TEST(FlippedByte, ADamagedTableFooterIsRefusedAtOpenAndRepairMovesItAside) {
  TempDir dir;
  const std::string path = dir.Sub("store");
  auto files = BuildStore(path);
  ASSERT_EQ(files["records"].size(), 1u);
  const std::string table = files["records"][0];
  FlipByte(table, fs::file_size(table) - 3);  // inside the footer's magic number
  auto store = Store::Open(path, Quiet());
  ASSERT_THAT(store, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(store.status().message(), HasSubstr("damaged"));
  EXPECT_THAT(store.status().message(), HasSubstr("kcache repair"));
  EXPECT_TRUE(fs::exists(table));  // nothing changed

  auto r = Store::Repair(path);
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->moved_to_lost.size(), 1u);
  EXPECT_THAT(r->moved_to_lost[0], HasSubstr(fs::path(table).filename().string()));
  store = Store::Open(path, Quiet());
  ASSERT_THAT(store, IsOk());
  // Every record was in that file: all are misses now, recompiled and served.
  for (int i = 0; i < kEntries; ++i) {
    auto e = (*store)->Lookup(MakeRecord(i).key());
    ASSERT_THAT(e, IsOk());
    EXPECT_EQ(*e, nullptr);
    ASSERT_THAT((*store)->Publish(MakeRecord(i), MakeCubin(2000 + i, i)), IsOk());
    ExpectServed(**store, i);
  }
  auto v = (*store)->Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->corrupt(), 0u);
  EXPECT_THAT(v->unreadable(), IsEmpty());
}

// --- Lost metadata files ---------------------------------------------------------

std::vector<std::string> Files(const std::string& dir, std::string_view prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with(prefix)) out.push_back(e.path().string());
  }
  return out;
}

// Issue 17.3: without CURRENT the next start created an empty store in the
// directory and RocksDB deleted every old table file.
TEST(LostMetadata, AMissingCurrentIsRefusedNothingIsDeletedAndRepairBringsItAllBack) {
  TempDir dir;
  const std::string path = dir.Sub("store");
  BuildStore(path);
  const auto tables = Files(path, "0");
  fs::remove(path + "/CURRENT");
  for (int attempt = 0; attempt < 3; ++attempt) {  // systemd restarts it
    auto store = Store::Open(path, Quiet());
    ASSERT_THAT(store, StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(store.status().message(), HasSubstr("CURRENT file is missing"));
    EXPECT_THAT(store.status().message(), HasSubstr("kcache repair --store " + path));
    StoreOptions ro = Quiet();
    ro.read_only = true;
    EXPECT_THAT(Store::Open(path, ro), StatusIs(absl::StatusCode::kFailedPrecondition));
  }
  EXPECT_EQ(Files(path, "0"), tables);
  EXPECT_FALSE(fs::exists(path + "/CURRENT"));

  auto r = Store::Repair(path);
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->moved_to_lost, IsEmpty());
  EXPECT_EQ(r->entries, static_cast<uint64_t>(kEntries));
  auto store = Store::Open(path, Quiet());
  ASSERT_THAT(store, IsOk());
  for (int i = 0; i < kEntries; ++i) ExpectServed(**store, i);
  auto stats = (*store)->Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->pinned(), static_cast<uint64_t>(kEntries / 10));
  EXPECT_EQ(stats->quarantined(), 2u);
}

TEST(LostMetadata, AMissingManifestIsRefusedWithTheRepairAndRepairWorks) {
  TempDir dir;
  const std::string path = dir.Sub("store");
  BuildStore(path);
  for (const auto& m : Files(path, "MANIFEST-")) fs::remove(m);
  auto store = Store::Open(path, Quiet());
  ASSERT_THAT(store, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(store.status().message(), HasSubstr("damaged"));
  EXPECT_THAT(store.status().message(), HasSubstr("kcache repair"));
  ASSERT_THAT(Store::Repair(path), IsOk());
  store = Store::Open(path, Quiet());
  ASSERT_THAT(store, IsOk());
  for (int i = 0; i < kEntries; ++i) ExpectServed(**store, i);
}

TEST(LostMetadata, RepairRefusesAStoreInUseAndAnEmptyDirectory) {
  TempDir dir;
  const std::string path = dir.Sub("store");
  auto store = Store::Open(path, Quiet());
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT((*store)->Publish(MakeRecord(1), MakeCubin(2001, 1)), IsOk());
  EXPECT_THAT(Store::Repair(path), Not(IsOk()));
  ExpectServed(**store, 1);
  fs::create_directories(dir.Sub("empty"));
  EXPECT_THAT(Store::Repair(dir.Sub("empty")), StatusIs(absl::StatusCode::kNotFound));
}

// --- A record under the wrong key (issue 17.10) -------------------------------------

TEST(WrongKey, ARecordStoredUnderAnotherKeyIsNeverServedAndVerifyReportsIt) {
  TempDir dir;
  auto store = Store::Open(dir.Sub("store"), Quiet());
  ASSERT_THAT(store, IsOk());
  for (int i = 0; i < 3; ++i) {
    ASSERT_THAT((*store)->Publish(MakeRecord(i), MakeCubin(2000 + i, i)), IsOk());
  }
  // Entry 1's key now holds entry 2's (valid, digest-correct) record.
  auto* db = (*store)->raw_db_for_testing();
  auto* records = (*store)->column_family_for_testing("records");
  std::string raw2;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), records, MakeRecord(2).key(), &raw2).ok());
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), records, MakeRecord(1).key(), raw2).ok());
  auto v = (*store)->Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->corrupt(), 1u);
  ASSERT_EQ(v->quarantined_keys_size(), 1);
  EXPECT_EQ(v->quarantined_keys(0), MakeRecord(1).key());
  EXPECT_EQ(*(*store)->Lookup(MakeRecord(1).key()), nullptr);
  ExpectServed(**store, 0);
  ExpectServed(**store, 2);

  // And on the lookup path directly.
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), records, MakeRecord(0).key(), raw2).ok());
  EXPECT_EQ(*(*store)->Lookup(MakeRecord(0).key()), nullptr);
  EXPECT_EQ((*store)->Stats()->quarantined(), 2u);
}

}  // namespace
}  // namespace kcache
