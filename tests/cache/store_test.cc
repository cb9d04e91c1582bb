// Store unit tests against a real RocksDB in a fresh directory per test.
#include "cache/store.h"

#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/record_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::IsOk;
using ::kcache::testing::MakeCubin;
using ::kcache::testing::MakeRecord;
using ::kcache::testing::MakeToolchain;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

class StoreTest : public ::testing::Test {
 protected:
  StoreOptions Opts() {
    StoreOptions o;
    o.stats_flush_interval = absl::ZeroDuration();  // flushed explicitly
    o.now_unix_ms = [this] { return now_ms_.load(); };
    return o;
  }
  std::unique_ptr<Store> OpenStore(StoreOptions o) {
    auto s = Store::Open(dir_.Sub("store"), std::move(o));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  std::unique_ptr<Store> OpenStore() { return OpenStore(Opts()); }

  TempDir dir_;
  std::atomic<int64_t> now_ms_{1'700'000'000'000};
};

TEST_F(StoreTest, PublishThenLookupReturnsTheSameBytes) {
  auto store = OpenStore();
  auto rec = MakeRecord(1);
  std::string cubin = MakeCubin(4096, 1);
  auto published = store->Publish(rec, cubin);
  ASSERT_THAT(published, IsOk());
  EXPECT_EQ((*published)->record.cubin_sha256(), std::string(AsBytes(Sha256(cubin))));
  EXPECT_EQ((*published)->record.cubin_size(), cubin.size());
  EXPECT_EQ((*published)->record.toolchain().id(), ToolchainIdHex(rec.toolchain()));
  EXPECT_EQ((*published)->record.created_unix_ms(), now_ms_.load());

  auto got = store->Lookup(rec.key());
  ASSERT_THAT(got, IsOk());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->cubin, cubin);
  EXPECT_EQ((*got)->record.arch(), "sm_90a");
}

TEST_F(StoreTest, MissingKeyIsNotAnError) {
  auto store = OpenStore();
  auto got = store->Lookup(MakeRecord(7).key());
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, nullptr);
  EXPECT_THAT(store->Lookup("short"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreTest, SurvivesReopenAndServesFromDiskWithoutHotLayer) {
  auto rec = MakeRecord(2);
  std::string cubin = MakeCubin(10000, 2);
  {
    auto store = OpenStore();
    ASSERT_THAT(store->Publish(rec, cubin), IsOk());
    KC_ASSERT_OK(store->Close());
  }
  auto o = Opts();
  o.hot_cache_bytes = 0;
  auto store = OpenStore(o);
  auto got = store->Lookup(rec.key());
  ASSERT_THAT(got, IsOk());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->cubin, cubin);
}

TEST_F(StoreTest, PublishRejectsBadInputNamingTheField) {
  auto store = OpenStore();
  auto rec = MakeRecord(3);
  EXPECT_THAT(store->Publish(rec, ""), StatusIs(absl::StatusCode::kInvalidArgument));
  auto wrong_digest = rec;
  wrong_digest.set_cubin_sha256(std::string(32, 'x'));
  auto s = store->Publish(wrong_digest, "abc");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("cubin_sha256"));
  auto wrong_toolchain = rec;
  *wrong_toolchain.mutable_toolchain() = MakeToolchain("12.8");
  s = store->Publish(wrong_toolchain, "abc");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("toolchain"));
  auto bad_key = rec;
  bad_key.set_key("nope");
  EXPECT_THAT(store->Publish(bad_key, "abc"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreTest, SharedBlobIsDeduplicatedAndKeptWhileReferenced) {
  auto store = OpenStore();
  std::string cubin = MakeCubin(5000, 9);
  auto a = MakeRecord(10), b = MakeRecord(11);
  ASSERT_THAT(store->Publish(a, cubin), IsOk());
  ASSERT_THAT(store->Publish(b, cubin), IsOk());
  auto stats = store->Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->entries(), 2u);
  EXPECT_EQ(stats->blobs(), 1u);
  EXPECT_EQ(stats->blob_bytes(), cubin.size());

  auto removed = store->InvalidateKey(a.key());
  ASSERT_THAT(removed, IsOk());
  EXPECT_EQ(removed->removed_entries(), 1u);
  EXPECT_EQ(removed->freed_bytes(), 0u);  // b still uses the blob
  auto got = store->Lookup(b.key());
  ASSERT_THAT(got, IsOk());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->cubin, cubin);

  removed = store->InvalidateKey(b.key());
  ASSERT_THAT(removed, IsOk());
  EXPECT_GT(removed->freed_bytes(), 0u);
  EXPECT_THAT(store->InvalidateKey(b.key()), StatusIs(absl::StatusCode::kNotFound));
  // No blob is left behind.
  auto* blobs = store->column_family_for_testing("blobs");
  std::unique_ptr<rocksdb::Iterator> it(
      store->raw_db_for_testing()->NewIterator(rocksdb::ReadOptions(), blobs));
  it->SeekToFirst();
  EXPECT_FALSE(it->Valid());
}

