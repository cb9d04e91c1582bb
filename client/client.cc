#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/cuda_loader.h"
#include "client/discovery.h"
#include "client/raw_launch.h"
#include "client/target_arch.h"
#include "compiler/cuda/cubin_images.h"

namespace kcache {

namespace ci = client_internal;

struct Client::Flight {
  absl::Notification done;
  absl::Status status;
  std::shared_ptr<const v1::GetKernelResponse> response;
  std::shared_ptr<const LoadedKernel> loaded;
};

void* LoadedKernel::Function(v1::EntryRole role) const {
  for (const auto& e : response->record().entry_points()) {
    if (e.role() == role) {
      auto it = functions.find(e.name());
      return it == functions.end() ? nullptr : it->second;
    }
  }
  return nullptr;
}

void* LoadedKernel::Function(absl::string_view name) const {
  auto it = functions.find(std::string(name));
  return it == functions.end() ? nullptr : it->second;
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  options.target = DiscoverTarget(options.target);
  std::string token = options.admin_token;
  if (!options.admin_token_path.empty()) {
    if (!token.empty()) {
      return absl::InvalidArgumentError(
          "ClientOptions.admin_token_path: give admin_token or admin_token_path, not both");
    }
    std::ifstream in(options.admin_token_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("ClientOptions.admin_token_path: cannot read ", options.admin_token_path));
    }
    token = std::string(absl::StripAsciiWhitespace(ss.str()));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ClientOptions.admin_token_path: ", options.admin_token_path, " is empty"));
    }
  }
  return std::unique_ptr<Client>(new Client(std::move(options), std::move(token)));
}

Client::Client(ClientOptions options, std::string admin_token)
    : options_(std::move(options)), admin_token_(std::move(admin_token)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  // Reconnect quickly after a daemon restart; our own loop backs off.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(options_.target, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::KernelService::NewStub(channel_);
}

Client::~Client() {
  auto api = ci::GetCudaApi();
  absl::MutexLock lock(&mu_);
  if (!api.ok()) return;
  for (auto& [k, f] : loads_) {
    if (f->done.HasBeenNotified() && f->loaded && !f->loaded->modules.empty()) {
      // A module is unloaded in its own context, whatever is current here.
      auto ctx = static_cast<ci::CUcontext>(f->loaded->context);
      if ((*api)->cuCtxPushCurrent(ctx) != 0) continue;  // context gone: nothing to free
      for (void* m : f->loaded->modules) (*api)->cuModuleUnload(static_cast<ci::CUmodule>(m));
      ci::CUcontext popped = nullptr;
      (*api)->cuCtxPopCurrent(&popped);
    }
  }
}

uint64_t Client::rpc_count() const {
  absl::MutexLock lock(&mu_);
  return rpcs_;
}

absl::Status Client::EnsureConnected(absl::Time deadline) {
  const absl::Time until = std::min(deadline, absl::Now() + options_.connect_timeout);
  if (auto st = ProbeUnixTarget(options_.target, until - absl::Now(), reached_.load()); !st.ok()) {
    return st;
  }
  if (channel_->GetState(true) != GRPC_CHANNEL_READY &&
      !channel_->WaitForConnected(absl::ToChronoTime(until))) {
    return absl::UnavailableError(absl::StrCat("no kcache daemon answered at ", options_.target,
                                               " within ",
                                               absl::FormatDuration(options_.connect_timeout)));
  }
  reached_.store(true);
  return absl::OkStatus();
}

namespace {

// Reports one streaming call's compile to ClientOptions::on_progress from a
// thread of its own (so that a single long phase is still reported every
// progress_every); the reading thread only records the daemon's events.
// Created at the first progress event, i.e. only for a miss.
class ProgressReporter {
 public:
  ProgressReporter(const ClientOptions& o, const v1::GetKernelRequest& request, absl::Time start)
      : o_(o), start_(start) {
    p_.request = &request;
    thread_ = std::thread([this] { Run(); });
  }
  ~ProgressReporter() { Finish(absl::CancelledError("abandoned")); }

  void Update(const v1::Progress& p) {
    absl::MutexLock lock(&mu_);
    p_.phase = p.phase();
    p_.queue_position = p.queue_position();
    p_.queue = p.queue();
    changed_ = true;
  }

