// Both ends of the compile-worker protocol (compiler/worker.proto): framing
// over a stream socket, conversions between CompileInput/CompileOutput and
// the wire messages, and the worker's serve loop (kcache-compile-worker's
// whole body). Functions are thread-compatible: one thread per fd.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/compile.h"
#include "compiler/raw_compile.h"
#include "compiler/worker.pb.h"

namespace kcache::worker {

// The worker's exit status when an allocation failed under its address-space
// limit (std::new_handler, or NVRTC answering out of memory); WorkerPool maps
// it to ResourceExhausted naming the limit.
inline constexpr int kExitOutOfMemory = 86;

// Frames larger than this are refused at both ends.
inline constexpr size_t kMaxFrameBytes = size_t{1} << 30;

// Writes one frame (4-byte little-endian length + payload). Blocks until
// written or `deadline`. Never raises SIGPIPE. Errors: Unavailable when the
// peer is gone, DeadlineExceeded, Internal.
absl::Status WriteFrame(int fd, const std::string& payload,
                        absl::Time deadline = absl::InfiniteFuture());

// Reads one frame. NotFound on a clean end of stream before any byte of the
// frame (the peer closed), Unavailable when the peer vanished mid-frame,
// DeadlineExceeded, DataLoss on an oversized length.
absl::StatusOr<std::string> ReadFrame(int fd, absl::Time deadline = absl::InfiniteFuture());

CompileRequest ToRequest(const CompileInput& input, absl::Time deadline);
CompileInput FromRequest(const CompileRequest& request, absl::Time* deadline);
CompileResponse ToResponse(const absl::StatusOr<CompileOutput>& result);
absl::StatusOr<CompileOutput> FromResponse(const CompileResponse& response);

struct ServeOptions {
  int fd = 3;               // the socket to the pool
  std::string nvrtc_path;   // empty: Nvrtc's default search
  std::string nvjitlink_path;  // empty: NvJitLink's default search
  // LLVM IR -> PTX for raw kernels; set by kcache-compile-worker's main when
  // built with LLVM. Null: LLVM IR requests answer Unimplemented.
  IrToPtxFn ir_to_ptx = nullptr;
  // Tests only: honour the extra options "kcache-test-crash" (abort()),
  // "kcache-test-hang" (block forever) and "kcache-test-crash-once=PATH"
  // (abort() if PATH does not exist yet, creating it; otherwise compile
  // without the option), "kcache-test-alloc" (allocate until an allocation
  // fails; with no address-space limit, give up after 64 GiB and answer
  // Internal) and "kcache-test-spin" (burn CPU forever). Off in production: then they reach NVRTC, which
  // rejects them as unknown options.
  bool enable_test_faults = false;
  // Tests only: raw kernels named "kcache_test_llvm_fatal" make LLVM abort
  // (IrToPtxOptions::enable_test_faults). Set by --enable-test-faults or by
  // KCACHE_TEST_RAW_FAULTS=1 in the environment (which the daemon's workers
  // inherit, so an end-to-end test can reach it through kcached).
  bool enable_raw_test_faults = false;
  // Resource limits, set by the worker on itself (posix_spawn cannot):
  // RLIMIT_AS and RLIMIT_FSIZE at start, RLIMIT_CORE always 0, and before
  // each compile the soft RLIMIT_CPU to (CPU used so far + cpu_seconds),
  // RLIMIT_CPU being cumulative per process. 0 = unlimited.
  uint64_t limit_as_bytes = 0;
  uint64_t limit_cpu_seconds = 0;
  uint64_t limit_fsize_bytes = 0;
};

// Serves compile requests on `options.fd` until the pool closes it. Returns
// the process exit code: 0 on a clean close, 1 on a protocol error.
int Serve(const ServeOptions& options);

// Parses kcache-compile-worker's arguments: --fd=N, --nvrtc=PATH,
// --nvjitlink=PATH, --enable-test-faults, --limit-as=BYTES,
// --limit-cpu=SECONDS, --limit-fsize=BYTES; reads KCACHE_TEST_RAW_FAULTS. InvalidArgument naming the bad argument.
absl::StatusOr<ServeOptions> ParseWorkerArgs(int argc, char** argv);

}  // namespace kcache::worker
