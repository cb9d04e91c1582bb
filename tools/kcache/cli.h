// The `kcache` ops command line as a library function, so that tests drive
// it in process and `main` stays a thin wrapper. Commands: status, stats,
// ls, show, warm, export, import, invalidate, gc, pin, unpin, verify,
// repair.
// `kcache --help` and docs/ops.md describe them.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kcache::tools {

// Exit statuses (documented in `kcache --help` and docs/ops.md).
enum ExitCode : int {
  kExitOk = 0,           // done
  kExitFailed = 1,       // the operation failed (or found failures: warm, verify)
  kExitUsage = 2,        // bad arguments or manifest; nothing was changed
  kExitUnavailable = 3,  // no daemon answers / no store / store held by a daemon
};

struct CliIo {
  std::ostream& out;  // results
  std::ostream& err;  // errors ("kcache: ..."), progress
  bool tty = false;   // err is a terminal: draw progress bars
};

// Runs one command; `args` excludes the program name. Returns an ExitCode.
int RunKcache(const std::vector<std::string>& args, CliIo io);

}  // namespace kcache::tools
