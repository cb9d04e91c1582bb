// NVRTC loader and compile driver. nvrtc.h (the CUDA header) is used only for
// types and prototypes: every entry point is resolved with dlsym.
#include "compiler/cuda/nvrtc.h"

#include <nvrtc.h>

#include <atomic>
#include <cctype>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "compiler/cuda/cubin_images.h"
#include "compiler/cuda/cuda_library.h"

namespace kcache {
namespace {

// The one adapter from nvrtcResult to absl::Status. `what` names the call;
// `detail` (e.g. the compile log) is appended when non-empty.
absl::Status NvrtcStatus(nvrtcResult r, const char* (*error_string)(nvrtcResult),
                         absl::string_view what, absl::string_view detail = {}) {
  if (r == NVRTC_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", error_string ? error_string(r) : "nvrtc error", " (",
                                 static_cast<int>(r), ")");
  if (!detail.empty()) absl::StrAppend(&msg, "\n", detail);
  switch (r) {
    case NVRTC_ERROR_COMPILATION:
      return absl::FailedPreconditionError(msg);
    case NVRTC_ERROR_INVALID_OPTION:
    case NVRTC_ERROR_INVALID_INPUT:
      return absl::InvalidArgumentError(msg);
    case NVRTC_ERROR_CANCELLED:
      return absl::DeadlineExceededError(msg);
    case NVRTC_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// What the flow callback stops a compile for: its deadline, or its module's
// cancel flag (CompileUnits: another unit failed).
struct FlowStop {
  absl::Time deadline;
  const std::atomic<bool>* cancel;
};

int FlowCallback(void* payload, void* /*reserved*/) {
  // Returning 1 asks NVRTC to stop; it then fails with NVRTC_ERROR_CANCELLED.
  const auto* stop = static_cast<const FlowStop*>(payload);
  if (stop->cancel != nullptr && stop->cancel->load(std::memory_order_relaxed)) return 1;
  return absl::Now() >= stop->deadline ? 1 : 0;
}

bool IsNumber(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// "12 bytes smem" style: finds "<N> <unit>" in `text`; -1 when absent.
int FindCount(absl::string_view text, absl::string_view unit) {
  size_t pos = text.find(unit);
  if (pos == absl::string_view::npos) return -1;
  // Walk back over spaces and digits before the unit.
  size_t end = pos;
  while (end > 0 && text[end - 1] == ' ') --end;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
  int value = -1;
  if (begin == end || !absl::SimpleAtoi(text.substr(begin, end - begin), &value)) return -1;
  return value;
}

}  // namespace

const std::vector<std::string>& CanonicalNvrtcOptions() {
  static const auto* const kOptions = new std::vector<std::string>{
      "-std=c++17",
      "--device-as-default-execution-space",
      "--ftz=false",
      "--prec-div=true",
      "--prec-sqrt=true",
      "--fmad=true",
      // Resource report into the log; does not change the code.
      "--ptxas-options=-v",
  };
  return *kOptions;
}

absl::Status ValidateArch(absl::string_view arch) {
  absl::string_view rest = arch;
  if (!absl::ConsumePrefix(&rest, "sm_")) {
    return absl::InvalidArgumentError(
        absl::StrCat("arch: must look like \"sm_90a\", got \"", arch, "\""));
  }
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) rest.remove_suffix(1);
  if (!IsNumber(rest) || rest.size() < 2 || rest.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("arch: must look like \"sm_90a\", got \"", arch, "\""));
  }
  return absl::OkStatus();
}

std::vector<KernelReport> ParsePtxasReport(absl::string_view log) {
  // ptxas -v prints, per function:
  //   ptxas info    : Compiling entry function 'f' for 'sm_90a'
  //   ptxas info    : Function properties for f
  //       8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
  //   ptxas info    : Used 32 registers, used 1 barriers, 1024 bytes smem, 388 bytes cmem[0]
  // Device functions that are not inlined get "Function properties" blocks
  // too but no "Used" line; only functions with a "Used" line are reported.
  std::vector<KernelReport> out;
  std::string current;   // function whose report is being read
  KernelReport pending;  // properties seen for `current`
  bool have_pending = false;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "ptxas info")) {
      rest = absl::StripLeadingAsciiWhitespace(rest);
      absl::ConsumePrefix(&rest, ":");
      rest = absl::StripLeadingAsciiWhitespace(rest);
      absl::string_view name = rest;
      if (absl::ConsumePrefix(&name, "Compiling entry function '")) {
        size_t q = name.find('\'');
        current = std::string(name.substr(0, q));
        pending = KernelReport{};
        pending.name = current;
        have_pending = true;
      } else if (absl::ConsumePrefix(&name, "Function properties for ")) {
        current = std::string(absl::StripAsciiWhitespace(name));
        if (!have_pending || pending.name != current) {
          pending = KernelReport{};
          pending.name = current;
          have_pending = true;
        }
      } else if (absl::StartsWith(rest, "Used ") && have_pending) {
        pending.registers = std::max(0, FindCount(rest, "registers"));
        pending.static_smem_bytes = std::max(0, FindCount(rest, "bytes smem"));
        out.push_back(pending);
        have_pending = false;
      }
      continue;
    }
    if (have_pending && absl::StrContains(line, "bytes stack frame")) {
      pending.stack_frame_bytes = std::max(0, FindCount(line, "bytes stack frame"));
      pending.spill_store_bytes = std::max(0, FindCount(line, "bytes spill stores"));
      pending.spill_load_bytes = std::max(0, FindCount(line, "bytes spill loads"));
    }
  }
  return out;
}

