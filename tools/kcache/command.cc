// The checks and reports that every `kcache` command uses (see command.h).
#include "tools/kcache/command.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/key.h"

namespace kcache::tools {

int CommandContext::Usage(absl::string_view msg) {
  io.err << "kcache: " << (cmd ? cmd->name + ": " : "") << msg << " (see kcache "
         << (cmd ? cmd->name + " " : "") << "--help)\n";
  return kExitUsage;
}

int CommandContext::Fail(const absl::Status& st, absl::string_view context) {
  io.err << "kcache: " << (cmd ? cmd->name + ": " : "") << context << (context.empty() ? "" : ": ")
         << st.message() << "\n";
  if (absl::IsUnavailable(st)) return kExitUnavailable;
  return kExitFailed;
}

// Opens the daemon or the store; nullptr after reporting the failure.
std::unique_ptr<Admin> CommandContext::Open(bool create) {
  auto admin = tools::Connect(conn, cmd->mutates, create);
  if (!admin.ok()) {
    exit_code = Fail(admin.status());
    return nullptr;
  }
  return *std::move(admin);
}

// A hex key or prefix typed by a person, checked before anything is opened.
bool CommandContext::CheckKeyArg(const std::string& key) {
  if (auto p = ParseHexKeyPrefix(key); !p.ok()) {
    exit_code = Usage(absl::StrCat("KEY '", key, "': ", p.status().message()));
    return false;
  }
  return true;
}

// --toolchain as a 16-digit hex id (import, invalidate), checked; false
// after reporting a usage error.
bool CommandContext::CheckToolchainArg() {
  const std::string id = args.get("toolchain");
  if (!ParseToolchainIdHex(id).ok()) {
    exit_code = Usage(absl::StrCat("--toolchain: '", id, "' is not a 16-digit hex id"));
    return false;
  }
  return true;
}

// --`flag` as a positive duration (--timeout, --deadline); nullopt after
// reporting a usage error.
std::optional<absl::Duration> CommandContext::PositiveDurationArg(const std::string& flag) {
  auto d = ParseDurationArg(args.get(flag));
  if (!d.ok() || *d <= absl::ZeroDuration()) {
    exit_code =
        Usage(absl::StrCat("--", flag, ": ", d.ok() ? "must be positive" : d.status().message()));
    return std::nullopt;
  }
  return *d;
}

// The filter flags (ls, export), checked; false after reporting a usage error.
bool CommandContext::BuildFilter(v1::Filter* f) {
  if (args.has("toolchain")) {
    std::string id = args.get("toolchain");
    if (id != "current" && !ParseToolchainIdHex(id).ok()) {
      exit_code =
          Usage(absl::StrCat("--toolchain: '", id, "' is not a 16-digit hex id or 'current'"));
      return false;
    }
    f->set_toolchain_id(id);
  }
  if (args.has("arch")) f->set_arch(args.get("arch"));
  if (args.has("mask")) {
    static const std::vector<std::string> kKinds = {"none",     "causal",  "sliding_window",
                                                    "document", "drafter", "expr"};
    std::string m = args.get("mask");
    if (std::find(kKinds.begin(), kKinds.end(), m) == kKinds.end()) {
      exit_code =
          Usage(absl::StrCat("--mask: '", m, "' is not one of ", absl::StrJoin(kKinds, ", ")));
      return false;
    }
    f->set_mask_kind(m);
  }
  for (const char* flag : {"created-before", "unused-since"}) {
    if (!args.has(flag)) continue;
    auto t = ParseWhen(args.get(flag), now);
    if (!t.ok()) {
      exit_code = Usage(absl::StrCat("--", flag, ": ", t.status().message()));
      return false;
    }
    int64_t ms = absl::ToUnixMillis(*t);
    if (std::string(flag) == "created-before") {
      f->set_created_before_unix_ms(ms);
    } else {
      f->set_unused_since_unix_ms(ms);
    }
  }
  if (args.has("pinned") && args.has("unpinned")) {
    exit_code = Usage("--pinned and --unpinned exclude each other");
    return false;
  }
  if (args.has("pinned")) f->set_pinned(v1::Filter::PINNED_ONLY);
  if (args.has("unpinned")) f->set_pinned(v1::Filter::PINNED_NONE);
  return true;
}

// "current" becomes the daemon's (or this machine's) toolchain id.
absl::Status CommandContext::ResolveCurrentToolchain(Admin& admin, v1::Filter* f) {
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

void CommandContext::PrintJson(const nlohmann::json& j) { io.out << j.dump(2) << "\n"; }

}  // namespace kcache::tools
