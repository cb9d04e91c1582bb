#include "service/kernel_backend.h"

#include <algorithm>
#include <map>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "compiler/attention/codegen.h"
#include "compiler/attention/spec_canonical.h"
#include "compiler/attention/spec_normalize.h"
#include "compiler/attention/spec_validate.h"
#include "compiler/resources.h"
#include "kernels/attention_params.h"
#include "kernels/embedded.h"

namespace kcache {

namespace {

// Every template file, as NVRTC headers. Built once: the templates are
// immutable data in the binary.
const std::map<std::string, std::string>& TemplateHeaders() {
  static const auto* headers = [] {
    auto* m = new std::map<std::string, std::string>;
    for (const auto& f : kernels::TemplateFiles()) {
      (*m)[std::string(f.name)] = std::string(f.contents);
    }
    return m;
  }();
  return *headers;
}

// The target architecture a device gets: the arch-specific variant on
// Hopper and later (needed for wgmma; the cubin is loaded on exactly that
// device kind), the plain one before.
std::string DeviceTargetArch(const DeviceInfo& d) {
  return d.cc_major >= 9 ? absl::StrCat(d.arch, "a") : d.arch;
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
  compile_seconds_ = m.GetHistogram("kcache_compile_seconds", "Compile + verify + publish time",
                                    {0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128});
}

absl::StatusOr<ResolvedRequest> KernelBackend::Resolve(const v1::GetKernelRequest& request) const {
  if (!deps_.toolchain_status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("this daemon cannot compile: ", deps_.toolchain_status.message()));
  }
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: missing");
  attention::Limits limits;
  limits.max_expr_nodes = static_cast<int>(deps_.config.max_expr_nodes());
  limits.max_expr_depth = static_cast<int>(deps_.config.max_expr_depth());
  if (absl::Status st = attention::ValidateAttentionSpec(request.spec(), limits); !st.ok()) {
    return st;
  }
  ResolvedRequest r;
  const v1::Target& t = request.target();
  switch (t.where_case()) {
    case v1::Target::kDevice: {
      auto it = std::find_if(devices_.begin(), devices_.end(),
                             [&](const DeviceInfo& d) { return d.ordinal == t.device(); });
      if (it == devices_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "target.device: no device ", t.device(), " on this node (",
            devices_.empty() ? std::string("compile-only mode: give target.arch")
                             : absl::StrCat(devices_.size(), " devices"),
            ")"));
      }
      r.arch = DeviceTargetArch(*it);
      r.device = it->ordinal;
      break;
    }
    case v1::Target::kArch: {
      auto parsed = attention::ParseAttentionArch(t.arch());
      if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("target.arch: ", parsed.status().message()));
      r.arch = t.arch();
      break;
    }
    case v1::Target::WHERE_NOT_SET:
      return absl::InvalidArgumentError("target: set arch (e.g. \"sm_90a\") or device");
  }
  r.normalized = attention::NormalizeAttentionSpec(request.spec());
  r.canonical = attention::CanonicalSpecBytes(r.normalized);
  KeyParts parts;
  parts.spec_canonical = r.canonical;
  std::string digest(kernels::TemplateDigestHex());
  parts.template_digest = digest;
  parts.toolchain = &deps_.toolchain;
  parts.arch = r.arch;
  auto key = ComputeKey(parts);
  if (!key.ok()) return key.status();
  r.key = *std::move(key);
  if (r.device < 0) {
    // By arch: spread keys over the devices that can verify that arch (by
    // key, so one key always lands on one queue); none = compile-only.
    std::vector<int> able;
    for (const DeviceInfo& d : devices_) {
      if (CanVerifyArch(d, r.arch)) able.push_back(d.ordinal);
    }
    if (!able.empty()) r.device = able[absl::HashOf(r.key) % able.size()];
  }
  r.queue = r.device >= 0 ? absl::StrCat("gpu", r.device) : r.arch;
  return r;
}

