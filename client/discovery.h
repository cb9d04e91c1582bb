// How every kcache client (kcache::Client, the `kcache` CLI; the Python
// client's kcache.client.discover_target mirrors it) finds the daemon, and
// the quick check of a Unix socket made before any RPC.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kcache {

inline constexpr char kSystemSocket[] = "/run/kcache/kcached.sock";
inline constexpr char kLocalSocket[] = ".kcache/kcached.sock";

// The daemon's gRPC target: `explicit_target` if not empty; else
// $KCACHE_TARGET if set and not empty; else "unix:/run/kcache/kcached.sock"
// if that path exists; else "unix:.kcache/kcached.sock".
std::string DiscoverTarget(absl::string_view explicit_target = {});

namespace discovery_internal {
// DiscoverTarget with the system socket's path given (tests).
std::string DiscoverTarget(absl::string_view explicit_target, const std::string& system_socket);
}  // namespace discovery_internal

// The socket path of a "unix:" / "unix://" target, or "" for any other.
std::string UnixSocketPath(absl::string_view target);

// For a unix: target, checks the socket with a plain connect(2), retrying
// while the daemon refuses (ECONNREFUSED, EAGAIN: restarting) for at most
// `budget`. OK for other targets and when the connect succeeds. Otherwise
// UnavailableError naming the path and the reason: missing (with how to start
// the daemon), not a socket, permission denied (with the kcache group hint),
// or still refusing after the budget. `reached_before`: this client has
// talked to the daemon at this target, so a missing socket is a daemon
// restarting (it removes its socket on exit) and is waited for too, within
// the budget; otherwise a missing socket fails at once.
absl::Status ProbeUnixTarget(absl::string_view target, absl::Duration budget = absl::Seconds(10),
                             bool reached_before = false);

}  // namespace kcache
