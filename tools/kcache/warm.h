// `kcache warm`'s engine: asks a daemon for every (spec, arch) of a manifest
// with GetKernel from a small pool of threads, so that each compile is
// reported on its own (hit, compiled, or the daemon's error), in parallel
// across the daemon's queues. Needs no GPU: a compile-only daemon (kcached
// --compile_only) compiles for named architectures.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tools/kcache/manifest.h"

namespace kcache::tools {

struct WarmResult {
  WarmItem item;
  absl::Status status;  // the daemon's answer for this item
  bool hit = false;     // already in the store
  std::string key;      // binary store key, when OK
  absl::Duration elapsed;
};

struct WarmOptions {
  int jobs = 4;                                 // concurrent requests
  absl::Duration deadline = absl::Minutes(10);  // per request
  // Called once per finished item, serialized (never concurrently), with the
  // number finished so far.
  std::function<void(const WarmResult&, size_t done)> on_done;
  // Called while requests are outstanding and the oldest has waited at least
  // `progress_after`: then every `progress_every`, serialized with on_done,
  // with the number finished, the number outstanding, and the oldest
  // outstanding item and how long it has waited (a compile, usually: hits
  // answer in milliseconds). So a long compile is never silence.
  std::function<void(size_t done, size_t outstanding, const WarmItem& oldest,
                     absl::Duration waited)>
      on_waiting;
  absl::Duration progress_after = absl::Seconds(2);
  absl::Duration progress_every = absl::Seconds(2);
};

// Runs every item; returns the results in manifest order. Thread-safe to
// call; blocks until all items are answered.
std::vector<WarmResult> Warm(const std::shared_ptr<grpc::Channel>& channel,
                             const std::vector<WarmItem>& items, const WarmOptions& options);

}  // namespace kcache::tools
