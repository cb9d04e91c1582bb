// The two Admin implementations (see admin.h): DaemonAdmin over gRPC and
// StoreAdmin over cache/store.h.
#include "tools/kcache/admin.h"

#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/key.h"
#include "cache/store.h"
#include "client/client.h"
#include "client/discovery.h"
#include "compiler/cuda/nvrtc.h"
#include "compiler/toolchain.h"

namespace kcache::tools {
namespace {

namespace fs = std::filesystem;

constexpr size_t kImportChunk = size_t{1} << 20;

class DaemonAdmin final : public Admin {
 public:
  DaemonAdmin(std::string target, std::shared_ptr<grpc::Channel> channel, absl::Duration timeout)
      : target_(std::move(target)),
        channel_(std::move(channel)),
        stub_(v1::AdminService::NewStub(channel_)),
        timeout_(timeout) {}

  std::string Describe() const override { return absl::StrCat("daemon at ", target_); }
  std::shared_ptr<grpc::Channel> channel() const override { return channel_; }

  absl::StatusOr<v1::StatsResponse> Stats() override {
    return Call<v1::StatsResponse>(&v1::AdminService::Stub::Stats, v1::StatsRequest());
  }
  absl::StatusOr<v1::ListResponse> List(const v1::Filter& filter, uint32_t page_size,
                                        const std::string& token) override {
    v1::ListRequest req;
    *req.mutable_filter() = filter;
    req.set_page_size(page_size);
    req.set_page_token(token);
    return Call<v1::ListResponse>(&v1::AdminService::Stub::List, req);
  }
  absl::StatusOr<v1::EntrySummary> Inspect(const std::string& key) override {
    v1::InspectRequest req;
    req.set_key(key);
    auto r = Call<v1::InspectResponse>(&v1::AdminService::Stub::Inspect, req);
    if (!r.ok()) return r.status();
    return r->entry();
  }
  absl::StatusOr<std::string> Cubin(const std::string& key) override {
    v1::InspectRequest req;
    req.set_key(key);
    req.set_include_cubin(true);
    auto r = Call<v1::InspectResponse>(&v1::AdminService::Stub::Inspect, req);
    if (!r.ok()) return r.status();
    return r->cubin();
  }
  absl::Status Pin(const std::string& key, const std::string& reason) override {
    v1::PinRequest req;
    req.set_key(key);
    req.set_reason(reason);
    return Call<v1::PinResponse>(&v1::AdminService::Stub::Pin, req).status();
  }
  absl::Status Unpin(const std::string& key) override {
    v1::PinRequest req;
    req.set_key(key);
    return Call<v1::PinResponse>(&v1::AdminService::Stub::Unpin, req).status();
  }
  absl::StatusOr<v1::EvictResponse> Evict(uint64_t max_bytes,
                                          std::optional<absl::Duration> grace) override {
    v1::EvictRequest req;
    req.set_max_bytes(max_bytes);
    // The daemon reads 0 as "its configured grace"; an explicit 0 s becomes 1 ms.
    if (grace) req.set_grace_period_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(*grace)));
    return Call<v1::EvictResponse>(&v1::AdminService::Stub::Evict, req);
  }
  absl::StatusOr<v1::InvalidateResponse> Invalidate(v1::InvalidateRequest req) override {
    return Call<v1::InvalidateResponse>(&v1::AdminService::Stub::Invalidate, req);
  }
  absl::StatusOr<v1::VerifyResponse> Verify() override {
    return Call<v1::VerifyResponse>(&v1::AdminService::Stub::Verify, v1::VerifyRequest());
  }
  absl::Status Export(const v1::Filter& filter,
                      absl::FunctionRef<absl::Status(std::string_view)> sink) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    v1::ExportRequest req;
    *req.mutable_filter() = filter;
    auto reader = stub_->Export(&ctx, req);
    v1::BundleChunk chunk;
    absl::Status sink_status;
    while (reader->Read(&chunk)) {
      sink_status = sink(chunk.data());
      if (!sink_status.ok()) {
        ctx.TryCancel();
        break;
      }
    }
    grpc::Status st = reader->Finish();
    if (!sink_status.ok()) return sink_status;
    return FromGrpcStatus(st);
  }
  absl::StatusOr<v1::ImportResponse> Import(
      std::string_view bundle, bool allow_foreign,
      const std::function<void(uint64_t)>& progress) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    if (allow_foreign) ctx.AddMetadata("x-kcache-allow-foreign-toolchain", "1");
    v1::ImportResponse resp;
    auto writer = stub_->Import(&ctx, &resp);
    uint64_t sent = 0;
    for (size_t off = 0; off < bundle.size(); off += kImportChunk) {
      v1::BundleChunk c;
      c.set_data(std::string(bundle.substr(off, kImportChunk)));
      if (!writer->Write(c)) break;  // the daemon answered early; Finish says why
      sent += c.data().size();
      if (progress) progress(sent);
    }
    writer->WritesDone();
    absl::Status st = FromGrpcStatus(writer->Finish());
    if (!st.ok()) return st;
    return resp;
  }

 private:
  template <typename Resp, typename Req>
  absl::StatusOr<Resp> Call(grpc::Status (v1::AdminService::Stub::*method)(grpc::ClientContext*,
                                                                           const Req&, Resp*),
                            const Req& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    Resp resp;
    absl::Status st = FromGrpcStatus(((*stub_).*method)(&ctx, req, &resp));
    if (!st.ok()) return st;
    return resp;
  }

  const std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AdminService::Stub> stub_;
  const absl::Duration timeout_;
};

