// Raw-kernel launches: shared memory over 48 KiB, clusters (see raw_launch.h).
#include "client/raw_launch.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kcache {
namespace {

namespace ci = client_internal;

// cuda.h's enum values.
constexpr int kAttrSharedSizeBytes = 1;             // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
constexpr int kAttrMaxDynamicSharedSize = 8;        // ..._MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kAttrClusterSizeMustBeSet = 10;       // ..._CLUSTER_SIZE_MUST_BE_SET
constexpr int kAttrRequiredClusterWidth = 11;       // HEIGHT 12, DEPTH 13
constexpr int kAttrNonPortableClusterSize = 14;     // ..._NON_PORTABLE_CLUSTER_SIZE_ALLOWED
constexpr int kDevAttrMaxSharedPerBlockOptin = 97;  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_..._OPTIN
constexpr int kLaunchAttrClusterDimension = 4;
constexpr int kLaunchAttrClusterSchedulingPolicy = 5;
constexpr int kClusterSchedulingSpread = 1;
constexpr unsigned kDefaultDynamicSharedLimit = 48 * 1024;
constexpr unsigned kPortableClusterSize = 8;

std::string Str(const Dim3& d) { return absl::StrCat("(", d.x, ", ", d.y, ", ", d.z, ")"); }

// The limits of `fn` in the current context. An attribute the driver does
// not know reads as 0 (no cluster).
absl::StatusOr<RawFunctionLimits> ReadLimits(const ci::CudaApi& api, ci::CUfunction fn) {
  auto attr = [&](int a) {
    int v = 0;
    return api.cuFuncGetAttribute(&v, a, fn) == 0 ? v : 0;
  };
  ci::CUdevice dev = 0;
  if (auto s = ci::CudaStatus(api, api.cuCtxGetDevice(&dev), "cuCtxGetDevice"); !s.ok()) return s;
  int optin = 0;
  if (auto s =
          ci::CudaStatus(api, api.cuDeviceGetAttribute(&optin, kDevAttrMaxSharedPerBlockOptin, dev),
                         "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
      !s.ok()) {
    return s;
  }
  RawFunctionLimits l;
  l.static_shared = attr(kAttrSharedSizeBytes);
  l.max_shared_optin = std::max<int>(optin, kDefaultDynamicSharedLimit);
  const int w = attr(kAttrRequiredClusterWidth), h = attr(kAttrRequiredClusterWidth + 1),
            d = attr(kAttrRequiredClusterWidth + 2);
  if (w > 0 && h > 0 && d > 0) {
    l.required_cluster =
        Dim3{static_cast<unsigned>(w), static_cast<unsigned>(h), static_cast<unsigned>(d)};
  }
  l.cluster_must_be_set = attr(kAttrClusterSizeMustBeSet) != 0;
  return l;
}

}  // namespace

absl::StatusOr<std::optional<Dim3>> PlanRawLaunch(absl::string_view name,
                                                  const RawLaunchConfig& config,
                                                  const RawFunctionLimits& limits) {
  for (const auto& [what, d] : {std::pair{"grid", config.grid}, std::pair{"block", config.block}}) {
    if (d.x == 0 || d.y == 0 || d.z == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", what, " ", Str(d), " has a zero dimension"));
    }
  }
  const int64_t total = int64_t{config.shared_bytes} + limits.static_shared;
  if (total > limits.max_shared_optin) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": shared_bytes=", config.shared_bytes, " bytes of dynamic shared memory",
        limits.static_shared > 0 ? absl::StrCat(" plus ", limits.static_shared, " static") : "",
        " is over this device's maximum of ", limits.max_shared_optin,
        " bytes per block (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN); at most ",
        std::max(0, limits.max_shared_optin - limits.static_shared), " dynamic"));
  }
  std::optional<Dim3> cluster = config.cluster;
  if (cluster) {
    if (cluster->x == 0 || cluster->y == 0 || cluster->z == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": cluster ", Str(*cluster), " has a zero dimension"));
    }
    if (limits.required_cluster && !(*cluster == *limits.required_cluster)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": cluster ", Str(*cluster),
                                                     ", but the kernel was compiled for "
                                                     "clusters of ",
                                                     Str(*limits.required_cluster),
                                                     " (.reqnctapercluster)"));
    }
  } else if (limits.required_cluster) {
    cluster = limits.required_cluster;
  } else if (limits.cluster_must_be_set) {
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     ": the kernel requires a thread-block cluster (.explicitcluster) and "
                     "does not say its shape: set RawLaunchConfig::cluster"));
  }
  if (cluster) {
    const unsigned g[3] = {config.grid.x, config.grid.y, config.grid.z};
    const unsigned c[3] = {cluster->x, cluster->y, cluster->z};
    for (int i = 0; i < 3; ++i) {
      if (g[i] % c[i] != 0) {
        const char axis = static_cast<char>('x' + i);
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": grid ", std::string(1, axis), "=", g[i],
                         " is not a multiple of the cluster's ", std::string(1, axis), "=", c[i],
                         " (the grid counts blocks, a whole number of clusters)"));
      }
    }
    if (*cluster == Dim3{} && !limits.required_cluster && !limits.cluster_must_be_set) {
      cluster.reset();  // (1,1,1) asked of a kernel that needs none: an ordinary launch
    }
  }
  return cluster;
}

