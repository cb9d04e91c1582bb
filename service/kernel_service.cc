#include "service/kernel_service.h"

#include <deque>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "service/admin_token.h"
#include "service/grpc_status.h"

namespace kcache {

namespace {

absl::Status AbandonedAtShutdown() {
  return absl::UnavailableError("kcached is shutting down; its compile was abandoned, retry");
}

void FillResponse(const KernelAnswer& a, v1::GetKernelResponse* resp) {
  *resp->mutable_record() = a.record();
  resp->set_cubin(a.cubin());
  resp->set_cache_hit(a.hit);
}

// A serialized GetKernelResponse in two slices: every field but the cubin,
// serialized by protobuf, then the cubin field (tag, length) and its bytes,
// which stay in the answer's shared, immutable entry until gRPC has sent
// them. Protobuf parsers accept fields in any order, so this parses as the
// same message; a field added to GetKernelResponse later is covered too.
void FillRawResponse(const KernelAnswer& a, grpc::ByteBuffer* out) {
  v1::GetKernelResponse rest;
  *rest.mutable_record() = a.record();
  rest.set_cache_hit(a.hit);
  std::string head = rest.SerializeAsString();
  const std::string& cubin = a.cubin();
  if (cubin.empty()) {  // proto3 leaves an empty bytes field out
    grpc::Slice s(head);
    *out = grpc::ByteBuffer(&s, 1);
    return;
  }
  constexpr uint8_t kCubinTag = (v1::GetKernelResponse::kCubinFieldNumber << 3) | 2;
  head.push_back(static_cast<char>(kCubinTag));
  for (uint64_t n = cubin.size();; n >>= 7) {  // varint length
    if (n < 0x80) {
      head.push_back(static_cast<char>(n));
      break;
    }
    head.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  auto* keep = new KernelAnswer(a);  // holds the entry; freed with the slice
  grpc::Slice slices[2] = {grpc::Slice(head),
                           grpc::Slice(
                               const_cast<char*>(cubin.data()), cubin.size(),
                               [](void* p) { delete static_cast<KernelAnswer*>(p); }, keep)};
  *out = grpc::ByteBuffer(slices, 2);
}

// The bytes of a received message in one piece.
std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!b.Dump(&slices).ok()) return out;
  out.reserve(b.Length());
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer Serialized(const google::protobuf::Message& m) {
  grpc::Slice s(m.SerializeAsString());
  return grpc::ByteBuffer(&s, 1);
}

v1::Progress ToProto(const ProgressEvent& e) {
  v1::Progress p;
  p.set_phase(ToProtoPhase(e.phase));
  p.set_queue_position(static_cast<uint32_t>(e.queue_position));
  p.set_queue(e.queue);
  return p;
}

// One GetKernel / GetKernelStream call's part in kcache_get_kernel_seconds:
// when it arrived, and (for a call that waits) whether its own job compiled.
struct CallTiming {
  KernelBackend* backend;
  absl::Time start;
  std::shared_ptr<const std::atomic<bool>> compiled_here;  // null: no wait

  void Observe(KernelBackend::Outcome o) const { backend->ObserveRequest(o, absl::Now() - start); }
  // For a waiting call's outcome.
  void ObserveWait(bool ok) const {
    Observe(!ok                                                 ? KernelBackend::Outcome::kFailed
            : compiled_here != nullptr && compiled_here->load() ? KernelBackend::Outcome::kCompiled
                                                                : KernelBackend::Outcome::kWaited);
  }
};

}  // namespace

v1::Progress::Phase ToProtoPhase(Phase phase) {
  // Each value by name: the two enums are numbered independently (the proto
  // starts with PHASE_UNSPECIFIED), and -Wswitch names a Phase left out here.
  switch (phase) {
    case Phase::kQueued:
      return v1::Progress::PHASE_QUEUED;
    case Phase::kCompiling:
      return v1::Progress::PHASE_COMPILING;
    case Phase::kVerifying:
      return v1::Progress::PHASE_VERIFYING;
    case Phase::kDone:
      return v1::Progress::PHASE_DONE;
    case Phase::kFailed:
      return v1::Progress::PHASE_FAILED;
  }
  return v1::Progress::PHASE_UNSPECIFIED;
}

absl::Status KernelServiceImpl::Admit(grpc::CallbackServerContext* ctx,
                                      const v1::GetKernelRequest& req) const {
  if (state_->shutting_down.load()) return absl::UnavailableError("kcached is shutting down");
  if (req.spec().ByteSizeLong() > max_spec_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", req.spec().ByteSizeLong(),
                                                   " bytes, over the limit of ", max_spec_bytes_));
  }
  if (req.has_raw()) return AdmitRaw(ctx, req, "raw");
  return absl::OkStatus();
}

