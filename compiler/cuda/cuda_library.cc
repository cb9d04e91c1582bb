#include "compiler/cuda/cuda_library.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

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
  return absl::UnavailableError(
      absl::StrCat(display_name, " could not be loaded; tried: ", absl::StrJoin(tried, "; ")));
}

void* CudaSymbols::Find(const char* name) {
  void* symbol = dlsym(handle_, name);
  if (symbol == nullptr) missing_.push_back(name);
  return symbol;
}

absl::StatusOr<void*> LoadCudaLibrary(absl::string_view display_name, absl::string_view base,
                                      int major, const std::string& explicit_path,
                                      absl::string_view lacks_symbols,
                                      absl::FunctionRef<void(CudaSymbols&)> resolve) {
  absl::StatusOr<void*> handle = OpenCudaLibrary(display_name, base, major, explicit_path);
  if (!handle.ok()) return handle;
  CudaSymbols symbols(*handle);
  resolve(symbols);
  if (!symbols.missing().empty()) {
    dlclose(*handle);
    return absl::UnavailableError(
        absl::StrCat(lacks_symbols, ": ", absl::StrJoin(symbols.missing(), ", ")));
  }
  return handle;
}

absl::StatusOr<std::string> LoadedLibraryPath(void* symbol, absl::string_view display_name) {
  Dl_info info;
  if (dladdr(symbol, &info) == 0 || !info.dli_fname) {
    return absl::InternalError(
        absl::StrCat("dladdr could not name the loaded ", display_name, " library"));
  }
  char resolved[PATH_MAX];
  if (!realpath(info.dli_fname, resolved)) return std::string(info.dli_fname);
  return std::string(resolved);
}

std::string ReadCudaLog(absl::FunctionRef<bool(size_t*)> size,
                        absl::FunctionRef<bool(char*)> read) {
  std::string log;
  size_t n = 0;
  if (size(&n) && n > 1) {
    log.resize(n);
    if (!read(log.data())) log.clear();
    while (!log.empty() && log.back() == '\0') log.pop_back();
  }
  return log;
}

}  // namespace kcache
