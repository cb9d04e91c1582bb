// The compile contract shared by the in-process NVRTC compiler, the isolated
// worker pool and their fakes: what goes into one compile and what comes out.
// Plain structs (no protobuf) so the NVRTC/driver layer links with only absl.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"

namespace kcache {

// A kernel another compiler produced, compiled as is (compiler/worker/raw_compile.h):
// LLVM IR through LLVM's NVPTX backend to PTX, PTX through nvJitLink.
// Values match kcache.v1.RawKernel.Format.
enum class RawFormat { kLlvmIr = 1, kLlvmBitcode = 2, kPtx = 3 };
struct RawSource {
  RawFormat format = RawFormat::kPtx;
  std::string bytes;
  std::vector<std::string> kernel_names;  // entry points that must be in it
};

// One NVRTC compile (or, with `raw` set, one raw-kernel compile). The toolchain's canonical options
// (CanonicalNvrtcOptions in compiler/cuda/nvrtc.h) and `--gpu-architecture=<arch>` are always
// added; `extra_options` come after them and are NOT part of the toolchain fingerprint: a caller
// that uses them must fold them into its cache key.
struct CompileInput {
  std::string source;        // CUDA C++ translation unit
  std::string program_name;  // shown in diagnostics, e.g. "kcache_attn.cu"
  // Named headers resolved by #include "name" (nvrtcCreateProgram's
  // headers/includeNames). Ordered, so a compile is reproducible.
  std::map<std::string, std::string> headers;
  std::string arch;  // "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", ...
  std::vector<std::string> extra_options;
  // More translation units of the same module (an attention module with
  // backward: compiler/attention/codegen.h). With any, `source` and each of
  // these compile apart, concurrently, each into a whole executable image,
  // and the output's cubin is the images one after another
  // (compiler/cuda/cubin_images.h; CompileUnits in compiler/cuda/nvrtc.h);
  // its log and kernels cover every unit. Like extra_options, not part of
  // the toolchain fingerprint: a caller that sets it folds it into its key.
  std::vector<std::string> more_units;
  // Set: a raw kernel for `arch`; source, program_name, headers and
  // extra_options are then unused. Only WorkerPool and the worker handle it
  // (InProcessCompiler answers Unimplemented): raw input is code, and LLVM
  // may abort on it, so it only ever runs in a worker process.
  std::optional<RawSource> raw;
};

// Per-kernel figures from ptxas's verbose report (--ptxas-options=-v). The
// driver's view after loading (compiler/cuda/cuda_driver.h) is authoritative; this
// is what compile-only mode records.
struct KernelReport {
  std::string name;  // as ptxas names it: the symbol (extern "C" = plain name)
  int registers = 0;
  int static_smem_bytes = 0;
  int stack_frame_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
};

struct CompileOutput {
  std::string cubin;                  // ELF image(s): compiler/cuda/cubin_images.h
  std::string log;                    // NVRTC's full program log (warnings + ptxas report)
  std::vector<KernelReport> kernels;  // entry functions, in log order
  absl::Duration wall_time;           // create + compile + fetch, as seen by the compiler
};

// Anything that compiles a CompileInput: InProcessCompiler (compiler/cuda/nvrtc.h),
// WorkerPool (compiler/worker/worker_pool.h), or a test fake. Implementations are
// thread-safe.
//
// Errors:
//   InvalidArgument     malformed input (bad arch, option, empty source), or
//                       an option NVRTC rejects;
//   FailedPrecondition  the source does not compile; the message carries
//                       NVRTC's log (the daemon returns it as is);
//   Unavailable         NVRTC cannot be loaded (message says where it looked);
//   DeadlineExceeded    the deadline passed before the compile finished;
//   Internal            NVRTC or a compile worker failed in some other way
//                       (e.g. "compile worker crashed with signal 6").
// Marks a compile that hit a compile worker's resource limit (WorkerPool's
// ResourceExhausted; issue 26): deterministic for its input, so remembered
// like a compile error and never answered with a retry hint.
inline constexpr char kCompileLimitExceeded[] = "exceeded the compile worker's";
inline bool IsCompileLimitExceeded(const absl::Status& s) {
  return absl::IsResourceExhausted(s) && absl::StrContains(s.message(), kCompileLimitExceeded);
}

class Compiler {
 public:
  virtual ~Compiler() = default;
  virtual absl::StatusOr<CompileOutput> Compile(const CompileInput& input, absl::Time deadline) = 0;
};

}  // namespace kcache
