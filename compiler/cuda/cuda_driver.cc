// The CUDA driver behind Devices. cuda.h is used only for types and
// prototypes; every entry point is resolved with dlsym, under the versioned
// name that cuda.h's macros map to (cuCtxPushCurrent -> cuCtxPushCurrent_v2).
#include "compiler/cuda/cuda_driver.h"

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/cuda/cubin_images.h"
#include "compiler/cuda/cuda_library.h"
#include "kernels/attention_params.h"

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
  // The numeric check's runs (RunAttentionCheck).
  decltype(&::cuMemAlloc) MemAlloc;
  decltype(&::cuMemFree) MemFree;
  decltype(&::cuMemcpyHtoD) MemcpyHtoD;
  decltype(&::cuMemcpyDtoH) MemcpyDtoH;
  decltype(&::cuMemsetD8) MemsetD8;
  decltype(&::cuLaunchKernel) LaunchKernel;
  decltype(&::cuCtxSynchronize) CtxSynchronize;
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
  const std::string msg =
      absl::StrCat(what, ": ", name ? name : "CUDA error", " (", static_cast<int>(r), ")",
                   desc ? ": " : "", desc ? desc : "");
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

// The modules of one cubin blob, one per image (compiler/cuda/cubin_images.h),
// loaded into the current context; every one loaded is unloaded when the
// holder goes, on every path (declare it after the ScopedContext).
class CubinModules {
 public:
  explicit CubinModules(const CudaDriverApi& api) : api_(api) {}
  ~CubinModules() {
    for (CUmodule m : modules_) api_.ModuleUnload(m);
  }
  CubinModules(const CubinModules&) = delete;
  CubinModules& operator=(const CubinModules&) = delete;

  // Loads every image of `blob`, in order; the first failure answers (what
  // was loaded before it is unloaded with the holder).
  absl::Status Load(absl::string_view blob) {
    return LoadCubinImages(std::string_view(blob.data(), blob.size()), [&](const char* image) {
      CUmodule m = nullptr;
      absl::Status s = CuStatus(&api_, api_.ModuleLoadData(&m, image),
                                absl::StrCat("cuModuleLoadData (image ", modules_.size(), ")"));
      if (s.ok()) modules_.push_back(m);
      return s;
    });
  }

  // `name` from the first image that defines it; the driver's own error for
  // any answer but NOT_FOUND, which stops the search.
  absl::StatusOr<CUfunction> Function(const std::string& name) const {
    CUfunction fn = nullptr;
    const CUresult rc = FindCubinFunction(
        modules_, [&](CUmodule m) { return api_.ModuleGetFunction(&fn, m, name.c_str()); });
    if (absl::Status s =
            CuStatus(&api_, rc,
                     absl::StrCat("cuModuleGetFunction(\"", name, "\") in the cubin's ",
                                  modules_.size(), " image(s)"));
        !s.ok()) {
      return s;
    }
    return fn;
  }

 private:
  const CudaDriverApi& api_;
  std::vector<CUmodule> modules_;
};

}  // namespace

std::string ArchForComputeCapability(int major, int minor) {
  return absl::StrCat("sm_", major, minor);
}

