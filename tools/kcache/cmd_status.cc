// `kcache status` and `kcache stats`: the daemon (or store) at a glance,
// and its counters and entries per toolchain and arch.
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/kcache/command.h"
#include "tools/kcache/output.h"
#include "tools/kcache/remote_output.h"

namespace kcache::tools {

using nlohmann::json;

namespace {

struct ToolchainRow {
  uint64_t entries = 0, bytes = 0;
  std::vector<std::string> archs;
};
std::map<std::string, ToolchainRow> ByToolchain(const v1::StatsResponse& s) {
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
int PrintStats(CommandContext& c,
               absl::FunctionRef<void(const Admin&, const v1::StatsResponse&)> text) {
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  auto s = admin->Stats();
  if (!s.ok()) return c.Fail(s.status());
  if (c.as_json) {
    c.PrintJson(StatsJson(*admin, *s));
  } else {
    text(*admin, *s);
  }
  c.WarnUnreadable(s->unreadable());
  if (!s->store_damage().empty()) c.io.err << "kcache: " << s->store_damage() << "\n";
  return kExitOk;
}

}  // namespace

int StatusCommand(CommandContext& c) {
  return PrintStats(c, [&](const Admin& admin, const v1::StatsResponse& s) {
    const bool daemon = admin.channel() != nullptr;
    std::ostream& o = c.io.out;
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
      << (!raw.id().empty() ? absl::StrCat(raw.compiler(), " ", raw.version(), "  id ", raw.id(),
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
             id == tc.id()                         ? "current"
             : !raw.id().empty() && id == raw.id() ? "current (raw kernels)"
                                                   : "other: never served; kcache invalidate "
                                                     "--toolchain " +
                                                         id});
    }
    if (t.size() == 0) {
      o << "(no entries)\n";
    } else {
      t.Print(o);
    }
  });
}

int StatsCommand(CommandContext& c) {
  return PrintStats(c, [&](const Admin& admin, const v1::StatsResponse& s) {
    std::ostream& o = c.io.out;
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
      const bool current =
          g.toolchain_id() == s.toolchain().id() ||
          (!s.raw_toolchain().id().empty() && g.toolchain_id() == s.raw_toolchain().id());
      t.Add({g.toolchain_id() + (current ? "*" : ""), g.arch(), absl::StrCat(g.entries()),
             HumanBytes(g.bytes())});
    }
    t.Print(o);
    if (!s.toolchain().id().empty()) o << "(* a current toolchain: attention or raw kernels)\n";
  });
}

}  // namespace kcache::tools
