#include "cache/remote/remote_tier.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/record_codec.h"

namespace kcache {

namespace {

// Extends / deletes the lease only while it is still ours.
constexpr const char* kRenewScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
constexpr const char* kReleaseScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) else return 0 end";

std::string Prefix(std::string_view key) {
  // A malformed key (never produced by the backend) still gets a prefix of
  // its own rather than an out-of-range read.
  std::string_view tc = key.size() >= 1 + kToolchainIdSize ? KeyToolchainId(key) : key;
  return absl::StrCat("kcache:v1:", ToHex(tc), ":");
}

}  // namespace

class RemoteTier::RedisLease : public SharedTier::Lease {
 public:
  RedisLease(RemoteTier* tier, std::string lease_key, std::string token)
      : tier_(tier), lease_key_(std::move(lease_key)), token_(std::move(token)) {}
  ~RedisLease() override { tier_->Release(lease_key_, token_); }

 private:
  RemoteTier* const tier_;
  const std::string lease_key_;
  const std::string token_;
};

std::string RemoteTier::RecordKey(std::string_view key) {
  return absl::StrCat(Prefix(key), "rec:", ToHex(key));
}
std::string RemoteTier::BlobKey(std::string_view key, std::string_view cubin_sha256) {
  return absl::StrCat(Prefix(key), "blob:", ToHex(cubin_sha256));
}
std::string RemoteTier::LeaseKey(std::string_view key) {
  return absl::StrCat(Prefix(key), "lease:", ToHex(key));
}

RemoteTier::RemoteTier(RemoteTierOptions options)
    : options_(std::move(options)), client_(options_.redis) {
  renewer_ = std::thread([this] { RenewLoop(); });
}

RemoteTier::~RemoteTier() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  renewer_.join();
}

absl::StatusOr<RedisReply> RemoteTier::Call(const std::vector<std::string>& argv) {
  auto r = client_.Command(argv);
  if (!r.ok()) n_.errors.fetch_add(1, std::memory_order_relaxed);
  return r;
}

EntryRef RemoteTier::Get(std::string_view key, bool count_miss) {
  auto miss = [&]() -> EntryRef {
    if (count_miss) n_.misses.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  };
  auto bad = [&](const std::string& why) -> EntryRef {
    n_.bad_entries.fetch_add(1, std::memory_order_relaxed);
    // Logged on the first look only: a node waiting on a lease re-reads the
    // same bad entry every poll until its holder replaces it.
    if (count_miss) {
      std::cerr << "kcached: remote tier: refused entry " << KeyToHex(key) << ": " << why
                << std::endl;
    }
    return miss();
  };
  auto rec = Call({"GET", RecordKey(key)});
  if (!rec.ok() || rec->type != RedisReply::Type::kString) return miss();
  n_.bytes_read.fetch_add(rec->str.size(), std::memory_order_relaxed);
  auto record = DecodeRecord(rec->str);
  if (!record.ok()) return bad(std::string(record.status().message()));
  if (record->key() != key) {
    return bad(absl::StrCat("the record is for key ", KeyToHex(record->key())));
  }
  auto blob = Call({"GET", BlobKey(key, record->cubin_sha256())});
  // A record without its blob (evicted by Redis): a miss, not damage.
  if (!blob.ok() || blob->type != RedisReply::Type::kString) return miss();
  n_.bytes_read.fetch_add(blob->str.size(), std::memory_order_relaxed);
  if (blob->str.empty() || blob->str.size() != record->cubin_size() ||
      AsBytes(Sha256(blob->str)) != record->cubin_sha256()) {
    return bad("the cubin does not match the record's digest");
  }
  n_.hits.fetch_add(1, std::memory_order_relaxed);
  auto entry = std::make_shared<Entry>();
  entry->record = *std::move(record);
  entry->cubin = std::move(blob->str);
  return entry;
}

EntryRef RemoteTier::Fetch(std::string_view key) { return Get(key, /*count_miss=*/true); }

