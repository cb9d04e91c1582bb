// The `kcache` command line (see cli.h): the command table, help, and the
// checks common to every command (a bad argument never reaches the daemon
// or the store); then the command's own function (cmd_*.cc) runs against
// one Admin (tools/kcache/admin.h).
#include "tools/kcache/cli.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tools/kcache/args.h"
#include "tools/kcache/command.h"

// The project version (the VERSION file, through CMake's project()).
#ifndef KCACHE_VERSION
#error "KCACHE_VERSION must be defined by the build (tools/kcache/CMakeLists.txt)"
#endif

namespace kcache::tools {
namespace {

const std::vector<FlagSpec>& GlobalFlags() {
  static const auto* f = new std::vector<FlagSpec>{
      {"socket", true, "PATH",
       "the daemon's Unix socket (default: $KCACHE_TARGET, /run/kcache/kcached.sock, "
       ".kcache/kcached.sock)"},
      {"target", true, "TARGET", "the daemon's gRPC target, e.g. unix:/run/kcache/kcached.sock"},
      {"store", true, "DIR", "work on a store directory directly, without a daemon"},
      {"json", false, "", "print JSON for scripts instead of tables"},
      {"timeout", true, "DURATION", "deadline of each admin call (default 10m)"},
      {"help", false, "", "show help"},
      {"version", false, "", "print the version (" KCACHE_VERSION ") and exit"},
  };
  return *f;
}

const std::vector<FlagSpec> kFilterFlags = {
    {"toolchain", true, "ID", "only entries of this toolchain (16 hex digits, or 'current')"},
    {"arch", true, "ARCH", "only entries for this architecture, e.g. sm_90a"},
    {"mask", true, "KIND",
     "only this mask kind: none, causal, sliding_window, document, drafter, expr"},
    {"created-before", true, "WHEN", "only entries created before WHEN"},
    {"unused-since", true, "WHEN", "only entries not used since WHEN (or never used)"},
    {"pinned", false, "", "only pinned entries"},
    {"unpinned", false, "", "only entries that are not pinned"},
};

std::vector<FlagSpec> With(std::vector<FlagSpec> a, const std::vector<FlagSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<Command>& Commands() {
  static const auto* c = new std::vector<Command>{
      {"status",
       "",
       0,
       0,
       false,
       "the daemon, toolchain, devices, queues, store size and entries per toolchain",
       {},
       &StatusCommand},
      {"stats",
       "",
       0,
       0,
       false,
       "counters (requests, hits, compiles) and entries/bytes per toolchain and arch",
       {},
       &StatsCommand},
      {"ls", "", 0, 0, false, "list entries",
       With(kFilterFlags,
            {{"sort", true, "ORDER", "created | last-used | size | hits (newest/largest first)"},
             {"limit", true, "N", "show at most N entries"},
             {"full-keys", false, "", "print whole keys (82 hex digits)"}}),
       &LsCommand},
      {"show",
       "KEY",
       1,
       1,
       false,
       "one entry: spec, launch facts, resources, compile log, use (KEY: hex or unique prefix)",
       {},
       &ShowCommand},
      {"warm",
       "MANIFEST",
       1,
       1,
       false,
       "compile every spec x arch of a manifest through the daemon (no GPU needed)",
       {{"jobs", true, "N", "concurrent requests (default 4)"},
        {"deadline", true, "DURATION", "per kernel (default 10m)"}},
       &WarmCommand},
      {"export", "", 0, 0, false, "write matching entries to a bundle file",
       With({{"out", true, "FILE", "the bundle to write (required)"}}, kFilterFlags),
       &ExportCommand},
      {"import",
       "FILE",
       1,
       1,
       true,
       "import a bundle (every digest is checked first)",
       {{"allow-foreign-toolchain", false, "", "accept entries of another toolchain"},
        {"toolchain", true, "ID",
         "with --store: the toolchain the bundle must be of "
         "(default: this machine's NVRTC)"}},
       &ImportCommand},
      {"invalidate",
       "[KEY]",
       0,
       1,
       true,
       "remove entries: of a toolchain, of an arch, created before a time, or one KEY",
       {{"toolchain", true, "ID", "every entry of this toolchain (16 hex digits)"},
        {"arch", true, "ARCH", "every entry for this architecture"},
        {"before", true, "WHEN", "every entry created before WHEN"}},
       &InvalidateCommand},
      {"gc",
       "",
       0,
       0,
       true,
       "evict least-recently-used entries until the cubins fit in N bytes",
       {{"max-bytes", true, "N", "the budget, e.g. 10G (required)"},
        {"grace", true, "DURATION",
         "never evict entries used this recently (default: the "
         "daemon's / 10m)"}},
       &GcCommand},
      {"pin",
       "KEY",
       1,
       1,
       true,
       "protect an entry from eviction",
       {{"reason", true, "TEXT", "why (kept with the pin)"}},
       &PinCommand},
      {"unpin", "KEY", 1, 1, true, "remove an entry's pin", {}, &UnpinCommand},
      {"verify",
       "",
       0,
       0,
       true,
       "re-hash every cubin; quarantine and report corrupt entries (exit 1 if any)",
       {},
       &VerifyCommand},
      {"repair",
       "",
       0,
       0,
       true,
       "rebuild a damaged store's metadata from its files (--store DIR; stop kcached first)",
       {},
       &RepairCommand},
  };
  return *c;
}

const Command* FindByName(const std::string& name) {
  for (const Command& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string FlagLine(const FlagSpec& f) {
  std::string lhs = absl::StrCat("--", f.name, f.takes_value ? " " + f.value : "");
  return absl::StrFormat("  %-28s %s\n", lhs, f.help);
}

std::string MainHelp() {
  std::string s =
      "usage: kcache [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]\n"
      "Operates a kcache node: through the daemon's admin service, or directly on a\n"
      "store directory when no daemon runs (read commands open it read-only while a\n"
      "daemon holds it; commands that change it must then go through the daemon).\n\n"
      "commands:\n";
  for (const Command& c : Commands()) {
    absl::StrAppend(&s, absl::StrFormat("  %-12s %s\n", c.name, c.summary));
  }
  absl::StrAppend(&s, "\nglobal flags:\n");
  for (const FlagSpec& f : GlobalFlags()) absl::StrAppend(&s, FlagLine(f));
  absl::StrAppend(&s,
                  "\nWHEN: 2026-11-30, 2026-11-30T12:00:00Z, @UNIX_MS, or an age: 30d, 12h, 90m\n"
                  "\nexit status:\n"
                  "  0  done\n"
                  "  1  the operation failed (warm: a spec failed; verify: corrupt entries)\n"
                  "  2  bad arguments or manifest (nothing was changed)\n"
                  "  3  no daemon answers, no store, or the store is held by a daemon\n"
                  "\n`kcache COMMAND --help` describes a command; docs/ops.md has more.\n");
  return s;
}

std::string CommandHelp(const Command& c) {
  std::string s = absl::StrCat("usage: kcache ", c.name, c.args.empty() ? "" : " " + c.args,
                               c.flags.empty() ? "" : " [FLAGS]", "\n", c.summary, "\n");
  if (!c.flags.empty()) {
    absl::StrAppend(&s, "\nflags:\n");
    for (const FlagSpec& f : c.flags) absl::StrAppend(&s, FlagLine(f));
  }
  absl::StrAppend(&s,
                  "\nglobal flags: --socket PATH | --target T | --store DIR, --json, "
                  "--timeout DURATION (see kcache --help)\n");
  return s;
}

// The first argument that is not a flag (nor a global flag's value).
int FindCommand(const std::vector<std::string>& argv) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") return i + 1 < argv.size() ? static_cast<int>(i + 1) : -1;
    if (a.size() > 1 && a[0] == '-') {
      if (!absl::StrContains(a, '=')) {
        std::string name = a.substr(a[1] == '-' ? 2 : 1);
        for (const FlagSpec& f : GlobalFlags()) {
          if (f.name == name && f.takes_value) ++i;
        }
      }
      continue;
    }
    return static_cast<int>(i);
  }
  return -1;
}

std::string VersionLine() { return absl::StrCat("kcache ", KCACHE_VERSION, "\n"); }

}  // namespace

int RunKcache(const std::vector<std::string>& argv, CliIo io) {
  CommandContext c(io, absl::Now());
  int ci = FindCommand(argv);
  if (ci < 0) {
    auto parsed = ParseArgs(argv, GlobalFlags());
    if (parsed.ok() && parsed->has("help")) {
      io.out << MainHelp();
      return kExitOk;
    }
    if (parsed.ok() && parsed->has("version")) {
      io.out << VersionLine();
      return kExitOk;
    }
    if (!parsed.ok()) return c.Usage(parsed.status().message());
    return c.Usage("no command given");
  }
  const std::string& name = argv[ci];
  if (name == "help") {
    const Command* h = ci + 1 < static_cast<int>(argv.size()) ? FindByName(argv[ci + 1]) : nullptr;
    io.out << (h ? CommandHelp(*h) : MainHelp());
    return kExitOk;
  }
  c.cmd = FindByName(name);
  if (c.cmd == nullptr) return c.Usage(absl::StrCat("unknown command '", name, "'"));
  std::vector<std::string> rest(argv.begin(), argv.begin() + ci);
  rest.insert(rest.end(), argv.begin() + ci + 1, argv.end());
  auto parsed = ParseArgs(rest, With(GlobalFlags(), c.cmd->flags));
  if (!parsed.ok()) return c.Usage(parsed.status().message());
  c.args = *std::move(parsed);
  if (c.args.has("help")) {
    io.out << CommandHelp(*c.cmd);
    return kExitOk;
  }
  if (c.args.has("version")) {
    io.out << VersionLine();
    return kExitOk;
  }
  if (c.args.positional.size() < c.cmd->min_pos || c.args.positional.size() > c.cmd->max_pos) {
    return c.Usage(c.cmd->max_pos == 0
                       ? absl::StrCat("unexpected argument '", c.args.positional[0], "'")
                       : absl::StrCat("expects ", c.cmd->args));
  }
  c.as_json = c.args.has("json");
  c.conn.socket = c.args.get("socket");
  c.conn.target = c.args.get("target");
  c.conn.store = c.args.get("store");
  if (int given = !c.conn.socket.empty() + !c.conn.target.empty() + !c.conn.store.empty();
      given > 1) {
    return c.Usage("give at most one of --socket, --target and --store");
  }
  if (c.args.has("timeout")) {
    auto t = c.PositiveDurationArg("timeout");
    if (!t) return c.exit_code;
    c.conn.rpc_timeout = *t;
  }
  return c.cmd->run(c);
}

}  // namespace kcache::tools
