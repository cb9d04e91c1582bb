// Raw kernels: request -> identity -> record (see raw_kernel.h).
#include "compiler/raw_kernel.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "compiler/cuda/nvrtc.h"
#include "compiler/resources.h"
#include "compiler/worker/raw_compile.h"

namespace kcache {
namespace {

void AppendField(std::string* out, std::string_view field) {
  absl::StrAppend(out, field.size(), ":");
  out->append(field.data(), field.size());
}

}  // namespace

absl::StatusOr<RawIdentity> ResolveRaw(const v1::RawKernel& raw, std::string_view arch,
                                       const v1::Toolchain& toolchain, size_t max_kernel_names) {
  RawIdentity id;
  id.source.format = static_cast<RawFormat>(raw.format());
  id.source.bytes = raw.source();
  id.source.kernel_names.assign(raw.kernel_names().begin(), raw.kernel_names().end());
  if (absl::Status s = ValidateRawSource(id.source, max_kernel_names); !s.ok()) return s;
  if (absl::Status s = ValidateArch(absl::string_view(arch.data(), arch.size())); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("target.", s.message()));
  }
  id.arch = std::string(arch);
  const Sha256Digest digest = Sha256(id.source.bytes);
  id.source_sha256 = std::string(AsBytes(digest));
  // Canonical identity of the input: kind, format, source digest, names.
  std::string canonical = "kcache.raw.v1\n";
  AppendField(&canonical, absl::StrCat(static_cast<int>(raw.format())));
  AppendField(&canonical, id.source_sha256);
  AppendField(&canonical, absl::StrCat(id.source.kernel_names.size()));
  for (const std::string& n : id.source.kernel_names) AppendField(&canonical, n);
  const std::string source_hex = ToHex(digest);
  auto key = ComputeKey({.spec_canonical = canonical,
                         .template_digest = source_hex,
                         .toolchain = &toolchain,
                         .arch = id.arch});
  if (!key.ok()) return key.status();
  id.key = *std::move(key);
  return id;
}

absl::StatusOr<AttentionBuild> BuildRaw(const RawIdentity& id, const v1::Toolchain& toolchain,
                                        Compiler& compiler, absl::Time deadline) {
  const absl::Time start = absl::Now();
  CompileInput in;
  in.arch = id.arch;
  in.program_name = "raw";
  in.raw = id.source;
  return CompileKernelBuild(
      in, id.key, toolchain, compiler, deadline, start,
      [&](const CompileOutput& out, AttentionBuild& b) {
        v1::KernelRecord& rec = b.record;
        rec.set_template_digest(ToHex(id.source_sha256));
        v1::RawKernelInfo* info = rec.mutable_raw();
        info->set_format(static_cast<v1::RawKernel::Format>(id.source.format));
        info->set_source_sha256(id.source_sha256);
        info->set_source_size(id.source.bytes.size());
        for (const std::string& name : id.source.kernel_names) {
          info->add_kernel_names(name);
          v1::EntryPoint* ep = rec.add_entry_points();
          ep->set_name(name);
          for (const KernelReport& k : out.kernels) {
            if (k.name == name) *ep->mutable_resources() = ToResources(k);
          }
          b.requirements.push_back({name, 0, 0});
        }
      });
}

}  // namespace kcache
