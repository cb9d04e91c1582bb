#include "service/remote_hook.h"

#include <glog/logging.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cache/remote/remote_tier.h"
#include "service/logging.h"

namespace kcache {

EntryRef FetchOrClaim(SharedTier& tier, Store& store, std::string_view key, absl::Time wait_until,
                      std::unique_ptr<SharedTier::Lease>* lease) {
  EntryRef remote = tier.Fetch(key);
  if (remote == nullptr) {
    SharedTier::Claim claim = tier.ClaimCompile(key, wait_until);
    if (claim.entry == nullptr) {
      *lease = std::move(claim.lease);
      return nullptr;
    }
    remote = std::move(claim.entry);
  }
  // Stored as if compiled here (Publish re-checks the record and digest); a
  // fresh creation time, so that local eviction sees it as new here.
  v1::KernelRecord record = remote->record;
  record.set_created_unix_ms(0);
  auto stored = store.Publish(std::move(record), remote->cubin);
  if (stored.ok()) return *std::move(stored);
  // Verified already: serve it even if the local store cannot take it now.
  LOG(WARNING) << "remote tier: storing a fetched entry locally failed: key=" << KeyPrefix(key)
               << " error=" << LogQuote(stored.status().message());
  return remote;
}

absl::StatusOr<std::unique_ptr<SharedTier>> MakeSharedTier(const v1::DaemonConfig& c) {
  if (c.remote().empty()) return std::unique_ptr<SharedTier>();
  auto address = ParseRedisUrl(c.remote());
  if (!address.ok()) return address.status();
  RemoteTierOptions o;
  o.redis.address = *address;
  if (!c.remote_password_file().empty()) {
    std::ifstream in(c.remote_password_file());
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote_password_file: cannot read '", c.remote_password_file(), "'"));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    o.redis.password = std::string(absl::StripAsciiWhitespace(ss.str()));
    if (o.redis.password.empty()) {
      return absl::InvalidArgumentError("remote_password_file: the file is empty");
    }
  }
  if (c.remote_timeout_ms() > 0) o.redis.timeout = absl::Milliseconds(c.remote_timeout_ms());
  if (c.remote_lease_ms() > 0) o.lease_ttl = absl::Milliseconds(c.remote_lease_ms());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  o.node_id = absl::StrCat(host, ":", getpid(), ":", std::random_device()());
  LOG(INFO) << "remote tier " << address->ToString() << " (timeout "
            << absl::FormatDuration(o.redis.timeout) << ", lease "
            << absl::FormatDuration(o.lease_ttl) << ")";
  return std::unique_ptr<SharedTier>(std::make_unique<RemoteTier>(std::move(o)));
}

void AddRemoteMetrics(MetricsRegistry& metrics, const SharedTier* tier) {
  metrics.AddGauge("kcache_remote_connected", "1 while the remote tier answers", [tier] {
    v1::RemoteTierStats s;
    tier->FillStats(&s);
    return std::vector<std::pair<std::string, double>>{{"", s.connected() ? 1.0 : 0.0}};
  });
  // Counts and bytes apart (a metric has one unit); both are totals since
  // start, so counters.
  metrics.AddCounterFunc(
      "kcache_remote_events_total",
      "Remote tier events since start, by kind (hits, misses, errors, bad_entries, publishes, "
      "leases, lease_waits, takeovers, wait_timeouts, reconnects)",
      [tier] {
        v1::RemoteTierStats s;
        tier->FillStats(&s);
        std::vector<std::pair<std::string, double>> out;
        auto add = [&](const char* kind, uint64_t v) {
          out.emplace_back(absl::StrCat("kind=\"", kind, "\""), static_cast<double>(v));
        };
        add("hits", s.hits());
        add("misses", s.misses());
        add("errors", s.errors());
        add("bad_entries", s.bad_entries());
        add("publishes", s.publishes());
        add("leases", s.leases());
        add("lease_waits", s.lease_waits());
        add("takeovers", s.takeovers());
        add("wait_timeouts", s.wait_timeouts());
        add("reconnects", s.reconnects());
        return out;
      });
  metrics.AddCounterFunc("kcache_remote_bytes_total",
                         "Bytes read from and written to the remote tier since start", [tier] {
                           v1::RemoteTierStats s;
                           tier->FillStats(&s);
                           return std::vector<std::pair<std::string, double>>{
                               {"direction=\"read\"", static_cast<double>(s.bytes_read())},
                               {"direction=\"written\"", static_cast<double>(s.bytes_written())}};
                         });
}

}  // namespace kcache