absl::Status KernelServiceImpl::AdmitRaw(grpc::CallbackServerContext* ctx,
                                         const v1::GetKernelRequest& req,
                                         const std::string& field) const {
  if (!raw_.enabled) {
    return absl::FailedPreconditionError(absl::StrCat(
        field,
        ": raw kernels (LLVM IR / PTX) are disabled on this daemon; an operator can enable "
        "them with --enable_raw_kernels (admin-token only)"));
  }
  if (!raw_.token_accepted_here) {
    return absl::PermissionDeniedError(absl::StrCat(
        field,
        ": raw kernels are accepted only where admin calls are (the Unix socket, or TCP "
        "with TLS); the admin token is not accepted over plaintext TCP"));
  }
  if (!CarriesAdminToken(ctx->client_metadata(), raw_.token)) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": raw kernels need the admin token (metadata \"authorization: Bearer <token>\")"));
  }
  if (req.raw().source().size() > raw_.max_source_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".source: ", req.raw().source().size(), " bytes, over the limit of ",
                     raw_.max_source_bytes, " (max_raw_source_bytes)"));
  }
  return absl::OkStatus();
}

absl::Time KernelServiceImpl::DeadlineOf(grpc::ServerContextBase* ctx) const {
  absl::Time d = absl::FromChrono(ctx->deadline());
  absl::Time cap = absl::Now() + default_deadline_;
  return d < cap ? d : cap;  // no deadline from the client = far future
}

// The part of a call that waits for a compile, shared by GetKernel's and
// GetKernelStream's reactors (one member each): it owns the call's Ticket, and
// is in Waiting::calls from Start until the reactor's OnDone calls Leave, so
// that AbandonWaits can reach it. The ticket's DoneFn (the reactor's answer)
// runs on whichever thread ends the wait: a compile thread, the scheduler's
// deadline thread, Shutdown's caller, or the thread that cancels it (OnCancel
// or AbandonWaits).
// Lock order: Waiting::mu before TicketWait::mu_.
class KernelServiceImpl::TicketWait {
 public:
  explicit TicketWait(std::shared_ptr<Waiting> waiting) : waiting_(std::move(waiting)) {}

  // Joins the waiting set and hands `ticket` the DoneFn, which may run here
  // when the outcome is already known or the waits are already abandoned.
  // Call once, before the reactor is returned to gRPC (so that its OnDone,
  // and Leave, cannot come before this returns).
  void Start(std::unique_ptr<Ticket> ticket, DoneFn done) {
    std::shared_ptr<Ticket> t = std::move(ticket);
    bool abandoned = false;
    {
      absl::MutexLock lock(&waiting_->mu);
      {
        absl::MutexLock own(&mu_);
        ticket_ = t;
      }
      waiting_->calls.insert(this);
      abandoned = waiting_->abandoned;
      if (abandoned) MarkStopped(kShutdown);
    }
    t->OnDone(std::move(done));
    if (abandoned) t->Cancel();
  }

  // The client went away (or the server is cancelling its calls): from the
  // reactor's OnCancel. Runs the DoneFn here unless already answered.
  void ClientGone() {
    std::shared_ptr<Ticket> ticket = CurrentTicket();
    MarkStopped(kClientGone);
    if (ticket != nullptr) ticket->Cancel();
  }

  // For AbandonWaits, which holds Waiting::mu (so the call cannot end
  // meanwhile): the ticket to cancel, or null when the call is ending.
  std::shared_ptr<Ticket> Abandon() {
    MarkStopped(kShutdown);
    return CurrentTicket();
  }

  // From the reactor's OnDone: releases the ticket (it touches the scheduler),
  // then leaves the set, after which the service (and then the scheduler)
  // may be destroyed.
  void Leave() {
    std::shared_ptr<Ticket> ticket;
    {
      absl::MutexLock lock(&mu_);
      ticket = std::move(ticket_);
    }
    ticket.reset();  // AbandonWaits may still hold it; the answer is given
    absl::MutexLock lock(&waiting_->mu);
    waiting_->calls.erase(this);
  }