TEST_F(StoreTest, RepublishWithAnotherCubinReleasesTheOldBlob) {
  auto store = OpenStore();
  auto rec = MakeRecord(12);
  ASSERT_THAT(store->Publish(rec, MakeCubin(3000, 1)), IsOk());
  ASSERT_THAT(store->Publish(rec, MakeCubin(3000, 2)), IsOk());
  auto stats = store->Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->entries(), 1u);
  EXPECT_EQ(stats->blobs(), 1u);
  auto got = store->Lookup(rec.key());
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ((*got)->cubin, MakeCubin(3000, 2));
  EXPECT_THAT(store->CollectGarbage(), IsOk());
  auto* blobs = store->column_family_for_testing("blobs");
  std::unique_ptr<rocksdb::Iterator> it(
      store->raw_db_for_testing()->NewIterator(rocksdb::ReadOptions(), blobs));
  int n = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) ++n;
  EXPECT_EQ(n, 1);
}

TEST_F(StoreTest, AccessStatsAreBatchedAndFlushed) {
  auto store = OpenStore();
  auto rec = MakeRecord(13);
  ASSERT_THAT(store->Publish(rec, MakeCubin(100, 1)), IsOk());
  for (int i = 0; i < 5; ++i) ASSERT_THAT(store->Lookup(rec.key()), IsOk());
  // Nothing on disk yet: the hits are in memory.
  std::string raw;
  auto* stats_cf = store->column_family_for_testing("stats");
  ASSERT_TRUE(
      store->raw_db_for_testing()->Get(rocksdb::ReadOptions(), stats_cf, rec.key(), &raw).ok());
  v1::AccessStats on_disk;
  ASSERT_TRUE(on_disk.ParseFromString(raw));
  EXPECT_EQ(on_disk.hits(), 0u);
  // Inspect sees them anyway.
  auto summary = store->Inspect(rec.key());
  ASSERT_THAT(summary, IsOk());
  ASSERT_TRUE(summary->has_value());
  EXPECT_EQ((*summary)->access().hits(), 5u);
  EXPECT_EQ((*summary)->access().last_used_unix_ms(), now_ms_.load());
  KC_ASSERT_OK(store->FlushAccessStats());
  ASSERT_TRUE(
      store->raw_db_for_testing()->Get(rocksdb::ReadOptions(), stats_cf, rec.key(), &raw).ok());
  ASSERT_TRUE(on_disk.ParseFromString(raw));
  EXPECT_EQ(on_disk.hits(), 5u);
  // Close flushes too, and a republish keeps the count.
  ASSERT_THAT(store->Lookup(rec.key()), IsOk());
  KC_ASSERT_OK(store->Close());
  store = OpenStore();
  ASSERT_THAT(store->Publish(rec, MakeCubin(100, 1)), IsOk());
  summary = store->Inspect(rec.key());
  EXPECT_EQ((*summary)->access().hits(), 6u);
}

