// The daemon's use of the shared remote tier (issue 16), kept out of
// kernel_backend.cc: the step between a local miss and a compile, and the
// tier's construction, metrics and status from the configuration.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/remote/shared_tier.h"
#include "cache/store.h"
#include "kcache/v1/daemon_config.pb.h"
#include "service/metrics.h"

namespace kcache {

// Before compiling `key` on a local miss: a verified entry from the tier,
// stored locally (one atomic Publish) and returned; or nullptr, and then
// `*lease` holds the fleet lease when this node is the one to compile (keep
// it until the result is published to the tier), or stays null when the
// node compiles alone (tier down, wait out of time). Waits for another
// node's compile until `wait_until` at most. Never fails.
EntryRef FetchOrClaim(SharedTier& tier, Store& store, std::string_view key, absl::Time wait_until,
                      std::unique_ptr<SharedTier::Lease>* lease);

// The tier named by config.remote (nullptr when empty): parses the URL,
// reads the password file. InvalidArgument naming the field otherwise.
// Does not wait for Redis: an unreachable Redis is a tier that is down.
absl::StatusOr<std::unique_ptr<SharedTier>> MakeSharedTier(const v1::DaemonConfig& config);

// Prometheus gauges read from the tier at scrape time:
// kcache_remote_connected and kcache_remote_events{kind="hits"|...}.
void AddRemoteMetrics(MetricsRegistry& metrics, const SharedTier* tier);

}  // namespace kcache
