// The CUDA driver behind Devices. cuda.h is used only for types and
// prototypes; every entry point is resolved with dlsym, under the versioned
// name that cuda.h's macros map to (cuCtxPushCurrent -> cuCtxPushCurrent_v2).
#include "compiler/cuda_driver.h"

#include <cuda.h>
#include <dlfcn.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/cuda_library.h"

namespace kcache {

struct CudaDriverApi {
  decltype(&::cuGetErrorName) GetErrorName;
  decltype(&::cuGetErrorString) GetErrorString;
  decltype(&::cuInit) Init;
  decltype(&::cuDriverGetVersion) DriverGetVersion;
  decltype(&::cuDeviceGetCount) DeviceGetCount;
  decltype(&::cuDeviceGet) DeviceGet;
  decltype(&::cuDeviceGetName) DeviceGetName;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute;
  decltype(&::cuDeviceTotalMem) DeviceTotalMem;
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain;
  decltype(&::cuDevicePrimaryCtxRelease) DevicePrimaryCtxRelease;
  decltype(&::cuCtxPushCurrent) CtxPushCurrent;
  decltype(&::cuCtxPopCurrent) CtxPopCurrent;
  decltype(&::cuModuleLoadData) ModuleLoadData;
  decltype(&::cuModuleUnload) ModuleUnload;
  decltype(&::cuModuleGetFunction) ModuleGetFunction;
  decltype(&::cuFuncGetAttribute) FuncGetAttribute;
  decltype(&::cuFuncSetAttribute) FuncSetAttribute;
};

struct CudaDevices::Device {
  DeviceInfo info;
  CUdevice device = 0;
  CUcontext primary = nullptr;
};

namespace {

// The one adapter from CUresult to absl::Status. `what` names the call.
absl::Status CuStatus(const CudaDriverApi* api, CUresult r, absl::string_view what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  const char* desc = nullptr;
  if (api && api->GetErrorName) api->GetErrorName(r, &name);
  if (api && api->GetErrorString) api->GetErrorString(r, &desc);
  const std::string msg = absl::StrCat(what, ": ", name ? name : "CUDA error", " (",
                                       static_cast<int>(r), ")", desc ? ": " : "",
                                       desc ? desc : "");
  switch (r) {
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_NOT_FOUND:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_INVALID_SOURCE:
    case CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND:
      return absl::FailedPreconditionError(msg);
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_DEVICE:
      return absl::InvalidArgumentError(msg);
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(msg);
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_STUB_LIBRARY:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Pushes a context on this thread for the scope; pops it on exit.
class ScopedContext {
 public:
  ScopedContext(const CudaDriverApi& api, CUcontext ctx) : api_(api) {
    status_ = CuStatus(&api_, api_.CtxPushCurrent(ctx), "cuCtxPushCurrent");
  }
  ~ScopedContext() {
    if (status_.ok()) {
      CUcontext popped;
      api_.CtxPopCurrent(&popped);
    }
  }
  const absl::Status& status() const { return status_; }

 private:
  const CudaDriverApi& api_;
  absl::Status status_;
};

}  // namespace

std::string ArchForComputeCapability(int major, int minor) {
  return absl::StrCat("sm_", major, minor);
}

bool CanVerifyArch(const DeviceInfo& device, absl::string_view cubin_arch) {
  if (cubin_arch == device.arch) return true;
  // The arch-specific ('a') and family ('f') variants of the device's own
  // architecture load on it too.
  return cubin_arch.size() == device.arch.size() + 1 &&
         absl::StartsWith(cubin_arch, device.arch) &&
         (cubin_arch.back() == 'a' || cubin_arch.back() == 'f');
}

CudaDevices::CudaDevices() = default;

CudaDevices::~CudaDevices() {
  if (!api_) return;
  for (Device& d : devices_) {
    if (d.primary) api_->DevicePrimaryCtxRelease(d.device);
  }
}

std::unique_ptr<CudaDevices> CudaDevices::Open(const std::string& library_path) {
  std::unique_ptr<CudaDevices> self(new CudaDevices());
  const auto compile_only = [&](std::string why) {
    self->availability_ = absl::UnavailableError(absl::StrCat("compile-only mode: ", why));
    self->devices_.clear();
    self->api_.reset();
    return std::move(self);
  };

  void* handle = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    return compile_only(absl::StrCat(library_path, " not loadable (", err ? err : "?", ")"));
  }
  auto api = std::make_unique<CudaDriverApi>();
  CudaSymbols symbols(handle);
  symbols.Resolve(api->GetErrorName, "cuGetErrorName");
  symbols.Resolve(api->GetErrorString, "cuGetErrorString");
  symbols.Resolve(api->Init, "cuInit");
  symbols.Resolve(api->DriverGetVersion, "cuDriverGetVersion");
  symbols.Resolve(api->DeviceGetCount, "cuDeviceGetCount");
  symbols.Resolve(api->DeviceGet, "cuDeviceGet");
  symbols.Resolve(api->DeviceGetName, "cuDeviceGetName");
  symbols.Resolve(api->DeviceGetAttribute, "cuDeviceGetAttribute");
  symbols.Resolve(api->DeviceTotalMem, "cuDeviceTotalMem_v2");
  symbols.Resolve(api->DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  symbols.Resolve(api->DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  symbols.Resolve(api->CtxPushCurrent, "cuCtxPushCurrent_v2");
  symbols.Resolve(api->CtxPopCurrent, "cuCtxPopCurrent_v2");
  symbols.Resolve(api->ModuleLoadData, "cuModuleLoadData");
  symbols.Resolve(api->ModuleUnload, "cuModuleUnload");
  symbols.Resolve(api->ModuleGetFunction, "cuModuleGetFunction");
  symbols.Resolve(api->FuncGetAttribute, "cuFuncGetAttribute");
  symbols.Resolve(api->FuncSetAttribute, "cuFuncSetAttribute");
  if (!symbols.missing().empty()) {
    // Not dlclose'd: a driver library is never unloaded.
    return compile_only(
        absl::StrCat(library_path, " lacks symbols: ", absl::StrJoin(symbols.missing(), ", ")));
  }
  if (absl::Status s = CuStatus(api.get(), api->Init(0), "cuInit"); !s.ok()) {
    return compile_only(s.ToString());
  }
  api->DriverGetVersion(&self->driver_version_);
  int count = 0;
  if (absl::Status s = CuStatus(api.get(), api->DeviceGetCount(&count), "cuDeviceGetCount");
      !s.ok()) {
    return compile_only(s.ToString());
  }
  if (count == 0) return compile_only("no CUDA device found");

  for (int i = 0; i < count; ++i) {
    Device d;
    d.info.ordinal = i;
    absl::Status s = CuStatus(api.get(), api->DeviceGet(&d.device, i), "cuDeviceGet");
    char name[256] = {};
    if (s.ok()) s = CuStatus(api.get(), api->DeviceGetName(name, sizeof(name), d.device),
                             "cuDeviceGetName");
    const auto attr = [&](CUdevice_attribute a, int* out) {
      if (s.ok()) s = CuStatus(api.get(), api->DeviceGetAttribute(out, a, d.device),
                               "cuDeviceGetAttribute");
    };
    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &d.info.cc_major);
    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &d.info.cc_minor);
    attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &d.info.sm_count);
    attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &d.info.max_smem_per_block_optin);
    size_t mem = 0;
    if (s.ok()) s = CuStatus(api.get(), api->DeviceTotalMem(&mem, d.device), "cuDeviceTotalMem");
    if (s.ok()) s = CuStatus(api.get(), api->DevicePrimaryCtxRetain(&d.primary, d.device),
                             "cuDevicePrimaryCtxRetain");
    if (!s.ok()) {
      // Release what was retained so far; one broken device means the
      // daemon should not pretend to verify.
      for (Device& done : self->devices_) api->DevicePrimaryCtxRelease(done.device);
      self->devices_.clear();
      return compile_only(absl::StrCat("device ", i, ": ", s.ToString()));
    }
    d.info.name = name;
    d.info.total_memory_bytes = mem;
    d.info.arch = ArchForComputeCapability(d.info.cc_major, d.info.cc_minor);
    self->devices_.push_back(std::move(d));
  }
  self->api_ = std::move(api);
  self->availability_ = absl::OkStatus();
  return self;
}

