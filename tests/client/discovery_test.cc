// Discovery of the daemon's socket and the failures a client reports before
// any RPC (client/discovery.h): missing socket, not a socket, permission
// denied, a socket that refuses; all fast, naming the path.
#include "client/discovery.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>

#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

// A bound Unix socket at `path`, listening or not (not: connect is refused).
int BindSocket(const std::string& path, bool listen) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
  if (listen) EXPECT_EQ(::listen(fd, 4), 0);
  return fd;
}

// Sets (or unsets, nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

v1::AttentionSpec AnySpec() {
  return v1::AttentionSpec();  // never sent: these clients fail before any RPC
}

TEST(Discovery, ExplicitThenEnvThenSystemSocketThenLocal) {
  TempDir dir;
  const std::string system = dir.Sub("run-kcached.sock");
  {
    ScopedEnv env("KCACHE_TARGET", std::nullopt);
    EXPECT_EQ(discovery_internal::DiscoverTarget("", system), "unix:.kcache/kcached.sock");
    int fd = BindSocket(system, true);
    EXPECT_EQ(discovery_internal::DiscoverTarget("", system), "unix:" + system);
    EXPECT_EQ(discovery_internal::DiscoverTarget("unix:/x.sock", system), "unix:/x.sock");
    ScopedEnv set("KCACHE_TARGET", "unix:/from/env.sock");
    EXPECT_EQ(discovery_internal::DiscoverTarget("", system), "unix:/from/env.sock");
    EXPECT_EQ(discovery_internal::DiscoverTarget("localhost:1234", system), "localhost:1234");
    ::close(fd);
  }
  {
    ScopedEnv empty("KCACHE_TARGET", "");  // empty counts as unset
    EXPECT_EQ(discovery_internal::DiscoverTarget("", dir.Sub("absent.sock")),
              "unix:.kcache/kcached.sock");
  }
  // The client uses it: an empty target is discovered.
  ScopedEnv set("KCACHE_TARGET", "unix:" + dir.Sub("env.sock"));
  auto c = Client::Create(ClientOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->Fetch(AnySpec(), v1::Target());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(dir.Sub("env.sock")));
}

TEST(Discovery, UnixSocketPath) {
  EXPECT_EQ(UnixSocketPath("unix:/a/b.sock"), "/a/b.sock");
  EXPECT_EQ(UnixSocketPath("unix:///a/b.sock"), "/a/b.sock");
  EXPECT_EQ(UnixSocketPath("unix:rel.sock"), "rel.sock");
  EXPECT_EQ(UnixSocketPath("localhost:1"), "");
}

TEST(Discovery, MissingSocketFailsAtOnceNamingThePath) {
  TempDir dir;
  ClientOptions o;
  o.target = "unix:" + dir.Sub("none.sock");
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok());
  const absl::Time t0 = absl::Now();
  auto r = (*c)->Fetch(AnySpec(), v1::Target());  // the 10-minute default deadline
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(dir.Sub("none.sock")));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("does not exist"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("scripts/run.sh"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("systemctl start kcached"));
  EXPECT_EQ((*c)->rpc_count(), 0u);
  auto p = (*c)->Prefetch(v1::PrefetchRequest());
  EXPECT_TRUE(absl::IsUnavailable(p.status())) << p.status();
}

TEST(Discovery, RegularFileIsNotASocket) {
  TempDir dir;
  const std::string path = dir.Sub("kcached.sock");
  std::ofstream(path) << "not a socket";
  ClientOptions o;
  o.target = "unix:" + path;
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok());
  const absl::Time t0 = absl::Now();
  auto r = (*c)->Fetch(AnySpec(), v1::Target());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(path + " exists but is not a socket"));
}

TEST(Discovery, RefusingSocketIsRetriedForTheConnectBudgetOnly) {
  TempDir dir;
  const std::string path = dir.Sub("kcached.sock");
  int fd = BindSocket(path, /*listen=*/false);  // a daemon gone: connect is refused
  ClientOptions o;
  o.target = "unix:" + path;
  o.connect_timeout = absl::Milliseconds(300);
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok());
  const absl::Time t0 = absl::Now();
  auto r = (*c)->Fetch(AnySpec(), v1::Target());
  const absl::Duration took = absl::Now() - t0;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("no kcache daemon answers at unix:" + path));
  ::close(fd);
}

// The probe's answer for a 0600 socket, asked by a user who is not its owner:
// this process when it is not root; a child that drops to nobody when it is
// (root bypasses file permissions, and CI runs as root).
TEST(Discovery, SocketWithoutPermissionSaysPermissionDenied) {
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string path = dir.Sub("kcached.sock");
  int fd = BindSocket(path, true);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(path.c_str(), 0000), 0);
    absl::Status st = ProbeUnixTarget("unix:" + path, absl::Seconds(5));
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("permission denied"));
    EXPECT_THAT(std::string(st.message()), HasSubstr("kcache group"));
    EXPECT_THAT(std::string(st.message()), HasSubstr(path));
  } else {
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(pipefd[0]);
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      absl::Status st = ProbeUnixTarget("unix:" + path, absl::Seconds(5));
      std::string msg(st.message());
      ssize_t w = ::write(pipefd[1], msg.data(), msg.size());
      ::_exit(w < 0 ? 3 : 0);
    }
    ::close(pipefd[1]);
    std::string msg;
    char buf[512];
    for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof(buf))) > 0;) msg.append(buf, n);
    ::close(pipefd[0]);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFEXITED(wstatus));
    ASSERT_EQ(WEXITSTATUS(wstatus), 0) << "the child could not drop to uid 65534";
    EXPECT_THAT(msg, HasSubstr("permission denied"));
    EXPECT_THAT(msg, HasSubstr("add this user to the kcache group"));  // connect(2) refused
    EXPECT_THAT(msg, HasSubstr(path));
  }
  ::close(fd);
}

}  // namespace
}  // namespace kcache
