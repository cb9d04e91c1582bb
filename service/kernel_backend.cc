#include "service/kernel_backend.h"

#include <glog/logging.h>

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/target_arch.h"
#include "service/logging.h"
#include "service/remote_hook.h"

namespace kcache {

namespace {

// What a compile log line calls the kernel: the spec's kind, or the raw format.
std::string KindOf(const ResolvedRequest& r) {
  if (r.raw != nullptr) return "raw";
  return r.id.normalized.backward() ? "attention_bwd" : "attention";
}

// "key=... arch=... queue=... kind=...": the part every compile line shares.
std::string CompileFields(const ResolvedRequest& r) {
  return absl::StrCat("key=", KeyPrefix(r.id.key), " arch=", r.id.arch, " queue=", r.queue,
                      " kind=", KindOf(r));
}

}  // namespace

KernelBackend::KernelBackend(BackendDeps deps) : deps_(std::move(deps)) {
  if (deps_.devices != nullptr && deps_.devices->Availability().ok() &&
      !deps_.config.compile_only()) {
    devices_ = deps_.devices->List();
  }
  MetricsRegistry& m = *deps_.metrics;
  requests_ = m.GetCounter("kcache_requests_total", "GetKernel requests");
  hits_ = m.GetCounter("kcache_hits_total", "Requests answered from the store");
  misses_ = m.GetCounter("kcache_misses_total", "Requests that waited for a compile");
  compiles_ = m.GetCounter("kcache_compiles_total", "Compiles run (successful or not)");
  compile_failures_ = m.GetCounter("kcache_compile_failures_total", "Compiles that failed");
  invalid_ = m.GetCounter("kcache_invalid_requests_total", "Requests refused as invalid");
  numeric_failures_ = m.GetCounter("kcache_numeric_check_failures_total",
                                   "Kernels refused by the numeric check before serve");
  numeric_check_seconds_ =
      m.GetHistogram("kcache_numeric_check_seconds",
                     "Numeric check per new kernel (reference compile, runs, comparison)",
                     {0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16});
  compile_seconds_ = m.GetHistogram("kcache_compile_seconds", "Compile + verify + publish time",
                                    {0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128});
  const char* outcomes[] = {"hit", "compiled", "waited", "failed"};
  for (int i = 0; i < 4; ++i) {
    request_seconds_[i] =
        m.GetHistogram("kcache_get_kernel_seconds",
                       "GetKernel and GetKernelStream latency, from arrival to answer, by outcome",
                       {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                        10, 30, 60, 120, 300, 600},
                       absl::StrCat("outcome=\"", outcomes[i], "\""));
  }
}

void KernelBackend::ObserveRequest(Outcome outcome, absl::Duration latency) {
  request_seconds_[static_cast<int>(outcome)]->Observe(absl::ToDoubleSeconds(latency));
}

absl::StatusOr<ResolvedRequest> KernelBackend::Resolve(const v1::GetKernelRequest& request) const {
  if (request.has_spec() && request.has_raw()) {
    return absl::InvalidArgumentError("spec and raw: set one of them, not both");
  }
  if (request.has_raw()) {
    if (!deps_.raw_toolchain_status.ok()) {
      return absl::Status(absl::IsFailedPrecondition(deps_.raw_toolchain_status)
                              ? absl::StatusCode::kFailedPrecondition
                              : absl::StatusCode::kUnavailable,
                          absl::StrCat("this daemon cannot compile raw kernels: ",
                                       deps_.raw_toolchain_status.message()));
    }
  } else if (!deps_.toolchain_status.ok()) {
    // Not UNAVAILABLE: retrying does not help until an operator installs
    // NVRTC (or fixes --nvrtc_path) and restarts the daemon.
    return absl::FailedPreconditionError(
        absl::StrCat("this daemon cannot compile: ", deps_.toolchain_status.message()));
  }
  if (!request.has_spec() && !request.has_raw()) {
    return absl::InvalidArgumentError("spec: missing (or give raw)");
  }
  ResolvedRequest r;
  const v1::Target& t = request.target();
  std::string arch;
  switch (t.where_case()) {
    case v1::Target::kDevice: {
      auto it = std::find_if(devices_.begin(), devices_.end(),
                             [&](const DeviceInfo& d) { return d.ordinal == t.device(); });
      if (it == devices_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("target.device: no device ", t.device(), " on this node (",
                         devices_.empty() ? std::string("compile-only mode: give target.arch")
                                          : absl::StrCat(devices_.size(), " devices"),
                         ")"));
      }
      arch = TargetArchForCapability(it->cc_major, it->cc_minor);
      r.device = it->ordinal;
      break;
    }
    case v1::Target::kArch:
      arch = t.arch();
      break;
    case v1::Target::WHERE_NOT_SET:
      return absl::InvalidArgumentError("target: set arch (e.g. \"sm_90a\") or device");
  }
  if (request.has_raw()) {
    auto raw =
        ResolveRaw(request.raw(), arch, deps_.raw_toolchain, deps_.config.max_raw_kernel_names());
    if (!raw.ok()) return raw.status();
    r.id.arch = raw->arch;
    r.id.key = raw->key;
    r.raw = std::make_shared<const RawIdentity>(*std::move(raw));
  } else {
    AttentionLimits limits;
    limits.max_expr_nodes = static_cast<int>(deps_.config.max_expr_nodes());
    limits.max_expr_depth = static_cast<int>(deps_.config.max_expr_depth());
    auto id = ResolveAttention(request.spec(), arch, deps_.toolchain, limits);
    if (!id.ok()) return id.status();
    r.id = *std::move(id);
  }
  if (r.device < 0) {
    // By arch: spread keys over the devices that can verify that arch (by
    // key, so one key always lands on one queue); none = compile-only.
    std::vector<int> able;
    for (const DeviceInfo& d : devices_) {
      if (CanVerifyArch(d, r.id.arch)) able.push_back(d.ordinal);
    }
    if (!able.empty()) r.device = able[absl::HashOf(r.id.key) % able.size()];
  }
  r.queue = r.device >= 0 ? absl::StrCat("gpu", r.device) : r.id.arch;
  return r;
}