bool CanVerifyArch(const DeviceInfo& device, absl::string_view cubin_arch) {
  if (cubin_arch == device.arch) return true;
  // The arch-specific ('a') and family ('f') variants of the device's own
  // architecture load on it too.
  return cubin_arch.size() == device.arch.size() + 1 && absl::StartsWith(cubin_arch, device.arch) &&
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
  const auto compile_only = [&](const std::string& why) {
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
  symbols.Resolve(api->MemAlloc, "cuMemAlloc_v2");
  symbols.Resolve(api->MemFree, "cuMemFree_v2");
  symbols.Resolve(api->MemcpyHtoD, "cuMemcpyHtoD_v2");
  symbols.Resolve(api->MemcpyDtoH, "cuMemcpyDtoH_v2");
  symbols.Resolve(api->MemsetD8, "cuMemsetD8_v2");
  symbols.Resolve(api->LaunchKernel, "cuLaunchKernel");
  symbols.Resolve(api->CtxSynchronize, "cuCtxSynchronize");
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
    if (s.ok())
      s = CuStatus(api.get(), api->DeviceGetName(name, sizeof(name), d.device), "cuDeviceGetName");
    const auto attr = [&](CUdevice_attribute a, int* out) {
      if (s.ok())
        s = CuStatus(api.get(), api->DeviceGetAttribute(out, a, d.device), "cuDeviceGetAttribute");
    };
    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &d.info.cc_major);
    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &d.info.cc_minor);
    attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &d.info.sm_count);
    attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &d.info.max_smem_per_block_optin);
    size_t mem = 0;
    if (s.ok()) s = CuStatus(api.get(), api->DeviceTotalMem(&mem, d.device), "cuDeviceTotalMem");
    if (s.ok()) {
      s = CuStatus(api.get(), api->DevicePrimaryCtxRetain(&d.primary, d.device),
                   "cuDevicePrimaryCtxRetain");
    }
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
  CubinModules modules(*api_);
  if (absl::Status s = modules.Load(cubin); !s.ok()) return s;

  VerifyResult result;
  result.device_ordinal = ordinal;
  result.device_name = dev.info.name;
  for (const EntryRequirement& req : entries) {
    absl::StatusOr<CUfunction> found = modules.Function(req.name);
    if (!found.ok()) return found.status();
    CUfunction fn = *found;
    absl::Status s;
    if (req.dynamic_smem_bytes > 0) {
      s = CuStatus(api_.get(),
                   api_->FuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          req.dynamic_smem_bytes),
                   absl::StrCat("cuFuncSetAttribute(", req.name,
                                ", MAX_DYNAMIC_SHARED_SIZE_BYTES=", req.dynamic_smem_bytes, ")"));
      if (!s.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("entry ", req.name, " needs ", req.dynamic_smem_bytes,
                         " bytes of dynamic shared memory; device ", ordinal, " allows at most ",
                         dev.info.max_smem_per_block_optin, " per block in total: ", s.message()));
      }
    }
    EntryResources r;
    r.name = req.name;
    const auto get = [&](CUfunction_attribute a, int* out, const char* what) {
      if (s.ok()) {
        s = CuStatus(api_.get(), api_->FuncGetAttribute(out, a, fn),
                     absl::StrCat("cuFuncGetAttribute(", req.name, ", ", what, ")"));
      }
    };
    get(CU_FUNC_ATTRIBUTE_NUM_REGS, &r.registers, "NUM_REGS");
    get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &r.static_smem_bytes, "SHARED_SIZE_BYTES");
    get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &r.max_dynamic_smem_bytes,
        "MAX_DYNAMIC_SHARED_SIZE_BYTES");
    get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &r.local_bytes, "LOCAL_SIZE_BYTES");
    get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &r.max_threads_per_block, "MAX_THREADS_PER_BLOCK");
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

namespace {

// float -> bf16 / fp16 bits, round to nearest even (finite inputs in [-4, 4]).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
uint16_t ToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (a < 6.103515625e-05f) {  // subnormal half: in units of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  std::memcpy(&u, &a, 4);
  int e = static_cast<int>(u >> 23) - 127 + 15;
  uint32_t m = u & 0x7fffffu;
  uint32_t r = m >> 13;
  const uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  if (r == 0x400u) {
    r = 0;
    ++e;
  }
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(e) << 10) | r);
}
float FromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float FromHalf(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) ? 1u : 0u;
  const int e = (h >> 10) & 0x1f;
  const uint32_t m = h & 0x3ffu;
  float v;
  if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -24);
  } else if (e == 31) {
    v = m ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(m | 0x400u), e - 25);
  }
  return sign ? -v : v;
}

}  // namespace

