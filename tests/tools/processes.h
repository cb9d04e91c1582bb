// Child processes for the kcache CLI's end-to-end tests: runs of the kcache
// binary with their exit status and output. The daemons they talk to are
// DaemonProcess (tests/common/daemon_process.h).
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/common/daemon_process.h"

extern char** environ;

namespace kcache::testing {

// Spawns argv with stdout and stderr to files; returns the pid.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& out_path,
                   const std::string& err_path) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  argv.reserve(copy.size() + 1);
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

}  // namespace kcache::testing
