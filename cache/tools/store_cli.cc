// kcache-store subcommands over cache/store.h (see store_cli.h).
#include "cache/tools/store_cli.h"

#include <cstdint>
#include <map>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/store.h"
#include "google/protobuf/util/json_util.h"

namespace kcache {
namespace {

constexpr char kUsage[] =
    "usage: kcache-store --store=DIR [--json] COMMAND\n"
    "  stats                                 entries, blobs, bytes, by toolchain/arch\n"
    "  ls [--toolchain=ID] [--arch=A] [--limit=N]\n"
    "  verify                                re-hash every blob, quarantine bad ones\n"
    "  export --out=F [--toolchain=ID] [--arch=A]\n"
    "  import F (--toolchain=ID | --allow-foreign-toolchain)\n"
    "  gc --max-bytes=N [--grace-ms=MS]      evict LRU entries to N bytes, collect garbage\n";

struct Args {
  std::map<std::string, std::string> flags;  // --name=value or --name (value "")
  std::vector<std::string> positional;
};

Args Parse(const std::vector<std::string>& argv) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (absl::StartsWith(s, "--")) {
      auto eq = s.find('=');
      std::string name = s.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      std::string value = eq == std::string::npos ? "" : s.substr(eq + 1);
      // "--out F" and "--max-bytes N" are accepted as well as "--out=F".
      if (eq == std::string::npos && (name == "out" || name == "max-bytes") &&
          i + 1 < argv.size()) {
        value = argv[++i];
      }
      a.flags[name] = value;
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

class Cli {
 public:
  Cli(std::ostream& out, std::ostream& err) : out_(out), err_(err) {}

  int Run(const std::vector<std::string>& argv) {
    Args a = Parse(argv);
    json_ = a.flags.count("json") > 0;
    if (a.flags.count("help") || a.positional.empty()) {
      (a.flags.count("help") ? out_ : err_) << kUsage;
      return a.flags.count("help") ? 0 : 2;
    }
    auto store_dir = a.flags.find("store");
    if (store_dir == a.flags.end() || store_dir->second.empty()) {
      return Usage("--store=DIR is required");
    }
    const std::string cmd = a.positional[0];
    static const std::map<std::string, std::vector<std::string>> kKnown = {
        {"stats", {}},
        {"ls", {"toolchain", "arch", "limit"}},
        {"verify", {}},
        {"export", {"out", "toolchain", "arch"}},
        {"import", {"toolchain", "allow-foreign-toolchain"}},
        {"gc", {"max-bytes", "grace-ms"}}};
    auto known = kKnown.find(cmd);
    if (known == kKnown.end()) return Usage(absl::StrCat("unknown command '", cmd, "'"));
    for (const auto& [name, value] : a.flags) {
      if (name == "store" || name == "json") continue;
      if (std::find(known->second.begin(), known->second.end(), name) == known->second.end()) {
        return Usage(absl::StrCat("unknown flag --", name, " for ", cmd));
      }
    }
    const size_t want_positional = cmd == "import" ? 2 : 1;
    if (a.positional.size() != want_positional) {
      return Usage(cmd == "import" ? "import takes one bundle file"
                                   : absl::StrCat(cmd, " takes no positional arguments"));
    }
    v1::Filter filter;
    if (auto it = a.flags.find("toolchain"); it != a.flags.end() && cmd != "import") {
      filter.set_toolchain_id(it->second);
    }
    if (auto it = a.flags.find("arch"); it != a.flags.end()) filter.set_arch(it->second);

    // Read commands fall back to a read-only open while a daemon holds the store.
    const bool reads_only = cmd == "stats" || cmd == "ls" || cmd == "export";
    auto store = Store::Open(store_dir->second, StoreOptions{});
    if (!store.ok() && reads_only && absl::IsFailedPrecondition(store.status())) {
      StoreOptions ro;
      ro.read_only = true;
      store = Store::Open(store_dir->second, ro);
    }
    if (!store.ok()) return Fail(store.status());
    Store& s = **store;

    if (cmd == "stats") {
      auto r = s.Stats();
      if (!r.ok()) return Fail(r.status());
      if (json_) {
        out_ << Json(*r) << "\n";
      } else {
        out_ << "entries " << r->entries() << "\nblobs " << r->blobs() << "\nblob_bytes "
             << r->blob_bytes() << "\npinned " << r->pinned() << "\nquarantined "
             << r->quarantined() << "\n";
        for (const auto& g : r->groups()) {
          out_ << "group toolchain=" << g.toolchain_id() << " arch=" << g.arch()
               << " entries=" << g.entries() << " bytes=" << g.bytes() << "\n";
        }
      }
    } else if (cmd == "ls") {
      uint64_t limit = UINT64_MAX;
      if (auto it = a.flags.find("limit"); it != a.flags.end()) {
        if (!absl::SimpleAtoi(it->second, &limit)) return Usage("--limit: not a number");
      }
      std::string token;
      uint64_t shown = 0;
      do {
        auto page = s.List(filter, 1000, token);
        if (!page.ok()) return Fail(page.status());
        for (const auto& e : page->entries()) {
          if (shown++ >= limit) return 0;
          if (json_) {
            out_ << Json(e) << "\n";
          } else {
            out_ << KeyToHex(e.record().key()) << " " << e.record().arch() << " "
                 << e.record().cubin_size() << "B hits=" << e.access().hits()
                 << (e.pinned() ? " pinned" : "") << "\n";
          }
        }
        token = page->next_page_token();
      } while (!token.empty());
    } else if (cmd == "verify") {
      auto r = s.Verify();
      if (!r.ok()) return Fail(r.status());
      if (json_) {
        out_ << Json(*r) << "\n";
      } else {
        out_ << "checked " << r->checked() << "\ncorrupt " << r->corrupt() << "\n";
        for (const auto& k : r->quarantined_keys()) out_ << "quarantined " << ToHex(k) << "\n";
      }
      return r->corrupt() == 0 ? 0 : 1;
    } else if (cmd == "export") {
      auto it = a.flags.find("out");
      if (it == a.flags.end() || it->second.empty()) return Usage("export needs --out=FILE");
      auto r = s.ExportToFile(filter, it->second);
      if (!r.ok()) return Fail(r.status());
      out_ << "exported " << r->exported << "\n";
      for (const auto& k : r->quarantined_keys) out_ << "quarantined " << ToHex(k) << "\n";
    } else if (cmd == "import") {
      ImportOptions o;
      o.allow_foreign_toolchain = a.flags.count("allow-foreign-toolchain") > 0;
      if (auto it = a.flags.find("toolchain"); it != a.flags.end()) {
        o.expected_toolchain_id = it->second;
      }
      if (!o.allow_foreign_toolchain && o.expected_toolchain_id.empty()) {
        return Usage("import needs --toolchain=ID or --allow-foreign-toolchain");
      }
      auto r = s.ImportFile(a.positional[1], o);
      if (!r.ok()) return Fail(r.status());
      if (json_) {
        out_ << Json(*r) << "\n";
      } else {
        out_ << "imported " << r->imported() << "\nalready_present " << r->already_present()
             << "\n";
      }
    } else if (cmd == "gc") {
      uint64_t max_bytes = 0;
      auto it = a.flags.find("max-bytes");
      if (it == a.flags.end() || !absl::SimpleAtoi(it->second, &max_bytes)) {
        return Usage("gc needs --max-bytes=N (a number)");
      }
      std::optional<absl::Duration> grace;
      if (auto g = a.flags.find("grace-ms"); g != a.flags.end()) {
        int64_t ms = 0;
        if (!absl::SimpleAtoi(g->second, &ms) || ms < 0) return Usage("--grace-ms: not a number");
        grace = absl::Milliseconds(ms);
      }
      auto r = s.Evict(max_bytes, grace);
      if (!r.ok()) return Fail(r.status());
      auto freed = s.CollectGarbage();
      if (!freed.ok()) return Fail(freed.status());
      out_ << "evicted " << r->evicted_entries() << "\nfreed_bytes " << r->freed_bytes() + *freed
           << "\n";
    }
    if (auto st = s.Close(); !st.ok()) return Fail(st);
    return 0;
  }

 private:
  int Usage(std::string_view msg) {
    err_ << "kcache-store: " << msg << " (see --help)\n";
    return 2;
  }
  int Fail(const absl::Status& s) {
    err_ << "kcache-store: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
    return 1;
  }

  std::ostream& out_;
  std::ostream& err_;
  bool json_ = false;
};

}  // namespace

int RunStoreCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return Cli(out, err).Run(args);
}

}  // namespace kcache