absl::StatusOr<AttentionCheckDiff> CudaDevices::RunAttentionCheck(
    int ordinal, const AttentionCheckKernel& k, absl::string_view cubin,
    absl::string_view reference_cubin) {
  if (!api_) return availability_;
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("ordinal: no device ", ordinal));
  }
  if (k.num_kv_heads <= 0 || k.num_q_heads % k.num_kv_heads != 0 || k.head_dim_qk <= 0 ||
      k.head_dim_v <= 0 || k.forward.block_m <= 0 || k.forward.name.empty()) {
    return absl::InvalidArgumentError("kernel: incomplete description");
  }
  if (k.buffers.size() > static_cast<size_t>(kMaxExprBuffers)) {
    return absl::InvalidArgumentError("kernel: too many buffers");
  }
  const Device& dev = devices_[ordinal];
  const CudaDriverApi& api = *api_;
  ScopedContext ctx(api, dev.primary);
  if (!ctx.status().ok()) return ctx.status();

  // Everything allocated or loaded is released on every path.
  struct Holder {
    const CudaDriverApi& api;
    std::vector<CUdeviceptr> mem;
    ~Holder() {
      for (CUdeviceptr p : mem) api.MemFree(p);
    }
  } hold{api, {}};
  const auto upload = [&](const void* data, size_t bytes) -> absl::StatusOr<CUdeviceptr> {
    CUdeviceptr p = 0;
    absl::Status s = CuStatus(&api, api.MemAlloc(&p, bytes < 16 ? 16 : bytes), "cuMemAlloc");
    if (!s.ok()) return s;
    hold.mem.push_back(p);
    if (data != nullptr) {
      s = CuStatus(&api, api.MemcpyHtoD(p, data, bytes), "cuMemcpyHtoD");
    } else {
      s = CuStatus(&api, api.MemsetD8(p, 0, bytes < 16 ? 16 : bytes), "cuMemsetD8");
    }
    if (!s.ok()) return s;
    return p;
  };
  // Each blob loaded once, every image; its functions looked up in those.
  CubinModules kernel_modules(api), reference_modules(api);
  if (absl::Status s = kernel_modules.Load(cubin); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("kernel cubin: ", s.message()));
  }
  if (absl::Status s = reference_modules.Load(reference_cubin); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("reference cubin: ", s.message()));
  }
  const auto function = [&](const CubinModules& modules, const std::string& name,
                            int smem) -> absl::StatusOr<CUfunction> {
    absl::StatusOr<CUfunction> fn = modules.Function(name);
    if (fn.ok() && smem > 48 * 1024) {
      absl::Status s = CuStatus(
          &api, api.FuncSetAttribute(*fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
          absl::StrCat("cuFuncSetAttribute(", name, ", MAX_DYNAMIC_SHARED_SIZE_BYTES=", smem, ")"));
      if (!s.ok()) return s;
    }
    return fn;
  };

  // Shapes: batch 2, odd lengths over several tiles; the drafter's q_len is
  // N blocks, its keys the context then the blocks.
  const int B = 2, Hq = k.num_q_heads, Hkv = k.num_kv_heads;
  const int dqk = k.head_dim_qk, dv = k.head_dim_v;
  int Lq = 173, Lkv = 211, S = 0, N = 0;
  if (k.mask == KC_MASK_DRAFTER) {
    const int blk = k.drafter_block > 0 ? k.drafter_block : 16;
    N = (160 + blk - 1) / blk;
    S = 150;
    Lq = N * blk;
    Lkv = S + Lq;
  }
  std::mt19937 rng(0x6b63u);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const auto elems = [&](size_t n, float scale) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = k.bf16 ? ToBf16(uni(rng) * scale) : ToHalf(uni(rng) * scale);
    return v;
  };
  const auto hq = elems(static_cast<size_t>(B) * Hq * Lq * dqk, 2.f);
  const auto hk = elems(static_cast<size_t>(B) * Hkv * Lkv * dqk, 2.f);
  const auto hv = elems(static_cast<size_t>(B) * Hkv * Lkv * dv, 1.f);

  kcache::AttentionParams p{};
  const auto set = [](auto& field, absl::StatusOr<CUdeviceptr> ptr) -> absl::Status {
    if (!ptr.ok()) return ptr.status();
    field = reinterpret_cast<std::remove_reference_t<decltype(field)>>(*ptr);
    return absl::OkStatus();
  };
  absl::Status s;
  const auto chain = [&](absl::Status st) {
    if (s.ok()) s = std::move(st);
  };
  chain(set(p.q, upload(hq.data(), hq.size() * 2)));
  chain(set(p.k, upload(hk.data(), hk.size() * 2)));
  chain(set(p.v, upload(hv.data(), hv.size() * 2)));
  const size_t n_o = static_cast<size_t>(B) * Hq * Lq * dv;
  chain(set(p.o, upload(nullptr, n_o * 2)));
  chain(set(p.lse, upload(nullptr, static_cast<size_t>(B) * Hq * Lq * 4)));
  p.q_stride_s = dqk, p.q_stride_h = static_cast<kc_i64>(Lq) * dqk,
  p.q_stride_b = p.q_stride_h * Hq;
  p.k_stride_s = dqk, p.k_stride_h = static_cast<kc_i64>(Lkv) * dqk,
  p.k_stride_b = p.k_stride_h * Hkv;
  p.v_stride_s = dv, p.v_stride_h = static_cast<kc_i64>(Lkv) * dv,
  p.v_stride_b = p.v_stride_h * Hkv;
  p.o_stride_s = dv, p.o_stride_h = static_cast<kc_i64>(Lq) * dv, p.o_stride_b = p.o_stride_h * Hq;
  p.lse_stride_h = Lq, p.lse_stride_b = static_cast<kc_i64>(Lq) * Hq;
  p.batch = B, p.num_q_heads = Hq, p.num_kv_heads = Hkv, p.q_len = Lq, p.kv_len = Lkv;
  // Mask inputs: document ids in runs, drafter anchors (some blocks dropped),
  // ALiBi slopes, expression buffers.
  std::vector<int32_t> qid(static_cast<size_t>(B) * Lq), kvid(static_cast<size_t>(B) * Lkv);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < Lq; ++i) qid[b * Lq + i] = (i + 17 * b) / 37;
    for (int i = 0; i < Lkv; ++i) kvid[b * Lkv + i] = (i + 17 * b) / 37;
  }
  chain(set(p.q_seq_id, upload(qid.data(), qid.size() * 4)));
  chain(set(p.kv_seq_id, upload(kvid.data(), kvid.size() * 4)));
  p.q_seq_id_stride_b = Lq, p.kv_seq_id_stride_b = Lkv;
  if (N > 0) {
    std::vector<int32_t> anc(static_cast<size_t>(B) * N);
    std::vector<int8_t> keep(static_cast<size_t>(B) * N);
    for (size_t i = 0; i < anc.size(); ++i) {
      anc[i] = static_cast<int32_t>(rng() % static_cast<unsigned>(S + 1));
      keep[i] = (rng() % 8u) != 0 ? 1 : 0;
    }
    chain(set(p.drafter_anchor, upload(anc.data(), anc.size() * 4)));
    chain(set(p.drafter_keep, upload(keep.data(), keep.size())));
    p.drafter_stride_b = N, p.drafter_context_len = S, p.drafter_num_blocks = N;
  }
  std::vector<float> slopes(static_cast<size_t>(Hq));
  for (int h = 0; h < Hq; ++h)
    slopes[h] = 0.05f * static_cast<float>(h + 1) / static_cast<float>(Hq);
  chain(set(p.alibi_slopes, upload(slopes.data(), slopes.size() * 4)));
  for (size_t i = 0; i < k.buffers.size(); ++i) {
    const int rank = k.buffers[i].rank < 1 ? 1 : (k.buffers[i].rank > 4 ? 4 : k.buffers[i].rank);
    const int ext = rank == 1 ? 512 : rank == 2 ? 64 : rank == 3 ? 16 : 8;
    size_t n = 1;
    for (int d = 0; d < rank; ++d) n *= ext;
    KcBuffer& kb = p.buffers[i];
    kb.rank = rank;
    for (int d = rank - 1; d >= 0; --d) {
      kb.extent[d] = ext;
      kb.stride[d] = d == rank - 1 ? 1 : kb.stride[d + 1] * ext;
    }
    absl::StatusOr<CUdeviceptr> ptr;
    if (k.buffers[i].type == 2) {
      std::vector<float> v(n);
      for (auto& x : v) x = uni(rng) * 0.5f;
      ptr = upload(v.data(), n * 4);
    } else if (k.buffers[i].type == 3) {
      std::vector<int8_t> v(n);
      for (auto& x : v) x = static_cast<int8_t>(rng() & 1u);
      ptr = upload(v.data(), n);
    } else {
      std::vector<int32_t> v(n);
      for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<unsigned>(Lkv + 1));
      ptr = upload(v.data(), n * 4);
    }
    if (!ptr.ok()) {
      chain(ptr.status());
    } else {
      kb.ptr = reinterpret_cast<const void*>(*ptr);
    }
  }
  if (!s.ok()) return s;

  const auto launch = [&](CUfunction fn, int gx, int threads, int smem,
                          kcache::AttentionParams* params, const char* what) {
    void* args[] = {params};
    absl::Status st =
        CuStatus(&api,
                 api.LaunchKernel(fn, static_cast<unsigned>(gx), static_cast<unsigned>(Hq), B,
                                  static_cast<unsigned>(threads), 1, 1, static_cast<unsigned>(smem),
                                  nullptr, args, nullptr),
                 absl::StrCat("cuLaunchKernel(", what, ")"));
    if (st.ok()) st = CuStatus(&api, api.CtxSynchronize(), absl::StrCat("run of ", what));
    return st;
  };
  // The kernel: tile classes first for an expression mask.
  if (!k.mask_build.name.empty()) {
    const int bm = k.mask_build.block_m, bn = k.mask_build.block_n;
    if (bm <= 0 || bn <= 0) return absl::InvalidArgumentError("kernel: mask build without tiles");
    const int mt = (Lq + bm - 1) / bm, nt = (Lkv + bn - 1) / bn;
    chain(set(p.tile_class, upload(nullptr, static_cast<size_t>(B) * Hq * mt * nt)));
    p.tile_class_stride_m = nt, p.tile_class_stride_h = static_cast<kc_i64>(mt) * nt,
    p.tile_class_stride_b = p.tile_class_stride_h * Hq;
    auto mb = function(kernel_modules, k.mask_build.name, 0);
    if (!mb.ok()) return mb.status();
    chain(launch(*mb, mt, k.mask_build.threads, 0, &p, k.mask_build.name.c_str()));
  }
  auto fwd = function(kernel_modules, k.forward.name, k.forward.dynamic_smem_bytes);
  if (!fwd.ok()) return fwd.status();
  chain(launch(*fwd, (Lq + k.forward.block_m - 1) / k.forward.block_m, k.forward.threads,
               k.forward.dynamic_smem_bytes, &p, k.forward.name.c_str()));
  if (!s.ok()) return s;
  std::vector<uint16_t> o(n_o);
  s = CuStatus(&api, api.MemcpyDtoH(o.data(), reinterpret_cast<CUdeviceptr>(p.o), n_o * 2),
               "cuMemcpyDtoH");
  if (!s.ok()) return s;

  // The reference: fp32 O into its own buffer.
  kcache::AttentionParams rp = p;
  chain(set(rp.o, upload(nullptr, n_o * 4)));
  chain(set(rp.lse, upload(nullptr, static_cast<size_t>(B) * Hq * Lq * 4)));
  auto ref = function(reference_modules, "kcache_attn_ref_fwd", 0);
  if (!ref.ok()) return ref.status();
  chain(launch(*ref, (Lq + 127) / 128, 128, 0, &rp, "kcache_attn_ref_fwd"));
  if (!s.ok()) return s;
  std::vector<float> r(n_o);
  s = CuStatus(&api, api.MemcpyDtoH(r.data(), reinterpret_cast<CUdeviceptr>(rp.o), n_o * 4),
               "cuMemcpyDtoH");
  if (!s.ok()) return s;

  AttentionCheckDiff diff;
  diff.device = dev.info.name;
  double num = 0, den = 0;
  for (size_t i = 0; i < n_o; ++i) {
    const double a = k.bf16 ? FromBf16(o[i]) : FromHalf(o[i]);
    const double d = a - static_cast<double>(r[i]);
    if (std::isnan(a)) {
      diff.rel_l2 = NAN;
      diff.max_abs = NAN;
      return diff;
    }
    num += d * d;
    den += static_cast<double>(r[i]) * r[i];
    diff.max_abs = std::max(diff.max_abs, std::fabs(d));
  }
  diff.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return diff;
}

}  // namespace kcache
