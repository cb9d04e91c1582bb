// One raw kernel (v1::RawKernel: LLVM IR, bitcode or PTX) from request to
// cubin and record, the raw twin of attention_compile.h: validate, key,
// compile (in a worker: CompileInput::raw), describe as a KernelRecord.
// Thread-safe (no shared state).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/attention_compile.h"
#include "compiler/cuda/compile.h"
#include "kcache/v1/record.pb.h"
#include "kcache/v1/spec.pb.h"

namespace kcache {

struct RawIdentity {
  RawSource source;
  std::string arch;
  std::string key;            // store key (cache/key.h), under the raw toolchain's prefix
  std::string source_sha256;  // 32 raw bytes
};

// Validates `raw` (InvalidArgument "raw.format: ...", "raw.kernel_names[i]:
// ..."; at most `max_kernel_names` names) and `arch` ("target.arch: ..."),
// and computes the key over a canonical encoding of the kind ("raw"), the
// format, the source's SHA-256, the kernel names in order, the raw
// toolchain (LLVM and nvJitLink versions, options) and the arch.
absl::StatusOr<RawIdentity> ResolveRaw(const v1::RawKernel& raw, std::string_view arch,
                                       const v1::Toolchain& toolchain,
                                       size_t max_kernel_names = 64);

// Compiles with `compiler` (a WorkerPool: InProcessCompiler refuses raw
// input) by `deadline` and builds the record: raw info, toolchain, arch, one
// entry point per kernel name with the ptxas figures, the log. Errors are
// the compiler's (compiler/worker/raw_compile.h).
absl::StatusOr<AttentionBuild> BuildRaw(const RawIdentity& id, const v1::Toolchain& toolchain,
                                        Compiler& compiler, absl::Time deadline);

}  // namespace kcache
