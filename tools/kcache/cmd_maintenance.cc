// The commands that change or check the store: `kcache invalidate`, `gc`,
// `pin`, `unpin`, `verify` and `repair`.
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/key.h"
#include "cache/store.h"
#include "tools/kcache/command.h"
#include "tools/kcache/output.h"

namespace kcache::tools {

int InvalidateCommand(CommandContext& c) {
  v1::InvalidateRequest req;
  int given = 0;
  if (c.args.has("toolchain")) {
    ++given;
    if (!c.CheckToolchainArg()) return c.exit_code;
    req.set_toolchain_id(c.args.get("toolchain"));
  }
  if (c.args.has("arch")) {
    ++given;
    if (c.args.get("arch").empty()) return c.Usage("--arch: empty");
    req.set_arch(c.args.get("arch"));
  }
  if (c.args.has("before")) {
    ++given;
    auto t = ParseWhen(c.args.get("before"), c.now);
    if (!t.ok()) return c.Usage(absl::StrCat("--before: ", t.status().message()));
    req.set_created_before_unix_ms(absl::ToUnixMillis(*t));
  }
  if (!c.args.positional.empty()) {
    ++given;
    if (!c.CheckKeyArg(c.args.positional[0])) return c.exit_code;
    req.set_key(c.args.positional[0]);
  }
  if (given != 1)
    return c.Usage("give exactly one of --toolchain ID, --arch ARCH, --before WHEN, KEY");
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  auto r = admin->Invalidate(req);
  if (!r.ok()) return c.Fail(r.status());
  c.WarnUnreadable(r->unreadable());
  if (c.as_json) {
    c.PrintJson(ProtoToJson(*r));
  } else {
    c.io.out << "removed " << r->removed_entries() << " entries, freed "
             << HumanBytes(r->freed_bytes()) << "\n";
  }
  return kExitOk;
}

int GcCommand(CommandContext& c) {
  if (!c.args.has("max-bytes")) return c.Usage("--max-bytes N is required");
  auto max = ParseBytes(c.args.get("max-bytes"));
  if (!max.ok()) return c.Usage(absl::StrCat("--max-bytes: ", max.status().message()));
  std::optional<absl::Duration> grace;
  if (c.args.has("grace")) {
    auto g = ParseDurationArg(c.args.get("grace"));
    if (!g.ok()) return c.Usage(absl::StrCat("--grace: ", g.status().message()));
    grace = *g;
  }
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  auto r = admin->Evict(*max, grace);
  if (!r.ok()) return c.Fail(r.status());
  c.WarnUnreadable(r->unreadable());
  if (c.as_json) {
    c.PrintJson(ProtoToJson(*r));
  } else {
    c.io.out << "evicted " << r->evicted_entries() << " entries, freed "
             << HumanBytes(r->freed_bytes()) << "\n";
  }
  return kExitOk;
}

namespace {

int PinOrUnpin(CommandContext& c, bool pin) {
  const std::string key = c.args.positional[0];
  if (!c.CheckKeyArg(key)) return c.exit_code;
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  absl::Status st = pin ? admin->Pin(key, c.args.get("reason")) : admin->Unpin(key);
  if (!st.ok()) return c.Fail(st, key);
  if (c.as_json) {
    c.PrintJson({{"key", key}, {"pinned", pin}});
  } else {
    c.io.out << (pin ? "pinned " : "unpinned ") << key << "\n";
  }
  return kExitOk;
}

}  // namespace

int PinCommand(CommandContext& c) { return PinOrUnpin(c, true); }
int UnpinCommand(CommandContext& c) { return PinOrUnpin(c, false); }

int VerifyCommand(CommandContext& c) {
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  auto r = admin->Verify();
  if (!r.ok()) return c.Fail(r.status());
  c.WarnUnreadable(r->unreadable());
  if (c.as_json) {
    c.PrintJson(ProtoToJson(*r));
  } else {
    c.io.out << "checked " << r->checked() << " entries, " << r->corrupt() << " corrupt\n";
    for (const auto& k : r->quarantined_keys()) c.io.out << "quarantined " << KeyToHex(k) << "\n";
  }
  if (r->corrupt() > 0) {
    c.io.err << "kcache: verify: " << r->corrupt()
             << " corrupt entries were quarantined (they will be recompiled on demand)\n";
    return kExitFailed;
  }
  return r->unreadable().empty() ? kExitOk : kExitFailed;
}

int RepairCommand(CommandContext& c) {
  // RepairDB needs the store to itself: never through a daemon.
  std::string dir = c.conn.store.empty() ? std::string(kDefaultStore) : c.conn.store;
  if (!c.conn.socket.empty() || !c.conn.target.empty()) {
    return c.Usage("repair works on a store directory (--store DIR) with kcached stopped");
  }
  auto r = kcache::Store::Repair(dir);
  if (!r.ok()) {
    if (absl::IsFailedPrecondition(r.status()) || absl::StrContains(r.status().message(), "lock")) {
      return c.Fail(absl::UnavailableError(
          absl::StrCat("the store ", dir,
                       " is in use (a running kcached?); stop it first: ", r.status().message())));
    }
    if (absl::IsNotFound(r.status())) return c.Fail(absl::UnavailableError(r.status().message()));
    return c.Fail(r.status());
  }
  if (c.as_json) {
    c.PrintJson({{"store", dir},
                 {"moved_to_lost", r->moved_to_lost},
                 {"entries", r->entries},
                 {"quarantined", r->quarantined},
                 {"freed_bytes", r->freed_bytes}});
  } else {
    c.io.out << "repaired " << dir << ": " << r->entries << " entries readable, " << r->quarantined
             << " quarantined (their cubin was lost), " << HumanBytes(r->freed_bytes)
             << " of unreferenced cubins freed\n";
    for (const auto& f : r->moved_to_lost) {
      c.io.out << "moved to lost/: " << f
               << " (unreadable; its entries are recompiled on demand)\n";
    }
  }
  return kExitOk;
}

}  // namespace kcache::tools
