// kcache::Client: how a trainer gets finished attention kernels from the node
// daemon (kcached). It never compiles: it asks the daemon over gRPC, and loads
// the returned cubin with the CUDA driver into the caller's current context.
//
// Thread-safety: a Client is safe for concurrent use from any number of
// threads. It holds one channel. Concurrent requests for the same spec and
// target share one RPC, and a kernel is loaded once per (key, CUDA context):
// later calls return the memoized module and functions.
//
// Ownership: loaded modules live until the Client is destroyed (they are
// unloaded then, in whichever context they belong to; destroy the Client
// before destroying those contexts).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kcache/v1/service.grpc.pb.h"

namespace kcache {

// A compile under way, as ClientOptions::on_progress sees it.
struct CompileProgress {
  // What was asked for; valid during the on_progress call only.
  const v1::GetKernelRequest* request = nullptr;
  // The daemon's last word: queued (with its position on `queue`),
  // compiling, verifying; PHASE_UNSPECIFIED before it said anything.
  v1::Progress::Phase phase = v1::Progress::PHASE_UNSPECIFIED;
  uint32_t queue_position = 0;
  std::string queue;
  absl::Duration elapsed;  // since the call began
  // The last report of a call has `finished` set: OK when the kernel came,
  // else why not.
  bool finished = false;
  absl::Status status;
};

struct ClientOptions {
  // gRPC target: "unix:/abs/path.sock", "unix:relative.sock" or "host:port".
  // Empty: found by DiscoverTarget (client/discovery.h): $KCACHE_TARGET, else
  // /run/kcache/kcached.sock if it exists, else .kcache/kcached.sock.
  std::string target;
  // How long a call waits to reach the daemon (a unix: socket that exists
  // but refuses, i.e. a restarting daemon; a channel that does not connect),
  // separately from the compile deadline. A missing socket, a path that is
  // not a socket, or one this user may not open fails at once.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Deadline of one GetKernel when the caller gives none; a cold compile can
  // take a while.
  absl::Duration default_deadline = absl::Minutes(10);
  // While the daemon is unavailable (restarting), retry with exponential
  // backoff, for at most connect_timeout and within the call's deadline.
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(1);
  int max_message_bytes = 64 << 20;
  // The daemon's admin token, for raw kernels (FetchRaw / LoadRaw) only: sent
  // as "authorization: Bearer <token>" on raw requests and on nothing else.
  // Give the token or a file holding it (read once by Create, surrounding
  // whitespace stripped, as kcached reads its --admin_token_path); not both.
  std::string admin_token;
  std::string admin_token_path;
  // Progress of slow compiles. When set, calls go over GetKernelStream, and a
  // kernel that is not ready after `progress_after` is reported: then every
  // `progress_every` and at each phase change, and once more (`finished`)
  // when it is ready or fails. Hits and quick compiles are not reported.
  // Runs on a thread of the client's, never twice at once for one call; it
  // must be quick and must not call into this Client.
  std::function<void(const CompileProgress&)> on_progress;
  absl::Duration progress_after = absl::Seconds(2);
  absl::Duration progress_every = absl::Seconds(10);
};

namespace client_internal {
struct RawLaunchState;  // client/raw_launch.h
}  // namespace client_internal

// A kernel loaded into one CUDA context.
struct LoadedKernel {
  std::shared_ptr<const v1::GetKernelResponse> response;  // record + cubin
  void* context = nullptr;                                // CUcontext
  // One CUmodule per image of the cubin (compiler/cuda/cubin_images.h).
  std::vector<void*> modules;
  // Entry-point name -> CUfunction, for every entry in the record, with its
  // dynamic shared memory limit already raised to what the record says.
  std::map<std::string, void*> functions;
  // What LaunchRaw (client/raw_launch.h) learnt and did per function, once
  // per function in this context.
  std::shared_ptr<client_internal::RawLaunchState> raw_launch_state;

