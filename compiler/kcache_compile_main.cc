// kcache-compile: compiles one attention spec (JSON, protobuf's mapping of
// kcache.v1.AttentionSpec) into a cubin and its record, in process, with no
// daemon and no GPU, and prints the entry points with their roles (a spec
// with "backward": true has the backward's too). For tests and for people
// who want to look at a kernel.
//
//   kcache-compile SPEC.json|- [--arch=sm_90a] [--out=FILE.cubin]
//                  [--record=FILE.json] [--nvrtc=PATH] [--source=FILE.cu]
//                  [--source-only]
//
// Exit codes: 0 compiled; 1 the spec or the compile failed (the message
// names the field, or carries NVRTC's log); 2 usage error.
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cache/key.h"
#include "compiler/attention/codegen.h"
#include "compiler/attention/spec_json.h"
#include "compiler/attention_compile.h"
#include "compiler/cuda/nvrtc.h"
#include "compiler/toolchain.h"
#include "google/protobuf/util/json_util.h"

namespace {

constexpr char kUsage[] =
    "usage: kcache-compile SPEC.json|- [--arch=sm_90a] [--out=FILE.cubin] [--record=FILE.json]\n"
    "                      [--nvrtc=PATH] [--source=FILE.cu] [--source-only]\n"
    "Compiles one attention spec (JSON of kcache.v1.AttentionSpec) with NVRTC, in process.\n"
    "  --arch     sm_80, sm_86, sm_89, sm_90 or sm_90a (default sm_90a)\n"
    "  --out      write the cubin here (with backward: two ELF images one after another,\n"
    "             docs/kernel-contract.md; cuobjdump and a plain cuModuleLoadData see the first)\n"
    "  --record   write the KernelRecord (JSON) here\n"
    "  --source   write the generated CUDA translation unit here\n"
    "  --source-only  with --source: stop after writing it (no NVRTC compile)\n"
    "  --nvrtc    path of libnvrtc (default: the usual places)\n"
    "  --version  print kcache's version and exit\n"
    "Exit codes: 0 compiled, 1 spec or compile failed, 2 usage error.\n";

int Usage(const std::string& why) {
  std::cerr << "kcache-compile: " << why << " (see --help)\n";
  return 2;
}

// "forward", "backward_dq", ...: the EntryRole without its prefix.
std::string RoleName(kcache::v1::EntryRole role) {
  std::string name = kcache::v1::EntryRole_Name(role);
  constexpr absl::string_view kPrefix = "ENTRY_ROLE_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  return absl::AsciiStrToLower(name);
}

bool WriteFile(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec_path, arch = "sm_90a", out_path, record_path, nvrtc_path, source_path;
  bool source_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const std::string& flag, std::string* dst) {
      if (!absl::StartsWith(a, flag)) return false;
      *dst = a.substr(flag.size());
      return true;
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--version") {
      std::cout << "kcache-compile " << KCACHE_VERSION << "\n";
      return 0;
    }
    if (a == "--source-only") {
      source_only = true;
      continue;
    }
    if (value("--arch=", &arch) || value("--out=", &out_path) || value("--record=", &record_path) ||
        value("--nvrtc=", &nvrtc_path) || value("--source=", &source_path)) {
      continue;
    }
    if (absl::StartsWith(a, "--")) return Usage(absl::StrCat("unknown flag ", a));
    if (!spec_path.empty()) return Usage("one spec at a time");
    spec_path = a;
  }
  if (spec_path.empty()) return Usage("no spec given");

  std::stringstream json;
  if (spec_path == "-") {
    json << std::cin.rdbuf();
  } else {
    std::ifstream in(spec_path);
    if (!in) return Usage(absl::StrCat("cannot read ", spec_path));
    json << in.rdbuf();
  }
  auto spec = kcache::attention::ParseSpecJson(json.str());
  if (!spec.ok()) {
    std::cerr << "kcache-compile: " << spec.status().message() << "\n";
    return 1;
  }

  kcache::Nvrtc nvrtc(nvrtc_path);
  auto toolchain = kcache::NvrtcToolchain(nvrtc);
  if (!toolchain.ok()) {
    std::cerr << "kcache-compile: " << toolchain.status().message() << "\n";
    return 1;
  }
  auto id = kcache::ResolveAttention(*spec, arch, *toolchain);
  if (!id.ok()) {
    std::cerr << "kcache-compile: " << id.status().message() << "\n";
    return 1;
  }
  if (!source_path.empty()) {
    auto gen = kcache::attention::GenerateAttentionSource(id->normalized, id->arch);
    if (gen.ok() && !WriteFile(source_path, gen->source)) {
      std::cerr << "kcache-compile: cannot write " << source_path << "\n";
      return 1;
    }
    if (source_only) {
      if (!gen.ok()) {
        std::cerr << "kcache-compile: " << gen.status().message() << "\n";
        return 1;
      }
      return 0;
    }
  } else if (source_only) {
    return Usage("--source-only needs --source=FILE.cu");
  }
  kcache::InProcessCompiler compiler(&nvrtc);
  auto build = kcache::BuildAttention(*id, *toolchain, compiler, absl::InfiniteFuture());
  if (!build.ok()) {
    std::cerr << "kcache-compile: " << build.status().message() << "\n";
    return 1;
  }
  if (!out_path.empty() && !WriteFile(out_path, build->cubin)) {
    std::cerr << "kcache-compile: cannot write " << out_path << "\n";
    return 1;
  }
  if (!record_path.empty()) {
    std::string rec_json;
    google::protobuf::util::JsonPrintOptions o;
    o.add_whitespace = true;
    o.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(build->record, &rec_json, o);
    if (!WriteFile(record_path, rec_json)) {
      std::cerr << "kcache-compile: cannot write " << record_path << "\n";
      return 1;
    }
  }
  const auto& rec = build->record;
  std::cout << "spec       " << kcache::attention::DescribeSpec(rec.spec()) << "\n"
            << "arch       " << rec.arch() << "\n"
            << "key        " << kcache::KeyToHex(rec.key()) << "\n"
            << "toolchain  " << rec.toolchain().compiler() << " " << rec.toolchain().version()
            << " (" << rec.toolchain().id() << ")\n"
            << "cubin      " << build->cubin.size() << " bytes, compiled in "
            << rec.compile_time_us() / 1000 << " ms\n";
  if (rec.spec().backward()) {
    std::cout << "backward   " << (rec.deterministic_backward() ? "deterministic" : "atomic dQ")
              << "\n";
  }
  for (const auto& e : rec.entry_points()) {
    std::cout << "entry      " << e.name() << " (" << RoleName(e.role()) << "): " << e.threads()
              << " threads, " << e.dynamic_smem_bytes() << " B dynamic smem, tile " << e.block_m()
              << "x" << e.block_n() << ", " << e.resources().registers() << " registers, "
              << e.resources().spill_bytes() << " B spilled\n";
  }
  return 0;
}