absl::Status LaunchRaw(const LoadedKernel& kernel, absl::string_view name,
                       const RawLaunchConfig& config, void** args) {
  auto api = ci::GetCudaApi();
  if (!api.ok()) return api.status();
  return ci::LaunchRawWith(**api, kernel, name, config, args);
}

namespace client_internal {

absl::Status LaunchRawWith(const CudaApi& api, const LoadedKernel& kernel, absl::string_view name,
                           const RawLaunchConfig& config, void** args) {
  auto fn = static_cast<CUfunction>(kernel.Function(name));
  if (fn == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("LaunchRaw: \"", name, "\" is not an entry point of ", "this kernel"));
  }
  if (kernel.raw_launch_state == nullptr) {
    return absl::FailedPreconditionError("LaunchRaw: the kernel was not loaded by Client::LoadRaw");
  }
  RawLaunchState& state = *kernel.raw_launch_state;
  if (auto s = CudaStatus(api, api.cuCtxPushCurrent(static_cast<CUcontext>(kernel.context)),
                          "cuCtxPushCurrent");
      !s.ok()) {
    return s;
  }
  absl::Status st = [&]() -> absl::Status {
    const std::string key(name);
    RawFunctionLimits limits;
    {
      absl::MutexLock lock(&state.mu);
      auto it = state.limits.find(key);
      if (it == state.limits.end()) {
        auto read = ReadLimits(api, fn);  // a few attribute reads: short
        if (!read.ok()) return read.status();
        it = state.limits.emplace(key, *read).first;
      }
      limits = it->second;
    }
    auto cluster = PlanRawLaunch(name, config, limits);
    if (!cluster.ok()) return cluster.status();
    if (config.shared_bytes > kDefaultDynamicSharedLimit) {
      absl::MutexLock lock(&state.mu);
      if (!state.raised.contains(key)) {
        const int most = limits.max_shared_optin - limits.static_shared;
        if (auto s = CudaStatus(api, api.cuFuncSetAttribute(fn, kAttrMaxDynamicSharedSize, most),
                                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
            !s.ok()) {
          return s;
        }
        state.raised.insert(key);
      }
    }
    auto stream = static_cast<CUstream>(config.stream);
    if (!cluster->has_value()) {
      return CudaStatus(api,
                        api.cuLaunchKernel(fn, config.grid.x, config.grid.y, config.grid.z,
                                           config.block.x, config.block.y, config.block.z,
                                           config.shared_bytes, stream, args, nullptr),
                        "cuLaunchKernel");
    }
    const Dim3 c = **cluster;
    if (api.cuLaunchKernelEx == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          name,
          " needs a thread-block cluster launch (cuLaunchKernelEx, CUDA 12+); this driver "
          "lacks it"));
    }
    if (c.x * c.y * c.z > kPortableClusterSize) {
      if (auto s = CudaStatus(api, api.cuFuncSetAttribute(fn, kAttrNonPortableClusterSize, 1),
                              "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
          !s.ok()) {
        return s;
      }
    }
    CuLaunchAttribute attrs[2] = {};
    attrs[0].id = kLaunchAttrClusterDimension;
    attrs[0].value.cluster_dim = {c.x, c.y, c.z};
    // Triton's launcher spreads a cluster's blocks over SMs; so do we.
    attrs[1].id = kLaunchAttrClusterSchedulingPolicy;
    attrs[1].value.value = kClusterSchedulingSpread;
    CuLaunchConfig lc{
        config.grid.x,  config.grid.y,       config.grid.z, config.block.x, config.block.y,
        config.block.z, config.shared_bytes, stream,        attrs,          2};
    return CudaStatus(api, api.cuLaunchKernelEx(&lc, fn, args, nullptr),
                      "cuLaunchKernelEx (cluster launch)");
  }();
  CUcontext popped = nullptr;
  api.cuCtxPopCurrent(&popped);
  return st;
}

}  // namespace client_internal
}  // namespace kcache