  // Stops the thread; the final report, if anything was reported.
  void Finish(absl::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
    }
    thread_.join();
    if (!reported_) return;  // written by the joined thread only
    CompileProgress last;
    {
      absl::MutexLock lock(&mu_);
      last = p_;
    }
    last.elapsed = absl::Now() - start_;
    last.finished = true;
    last.status = std::move(status);
    o_.on_progress(last);
  }

 private:
  void Run() {
    absl::MutexLock lock(&mu_);
    absl::Time next = start_ + o_.progress_after;
    for (;;) {
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (reported_ && changed_);
      };
      mu_.AwaitWithDeadline(absl::Condition(&wake), next);
      if (stop_) return;
      reported_ = true;
      changed_ = false;
      CompileProgress now = p_;
      now.elapsed = absl::Now() - start_;
      mu_.Unlock();  // the callback runs with no lock held
      o_.on_progress(now);
      mu_.Lock();
      next = absl::Now() + o_.progress_every;
    }
  }

  const ClientOptions& o_;
  const absl::Time start_;
  absl::Mutex mu_;
  CompileProgress p_ ABSL_GUARDED_BY(mu_);
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_ = false;  // the thread's, then Finish's after the join
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> Client::CallGetKernel(
    const v1::GetKernelRequest& request, absl::Time deadline) {
  absl::Duration backoff = options_.initial_backoff;
  absl::Time unavailable_since = absl::InfiniteFuture();
  for (;;) {
    // A missing, wrong or forbidden socket fails here at once; a daemon that
    // refuses is waited for at most connect_timeout, not the compile deadline.
    if (auto st = EnsureConnected(deadline); !st.ok()) return st;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    // Wait for the channel to connect rather than failing at once while the
    // daemon starts; the deadline bounds it.
    ctx.set_wait_for_ready(true);
    // The admin token goes only with raw requests: spec requests need none,
    // and a token sent on every call would travel further than it must.
    if (request.has_raw() && !admin_token_.empty()) {
      ctx.AddMetadata("authorization", absl::StrCat("Bearer ", admin_token_));
    }
    auto resp = std::make_shared<v1::GetKernelResponse>();
    {
      absl::MutexLock lock(&mu_);
      ++rpcs_;
    }
    grpc::Status st;
    if (!options_.on_progress) {
      st = stub_->GetKernel(&ctx, request, resp.get());
    } else {
      // The same answer as a stream of events: progress while the daemon
      // compiles, then the result.
      const absl::Time start = absl::Now();
      std::unique_ptr<ProgressReporter> progress;
      std::unique_ptr<grpc::ClientReader<v1::GetKernelEvent>> reader =
          stub_->GetKernelStream(&ctx, request);
      v1::GetKernelEvent event;
      bool got = false;
      while (reader->Read(&event)) {
        if (event.has_result()) {
          resp->Swap(event.mutable_result());
          got = true;
        } else if (event.has_progress()) {
          if (progress == nullptr) {
            progress = std::make_unique<ProgressReporter>(options_, request, start);
          }
          progress->Update(event.progress());
        }
      }
      st = reader->Finish();
      if (st.ok() && !got) {
        st = grpc::Status(grpc::StatusCode::INTERNAL,
                          "the daemon ended GetKernelStream without a result");
      }
      if (progress != nullptr) progress->Finish(FromGrpcStatus(st));
    }
    if (st.ok()) return std::shared_ptr<const v1::GetKernelResponse>(std::move(resp));
    // CANCELLED is retried too: this client never cancels a call itself, so
    // it comes from the daemon cutting calls off while it shuts down (a
    // retry after "shutting down, retry" can reach it in that window).
    // GetKernel is idempotent.
    bool retry = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                 st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                 st.error_code() == grpc::StatusCode::CANCELLED;
    absl::Time now = absl::Now();
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      unavailable_since = std::min(unavailable_since, now);
      if (now - unavailable_since >= options_.connect_timeout) retry = false;
    } else {
      unavailable_since = absl::InfiniteFuture();
    }
    if (!retry || now + backoff >= deadline) {
      if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        // gRPC says DEADLINE_EXCEEDED both when no daemon ever answered
        // and when a compile ran too long; say which where we can tell.
        auto state = channel_->GetState(false);
        if (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_IDLE) {
          return absl::UnavailableError(absl::StrCat("no kcache daemon answered at ",
                                                     options_.target, " before the deadline"));
        }
      }
      if (st.error_code() == grpc::StatusCode::PERMISSION_DENIED && request.has_raw()) {
        // Say whether this client sent a token at all: the fix differs.
        return absl::PermissionDeniedError(absl::StrCat(
            st.error_message(), admin_token_.empty()
                                    ? " (this client has no admin token: set "
                                      "ClientOptions.admin_token or admin_token_path)"
                                    : " (the daemon refused this client's admin token)"));
      }
      return FromGrpcStatus(st);
    }
    // A server-provided hint wins over our own backoff.
    absl::Duration wait = backoff;
    auto hint = ctx.GetServerTrailingMetadata().find("retry-after-ms");
    if (hint != ctx.GetServerTrailingMetadata().end()) {
      int ms = 0;
      if (absl::SimpleAtoi(absl::string_view(hint->second.data(), hint->second.size()), &ms)) {
        wait = absl::Milliseconds(std::clamp(ms, 1, 10000));
      }
    }
    absl::SleepFor(std::min(wait, deadline - now));
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> Client::Fetch(
    const v1::AttentionSpec& spec, const v1::Target& target, absl::Duration deadline) {
  v1::GetKernelRequest req;
  *req.mutable_spec() = spec;
  *req.mutable_target() = target;
  return FetchRequest(req, deadline);
}

absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> Client::FetchRaw(
    const v1::RawKernel& raw, const v1::Target& target, absl::Duration deadline) {
  v1::GetKernelRequest req;
  *req.mutable_raw() = raw;
  *req.mutable_target() = target;
  return FetchRequest(req, deadline);
}

absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> Client::FetchRequest(
    const v1::GetKernelRequest& req, absl::Duration deadline) {
  std::string memo_key;
  {
    google::protobuf::io::StringOutputStream out(&memo_key);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    req.SerializeToCodedStream(&coded);
  }
  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    absl::MutexLock lock(&mu_);
    auto& slot = fetches_[memo_key];
    if (!slot) {
      slot = std::make_shared<Flight>();
      leader = true;
    }
    flight = slot;
  }
  absl::Time until =
      absl::Now() + (deadline > absl::ZeroDuration() ? deadline : options_.default_deadline);
  if (leader) {
    auto r = CallGetKernel(req, until);
    if (r.ok()) {
      flight->response = *r;
    } else {
      flight->status = r.status();
      absl::MutexLock lock(&mu_);
      fetches_.erase(memo_key);  // failures are not memoized: the next call asks again
    }
    flight->done.Notify();
  } else if (!flight->done.WaitForNotificationWithDeadline(until)) {
    return absl::DeadlineExceededError("waiting for another thread's request for this kernel");
  }
  if (!flight->status.ok()) return flight->status;
  return flight->response;
}

absl::StatusOr<std::shared_ptr<const LoadedKernel>> Client::Load(const v1::AttentionSpec& spec,
                                                                 v1::Target target,
                                                                 absl::Duration deadline) {
  v1::GetKernelRequest req;
  *req.mutable_spec() = spec;
  *req.mutable_target() = std::move(target);
  return LoadRequest(std::move(req), deadline);
}

absl::StatusOr<std::shared_ptr<const LoadedKernel>> Client::LoadRaw(const v1::RawKernel& raw,
                                                                    v1::Target target,
                                                                    absl::Duration deadline) {
  v1::GetKernelRequest req;
  *req.mutable_raw() = raw;
  *req.mutable_target() = std::move(target);
  return LoadRequest(std::move(req), deadline);
}