struct Nvrtc::Api {
  decltype(&::nvrtcGetErrorString) GetErrorString;
  decltype(&::nvrtcVersion) Version;
  decltype(&::nvrtcCreateProgram) CreateProgram;
  decltype(&::nvrtcDestroyProgram) DestroyProgram;
  decltype(&::nvrtcCompileProgram) CompileProgram;
  decltype(&::nvrtcGetCUBINSize) GetCUBINSize;
  decltype(&::nvrtcGetCUBIN) GetCUBIN;
  decltype(&::nvrtcGetProgramLogSize) GetProgramLogSize;
  decltype(&::nvrtcGetProgramLog) GetProgramLog;
  decltype(&::nvrtcSetFlowCallback) SetFlowCallback;
};

Nvrtc::Nvrtc(std::string library_path) : library_path_(std::move(library_path)) {}

Nvrtc::~Nvrtc() {
  // The library stays loaded: NVRTC keeps process-wide state and unloading
  // it while another Nvrtc instance may use it buys nothing.
}

absl::Status Nvrtc::Load() const { return GetApi().status(); }

absl::StatusOr<const Nvrtc::Api*> Nvrtc::GetApi() const {
  return api_.Get([&]() -> absl::StatusOr<std::unique_ptr<Api>> {
    auto api = std::make_unique<Api>();
    absl::StatusOr<void*> loaded = LoadCudaLibrary(
        "NVRTC", "libnvrtc", 13, library_path_,
        "NVRTC library lacks symbols (too old? need NVRTC >= 12.x)", [&](CudaSymbols& symbols) {
          symbols.Resolve(api->GetErrorString, "nvrtcGetErrorString");
          symbols.Resolve(api->Version, "nvrtcVersion");
          symbols.Resolve(api->CreateProgram, "nvrtcCreateProgram");
          symbols.Resolve(api->DestroyProgram, "nvrtcDestroyProgram");
          symbols.Resolve(api->CompileProgram, "nvrtcCompileProgram");
          symbols.Resolve(api->GetCUBINSize, "nvrtcGetCUBINSize");
          symbols.Resolve(api->GetCUBIN, "nvrtcGetCUBIN");
          symbols.Resolve(api->GetProgramLogSize, "nvrtcGetProgramLogSize");
          symbols.Resolve(api->GetProgramLog, "nvrtcGetProgramLog");
          symbols.Resolve(api->SetFlowCallback, "nvrtcSetFlowCallback");
        });
    if (!loaded.ok()) return loaded.status();
    return api;
  });
}