TEST_F(StoreTest, BackgroundFlusherWritesStats) {
  auto o = Opts();
  o.stats_flush_interval = absl::Milliseconds(1);
  auto store = OpenStore(o);
  auto rec = MakeRecord(14);
  ASSERT_THAT(store->Publish(rec, MakeCubin(100, 1)), IsOk());
  ASSERT_THAT(store->Lookup(rec.key()), IsOk());
  // Polls the disk (not a sleep-for-correctness: the flusher's interval is
  // 1 ms and the loop ends as soon as the value lands).
  auto* stats_cf = store->column_family_for_testing("stats");
  for (int i = 0; i < 100000; ++i) {
    std::string raw;
    v1::AccessStats a;
    if (store->raw_db_for_testing()->Get(rocksdb::ReadOptions(), stats_cf, rec.key(), &raw).ok() &&
        a.ParseFromString(raw) && a.hits() == 1) {
      SUCCEED();
      return;
    }
    std::this_thread::yield();
  }
  FAIL() << "the background flusher never wrote the hit";
}

TEST_F(StoreTest, ListFiltersAndPages) {
  auto store = OpenStore();
  auto t13 = MakeToolchain("13.0"), t12 = MakeToolchain("12.8");
  for (int i = 0; i < 30; ++i) {
    now_ms_ = 1000 + i;
    auto r = MakeRecord(i, i < 20 ? t13 : t12, i % 3 == 0 ? "sm_80" : "sm_90a");
    ASSERT_THAT(store->Publish(r, MakeCubin(64, i)), IsOk());
  }
  KC_ASSERT_OK(store->Pin(MakeRecord(4, t13, "sm_90a").key(), "hot"));
  now_ms_ = 5000;
  ASSERT_THAT(store->Lookup(MakeRecord(5, t13, "sm_90a").key()), IsOk());

  auto count = [&](const v1::Filter& f, uint32_t page) {
    size_t n = 0;
    std::string token, last;
    do {
      auto p = store->List(f, page, token);
      EXPECT_THAT(p, IsOk());
      if (!p.ok()) return size_t{0};
      EXPECT_LE(p->entries_size(), static_cast<int>(page));
      for (const auto& e : p->entries()) {
        EXPECT_GT(e.record().key(), last);  // key order, no repeats
        last = e.record().key();
        ++n;
      }
      token = p->next_page_token();
    } while (!token.empty());
    return n;
  };
  v1::Filter all;
  EXPECT_EQ(count(all, 7), 30u);
  EXPECT_EQ(count(all, 1000), 30u);
  v1::Filter f;
  f.set_toolchain_id(ToolchainIdHex(t12));
  EXPECT_EQ(count(f, 3), 10u);
  f = {};
  f.set_arch("sm_80");
  EXPECT_EQ(count(f, 4), 10u);
  f = {};
  f.set_mask_kind("causal");
  EXPECT_EQ(count(f, 5), 15u);
  f.set_mask_kind("none");
  EXPECT_EQ(count(f, 5), 15u);
  f = {};
  f.set_created_before_unix_ms(1010);
  EXPECT_EQ(count(f, 4), 10u);
  f = {};
  f.set_pinned(v1::Filter::PINNED_ONLY);
  EXPECT_EQ(count(f, 4), 1u);
  f.set_pinned(v1::Filter::PINNED_NONE);
  EXPECT_EQ(count(f, 4), 29u);
  f = {};
  f.set_unused_since_unix_ms(4000);
  EXPECT_EQ(count(f, 4), 29u);
  f = {};
  f.set_key_prefix(MakeRecord(4, t13, "sm_90a").key().substr(0, 20));
  EXPECT_EQ(count(f, 4), 1u);
  f = {};
  f.set_toolchain_id("nothex");
  EXPECT_THAT(store->List(f), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store->List({}, 10, "garbage"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreTest, ResolveKeyPrefix) {
  auto store = OpenStore();
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) {
    auto r = MakeRecord(i);
    keys.push_back(r.key());
    ASSERT_THAT(store->Publish(r, MakeCubin(64, i)), IsOk());
  }
  const std::string hex = KeyToHex(keys[3]);
  EXPECT_EQ(*store->ResolveKeyPrefix(hex), keys[3]);
  EXPECT_EQ(*store->ResolveKeyPrefix(hex.substr(0, 30)), keys[3]);
  // 18 hex digits = version + toolchain id: shared by all 40.
  auto amb = store->ResolveKeyPrefix(hex.substr(0, 18));
  EXPECT_THAT(amb, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(amb.status().message()), HasSubstr("ambiguous"));
  EXPECT_THAT(store->ResolveKeyPrefix("02"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store->ResolveKeyPrefix("0g"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreTest, StatsByToolchainAndArch) {
  auto store = OpenStore();
  auto t13 = MakeToolchain("13.0"), t12 = MakeToolchain("12.8");
  ASSERT_THAT(store->Publish(MakeRecord(1, t13, "sm_90a"), MakeCubin(100, 1)), IsOk());
  ASSERT_THAT(store->Publish(MakeRecord(2, t13, "sm_90a"), MakeCubin(200, 2)), IsOk());
  ASSERT_THAT(store->Publish(MakeRecord(3, t13, "sm_80"), MakeCubin(300, 3)), IsOk());
  ASSERT_THAT(store->Publish(MakeRecord(4, t12, "sm_90a"), MakeCubin(400, 4)), IsOk());
  KC_ASSERT_OK(store->Pin(MakeRecord(1, t13, "sm_90a").key(), ""));
  auto s = store->Stats();
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->entries(), 4u);
  EXPECT_EQ(s->blobs(), 4u);
  EXPECT_EQ(s->blob_bytes(), 1000u);
  EXPECT_EQ(s->pinned(), 1u);
  EXPECT_EQ(s->quarantined(), 0u);
  ASSERT_EQ(s->groups_size(), 3);
  uint64_t total = 0;
  for (const auto& g : s->groups()) {
    total += g.entries();
    if (g.toolchain_id() == ToolchainIdHex(t13) && g.arch() == "sm_90a") {
      EXPECT_EQ(g.entries(), 2u);
      EXPECT_EQ(g.bytes(), 300u);
    }
  }
  EXPECT_EQ(total, 4u);
}

TEST_F(StoreTest, EvictsLeastRecentlyUsedNeverPinnedOrRecent) {
  auto store = OpenStore();
  // 10 entries of 1000 bytes, created at t = 0..9 s.
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) {
    now_ms_ = 1'000'000 + i * 1000;
    auto r = MakeRecord(i);
    keys.push_back(r.key());
    ASSERT_THAT(store->Publish(r, MakeCubin(1000, i)), IsOk());
  }
  KC_ASSERT_OK(store->Pin(keys[0], "keep"));  // the oldest, but pinned
  now_ms_ = 1'000'000 + 20'000;
  ASSERT_THAT(store->Lookup(keys[1]), IsOk());  // used just now: in grace
  now_ms_ = 1'000'000 + 30'000;
  // Grace 5 s: keys[1] (used at 20 s... 10 s ago) is not protected; use a
  // longer grace so that it is.
  auto r = store->Evict(3000, absl::Seconds(15));
  ASSERT_THAT(r, IsOk());
  // 10000 bytes -> 3000: 7 entries must go; protected: keys[0] (pinned),
  // keys[1] (used 10 s ago). Oldest first: keys[2..8].
  EXPECT_EQ(r->evicted_entries(), 7u);
  EXPECT_EQ(r->freed_bytes(), 7000u);
  for (int i = 0; i < 10; ++i) {
    auto got = store->Lookup(keys[i]);
    ASSERT_THAT(got, IsOk());
    const bool expect_present = i == 0 || i == 1 || i == 9;
    EXPECT_EQ(*got != nullptr, expect_present) << i;
  }
  // Everything left is protected or within budget now.
  r = store->Evict(0, absl::Hours(1));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->evicted_entries(), 0u);
  KC_ASSERT_OK(store->Unpin(keys[0]));
  now_ms_ += 10'000'000;
  r = store->Evict(0, absl::Seconds(1));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->evicted_entries(), 3u);
  EXPECT_THAT(store->Pin(keys[0], ""), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(StoreTest, InvalidateToolchainArchAndAge) {
  auto store = OpenStore();
  auto t13 = MakeToolchain("13.0"), t12 = MakeToolchain("12.8");
  std::string shared = MakeCubin(777, 77);
  for (int i = 0; i < 20; ++i) {
    now_ms_ = 1000 + i;
    ASSERT_THAT(store->Publish(MakeRecord(i, t13, i % 2 ? "sm_80" : "sm_90a"), MakeCubin(100, i)),
                IsOk());
    ASSERT_THAT(
        store->Publish(MakeRecord(i, t12, "sm_90a"), i == 0 ? shared : MakeCubin(50, 100 + i)),
        IsOk());
  }
  // One t13 entry shares its blob with a t12 entry.
  ASSERT_THAT(store->Publish(MakeRecord(99, t13), shared), IsOk());
  ASSERT_THAT(store->Lookup(MakeRecord(3, t12).key()), IsOk());  // now in the hot layer

  auto r = store->InvalidateToolchain(ToolchainIdHex(t12));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->removed_entries(), 20u);
  EXPECT_EQ(r->freed_bytes(), 19u * 50);                         // the shared blob stays
  EXPECT_EQ(*store->Lookup(MakeRecord(3, t12).key()), nullptr);  // hot layer invalidated
  auto got = store->Lookup(MakeRecord(99, t13).key());
  ASSERT_THAT(got, IsOk());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->cubin, shared);

  r = store->InvalidateArch("sm_80");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->removed_entries(), 10u);
  v1::InvalidateRequest req;
  req.set_created_before_unix_ms(1010);
  r = store->Invalidate(req);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->removed_entries(), 5u);  // i = 0, 2, 4, 6, 8
  auto s = store->Stats();
  EXPECT_EQ(s->entries(), 6u);  // i = 10, 12, ..., 18 and 99
  EXPECT_THAT(store->Invalidate(v1::InvalidateRequest()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store->InvalidateToolchain("xyz"), StatusIs(absl::StatusCode::kInvalidArgument));
  // GC finds nothing left over.
  auto freed = store->CollectGarbage();
  ASSERT_THAT(freed, IsOk());
  EXPECT_EQ(*freed, 0u);
}