  // The CUfunction of the first entry with this role, or nullptr.
  void* Function(v1::EntryRole role) const;
  // The CUfunction of the entry point with this name (a raw kernel's
  // RawKernel.kernel_names), or nullptr.
  void* Function(absl::string_view name) const;
};

class Client {
 public:
  // Creates the channel; does not wait for the daemon. An empty target is
  // discovered (DiscoverTarget). InvalidArgument naming the field for both
  // admin-token fields set, or an
  // admin_token_path that cannot be read or holds no token.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Asks the daemon for a finished kernel and waits for it (cache hit, or
  // the daemon's compile). Memoized per (spec, target): the second call for
  // the same request makes no RPC. Errors carry the daemon's code and
  // message: InvalidArgument (a bad spec field), FailedPrecondition (the
  // compile failed; the message holds the log), DeadlineExceeded, and
  // Unavailable at once when a unix: socket is missing, not a socket or not
  // permitted (the message names the path and the fix), and when no daemon
  // answered within connect_timeout ("no kcache daemon ... at unix:...").
  absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> Fetch(
      const v1::AttentionSpec& spec, const v1::Target& target,
      absl::Duration deadline = absl::ZeroDuration());

  // Fetch, then load into the calling thread's current CUDA context (which
  // must be set, e.g. by the CUDA runtime or cuCtxSetCurrent). An unset
  // target arch is filled from the context's device. Once per (key,
  // context).
  absl::StatusOr<std::shared_ptr<const LoadedKernel>> Load(
      const v1::AttentionSpec& spec, v1::Target target = {},
      absl::Duration deadline = absl::ZeroDuration());

  // Raw kernels (LLVM IR text / bitcode or PTX, with the kernel names to
  // export; proto/kcache/v1/spec.proto RawKernel). As Fetch and Load, with
  // the same retries, memo (per request; per (key, context) for loads) and
  // errors, plus: PermissionDenied when the daemon refuses this client's
  // admin token or the client has none (the message says which option to
  // set); FailedPrecondition also when the daemon has raw kernels disabled
  // (the message names --enable_raw_kernels); InvalidArgument for input the
  // daemon rejects (e.g. "raw.source: ..." with the LLVM verifier's message,
  // "raw.kernel_names[0]: ..."); Unimplemented for LLVM IR on a daemon built
  // without LLVM. The memo keeps the request (source included) for the
  // Client's lifetime.
  //
  // LoadRaw's functions are LoadedKernel::Function(name), one per kernel
  // name. The record has no launch facts for raw kernels: the caller knows
  // grid, block and shared memory, and launches with LaunchRaw
  // (client/raw_launch.h), which raises the dynamic shared memory limit over
  // 48 KiB and launches thread-block clusters.
  absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> FetchRaw(
      const v1::RawKernel& raw, const v1::Target& target,
      absl::Duration deadline = absl::ZeroDuration());
  absl::StatusOr<std::shared_ptr<const LoadedKernel>> LoadRaw(
      const v1::RawKernel& raw, v1::Target target = {},
      absl::Duration deadline = absl::ZeroDuration());

  // Schedules compiles at pre-population priority; returns per spec.
  absl::StatusOr<v1::PrefetchResponse> Prefetch(const v1::PrefetchRequest& request,
                                                absl::Duration deadline = absl::Seconds(30));

  // Number of GetKernel RPCs this client has made (for tests and metrics).
  uint64_t rpc_count() const;

 private:
  Client(ClientOptions options, std::string admin_token);

  struct Flight;  // one in-progress fetch or load, shared by its waiters
  // Fetch / Load of a whole GetKernelRequest (spec or raw); Load fills the
  // request's target from the current context when it has none.
  absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> FetchRequest(
      const v1::GetKernelRequest& request, absl::Duration deadline);
  absl::StatusOr<std::shared_ptr<const LoadedKernel>> LoadRequest(v1::GetKernelRequest request,
                                                                  absl::Duration deadline);
  absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> CallGetKernel(
      const v1::GetKernelRequest& request, absl::Time deadline);
  // Before an RPC: the socket probe, then the channel's connect, both within
  // min(connect_timeout, deadline).
  absl::Status EnsureConnected(absl::Time deadline);

  const ClientOptions options_;
  std::string admin_token_;  // options_.admin_token or the contents of admin_token_path
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> stub_;
  // The daemon has been reached once: a missing socket later is a restart.
  std::atomic<bool> reached_{false};

  mutable absl::Mutex mu_;
  // Request bytes -> in-flight or finished fetch.
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> fetches_ ABSL_GUARDED_BY(mu_);
  // Record key + context -> in-flight or finished load.
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> loads_ ABSL_GUARDED_BY(mu_);
  uint64_t rpcs_ ABSL_GUARDED_BY(mu_) = 0;
};

// The one adapter from grpc::Status to absl::Status (codes map 1:1).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kcache