absl::StatusOr<NvrtcVersion> Nvrtc::Version() const {
  absl::StatusOr<const Api*> api = GetApi();
  if (!api.ok()) return api.status();
  NvrtcVersion v;
  absl::Status s =
      NvrtcStatus((*api)->Version(&v.major, &v.minor), (*api)->GetErrorString, "nvrtcVersion");
  if (!s.ok()) return s;
  return v;
}

absl::StatusOr<std::string> Nvrtc::LibraryPath() const {
  absl::StatusOr<const Api*> api = GetApi();
  if (!api.ok()) return api.status();
  return LoadedLibraryPath(reinterpret_cast<void*>((*api)->Version), "NVRTC");
}

absl::StatusOr<CompileOutput> Nvrtc::Compile(const CompileInput& input, absl::Time deadline,
                                             const std::atomic<bool>* cancel) const {
  if (input.raw.has_value()) {
    return absl::UnimplementedError(
        "raw kernels compile only in kcache-compile-worker (compiler/worker/raw_compile.h), not "
        "NVRTC");
  }
  if (absl::Status s = ValidateArch(input.arch); !s.ok()) return s;
  if (input.source.empty()) return absl::InvalidArgumentError("source: empty");
  if (!input.more_units.empty()) {
    return absl::InvalidArgumentError("more_units: a module of several units needs CompileUnits");
  }
  for (const std::string& opt : input.extra_options) {
    if (absl::StartsWith(opt, "-arch") || absl::StartsWith(opt, "--gpu-architecture")) {
      return absl::InvalidArgumentError(
          absl::StrCat("extra_options: \"", opt, "\": the architecture comes from `arch`"));
    }
  }
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError("compile deadline passed before NVRTC started");
  }
  absl::StatusOr<const Api*> api_or = GetApi();
  if (!api_or.ok()) return api_or.status();
  const Api& api = **api_or;
  const absl::Time start = absl::Now();

  std::vector<const char*> header_names, header_sources;
  for (const auto& [name, contents] : input.headers) {
    header_names.push_back(name.c_str());
    header_sources.push_back(contents.c_str());
  }
  const std::string name = input.program_name.empty() ? "kcache.cu" : input.program_name;
  nvrtcProgram prog = nullptr;
  absl::Status s = NvrtcStatus(api.CreateProgram(&prog, input.source.c_str(), name.c_str(),
                                                 static_cast<int>(header_names.size()),
                                                 header_sources.data(), header_names.data()),
                               api.GetErrorString, "nvrtcCreateProgram");
  if (!s.ok()) return s;
  struct Destroy {
    const Api& api;
    nvrtcProgram* prog;
    ~Destroy() { api.DestroyProgram(prog); }
  } destroy{api, &prog};

  FlowStop stop{deadline, cancel};  // outlives the compile call below
  if (deadline != absl::InfiniteFuture() || cancel != nullptr) {
    s = NvrtcStatus(api.SetFlowCallback(prog, &FlowCallback, &stop), api.GetErrorString,
                    "nvrtcSetFlowCallback");
    if (!s.ok()) return s;
  }

  const std::string arch_option = absl::StrCat("--gpu-architecture=", input.arch);
  std::vector<const char*> options;
  options.push_back(arch_option.c_str());
  for (const std::string& o : CanonicalNvrtcOptions()) options.push_back(o.c_str());
  for (const std::string& o : input.extra_options) options.push_back(o.c_str());
  const nvrtcResult compiled =
      api.CompileProgram(prog, static_cast<int>(options.size()), options.data());

  CompileOutput out;
  out.log = ReadCudaLog([&](size_t* n) { return api.GetProgramLogSize(prog, n) == NVRTC_SUCCESS; },
                        [&](char* log) { return api.GetProgramLog(prog, log) == NVRTC_SUCCESS; });
  if (compiled == NVRTC_ERROR_CANCELLED && cancel != nullptr && cancel->load() &&
      absl::Now() < deadline) {
    return absl::CancelledError(absl::StrCat("NVRTC compile of ", name, " for ", input.arch,
                                             ": cancelled: another unit of the module failed"));
  }
  if (compiled != NVRTC_SUCCESS) {
    return NvrtcStatus(compiled, api.GetErrorString,
                       absl::StrCat("NVRTC compile of ", name, " for ", input.arch), out.log);
  }
  size_t cubin_size = 0;
  s = NvrtcStatus(api.GetCUBINSize(prog, &cubin_size), api.GetErrorString, "nvrtcGetCUBINSize");
  if (!s.ok()) return s;
  out.cubin.resize(cubin_size);
  s = NvrtcStatus(api.GetCUBIN(prog, out.cubin.data()), api.GetErrorString, "nvrtcGetCUBIN");
  if (!s.ok()) return s;
  out.kernels = ParsePtxasReport(out.log);
  out.wall_time = absl::Now() - start;
  return out;
}

