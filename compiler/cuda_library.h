// Loading NVIDIA's run-time libraries (NVRTC, nvJitLink) with dlopen, so
// that kcache builds and starts without them and says which paths it tried
// when one is missing.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kcache {

// dlopen's `explicit_path` alone when it is non-empty; otherwise the first
// of "<base>.so.<major>", "<base>.so", "$CUDA_HOME/lib64/<base>.so.<major>"
// and "/usr/local/cuda/lib64/<base>.so.<major>" that loads. The handle is
// never closed (the libraries keep process-wide state). UNAVAILABLE names
// `display_name` and every path tried with dlerror's reason.
absl::StatusOr<void*> OpenCudaLibrary(absl::string_view display_name, absl::string_view base,
                                      int major, const std::string& explicit_path);

}  // namespace kcache