CompileResult KernelBackend::Compile(const ResolvedRequest& r, absl::Time compile_deadline,
                                     const ReportFn& report) {
  auto existing = deps_.store->Lookup(r.key);
  if (existing.ok() && *existing != nullptr) {
    auto ck = std::make_shared<CompiledKernel>();
    ck->record = (*existing)->record;
    ck->cubin = (*existing)->cubin;
    return std::shared_ptr<const CompiledKernel>(std::move(ck));
  }
  absl::Time start = absl::Now();
  compiles_->Inc();
  auto fail = [&](absl::Status st) -> CompileResult {
    compile_failures_->Inc();
    return st;
  };
  auto gen = attention::GenerateAttentionSource(r.normalized, r.arch);
  if (!gen.ok()) return fail(gen.status());
  CompileInput in;
  in.source = gen->source;
  in.program_name = gen->program_name;
  in.headers = TemplateHeaders();
  in.arch = r.arch;
  auto out = deps_.compiler->Compile(in, compile_deadline);
  if (!out.ok()) return fail(out.status());

  v1::KernelRecord rec;
  rec.set_key(r.key);
  *rec.mutable_toolchain() = deps_.toolchain;
  rec.set_arch(r.arch);
  *rec.mutable_spec() = r.normalized;
  rec.set_template_digest(std::string(kernels::TemplateDigestHex()));
  rec.set_abi_version(kAttentionAbiVersion);
  rec.set_compile_log(out->log);
  rec.set_deterministic_backward(r.normalized.backward() && r.normalized.deterministic());
  std::vector<EntryRequirement> reqs;
  for (const v1::EntryPoint& e : gen->entry_points) {
    v1::EntryPoint* ep = rec.add_entry_points();
    *ep = e;
    for (const KernelReport& k : out->kernels) {
      if (k.name == e.name()) *ep->mutable_resources() = ToResources(k);
    }
    reqs.push_back({e.name(), static_cast<int>(e.dynamic_smem_bytes()),
                    static_cast<int>(e.threads())});
  }
  if (r.device >= 0) {
    report(Phase::kVerifying);
    auto v = deps_.devices->Verify(r.device, r.arch, out->cubin, reqs);
    if (!v.ok()) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("verification on device ", r.device, " failed: ", v.status().message())));
    }
    for (int i = 0; i < rec.entry_points_size(); ++i) {
      auto* ep = rec.mutable_entry_points(i);
      KernelReport k;
      for (const KernelReport& kr : out->kernels) {
        if (kr.name == ep->name()) k = kr;
      }
      *ep->mutable_resources() = ToResources(v->entries[static_cast<size_t>(i)], k);
    }
    rec.set_verified(true);
    rec.set_verified_on(v->device_name);
  }
  rec.set_compile_time_us(static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start)));
  rec.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  auto entry = deps_.store->Publish(std::move(rec), std::move(out->cubin));
  if (!entry.ok()) return fail(entry.status());
  compile_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  auto ck = std::make_shared<CompiledKernel>();
  ck->record = (*entry)->record;
  ck->cubin = (*entry)->cubin;
  return std::shared_ptr<const CompiledKernel>(std::move(ck));
}

JobFn KernelBackend::MakeJob(std::shared_ptr<const ResolvedRequest> r,
                             absl::Time compile_deadline) {
  return [this, r, compile_deadline](const ReportFn& report) {
    return Compile(*r, compile_deadline, report);
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
  auto hit = deps_.store->Lookup(r->key);
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
  sreq.key = shared->key;
  sreq.queue = shared->queue;
  sreq.priority = Priority::kInteractive;
  sreq.deadline = deadline;
  sreq.job = MakeJob(shared, std::min(deadline, cap));
  sreq.progress = std::move(progress);
  auto ticket = deps_.scheduler->Submit(std::move(sreq));
  if (!ticket.ok()) return ticket.status();
  pending.ticket = *std::move(ticket);
  return pending;
}

absl::StatusOr<KernelAnswer> KernelBackend::Answer(CompileResult result) {
  if (!result.ok()) return result.status();
  KernelAnswer answer;
  answer.compiled = *std::move(result);
  return answer;
}

absl::StatusOr<KernelAnswer> KernelBackend::Get(const v1::GetKernelRequest& request,
                                                absl::Time deadline, CancelToken* cancel) {
  auto pending = Begin(request, deadline);
  if (!pending.ok()) return pending.status();
  if (pending->ticket == nullptr) return std::move(pending->answer);
  if (cancel != nullptr) {
    // Poll the token: Ticket::Cancel from another thread would also do, but
    // a token may be cancelled before we get here.
    for (;;) {
      if (cancel->cancelled()) return absl::CancelledError("request cancelled");
      auto r = pending->ticket->WaitUntil(absl::Now() + absl::Milliseconds(50));
      if (r.has_value()) return Answer(*std::move(r));
    }
  }
  return Answer(pending->ticket->Wait());
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
    out->set_key(r->key);
    auto hit = deps_.store->Lookup(r->key);
    if (hit.ok() && *hit != nullptr) {
      out->set_state(v1::PrefetchResult::STATE_CACHED);
      continue;
    }
    auto shared = std::make_shared<const ResolvedRequest>(*std::move(r));
    Request sreq;
    sreq.key = shared->key;
    sreq.queue = shared->queue;
    sreq.priority = Priority::kPrefetch;
    sreq.job = MakeJob(shared, absl::Now() + absl::Milliseconds(deps_.config.default_deadline_ms()));
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
  for (const DeviceInfo& d : devices_) {
    s->add_devices(absl::StrCat(d.ordinal, ": ", d.name, " (", d.arch, ", ", d.sm_count, " SMs)"));
  }
  s->set_compile_only(devices_.empty());
}

}  // namespace kcache