class StoreAdmin final : public Admin {
 public:
  StoreAdmin(std::string path, std::unique_ptr<Store> store, bool read_only,
             std::string toolchain_id)
      : path_(std::move(path)),
        store_(std::move(store)),
        read_only_(read_only),
        toolchain_id_(std::move(toolchain_id)) {}
  ~StoreAdmin() override { (void)store_->Close(); }

  std::string Describe() const override {
    return absl::StrCat("store ", path_, read_only_ ? " (read-only)" : "");
  }

  absl::StatusOr<v1::StatsResponse> Stats() override {
    auto s = store_->Stats();
    if (!s.ok()) return s.status();
    // This machine's NVRTC and nvJitLink stand in for "the current
    // toolchains" (attention and raw kernels).
    Nvrtc nvrtc;
    if (auto tc = NvrtcToolchain(nvrtc); tc.ok()) *s->mutable_toolchain() = *tc;
    NvJitLink linker;
    if (auto tc = RawToolchain(linker); tc.ok()) *s->mutable_raw_toolchain() = *tc;
    return s;
  }
  absl::StatusOr<v1::ListResponse> List(const v1::Filter& filter, uint32_t page_size,
                                        const std::string& token) override {
    return store_->List(filter, page_size, token);
  }
  absl::StatusOr<v1::EntrySummary> Inspect(const std::string& key) override {
    auto k = Resolve(key);
    if (!k.ok()) return k.status();
    auto e = store_->Inspect(*k);
    if (!e.ok()) return e.status();
    if (!e->has_value()) return absl::NotFoundError("no entry under that key");
    return **e;
  }
  absl::StatusOr<std::string> Cubin(const std::string& key) override {
    auto k = Resolve(key);
    if (!k.ok()) return k.status();
    auto e = store_->Lookup(*k);
    if (!e.ok()) return e.status();
    if (*e == nullptr) return absl::NotFoundError("no entry under that key");
    return (*e)->cubin;
  }
  absl::Status Pin(const std::string& key, const std::string& reason) override {
    auto k = Resolve(key);
    if (!k.ok()) return k.status();
    return store_->Pin(*k, reason);
  }
  absl::Status Unpin(const std::string& key) override {
    auto k = Resolve(key);
    if (!k.ok()) return k.status();
    return store_->Unpin(*k);
  }
  absl::StatusOr<v1::EvictResponse> Evict(uint64_t max_bytes,
                                          std::optional<absl::Duration> grace) override {
    auto r = store_->Evict(max_bytes, grace);
    if (!r.ok()) return r.status();
    auto freed = store_->CollectGarbage();
    if (!freed.ok()) return freed.status();
    r->set_freed_bytes(r->freed_bytes() + *freed);
    return r;
  }
  absl::StatusOr<v1::InvalidateResponse> Invalidate(v1::InvalidateRequest req) override {
    if (req.what_case() == v1::InvalidateRequest::kKey) {
      auto k = Resolve(req.key());
      if (!k.ok()) return k.status();
      req.set_key(*k);
    }
    return store_->Invalidate(req);
  }
  absl::StatusOr<v1::VerifyResponse> Verify() override { return store_->Verify(); }
  absl::Status Export(const v1::Filter& filter,
                      absl::FunctionRef<absl::Status(std::string_view)> sink) override {
    return store_->Export(filter, sink).status();
  }
  absl::StatusOr<v1::ImportResponse> Import(
      std::string_view bundle, bool allow_foreign,
      const std::function<void(uint64_t)>& progress) override {
    ImportOptions o;
    o.allow_foreign_toolchain = allow_foreign;
    o.expected_toolchain_id = toolchain_id_;
    if (o.expected_toolchain_id.empty() && !allow_foreign) {
      Nvrtc nvrtc;
      auto tc = NvrtcToolchain(nvrtc);
      if (!tc.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot tell this machine's toolchain (", tc.status().message(),
                         "); pass --toolchain ID or --allow-foreign-toolchain"));
      }
      o.expected_toolchain_id = tc->id();
    }
    auto r = store_->Import(bundle, o);
    if (r.ok() && progress) progress(bundle.size());
    return r;
  }

 private:
  absl::StatusOr<std::string> Resolve(const std::string& key) {
    if (ValidateKey(key).ok()) return key;
    return store_->ResolveKeyPrefix(key);
  }

  const std::string path_;
  std::unique_ptr<Store> store_;
  const bool read_only_;
  const std::string toolchain_id_;
};

