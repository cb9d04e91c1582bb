// Launching a raw kernel (Client::LoadRaw) with what its compiler asked for:
// more than 48 KiB of dynamic shared memory, thread-block clusters. The C++
// twin of Python's RawModule.launch (client/python/kcache/cuda.py).
//
// Thread-safety: LaunchRaw may be called from any thread, concurrently; the
// per-function facts it reads from the driver and the shared-memory limit it
// raises are kept once per (function, context) in the LoadedKernel.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/cuda_loader.h"

namespace kcache {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  friend bool operator==(const Dim3& a, const Dim3& b) {
    return a.x == b.x && a.y == b.y && a.z == b.z;
  }
};

struct RawLaunchConfig {
  Dim3 grid;                  // in blocks (a whole number of clusters)
  Dim3 block;                 // threads per block
  unsigned shared_bytes = 0;  // dynamic shared memory per block
  void* stream = nullptr;     // CUstream; null: the context's default stream
  // Thread-block cluster shape. Unset: the one the kernel was compiled for
  // (PTX .reqnctapercluster, Triton's num_ctas), or none. Needed for
  // .explicitcluster kernels, which do not say their shape.
  std::optional<Dim3> cluster;
};

// What the driver says about one function in one context.
struct RawFunctionLimits {
  int static_shared = 0;                 // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
  int max_shared_optin = 48 * 1024;      // the device's MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
  std::optional<Dim3> required_cluster;  // REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH, all > 0
  bool cluster_must_be_set = false;      // CLUSTER_SIZE_MUST_BE_SET
};

// Checks a launch of `name` against its limits, without the driver. Returns
// the cluster shape to launch with (nullopt: an ordinary launch).
// InvalidArgument naming the kernel: shared memory (dynamic + static) over
// the device's maximum (the message says the maximum); a zero grid or block
// dimension; a cluster that differs from the compiled one, or none known for
// an .explicitcluster kernel; a grid that is not a whole number of clusters.
absl::StatusOr<std::optional<Dim3>> PlanRawLaunch(absl::string_view name,
                                                  const RawLaunchConfig& config,
                                                  const RawFunctionLimits& limits);

// Launches entry point `name` of `kernel` (from Client::LoadRaw) with `args`
// (kernelParams: one pointer per kernel parameter, as cuLaunchKernel takes
// them), in the kernel's context (pushed for the call). Over 48 KiB of
// shared memory the function's dynamic limit is raised to the device's
// maximum, once per function and context (as Triton's launcher does);
// clusters launch through cuLaunchKernelEx. Errors: PlanRawLaunch's;
// NotFound for a name the kernel does not export; FailedPrecondition for a
// cluster launch on a driver without cuLaunchKernelEx; the driver's errors
// (client/cuda_loader.h CudaStatus); Unavailable without a driver.
absl::Status LaunchRaw(const LoadedKernel& kernel, absl::string_view name,
                       const RawLaunchConfig& config, void** args);

namespace client_internal {

// LoadedKernel::raw_launch_state: per entry point, its limits (read from the
// driver on the first launch) and whether its dynamic shared memory limit
// has been raised. The mutex is held only around map access and the one
// cuFuncSetAttribute, never across a launch.
struct RawLaunchState {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, RawFunctionLimits> limits ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<std::string> raised ABSL_GUARDED_BY(mu);
};

// LaunchRaw through `api` (tests give a fake driver).
absl::Status LaunchRawWith(const CudaApi& api, const LoadedKernel& kernel, absl::string_view name,
                           const RawLaunchConfig& config, void** args);

}  // namespace client_internal
}  // namespace kcache
