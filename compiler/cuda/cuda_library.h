// Loading NVIDIA's run-time libraries (NVRTC, nvJitLink, the driver) with
// dlopen, so that kcache builds and starts without them and says which paths
// it tried when one is missing; and the pieces their wrappers share (symbol
// lookup, the loaded file's path, reading a log).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kcache {

// dlopen's `explicit_path` alone when it is non-empty; otherwise the first
// of "<base>.so.<major>", "<base>.so", "$CUDA_HOME/lib64/<base>.so.<major>"
// and "/usr/local/cuda/lib64/<base>.so.<major>" that loads. The handle is
// never closed (the libraries keep process-wide state). UNAVAILABLE names
// `display_name` and every path tried with dlerror's reason.
absl::StatusOr<void*> OpenCudaLibrary(absl::string_view display_name, absl::string_view base,
                                      int major, const std::string& explicit_path);

// The entry points of one dlopen'ed library, looked up by name; remembers
// the names it could not find. Not thread-safe: one per load.
class CudaSymbols {
 public:
  explicit CudaSymbols(void* handle) : handle_(handle) {}

  // Sets `fn` to the library's symbol `name`, or to null (and remembers
  // `name`) when the library lacks it.
  template <typename Fn>
  void Resolve(Fn*& fn, const char* name) {
    fn = reinterpret_cast<Fn*>(Find(name));
  }
  // The names not found, in the order they were asked for.
  const std::vector<std::string>& missing() const { return missing_; }

 private:
  void* Find(const char* name);

  void* const handle_;
  std::vector<std::string> missing_;
};

// OpenCudaLibrary, then `resolve` over the library's symbols. When a symbol
// is missing the library is closed again and the result is UNAVAILABLE
// "<lacks_symbols>: <the missing names>".
absl::StatusOr<void*> LoadCudaLibrary(absl::string_view display_name, absl::string_view base,
                                      int major, const std::string& explicit_path,
                                      absl::string_view lacks_symbols,
                                      absl::FunctionRef<void(CudaSymbols&)> resolve);

// A library's resolved entry points (`Api`), loaded on first use. The
// outcome is sticky: a failed load is not retried. Thread-safe: the first
// caller loads, concurrent callers wait for it. `Api` may be incomplete where
// this is declared; the owner's destructor must see it complete.
template <typename Api>
class LazyCudaApi {
 public:
  using LoadFn = absl::FunctionRef<absl::StatusOr<std::unique_ptr<Api>>()>;

  // The loaded Api; `load` runs on the first call only, under the lock.
  absl::StatusOr<const Api*> Get(LoadFn load) const {
    absl::MutexLock lock(&mu_);
    if (!attempted_) {
      attempted_ = true;
      absl::StatusOr<std::unique_ptr<Api>> loaded = load();
      if (loaded.ok()) {
        api_ = *std::move(loaded);
      } else {
        status_ = loaded.status();
      }
    }
    if (!status_.ok()) return status_;
    return api_.get();
  }

 private:
  mutable absl::Mutex mu_;
  mutable bool attempted_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Set once under mu_; what it points to is read-only afterwards.
  mutable std::unique_ptr<Api> api_ ABSL_GUARDED_BY(mu_);
};

// The canonical path (realpath; dladdr's name when that fails) of the loaded
// library file that defines `symbol`. INTERNAL naming `display_name` when
// dladdr cannot tell.
absl::StatusOr<std::string> LoadedLibraryPath(void* symbol, absl::string_view display_name);

// A log that a library hands out in two calls: `size` (false on failure)
// then `read` into a buffer of that size (false on failure). Empty when
// either fails or the log is empty; trailing NULs removed.
std::string ReadCudaLog(absl::FunctionRef<bool(size_t*)> size, absl::FunctionRef<bool(char*)> read);

}  // namespace kcache
