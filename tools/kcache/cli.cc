// The `kcache` commands (see cli.h): argument checking first (a bad
// argument never reaches the daemon or the store), then one Admin
// (tools/kcache/admin.h) to talk to, then output as a table or JSON.
#include "tools/kcache/cli.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cache/bundle.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/store.h"
#include "compiler/attention/spec_json.h"
#ifdef KCACHE_TOOLS_WITH_LLVM
#include "compiler/llvm/cubin_elf.h"
#endif
#include "tools/kcache/admin.h"
#include "tools/kcache/args.h"
#include "tools/kcache/manifest.h"
#include "tools/kcache/output.h"
#include "tools/kcache/remote_output.h"
#include "tools/kcache/warm.h"

namespace kcache::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// `kcache show`'s line for the numeric check before serve (issue 28).
std::string NumericCheckLine(const v1::NumericCheck& c) {
  switch (c.state()) {
    case v1::NUMERIC_CHECK_PASSED:
      return absl::StrFormat("passed on %s (rel L2 %.2e <= %.0e, worst |diff| %.2e, %.2f s)",
                             c.device(), c.rel_l2_error(), c.tolerance(), c.max_abs_error(),
                             c.check_time_us() / 1e6);
    case v1::NUMERIC_CHECK_UNCHECKED:
      return "unchecked (compiled without a device to run it on)";
    default:
      return "unchecked (recorded before the check existed)";
  }
}

