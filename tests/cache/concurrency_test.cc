// 16 threads publish and look up shared and private keys while another
// thread keeps evicting and collecting garbage. No lookup may return torn or
// wrong bytes, no entry may lose its blob, and once evictions stop every
// published entry is present and verifies. Latches and barriers, no sleeps.
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "cache/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::IsOk;
using ::kcache::testing::MakeCubin;
using ::kcache::testing::MakeRecord;
using ::kcache::testing::TempDir;

constexpr int kThreads = 16;
constexpr int kShared = 24;      // keys every thread publishes and reads
constexpr int kPrivate = 6;      // keys only one thread publishes
constexpr int kIterations = 60;  // per thread

// Key n's cubin. Shared keys 0..kShared-1 pair up onto 12 cubins, so blobs
// are shared between keys too (n and n + 12 have the same bytes).
std::string CubinFor(int n) { return MakeCubin(2048 + (n % 12) * 64, n < kShared ? n % 12 : n); }

TEST(ConcurrencyTest, PublishLookupEvictRace) {
  TempDir dir;
  StoreOptions o;
  o.hot_cache_bytes = size_t{32} * 1024;  // small: inserts and evictions race too
  o.stats_flush_interval = absl::Milliseconds(1);
  auto opened = Store::Open(dir.Sub("store"), o);
  ASSERT_THAT(opened, IsOk());
  Store& store = **opened;

  std::atomic<bool> stop_evicting{false};
  std::atomic<int> bad{0}, served{0}, misses{0}, evictions{0};
  absl::Barrier* start = new absl::Barrier(kThreads + 1);
  absl::BlockingCounter phase1_done(kThreads);
  // Phase 2 starts only once the evictor has stopped (the main thread joins it
  // before it reaches this barrier).
  absl::Barrier* phase2 = new absl::Barrier(kThreads + 1);

  std::thread evictor([&] {
    if (start->Block()) delete start;
    while (!stop_evicting.load()) {
      auto r = store.Evict(uint64_t{8} * 1024, absl::ZeroDuration());
      if (!r.ok()) {
        ADD_FAILURE() << r.status();
        break;
      }
      evictions += static_cast<int>(r->evicted_entries());
      if (!store.CollectGarbage().ok()) ++bad;
    }
  });

  auto check = [&](int n, const absl::StatusOr<EntryRef>& got) {
    if (!got.ok()) {
      ADD_FAILURE() << got.status();
      ++bad;
      return;
    }
    if (*got == nullptr) {
      ++misses;  // evicted: allowed while the evictor runs
      return;
    }
    ++served;
    if ((*got)->cubin != CubinFor(n) || (*got)->record.key() != MakeRecord(n).key()) ++bad;
  };

  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (start->Block()) delete start;
      for (int i = 0; i < kIterations; ++i) {
        const int shared = (t * 7 + i) % kShared;
        const int mine = kShared + t * kPrivate + i % kPrivate;
        for (int n : {shared, mine}) {
          if (!store.Publish(MakeRecord(n), CubinFor(n)).ok()) ++bad;
        }
        check(shared, store.Lookup(MakeRecord(shared).key()));
        check(mine, store.Lookup(MakeRecord(mine).key()));
        const int other = (shared * 5 + t) % kShared;
        check(other, store.Lookup(MakeRecord(other).key()));
      }
      phase1_done.DecrementCount();
      // Phase 2, evictions stopped: publish everything once more, then every
      // key of every thread must be served.
      if (phase2->Block()) delete phase2;
      for (int n = kShared + t * kPrivate; n < kShared + (t + 1) * kPrivate; ++n) {
        if (!store.Publish(MakeRecord(n), CubinFor(n)).ok()) ++bad;
      }
      if (t < kShared) {
        for (int n = t; n < kShared; n += kThreads) {
          if (!store.Publish(MakeRecord(n), CubinFor(n)).ok()) ++bad;
        }
      }
    });
  }
  phase1_done.Wait();
  stop_evicting = true;
  evictor.join();
  if (phase2->Block()) delete phase2;
  for (auto& th : threads) th.join();

  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(served.load(), 0);
  EXPECT_GT(evictions.load(), 0) << "the evictor never evicted: the race was not exercised";
  const int total = kShared + kThreads * kPrivate;
  for (int n = 0; n < total; ++n) {
    auto got = store.Lookup(MakeRecord(n).key());
    ASSERT_THAT(got, IsOk());
    ASSERT_NE(*got, nullptr) << "entry " << n << " lost";
    EXPECT_EQ((*got)->cubin, CubinFor(n)) << n;
  }
  auto v = store.Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->checked(), static_cast<uint64_t>(total));
  EXPECT_EQ(v->corrupt(), 0u);
  auto s = store.Stats();
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->quarantined(), 0u);
  EXPECT_EQ(s->entries(), static_cast<uint64_t>(total));
  // Refs are exact: dropping everything leaves no blob behind.
  ASSERT_THAT(store.InvalidateCreatedBefore(INT64_MAX), IsOk());
  ASSERT_THAT(store.CollectGarbage(), IsOk());
  auto after = store.Stats();
  EXPECT_EQ(after->entries(), 0u);
  std::unique_ptr<rocksdb::Iterator> it(store.raw_db_for_testing()->NewIterator(
      rocksdb::ReadOptions(), store.column_family_for_testing("blobs")));
  it->SeekToFirst();
  EXPECT_FALSE(it->Valid());
}

}  // namespace
}  // namespace kcache
