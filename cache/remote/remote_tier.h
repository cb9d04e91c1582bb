// The shared remote tier on Redis (issue 16): SharedTier over RedisClient.
//
// Redis layout, all under the toolchain of the key, so that one toolchain's
// entries can be found and cleared together (SCAN MATCH kcache:v1:<id>:*):
//   kcache:v1:<toolchain id hex>:blob:<cubin sha256 hex>   cubin bytes
//   kcache:v1:<toolchain id hex>:rec:<key hex>             KernelRecord bytes
//   kcache:v1:<toolchain id hex>:lease:<key hex>           owner token, PX ttl
// The record is written after the blob. Nothing in Redis is trusted: records
// and blobs are checked as the store checks a local read (record_codec.h,
// digest and size) before they are returned.
//
// Single flight across nodes: SET lease NX PX ttl; the holder's lease is
// renewed every ttl/3 by one background thread (compare-and-PEXPIRE in Lua,
// so a node never extends a lease it lost) and deleted (compare-and-DEL)
// when the Lease is destroyed. A node that finds the lease polls for the
// record with backoff (poll_min .. poll_max: 20 .. 100 ms), retrying SET NX on each round,
// so that when the holder dies its lease expires and one waiter takes over.
//
// Thread-safe. No lock is held across Redis I/O.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cache/remote/redis_client.h"
#include "cache/remote/shared_tier.h"

namespace kcache {

struct RemoteTierOptions {
  RedisClientOptions redis;
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration poll_min = absl::Milliseconds(20);
  absl::Duration poll_max = absl::Milliseconds(100);
  // Distinguishes this node's leases (logged by nothing; compared by Lua).
  std::string node_id;
};

class RemoteTier : public SharedTier {
 public:
  explicit RemoteTier(RemoteTierOptions options);
  ~RemoteTier() override;  // stops renewing; outstanding Leases must be gone

  EntryRef Fetch(std::string_view key) override;
  Claim ClaimCompile(std::string_view key, absl::Time wait_until) override;
  void Publish(const Entry& entry) override;
  void FillStats(v1::RemoteTierStats* out) const override;
  void Stop() override { stopping_.store(true); }

  // The Redis keys of an entry (exposed for tests and tools).
  static std::string RecordKey(std::string_view key);
  static std::string BlobKey(std::string_view key, std::string_view cubin_sha256);
  static std::string LeaseKey(std::string_view key);

  RedisClient& client() { return client_; }

 private:
  class RedisLease;
  friend class RedisLease;

  // Fetch without counting a miss (the wait loop polls with it).
  EntryRef Get(std::string_view key, bool count_miss);
  absl::StatusOr<RedisReply> Call(const std::vector<std::string>& argv);
  void Release(const std::string& lease_key, const std::string& token);
  void RenewLoop();

  const RemoteTierOptions options_;
  RedisClient client_;
  std::atomic<uint64_t> token_seq_{0};
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  // Leases held now: lease key -> token. Renewed by RenewLoop.
  absl::flat_hash_map<std::string, std::string> held_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread renewer_;

  struct Counters {
    std::atomic<uint64_t> hits{0}, misses{0}, errors{0}, bad_entries{0}, publishes{0}, leases{0},
        lease_waits{0}, takeovers{0}, wait_timeouts{0}, bytes_read{0}, bytes_written{0};
  };
  mutable Counters n_;
};

}  // namespace kcache
