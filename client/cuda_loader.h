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
using CUstream = struct CUstream_st*;

// cuda.h's CUlaunchAttribute / CUlaunchConfig, for cuLaunchKernelEx with a
// cluster shape (the only attributes kcache sets).
struct CuLaunchAttribute {
  int id;  // 4 = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, 5 = ..._SCHEDULING_POLICY_PREFERENCE
  char pad[4];
  union {
    char bytes[64];
    void* align;
    struct {
      unsigned x, y, z;
    } cluster_dim;
    int value;
  } value;
};
struct CuLaunchConfig {
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_bytes;
  CUstream stream;
  CuLaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(CuLaunchAttribute) == 72 && sizeof(CuLaunchConfig) == 56,
              "CUlaunchAttribute / CUlaunchConfig layout of cuda.h");

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
  // Raw-kernel launches (client/raw_launch.h).
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  // Optional (CUDA 12+): null where the driver lacks it.
  CUresult (*cuLaunchKernelEx)(const CuLaunchConfig*, CUfunction, void**, void**);
};

// Loads the driver once; Unavailable when there is none.
absl::StatusOr<const CudaApi*> GetCudaApi();

// "cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE (200)": the one adapter from
// CUresult to absl::Status in the client.
absl::Status CudaStatus(const CudaApi& api, CUresult rc, const char* what);

}  // namespace kcache::client_internal
