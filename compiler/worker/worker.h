// Both ends of the compile-worker protocol (compiler/worker/worker.proto): framing
// over a stream socket, conversions between CompileInput/CompileOutput and
// the wire messages, and the worker's serve loop (kcache-compile-worker's
// whole body). Functions are thread-compatible: one thread per fd.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/cuda/compile.h"
#include "compiler/worker/raw_compile.h"
#include "compiler/worker/worker.pb.h"

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
  int fd = 3;                  // the socket to the pool
  std::string nvrtc_path;      // empty: Nvrtc's default search
  std::string nvjitlink_path;  // empty: NvJitLink's default search
  // LLVM IR -> PTX for raw kernels; set by kcache-compile-worker's main when
  // built with LLVM. Null: LLVM IR requests answer Unimplemented.
  IrToPtxFn ir_to_ptx = nullptr;
  // Tests only: honour the extra options "kcache-test-crash" (abort()),
  // "kcache-test-hang" (block forever) and "kcache-test-crash-once=PATH"
  // (abort() if PATH does not exist yet, creating it; otherwise compile
  // without the option), "kcache-test-alloc" (allocate until an allocation
  // fails; with no address-space limit, give up after 64 GiB and answer
  // Internal), "kcache-test-spin" (burn CPU forever) and
  // "kcache-test-sandbox" (answer FailedPrecondition with DescribeSandbox's
  // line instead of compiling). Off in production: then they reach NVRTC,
  // which rejects them as unknown options.
  bool enable_test_faults = false;
  // Tests only: raw kernels named "kcache_test_llvm_fatal" make LLVM abort
  // (IrToPtxOptions::enable_test_faults); a raw kernel named
  // "kcache_test_alloc" or "kcache_test_spin" runs the fault of the same
  // name above before compiling. Set by --enable-test-faults or by
  // KCACHE_TEST_RAW_FAULTS=1 in the environment (which the daemon's workers
  // inherit, so an end-to-end test can reach it through kcached).
  bool enable_raw_test_faults = false;
  // Drop network access at start (DropNetwork); off only with --keep-network.
  bool drop_network = true;
  // --probe: apply the protections, print DescribeSandbox's line on stdout
  // and exit 0 (kcached's start-up check, WorkerPool::Probe).
  bool probe = false;
  // Resource limits, set by the worker on itself (posix_spawn cannot):
  // RLIMIT_AS and RLIMIT_FSIZE at start, RLIMIT_CORE always 0, and before
  // each compile the soft RLIMIT_CPU to (CPU used so far + cpu_seconds),
  // RLIMIT_CPU being cumulative per process. 0 = unlimited.
  uint64_t limit_as_bytes = 0;
  uint64_t limit_cpu_seconds = 0;
  uint64_t limit_fsize_bytes = 0;
};

// Drops this process's network access where an unprivileged process can:
// unshare(CLONE_NEWUSER | CLONE_NEWNET) (a user namespace of its own, with
// its uid and gid mapped to themselves, and a network namespace with only a
// loopback interface, down), then gives up the capabilities the new user
// namespace granted and sets no_new_privs (a failure of those two steps is
// a warning on stderr: the network is gone anyway). The process must be
// single-threaded. PermissionDenied naming the call when the platform
// refuses (user namespaces off, or forbidden, as systemd's
// RestrictNamespaces= and SystemCallFilter= do in docker/kcached.service, or
// Docker's default seccomp profile); then nothing was changed.
absl::Status DropNetwork();

// What a worker applied at start (for --probe and the sandbox test fault).
struct SandboxReport {
  absl::Status network;  // DropNetwork's answer
};

// One line: "network dropped (...)" or "network kept (<why>)", then what
// the process sees: "; interfaces lo; connect 192.0.2.1: Network is
// unreachable" (a UDP connect, which sends nothing).
std::string DescribeSandbox(const SandboxReport& report);

// Applies the protections (DropNetwork unless options.drop_network is off,
// then the resource limits), then serves compile requests on `options.fd`
// until the pool closes it (or, with options.probe, prints the protections
// and returns). Returns the process exit code: 0 on a clean close, 1 on a
// protocol error.
int Serve(const ServeOptions& options);

// Parses kcache-compile-worker's arguments: --fd=N, --nvrtc=PATH,
// --nvjitlink=PATH, --enable-test-faults, --limit-as=BYTES,
// --limit-cpu=SECONDS, --limit-fsize=BYTES, --keep-network, --probe; reads
// KCACHE_TEST_RAW_FAULTS. InvalidArgument naming the bad argument.
absl::StatusOr<ServeOptions> ParseWorkerArgs(int argc, char** argv);

}  // namespace kcache::worker
