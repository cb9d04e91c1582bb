// nvJitLink (the CUDA toolkit's JIT linker), loaded at run time with dlopen
// like NVRTC: PTX in, cubin out. Used by the raw-kernel path
// (compiler/worker/raw_compile.h) inside the compile workers. A missing library is
// an Unavailable error at first use, never a failure at start.
//
// Thread-safety: NvJitLink is thread-safe. Loading happens once; each Link
// uses its own nvJitLinkHandle, which nvJitLink allows concurrently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compiler/cuda/cuda_library.h"

namespace kcache {

// The options every link gets besides -arch (part of the raw toolchain's
// fingerprint): IEEE-ish numerics spelled out, -O3, the ptxas resource
// report into the info log.
const std::vector<std::string>& CanonicalNvJitLinkOptions();

struct NvJitLinkVersion {
  unsigned major = 0;
  unsigned minor = 0;
};

struct LinkOutput {
  std::string cubin;
  std::string log;  // nvJitLink's info log (ptxas -v report)
};

class NvJitLink {
 public:
  // `library_path` empty: "libnvJitLink.so.13", "libnvJitLink.so", then
  // $CUDA_HOME/lib64/libnvJitLink.so.13 and /usr/local/cuda/lib64/...
  // Nothing is loaded until the first call below.
  explicit NvJitLink(std::string library_path = "");
  ~NvJitLink();
  NvJitLink(const NvJitLink&) = delete;
  NvJitLink& operator=(const NvJitLink&) = delete;

  // Unavailable (naming every path tried) when the library cannot be loaded
  // or lacks a symbol. Sticky.
  absl::Status Load() const;
  absl::StatusOr<NvJitLinkVersion> Version() const;
  absl::StatusOr<std::string> LibraryPath() const;

  // Links one PTX module into a cubin for `arch` (e.g. "sm_90a"). Errors:
  // InvalidArgument for an arch or option nvJitLink does not know;
  // FailedPrecondition with the error log when the PTX does not assemble;
  // Unavailable when the library cannot be loaded; Internal otherwise.
  absl::StatusOr<LinkOutput> LinkPtx(absl::string_view ptx, absl::string_view arch,
                                     absl::string_view name) const;

 private:
  struct Api;
  absl::StatusOr<const Api*> GetApi() const;

  const std::string library_path_;
  LazyCudaApi<Api> api_;
};

}  // namespace kcache
