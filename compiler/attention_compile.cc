#include "compiler/attention_compile.h"

#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/key.h"
#include "compiler/attention/codegen.h"
#include "compiler/attention/spec_canonical.h"
#include "compiler/attention/spec_normalize.h"
#include "compiler/attention/spec_validate.h"
#include "compiler/resources.h"
#include "kernels/attention_params.h"
#include "kernels/embedded.h"

namespace kcache {

// Every template file, as NVRTC headers. Built once: the templates are
// immutable data in the binary.
const std::map<std::string, std::string>& TemplateHeaders() {
  static const auto* headers = [] {
    auto* m = new std::map<std::string, std::string>;
    for (const auto& f : kernels::TemplateFiles()) {
      (*m)[std::string(f.name)] = std::string(f.contents);
    }
    return m;
  }();
  return *headers;
}

namespace {

const KernelReport* FindReport(const std::vector<KernelReport>& reports, const std::string& name) {
  for (const KernelReport& k : reports) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<AttentionIdentity> ResolveAttention(const v1::AttentionSpec& spec,
                                                   std::string_view arch,
                                                   const v1::Toolchain& toolchain,
                                                   const AttentionLimits& limits) {
  attention::Limits l;
  l.max_expr_nodes = limits.max_expr_nodes;
  l.max_expr_depth = limits.max_expr_depth;
  if (absl::Status st = attention::ValidateAttentionSpec(spec, l); !st.ok()) return st;
  auto parsed = attention::ParseAttentionArch(absl::string_view(arch.data(), arch.size()));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("target.arch: ", parsed.status().message()));
  }
  AttentionIdentity id;
  id.normalized = attention::NormalizeAttentionSpec(spec);
  id.arch = std::string(arch);
  // Tiles the target cannot build (a tuning, or head dims without tiles
  // there) are the caller's error, answered here rather than as a failed
  // compile: no compile job, no lease on a shared tier, nothing retried.
  if (auto t = attention::ChooseAttentionTiles(id.normalized, *parsed); !t.ok()) return t.status();
  if (id.normalized.backward()) {
    if (auto t = attention::ChooseAttentionBwdTiles(id.normalized, *parsed); !t.ok()) {
      return t.status();
    }
  }
  const std::string canonical = attention::CanonicalSpecBytes(id.normalized);
  const std::string digest(kernels::TemplateDigestHex());
  auto key = ComputeKey({.spec_canonical = canonical,
                         .template_digest = digest,
                         .toolchain = &toolchain,
                         .arch = id.arch});
  if (!key.ok()) return key.status();
  id.key = *std::move(key);
  return id;
}

absl::StatusOr<AttentionBuild> BuildAttention(const AttentionIdentity& id,
                                              const v1::Toolchain& toolchain, Compiler& compiler,
                                              absl::Time deadline) {
  const absl::Time start = absl::Now();
  auto gen = attention::GenerateAttentionSource(id.normalized, id.arch);
  if (!gen.ok()) return gen.status();
  CompileInput in;
  in.source = gen->units.front();
  in.more_units.assign(gen->units.begin() + 1, gen->units.end());
  in.program_name = gen->program_name;
  in.headers = TemplateHeaders();
  in.arch = id.arch;
  return CompileKernelBuild(
      in, id.key, toolchain, compiler, deadline, start,
      [&](const CompileOutput& out, AttentionBuild& b) {
        v1::KernelRecord& rec = b.record;
        *rec.mutable_spec() = id.normalized;
        rec.set_template_digest(std::string(kernels::TemplateDigestHex()));
        rec.set_abi_version(kAttentionAbiVersion);
        rec.set_deterministic_backward(id.normalized.backward() && id.normalized.deterministic());
        b.reference_source = gen->reference_source;
        for (const v1::EntryPoint& e : gen->entry_points) {
          v1::EntryPoint* ep = rec.add_entry_points();
          *ep = e;
          if (const KernelReport* k = FindReport(out.kernels, e.name())) {
            *ep->mutable_resources() = ToResources(*k);
          }
          b.requirements.push_back(
              {e.name(), static_cast<int>(e.dynamic_smem_bytes()), static_cast<int>(e.threads())});
        }
      });
}

absl::StatusOr<AttentionBuild> CompileKernelBuild(
    const CompileInput& in, const std::string& key, const v1::Toolchain& toolchain,
    Compiler& compiler, absl::Time deadline, absl::Time start,
    absl::FunctionRef<void(const CompileOutput&, AttentionBuild&)> describe) {
  auto out = compiler.Compile(in, deadline);
  if (!out.ok()) return out.status();
  AttentionBuild b;
  v1::KernelRecord& rec = b.record;
  rec.set_key(key);
  *rec.mutable_toolchain() = toolchain;
  rec.set_arch(in.arch);
  rec.set_compile_log(out->log);
  describe(*out, b);
  rec.set_compile_time_us(static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start)));
  rec.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  b.cubin = std::move(out->cubin);
  return b;
}

void ApplyVerification(const VerifyResult& verified, AttentionBuild& build) {
  v1::KernelRecord& rec = build.record;
  for (int i = 0; i < rec.entry_points_size() && i < static_cast<int>(verified.entries.size());
       ++i) {
    v1::EntryPoint* ep = rec.mutable_entry_points(i);
    // Keep the compiler's spill figures beside the driver's view.
    KernelReport k;
    k.spill_store_bytes = ep->resources().spill_bytes();
    *ep->mutable_resources() = ToResources(verified.entries[static_cast<size_t>(i)], k);
  }
  rec.set_verified(true);
  rec.set_verified_on(verified.device_name);
}

}  // namespace kcache