const std::vector<FlagSpec>& GlobalFlags() {
  static const auto* f = new std::vector<FlagSpec>{
      {"socket", true, "PATH", "the daemon's Unix socket (default: $KCACHE_TARGET, /run/kcache/kcached.sock, .kcache/kcached.sock)"},
      {"target", true, "TARGET", "the daemon's gRPC target, e.g. unix:/run/kcache/kcached.sock"},
      {"store", true, "DIR", "work on a store directory directly, without a daemon"},
      {"json", false, "", "print JSON for scripts instead of tables"},
      {"timeout", true, "DURATION", "deadline of each admin call (default 10m)"},
      {"help", false, "", "show help"},
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

struct Command {
  std::string name;
  std::string args;  // positional arguments, for the usage line
  size_t min_pos, max_pos;
  bool mutates;
  std::string summary;
  std::vector<FlagSpec> flags;
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
       {}},
      {"stats",
       "",
       0,
       0,
       false,
       "counters (requests, hits, compiles) and entries/bytes per toolchain and arch",
       {}},
      {"ls", "", 0, 0, false, "list entries",
       With(kFilterFlags,
            {{"sort", true, "ORDER", "created | last-used | size | hits (newest/largest first)"},
             {"limit", true, "N", "show at most N entries"},
             {"full-keys", false, "", "print whole keys (82 hex digits)"}})},
      {"show",
       "KEY",
       1,
       1,
       false,
       "one entry: spec, launch facts, resources, compile log, use (KEY: hex or unique prefix)",
       {}},
      {"warm",
       "MANIFEST",
       1,
       1,
       false,
       "compile every spec x arch of a manifest through the daemon (no GPU needed)",
       {{"jobs", true, "N", "concurrent requests (default 4)"},
        {"deadline", true, "DURATION", "per kernel (default 10m)"}}},
      {"export", "", 0, 0, false, "write matching entries to a bundle file",
       With({{"out", true, "FILE", "the bundle to write (required)"}}, kFilterFlags)},
      {"import",
       "FILE",
       1,
       1,
       true,
       "import a bundle (every digest is checked first)",
       {{"allow-foreign-toolchain", false, "", "accept entries of another toolchain"},
        {"toolchain", true, "ID",
         "with --store: the toolchain the bundle must be of "
         "(default: this machine's NVRTC)"}}},
      {"invalidate",
       "[KEY]",
       0,
       1,
       true,
       "remove entries: of a toolchain, of an arch, created before a time, or one KEY",
       {{"toolchain", true, "ID", "every entry of this toolchain (16 hex digits)"},
        {"arch", true, "ARCH", "every entry for this architecture"},
        {"before", true, "WHEN", "every entry created before WHEN"}}},
      {"gc",
       "",
       0,
       0,
       true,
       "evict least-recently-used entries until the cubins fit in N bytes",
       {{"max-bytes", true, "N", "the budget, e.g. 10G (required)"},
        {"grace", true, "DURATION",
         "never evict entries used this recently (default: the "
         "daemon's / 10m)"}}},
      {"pin",
       "KEY",
       1,
       1,
       true,
       "protect an entry from eviction",
       {{"reason", true, "TEXT", "why (kept with the pin)"}}},
      {"unpin", "KEY", 1, 1, true, "remove an entry's pin", {}},
      {"verify",
       "",
       0,
       0,
       true,
       "re-hash every cubin; quarantine and report corrupt entries (exit 1 if any)",
       {}},
      {"repair",
       "",
       0,
       0,
       true,
       "rebuild a damaged store's metadata from its files (--store DIR; stop kcached first)",
       {}},
  };
  return *c;
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
      if (a.find('=') == std::string::npos) {
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

class Cli {
 public:
  explicit Cli(CliIo io) : io_(io), now_(absl::Now()) {}

  int Run(const std::vector<std::string>& argv) {
    int ci = FindCommand(argv);
    if (ci < 0) {
      auto parsed = ParseArgs(argv, GlobalFlags());
      if (parsed.ok() && parsed->has("help")) {
        io_.out << MainHelp();
        return kExitOk;
      }
      if (!parsed.ok()) return Usage(parsed.status().message());
      return Usage("no command given");
    }
    std::string name = argv[ci];
    if (name == "help") {
      const Command* c = ci + 1 < static_cast<int>(argv.size()) ? Find(argv[ci + 1]) : nullptr;
      io_.out << (c ? CommandHelp(*c) : MainHelp());
      return kExitOk;
    }
    cmd_ = Find(name);
    if (cmd_ == nullptr) return Usage(absl::StrCat("unknown command '", name, "'"));
    std::vector<std::string> rest(argv.begin(), argv.begin() + ci);
    rest.insert(rest.end(), argv.begin() + ci + 1, argv.end());
    auto parsed = ParseArgs(rest, With(GlobalFlags(), cmd_->flags));
    if (!parsed.ok()) return Usage(parsed.status().message());
    a_ = *std::move(parsed);
    if (a_.has("help")) {
      io_.out << CommandHelp(*cmd_);
      return kExitOk;
    }
    if (a_.positional.size() < cmd_->min_pos || a_.positional.size() > cmd_->max_pos) {
      return Usage(cmd_->max_pos == 0 ? absl::StrCat("unexpected argument '", a_.positional[0], "'")
                                      : absl::StrCat("expects ", cmd_->args));
    }
    json_ = a_.has("json");
    conn_.socket = a_.get("socket");
    conn_.target = a_.get("target");
    conn_.store = a_.get("store");
    if (int given = !conn_.socket.empty() + !conn_.target.empty() + !conn_.store.empty();
        given > 1) {
      return Usage("give at most one of --socket, --target and --store");
    }
    if (a_.has("timeout")) {
      auto t = PositiveDurationArg("timeout");
      if (!t) return exit_;
      conn_.rpc_timeout = *t;
    }
    static const std::map<std::string, int (Cli::*)()> kRun = {
        {"status", &Cli::Status}, {"stats", &Cli::Stats},
        {"ls", &Cli::Ls},         {"show", &Cli::Show},
        {"warm", &Cli::Warm},     {"export", &Cli::Export},
        {"import", &Cli::Import}, {"invalidate", &Cli::Invalidate},
        {"gc", &Cli::Gc},         {"pin", &Cli::Pin},
        {"unpin", &Cli::Unpin},   {"verify", &Cli::Verify},
        {"repair", &Cli::Repair}};
    return (this->*kRun.at(cmd_->name))();
  }

 private:
  static const Command* Find(const std::string& name) {
    for (const Command& c : Commands()) {
      if (c.name == name) return &c;
    }
    return nullptr;
  }

  int Usage(absl::string_view msg) {
    io_.err << "kcache: " << (cmd_ ? cmd_->name + ": " : "") << msg << " (see kcache "
            << (cmd_ ? cmd_->name + " " : "") << "--help)\n";
    return kExitUsage;
  }
  int Fail(const absl::Status& st, absl::string_view context = {}) {
    io_.err << "kcache: " << (cmd_ ? cmd_->name + ": " : "") << context
            << (context.empty() ? "" : ": ") << st.message() << "\n";
    if (absl::IsUnavailable(st)) return kExitUnavailable;
    return kExitFailed;
  }

  // Opens the daemon or the store; nullptr after reporting the failure.
  std::unique_ptr<Admin> Open(bool create = false) {
    auto admin = tools::Connect(conn_, cmd_->mutates, create);
    if (!admin.ok()) {
      exit_ = Fail(admin.status());
      return nullptr;
    }
    return *std::move(admin);
  }

  // A hex key or prefix typed by a person, checked before anything is opened.
  bool CheckKeyArg(const std::string& key) {
    if (auto p = ParseHexKeyPrefix(key); !p.ok()) {
      exit_ = Usage(absl::StrCat("KEY '", key, "': ", p.status().message()));
      return false;
    }
    return true;
  }

  // --toolchain as a 16-digit hex id (import, invalidate), checked; false
  // after reporting a usage error.
  bool CheckToolchainArg() {
    const std::string id = a_.get("toolchain");
    if (!ParseToolchainIdHex(id).ok()) {
      exit_ = Usage(absl::StrCat("--toolchain: '", id, "' is not a 16-digit hex id"));
      return false;
    }
    return true;
  }

  // --`flag` as a positive duration (--timeout, --deadline); nullopt after
  // reporting a usage error.
  std::optional<absl::Duration> PositiveDurationArg(const std::string& flag) {
    auto d = ParseDurationArg(a_.get(flag));
    if (!d.ok() || *d <= absl::ZeroDuration()) {
      exit_ =
          Usage(absl::StrCat("--", flag, ": ", d.ok() ? "must be positive" : d.status().message()));
      return std::nullopt;
    }
    return *d;
  }

  // The filter flags (ls, export), checked; false after reporting a usage error.
  bool BuildFilter(v1::Filter* f) {
    if (a_.has("toolchain")) {
      std::string id = a_.get("toolchain");
      if (id != "current" && !ParseToolchainIdHex(id).ok()) {
        exit_ =
            Usage(absl::StrCat("--toolchain: '", id, "' is not a 16-digit hex id or 'current'"));
        return false;
      }
      f->set_toolchain_id(id);
    }
    if (a_.has("arch")) f->set_arch(a_.get("arch"));
    if (a_.has("mask")) {
      static const std::vector<std::string> kKinds = {"none",     "causal",  "sliding_window",
                                                      "document", "drafter", "expr"};
      std::string m = a_.get("mask");
      if (std::find(kKinds.begin(), kKinds.end(), m) == kKinds.end()) {
        exit_ =
            Usage(absl::StrCat("--mask: '", m, "' is not one of ", absl::StrJoin(kKinds, ", ")));
        return false;
      }
      f->set_mask_kind(m);
    }
    for (const char* flag : {"created-before", "unused-since"}) {
      if (!a_.has(flag)) continue;
      auto t = ParseWhen(a_.get(flag), now_);
      if (!t.ok()) {
        exit_ = Usage(absl::StrCat("--", flag, ": ", t.status().message()));
        return false;
      }
      int64_t ms = absl::ToUnixMillis(*t);
      if (std::string(flag) == "created-before") {
        f->set_created_before_unix_ms(ms);
      } else {
        f->set_unused_since_unix_ms(ms);
      }
    }
    if (a_.has("pinned") && a_.has("unpinned")) {
      exit_ = Usage("--pinned and --unpinned exclude each other");
      return false;
    }
    if (a_.has("pinned")) f->set_pinned(v1::Filter::PINNED_ONLY);
    if (a_.has("unpinned")) f->set_pinned(v1::Filter::PINNED_NONE);
    return true;
  }

  // "current" becomes the daemon's (or this machine's) toolchain id.
  absl::Status ResolveCurrentToolchain(Admin& admin, v1::Filter* f) {
    if (f->toolchain_id() != "current") return absl::OkStatus();
    auto s = admin.Stats();
    if (!s.ok()) return s.status();
    if (s->toolchain().id().empty()) {
      return absl::FailedPreconditionError(
          "--toolchain current: the current toolchain is unknown "
          "(no daemon, and NVRTC does not load here)");
    }
    f->set_toolchain_id(s->toolchain().id());
    return absl::OkStatus();
  }

  void PrintJson(const json& j) { io_.out << j.dump(2) << "\n"; }

  // Store ranges a scan had to skip (damaged table files), on stderr.
  template <typename Lines>
  void WarnUnreadable(const Lines& unreadable) {
    for (const auto& u : unreadable) {
      io_.err << "kcache: " << cmd_->name << ": skipped what could not be read: " << u << "\n";
    }
    if (!unreadable.empty()) {
      io_.err << "kcache: " << cmd_->name
              << ": the store is damaged; see `kcache repair --help` and docs/ops.md\n";
    }
  }

  // --- status / stats --------------------------------------------------------

  struct ToolchainRow {
    uint64_t entries = 0, bytes = 0;
    std::vector<std::string> archs;
  };
  static std::map<std::string, ToolchainRow> ByToolchain(const v1::StatsResponse& s) {
    std::map<std::string, ToolchainRow> out;
    for (const auto& g : s.groups()) {
      auto& r = out[g.toolchain_id()];
      r.entries += g.entries();
      r.bytes += g.bytes();
      r.archs.push_back(g.arch());
    }
    return out;
  }

  json StatsJson(const Admin& admin, const v1::StatsResponse& s) {
    json j = ProtoToJson(s);
    j["source"] = admin.Describe();
    j["mode"] = admin.channel() ? "daemon" : "store";
    json tcs = json::array();
    for (const auto& [id, r] : ByToolchain(s)) {
      tcs.push_back(
          {{"toolchain_id", id},
           {"entries", r.entries},
           {"bytes", r.bytes},
           {"current", id == s.toolchain().id()},
           {"current_raw", !s.raw_toolchain().id().empty() && id == s.raw_toolchain().id()}});
    }
    j["toolchains"] = tcs;
    return j;
  }

  // status and stats: the stats as JSON with --json, otherwise `text`.
  int PrintStats(absl::FunctionRef<void(const Admin&, const v1::StatsResponse&)> text) {
    auto admin = Open();
    if (!admin) return exit_;
    auto s = admin->Stats();
    if (!s.ok()) return Fail(s.status());
    if (json_) {
      PrintJson(StatsJson(*admin, *s));
    } else {
      text(*admin, *s);
    }
    WarnUnreadable(s->unreadable());
    if (!s->store_damage().empty()) io_.err << "kcache: " << s->store_damage() << "\n";
    return kExitOk;
  }

  int Status() {
    return PrintStats([&](const Admin& admin, const v1::StatsResponse& s) {
      const bool daemon = admin.channel() != nullptr;
      std::ostream& o = io_.out;
      o << "source      " << admin.Describe()
        << (daemon ? (s.compile_only() ? " (compile-only)" : "") : " (no daemon)") << "\n";
      const auto& tc = s.toolchain();
      o << "toolchain   "
        << (tc.id().empty() ? std::string("unknown (NVRTC does not load here)")
                            : absl::StrCat(tc.compiler(), " ", tc.version(), "  id ", tc.id(),
                                           daemon ? "" : "  (this machine's NVRTC)"))
        << "\n";
      // Raw kernels (LLVM IR, PTX) key under a toolchain of their own: its
      // id changes with the LLVM or nvJitLink release, so after an upgrade
      // the old one shows below as "other", to invalidate.
      const auto& raw = s.raw_toolchain();
      o << "raw         "
        << (!raw.id().empty()
                ? absl::StrCat(raw.compiler(), " ", raw.version(), "  id ", raw.id(),
                               daemon ? "" : "  (this machine's LLVM and nvJitLink)")
                : std::string(daemon ? "off (kcached runs without --enable_raw_kernels)"
                                     : "unknown (nvJitLink does not load here)"))
        << "\n";
      if (daemon) {
        o << "devices     "
          << (s.devices().empty() ? std::string("none (compiles for named architectures only)")
                                  : absl::StrJoin(s.devices(), "; "))
          << "\n";
        std::vector<std::string> qs;
        for (const auto& q : s.queues()) {
          qs.push_back(
              absl::StrCat(q.name(), " ", q.busy() ? "busy" : "idle", ", ", q.depth(), " queued"));
        }
        o << "queues      " << (qs.empty() ? std::string("none yet") : absl::StrJoin(qs, "; "))
          << "\n";
        if (s.has_remote()) o << "remote      " << RemoteStatusLine(s.remote()) << "\n";
      }
      o << "store       " << s.entries() << " entries, " << s.blobs() << " cubins, "
        << HumanBytes(s.blob_bytes()) << ", " << s.pinned() << " pinned, " << s.quarantined()
        << " quarantined\n\n";
      Table t({"TOOLCHAIN", "ENTRIES", "BYTES", "ARCHS", ""}, {false, true, true, false, false});
      for (const auto& [id, r] : ByToolchain(s)) {
        t.Add({id, absl::StrCat(r.entries), HumanBytes(r.bytes), absl::StrJoin(r.archs, ","),
               id == tc.id()                        ? "current"
               : !raw.id().empty() && id == raw.id() ? "current (raw kernels)"
                                                     : "other: never served; kcache invalidate "
                                                       "--toolchain " + id});
      }
      if (t.size() == 0) {
        o << "(no entries)\n";
      } else {
        t.Print(o);
      }
    });
  }

  int Stats() {
    return PrintStats([&](const Admin& admin, const v1::StatsResponse& s) {
      std::ostream& o = io_.out;
      if (admin.channel()) {
        uint64_t answered = s.hits() + s.misses();
        o << "requests          " << s.requests() << "\n"
          << "hits              " << s.hits()
          << (answered ? absl::StrFormat(" (%.1f%%)", 100.0 * s.hits() / answered) : "") << "\n"
          << "misses            " << s.misses() << "\n"
          << "compiles          " << s.compiles() << "\n"
          << "compile failures  " << s.compile_failures() << "\n";
        if (s.has_remote()) PrintRemoteStats(o, s.remote());
      }
      o << "entries           " << s.entries() << "\n"
        << "cubins            " << s.blobs() << " (" << HumanBytes(s.blob_bytes()) << ")\n"
        << "pinned            " << s.pinned() << "\n"
        << "quarantined       " << s.quarantined() << "\n\n";
      Table t({"TOOLCHAIN", "ARCH", "ENTRIES", "BYTES"}, {false, false, true, true});
      for (const auto& g : s.groups()) {
        const bool current = g.toolchain_id() == s.toolchain().id() ||
                             (!s.raw_toolchain().id().empty() &&
                              g.toolchain_id() == s.raw_toolchain().id());
        t.Add({g.toolchain_id() + (current ? "*" : ""), g.arch(),
               absl::StrCat(g.entries()), HumanBytes(g.bytes())});
      }
      t.Print(o);
      if (!s.toolchain().id().empty()) o << "(* a current toolchain: attention or raw kernels)\n";
    });
  }

  // --- ls / show ------------------------------------------------------------

  int Ls() {
    v1::Filter filter;
    if (!BuildFilter(&filter)) return exit_;
    std::string sort = a_.get("sort");
    if (!sort.empty() && sort != "created" && sort != "last-used" && sort != "size" &&
        sort != "hits") {
      return Usage(absl::StrCat("--sort: '", sort, "' is not created, last-used, size or hits"));
    }
    uint64_t limit = UINT64_MAX;
    if (a_.has("limit") && !absl::SimpleAtoi(a_.get("limit"), &limit)) {
      return Usage(absl::StrCat("--limit: '", a_.get("limit"), "' is not a number"));
    }
    auto admin = Open();
    if (!admin) return exit_;
    if (auto st = ResolveCurrentToolchain(*admin, &filter); !st.ok()) return Fail(st);
    std::vector<v1::EntrySummary> entries;
    std::string token;
    do {
      auto page = admin->List(filter, 1000, token);
      if (!page.ok()) return Fail(page.status());
      WarnUnreadable(page->unreadable());
      for (auto& e : *page->mutable_entries()) entries.push_back(std::move(e));
      token = page->next_page_token();
      // Without a sort the store's key order is the answer: stop early.
      if (sort.empty() && entries.size() >= limit) break;
    } while (!token.empty());
    auto by = [&](auto f) {
      std::stable_sort(entries.begin(), entries.end(),
                       [&](const auto& x, const auto& y) { return f(x) > f(y); });
    };
    if (sort == "created")
      by([](const v1::EntrySummary& e) { return e.record().created_unix_ms(); });
    if (sort == "last-used")
      by([](const v1::EntrySummary& e) { return e.access().last_used_unix_ms(); });
    if (sort == "size") by([](const v1::EntrySummary& e) { return e.record().cubin_size(); });
    if (sort == "hits") by([](const v1::EntrySummary& e) { return e.access().hits(); });
    if (entries.size() > limit) entries.resize(limit);
    if (json_) {
      json arr = json::array();
      for (const auto& e : entries) {
        json j = ProtoToJson(e);
        j["description"] = attention::DescribeSpec(e.record().spec());
        arr.push_back(std::move(j));
      }
      PrintJson({{"entries", arr}});
      return kExitOk;
    }
    Table t({"KEY", "ARCH", "SPEC", "SIZE", "HITS", "LAST USED", "CREATED", "FLAGS"},
            {false, false, false, true, true, false, false, false});
    for (const auto& e : entries) {
      const auto& r = e.record();
      std::vector<std::string> flags;
      if (e.pinned()) flags.push_back("pinned");
      flags.push_back(r.verified() ? "verified" : "unverified");
      if (r.numeric_check().state() != v1::NUMERIC_CHECK_PASSED) flags.push_back("unchecked");
      t.Add({a_.has("full-keys") ? KeyToHex(r.key()) : ShortKey(r.key()), r.arch(),
             attention::DescribeSpec(r.spec()), HumanBytes(r.cubin_size()),
             absl::StrCat(e.access().hits()), FormatUnixMs(e.access().last_used_unix_ms()),
             FormatUnixMs(r.created_unix_ms()), absl::StrJoin(flags, ",")});
    }
    t.Print(io_.out);
    return kExitOk;
  }

  // The kernels inside the cubin itself, read from its ELF (no GPU, no
  // NVIDIA disassembler): names, registers, shared memory, code size.
  void PrintCubinKernels(Admin& admin, const std::string& key, std::ostream& o) {
#ifdef KCACHE_TOOLS_WITH_LLVM
    auto cubin = admin.Cubin(key);
    if (!cubin.ok()) {
      o << "\ncubin kernels: cannot fetch the cubin: " << cubin.status().message() << "\n";
      return;
    }
    auto info = ReadCubin(*cubin);
    if (!info.ok()) {
      o << "\ncubin kernels: " << info.status().message() << "\n";
      return;
    }
    o << "\ncubin kernels (from the ELF, " << info->arch << "):\n";
    auto num = [](int64_t v) { return v < 0 ? std::string("?") : absl::StrCat(v); };
    Table t({"  NAME", "KIND", "REGS", "STATIC SMEM", "FRAME", "PARAMS", "CODE"},
            {false, false, true, true, true, true, true});
    for (const CubinKernel& k : info->kernels) {
      t.Add({"  " + k.name, k.entry ? "kernel" : "device fn", num(k.registers),
             num(k.static_smem_bytes), num(k.frame_bytes), num(k.param_bytes), num(k.code_bytes)});
    }
    t.Print(o);
    for (const std::string& n : info->notes) o << "  note: " << n << "\n";
#else
    o << "\ncubin kernels: this kcache was built without LLVM (KCACHE_WITH_LLVM=OFF)\n";
#endif
  }

  int Show() {
    const std::string key = a_.positional[0];
    if (!CheckKeyArg(key)) return exit_;
    auto admin = Open();
    if (!admin) return exit_;
    auto e = admin->Inspect(key);
    if (!e.ok()) return Fail(e.status(), key);
    const v1::KernelRecord& r = e->record();
    if (json_) {
      json j = ProtoToJson(*e);
      j["description"] = attention::DescribeSpec(r.spec());
#ifdef KCACHE_TOOLS_WITH_LLVM
      if (auto cubin = admin->Cubin(key); cubin.ok()) {
        if (auto info = ReadCubin(*cubin); info.ok()) {
          json ks = json::array();
          for (const CubinKernel& k : info->kernels) {
            ks.push_back({{"name", k.name},
                          {"entry", k.entry},
                          {"registers", k.registers},
                          {"static_smem_bytes", k.static_smem_bytes},
                          {"frame_bytes", k.frame_bytes},
                          {"param_bytes", k.param_bytes},
                          {"code_bytes", k.code_bytes}});
          }
          j["cubin_kernels"] = ks;
        }
      }
#endif
      PrintJson(j);
      return kExitOk;
    }
    std::ostream& o = io_.out;
    const auto& tc = r.toolchain();
    o << "key           " << KeyToHex(r.key()) << "\n"
      << "spec          "
      << (r.has_raw() ? absl::StrCat("raw kernel (", v1::RawKernel::Format_Name(r.raw().format()),
                                     ": ", absl::StrJoin(r.raw().kernel_names(), ", "), ")")
                      : attention::DescribeSpec(r.spec()))
      << "\n"
      << "arch          " << r.arch() << "\n"
      << "toolchain     " << tc.compiler() << " " << tc.version() << "  id " << tc.id()
      << "  build " << tc.build() << "\n"
      << "options       " << absl::StrJoin(tc.options(), " ") << "\n"
      << "verified      "
      << (r.verified() ? absl::StrCat("yes, on ", r.verified_on())
                       : std::string("no (compiled without a device of this arch)"))
      << "\n"
      << "numeric check " << NumericCheckLine(r.numeric_check()) << "\n"
      << "size          " << HumanBytes(r.cubin_size()) << " (" << r.cubin_size() << " bytes)"
      << "\n"
      << "cubin sha256  " << ToHex(r.cubin_sha256()) << "\n"
      << "created       " << FormatUnixMs(r.created_unix_ms()) << "\n"
      << "compile time  " << absl::StrFormat("%.2f s", r.compile_time_us() / 1e6) << "\n"
      << "hits          " << e->access().hits() << "\n"
      << "last used     " << FormatUnixMs(e->access().last_used_unix_ms()) << "\n"
      << "pinned        " << (e->pinned() ? "yes" : "no") << "\n"
      << "templates     " << r.template_digest() << "  (launch ABI " << r.abi_version() << ")\n"
      << "\nentry points:\n";
    Table t({"  NAME", "ROLE", "THREADS", "DYN SMEM", "TILE", "REGS", "STATIC SMEM", "MAX DYN",
             "LOCAL", "SPILL"},
            {false, false, true, true, false, true, true, true, true, true});
    for (const auto& ep : r.entry_points()) {
      const auto& res = ep.resources();
      t.Add({"  " + ep.name(), v1::EntryRole_Name(ep.role()), absl::StrCat(ep.threads()),
             absl::StrCat(ep.dynamic_smem_bytes()), absl::StrCat(ep.block_m(), "x", ep.block_n()),
             absl::StrCat(res.registers()), absl::StrCat(res.static_smem_bytes()),
             absl::StrCat(res.max_dynamic_smem_bytes()), absl::StrCat(res.local_bytes()),
             absl::StrCat(res.spill_bytes())});
    }
    t.Print(o);
    PrintCubinKernels(*admin, key, o);
    if (r.has_raw()) {
      o << "\nraw kernel:   " << v1::RawKernel::Format_Name(r.raw().format()) << ", "
        << r.raw().source_size() << " bytes, source sha256 " << ToHex(r.raw().source_sha256())
        << "\n";
    } else {
      o << "\nspec (JSON):\n" << attention::SpecToJson(r.spec()) << "\n";
    }
    o << "\ncompile log:\n" << (r.compile_log().empty() ? "(empty)" : r.compile_log()) << "\n";
    return kExitOk;
  }

  // --- warm -------------------------------------------------------------------

  int Warm() {
    if (!conn_.store.empty()) {
      return Usage(
          "warm compiles through a daemon, not on a store directly; start one first: "
          "kcached --compile_only --store_path=DIR --socket_path=SOCK & then kcache "
          "warm --socket SOCK MANIFEST");
    }
    WarmOptions wo;
    if (a_.has("jobs")) {
      int jobs = 0;
      if (!absl::SimpleAtoi(a_.get("jobs"), &jobs) || jobs < 1 || jobs > 64) {
        return Usage(absl::StrCat("--jobs: '", a_.get("jobs"), "' is not a number in 1..64"));
      }
      wo.jobs = jobs;
    }
    if (a_.has("deadline")) {
      auto d = PositiveDurationArg("deadline");
      if (!d) return exit_;
      wo.deadline = *d;
    }
    auto items = LoadManifest(a_.positional[0]);
    if (!items.ok()) return Usage(items.status().message());
    auto admin = Open();
    if (!admin) return exit_;
    if (admin->channel() == nullptr) {
      return Fail(absl::UnavailableError(
          "warm needs a running daemon and none answers (start kcached --compile_only, or "
          "pass --socket)"));
    }
    Progress bar(io_.err, io_.tty && !json_, "warm", items->size());
    size_t compiled = 0, cached = 0, failed = 0;
    wo.on_done = [&](const WarmResult& r, size_t done) {
      const char* what = !r.status.ok() ? "FAILED" : r.hit ? "cached" : "compiled";
      if (!r.status.ok()) {
        ++failed;
      } else if (r.hit) {
        ++cached;
      } else {
        ++compiled;
      }
      std::string label = absl::StrCat(r.item.name, " ", r.item.arch);
      if (bar.tty()) {
        bar.Update(done, absl::StrCat(compiled, " compiled, ", cached, " cached, ", failed,
                                      " failed  ", label));
      } else if (!json_) {
        io_.err << absl::StrFormat("[%d/%d] %-8s %s (%.1f s)%s\n", done, items->size(), what, label,
                                   absl::ToDoubleSeconds(r.elapsed),
                                   r.status.ok() ? "" : ": " + std::string(r.status.message()));
      }
    };
    absl::Time start = absl::Now();
    std::vector<WarmResult> results = tools::Warm(admin->channel(), *items, wo);
    bar.Finish();
    if (json_) {
      json arr = json::array();
      for (const auto& r : results) {
        arr.push_back({{"name", r.item.name},
                       {"arch", r.item.arch},
                       {"result", !r.status.ok() ? "failed"
                                  : r.hit        ? "cached"
                                                 : "compiled"},
                       {"key", r.status.ok() ? KeyToHex(r.key) : ""},
                       {"error", std::string(r.status.message())},
                       {"seconds", absl::ToDoubleSeconds(r.elapsed)}});
      }
      PrintJson({{"total", results.size()},
                 {"compiled", compiled},
                 {"cached", cached},
                 {"failed", failed},
                 {"results", arr}});
    } else {
      io_.out << absl::StrFormat("warm: %d kernels: %d compiled, %d cached, %d failed (%.1f s)\n",
                                 results.size(), compiled, cached, failed,
                                 absl::ToDoubleSeconds(absl::Now() - start));
    }
    for (const auto& r : results) {
      if (r.status.ok()) continue;
      io_.err << "kcache: warm: failed: " << r.item.name << " " << r.item.arch << ": "
              << r.status.message() << "\n";
    }
    if (failed == 0) return kExitOk;
    // The daemon went away mid-way: say so with the "unavailable" status.
    bool all_unavailable = std::all_of(results.begin(), results.end(), [](const WarmResult& r) {
      return r.status.ok() || absl::IsUnavailable(r.status);
    });
    return all_unavailable ? kExitUnavailable : kExitFailed;
  }

  // --- export / import ------------------------------------------------------

  int Export() {
    const std::string out = a_.get("out");
    if (out.empty()) return Usage("--out FILE is required");
    v1::Filter filter;
    if (!BuildFilter(&filter)) return exit_;
    auto admin = Open();
    if (!admin) return exit_;
    if (auto st = ResolveCurrentToolchain(*admin, &filter); !st.ok()) return Fail(st);
    // Written beside the target and renamed: a failed export leaves no
    // half bundle under the name.
    const std::string tmp = out + ".tmp";
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Fail(absl::InternalError(absl::StrCat("cannot write ", tmp)));
    Progress bar(io_.err, io_.tty && !json_, "export", 0);
    uint64_t bytes = 0;
    absl::Status st = admin->Export(filter, [&](std::string_view piece) -> absl::Status {
      f.write(piece.data(), static_cast<std::streamsize>(piece.size()));
      if (!f) return absl::InternalError(absl::StrCat("writing ", tmp, " failed"));
      bytes += piece.size();
      bar.Update(0, HumanBytes(bytes));
      return absl::OkStatus();
    });
    bar.Finish();
    f.close();
    std::error_code ec;
    if (!st.ok() || !f) {
      fs::remove(tmp, ec);
      return Fail(st.ok() ? absl::InternalError(absl::StrCat("writing ", tmp, " failed")) : st);
    }
    // Read it back: counts the entries and checks what was written.
    auto count = CountBundle(tmp);
    if (!count.ok()) {
      fs::remove(tmp, ec);
      return Fail(count.status(), "the exported bundle does not check out");
    }
    fs::rename(tmp, out, ec);
    if (ec) return Fail(absl::InternalError(absl::StrCat("rename to ", out, ": ", ec.message())));
    if (json_) {
      PrintJson({{"file", out}, {"entries", *count}, {"bytes", bytes}});
    } else {
      io_.out << "exported " << *count << " entries (" << HumanBytes(bytes) << ") to " << out
              << "\n";
    }
    return kExitOk;
  }

  static absl::StatusOr<uint64_t> CountBundle(const std::string& path) {
    auto bytes = ReadBundleFile(path);
    if (!bytes.ok()) return bytes.status();
    auto entries = DecodeBundle(*bytes);
    if (!entries.ok()) return entries.status();
    return entries->size();
  }

  int Import() {
    const std::string file = a_.positional[0];
    if (a_.has("toolchain")) {
      if (!CheckToolchainArg()) return exit_;
      if (conn_.store.empty()) return Usage("--toolchain is for --store (a daemon uses its own)");
      conn_.toolchain_id = a_.get("toolchain");
    }
    // Every digest is checked here before anything is sent or written. The
    // read is bounded and refuses a file that is not a bundle at once.
    auto bytes = ReadBundleFile(file);
    if (!bytes.ok()) return Usage(bytes.status().message());
    auto entries = DecodeBundle(*bytes);
    if (!entries.ok()) return Fail(entries.status(), file);
    std::map<std::string, uint64_t> per_toolchain;
    for (const auto& e : *entries) ++per_toolchain[e.record.toolchain().id()];
    auto admin = Open(/*create=*/true);
    if (!admin) return exit_;
    Progress bar(io_.err, io_.tty && !json_, "import", bytes->size());
    const bool foreign = a_.has("allow-foreign-toolchain");
    auto r =
        admin->Import(*bytes, foreign, [&](uint64_t sent) { bar.Update(sent, HumanBytes(sent)); });
    bar.Finish();
    if (!r.ok()) {
      int code = Fail(r.status(), file);
      if (!foreign && absl::StrContains(r.status().message(), "toolchain")) {
        std::vector<std::string> ids;
        for (const auto& [id, n] : per_toolchain) ids.push_back(absl::StrCat(id, " (", n, ")"));
        io_.err << "kcache: import: the bundle holds toolchain(s) " << absl::StrJoin(ids, ", ")
                << "; pass --allow-foreign-toolchain to import them anyway\n";
      }
      return code;
    }
    if (json_) {
      json j = ProtoToJson(*r);
      j["file"] = file;
      PrintJson(j);
    } else {
      io_.out << "imported " << r->imported() << " entries, " << r->already_present()
              << " already present, from " << file << "\n";
    }
    return kExitOk;
  }

  // --- invalidate / gc / pin / verify ---------------------------------------

  int Invalidate() {
    v1::InvalidateRequest req;
    int given = 0;
    if (a_.has("toolchain")) {
      ++given;
      if (!CheckToolchainArg()) return exit_;
      req.set_toolchain_id(a_.get("toolchain"));
    }
    if (a_.has("arch")) {
      ++given;
      if (a_.get("arch").empty()) return Usage("--arch: empty");
      req.set_arch(a_.get("arch"));
    }
    if (a_.has("before")) {
      ++given;
      auto t = ParseWhen(a_.get("before"), now_);
      if (!t.ok()) return Usage(absl::StrCat("--before: ", t.status().message()));
      req.set_created_before_unix_ms(absl::ToUnixMillis(*t));
    }
    if (!a_.positional.empty()) {
      ++given;
      if (!CheckKeyArg(a_.positional[0])) return exit_;
      req.set_key(a_.positional[0]);
    }
    if (given != 1)
      return Usage("give exactly one of --toolchain ID, --arch ARCH, --before WHEN, KEY");
    auto admin = Open();
    if (!admin) return exit_;
    auto r = admin->Invalidate(req);
    if (!r.ok()) return Fail(r.status());
    WarnUnreadable(r->unreadable());
    if (json_) {
      PrintJson(ProtoToJson(*r));
    } else {
      io_.out << "removed " << r->removed_entries() << " entries, freed "
              << HumanBytes(r->freed_bytes()) << "\n";
    }
    return kExitOk;
  }

  int Gc() {
    if (!a_.has("max-bytes")) return Usage("--max-bytes N is required");
    auto max = ParseBytes(a_.get("max-bytes"));
    if (!max.ok()) return Usage(absl::StrCat("--max-bytes: ", max.status().message()));
    std::optional<absl::Duration> grace;
    if (a_.has("grace")) {
      auto g = ParseDurationArg(a_.get("grace"));
      if (!g.ok()) return Usage(absl::StrCat("--grace: ", g.status().message()));
      grace = *g;
    }
    auto admin = Open();
    if (!admin) return exit_;
    auto r = admin->Evict(*max, grace);
    if (!r.ok()) return Fail(r.status());
    WarnUnreadable(r->unreadable());
    if (json_) {
      PrintJson(ProtoToJson(*r));
    } else {
      io_.out << "evicted " << r->evicted_entries() << " entries, freed "
              << HumanBytes(r->freed_bytes()) << "\n";
    }
    return kExitOk;
  }

  int PinOrUnpin(bool pin) {
    const std::string key = a_.positional[0];
    if (!CheckKeyArg(key)) return exit_;
    auto admin = Open();
    if (!admin) return exit_;
    absl::Status st = pin ? admin->Pin(key, a_.get("reason")) : admin->Unpin(key);
    if (!st.ok()) return Fail(st, key);
    if (json_) {
      PrintJson({{"key", key}, {"pinned", pin}});
    } else {
      io_.out << (pin ? "pinned " : "unpinned ") << key << "\n";
    }
    return kExitOk;
  }
  int Pin() { return PinOrUnpin(true); }
  int Unpin() { return PinOrUnpin(false); }

  int Verify() {
    auto admin = Open();
    if (!admin) return exit_;
    auto r = admin->Verify();
    if (!r.ok()) return Fail(r.status());
    WarnUnreadable(r->unreadable());
    if (json_) {
      PrintJson(ProtoToJson(*r));
    } else {
      io_.out << "checked " << r->checked() << " entries, " << r->corrupt() << " corrupt\n";
      for (const auto& k : r->quarantined_keys()) io_.out << "quarantined " << KeyToHex(k) << "\n";
    }
    if (r->corrupt() > 0) {
      io_.err << "kcache: verify: " << r->corrupt()
              << " corrupt entries were quarantined (they will be recompiled on demand)\n";
      return kExitFailed;
    }
    return r->unreadable().empty() ? kExitOk : kExitFailed;
  }

  int Repair() {
    // RepairDB needs the store to itself: never through a daemon.
    std::string dir = conn_.store.empty() ? std::string(kDefaultStore) : conn_.store;
    if (!conn_.socket.empty() || !conn_.target.empty()) {
      return Usage("repair works on a store directory (--store DIR) with kcached stopped");
    }
    auto r = kcache::Store::Repair(dir);
    if (!r.ok()) {
      if (absl::IsFailedPrecondition(r.status()) || absl::StrContains(r.status().message(), "lock")) {
        return Fail(absl::UnavailableError(absl::StrCat(
            "the store ", dir, " is in use (a running kcached?); stop it first: ",
            r.status().message())));
      }
      if (absl::IsNotFound(r.status())) return Fail(absl::UnavailableError(r.status().message()));
      return Fail(r.status());
    }
    if (json_) {
      PrintJson({{"store", dir},
                 {"moved_to_lost", r->moved_to_lost},
                 {"entries", r->entries},
                 {"quarantined", r->quarantined},
                 {"freed_bytes", r->freed_bytes}});
    } else {
      io_.out << "repaired " << dir << ": " << r->entries << " entries readable, "
              << r->quarantined << " quarantined (their cubin was lost), "
              << HumanBytes(r->freed_bytes) << " of unreferenced cubins freed\n";
      for (const auto& f : r->moved_to_lost) {
        io_.out << "moved to lost/: " << f << " (unreadable; its entries are recompiled on demand)\n";
      }
    }
    return kExitOk;
  }

  CliIo io_;
  const absl::Time now_;
  const Command* cmd_ = nullptr;
  ParsedArgs a_;
  ConnectOptions conn_;
  bool json_ = false;
  int exit_ = kExitOk;
};

}  // namespace

int RunKcache(const std::vector<std::string>& args, CliIo io) { return Cli(io).Run(args); }

}  // namespace kcache::tools