TEST_F(StoreTest, ReadOnlyOpenServesAndRefusesWrites) {
  auto rec = MakeRecord(1);
  {
    auto store = OpenStore();
    ASSERT_THAT(store->Publish(rec, MakeCubin(100, 1)), IsOk());
  }
  auto o = Opts();
  o.read_only = true;
  auto ro = OpenStore(o);
  auto got = ro->Lookup(rec.key());
  ASSERT_THAT(got, IsOk());
  EXPECT_NE(*got, nullptr);
  EXPECT_THAT(ro->Publish(MakeRecord(2), "x"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ro->Evict(0), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ro->Stats(), IsOk());
  TempDir empty;
  EXPECT_THAT(Store::Open(empty.Sub("nothing"), o), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(StoreTest, SecondWriterInAnotherProcessGetsAClearError) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  // RocksDB's LOCK is a POSIX lock: held per process, so probe from a child.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto s = Store::Open(dir_.Sub("store"), StoreOptions{});
    bool ok = !s.ok() && absl::IsFailedPrecondition(s.status()) &&
              absl::StrContains(s.status().message(), "locked by another process");
    StoreOptions ro;
    ro.read_only = true;
    ro.stats_flush_interval = absl::ZeroDuration();
    auto r = Store::Open(dir_.Sub("store"), ro);
    ok = ok && r.ok();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST_F(StoreTest, HotLayerIsBoundedAndServesWithoutDisk) {
  auto o = Opts();
  o.hot_cache_bytes = size_t{10} * 1024;
  auto store = OpenStore(o);
  for (int i = 0; i < 20; ++i) {
    ASSERT_THAT(store->Publish(MakeRecord(i), MakeCubin(2000, i)), IsOk());
  }
  EXPECT_LE(store->hot_cache_for_testing().bytes(), 10u * 1024);
  EXPECT_GT(store->hot_cache_for_testing().size(), 0u);
  // The same object comes back on a hot hit: no copy, no disk.
  auto a = store->Lookup(MakeRecord(19).key());
  auto b = store->Lookup(MakeRecord(19).key());
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->get(), b->get());
}

}  // namespace
}  // namespace kcache
