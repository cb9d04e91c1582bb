// Raw kernels in the compile worker (see raw_compile.h).
#include "compiler/worker/raw_compile.h"

#include <cctype>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "compiler/cuda/cubin_images.h"
#include "compiler/cuda/nvrtc.h"

namespace kcache {
namespace {

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '$' && c != '.') {
      return false;
    }
  }
  return true;
}

bool IsIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.';
}

}  // namespace

std::string ConfiguredLlvmVersion() {
#ifdef KCACHE_LLVM_VERSION
  return KCACHE_LLVM_VERSION;
#else
  return "";
#endif
}

absl::Status ValidateRawSource(const RawSource& raw, size_t max_names) {
  if (raw.format != RawFormat::kLlvmIr && raw.format != RawFormat::kLlvmBitcode &&
      raw.format != RawFormat::kPtx) {
    return absl::InvalidArgumentError(
        "raw.format: set FORMAT_LLVM_IR, FORMAT_LLVM_BITCODE or FORMAT_PTX");
  }
  if (raw.bytes.empty()) return absl::InvalidArgumentError("raw.source: empty");
  if (raw.kernel_names.empty()) {
    return absl::InvalidArgumentError("raw.kernel_names: name at least one kernel to export");
  }
  if (raw.kernel_names.size() > max_names) {
    return absl::InvalidArgumentError(absl::StrCat("raw.kernel_names: ", raw.kernel_names.size(),
                                                   " names, over the limit of ", max_names));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < raw.kernel_names.size(); ++i) {
    const std::string& n = raw.kernel_names[i];
    if (n.size() > 1024 || !IsIdentifier(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw.kernel_names[", i,
                       "]: not a kernel symbol name (letters, digits, _ $ .; at most "
                       "1024 characters)"));
    }
    if (!seen.insert(n).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw.kernel_names[", i, "]: \"", n, "\" is named twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPtxEntries(absl::string_view ptx, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) {
    bool found = false;
    for (size_t pos = ptx.find(".entry"); pos != absl::string_view::npos && !found;
         pos = ptx.find(".entry", pos + 1)) {
      size_t p = pos + 6;
      if (p >= ptx.size() || !std::isspace(static_cast<unsigned char>(ptx[p]))) continue;
      while (p < ptx.size() && std::isspace(static_cast<unsigned char>(ptx[p]))) ++p;
      size_t e = p;
      while (e < ptx.size() && IsIdentChar(ptx[e])) ++e;
      found = ptx.substr(p, e - p) == names[i];
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw.kernel_names[", i, "]: the PTX has no \".entry ", names[i], "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CompileOutput> CompileRaw(const RawSource& raw, const std::string& arch,
                                         const RawCompileOptions& options) {
  const absl::Time start = absl::Now();
  if (absl::Status s = ValidateArch(arch); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("target.", s.message()));
  }
  if (absl::Status s = ValidateRawSource(raw); !s.ok()) return s;
  CompileOutput out;
  std::string ptx_storage;
  absl::string_view ptx;
  if (raw.format == RawFormat::kPtx) {
    ptx = raw.bytes;
  } else {
    if (options.ir_to_ptx == nullptr) {
      return absl::UnimplementedError(
          "LLVM IR input needs a kcache-compile-worker built with LLVM (KCACHE_WITH_LLVM=ON); "
          "this one was built without it. PTX input works.");
    }
    IrToPtxOptions o;
    o.bitcode = raw.format == RawFormat::kLlvmBitcode;
    o.arch = arch;
    o.kernel_names = raw.kernel_names;
    o.enable_test_faults = options.enable_test_faults;
    auto generated = options.ir_to_ptx(raw.bytes, o);
    if (!generated.ok()) return generated.status();
    ptx_storage = *std::move(generated);
    ptx = ptx_storage;
    absl::StrAppend(&out.log, "LLVM ", ConfiguredLlvmVersion(), " NVPTX: ", ptx.size(),
                    " bytes of PTX for ", arch, "\n");
  }
  if (absl::Status s = CheckPtxEntries(ptx, raw.kernel_names); !s.ok()) return s;
  auto linked = options.linker->LinkPtx(ptx, arch, "raw.ptx");
  if (!linked.ok()) return linked.status();
  absl::StrAppend(&out.log, linked->log);
  // The loaders read a cubin as ELF images (compiler/cuda/cubin_images.h).
  if (absl::Status s = CheckCubinImage(linked->cubin, "nvJitLink's cubin"); !s.ok()) return s;
  out.cubin = std::move(linked->cubin);
  out.kernels = ParsePtxasReport(linked->log);
  out.wall_time = absl::Now() - start;
  return out;
}

}  // namespace kcache
