// libFuzzer target for what kcached does with a KernelService request's
// bytes before any compile: the budget check and parse (service/
// request_parse.h), then validation and normalization into a key
// (KernelBackend::Resolve: spec or raw kernel, target). The first byte picks
// GetKernelRequest ('P': PrefetchRequest, every entry). Nothing may crash,
// hang, read out of bounds or allocate past the budget; a request that
// resolves must resolve again, from its normalized spec, to the same key.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "absl/strings/string_view.h"
#include "compiler/toolchain.h"
#include "google/protobuf/stubs/logging.h"
#include "kcache/v1/daemon_config.pb.h"
#include "service/kernel_backend.h"
#include "service/metrics.h"
#include "service/request_parse.h"

namespace {

// A backend with no store, scheduler, compiler or devices: only Resolve is
// called, which touches none of them. Toolchains are fixed fakes, so keys
// are stable across runs.
kcache::KernelBackend& Backend() {
  static kcache::MetricsRegistry* metrics = new kcache::MetricsRegistry();
  static kcache::KernelBackend* backend = [] {
    // Protobuf logs a line per non-UTF-8 string it refuses: noise here.
    google::protobuf::SetLogHandler(nullptr);
    kcache::BackendDeps deps;
    deps.toolchain = kcache::MakeToolchain("nvrtc", "13.0", "fuzz", {});
    deps.toolchain_status = absl::OkStatus();
    deps.raw_toolchain = kcache::MakeToolchain("llvm-nvptx+nvjitlink", "22", "fuzz", {});
    deps.raw_toolchain_status = absl::OkStatus();
    deps.config.set_max_expr_nodes(256);
    deps.config.set_max_expr_depth(32);
    deps.config.set_max_raw_kernel_names(64);
    deps.config.set_compile_only(true);
    deps.metrics = metrics;
    return new kcache::KernelBackend(std::move(deps));
  }();
  return *backend;
}

void CheckResolve(const kcache::v1::GetKernelRequest& request) {
  auto r = Backend().Resolve(request);
  if (!r.ok()) {
    // Every refusal says why.
    if (r.status().message().empty()) std::abort();
    return;
  }
  if (r->id.key.empty() || r->queue.empty()) std::abort();
  if (r->raw != nullptr) return;
  // Normalizing is idempotent: the normalized spec is the same kernel.
  kcache::v1::GetKernelRequest again = request;
  *again.mutable_spec() = r->id.normalized;
  auto r2 = Backend().Resolve(again);
  if (!r2.ok() || r2->id.key != r->id.key) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  absl::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  kcache::RequestLimits limits;
  limits.max_request_bytes = 1 << 20;
  limits.max_prefetch_requests = 64;
  if (data[0] == 'P') {
    auto p = kcache::ParsePrefetchRequest(in, limits);
    if (!p.ok()) {
      if (p.status().message().empty()) std::abort();
      return 0;
    }
    if (static_cast<uint64_t>(p->requests_size()) > limits.max_prefetch_requests) std::abort();
    for (const auto& r : p->requests()) CheckResolve(r);
  } else {
    auto r = kcache::ParseGetKernelRequest(in, limits);
    if (!r.ok()) {
      if (r.status().message().empty()) std::abort();
      return 0;
    }
    CheckResolve(*r);
  }
  return 0;
}