  // The status for an outcome that this side caused by cancelling the
  // ticket (client gone, or shutdown), or nullopt for any other outcome.
  std::optional<grpc::Status> Stopped(grpc::ServerContextBase* ctx,
                                      const CompileResult& result) const {
    if (!absl::IsCancelled(result.status())) return std::nullopt;
    switch (why_.load()) {
      case kShutdown:
        return Reply(ctx, AbandonedAtShutdown());
      case kClientGone:
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      default:
        return std::nullopt;
    }
  }

 private:
  // Why this side cancelled the ticket; the first reason wins.
  enum Why : int { kNone, kClientGone, kShutdown };
  std::shared_ptr<Ticket> CurrentTicket() {
    absl::MutexLock lock(&mu_);
    return ticket_;
  }
  void MarkStopped(Why why) {
    int none = kNone;
    why_.compare_exchange_strong(none, why);
  }

  const std::shared_ptr<Waiting> waiting_;
  absl::Mutex mu_;
  std::shared_ptr<Ticket> ticket_ ABSL_GUARDED_BY(mu_);  // null before Start, and once ending
  std::atomic<int> why_{kNone};
};

// One GetKernel call waiting for a compile. gRPC deletes it through OnDone,
// which comes after Finish, which only the ticket's DoneFn calls.
class KernelServiceImpl::WaitingCall final : public grpc::ServerUnaryReactor {
 public:
  WaitingCall(grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp,
              std::shared_ptr<Waiting> waiting, CallTiming timing)
      : ctx_(ctx), resp_(resp), wait_(std::move(waiting)), timing_(std::move(timing)) {}

  void Start(std::unique_ptr<Ticket> ticket) {
    wait_.Start(std::move(ticket), [this](CompileResult r) { Answer(std::move(r)); });
  }
  void OnCancel() override { wait_.ClientGone(); }
  void OnDone() override {
    wait_.Leave();
    delete this;
  }

 private:
  // The ticket's DoneFn: the only caller of Finish, and its last touch of
  // this object (gRPC may run OnDone as soon as Finish is called).
  void Answer(CompileResult result) {
    grpc::Status status;
    if (auto stopped = wait_.Stopped(ctx_, result)) {
      status = *std::move(stopped);
    } else if (auto answer = KernelBackend::Answer(std::move(result)); answer.ok()) {
      FillRawResponse(*answer, resp_);
    } else {
      status = Reply(ctx_, answer.status());
    }
    timing_.ObserveWait(status.ok());
    Finish(status);
  }

  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const resp_;
  TicketWait wait_;
  const CallTiming timing_;
};

