// A real kcached in a child process, started on a given store and socket and
// waited on until it accepts connections; stopped with a signal, restartable
// on the same store. Shared by the end-to-end tests (through
// daemon_process.h, which adds the gtest assertions) and by the daemon load
// benchmark, so it does not depend on gtest.
//
// Not thread-safe: one thread starts and stops a given instance.
#pragma once

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kcache::testing {

struct KcachedOptions {
  // The kcached binary. Empty: $KCACHE_TEST_KCACHED if set (e.g. the static
  // build on the GPU machine), else KCACHE_TEST_KCACHED_PATH from the build.
  std::string binary;
  std::string store_path;
  std::string socket_path;
  // The daemon's stdout and stderr, appended to (a restart keeps the earlier
  // log). Empty: socket_path + ".log".
  std::string log_path;
  // After --compile_only=true --compile_threads=2; later flags win, so these
  // may undo them.
  std::vector<std::string> extra_args;
};

inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The kcached under test: $KCACHE_TEST_KCACHED (e.g. the static build on the
// GPU machine), else KCACHE_TEST_KCACHED_PATH from the build; empty if neither.
inline std::string TestKcachedPath() {
  if (const char* env = std::getenv("KCACHE_TEST_KCACHED"); env != nullptr) return env;
#ifdef KCACHE_TEST_KCACHED_PATH
  return KCACHE_TEST_KCACHED_PATH;
#else
  return std::string();
#endif
}

// A compile worker that sleeps `seconds`, then execs the real
// kcache-compile-worker beside the kcached under test (same pid and fds, so
// the daemon's pool cannot tell): the script `dir`/slow-worker.sh, for
// --worker_path. Makes a compile slow enough to watch or to join.
inline std::string SlowWorkerScript(const std::string& dir, int seconds) {
  const std::string real =
      (std::filesystem::path(TestKcachedPath()).parent_path() / "kcache-compile-worker").string();
  std::string path = dir + "/slow-worker.sh";
  std::ofstream(path) << "#!/bin/sh\nsleep " << seconds << "\nexec '" << real << "' \"$@\"\n";
  chmod(path.c_str(), 0755);
  return path;
}

class KcachedProcess {
 public:
  explicit KcachedProcess(KcachedOptions options) : o_(std::move(options)) {
    if (o_.log_path.empty()) o_.log_path = o_.socket_path + ".log";
  }
  ~KcachedProcess() { Kill(); }
  KcachedProcess(const KcachedProcess&) = delete;
  KcachedProcess& operator=(const KcachedProcess&) = delete;

  const std::string& socket() const { return o_.socket_path; }
  std::string target() const { return "unix:" + o_.socket_path; }
  const std::string& store() const { return o_.store_path; }
  const std::string& log_path() const { return o_.log_path; }
  pid_t pid() const { return pid_; }

  // Starts kcached and waits (60 s at most) until it accepts connections.
  // An error, with the daemon's log, if it exits first or does not come up
  // in time (it is then left running until Stop, Kill or the destructor).
  absl::Status TryStart() {
    if (Binary().empty()) {
      return absl::InvalidArgumentError("KcachedOptions.binary: empty, and the build names none");
    }
    std::vector<std::string> args = {Binary(), "--store_path=" + o_.store_path,
                                     "--socket_path=" + o_.socket_path, "--compile_only=true",
                                     "--compile_threads=2"};
    args.insert(args.end(), o_.extra_args.begin(), o_.extra_args.end());
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string& log = o_.log_path;
    pid_ = fork();
    if (pid_ < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    if (pid_ == 0) {
      // Only async-signal-safe calls here. The daemon dies with its parent,
      // even when a test is killed at its timeout. Its stdout goes to the log
      // too: inheriting ours would hold a pipe we print to open after we exit.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    auto channel = grpc::CreateChannel(target(), grpc::InsecureChannelCredentials());
    absl::Time until = absl::Now() + absl::Seconds(60);
    while (absl::Now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) != 0) {
        pid_ = -1;  // reaped
        return absl::FailedPreconditionError(
            absl::StrCat(args[0], " exited at start (wait status ", status, "); ", LogTail()));
      }
      if (channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)))) {
        return absl::OkStatus();
      }
    }
    return absl::DeadlineExceededError(
        absl::StrCat("kcached did not start within 60 s; ", LogTail()));
  }

  // Sends `sig` and reaps the process; returns its wait status (0 if it was
  // not running).
  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return 0;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  void Kill() { Stop(SIGKILL); }

 private:
  std::string Binary() const { return o_.binary.empty() ? TestKcachedPath() : o_.binary; }

  std::string LogTail() const {
    return absl::StrCat("see ", o_.log_path, ":\n", ReadFileOrEmpty(o_.log_path));
  }

  KcachedOptions o_;
  pid_t pid_ = -1;
};

}  // namespace kcache::testing
