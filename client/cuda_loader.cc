#include "client/cuda_loader.h"

#include <dlfcn.h>

#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kcache::client_internal {

namespace {
struct Loaded {
  absl::Status status;
  CudaApi api{};
};

Loaded LoadOnce() {
  Loaded l;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    l.status = absl::UnavailableError(
        absl::StrCat("no CUDA driver: dlopen(libcuda.so.1) failed: ", dlerror()));
    return l;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (fn == nullptr && l.status.ok()) {
      l.status = absl::UnavailableError(absl::StrCat("CUDA driver lacks ", name));
    }
  };
  sym(l.api.cuInit, "cuInit");
  sym(l.api.cuCtxGetCurrent, "cuCtxGetCurrent");
  sym(l.api.cuCtxGetDevice, "cuCtxGetDevice");
  sym(l.api.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  sym(l.api.cuModuleLoadData, "cuModuleLoadData");
  sym(l.api.cuModuleUnload, "cuModuleUnload");
  sym(l.api.cuModuleGetFunction, "cuModuleGetFunction");
  sym(l.api.cuFuncSetAttribute, "cuFuncSetAttribute");
  sym(l.api.cuGetErrorName, "cuGetErrorName");
  sym(l.api.cuDriverGetVersion, "cuDriverGetVersion");
  sym(l.api.cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  sym(l.api.cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  sym(l.api.cuFuncGetAttribute, "cuFuncGetAttribute");
  sym(l.api.cuLaunchKernel, "cuLaunchKernel");
  l.api.cuCtxGetId =
      reinterpret_cast<decltype(l.api.cuCtxGetId)>(dlsym(h, "cuCtxGetId"));  // optional
  l.api.cuLaunchKernelEx =
      reinterpret_cast<decltype(l.api.cuLaunchKernelEx)>(dlsym(h, "cuLaunchKernelEx"));
  if (l.status.ok()) {
    if (CUresult rc = l.api.cuInit(0); rc != 0) l.status = CudaStatus(l.api, rc, "cuInit");
  }
  return l;
}
}  // namespace

absl::StatusOr<const CudaApi*> GetCudaApi() {
  static const Loaded* loaded = new Loaded(LoadOnce());  // never freed: process lifetime
  if (!loaded->status.ok()) return loaded->status;
  return &loaded->api;
}

absl::Status CudaStatus(const CudaApi& api, CUresult rc, const char* what) {
  if (rc == 0) return absl::OkStatus();
  const char* name = "unknown";
  if (api.cuGetErrorName != nullptr) api.cuGetErrorName(rc, &name);
  std::string msg = absl::StrCat(what, ": ", name, " (", rc, ")");
  // 100 = CUDA_ERROR_NO_DEVICE, 3 = CUDA_ERROR_NOT_INITIALIZED, 201 = INVALID_CONTEXT
  if (rc == 100 || rc == 3 || rc == 201) return absl::FailedPreconditionError(msg);
  if (rc == 200 || rc == 209 || rc == 218) return absl::InvalidArgumentError(msg);  // bad image
  return absl::InternalError(msg);
}

}  // namespace kcache::client_internal
