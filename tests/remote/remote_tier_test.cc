// RemoteTier and RedisClient against a real redis-server: verified reads,
// refused bad entries, leases (wait, hand-over, takeover after expiry), and a
// Redis that goes away and comes back.
#include "cache/remote/remote_tier.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/digest.h"
#include "cache/record_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/common/redis_process.h"

namespace kcache {
namespace {

using ::kcache::testing::MakeRecord;
using ::kcache::testing::MakeToolchain;
using ::kcache::testing::RedisProcess;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;

Entry MakeEntry(uint64_t n) {
  Entry e;
  e.cubin = absl::StrCat("cubin bytes of kernel ", n, std::string(1000, 'x'));
  e.record = MakeRecord(n);
  e.record.set_format_version(kRecordFormatVersion);
  e.record.set_cubin_sha256(std::string(AsBytes(Sha256(e.cubin))));
  e.record.set_cubin_size(e.cubin.size());
  e.record.mutable_toolchain()->set_id(ToolchainIdHex(MakeToolchain()));
  return e;
}

RemoteTierOptions Options(const RedisProcess& redis, absl::Duration lease = absl::Seconds(10)) {
  RemoteTierOptions o;
  o.redis.address = *ParseRedisUrl(redis.url());
  o.redis.reconnect_interval = absl::Milliseconds(100);
  o.lease_ttl = lease;
  o.node_id = "test";
  return o;
}

void WaitConnected(RemoteTier& t) {
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (!t.client().connected() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(t.client().connected()) << t.client().last_error();
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(redis_.Start().ok()); }
  TempDir dir_;
  RedisProcess redis_{dir_.Sub("redis.log")};
};

TEST(RedisUrl, Parses) {
  auto a = ParseRedisUrl("redis://cache.example:6380/2");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "cache.example");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->db, 2);
  EXPECT_EQ(a->ToString(), "redis://cache.example:6380/2");
  EXPECT_EQ(ParseRedisUrl("redis://h")->port, 6379);
  EXPECT_THAT(ParseRedisUrl("http://h:1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseRedisUrl("redis://u:pw@h:1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseRedisUrl("redis://h:99999"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseRedisUrl("redis://h:1/x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseRedisUrl("redis://:1"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(RemoteTierTest, PublishedEntryIsFetchedVerified) {
  RemoteTier tier(Options(redis_));
  WaitConnected(tier);
  Entry e = MakeEntry(1);
  EXPECT_EQ(tier.Fetch(e.record.key()), nullptr);
  tier.Publish(e);
  EntryRef got = tier.Fetch(e.record.key());
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->cubin, e.cubin);
  EXPECT_EQ(got->record.key(), e.record.key());
  v1::RemoteTierStats s;
  tier.FillStats(&s);
  EXPECT_EQ(s.hits(), 1u);
  EXPECT_EQ(s.misses(), 1u);
  EXPECT_EQ(s.publishes(), 1u);
  EXPECT_EQ(s.bad_entries(), 0u);
  EXPECT_GT(s.bytes_read(), e.cubin.size());
  EXPECT_TRUE(s.connected());
}

TEST_F(RemoteTierTest, DamagedCubinAndRecordOfAnotherKeyAreRefused) {
  RemoteTier tier(Options(redis_));
  WaitConnected(tier);
  Entry a = MakeEntry(1), b = MakeEntry(2);
  tier.Publish(a);
  tier.Publish(b);
  std::string damaged = a.cubin;
  damaged[10] ^= 1;
  ASSERT_TRUE(
      tier.client()
          .Command({"SET", RemoteTier::BlobKey(a.record.key(), a.record.cubin_sha256()), damaged})
          .ok());
  // b's key now names a's (valid) record.
  ASSERT_TRUE(
      tier.client()
          .Command({"SET", RemoteTier::RecordKey(b.record.key()), a.record.SerializeAsString()})
          .ok());
  EXPECT_EQ(tier.Fetch(a.record.key()), nullptr);
  EXPECT_EQ(tier.Fetch(b.record.key()), nullptr);
  ASSERT_TRUE(
      tier.client().Command({"SET", RemoteTier::RecordKey(b.record.key()), "not a record"}).ok());
  EXPECT_EQ(tier.Fetch(b.record.key()), nullptr);
  v1::RemoteTierStats s;
  tier.FillStats(&s);
  EXPECT_EQ(s.bad_entries(), 3u);
  EXPECT_EQ(s.hits(), 0u);
  // Publishing again (what a node does after compiling) replaces them.
  tier.Publish(a);
  tier.Publish(b);
  ASSERT_NE(tier.Fetch(a.record.key()), nullptr);
  ASSERT_NE(tier.Fetch(b.record.key()), nullptr);
}

TEST_F(RemoteTierTest, WaiterGetsTheHoldersResult) {
  RemoteTier holder(Options(redis_)), waiter(Options(redis_));
  WaitConnected(holder);
  WaitConnected(waiter);
  Entry e = MakeEntry(3);
  SharedTier::Claim mine = holder.ClaimCompile(e.record.key(), absl::Now() + absl::Seconds(5));
  ASSERT_NE(mine.lease, nullptr);
  ASSERT_EQ(mine.entry, nullptr);
  SharedTier::Claim theirs;
  std::thread t(
      [&] { theirs = waiter.ClaimCompile(e.record.key(), absl::Now() + absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(200));
  holder.Publish(e);
  mine.lease.reset();
  t.join();
  ASSERT_NE(theirs.entry, nullptr);
  EXPECT_EQ(theirs.lease, nullptr);
  EXPECT_EQ(theirs.entry->cubin, e.cubin);
  v1::RemoteTierStats s;
  waiter.FillStats(&s);
  EXPECT_EQ(s.lease_waits(), 1u);
  EXPECT_EQ(s.takeovers(), 0u);
  EXPECT_EQ(s.leases(), 0u);
}

TEST_F(RemoteTierTest, ExpiredLeaseIsTakenOverAndRenewedLeaseIsNot) {
  RemoteTier a(Options(redis_, absl::Milliseconds(600))), b(Options(redis_));
  WaitConnected(a);
  WaitConnected(b);
  Entry e = MakeEntry(4);
  // A live holder renews: b waits past several TTLs and gets nothing.
  SharedTier::Claim held = a.ClaimCompile(e.record.key(), absl::Now() + absl::Seconds(5));
  ASSERT_NE(held.lease, nullptr);
  SharedTier::Claim none = b.ClaimCompile(e.record.key(), absl::Now() + absl::Seconds(2));
  EXPECT_EQ(none.lease, nullptr);
  EXPECT_EQ(none.entry, nullptr);
  held.lease.reset();
  // A dead holder's lease (set by hand, never renewed) expires: b takes over.
  ASSERT_TRUE(
      a.client()
          .Command({"SET", RemoteTier::LeaseKey(e.record.key()), "dead-node/1", "PX", "500"})
          .ok());
  absl::Time start = absl::Now();
  SharedTier::Claim taken = b.ClaimCompile(e.record.key(), absl::Now() + absl::Seconds(10));
  EXPECT_NE(taken.lease, nullptr);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  v1::RemoteTierStats s;
  b.FillStats(&s);
  EXPECT_EQ(s.wait_timeouts(), 1u);
  EXPECT_EQ(s.takeovers(), 1u);
  EXPECT_EQ(s.leases(), 1u);
}

TEST_F(RemoteTierTest, RedisDownIsAMissQuicklyAndComesBack) {
  RemoteTier tier(Options(redis_));
  WaitConnected(tier);
  Entry e = MakeEntry(5);
  tier.Publish(e);
  redis_.Stop(SIGKILL);
  absl::Time start = absl::Now();
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(tier.Fetch(e.record.key()), nullptr);
    SharedTier::Claim c = tier.ClaimCompile(e.record.key(), absl::Now() + absl::Seconds(30));
    EXPECT_EQ(c.lease, nullptr);
    EXPECT_EQ(c.entry, nullptr);
    tier.Publish(e);
  }
  // Bounded by one timeout (the call that found it down), then immediate.
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_FALSE(tier.client().connected());
  v1::RemoteTierStats s;
  tier.FillStats(&s);
  EXPECT_GE(s.errors(), 20u);
  EXPECT_FALSE(s.last_error().empty());
  ASSERT_TRUE(redis_.Start().ok());
  WaitConnected(tier);
  tier.Publish(e);  // Redis came back empty (no persistence)
  EXPECT_NE(tier.Fetch(e.record.key()), nullptr);
  tier.FillStats(&s);
  EXPECT_EQ(s.reconnects(), 1u);
}

TEST(RedisClientAuth, PasswordFromOptionsIsSentOnConnect) {
  TempDir dir;
  RedisProcess redis(dir.Sub("redis.log"), {"--requirepass", "s3cret"});
  ASSERT_TRUE(redis.Start().ok());
  RedisClientOptions o;
  o.address = *ParseRedisUrl(redis.url() + "/3");
  o.reconnect_interval = absl::Milliseconds(50);
  o.password = "s3cret";
  RedisClient good(o);
  o.password = "wrong";
  RedisClient bad(o);
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (!good.connected() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(good.connected()) << good.last_error();
  auto db = good.Command({"CLIENT", "INFO"});
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_THAT(db->str, ::testing::HasSubstr("db=3"));
  EXPECT_FALSE(bad.connected());
  EXPECT_THAT(bad.Command({"PING"}), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(bad.last_error(), ::testing::HasSubstr("AUTH"));
}

}  // namespace
}  // namespace kcache
