// Damaged blobs and records, written behind the store's back through the raw
// RocksDB handle, are detected on every read path (lookup, verify, export),
// never returned, and land in the quarantine.
#include <string>

#include "cache/bundle.h"
#include "cache/digest.h"
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
using ::testing::HasSubstr;

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.stats_flush_interval = absl::ZeroDuration();
    // The in-memory layer would serve the bytes it verified before the damage;
    // these tests are about the disk read paths.
    o.hot_cache_bytes = 0;
    auto s = Store::Open(dir_.Sub("store"), o);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    for (int i = 0; i < 6; ++i) {
      records_.push_back(MakeRecord(i));
      cubins_.push_back(MakeCubin(3000 + i, i));
      ASSERT_THAT(store_->Publish(records_[i], cubins_[i]), IsOk());
    }
  }

  std::string Digest(int i) { return std::string(AsBytes(Sha256(cubins_[i]))); }

  // Flips one byte in the middle of entry i's stored blob.
  void DamageBlob(int i) {
    std::string bad = cubins_[i];
    bad[bad.size() / 2] ^= 0x5a;
    ASSERT_TRUE(store_->raw_db_for_testing()
                    ->Put(rocksdb::WriteOptions(), store_->column_family_for_testing("blobs"),
                          Digest(i), bad)
                    .ok());
  }

  v1::QuarantineInfo Quarantined(int i) {
    std::string raw;
    v1::QuarantineInfo q;
    auto s = store_->raw_db_for_testing()->Get(rocksdb::ReadOptions(),
                                               store_->column_family_for_testing("quarantine"),
                                               records_[i].key(), &raw);
    EXPECT_TRUE(s.ok()) << "entry " << i << " is not in the quarantine: " << s.ToString();
    EXPECT_TRUE(q.ParseFromString(raw));
    return q;
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
  std::vector<v1::KernelRecord> records_;
  std::vector<std::string> cubins_;
};

TEST_F(CorruptionTest, LookupNeverServesADamagedBlob) {
  DamageBlob(2);
  auto got = store_->Lookup(records_[2].key());
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, nullptr);
  auto q = Quarantined(2);
  EXPECT_THAT(q.reason(), HasSubstr("SHA-256"));
  EXPECT_EQ(q.record().key(), records_[2].key());
  EXPECT_EQ(store_->Stats()->quarantined(), 1u);
  EXPECT_EQ(store_->Stats()->entries(), 5u);
  // Still not served on a second try, and the others are fine.
  EXPECT_EQ(*store_->Lookup(records_[2].key()), nullptr);
  for (int i : {0, 1, 3, 4, 5}) {
    auto ok = store_->Lookup(records_[i].key());
    ASSERT_THAT(ok, IsOk());
    ASSERT_NE(*ok, nullptr);
    EXPECT_EQ((*ok)->cubin, cubins_[i]);
  }
  // The caller recompiles and republishes: served again.
  ASSERT_THAT(store_->Publish(records_[2], cubins_[2]), IsOk());
  auto again = store_->Lookup(records_[2].key());
  ASSERT_THAT(again, IsOk());
  ASSERT_NE(*again, nullptr);
  EXPECT_EQ((*again)->cubin, cubins_[2]);
}

TEST_F(CorruptionTest, MissingBlobAndGarbageRecordAreQuarantined) {
  ASSERT_TRUE(
      store_->raw_db_for_testing()
          ->Delete(rocksdb::WriteOptions(), store_->column_family_for_testing("blobs"), Digest(1))
          .ok());
  EXPECT_EQ(*store_->Lookup(records_[1].key()), nullptr);
  EXPECT_THAT(Quarantined(1).reason(), HasSubstr("missing"));

  ASSERT_TRUE(store_->raw_db_for_testing()
                  ->Put(rocksdb::WriteOptions(), store_->column_family_for_testing("records"),
                        records_[3].key(), "\xff\xff garbage")
                  .ok());
  EXPECT_EQ(*store_->Lookup(records_[3].key()), nullptr);
  Quarantined(3);
  EXPECT_EQ(store_->Stats()->quarantined(), 2u);
}

TEST_F(CorruptionTest, VerifyFindsEveryDamagedBlob) {
  DamageBlob(0);
  DamageBlob(4);
  auto v = store_->Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->checked(), 6u);
  EXPECT_EQ(v->corrupt(), 2u);
  EXPECT_THAT(v->quarantined_keys(),
              ::testing::UnorderedElementsAre(records_[0].key(), records_[4].key()));
  Quarantined(0);
  Quarantined(4);
  // A second pass is clean.
  v = store_->Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->checked(), 4u);
  EXPECT_EQ(v->corrupt(), 0u);
}

TEST_F(CorruptionTest, SharedDamagedBlobQuarantinesEveryRecordNamingIt) {
  auto twin = MakeRecord(100);
  ASSERT_THAT(store_->Publish(twin, cubins_[5]), IsOk());
  DamageBlob(5);
  auto v = store_->Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->corrupt(), 2u);
  EXPECT_EQ(*store_->Lookup(twin.key()), nullptr);
  // The bad bytes are gone, so a republish stores good ones.
  ASSERT_THAT(store_->Publish(twin, cubins_[5]), IsOk());
  EXPECT_EQ((*store_->Lookup(twin.key()))->cubin, cubins_[5]);
}

TEST_F(CorruptionTest, ExportLeavesDamagedEntriesOutAndQuarantinesThem) {
  DamageBlob(3);
  std::string bundle;
  auto r = store_->Export(v1::Filter(), [&](std::string_view piece) {
    bundle.append(piece);
    return absl::OkStatus();
  });
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exported, 5u);
  EXPECT_THAT(r->quarantined_keys, ::testing::ElementsAre(records_[3].key()));
  Quarantined(3);
  auto entries = DecodeBundle(bundle);
  ASSERT_THAT(entries, IsOk());
  ASSERT_EQ(entries->size(), 5u);
  for (const auto& e : *entries) {
    EXPECT_NE(e.record.key(), records_[3].key());
    EXPECT_EQ(std::string(AsBytes(Sha256(e.cubin))), e.record.cubin_sha256());
  }
}

}  // namespace
}  // namespace kcache
