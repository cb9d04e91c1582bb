// The raw-kernel compile that runs inside kcache-compile-worker: LLVM IR (or
// bitcode) -> PTX through an IR compiler the worker was built with
// (compiler/llvm/llvm_nvptx.h, absent without KCACHE_WITH_LLVM), then PTX ->
// cubin through nvJitLink; PTX input goes straight to nvJitLink. Resource
// figures come from ptxas's report in nvJitLink's info log.
//
// Thread-compatible: one compile at a time per RawCompiler is what the
// worker does; the pieces it calls are themselves thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compiler/cuda/compile.h"
#include "compiler/cuda/nvjitlink.h"
#include "compiler/llvm/llvm_nvptx.h"

namespace kcache {

// The LLVM release this tree was configured with (CMake's
// LLVM_PACKAGE_VERSION, e.g. "22.1.8"); empty when built without LLVM. Part
// of the raw toolchain's fingerprint (compiler/toolchain.h): the daemon and
// its workers are always built from one tree and configuration.
std::string ConfiguredLlvmVersion();

// LlvmIrToPtx's signature; null when the worker was built without LLVM.
using IrToPtxFn = absl::StatusOr<std::string> (*)(absl::string_view ir,
                                                  const IrToPtxOptions& options);

// Syntactic checks shared by the daemon (before keying) and the worker:
// a known format, a non-empty source, 1..max_names kernel names, each a
// PTX/C identifier of at most 1024 characters, no duplicates.
// InvalidArgument naming the field ("raw.kernel_names[2]: ...").
absl::Status ValidateRawSource(const RawSource& raw, size_t max_names = 1024);

// OK when every name has a `.entry NAME` in `ptx`; InvalidArgument
// "raw.kernel_names[i]: ..." otherwise.
absl::Status CheckPtxEntries(absl::string_view ptx, const std::vector<std::string>& names);

struct RawCompileOptions {
  const NvJitLink* linker = nullptr;  // required
  IrToPtxFn ir_to_ptx = nullptr;      // null: LLVM IR formats are Unimplemented
  bool enable_test_faults = false;    // see IrToPtxOptions
};

// Compiles `raw` for `arch`. Errors: InvalidArgument for bad input (the IR
// verifier's message, a missing entry); FailedPrecondition with nvJitLink's
// log when the PTX does not assemble; Unimplemented for LLVM IR in a worker
// built without LLVM; Unavailable when nvJitLink cannot be loaded.
absl::StatusOr<CompileOutput> CompileRaw(const RawSource& raw, const std::string& arch,
                                         const RawCompileOptions& options);

}  // namespace kcache