absl::StatusOr<std::unique_ptr<Admin>> ConnectDaemon(const std::string& target,
                                                     const ConnectOptions& o) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // A missing socket, a path that is not one, or one this user may not open
  // is said at once, with the path; a refusing daemon is waited for at most
  // connect_timeout.
  if (auto st = ProbeUnixTarget(target, o.connect_timeout); !st.ok()) return st;
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + o.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("no kcache daemon answers at ", target));
  }
  return std::unique_ptr<Admin>(new DaemonAdmin(target, std::move(channel), o.rpc_timeout));
}

absl::StatusOr<std::unique_ptr<Admin>> OpenStore(const std::string& dir, const ConnectOptions& o,
                                                 bool mutate, bool create) {
  std::error_code ec;
  // A directory with store files but no CURRENT is a damaged store, not a
  // missing one: Store::Open says so and how to repair it.
  auto holds_store_files = [&] {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (n.starts_with("MANIFEST-") || n.ends_with(".sst") || n.ends_with(".log")) return true;
    }
    return false;
  };
  if (!create && !fs::exists(fs::path(dir) / "CURRENT", ec) && !holds_store_files()) {
    return absl::UnavailableError(absl::StrCat("no kcache store at ", dir));
  }
  StoreOptions so;
  so.hot_cache_bytes = 0;
  so.stats_flush_interval = absl::ZeroDuration();  // no flusher thread
  so.read_only = !mutate;
  auto store = Store::Open(dir, so);
  if (!store.ok()) {
    if (absl::IsFailedPrecondition(store.status()) &&
        absl::StrContains(store.status().message(), "locked")) {
      return absl::UnavailableError(
          absl::StrCat("the store ", dir,
                       " is held by a running daemon; this command changes the store, "
                       "so run it through the daemon (--socket PATH)"));
    }
    if (absl::IsNotFound(store.status())) {
      return absl::UnavailableError(absl::StrCat("no kcache store at ", dir));
    }
    return store.status();
  }
  return std::unique_ptr<Admin>(new StoreAdmin(dir, *std::move(store), !mutate, o.toolchain_id));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Admin>> Connect(const ConnectOptions& o, bool mutate, bool create) {
  int given = !o.socket.empty() + !o.target.empty() + !o.store.empty();
  if (given > 1) {
    return absl::InvalidArgumentError("give at most one of --socket, --target and --store");
  }
  if (!o.target.empty()) return ConnectDaemon(o.target, o);
  if (!o.socket.empty()) return ConnectDaemon(absl::StrCat("unix:", o.socket), o);
  if (!o.store.empty()) return OpenStore(o.store, o, mutate, create);
  // Defaults: the daemon as every client finds it (client/discovery.h):
  // $KCACHE_TARGET, else /run/kcache/kcached.sock or .kcache/kcached.sock if
  // there; else the store itself.
  const std::string target = DiscoverTarget();
  if (const char* env = std::getenv("KCACHE_TARGET"); env != nullptr && *env != '\0') {
    return ConnectDaemon(target, o);
  }
  std::error_code ec;
  const std::string path = UnixSocketPath(target);
  if (!path.empty() && fs::exists(fs::symlink_status(path, ec))) {
    auto d = ConnectDaemon(target, o);
    if (d.ok()) return d;
    // A stale socket over a store of our own: the store. No store: the
    // daemon's reason (missing permission, say), not "no kcache store".
    auto s = OpenStore(kDefaultStore, o, mutate, create);
    if (!s.ok() && absl::IsUnavailable(s.status()) &&
        absl::StrContains(s.status().message(), "no kcache store")) {
      return d.status();
    }
    return s;
  }
  return OpenStore(kDefaultStore, o, mutate, create);
}

}  // namespace kcache::tools