absl::StatusOr<CompileOutput> CompileUnits(const Nvrtc& nvrtc, const CompileInput& input,
                                           absl::Time deadline) {
  return CompileUnits(
      [&nvrtc](const CompileInput& unit, absl::Time unit_deadline,
               const std::atomic<bool>* cancel) {
        return nvrtc.Compile(unit, unit_deadline, cancel);
      },
      input, deadline);
}

absl::StatusOr<CompileOutput> CompileUnits(const UnitCompile& compile, const CompileInput& input,
                                           absl::Time deadline) {
  if (input.more_units.empty()) {
    absl::StatusOr<CompileOutput> out = compile(input, deadline, nullptr);
    if (out.ok()) {
      if (absl::Status s = CheckCubinImage(out->cubin, "NVRTC's cubin"); !s.ok()) return s;
    }
    return out;
  }
  const absl::Time start = absl::Now();
  const size_t n = input.more_units.size() + 1;
  const std::string name = input.program_name.empty() ? "kcache.cu" : input.program_name;
  std::vector<CompileInput> units(n);
  for (size_t i = 0; i < n; ++i) {
    CompileInput& u = units[i];
    u.source = i == 0 ? input.source : input.more_units[i - 1];
    u.program_name = absl::StrCat(name, " (unit ", i, ")");
    u.headers = input.headers;
    u.arch = input.arch;
    u.extra_options = input.extra_options;
  }
  std::vector<absl::StatusOr<CompileOutput>> outs(n, absl::UnknownError("not compiled"));
  // Set by the first unit that fails (for itself: never by a cancelled one):
  // the others stop at NVRTC's next poll of the flow callback, or do not
  // start, and answer Cancelled. The module fails either way; their time
  // would be wasted.
  std::atomic<bool> cancel{false};
  const auto compile_unit = [&](size_t i) {
    if (cancel.load()) {
      outs[i] = absl::CancelledError(
          absl::StrCat(units[i].program_name, ": not compiled: another unit of the module failed"));
      return;
    }
    outs[i] = compile(units[i], deadline, &cancel);
    if (!outs[i].ok() && outs[i].status().code() != absl::StatusCode::kCancelled)
      cancel.store(true);
  };
  {
    std::vector<std::thread> threads;
    threads.reserve(n - 1);
    for (size_t i = 1; i < n; ++i) {
      try {
        threads.emplace_back(compile_unit, i);
      } catch (const std::system_error&) {
        compile_unit(i);  // no thread to be had: here, in turn
      }
    }
    compile_unit(0);
    for (std::thread& t : threads) t.join();
  }
  // The first unit, in order, that failed for itself answers (its message
  // names the unit's program); a unit cancelled because of it does not.
  for (size_t i = 0; i < n; ++i) {
    if (!outs[i].ok() && outs[i].status().code() != absl::StatusCode::kCancelled) {
      return outs[i].status();
    }
  }
  CompileOutput out;
  std::vector<std::string> images;
  for (size_t i = 0; i < n; ++i) {
    if (!outs[i].ok()) return outs[i].status();  // only cancellations are left: none is expected
    absl::StrAppend(&out.log, "unit ", i, ":\n", outs[i]->log);
    for (KernelReport& k : outs[i]->kernels) out.kernels.push_back(std::move(k));
    images.push_back(std::move(outs[i]->cubin));
  }
  absl::StatusOr<std::string> blob = JoinCubinImages(images);
  if (!blob.ok()) return blob.status();
  out.cubin = *std::move(blob);
  out.wall_time = absl::Now() - start;
  return out;
}

}  // namespace kcache
