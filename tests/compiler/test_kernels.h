// Small CUDA sources shared by the compiler tests and benchmarks.
#pragma once

#include <string>

namespace kcache::testing {

// A tiny kernel with static shared memory, so ptxas reports registers and smem.
inline std::string TinyKernelSource(const std::string& name = "kc_tiny") {
  return "extern \"C\" __global__ void __launch_bounds__(128) " + name +
         "(float* out, const float* in, int n) {\n"
         "  __shared__ float tile[128];\n"
         "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
         "  tile[threadIdx.x] = i < n ? in[i] : 0.0f;\n"
         "  __syncthreads();\n"
         "  if (i < n) out[i] = tile[127 - threadIdx.x] * 2.0f + 1.0f;\n"
         "}\n";
}

}  // namespace kcache::testing
