// LLVM IR (text or bitcode) -> PTX through LLVM's own NVPTX backend. The one
// place kcache calls into LLVM's IR and code generator; every LLVM error
// (parse diagnostics, verifier output, target lookup) becomes an absl::Status
// here and nowhere else. Runs inside kcache-compile-worker: LLVM aborts on
// some inputs (report_fatal_error), and the worker process is what contains
// that. Only built with KCACHE_WITH_LLVM (compiler/CMakeLists.txt).
//
// Thread-safety: LlvmIrToPtx may be called from several threads (each call
// has its own LLVMContext); target registration happens once.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kcache {

struct LlvmVersion {
  int major = 0;
  int minor = 0;
  std::string text;  // as written: "22.1.8", "23.0.0git"
};

// The LLVM release linked in.
LlvmVersion LinkedLlvmVersion();

// The LLVM release that wrote `ir`, where the IR says: bitcode's producer
// ("LLVM23.0.0git", in its identification block), textual IR's !llvm.ident
// ("clang version 23.0.0 (...)", "... LLVM 23.1.0"; the newest when several).
// nullopt when it does not say, as Triton's IR does not. Reads without
// parsing the module, so it answers for IR this LLVM cannot parse.
std::optional<LlvmVersion> DeclaredLlvmVersion(absl::string_view ir, bool bitcode);

struct IrToPtxOptions {
  bool bitcode = false;  // the bytes are bitcode (else textual IR)
  std::string arch;      // "sm_80", "sm_90a", ...: the NVPTX processor
  // Each must be a defined function of the module marked as a kernel
  // (ptx_kernel calling convention or !nvvm.annotations "kernel").
  std::vector<std::string> kernel_names;
  // Tests only (the worker sets it from KCACHE_TEST_RAW_FAULTS=1): a kernel
  // named "kcache_test_llvm_fatal" makes LLVM's report_fatal_error abort the
  // process, standing in for an input that crashes LLVM.
  bool enable_test_faults = false;
};

// Parses, verifies (llvm::verifyModule) and compiles `ir` to PTX for the
// triple nvptx64-nvidia-cuda and processor `options.arch` at -O3 codegen;
// the PTX ISA version is LLVM's choice per processor (the least it
// supports for it). IR with debug info keeps its .loc lines, but
// the PTX is not marked ".target ..., debug" (ptxas refuses to optimize
// PTX so marked). IR of older releases is upgraded as LLVM reads it (old
// intrinsics, !nvvm.annotations kernels). Errors:
//   InvalidArgument   "raw.source: written by LLVM X, newer than the LLVM Y
//                     that kcache links ..." when DeclaredLlvmVersion is a
//                     later major.minor than the linked one (patch releases
//                     share the IR format); "raw.source: LLVM Y cannot parse
//                     it: ..." with the diagnostic (and, for IR that does not
//                     say which LLVM wrote it, that a newer LLVM is a likely
//                     cause); the verifier's message; a triple other than
//                     nvptx64; a used llvm.* function this LLVM has no intrinsic for;
//                     "raw.kernel_names[i]: ..." for a missing or non-kernel
//                     function; "target.arch: ..." for a processor LLVM's
//                     NVPTX backend does not know;
//   Internal          code generation failed without aborting.
absl::StatusOr<std::string> LlvmIrToPtx(absl::string_view ir, const IrToPtxOptions& options);

}  // namespace kcache
