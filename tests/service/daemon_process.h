// A real kcached in a child process, for end-to-end tests: started on a
// temporary store and socket, stopped with SIGTERM or SIGKILL, restarted on
// the same store.
#pragma once

#include <grpcpp/grpcpp.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"

namespace kcache::testing {

class DaemonProcess {
 public:
  // `dir` holds the store, the socket and the daemon's log.
  DaemonProcess(std::string dir, std::vector<std::string> extra_args = {})
      : dir_(std::move(dir)), extra_(std::move(extra_args)) {}
  ~DaemonProcess() { Kill(); }

  std::string socket() const { return dir_ + "/kcached.sock"; }
  std::string target() const { return "unix:" + socket(); }
  std::string log_path() const { return dir_ + "/kcached.log"; }

  // Starts kcached and waits until its health service answers SERVING.
  void Start() {
    // KCACHE_TEST_KCACHED overrides the binary (e.g. the static build on the
    // GPU machine). Later flags win, so extra_args may undo --compile_only.
    const char* bin = std::getenv("KCACHE_TEST_KCACHED");
    std::vector<std::string> args = {bin != nullptr ? bin : KCACHE_TEST_KCACHED_PATH,
                                     "--store_path=" + dir_ + "/store",
                                     "--socket_path=" + socket(),
                                     "--compile_only=true",
                                     "--compile_threads=2"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string log = log_path();
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      // Only async-signal-safe calls here. The daemon dies with the test,
      // even when the test is killed at its timeout.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) dup2(fd, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    auto channel = grpc::CreateChannel(target(), grpc::InsecureChannelCredentials());
    absl::Time until = absl::Now() + absl::Seconds(60);
    while (absl::Now() < until) {
      int status = 0;
      ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << "kcached exited at start; see " << log_path();
      if (channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)))) {
        return;
      }
    }
    FAIL() << "kcached did not start within 60 s; see " << log_path();
  }

  // Sends `sig` and reaps the process; returns its wait status.
  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return 0;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  void Kill() { Stop(SIGKILL); }
  pid_t pid() const { return pid_; }

  v1::StatsResponse Stats() {
    auto stub = v1::AdminService::NewStub(
        grpc::CreateChannel(target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::StatsResponse resp;
    grpc::Status st = stub->Stats(&ctx, v1::StatsRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }

 private:
  std::string dir_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

}  // namespace kcache::testing
