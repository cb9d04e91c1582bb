// `kcache export` and `kcache import`: entries to and from bundle files
// (cache/bundle.h), every digest checked before anything is written.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/bundle.h"
#include "tools/kcache/command.h"
#include "tools/kcache/output.h"

namespace kcache::tools {

using nlohmann::json;

namespace {

namespace fs = std::filesystem;

absl::StatusOr<uint64_t> CountBundle(const std::string& path) {
  auto bytes = ReadBundleFile(path);
  if (!bytes.ok()) return bytes.status();
  auto entries = DecodeBundle(*bytes);
  if (!entries.ok()) return entries.status();
  return entries->size();
}

}  // namespace

int ExportCommand(CommandContext& c) {
  const std::string out = c.args.get("out");
  if (out.empty()) return c.Usage("--out FILE is required");
  v1::Filter filter;
  if (!c.BuildFilter(&filter)) return c.exit_code;
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  if (auto st = c.ResolveCurrentToolchain(*admin, &filter); !st.ok()) return c.Fail(st);
  // Written beside the target and renamed: a failed export leaves no
  // half bundle under the name.
  const std::string tmp = out + ".tmp";
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  if (!f) return c.Fail(absl::InternalError(absl::StrCat("cannot write ", tmp)));
  Progress bar(c.io.err, c.io.tty && !c.as_json, "export", 0);
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
    return c.Fail(st.ok() ? absl::InternalError(absl::StrCat("writing ", tmp, " failed")) : st);
  }
  // Read it back: counts the entries and checks what was written.
  auto count = CountBundle(tmp);
  if (!count.ok()) {
    fs::remove(tmp, ec);
    return c.Fail(count.status(), "the exported bundle does not check out");
  }
  fs::rename(tmp, out, ec);
  if (ec) return c.Fail(absl::InternalError(absl::StrCat("rename to ", out, ": ", ec.message())));
  if (c.as_json) {
    c.PrintJson({{"file", out}, {"entries", *count}, {"bytes", bytes}});
  } else {
    c.io.out << "exported " << *count << " entries (" << HumanBytes(bytes) << ") to " << out
             << "\n";
  }
  return kExitOk;
}

int ImportCommand(CommandContext& c) {
  const std::string file = c.args.positional[0];
  if (c.args.has("toolchain")) {
    if (!c.CheckToolchainArg()) return c.exit_code;
    if (c.conn.store.empty()) return c.Usage("--toolchain is for --store (a daemon uses its own)");
    c.conn.toolchain_id = c.args.get("toolchain");
  }
  // Every digest is checked here before anything is sent or written. The
  // read is bounded and refuses a file that is not a bundle at once.
  auto bytes = ReadBundleFile(file);
  if (!bytes.ok()) return c.Usage(bytes.status().message());
  auto entries = DecodeBundle(*bytes);
  if (!entries.ok()) return c.Fail(entries.status(), file);
  std::map<std::string, uint64_t> per_toolchain;
  for (const auto& e : *entries) ++per_toolchain[e.record.toolchain().id()];
  auto admin = c.Open(/*create=*/true);
  if (!admin) return c.exit_code;
  Progress bar(c.io.err, c.io.tty && !c.as_json, "import", bytes->size());
  const bool foreign = c.args.has("allow-foreign-toolchain");
  auto r =
      admin->Import(*bytes, foreign, [&](uint64_t sent) { bar.Update(sent, HumanBytes(sent)); });
  bar.Finish();
  if (!r.ok()) {
    int code = c.Fail(r.status(), file);
    if (!foreign && absl::StrContains(r.status().message(), "toolchain")) {
      std::vector<std::string> ids;
      ids.reserve(per_toolchain.size());
      for (const auto& [id, n] : per_toolchain) ids.push_back(absl::StrCat(id, " (", n, ")"));
      c.io.err << "kcache: import: the bundle holds toolchain(s) " << absl::StrJoin(ids, ", ")
               << "; pass --allow-foreign-toolchain to import them anyway\n";
    }
    return code;
  }
  if (c.as_json) {
    json j = ProtoToJson(*r);
    j["file"] = file;
    c.PrintJson(j);
  } else {
    c.io.out << "imported " << r->imported() << " entries, " << r->already_present()
             << " already present, from " << file << "\n";
  }
  return kExitOk;
}

}  // namespace kcache::tools
