// Child processes for the kcache CLI's end-to-end tests: a real kcached
// (compile-only) on a given store and socket, and runs of the kcache binary
// with their exit status and output.
#pragma once

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"

extern char** environ;

namespace kcache::testing {

inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Spawns argv with stdout and stderr to files; returns the pid.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& out_path,
                   const std::string& err_path) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

struct ToolRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the kcache binary to completion in `dir` (its output files live there).
inline ToolRun RunTool(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), KCACHE_TEST_KCACHE_PATH);
  const std::string out = dir + "/tool.out", err = dir + "/tool.err";
  std::remove(err.c_str());
  ToolRun r;
  pid_t pid = Spawn(args, out, err);
  if (pid < 0) return r;
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFileOrEmpty(out);
  r.err = ReadFileOrEmpty(err);
  return r;
}

// A compile-only kcached on `store` with its socket at `socket`.
class Daemon {
 public:
  Daemon(std::string store, std::string socket, std::vector<std::string> extra = {})
      : store_(std::move(store)), socket_(std::move(socket)), extra_(std::move(extra)) {}
  ~Daemon() { Stop(SIGKILL); }

  const std::string& socket() const { return socket_; }
  std::string log_path() const { return socket_ + ".log"; }

  // Starts kcached and waits (bounded) until it accepts connections.
  void Start() {
    std::vector<std::string> args = {KCACHE_TEST_KCACHED_PATH, "--store_path=" + store_,
                                     "--socket_path=" + socket_, "--compile_only=true",
                                     "--compile_threads=2"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = Spawn(args, "/dev/null", log_path());
    ASSERT_GT(pid_, 0);
    auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    absl::Time until = absl::Now() + absl::Seconds(60);
    while (absl::Now() < until) {
      int status = 0;
      ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0)
          << "kcached exited at start: " << ReadFileOrEmpty(log_path());
      if (channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)))) {
        return;
      }
    }
    FAIL() << "kcached did not start within 60 s: " << ReadFileOrEmpty(log_path());
  }

  // SIGTERM (graceful) by default; returns the wait status.
  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return 0;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  v1::StatsResponse Stats() {
    auto stub = v1::AdminService::NewStub(
        grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::StatsResponse resp;
    grpc::Status st = stub->Stats(&ctx, v1::StatsRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }

 private:
  std::string store_, socket_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

}  // namespace kcache::testing