CompileResult KernelBackend::Compile(const ResolvedRequest& r, absl::Time compile_deadline,
                                     const ReportFn& report, std::atomic<bool>* compiled) {
  auto existing = deps_.store->Lookup(r.id.key);
  if (existing.ok() && *existing != nullptr) return *std::move(existing);
  // Remote tier: another node's result, or the fleet lease to compile (held
  // until after the publish below), or neither (compile alone). Waiting for
  // another node uses at most half of the time left, to leave time to compile.
  std::unique_ptr<SharedTier::Lease> lease;
  if (deps_.remote != nullptr) {
    absl::Time now = absl::Now();
    EntryRef e = FetchOrClaim(*deps_.remote, *deps_.store, r.id.key,
                              now + (compile_deadline - now) / 2, &lease);
    if (e != nullptr) {
      LOG(INFO) << "compile " << CompileFields(r)
                << " outcome=remote duration=" << LogSeconds(absl::Now() - now)
                << " (another node's compile, from the shared tier)";
      return e;
    }
  }
  const absl::Time start = absl::Now();
  if (compiled != nullptr) compiled->store(true);
  compiles_->Inc();
  VLOG(1) << "compile " << CompileFields(r) << " started";
  auto fail = [&](absl::Status st) -> CompileResult {
    compile_failures_->Inc();
    LOG(WARNING) << "compile " << CompileFields(r)
                 << " outcome=failed duration=" << LogSeconds(absl::Now() - start)
                 << " code=" << absl::StatusCodeToString(st.code())
                 << " error=" << LogQuote(st.message());
    return st;
  };
  auto build = r.raw != nullptr
                   ? BuildRaw(*r.raw, deps_.raw_toolchain, *deps_.compiler, compile_deadline)
                   : BuildAttention(r.id, deps_.toolchain, *deps_.compiler, compile_deadline);
  if (!build.ok()) return fail(build.status());
  if (r.device >= 0) {
    report(Phase::kVerifying);
    auto v = deps_.devices->Verify(r.device, r.id.arch, build->cubin, build->requirements);
    if (!v.ok()) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("verification on device ", r.device, " failed: ", v.status().message())));
    }
    ApplyVerification(*v, *build);
    if (r.raw == nullptr && deps_.numeric_runner != nullptr) {
      auto check = CheckAttentionNumerics(*build, *deps_.compiler, *deps_.numeric_runner, r.device,
                                          compile_deadline);
      if (!check.ok()) {
        // Not published: every waiter gets this error, and the next request
        // for the key compiles again.
        numeric_failures_->Inc();
        return fail(check.status());
      }
      numeric_check_seconds_->Observe(check->check_time_us() / 1e6);
      *build->record.mutable_numeric_check() = *std::move(check);
    }
  }
  if (build->record.numeric_check().state() != v1::NUMERIC_CHECK_PASSED) {
    build->record.mutable_numeric_check()->set_state(v1::NUMERIC_CHECK_UNCHECKED);
  }
  auto entry = deps_.store->Publish(std::move(build->record), std::move(build->cubin));
  if (!entry.ok()) return fail(entry.status());
  const absl::Duration took = absl::Now() - start;
  compile_seconds_->Observe(absl::ToDoubleSeconds(took));
  LOG(INFO) << "compile " << CompileFields(r) << " outcome=compiled duration=" << LogSeconds(took)
            << " cubin_bytes=" << (*entry)->cubin.size()
            << " verified=" << ((*entry)->record.verified() ? "yes" : "no");
  if (deps_.remote != nullptr) deps_.remote->Publish(**entry);
  return *std::move(entry);
}

