// What every `kcache` command shares: the command table's row (Command),
// and one run of a command (CommandContext): its parsed arguments, where it
// connects, where it writes, and the checks and error reports all commands
// use. The commands themselves are in cmd_*.cc, one file per group; cli.cc
// parses the command line and dispatches.
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kcache/v1/service.pb.h"
#include "tools/kcache/admin.h"
#include "tools/kcache/args.h"
#include "tools/kcache/cli.h"

namespace kcache::tools {

class CommandContext;

// One row of the command table (cli.cc): what `kcache --help` shows and how
// the command is checked and run.
struct Command {
  std::string name;
  std::string args;  // positional arguments, for the usage line
  size_t min_pos, max_pos;
  bool mutates;
  std::string summary;
  std::vector<FlagSpec> flags;
  int (*run)(CommandContext&);  // returns an ExitCode
};

// One run of one command. Not thread-safe (a command runs on one thread).
// The checks below report their own failure (on io.err, as "kcache: CMD:
// ...") and leave the exit status in exit_code, so that a command returns
// c.exit_code when one of them says no.
class CommandContext {
 public:
  CommandContext(CliIo io, absl::Time now) : io(io), now(now) {}

  CliIo io;
  const absl::Time now;          // "now" for ages such as --before 30d
  const Command* cmd = nullptr;  // null until the command is known
  ParsedArgs args;               // global and command flags, positionals
  ConnectOptions conn;           // --socket, --target or --store
  bool as_json = false;          // --json
  int exit_code = kExitOk;       // set by a check that failed

  // Reports a usage error (exit 2) or a failure (exit 3 when unavailable,
  // else 1) and returns its exit status.
  int Usage(absl::string_view msg);
  int Fail(const absl::Status& st, absl::string_view context = {});

  // Opens the daemon or the store; nullptr after reporting the failure.
  std::unique_ptr<Admin> Open(bool create = false);

  // Argument checks, false (or nullopt) after reporting a usage error.
  bool CheckKeyArg(const std::string& key);
  bool CheckToolchainArg();
  std::optional<absl::Duration> PositiveDurationArg(const std::string& flag);
  bool BuildFilter(v1::Filter* f);

  // "current" becomes the daemon's (or this machine's) toolchain id.
  absl::Status ResolveCurrentToolchain(Admin& admin, v1::Filter* f);

  void PrintJson(const nlohmann::json& j);

  // Store ranges a scan had to skip (damaged table files), on stderr.
  template <typename Lines>
  void WarnUnreadable(const Lines& unreadable) {
    for (const auto& u : unreadable) {
      io.err << "kcache: " << cmd->name << ": skipped what could not be read: " << u << "\n";
    }
    if (!unreadable.empty()) {
      io.err << "kcache: " << cmd->name
             << ": the store is damaged; see `kcache repair --help` and docs/ops.md\n";
    }
  }
};

// The commands, by group (each returns an ExitCode).
int StatusCommand(CommandContext& c);  // cmd_status.cc
int StatsCommand(CommandContext& c);
int LsCommand(CommandContext& c);  // cmd_entries.cc
int ShowCommand(CommandContext& c);
int WarmCommand(CommandContext& c);    // cmd_warm.cc
int ExportCommand(CommandContext& c);  // cmd_bundle.cc
int ImportCommand(CommandContext& c);
int InvalidateCommand(CommandContext& c);  // cmd_maintenance.cc
int GcCommand(CommandContext& c);
int PinCommand(CommandContext& c);
int UnpinCommand(CommandContext& c);
int VerifyCommand(CommandContext& c);
int RepairCommand(CommandContext& c);

}  // namespace kcache::tools
