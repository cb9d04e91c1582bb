// nvJitLink loader and PTX linker. nvJitLink.h is used only for types and
// prototypes: every entry point is resolved with dlsym.
#include "compiler/cuda/nvjitlink.h"

#include <nvJitLink.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "compiler/cuda/cuda_library.h"
#include "compiler/cuda/nvrtc.h"

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
    case NVJITLINK_SUCCESS:
      return "NVJITLINK_SUCCESS";
    case NVJITLINK_ERROR_UNRECOGNIZED_OPTION:
      return "NVJITLINK_ERROR_UNRECOGNIZED_OPTION";
    case NVJITLINK_ERROR_MISSING_ARCH:
      return "NVJITLINK_ERROR_MISSING_ARCH";
    case NVJITLINK_ERROR_INVALID_INPUT:
      return "NVJITLINK_ERROR_INVALID_INPUT";
    case NVJITLINK_ERROR_PTX_COMPILE:
      return "NVJITLINK_ERROR_PTX_COMPILE";
    case NVJITLINK_ERROR_NVVM_COMPILE:
      return "NVJITLINK_ERROR_NVVM_COMPILE";
    case NVJITLINK_ERROR_INTERNAL:
      return "NVJITLINK_ERROR_INTERNAL";
    case NVJITLINK_ERROR_UNRECOGNIZED_ARCH:
      return "NVJITLINK_ERROR_UNRECOGNIZED_ARCH";
    case NVJITLINK_ERROR_UNSUPPORTED_ARCH:
      return "NVJITLINK_ERROR_UNSUPPORTED_ARCH";
    case NVJITLINK_ERROR_ARCH_MISMATCH:
      return "NVJITLINK_ERROR_ARCH_MISMATCH";
    default:
      return "nvJitLink error";
  }
}

// The one adapter from nvJitLinkResult to absl::Status. `what` names the
// call; `log` (nvJitLink's error log) is appended when non-empty.
absl::Status JitLinkStatus(nvJitLinkResult r, absl::string_view what, absl::string_view log = {}) {
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
      "-O3",
      "-ftz=0",
      "-prec-div=1",
      "-prec-sqrt=1",
      "-fma=1",
      // Resource report into the info log; does not change the code.
      "-Xptxas=-v",
  };
  return *kOptions;
}

NvJitLink::NvJitLink(std::string library_path) : library_path_(std::move(library_path)) {}
NvJitLink::~NvJitLink() = default;  // the library stays loaded, as NVRTC does

absl::Status NvJitLink::Load() const { return GetApi().status(); }

absl::StatusOr<const NvJitLink::Api*> NvJitLink::GetApi() const {
  return api_.Get([&]() -> absl::StatusOr<std::unique_ptr<Api>> {
    auto api = std::make_unique<Api>();
    absl::StatusOr<void*> loaded = LoadCudaLibrary(
        "nvJitLink", "libnvJitLink", 13, library_path_,
        "nvJitLink library lacks symbols (need CUDA >= 12.3)", [&](CudaSymbols& symbols) {
          symbols.Resolve(api->Create, "nvJitLinkCreate");
          symbols.Resolve(api->Destroy, "nvJitLinkDestroy");
          symbols.Resolve(api->AddData, "nvJitLinkAddData");
          symbols.Resolve(api->Complete, "nvJitLinkComplete");
          symbols.Resolve(api->GetLinkedCubinSize, "nvJitLinkGetLinkedCubinSize");
          symbols.Resolve(api->GetLinkedCubin, "nvJitLinkGetLinkedCubin");
          symbols.Resolve(api->GetErrorLogSize, "nvJitLinkGetErrorLogSize");
          symbols.Resolve(api->GetErrorLog, "nvJitLinkGetErrorLog");
          symbols.Resolve(api->GetInfoLogSize, "nvJitLinkGetInfoLogSize");
          symbols.Resolve(api->GetInfoLog, "nvJitLinkGetInfoLog");
          symbols.Resolve(api->Version, "nvJitLinkVersion");
        });
    if (!loaded.ok()) return loaded.status();
    return api;
  });
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
  return LoadedLibraryPath(reinterpret_cast<void*>((*api)->Version), "nvJitLink");
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
    return ReadCudaLog([&](size_t* n) { return api.GetErrorLogSize(h, n) == NVJITLINK_SUCCESS; },
                       [&](char* log) { return api.GetErrorLog(h, log) == NVJITLINK_SUCCESS; });
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
  out.log = ReadCudaLog([&](size_t* n) { return api.GetInfoLogSize(h, n) == NVJITLINK_SUCCESS; },
                        [&](char* log) { return api.GetInfoLog(h, log) == NVJITLINK_SUCCESS; });
  if (done != NVJITLINK_SUCCESS) {
    return JitLinkStatus(done, absl::StrCat("nvJitLink of ", input_name, " for ", arch),
                         error_log());
  }
  size_t size = 0;
  if (absl::Status s =
          JitLinkStatus(api.GetLinkedCubinSize(h, &size), "nvJitLinkGetLinkedCubinSize");
      !s.ok()) {
    return s;
  }
  out.cubin.resize(size);
  if (absl::Status s =
          JitLinkStatus(api.GetLinkedCubin(h, out.cubin.data()), "nvJitLinkGetLinkedCubin");
      !s.ok()) {
    return s;
  }
  return out;
}

}  // namespace kcache