JobFn KernelBackend::MakeJob(std::shared_ptr<const ResolvedRequest> r, absl::Time compile_deadline,
                             std::shared_ptr<std::atomic<bool>> compiled) {
  return [this, r = std::move(r), compile_deadline,
          compiled = std::move(compiled)](const ReportFn& report) {
    return Compile(*r, compile_deadline, report, compiled.get());
  };
}

absl::StatusOr<KernelBackend::Pending> KernelBackend::Begin(const v1::GetKernelRequest& request,
                                                            absl::Time deadline,
                                                            ProgressFn progress) {
  requests_->Inc();
  auto r = Resolve(request);
  if (!r.ok()) {
    invalid_->Inc();
    return r.status();
  }
  auto hit = deps_.store->Lookup(r->id.key);
  if (!hit.ok()) return hit.status();
  Pending pending;
  if (*hit != nullptr) {
    hits_->Inc();
    pending.answer.entry = *std::move(hit);
    pending.answer.hit = true;
    return pending;
  }
  misses_->Inc();
  // A started compile runs to completion even if every waiter leaves, so
  // bound it by the server's own limit as well as this request's deadline.
  absl::Time cap = absl::Now() + absl::Milliseconds(deps_.config.default_deadline_ms());
  auto shared = std::make_shared<const ResolvedRequest>(*std::move(r));
  Request sreq;
  sreq.key = shared->id.key;
  sreq.queue = shared->queue;
  sreq.priority = Priority::kInteractive;
  sreq.deadline = deadline;
  auto compiled = std::make_shared<std::atomic<bool>>(false);
  pending.compiled_here = compiled;
  sreq.job = MakeJob(shared, std::min(deadline, cap), compiled);
  sreq.progress = std::move(progress);
  auto ticket = deps_.scheduler->Submit(std::move(sreq));
  if (!ticket.ok()) return ticket.status();
  pending.ticket = *std::move(ticket);
  return pending;
}

absl::StatusOr<KernelAnswer> KernelBackend::Answer(CompileResult result) {
  if (!result.ok()) return result.status();
  KernelAnswer answer;
  answer.entry = *std::move(result);
  return answer;
}

v1::PrefetchResponse KernelBackend::Prefetch(const v1::PrefetchRequest& request) {
  v1::PrefetchResponse resp;
  for (int i = 0; i < request.requests_size(); ++i) {
    v1::PrefetchResult* out = resp.add_results();
    auto r = Resolve(request.requests(i));
    if (!r.ok()) {
      out->set_state(v1::PrefetchResult::STATE_REJECTED);
      out->set_error(absl::StrCat("requests[", i, "].", r.status().message()));
      continue;
    }
    out->set_key(r->id.key);
    auto hit = deps_.store->Lookup(r->id.key);
    if (hit.ok() && *hit != nullptr) {
      out->set_state(v1::PrefetchResult::STATE_CACHED);
      continue;
    }
    auto shared = std::make_shared<const ResolvedRequest>(*std::move(r));
    Request sreq;
    sreq.key = shared->id.key;
    sreq.queue = shared->queue;
    sreq.priority = Priority::kPrefetch;
    sreq.job =
        MakeJob(shared, absl::Now() + absl::Milliseconds(deps_.config.default_deadline_ms()));
    absl::Status st = deps_.scheduler->SubmitPrefetch(std::move(sreq));
    if (st.ok()) {
      out->set_state(v1::PrefetchResult::STATE_QUEUED);
    } else {
      out->set_state(v1::PrefetchResult::STATE_REJECTED);
      out->set_error(std::string(st.message()));
    }
  }
  return resp;
}

void KernelBackend::FillCounters(v1::StatsResponse* s) const {
  s->set_requests(requests_->Value());
  s->set_hits(hits_->Value());
  s->set_misses(misses_->Value());
  s->set_compiles(compiles_->Value());
  s->set_compile_failures(compile_failures_->Value());
  for (const QueueStats& q : deps_.scheduler->Stats()) {
    auto* qs = s->add_queues();
    qs->set_name(q.name);
    qs->set_depth(static_cast<uint32_t>(q.depth));
    qs->set_busy(q.busy);
  }
  *s->mutable_toolchain() = deps_.toolchain;
  if (deps_.raw_toolchain_status.ok()) *s->mutable_raw_toolchain() = deps_.raw_toolchain;
  for (const DeviceInfo& d : devices_) {
    s->add_devices(absl::StrCat(d.ordinal, ": ", d.name, " (", d.arch, ", ", d.sm_count, " SMs)"));
  }
  s->set_compile_only(devices_.empty());
  if (deps_.remote != nullptr) deps_.remote->FillStats(s->mutable_remote());
}

}  // namespace kcache