// One GetKernelStream call. Events come from the scheduler (progress, then
// the outcome) on its threads, or from the handler (a hit, a refusal); they
// are queued here and written one at a time, by whichever thread finds no
// write in flight: the one that queued an event, or gRPC's OnWriteDone. Once
// the queue is empty and the outcome is known, that thread calls Finish. No
// lock is held while calling into gRPC (a write may complete, and its
// OnWriteDone run, inside StartWrite), and neither StartWrite nor Finish is
// followed by a touch of this object: OnDone may delete it as soon as the
// last one is called.
class KernelServiceImpl::StreamingCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  StreamingCall(grpc::CallbackServerContext* ctx, std::shared_ptr<Waiting> waiting,
                CallTiming timing)
      : ctx_(ctx), wait_(std::move(waiting)), timing_(std::move(timing)) {}

  // Before Start: the flag of the job this call waits for.
  void SetCompiledHere(std::shared_ptr<const std::atomic<bool>> flag) {
    timing_.compiled_here = std::move(flag);
  }

  // The scheduler's ProgressFn for this call (see Ticket: its calls never
  // overlap each other or the DoneFn, and stop once the ticket is released).
  ProgressFn Progress() {
    return [this](const ProgressEvent& e) {
      // The final event travels as the result (or the status).
      if (e.phase == Phase::kDone || e.phase == Phase::kFailed) return;
      v1::GetKernelEvent ev;
      *ev.mutable_progress() = ToProto(e);
      Push(ev);
    };
  }

  // Waits for the compile (the outcome comes through the ticket's DoneFn).
  void Start(std::unique_ptr<Ticket> ticket) {
    wait_.Start(std::move(ticket), [this](CompileResult r) { Answer(std::move(r)); });
  }

  // Answered without a compile: from the store, or refused.
  void Result(const KernelAnswer& answer) {
    timing_.Observe(KernelBackend::Outcome::kHit);
    Conclude(ResultEvent(answer), grpc::Status::OK);
  }
  void Refuse(const absl::Status& st) {
    timing_.Observe(KernelBackend::Outcome::kFailed);
    Conclude(std::nullopt, Reply(ctx_, st));
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) broken_ = true;  // the stream is gone: write no more
    }
    Pump();
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
    }
    // Answers through the DoneFn (CANCELLED), which finishes the call once
    // a write in flight, if any, is done.
    wait_.ClientGone();
  }
  void OnDone() override {
    wait_.Leave();
    delete this;
  }

 private:
  static v1::GetKernelEvent ResultEvent(const KernelAnswer& answer) {
    v1::GetKernelEvent ev;
    FillResponse(answer, ev.mutable_result());
    return ev;
  }

  // The ticket's DoneFn.
  void Answer(CompileResult result) {
    if (auto stopped = wait_.Stopped(ctx_, result)) {
      timing_.ObserveWait(false);
      Conclude(std::nullopt, *std::move(stopped));
    } else if (auto answer = KernelBackend::Answer(std::move(result)); answer.ok()) {
      timing_.ObserveWait(true);
      Conclude(ResultEvent(*answer), grpc::Status::OK);
    } else {
      timing_.ObserveWait(false);
      Conclude(std::nullopt, Reply(ctx_, answer.status()));
    }
  }

  void Push(const v1::GetKernelEvent& ev) {
    grpc::ByteBuffer bytes = Serialized(ev);
    {
      absl::MutexLock lock(&mu_);
      if (status_.has_value()) return;  // nothing after the outcome
      queue_.push_back(std::move(bytes));
    }
    Pump();
  }
  // The outcome: a last event (the result) if any, then `status`. Once.
  void Conclude(const std::optional<v1::GetKernelEvent>& last, grpc::Status status) {
    std::optional<grpc::ByteBuffer> bytes;
    if (last.has_value()) bytes = Serialized(*last);
    {
      absl::MutexLock lock(&mu_);
      if (status_.has_value()) return;
      if (bytes.has_value()) queue_.push_back(*std::move(bytes));
      status_ = std::move(status);
    }
    Pump();
  }

  // Starts the next write, or Finish when nothing is left to write and the
  // outcome is known. Its call into gRPC is its last touch of this object.
  void Pump() {
    bool write = false;
    grpc::Status finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!queue_.empty() && !broken_) {
        current_.Swap(&queue_.front());  // ByteBuffer has no move: swap, not copy
        queue_.pop_front();
        writing_ = true;
        write = true;
      } else if (status_.has_value()) {
        finished_ = true;
        finish = *status_;
      } else {
        return;
      }
    }
    // current_ stays this write's until its OnWriteDone (writing_).
    if (write) {
      StartWrite(&current_);
    } else {
      Finish(std::move(finish));
    }
  }

  grpc::CallbackServerContext* const ctx_;
  TicketWait wait_;
  CallTiming timing_;  // compiled_here set before Start, then only read
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);  // serialized, not yet written
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);  // the outcome, once known
  bool writing_ ABSL_GUARDED_BY(mu_) = false;                // a StartWrite awaits its OnWriteDone
  bool finished_ ABSL_GUARDED_BY(mu_) = false;               // Finish was called
  bool broken_ ABSL_GUARDED_BY(mu_) = false;                 // cancelled or a write failed
  grpc::ByteBuffer current_;                                 // the write in flight
};

KernelServiceImpl::~KernelServiceImpl() {
  absl::MutexLock lock(&waiting_->mu);
  const Waiting& w = *waiting_;
  auto none = [&w]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) { return w.calls.empty(); };
  waiting_->mu.Await(absl::Condition(&none));
}

void KernelServiceImpl::AbandonWaits() {
  std::vector<std::shared_ptr<Ticket>> tickets;
  {
    absl::MutexLock lock(&waiting_->mu);
    waiting_->abandoned = true;
    for (TicketWait* call : waiting_->calls) {
      if (auto t = call->Abandon(); t != nullptr) tickets.push_back(std::move(t));
    }
  }
  // Each runs its call's DoneFn (the answer) here, unless already answered.
  for (const auto& t : tickets) t->Cancel();
}

