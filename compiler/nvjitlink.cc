// nvJitLink loader and PTX linker. nvJitLink.h is used only for types and
// prototypes: every entry point is resolved with dlsym.
#include "compiler/nvjitlink.h"

#include <dlfcn.h>
#include <limits.h>
#include <nvJitLink.h>
#include <stdlib.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/nvrtc.h"
#include "compiler/cuda_library.h"

namespace kcache {

struct NvJitLink::Api {
  decltype(&::nvJitLinkCreate) Create;
  decltype(&::nvJitLinkDestroy) Destroy;
  decltype(&::nvJitLinkAddData) AddData;
  decltype(&::nvJitLinkComplete) Complete;
  decltype(&::nvJitLinkGetLinkedCubinSize) GetLinkedCubinSize;
  decltype(&::nvJitLinkGetLinkedCubin) GetLinkedCubin;
  decltype(&::nvJitLinkGetErrorLogSize) GetErrorLogSize;
  decltype(&::nvJitLinkGetErrorLog) GetErrorLog;
  decltype(&::nvJitLinkGetInfoLogSize) GetInfoLogSize;
  decltype(&::nvJitLinkGetInfoLog) GetInfoLog;
  decltype(&::nvJitLinkVersion) Version;
};

namespace {

const char* ResultName(nvJitLinkResult r) {
  switch (r) {
    case NVJITLINK_SUCCESS: return "NVJITLINK_SUCCESS";
    case NVJITLINK_ERROR_UNRECOGNIZED_OPTION: return "NVJITLINK_ERROR_UNRECOGNIZED_OPTION";
    case NVJITLINK_ERROR_MISSING_ARCH: return "NVJITLINK_ERROR_MISSING_ARCH";
    case NVJITLINK_ERROR_INVALID_INPUT: return "NVJITLINK_ERROR_INVALID_INPUT";
    case NVJITLINK_ERROR_PTX_COMPILE: return "NVJITLINK_ERROR_PTX_COMPILE";
    case NVJITLINK_ERROR_NVVM_COMPILE: return "NVJITLINK_ERROR_NVVM_COMPILE";
    case NVJITLINK_ERROR_INTERNAL: return "NVJITLINK_ERROR_INTERNAL";
    case NVJITLINK_ERROR_UNRECOGNIZED_ARCH: return "NVJITLINK_ERROR_UNRECOGNIZED_ARCH";
    case NVJITLINK_ERROR_UNSUPPORTED_ARCH: return "NVJITLINK_ERROR_UNSUPPORTED_ARCH";
    case NVJITLINK_ERROR_ARCH_MISMATCH: return "NVJITLINK_ERROR_ARCH_MISMATCH";
    default: return "nvJitLink error";
  }
}

// The one adapter from nvJitLinkResult to absl::Status. `what` names the
// call; `log` (nvJitLink's error log) is appended when non-empty.
absl::Status JitLinkStatus(nvJitLinkResult r, absl::string_view what,
                           absl::string_view log = {}) {
  if (r == NVJITLINK_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", ResultName(r), " (", static_cast<int>(r), ")");
  if (!log.empty()) absl::StrAppend(&msg, "\n", log);
  switch (r) {
    case NVJITLINK_ERROR_PTX_COMPILE:
    case NVJITLINK_ERROR_INVALID_INPUT:
    case NVJITLINK_ERROR_UNRECOGNIZED_INPUT:
    case NVJITLINK_ERROR_INCORRECT_INPUT_TYPE:
      return absl::FailedPreconditionError(msg);
    case NVJITLINK_ERROR_UNRECOGNIZED_OPTION:
    case NVJITLINK_ERROR_MISSING_ARCH:
    case NVJITLINK_ERROR_UNRECOGNIZED_ARCH:
    case NVJITLINK_ERROR_UNSUPPORTED_ARCH:
    case NVJITLINK_ERROR_ARCH_MISMATCH:
    case NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

const std::vector<std::string>& CanonicalNvJitLinkOptions() {
  static const auto* const kOptions = new std::vector<std::string>{
      "-O3", "-ftz=0", "-prec-div=1", "-prec-sqrt=1", "-fma=1",
      // Resource report into the info log; does not change the code.
      "-Xptxas=-v",
  };
  return *kOptions;
}

NvJitLink::NvJitLink(std::string library_path) : library_path_(std::move(library_path)) {}
NvJitLink::~NvJitLink() = default;  // the library stays loaded, as NVRTC does

absl::Status NvJitLink::Load() const { return GetApi().status(); }

absl::StatusOr<const NvJitLink::Api*> NvJitLink::GetApi() const {
  absl::MutexLock lock(&mu_);
  if (attempted_) {
    if (!load_status_.ok()) return load_status_;
    return api_.get();
  }
  attempted_ = true;
  absl::StatusOr<void*> opened = OpenCudaLibrary("nvJitLink", "libnvJitLink", 13, library_path_);
  if (!opened.ok()) {
    load_status_ = opened.status();
    return load_status_;
  }
  void* handle = *opened;

  auto api = std::make_unique<Api>();
  std::vector<std::string> missing;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (!fn) missing.push_back(name);
  };
  resolve(api->Create, "nvJitLinkCreate");
  resolve(api->Destroy, "nvJitLinkDestroy");
  resolve(api->AddData, "nvJitLinkAddData");
  resolve(api->Complete, "nvJitLinkComplete");
  resolve(api->GetLinkedCubinSize, "nvJitLinkGetLinkedCubinSize");
  resolve(api->GetLinkedCubin, "nvJitLinkGetLinkedCubin");
  resolve(api->GetErrorLogSize, "nvJitLinkGetErrorLogSize");
  resolve(api->GetErrorLog, "nvJitLinkGetErrorLog");
  resolve(api->GetInfoLogSize, "nvJitLinkGetInfoLogSize");
  resolve(api->GetInfoLog, "nvJitLinkGetInfoLog");
  resolve(api->Version, "nvJitLinkVersion");
  if (!missing.empty()) {
    dlclose(handle);
    load_status_ = absl::UnavailableError(absl::StrCat(
        "nvJitLink library lacks symbols (need CUDA >= 12.3): ", absl::StrJoin(missing, ", ")));
    return load_status_;
  }
  api_ = std::move(api);
  return api_.get();
}

absl::StatusOr<NvJitLinkVersion> NvJitLink::Version() const {
  auto api = GetApi();
  if (!api.ok()) return api.status();
  NvJitLinkVersion v;
  if (absl::Status s = JitLinkStatus((*api)->Version(&v.major, &v.minor), "nvJitLinkVersion");
      !s.ok()) {
    return s;
  }
  return v;
}

absl::StatusOr<std::string> NvJitLink::LibraryPath() const {
  auto api = GetApi();
  if (!api.ok()) return api.status();
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>((*api)->Version), &info) == 0 || !info.dli_fname) {
    return absl::InternalError("dladdr could not name the loaded nvJitLink library");
  }
  char resolved[PATH_MAX];
  if (!realpath(info.dli_fname, resolved)) return std::string(info.dli_fname);
  return std::string(resolved);
}

absl::StatusOr<LinkOutput> NvJitLink::LinkPtx(absl::string_view ptx, absl::string_view arch,
                                              absl::string_view name) const {
  if (absl::Status s = ValidateArch(arch); !s.ok()) return s;
  if (ptx.empty()) return absl::InvalidArgumentError("raw.source: empty PTX");
  auto api_or = GetApi();
  if (!api_or.ok()) return api_or.status();
  const Api& api = **api_or;

  const std::string arch_option = absl::StrCat("-arch=", arch);
  std::vector<const char*> options = {arch_option.c_str()};
  for (const std::string& o : CanonicalNvJitLinkOptions()) options.push_back(o.c_str());
  nvJitLinkHandle h = nullptr;
  if (absl::Status s = JitLinkStatus(
          api.Create(&h, static_cast<uint32_t>(options.size()), options.data()), "nvJitLinkCreate");
      !s.ok()) {
    return s;
  }
  struct Destroy {
    const Api& api;
    nvJitLinkHandle* h;
    ~Destroy() { api.Destroy(h); }
  } destroy{api, &h};
  auto error_log = [&]() {
    std::string log;
    size_t n = 0;
    if (api.GetErrorLogSize(h, &n) == NVJITLINK_SUCCESS && n > 1) {
      log.resize(n);
      if (api.GetErrorLog(h, log.data()) != NVJITLINK_SUCCESS) log.clear();
      while (!log.empty() && log.back() == '\0') log.pop_back();
    }
    return log;
  };
  // nvJitLink reads PTX as a C string: pass a terminated copy.
  const std::string data(ptx);
  const std::string input_name(name.empty() ? "kernel.ptx" : name);
  if (absl::Status s = JitLinkStatus(
          api.AddData(h, NVJITLINK_INPUT_PTX, data.c_str(), data.size() + 1, input_name.c_str()),
          "nvJitLinkAddData", error_log());
      !s.ok()) {
    return s;
  }
  const nvJitLinkResult done = api.Complete(h);
  LinkOutput out;
  size_t n = 0;
  if (api.GetInfoLogSize(h, &n) == NVJITLINK_SUCCESS && n > 1) {
    out.log.resize(n);
    if (api.GetInfoLog(h, out.log.data()) != NVJITLINK_SUCCESS) out.log.clear();
    while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  }
  if (done != NVJITLINK_SUCCESS) {
    return JitLinkStatus(done, absl::StrCat("nvJitLink of ", input_name, " for ", arch),
                         error_log());
  }
  size_t size = 0;
  if (absl::Status s = JitLinkStatus(api.GetLinkedCubinSize(h, &size), "nvJitLinkGetLinkedCubinSize");
      !s.ok()) {
    return s;
  }
  out.cubin.resize(size);
  if (absl::Status s = JitLinkStatus(api.GetLinkedCubin(h, out.cubin.data()), "nvJitLinkGetLinkedCubin");
      !s.ok()) {
    return s;
  }
  return out;
}

}  // namespace kcache
