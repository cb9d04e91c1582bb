// One attention kernel from spec to cubin and record, shared by the daemon
// (which adds device verification and publishing) and the offline
// kcache-compile command: validate, normalize, key, generate, compile, and
// describe the result as a KernelRecord. Thread-safe (no shared state).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/cuda/compile.h"
#include "compiler/cuda/cuda_driver.h"
#include "kcache/v1/record.pb.h"
#include "kcache/v1/spec.pb.h"

namespace kcache {

// A spec resolved to its kernel identity for one architecture.
struct AttentionIdentity {
  v1::AttentionSpec normalized;
  std::string arch;
  std::string key;  // store key (cache/key.h)
};

struct AttentionLimits {
  int max_expr_nodes = 256;
  int max_expr_depth = 32;
};

// Validates `spec` (InvalidArgument naming the field) and `arch`
// (InvalidArgument "target.arch: ..."), normalizes, and computes the key over
// the canonical spec bytes, the embedded templates' digest, the toolchain
// and the arch.
absl::StatusOr<AttentionIdentity> ResolveAttention(const v1::AttentionSpec& spec,
                                                   std::string_view arch,
                                                   const v1::Toolchain& toolchain,
                                                   const AttentionLimits& limits = {});

struct AttentionBuild {
  v1::KernelRecord record;  // unverified; cubin_sha256 filled by the store
  std::string cubin;
  // What a device must satisfy to verify the cubin, one per entry point.
  std::vector<EntryRequirement> requirements;
  // Attention only: the numeric check's reference translation unit
  // (GeneratedSource::reference_source; compiler/numeric_check.h).
  std::string reference_source;
};

// Every kernel template file (kernels/), as NVRTC headers by name.
const std::map<std::string, std::string>& TemplateHeaders();

// Generates the source, compiles it with `compiler` by `deadline`, and
// builds the record (entry points with launch facts and the compiler's
// resource report, toolchain, template digest, ABI version, log, compile
// time). Errors are the generator's and the compiler's (FailedPrecondition
// with the log for a compile error).
absl::StatusOr<AttentionBuild> BuildAttention(const AttentionIdentity& id,
                                              const v1::Toolchain& toolchain, Compiler& compiler,
                                              absl::Time deadline);

// What BuildAttention and BuildRaw (raw_kernel.h) share: compiles `in` with
// `compiler` by `deadline`, then builds the record fields every kernel kind
// has (key, toolchain, in.arch, compile log, compile time since `start`,
// creation time) and keeps the cubin; `describe` first adds the kind's own
// fields and requirements from the compiler's output. Errors are the
// compiler's.
absl::StatusOr<AttentionBuild> CompileKernelBuild(
    const CompileInput& in, const std::string& key, const v1::Toolchain& toolchain,
    Compiler& compiler, absl::Time deadline, absl::Time start,
    absl::FunctionRef<void(const CompileOutput&, AttentionBuild&)> describe);

// Records a successful device verification: resources as the driver reports
// them, verified, verified_on.
void ApplyVerification(const VerifyResult& verified, AttentionBuild& build);

}  // namespace kcache
