// A real redis-server (Debian's) in a child process on a free loopback port,
// with no persistence (--save '' --appendonly no), for the remote-tier tests
// and benchmark. Killable and restartable on the same port. No gtest here.
//
// Not thread-safe: one thread starts and stops a given instance.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kcache::testing {

class RedisProcess {
 public:
  // `log_path`: redis-server's stdout and stderr, appended to.
  // `extra_args`: more redis-server options, e.g. {"--requirepass", "pw"}.
  explicit RedisProcess(std::string log_path, std::vector<std::string> extra_args = {})
      : log_path_(std::move(log_path)), extra_args_(std::move(extra_args)) {}
  ~RedisProcess() { Stop(SIGKILL); }
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;

  int port() const { return port_; }
  std::string url() const { return absl::StrCat("redis://127.0.0.1:", port_); }

  // Starts on a free port (the first time) or on the same port again, and
  // waits (20 s at most) until it accepts connections.
  absl::Status Start() {
    if (port_ == 0) port_ = FreePort();
    std::vector<std::string> args = {
        "redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no",     "--daemonize",         "no"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execvp("redis-server", argv.data());
      _exit(127);
    }
    absl::Time until = absl::Now() + absl::Seconds(20);
    while (absl::Now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) != 0) {
        pid_ = -1;
        return absl::FailedPreconditionError(
            absl::StrCat("redis-server exited at start (is it installed?), see ", log_path_));
      }
      if (Accepts()) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError("redis-server did not start within 20 s");
  }

  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return 0;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

 private:
  static int FreePort() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      a.sin_port = 0;  // no port: Start fails, naming port 0
    }
    close(fd);
    return ntohs(a.sin_port);
  }

  bool Accepts() const {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (ok) {
      // Any reply will do (-NOAUTH too, with --requirepass): it is serving.
      const char ping[] = "PING\r\n";
      char buf[16] = {};
      ok = write(fd, ping, sizeof(ping) - 1) == sizeof(ping) - 1 && read(fd, buf, 1) == 1;
    }
    close(fd);
    return ok;
  }

  const std::string log_path_;
  const std::vector<std::string> extra_args_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kcache::testing
