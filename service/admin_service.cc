#include "service/admin_service.h"

#include <glog/logging.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/key.h"
#include "service/admin_token.h"
#include "service/grpc_status.h"
#include "service/logging.h"

namespace kcache {

namespace {

constexpr size_t kMaxImportBytes = size_t{8} << 30;

}  // namespace

absl::Status AdminServiceImpl::Authorize(grpc::ServerContext* ctx) const {
  if (state_->shutting_down.load()) return absl::UnavailableError("kcached is shutting down");
  if (!token_.empty() && !CarriesAdminToken(ctx->client_metadata(), token_)) {
    return absl::PermissionDeniedError("admin calls over TCP need the admin token");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> AdminServiceImpl::ResolveKey(const std::string& key) {
  if (ValidateKey(key).ok()) return key;
  // Not a binary key: a hex key or unique hex prefix, as people type them.
  return store_->ResolveKeyPrefix(key);
}

#define KC_AUTHORIZE(ctx) \
  if (absl::Status _st = Authorize(ctx); !_st.ok()) return Reply(ctx, _st)

grpc::Status AdminServiceImpl::Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                                     v1::StatsResponse* resp) {
  KC_AUTHORIZE(ctx);
  auto s = store_->Stats();
  if (!s.ok()) return Reply(ctx, s.status());
  *resp = *std::move(s);
  backend_->FillCounters(resp);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::List(grpc::ServerContext* ctx, const v1::ListRequest* req,
                                    v1::ListResponse* resp) {
  KC_AUTHORIZE(ctx);
  auto r = store_->List(req->filter(), req->page_size(), req->page_token());
  if (!r.ok()) return Reply(ctx, r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Inspect(grpc::ServerContext* ctx, const v1::InspectRequest* req,
                                       v1::InspectResponse* resp) {
  KC_AUTHORIZE(ctx);
  auto key = ResolveKey(req->key());
  if (!key.ok()) return Reply(ctx, key.status());
  auto e = store_->Inspect(*key);
  if (!e.ok()) return Reply(ctx, e.status());
  if (!e->has_value()) return Reply(ctx, absl::NotFoundError("no entry under that key"));
  *resp->mutable_entry() = **e;
  if (req->include_cubin()) {
    auto entry = store_->Lookup(*key);  // digest-checked read
    if (!entry.ok()) return Reply(ctx, entry.status());
    if (*entry == nullptr) return Reply(ctx, absl::NotFoundError("no entry under that key"));
    resp->set_cubin((*entry)->cubin);
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Pin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                                   v1::PinResponse*) {
  KC_AUTHORIZE(ctx);
  auto key = ResolveKey(req->key());
  if (!key.ok()) return Reply(ctx, key.status());
  return Reply(ctx, store_->Pin(*key, req->reason()));
}

grpc::Status AdminServiceImpl::Unpin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                                     v1::PinResponse*) {
  KC_AUTHORIZE(ctx);
  auto key = ResolveKey(req->key());
  if (!key.ok()) return Reply(ctx, key.status());
  return Reply(ctx, store_->Unpin(*key));
}

grpc::Status AdminServiceImpl::Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                                     v1::EvictResponse* resp) {
  KC_AUTHORIZE(ctx);
  std::optional<absl::Duration> grace;
  if (req->grace_period_ms() > 0) grace = absl::Milliseconds(req->grace_period_ms());
  const absl::Time start = absl::Now();
  auto r = store_->Evict(req->max_bytes(), grace);
  if (!r.ok()) return Reply(ctx, r.status());
  evicted_->Inc(r->evicted_entries());
  LOG(INFO) << "eviction entries=" << r->evicted_entries() << " freed_bytes=" << r->freed_bytes()
            << " duration=" << LogSeconds(absl::Now() - start) << " (admin: gc --max-bytes "
            << req->max_bytes() << ")";
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Invalidate(grpc::ServerContext* ctx,
                                          const v1::InvalidateRequest* req,
                                          v1::InvalidateResponse* resp) {
  KC_AUTHORIZE(ctx);
  v1::InvalidateRequest r = *req;
  if (r.what_case() == v1::InvalidateRequest::kKey) {
    auto key = ResolveKey(r.key());
    if (!key.ok()) return Reply(ctx, key.status());
    r.set_key(*key);
  }
  const absl::Time start = absl::Now();
  auto out = store_->Invalidate(r);
  if (!out.ok()) return Reply(ctx, out.status());
  std::string what;
  switch (r.what_case()) {
    case v1::InvalidateRequest::kToolchainId:
      what = absl::StrCat("toolchain ", r.toolchain_id());
      break;
    case v1::InvalidateRequest::kArch:
      what = absl::StrCat("arch ", r.arch());
      break;
    case v1::InvalidateRequest::kCreatedBeforeUnixMs:
      what = absl::StrCat("created_before_unix_ms ", r.created_before_unix_ms());
      break;
    default:
      what = "key";
  }
  LOG(INFO) << "invalidation what=" << what << " entries=" << out->removed_entries()
            << " freed_bytes=" << out->freed_bytes()
            << " duration=" << LogSeconds(absl::Now() - start);
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Verify(grpc::ServerContext* ctx, const v1::VerifyRequest*,
                                      v1::VerifyResponse* resp) {
  KC_AUTHORIZE(ctx);
  const absl::Time start = absl::Now();
  auto r = store_->Verify();
  if (!r.ok()) return Reply(ctx, r.status());
  google::LogMessage(__FILE__, __LINE__,
                     r->corrupt() > 0 ? google::GLOG_WARNING : google::GLOG_INFO)
          .stream()
      << "verify checked=" << r->checked() << " corrupt=" << r->corrupt()
      << " quarantined=" << r->quarantined_keys_size()
      << " duration=" << LogSeconds(absl::Now() - start);
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Export(grpc::ServerContext* ctx, const v1::ExportRequest* req,
                                      grpc::ServerWriter<v1::BundleChunk>* writer) {
  KC_AUTHORIZE(ctx);
  constexpr size_t kChunk = size_t{1} << 20;
  std::string buf;
  auto flush = [&]() -> absl::Status {
    if (buf.empty()) return absl::OkStatus();
    v1::BundleChunk c;
    c.set_data(std::move(buf));
    buf.clear();
    if (!writer->Write(c)) return absl::CancelledError("client went away during export");
    return absl::OkStatus();
  };
  auto r = store_->Export(req->filter(), [&](std::string_view piece) -> absl::Status {
    buf.append(piece);
    return buf.size() >= kChunk ? flush() : absl::OkStatus();
  });
  if (!r.ok()) return Reply(ctx, r.status());
  return Reply(ctx, flush());
}

grpc::Status AdminServiceImpl::Import(grpc::ServerContext* ctx,
                                      grpc::ServerReader<v1::BundleChunk>* reader,
                                      v1::ImportResponse* resp) {
  KC_AUTHORIZE(ctx);
  // The bundle is validated as a whole before anything is written.
  std::string bundle;
  v1::BundleChunk c;
  while (reader->Read(&c)) {
    if (bundle.size() + c.data().size() > kMaxImportBytes) {
      return Reply(ctx, absl::ResourceExhaustedError("import: bundle over 8 GiB"));
    }
    bundle.append(c.data());
  }
  ImportOptions opts;
  opts.expected_toolchain_id = backend_->toolchain().id();
  auto it = ctx->client_metadata().find("x-kcache-allow-foreign-toolchain");
  opts.allow_foreign_toolchain = it != ctx->client_metadata().end() &&
                                 std::string_view(it->second.data(), it->second.size()) == "1";
  auto r = store_->Import(bundle, opts);
  if (!r.ok()) return Reply(ctx, r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

#undef KC_AUTHORIZE

}  // namespace kcache
