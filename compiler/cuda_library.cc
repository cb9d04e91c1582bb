#include "compiler/cuda_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kcache {

absl::StatusOr<void*> OpenCudaLibrary(absl::string_view display_name, absl::string_view base,
                                      int major, const std::string& explicit_path) {
  std::vector<std::string> candidates;
  if (!explicit_path.empty()) {
    candidates.push_back(explicit_path);
  } else {
    const std::string versioned = absl::StrCat(base, ".so.", major);
    candidates = {versioned, absl::StrCat(base, ".so")};
    if (const char* home = std::getenv("CUDA_HOME"); home && *home) {
      candidates.push_back(absl::StrCat(home, "/lib64/", versioned));
    }
    candidates.push_back(absl::StrCat("/usr/local/cuda/lib64/", versioned));
  }
  std::vector<std::string> tried;
  for (const std::string& path : candidates) {
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* err = dlerror();
    tried.push_back(absl::StrCat(path, " (", err ? err : "unknown error", ")"));
  }
  return absl::UnavailableError(absl::StrCat(display_name, " could not be loaded; tried: ",
                                             absl::StrJoin(tried, "; ")));
}

}  // namespace kcache
