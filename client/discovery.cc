#include "client/discovery.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kcache {

std::string DiscoverTarget(absl::string_view explicit_target) {
  return discovery_internal::DiscoverTarget(explicit_target, kSystemSocket);
}

std::string discovery_internal::DiscoverTarget(absl::string_view explicit_target,
                                               const std::string& system_socket) {
  if (!explicit_target.empty()) return std::string(explicit_target);
  if (const char* env = std::getenv("KCACHE_TARGET"); env != nullptr && *env != '\0') {
    return env;
  }
  struct stat st;
  if (::stat(system_socket.c_str(), &st) == 0) return absl::StrCat("unix:", system_socket);
  return absl::StrCat("unix:", kLocalSocket);
}

std::string UnixSocketPath(absl::string_view target) {
  if (absl::ConsumePrefix(&target, "unix://")) return std::string(target);
  if (absl::ConsumePrefix(&target, "unix:")) return std::string(target);
  return "";
}

namespace {

constexpr char kStartHint[] =
    "start the daemon (scripts/run.sh, or systemctl start kcached) or point "
    "KCACHE_TARGET at its socket";

// One connect(2) to `path`: 0 on success, else errno.
int ConnectOnce(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = rc == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

}  // namespace

absl::Status ProbeUnixTarget(absl::string_view target, absl::Duration budget, bool reached_before) {
  const std::string path = UnixSocketPath(target);
  if (path.empty()) return absl::OkStatus();
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kcache daemon socket path too long for a Unix socket: ", path));
  }
  const absl::Time until = absl::Now() + budget;
  absl::Duration backoff = absl::Milliseconds(20);
  for (;;) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      const int stat_errno = errno;
      if (stat_errno == ENOENT && reached_before && absl::Now() < until) {
        absl::SleepFor(std::min(backoff, until - absl::Now()));  // restarting
        backoff = std::min(backoff * 2, absl::Seconds(1));
        continue;
      }
      if (stat_errno == EACCES) {
        return absl::UnavailableError(
            absl::StrCat("kcache daemon socket ", path,
                         ": permission denied (a directory on the path may not be searched; "
                         "is this user in the kcache group?)"));
      }
      return absl::UnavailableError(absl::StrCat("no kcache daemon at ", target, ": ", path,
                                                 " does not exist; ", kStartHint));
    }
    if (!S_ISSOCK(st.st_mode)) {
      return absl::UnavailableError(absl::StrCat("no kcache daemon at ", target, ": ", path,
                                                 " exists but is not a socket; ", kStartHint));
    }
    const int err = ConnectOnce(path);
    if (err == 0) return absl::OkStatus();
    if (err == EACCES || err == EPERM) {
      return absl::UnavailableError(
          absl::StrCat("kcache daemon socket ", path,
                       ": permission denied (add this user to the kcache group: "
                       "usermod -aG kcache $USER, then log in again)"));
    }
    const bool transient = err == ECONNREFUSED || err == EAGAIN || err == ENOENT;
    const absl::Time now = absl::Now();
    if (!transient || now >= until) {
      return absl::UnavailableError(absl::StrCat(
          "no kcache daemon answers at ", target, " (", std::strerror(err),
          transient ? absl::StrCat(" for ", absl::FormatDuration(budget)) : std::string(),
          "): ", kStartHint));
    }
    absl::SleepFor(std::min(backoff, until - now));
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

}  // namespace kcache
