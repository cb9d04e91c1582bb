// kcached: wires the store, NVRTC and its workers, the devices, the
// scheduler and the gRPC servers together, and runs them until shutdown.
//
// Thread-safe: Shutdown may be called from any thread (the signal thread),
// once or more.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kcache/v1/daemon_config.pb.h"

namespace kcache {

class Daemon {
 public:
  // Starts everything; the daemon serves when this returns. Errors name what
  // could not be set up (store locked by another process, socket in use...).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const v1::DaemonConfig& config);
  ~Daemon();

  // Graceful: stop accepting (new requests get UNAVAILABLE), fail queued
  // compiles with UNAVAILABLE, let running compiles finish within
  // shutdown_grace_ms, stop the servers, flush and close the store.
  absl::Status Shutdown();

  // The port the metrics endpoint listens on (0 when off).
  int metrics_port() const;
  // The port the TCP listener got (0 when off).
  int tcp_port() const;

  struct Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kcache