SharedTier::Claim RemoteTier::ClaimCompile(std::string_view key, absl::Time wait_until) {
  const std::string lease_key = LeaseKey(key);
  const std::string token =
      absl::StrCat(options_.node_id, "/", token_seq_.fetch_add(1, std::memory_order_relaxed));
  const std::string ttl_ms = absl::StrCat(absl::ToInt64Milliseconds(options_.lease_ttl));
  bool waited = false;
  absl::Duration backoff = options_.poll_min;
  while (true) {
    auto set = Call({"SET", lease_key, token, "NX", "PX", ttl_ms});
    if (!set.ok()) return {};  // down: compile alone
    if (set->type == RedisReply::Type::kStatus) {
      {
        absl::MutexLock lock(&mu_);
        held_[lease_key] = token;
      }
      auto lease = std::make_unique<RedisLease>(this, lease_key, token);
      // Published between our miss and our lease (its holder has just let
      // go): take that and compile nothing.
      if (EntryRef e = Get(key, /*count_miss=*/false); e != nullptr) return {std::move(e), nullptr};
      n_.leases.fetch_add(1, std::memory_order_relaxed);
      if (waited) n_.takeovers.fetch_add(1, std::memory_order_relaxed);
      return {nullptr, std::move(lease)};
    }
    // Another node holds the lease: wait for its result.
    if (!waited) {
      waited = true;
      n_.lease_waits.fetch_add(1, std::memory_order_relaxed);
    }
    absl::Time now = absl::Now();
    if (now >= wait_until || stopping_.load()) {
      n_.wait_timeouts.fetch_add(1, std::memory_order_relaxed);
      return {};
    }
    absl::SleepFor(std::min(backoff, wait_until - now));
    backoff = std::min(backoff * 1.5, options_.poll_max);
    if (EntryRef e = Get(key, /*count_miss=*/false); e != nullptr) return {std::move(e), nullptr};
    if (!client_.connected()) return {};
  }
}

void RemoteTier::Release(const std::string& lease_key, const std::string& token) {
  {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(lease_key);
    if (it != held_.end() && it->second == token) held_.erase(it);
  }
  // If this fails the lease simply expires.
  (void)Call({"EVAL", kReleaseScript, "1", lease_key, token});
}

void RemoteTier::Publish(const Entry& entry) {
  const v1::KernelRecord& r = entry.record;
  std::string record_bytes = r.SerializeAsString();
  // Blob first, then the record: a reader that finds the record finds its
  // blob (unless Redis evicted it since, which reads as a miss).
  if (!Call({"SET", BlobKey(r.key(), r.cubin_sha256()), entry.cubin}).ok()) return;
  if (!Call({"SET", RecordKey(r.key()), record_bytes}).ok()) return;
  n_.publishes.fetch_add(1, std::memory_order_relaxed);
  n_.bytes_written.fetch_add(entry.cubin.size() + record_bytes.size(), std::memory_order_relaxed);
}

void RemoteTier::RenewLoop() {
  const absl::Duration every = options_.lease_ttl / 3;
  const std::string ttl_ms = absl::StrCat(absl::ToInt64Milliseconds(options_.lease_ttl));
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), every)) {
    std::vector<std::pair<std::string, std::string>> held(held_.begin(), held_.end());
    mu_.Unlock();  // renewing is I/O
    for (const auto& [lease_key, token] : held) {
      auto r = Call({"EVAL", kRenewScript, "1", lease_key, token, ttl_ms});
      if (r.ok() && r->type == RedisReply::Type::kInteger && r->integer == 0) {
        // Lost (expired while Redis was unreachable, or Redis restarted):
        // the compile goes on; its result is published all the same.
        std::cerr << "kcached: remote tier: lease " << lease_key << " was lost" << std::endl;
      }
    }
    mu_.Lock();
  }
}

void RemoteTier::FillStats(v1::RemoteTierStats* out) const {
  out->set_address(options_.redis.address.ToString());
  out->set_connected(client_.connected());
  out->set_last_error(client_.last_error());
  out->set_hits(n_.hits.load());
  out->set_misses(n_.misses.load());
  out->set_errors(n_.errors.load());
  out->set_bad_entries(n_.bad_entries.load());
  out->set_publishes(n_.publishes.load());
  out->set_leases(n_.leases.load());
  out->set_lease_waits(n_.lease_waits.load());
  out->set_takeovers(n_.takeovers.load());
  out->set_wait_timeouts(n_.wait_timeouts.load());
  out->set_bytes_read(n_.bytes_read.load());
  out->set_bytes_written(n_.bytes_written.load());
  out->set_reconnects(client_.reconnects());
}

}  // namespace kcache
