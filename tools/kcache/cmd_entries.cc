// `kcache ls` and `kcache show`: the entries of the store, and one entry
// in full (spec, launch facts, resources, the cubin's own kernels).
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "compiler/attention/spec_json.h"
#include "tools/kcache/command.h"
#ifdef KCACHE_TOOLS_WITH_LLVM
#include "compiler/llvm/cubin_elf.h"
#endif
#include "tools/kcache/output.h"

namespace kcache::tools {

using nlohmann::json;

namespace {

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
  // A cubin of several images (an attention module with backward) lists each
  // image's kernels, so a device function two images define is two rows: an
  // IMAGE column says which is which.
  const bool several = info->images > 1;
  o << "\ncubin kernels (from the ELF, " << info->arch
    << (several ? absl::StrCat(", ", info->images, " images") : std::string()) << "):\n";
  auto num = [](int64_t v) { return v < 0 ? std::string("?") : absl::StrCat(v); };
  std::vector<std::string> header = {"  NAME", "KIND",   "REGS", "STATIC SMEM",
                                     "FRAME",  "PARAMS", "CODE"};
  std::vector<bool> right = {false, false, true, true, true, true, true};
  if (several) {
    header.insert(header.begin() + 1, "IMAGE");
    right.insert(right.begin() + 1, true);
  }
  Table t(header, right);
  for (const CubinKernel& k : info->kernels) {
    std::vector<std::string> row = {"  " + k.name,      k.entry ? "kernel" : "device fn",
                                    num(k.registers),   num(k.static_smem_bytes),
                                    num(k.frame_bytes), num(k.param_bytes),
                                    num(k.code_bytes)};
    if (several) row.insert(row.begin() + 1, absl::StrCat(k.image));
    t.Add(row);
  }
  t.Print(o);
  for (const std::string& n : info->notes) o << "  note: " << n << "\n";
#else
  o << "\ncubin kernels: this kcache was built without LLVM (KCACHE_WITH_LLVM=OFF)\n";
#endif
}

}  // namespace

int LsCommand(CommandContext& c) {
  v1::Filter filter;
  if (!c.BuildFilter(&filter)) return c.exit_code;
  std::string sort = c.args.get("sort");
  if (!sort.empty() && sort != "created" && sort != "last-used" && sort != "size" &&
      sort != "hits") {
    return c.Usage(absl::StrCat("--sort: '", sort, "' is not created, last-used, size or hits"));
  }
  uint64_t limit = UINT64_MAX;
  if (c.args.has("limit") && !absl::SimpleAtoi(c.args.get("limit"), &limit)) {
    return c.Usage(absl::StrCat("--limit: '", c.args.get("limit"), "' is not a number"));
  }
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  if (auto st = c.ResolveCurrentToolchain(*admin, &filter); !st.ok()) return c.Fail(st);
  std::vector<v1::EntrySummary> entries;
  std::string token;
  do {
    auto page = admin->List(filter, 1000, token);
    if (!page.ok()) return c.Fail(page.status());
    c.WarnUnreadable(page->unreadable());
    for (auto& e : *page->mutable_entries()) entries.push_back(std::move(e));
    token = page->next_page_token();
    // Without a sort the store's key order is the answer: stop early.
    if (sort.empty() && entries.size() >= limit) break;
  } while (!token.empty());
  auto by = [&](auto f) {
    std::stable_sort(entries.begin(), entries.end(),
                     [&](const auto& x, const auto& y) { return f(x) > f(y); });
  };
  if (sort == "created") by([](const v1::EntrySummary& e) { return e.record().created_unix_ms(); });
  if (sort == "last-used")
    by([](const v1::EntrySummary& e) { return e.access().last_used_unix_ms(); });
  if (sort == "size") by([](const v1::EntrySummary& e) { return e.record().cubin_size(); });
  if (sort == "hits") by([](const v1::EntrySummary& e) { return e.access().hits(); });
  if (entries.size() > limit) entries.resize(limit);
  if (c.as_json) {
    json arr = json::array();
    for (const auto& e : entries) {
      json j = ProtoToJson(e);
      j["description"] = attention::DescribeSpec(e.record().spec());
      arr.push_back(std::move(j));
    }
    c.PrintJson({{"entries", arr}});
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
    t.Add({c.args.has("full-keys") ? KeyToHex(r.key()) : ShortKey(r.key()), r.arch(),
           attention::DescribeSpec(r.spec()), HumanBytes(r.cubin_size()),
           absl::StrCat(e.access().hits()), FormatUnixMs(e.access().last_used_unix_ms()),
           FormatUnixMs(r.created_unix_ms()), absl::StrJoin(flags, ",")});
  }
  t.Print(c.io.out);
  return kExitOk;
}

int ShowCommand(CommandContext& c) {
  const std::string key = c.args.positional[0];
  if (!c.CheckKeyArg(key)) return c.exit_code;
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  auto e = admin->Inspect(key);
  if (!e.ok()) return c.Fail(e.status(), key);
  const v1::KernelRecord& r = e->record();
  if (c.as_json) {
    json j = ProtoToJson(*e);
    j["description"] = attention::DescribeSpec(r.spec());
#ifdef KCACHE_TOOLS_WITH_LLVM
    if (auto cubin = admin->Cubin(key); cubin.ok()) {
      if (auto info = ReadCubin(*cubin); info.ok()) {
        json ks = json::array();
        for (const CubinKernel& k : info->kernels) {
          ks.push_back({{"name", k.name},
                        {"image", k.image},
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
    c.PrintJson(j);
    return kExitOk;
  }
  std::ostream& o = c.io.out;
  const auto& tc = r.toolchain();
  o << "key           " << KeyToHex(r.key()) << "\n"
    << "spec          "
    << (r.has_raw() ? absl::StrCat("raw kernel (", v1::RawKernel::Format_Name(r.raw().format()),
                                   ": ", absl::StrJoin(r.raw().kernel_names(), ", "), ")")
                    : attention::DescribeSpec(r.spec()))
    << "\n"
    << "arch          " << r.arch() << "\n"
    << "toolchain     " << tc.compiler() << " " << tc.version() << "  id " << tc.id() << "  build "
    << tc.build() << "\n"
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

}  // namespace kcache::tools