absl::Status CudaDevices::Availability() const { return availability_; }

std::vector<DeviceInfo> CudaDevices::List() const {
  std::vector<DeviceInfo> out;
  for (const Device& d : devices_) out.push_back(d.info);
  return out;
}

absl::StatusOr<VerifyResult> CudaDevices::Verify(int ordinal, absl::string_view arch,
                                                 absl::string_view cubin,
                                                 const std::vector<EntryRequirement>& entries) {
  if (!api_) return availability_;
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("ordinal: no device ", ordinal));
  }
  const Device& dev = devices_[ordinal];
  if (!CanVerifyArch(dev.info, arch)) {
    return absl::InvalidArgumentError(absl::StrCat("arch: device ", ordinal, " (", dev.info.arch,
                                                   ") cannot verify ", arch, " cubins"));
  }
  if (cubin.empty()) return absl::InvalidArgumentError("cubin: empty");
  if (entries.empty()) return absl::InvalidArgumentError("entries: none to verify");

  ScopedContext ctx(*api_, dev.primary);
  if (!ctx.status().ok()) return ctx.status();
  // cuModuleLoadData reads the image up to its ELF size; the string_view's
  // bytes need no terminator for a cubin.
  CUmodule module = nullptr;
  if (absl::Status s = CuStatus(api_.get(), api_->ModuleLoadData(&module, cubin.data()),
                                "cuModuleLoadData");
      !s.ok()) {
    return s;
  }
  struct Unload {
    const CudaDriverApi& api;
    CUmodule m;
    ~Unload() { api.ModuleUnload(m); }
  } unload{*api_, module};

  VerifyResult result;
  result.device_ordinal = ordinal;
  result.device_name = dev.info.name;
  for (const EntryRequirement& req : entries) {
    CUfunction fn = nullptr;
    absl::Status s = CuStatus(api_.get(), api_->ModuleGetFunction(&fn, module, req.name.c_str()),
                              absl::StrCat("cuModuleGetFunction(\"", req.name, "\")"));
    if (!s.ok()) return s;
    if (req.dynamic_smem_bytes > 0) {
      s = CuStatus(api_.get(),
                   api_->FuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          req.dynamic_smem_bytes),
                   absl::StrCat("cuFuncSetAttribute(", req.name, ", MAX_DYNAMIC_SHARED_SIZE_BYTES=",
                                req.dynamic_smem_bytes, ")"));
      if (!s.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "entry ", req.name, " needs ", req.dynamic_smem_bytes,
            " bytes of dynamic shared memory; device ", ordinal, " allows at most ",
            dev.info.max_smem_per_block_optin, " per block in total: ", s.message()));
      }
    }
    EntryResources r;
    r.name = req.name;
    const auto get = [&](CUfunction_attribute a, int* out, const char* what) {
      if (s.ok()) s = CuStatus(api_.get(), api_->FuncGetAttribute(out, a, fn),
                               absl::StrCat("cuFuncGetAttribute(", req.name, ", ", what, ")"));
    };
    get(CU_FUNC_ATTRIBUTE_NUM_REGS, &r.registers, "NUM_REGS");
    get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &r.static_smem_bytes, "SHARED_SIZE_BYTES");
    get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &r.max_dynamic_smem_bytes,
        "MAX_DYNAMIC_SHARED_SIZE_BYTES");
    get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &r.local_bytes, "LOCAL_SIZE_BYTES");
    get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &r.max_threads_per_block,
        "MAX_THREADS_PER_BLOCK");
    if (!s.ok()) return s;
    if (req.threads_per_block > r.max_threads_per_block) {
      return absl::FailedPreconditionError(
          absl::StrCat("entry ", req.name, " launches ", req.threads_per_block,
                       " threads per block but allows at most ", r.max_threads_per_block,
                       " (registers: ", r.registers, ")"));
    }
    result.entries.push_back(std::move(r));
  }
  return result;
}

}  // namespace kcache