absl::StatusOr<std::shared_ptr<const LoadedKernel>> Client::LoadRequest(
    v1::GetKernelRequest request, absl::Duration deadline) {
  v1::Target& target = *request.mutable_target();
  auto api_or = ci::GetCudaApi();
  if (!api_or.ok()) return api_or.status();
  const ci::CudaApi& api = **api_or;
  ci::CUcontext ctx = nullptr;
  if (auto st = ci::CudaStatus(api, api.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"); !st.ok()) {
    return st;
  }
  if (ctx == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(request.has_raw() ? "Client::LoadRaw" : "Client::Load",
                     ": no current CUDA context on this thread"));
  }
  if (target.where_case() == v1::Target::WHERE_NOT_SET) {
    ci::CUdevice dev = 0;
    int major = 0, minor = 0;
    if (auto st = ci::CudaStatus(api, api.cuCtxGetDevice(&dev), "cuCtxGetDevice"); !st.ok()) {
      return st;
    }
    // 75/76 = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR/MINOR
    if (auto st = ci::CudaStatus(api, api.cuDeviceGetAttribute(&major, 75, dev),
                                 "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
        !st.ok()) {
      return st;
    }
    if (auto st = ci::CudaStatus(api, api.cuDeviceGetAttribute(&minor, 76, dev),
                                 "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
        !st.ok()) {
      return st;
    }
    target.set_arch(TargetArchForCapability(major, minor));
  }
  if (target.driver_version() == 0) {
    int v = 0;
    api.cuDriverGetVersion(&v);
    target.set_driver_version(v);
  }
  auto resp = FetchRequest(request, deadline);
  if (!resp.ok()) return resp.status();

  // The context's unique id where the driver has one: a destroyed context's
  // address can be reused by a new one, which must not get the old module.
  unsigned long long ctx_id = reinterpret_cast<uintptr_t>(ctx);
  if (api.cuCtxGetId != nullptr) {
    unsigned long long id = 0;
    if (api.cuCtxGetId(ctx, &id) == 0) ctx_id = id;
  }
  std::string load_key = absl::StrCat((*resp)->record().key(), "@", ctx_id);
  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    absl::MutexLock lock(&mu_);
    auto& slot = loads_[load_key];
    if (!slot) {
      slot = std::make_shared<Flight>();
      leader = true;
    }
    flight = slot;
  }
  if (!leader) {
    flight->done.WaitForNotification();  // a module load is short and bounded
    if (!flight->status.ok()) return flight->status;
    return flight->loaded;
  }
  auto loaded = std::make_shared<LoadedKernel>();
  loaded->raw_launch_state = std::make_shared<client_internal::RawLaunchState>();
  loaded->response = *resp;
  loaded->context = ctx;
  absl::Status st = [&]() -> absl::Status {
    // The daemon's loaders (compiler/cuda/cuda_driver.cc) share these two
    // steps with this one through the templates of cubin_images.h; the
    // holder and error adapter stay here, written against the client's own
    // driver table (client/cuda_loader.h: no cuda.h, no daemon library).
    if (auto s = LoadCubinImages(
            (*resp)->cubin(),
            [&](const char* image) {
              ci::CUmodule mod = nullptr;
              absl::Status one = ci::CudaStatus(
                  api, api.cuModuleLoadData(&mod, image),
                  absl::StrCat("cuModuleLoadData (image ", loaded->modules.size(), ")").c_str());
              if (one.ok()) loaded->modules.push_back(mod);
              return one;
            });
        !s.ok()) {
      return s;  // the modules loaded so far are unloaded below
    }
    for (const auto& e : (*resp)->record().entry_points()) {
      // From the first image that defines it; any other driver error stops
      // the search and is reported as the driver gave it.
      ci::CUfunction fn = nullptr;
      const ci::CUresult rc = FindCubinFunction(loaded->modules, [&](void* m) {
        return api.cuModuleGetFunction(&fn, static_cast<ci::CUmodule>(m), e.name().c_str());
      });
      const std::string what = absl::StrCat("cuModuleGetFunction(", e.name(), ") in the cubin's ",
                                            loaded->modules.size(), " image(s)");
      if (auto s = ci::CudaStatus(api, rc, what.c_str()); !s.ok()) return s;
      if (e.dynamic_smem_bytes() > 48 * 1024) {
        // 8 = CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if (auto s = ci::CudaStatus(
                api, api.cuFuncSetAttribute(fn, 8, static_cast<int>(e.dynamic_smem_bytes())),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
            !s.ok()) {
          return s;
        }
      }
      loaded->functions[e.name()] = fn;
    }
    return absl::OkStatus();
  }();
  if (!st.ok()) {
    for (void* m : loaded->modules) api.cuModuleUnload(static_cast<ci::CUmodule>(m));
    flight->status = st;
    absl::MutexLock lock(&mu_);
    loads_.erase(load_key);
  } else {
    flight->loaded = loaded;
  }
  flight->done.Notify();
  if (!st.ok()) return st;
  return std::shared_ptr<const LoadedKernel>(loaded);
}

absl::StatusOr<v1::PrefetchResponse> Client::Prefetch(const v1::PrefetchRequest& request,
                                                      absl::Duration deadline) {
  if (auto st = EnsureConnected(absl::Now() + deadline); !st.ok()) return st;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  ctx.set_wait_for_ready(true);
  v1::PrefetchResponse resp;
  grpc::Status st = stub_->Prefetch(&ctx, request, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  return resp;
}

}  // namespace kcache