void KernelServiceImpl::AwaitWaitingCalls(int n) const {
  absl::MutexLock lock(&waiting_->mu);
  const Waiting& w = *waiting_;
  auto reached = [&w, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) {
    return static_cast<int>(w.calls.size()) == n;
  };
  waiting_->mu.Await(absl::Condition(&reached));
}

grpc::ServerUnaryReactor* KernelServiceImpl::GetKernel(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* resp) {
  CallTiming timing{backend_, absl::Now(), nullptr};
  // Answered on this thread (a hit or a refusal): gRPC's default reactor.
  auto answer_now = [ctx, &timing](const grpc::Status& status) {
    timing.Observe(status.ok() ? KernelBackend::Outcome::kHit : KernelBackend::Outcome::kFailed);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  };
  absl::StatusOr<v1::GetKernelRequest> req = ParseRequest(*request);
  if (!req.ok()) return answer_now(Reply(ctx, req.status()));
  if (absl::Status st = Admit(ctx, *req); !st.ok()) return answer_now(Reply(ctx, st));
  auto pending = backend_->Begin(*req, DeadlineOf(ctx));
  if (!pending.ok()) return answer_now(Reply(ctx, pending.status()));
  if (pending->ticket == nullptr) {
    FillRawResponse(pending->answer, resp);
    return answer_now(grpc::Status::OK);
  }
  // A miss waits for its compile (seconds to minutes) without a thread: the
  // scheduler finishes the call when the wait ends.
  timing.compiled_here = pending->compiled_here;
  auto* call = new WaitingCall(ctx, resp, waiting_, timing);
  call->Start(std::move(pending->ticket));
  return call;
}

absl::StatusOr<v1::GetKernelRequest> KernelServiceImpl::ParseRequest(
    const grpc::ByteBuffer& request) const {
  // Refused before its bytes are copied, let alone parsed.
  if (request.Length() > limits_.max_request_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: ", request.Length(), " bytes, over this daemon's limit of ",
                     limits_.max_request_bytes, " bytes per GetKernelRequest"));
  }
  return ParseGetKernelRequest(Flatten(request), limits_);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KernelServiceImpl::GetKernelStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  auto* call = new StreamingCall(ctx, waiting_, CallTiming{backend_, absl::Now(), nullptr});
  absl::StatusOr<v1::GetKernelRequest> req = ParseRequest(*request);
  if (!req.ok()) {
    call->Refuse(req.status());
    return call;
  }
  if (absl::Status st = Admit(ctx, *req); !st.ok()) {
    call->Refuse(st);
    return call;
  }
  // The first progress event (queued or compiling) is written from here,
  // inside Begin; later ones from the scheduler's threads.
  auto pending = backend_->Begin(*req, DeadlineOf(ctx), call->Progress());
  if (!pending.ok()) {
    call->Refuse(pending.status());
  } else if (pending->ticket == nullptr) {
    call->Result(pending->answer);
  } else {
    // Like GetKernel, a miss waits without a thread.
    call->SetCompiledHere(pending->compiled_here);
    call->Start(std::move(pending->ticket));
  }
  return call;
}

grpc::ServerUnaryReactor* KernelServiceImpl::Prefetch(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto answer = [&]() -> absl::Status {
    if (state_->shutting_down.load()) return absl::UnavailableError("kcached is shutting down");
    // The transport has bounded the bytes (max_message_bytes); the entries
    // and their fields are bounded before the parse.
    absl::StatusOr<v1::PrefetchRequest> req = ParsePrefetchRequest(Flatten(*request), limits_);
    if (!req.ok()) return req.status();
    for (int i = 0; i < req->requests_size(); ++i) {
      if (req->requests(i).spec().ByteSizeLong() > max_spec_bytes_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "requests[", i, "].spec: over the size limit of ", max_spec_bytes_, " bytes"));
      }
      if (req->requests(i).has_raw()) {
        if (absl::Status st =
                AdmitRaw(ctx, req->requests(i), absl::StrCat("requests[", i, "].raw"));
            !st.ok()) {
          return st;
        }
      }
    }
    *response = Serialized(backend_->Prefetch(*req));
    return absl::OkStatus();
  };
  reactor->Finish(Reply(ctx, answer()));
  return reactor;
}

}  // namespace kcache
