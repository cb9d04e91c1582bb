// Toolchain fingerprint: NVRTC version, a digest of the library file, and the
// canonical options.
#include "compiler/toolchain.h"

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "compiler/worker/raw_compile.h"

namespace kcache {

v1::Toolchain MakeToolchain(std::string compiler, std::string version, std::string build,
                            std::vector<std::string> options) {
  v1::Toolchain t;
  t.set_compiler(std::move(compiler));
  t.set_version(std::move(version));
  t.set_build(std::move(build));
  for (std::string& o : options) t.add_options(std::move(o));
  t.set_id(ToolchainIdHex(t));  // one definition, owned by the store: its key prefix
  return t;
}

namespace {

// "sha256:<hex>" of a library file's bytes.
absl::StatusOr<std::string> FileDigest(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InternalError(absl::StrCat("cannot open ", what, " library ", path));
  Sha256Hasher h;
  std::string buf(1 << 20, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.Update(std::string_view(buf.data(), static_cast<size_t>(in.gcount())));
  }
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", what, " library ", path));
  return absl::StrCat("sha256:", ToHex(h.Finish()));
}

}  // namespace

absl::StatusOr<v1::Toolchain> NvrtcToolchain(const Nvrtc& nvrtc) {
  absl::StatusOr<NvrtcVersion> version = nvrtc.Version();
  if (!version.ok()) return version.status();
  absl::StatusOr<std::string> path = nvrtc.LibraryPath();
  if (!path.ok()) return path.status();
  absl::StatusOr<std::string> build = FileDigest(*path, "NVRTC");
  if (!build.ok()) return build.status();
  return MakeToolchain("nvrtc", absl::StrCat(version->major, ".", version->minor), *build,
                       CanonicalNvrtcOptions());
}

absl::StatusOr<v1::Toolchain> RawToolchain(const NvJitLink& linker) {
  absl::StatusOr<NvJitLinkVersion> version = linker.Version();
  if (!version.ok()) return version.status();
  absl::StatusOr<std::string> path = linker.LibraryPath();
  if (!path.ok()) return path.status();
  absl::StatusOr<std::string> build = FileDigest(*path, "nvJitLink");
  if (!build.ok()) return build.status();
  const std::string llvm = ConfiguredLlvmVersion();
  // The NVPTX codegen settings of compiler/llvm/llvm_nvptx.cc, then nvJitLink's.
  // Its dropping of ".target sm_XX, debug" from the PTX of IR with debug info
  // is not listed: such IR failed in ptxas before, so no stored entry differs.
  std::vector<std::string> options = {"llvm:triple=nvptx64-nvidia-cuda", "llvm:codegen-O3",
                                      "llvm:ptx=min-for-arch"};
  for (const std::string& o : CanonicalNvJitLinkOptions()) options.push_back(o);
  return MakeToolchain("llvm-nvptx+nvjitlink",
                       absl::StrCat("llvm ", llvm.empty() ? "none" : llvm, " nvjitlink ",
                                    version->major, ".", version->minor),
                       *build, std::move(options));
}

}  // namespace kcache
