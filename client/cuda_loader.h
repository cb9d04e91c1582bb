// The few CUDA driver entry points the client needs to load finished cubins,
// loaded at run time (dlopen "libcuda.so.1") so that the client library links
// and runs on machines with no GPU (it then answers Unavailable on Load).
// Thread-safe: the library is loaded once; the driver allows module loads
// from any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace kcache::client_internal {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;

struct CudaApi {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  // Optional (CUDA 12+): a context's unique id; null where the driver lacks it.
  CUresult (*cuCtxGetId)(CUcontext, unsigned long long*);
};

// Loads the driver once; Unavailable when there is none.
absl::StatusOr<const CudaApi*> GetCudaApi();

// "cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE (200)": the one adapter from
// CUresult to absl::Status in the client.
absl::Status CudaStatus(const CudaApi& api, CUresult rc, const char* what);

}  // namespace kcache::client_internal
