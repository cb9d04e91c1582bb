// Toolchain fingerprint: NVRTC version, a digest of the library file, and the
// canonical options.
#include "compiler/toolchain.h"

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/digest.h"
#include "cache/key.h"

namespace kcache {

std::string ComputeToolchainId(const v1::Toolchain& toolchain) {
  // One definition, owned by the store: the id is its key prefix.
  return ToolchainIdHex(toolchain);
}

v1::Toolchain MakeToolchain(std::string compiler, std::string version, std::string build,
                            std::vector<std::string> options) {
  v1::Toolchain t;
  t.set_compiler(std::move(compiler));
  t.set_version(std::move(version));
  t.set_build(std::move(build));
  for (std::string& o : options) t.add_options(std::move(o));
  t.set_id(ComputeToolchainId(t));
  return t;
}

absl::StatusOr<v1::Toolchain> NvrtcToolchain(const Nvrtc& nvrtc) {
  absl::StatusOr<NvrtcVersion> version = nvrtc.Version();
  if (!version.ok()) return version.status();
  absl::StatusOr<std::string> path = nvrtc.LibraryPath();
  if (!path.ok()) return path.status();

  std::ifstream in(*path, std::ios::binary);
  if (!in) return absl::InternalError(absl::StrCat("cannot open NVRTC library ", *path));
  Sha256Hasher h;
  std::string buf(1 << 20, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.Update(std::string_view(buf.data(), static_cast<size_t>(in.gcount())));
  }
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read NVRTC library ", *path));

  return MakeToolchain("nvrtc", absl::StrCat(version->major, ".", version->minor),
                       absl::StrCat("sha256:", ToHex(h.Finish())), CanonicalNvrtcOptions());
}

}  // namespace kcache
