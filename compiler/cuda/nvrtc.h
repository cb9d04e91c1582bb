// NVRTC, loaded at run time with dlopen so that tools which only read the
// store start on machines without it. A missing NVRTC is an Unavailable error
// at the first use, never a failure at start.
//
// Thread-safety: Nvrtc and InProcessCompiler are thread-safe. Loading happens
// once (the first caller loads, others wait); after that no lock is taken and
// compiles run concurrently. NVRTC documents its API as thread-safe for
// distinct nvrtcProgram objects, and every Compile uses its own program.
//
// Numerics (part of the fingerprint): no --use_fast_math. The options spell
// out IEEE-ish defaults (--ftz=false, --prec-div=true, --prec-sqrt=true,
// --fmad=true) so that a change of NVRTC defaults cannot silently change
// kernels; templates that want fast exponentials call exp2f/__expf
// explicitly, where a reviewer can see it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "compiler/cuda/compile.h"
#include "compiler/cuda/cuda_library.h"

namespace kcache {

// The arch-independent options every compile gets, in order. The
// architecture option (--gpu-architecture=sm_XX) is added per compile and is
// not listed here: the arch is a separate component of the kernel key.
const std::vector<std::string>& CanonicalNvrtcOptions();

// Checks an arch string: "sm_" followed by 2-3 digits and an optional 'a' or
// 'f' suffix. Whether NVRTC supports it is checked by NVRTC itself.
absl::Status ValidateArch(absl::string_view arch);

// Extracts per-function resource figures from a ptxas -v report. Functions
// that never get a "Used N registers" line are left out. Never fails:
// unknown lines are ignored.
std::vector<KernelReport> ParsePtxasReport(absl::string_view log);

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
};

class Nvrtc {
 public:
  // `library_path` empty: try "libnvrtc.so.13", "libnvrtc.so" (the loader's
  // search path), then $CUDA_HOME/lib64/libnvrtc.so.13 and
  // /usr/local/cuda/lib64/libnvrtc.so.13. Otherwise exactly that path.
  // Nothing is loaded until the first call below.
  explicit Nvrtc(std::string library_path = "");
  ~Nvrtc();
  Nvrtc(const Nvrtc&) = delete;
  Nvrtc& operator=(const Nvrtc&) = delete;

  // Loads the library if not yet loaded. Unavailable (naming every path
  // tried and dlerror) when it cannot be loaded or lacks a symbol. The result
  // is sticky: a failed load is not retried.
  absl::Status Load() const;

  absl::StatusOr<NvrtcVersion> Version() const;
  // Canonical path of the loaded library file (realpath).
  absl::StatusOr<std::string> LibraryPath() const;

  // Compiles `input` (one unit: InvalidArgument when input.more_units is set;
  // CompileUnits compiles those); see Compiler in compiler/cuda/compile.h for
  // the error codes.
  // The deadline is enforced through nvrtcSetFlowCallback (NVRTC polls it,
  // so cancellation is prompt in the front end, coarser inside ptxas); an
  // InfiniteFuture deadline and no `cancel` install no callback. `cancel`
  // (may be null; CompileUnits' flag) stops the compile the same way once it
  // is true: Cancelled, unless the deadline has passed too
  // (DeadlineExceeded).
  absl::StatusOr<CompileOutput> Compile(const CompileInput& input,
                                        absl::Time deadline = absl::InfiniteFuture(),
                                        const std::atomic<bool>* cancel = nullptr) const;

 private:
  struct Api;  // resolved function pointers
  absl::StatusOr<const Api*> GetApi() const;

  const std::string library_path_;
  LazyCudaApi<Api> api_;
};

// One compile of `input`: nvrtc.Compile when input.more_units is empty;
// otherwise `source` and each of more_units compiled apart, each on its own
// thread (NVRTC allows distinct programs concurrently: on two cores the units
// of a backward module take about the longest unit's wall time, not the
// sum), and the output's cubin their images joined (JoinCubinImages). Its log
// has each unit's log under a "unit N:" line; its kernels are every unit's;
// its wall_time is the whole. Errors as Compiler::Compile. The first unit
// to fail cancels the others (NVRTC's flow callback; a unit not yet started
// is not started): they answer Cancelled, and the first unit, in order, that
// failed for itself answers for the compile (its message names the unit).
absl::StatusOr<CompileOutput> CompileUnits(const Nvrtc& nvrtc, const CompileInput& input,
                                           absl::Time deadline);

// One unit's compile as CompileUnits calls it: Nvrtc::Compile, or a test's
// stand-in. `cancel` is null for a module of one unit.
using UnitCompile = std::function<absl::StatusOr<CompileOutput>(
    const CompileInput& unit, absl::Time deadline, const std::atomic<bool>* cancel)>;

// CompileUnits with `compile` for each unit (the one above passes
// nvrtc.Compile); for tests of the threads and the cancellation.
absl::StatusOr<CompileOutput> CompileUnits(const UnitCompile& compile, const CompileInput& input,
                                           absl::Time deadline);

// Compiles in the calling process. Cheap, but an NVRTC crash or hang takes
// the process with it: the daemon uses WorkerPool (compiler/worker/worker_pool.h).
// Thread-safe. Does not own `nvrtc`, which must outlive it.
class InProcessCompiler : public Compiler {
 public:
  explicit InProcessCompiler(const Nvrtc* nvrtc) : nvrtc_(nvrtc) {}
  absl::StatusOr<CompileOutput> Compile(const CompileInput& input, absl::Time deadline) override {
    return CompileUnits(*nvrtc_, input, deadline);
  }

 private:
  const Nvrtc* nvrtc_;
};

}  // namespace kcache
