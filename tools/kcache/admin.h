// What `kcache` operates on: the daemon's AdminService (over its Unix socket
// or a gRPC target), or a store directory opened directly when no daemon
// runs. Both sit behind one interface so that every command works the same
// way in both modes.
//
// Thread-safety: an Admin is used by one thread (the command's), except
// channel(), which may be shared by `warm`'s worker threads.
// Errors: the daemon's gRPC status converted once (client/client.h
// FromGrpcStatus); Unavailable means "no daemon / no store to talk to".
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kcache/v1/service.grpc.pb.h"

namespace kcache::tools {

class Admin {
 public:
  virtual ~Admin() = default;

  // "daemon at unix:/run/kcache/kcached.sock" or "store .kcache/store (read-only)".
  virtual std::string Describe() const = 0;
  // The daemon's channel (for KernelService calls), or null in direct mode.
  virtual std::shared_ptr<grpc::Channel> channel() const { return nullptr; }

  // Store fields always; daemon counters, queues, devices and toolchain
  // only from a daemon (direct mode fills toolchain from this machine's
  // NVRTC when it loads).
  virtual absl::StatusOr<v1::StatsResponse> Stats() = 0;
  virtual absl::StatusOr<v1::ListResponse> List(const v1::Filter& filter, uint32_t page_size,
                                                const std::string& page_token) = 0;
  // `key` is a whole binary key or a hex key / unique hex prefix.
  // NotFound when nothing matches; InvalidArgument when ambiguous.
  virtual absl::StatusOr<v1::EntrySummary> Inspect(const std::string& key) = 0;
  // The entry's cubin bytes (digest-checked by the store). Unimplemented
  // where a backend cannot fetch them.
  virtual absl::StatusOr<std::string> Cubin(const std::string& key) {
    return absl::UnimplementedError("this connection cannot fetch cubins");
  }
  virtual absl::Status Pin(const std::string& key, const std::string& reason) = 0;
  virtual absl::Status Unpin(const std::string& key) = 0;
  // Evicts LRU entries down to max_bytes (and, directly on a store, collects
  // garbage: the daemon does that itself).
  virtual absl::StatusOr<v1::EvictResponse> Evict(uint64_t max_bytes,
                                                  std::optional<absl::Duration> grace) = 0;
  // A key in the request may be hex or a hex prefix.
  virtual absl::StatusOr<v1::InvalidateResponse> Invalidate(v1::InvalidateRequest request) = 0;
  virtual absl::StatusOr<v1::VerifyResponse> Verify() = 0;
  // Streams the bundle of the matching entries to `sink`.
  virtual absl::Status Export(const v1::Filter& filter,
                              absl::FunctionRef<absl::Status(std::string_view)> sink) = 0;
  // Imports a whole bundle; `progress` (optional) gets the bytes sent so far.
  virtual absl::StatusOr<v1::ImportResponse> Import(
      std::string_view bundle, bool allow_foreign_toolchain,
      const std::function<void(uint64_t)>& progress) = 0;
};

struct ConnectOptions {
  // Exactly one of these selects the mode; all empty = the defaults: the
  // daemon at $KCACHE_TARGET, else on /run/kcache/kcached.sock or
  // .kcache/kcached.sock if that socket exists (client/discovery.h), else the
  // store .kcache/store directly.
  std::string socket;  // --socket PATH
  std::string target;  // --target (gRPC target, e.g. unix:/path or host:port)
  std::string store;   // --store DIR
  absl::Duration connect_timeout = absl::Seconds(3);
  absl::Duration rpc_timeout = absl::Minutes(10);
  // Direct mode import: the toolchain id a bundle must carry (default: the
  // id of this machine's NVRTC).
  std::string toolchain_id;
};

inline constexpr char kDefaultSocket[] = ".kcache/kcached.sock";
inline constexpr char kDefaultStore[] = ".kcache/store";

// Opens the daemon connection or the store. `mutate` = the command changes
// the store: a store that a daemon holds is then refused (Unavailable
// saying to go through the daemon); read commands open it read-only.
// A store that does not exist is Unavailable, unless `create` (import).
absl::StatusOr<std::unique_ptr<Admin>> Connect(const ConnectOptions& options, bool mutate,
                                               bool create = false);

}  // namespace kcache::tools
