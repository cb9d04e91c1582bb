// In-process tests of GetKernel and GetKernelStream calls that wait for a
// compile: KernelServiceImpl on a real gRPC server, a real store and
// scheduler, and a fake compiler whose compiles the test releases. Waiting
// calls hold no thread: 500 callers of one uncompiled key share one compile
// without 500 threads; a cancelled call is answered CANCELLED and leaves;
// AbandonWaits (shutdown) answers UNAVAILABLE. Streams also report progress
// before their result, each phase as the wire value of its name.
#include <dirent.h>

#include <atomic>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "compiler/scheduler/scheduler.h"
#include "compiler/toolchain.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"
#include "service/config.h"
#include "service/kernel_backend.h"
#include "service/kernel_service.h"
#include "service/metrics.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::TempDir;

// Threads of this process, from /proc/self/task.
int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// Compiles block until Release(); each returns the same fake cubin, or the
// error set by Fail().
class GatedCompiler final : public Compiler {
 public:
  absl::StatusOr<CompileOutput> Compile(const CompileInput&, absl::Time) override {
    absl::MutexLock lock(&mu_);
    ++compiles_;
    mu_.Await(absl::Condition(&released_));
    if (!failure_.ok()) return failure_;
    CompileOutput out;
    out.cubin = "fake cubin";
    return out;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  void Fail(absl::Status st) {
    absl::MutexLock lock(&mu_);
    failure_ = std::move(st);
  }
  int compiles() {
    absl::MutexLock lock(&mu_);
    return compiles_;
  }
  void AwaitCompiles(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return compiles_ >= n; };
    mu_.Await(absl::Condition(&reached));
  }

 private:
  absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int compiles_ ABSL_GUARDED_BY(mu_) = 0;
};

v1::GetKernelRequest Request(int head_dim = 64) {
  v1::GetKernelRequest req;
  v1::AttentionSpec* spec = req.mutable_spec();
  spec->set_dtype(v1::DTYPE_BF16);
  spec->set_head_dim_qk(head_dim);
  spec->set_num_q_heads(8);
  spec->set_num_kv_heads(8);
  spec->mutable_mask()->mutable_causal();
  req.mutable_target()->set_arch("sm_80");
  return req;
}

// One daemon's kernel path in this process, serving on a Unix socket.
class Fixture {
 public:
  explicit Fixture(absl::Duration default_deadline = absl::Minutes(10)) {
    auto store = Store::Open(dir_.Sub("store"), StoreOptions{});
    if (!store.ok()) std::abort();
    store_ = *std::move(store);
    Scheduler::Options so;
    so.compile_threads = 1;
    scheduler_ = std::make_unique<Scheduler>(so);
    BackendDeps deps;
    deps.store = store_.get();
    deps.scheduler = scheduler_.get();
    deps.compiler = &compiler_;
    deps.toolchain = MakeToolchain("nvrtc", "13.0", "test", {});
    deps.config = DefaultDaemonConfig();
    deps.config.set_default_deadline_ms(absl::ToInt64Milliseconds(default_deadline));
    deps.metrics = &metrics_;
    backend_ = std::make_unique<KernelBackend>(std::move(deps));
    service_ =
        std::make_unique<KernelServiceImpl>(backend_.get(), &state_, 1 << 20, default_deadline);
    grpc::ServerBuilder b;
    target_ = "unix:" + dir_.Sub("sock");
    b.AddListeningPort(target_, grpc::InsecureServerCredentials());
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    if (server_ == nullptr) std::abort();
    channel_ = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
    stub_ = v1::KernelService::NewStub(channel_);
  }
  ~Fixture() {
    compiler_.Release();
    // A compile still running (a test may end while one runs, e.g. after
    // AbandonWaits) publishes through the backend into the store: let it end
    // before those are destroyed, as Daemon::Shutdown does.
    scheduler_->Shutdown(absl::InfiniteDuration()).IgnoreError();
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
    service_.reset();
    backend_.reset();
    scheduler_.reset();
  }

  GatedCompiler& compiler() { return compiler_; }
  Scheduler& scheduler() { return *scheduler_; }
  KernelServiceImpl& service() { return *service_; }
  ServingState& state() { return state_; }
  v1::KernelService::Stub& stub() { return *stub_; }
  // Compiles dropped from the queues because nobody waited for them any more.
  uint64_t DroppedCompiles() {
    uint64_t dropped = 0;
    for (const QueueStats& q : scheduler_->Stats()) dropped += q.dropped;
    return dropped;
  }

 private:
  TempDir dir_;
  GatedCompiler compiler_;
  MetricsRegistry metrics_;
  ServingState state_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<KernelBackend> backend_;
  std::unique_ptr<KernelServiceImpl> service_;
  std::string target_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> stub_;
};

// One GetKernel on gRPC's callback client API (no thread of its own).
struct Call {
  grpc::ClientContext ctx;
  v1::GetKernelRequest req;
  v1::GetKernelResponse resp;
  grpc::Status status;
  absl::Notification done;

  void Start(v1::KernelService::Stub& stub) {
    stub.async()->GetKernel(&ctx, &req, &resp, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
};

// Starts `call` (a Call or a StreamCall) on head dim 128, whose compile then
// holds the fixture's one compile thread, and waits until that compile runs.
template <typename C>
void StartRunningCompile(Fixture& f, C& call) {
  call.req = Request(128);
  call.Start(f.stub());
  f.compiler().AwaitCompiles(1);
}

// After a call waiting on a queued key was cancelled: the server saw it
// (OnCancel) and let go of the wait, so the queued compile, which nobody
// waits for any more, is dropped; then `blocker` (StartRunningCompile's call)
// finishes as the only compile.
void ExpectWaitLeftThenBlockerCompiles(Fixture& f, Call& blocker) {
  f.service().AwaitWaitingCalls(1);
  EXPECT_EQ(f.DroppedCompiles(), 1u);

  f.compiler().Release();
  blocker.done.WaitForNotification();
  EXPECT_TRUE(blocker.status.ok()) << blocker.status.error_message();
  EXPECT_EQ(f.compiler().compiles(), 1);
  f.service().AwaitWaitingCalls(0);
}

TEST(WaitingCallTest, ManyCallsForOneUncompiledKeyShareOneCompileWithoutAThreadEach) {
  constexpr int kCalls = 500;
  Fixture g;
  {
    // Start the channel and the server's threads first, with a request that
    // is refused without a compile.
    Call warm;
    warm.req = Request();
    warm.req.mutable_target()->set_arch("sm_70");
    warm.Start(g.stub());
    warm.done.WaitForNotification();
    ASSERT_EQ(warm.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  const int before = ThreadCount();
  ASSERT_GT(before, 0);

  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::make_unique<Call>());
    calls.back()->req = Request();
    calls.back()->Start(g.stub());
  }
  g.service().AwaitWaitingCalls(kCalls);
  g.compiler().AwaitCompiles(1);
  const int during = ThreadCount();
  // The thread-per-waiter design added one per call here (>= 500). gRPC may
  // grow its own pools a little under the burst; nothing near one a call.
  EXPECT_LT(during - before, kCalls / 5) << before << " threads before, " << during << " during";

  g.compiler().Release();
  for (auto& c : calls) c->done.WaitForNotification();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(calls[i]->status.ok()) << i << ": " << calls[i]->status.error_message();
    EXPECT_EQ(calls[i]->resp.cubin(), "fake cubin");
    EXPECT_FALSE(calls[i]->resp.cache_hit());
    EXPECT_EQ(calls[i]->resp.record().key(), calls[0]->resp.record().key());
  }
  EXPECT_EQ(g.compiler().compiles(), 1);
  g.service().AwaitWaitingCalls(0);
}

TEST(WaitingCallTest, CancelledCallIsAnsweredCancelledAndLeavesItsWait) {
  Fixture f;
  // A running compile of another key keeps the one asked for below queued.
  Call blocker;
  StartRunningCompile(f, blocker);

  Call call;
  call.req = Request(64);
  call.Start(f.stub());
  f.service().AwaitWaitingCalls(2);
  call.ctx.TryCancel();
  call.done.WaitForNotification();
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::CANCELLED);
  ExpectWaitLeftThenBlockerCompiles(f, blocker);
}

TEST(WaitingCallTest, AbandonWaitsAnswersWaitingCallsUnavailableWithTheRetryHint) {
  Fixture f;
  Call running;
  StartRunningCompile(f, running);
  f.service().AwaitWaitingCalls(1);

  f.state().shutting_down.store(true);
  f.service().AbandonWaits();
  running.done.WaitForNotification();
  EXPECT_EQ(running.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(running.status.error_message(), ::testing::HasSubstr("abandoned"));
  const auto& trailers = running.ctx.GetServerTrailingMetadata();
  EXPECT_NE(trailers.find("retry-after-ms"), trailers.end());
  f.service().AwaitWaitingCalls(0);
}

TEST(WaitingCallTest, QueuedCallsAreAnsweredUnavailableWhenTheSchedulerShutsDown) {
  Fixture f;
  Call running;
  StartRunningCompile(f, running);
  Call queued;
  queued.req = Request(64);
  queued.Start(f.stub());
  f.service().AwaitWaitingCalls(2);

  absl::Notification stopped;
  std::thread stopper([&] {
    f.scheduler().Shutdown(absl::InfiniteDuration()).IgnoreError();
    stopped.Notify();
  });
  queued.done.WaitForNotification();
  EXPECT_EQ(queued.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  f.compiler().Release();
  running.done.WaitForNotification();
  EXPECT_TRUE(running.status.ok()) << running.status.error_message();
  stopper.join();
}

TEST(WaitingCallTest, TheServersDeadlineEndsAWaitWithoutAThreadPolling) {
  Fixture f(absl::Milliseconds(300));  // the server's cap on every wait
  Call call;
  call.req = Request();
  call.Start(f.stub());
  call.done.WaitForNotification();
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << call.status.error_message();
  f.service().AwaitWaitingCalls(0);
}

// --- GetKernelStream ----------------------------------------------------------

// One GetKernelStream on gRPC's callback client API (no thread of its own):
// reads every event, then the status.
class StreamCall final : public grpc::ClientReadReactor<v1::GetKernelEvent> {
 public:
  grpc::ClientContext ctx;
  v1::GetKernelRequest req;
  // Complete once `done` is notified.
  std::vector<v1::GetKernelEvent> events;
  grpc::Status status;
  absl::Notification first;  // an event has arrived
  absl::Notification done;

  void Start(v1::KernelService::Stub& stub) {
    stub.async()->GetKernelStream(&ctx, &req, this);
    StartRead(&ev_);
    StartCall();
  }
  void OnReadDone(bool ok) override {  // reads run one at a time
    if (!ok) return;                   // the stream ended; OnDone follows
    events.push_back(ev_);
    if (!first.HasBeenNotified()) first.Notify();
    StartRead(&ev_);
  }
  void OnDone(const grpc::Status& s) override {
    status = s;
    done.Notify();
  }
  // The phases of the progress events, in order.
  std::vector<v1::Progress::Phase> Phases() const {
    std::vector<v1::Progress::Phase> out;
    for (const auto& e : events) {
      if (e.has_progress()) out.push_back(e.progress().phase());
    }
    return out;
  }

 private:
  v1::GetKernelEvent ev_;
};

TEST(WaitingStreamTest, ManyStreamsForOneUncompiledKeyShareOneCompileWithoutAThreadEach) {
  constexpr int kCalls = 500;
  Fixture g;
  {
    // Start the channel and the server's threads first, with a request that
    // is refused without a compile.
    StreamCall warm;
    warm.req = Request();
    warm.req.mutable_target()->set_arch("sm_70");
    warm.Start(g.stub());
    warm.done.WaitForNotification();
    ASSERT_EQ(warm.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(warm.events.empty());
  }
  const int before = ThreadCount();
  ASSERT_GT(before, 0);

  std::vector<std::unique_ptr<StreamCall>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::make_unique<StreamCall>());
    calls.back()->req = Request();
    calls.back()->Start(g.stub());
  }
  // Every call has been handled (its first progress event is written inside
  // the handler) and the compile is running.
  for (auto& c : calls) c->first.WaitForNotification();
  g.compiler().AwaitCompiles(1);
  const int during = ThreadCount();
  // A synchronous stream handler held a server thread per call here (>= 500).
  EXPECT_LT(during - before, kCalls / 5) << before << " threads before, " << during << " during";
  g.service().AwaitWaitingCalls(kCalls);

  g.compiler().Release();
  for (auto& c : calls) c->done.WaitForNotification();
  for (int i = 0; i < kCalls; ++i) {
    const StreamCall& c = *calls[i];
    ASSERT_TRUE(c.status.ok()) << i << ": " << c.status.error_message();
    ASSERT_GE(c.events.size(), 2u) << i;
    // Joined while the compile was queued or running; the result comes last.
    EXPECT_TRUE(c.events.front().has_progress()) << i;
    EXPECT_EQ(c.Phases().back(), v1::Progress::PHASE_COMPILING) << i;
    ASSERT_TRUE(c.events.back().has_result()) << i;
    EXPECT_EQ(c.events.back().result().cubin(), "fake cubin");
    EXPECT_FALSE(c.events.back().result().cache_hit());
    EXPECT_EQ(c.events.back().result().record().key(),
              calls[0]->events.back().result().record().key());
  }
  EXPECT_EQ(g.compiler().compiles(), 1);
  g.service().AwaitWaitingCalls(0);

  // The kernel is stored now: a stream is answered with the result alone.
  StreamCall hit;
  hit.req = Request();
  hit.Start(g.stub());
  hit.done.WaitForNotification();
  ASSERT_TRUE(hit.status.ok()) << hit.status.error_message();
  ASSERT_EQ(hit.events.size(), 1u);
  EXPECT_TRUE(hit.events[0].result().cache_hit());
  EXPECT_EQ(hit.events[0].result().cubin(), "fake cubin");
  EXPECT_EQ(g.compiler().compiles(), 1);
}

TEST(WaitingStreamTest, QueuedStreamReportsItsPositionThenCompilingThenTheResult) {
  Fixture f;
  StreamCall blocker;
  StartRunningCompile(f, blocker);
  StreamCall queued;
  queued.req = Request(64);
  queued.Start(f.stub());
  f.service().AwaitWaitingCalls(2);
  queued.first.WaitForNotification();

  f.compiler().Release();
  blocker.done.WaitForNotification();
  queued.done.WaitForNotification();
  ASSERT_TRUE(queued.status.ok()) << queued.status.error_message();
  ASSERT_FALSE(queued.events.empty());
  EXPECT_THAT(queued.Phases(),
              ::testing::ElementsAre(v1::Progress::PHASE_QUEUED, v1::Progress::PHASE_COMPILING));
  EXPECT_EQ(queued.events.front().progress().queue_position(), 0u);
  EXPECT_EQ(queued.events.front().progress().queue(), "sm_80");
  ASSERT_TRUE(queued.events.back().has_result());
  EXPECT_EQ(queued.events.back().result().cubin(), "fake cubin");
  EXPECT_TRUE(blocker.status.ok()) << blocker.status.error_message();
  EXPECT_EQ(f.compiler().compiles(), 2);
  f.service().AwaitWaitingCalls(0);
}

TEST(WaitingStreamTest, CancelledStreamIsAnsweredCancelledAndLeavesItsWait) {
  Fixture f;
  // A running compile of another key keeps the one asked for below queued.
  Call blocker;
  StartRunningCompile(f, blocker);

  StreamCall call;
  call.req = Request(64);
  call.Start(f.stub());
  f.service().AwaitWaitingCalls(2);
  call.first.WaitForNotification();
  call.ctx.TryCancel();
  call.done.WaitForNotification();
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::CANCELLED);
  ExpectWaitLeftThenBlockerCompiles(f, blocker);
}

TEST(WaitingStreamTest, AbandonWaitsAnswersWaitingStreamsUnavailableWithTheRetryHint) {
  Fixture f;
  StreamCall running;
  StartRunningCompile(f, running);
  StreamCall queued;
  queued.req = Request(64);
  queued.Start(f.stub());
  f.service().AwaitWaitingCalls(2);

  f.service().AbandonWaits();
  for (StreamCall* c : {&running, &queued}) {
    c->done.WaitForNotification();
    EXPECT_EQ(c->status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(c->status.error_message(), ::testing::HasSubstr("shutting down"));
    EXPECT_THAT(c->status.error_message(), ::testing::HasSubstr("abandoned"));
    const auto& trailers = c->ctx.GetServerTrailingMetadata();
    EXPECT_NE(trailers.find("retry-after-ms"), trailers.end());
    // Progress came first; no result.
    ASSERT_FALSE(c->events.empty());
    for (const auto& e : c->events) EXPECT_TRUE(e.has_progress());
  }
  f.service().AwaitWaitingCalls(0);

  // A stream that starts waiting after AbandonWaits is answered at once.
  StreamCall late;
  late.req = Request(256);
  late.Start(f.stub());
  late.done.WaitForNotification();
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(late.status.error_message(), ::testing::HasSubstr("abandoned"));
  f.service().AwaitWaitingCalls(0);
}

TEST(WaitingStreamTest, QueuedStreamsAreAnsweredUnavailableWhenTheSchedulerShutsDown) {
  Fixture f;
  StreamCall running;
  StartRunningCompile(f, running);
  StreamCall queued;
  queued.req = Request(64);
  queued.Start(f.stub());
  f.service().AwaitWaitingCalls(2);

  absl::Notification stopped;
  std::thread stopper([&] {
    f.scheduler().Shutdown(absl::InfiniteDuration()).IgnoreError();
    stopped.Notify();
  });
  queued.done.WaitForNotification();
  EXPECT_EQ(queued.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  const auto& trailers = queued.ctx.GetServerTrailingMetadata();
  EXPECT_NE(trailers.find("retry-after-ms"), trailers.end());
  f.compiler().Release();
  running.done.WaitForNotification();
  EXPECT_TRUE(running.status.ok()) << running.status.error_message();
  ASSERT_FALSE(running.events.empty());
  EXPECT_TRUE(running.events.back().has_result());
  stopper.join();
}

TEST(WaitingStreamTest, TheServersDeadlineEndsAStreamsWait) {
  Fixture f(absl::Milliseconds(300));  // the server's cap on every wait
  StreamCall call;
  call.req = Request();
  call.Start(f.stub());
  call.done.WaitForNotification();
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << call.status.error_message();
  EXPECT_THAT(call.Phases(), ::testing::Contains(v1::Progress::PHASE_COMPILING));
  f.service().AwaitWaitingCalls(0);
}

TEST(WaitingStreamTest, ACompileErrorEndsEveryStreamWithItsStatus) {
  Fixture f;
  f.compiler().Fail(absl::InvalidArgumentError("fake nvrtc: no such thing"));
  StreamCall a, b;
  a.req = Request();
  b.req = Request();
  a.Start(f.stub());
  b.Start(f.stub());
  f.service().AwaitWaitingCalls(2);
  f.compiler().Release();
  for (StreamCall* c : {&a, &b}) {
    c->done.WaitForNotification();
    EXPECT_EQ(c->status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(c->status.error_message(), ::testing::HasSubstr("fake nvrtc: no such thing"));
    for (const auto& e : c->events) EXPECT_TRUE(e.has_progress());
  }
  EXPECT_EQ(f.compiler().compiles(), 1);
  f.service().AwaitWaitingCalls(0);
}

// Progress events carry the scheduler's phase as the wire value of the same
// name; the two enums are numbered independently.
TEST(ProgressPhaseTest, EachSchedulerPhaseHasTheWireValueOfItsName) {
  const Phase phases[] = {Phase::kQueued, Phase::kCompiling, Phase::kVerifying, Phase::kDone,
                          Phase::kFailed};
  for (Phase p : phases) {
    EXPECT_EQ(v1::Progress::Phase_Name(ToProtoPhase(p)),
              "PHASE_" + absl::AsciiStrToUpper(PhaseName(p)));
  }
  // Every wire phase but PHASE_UNSPECIFIED is some scheduler phase.
  EXPECT_EQ(v1::Progress::Phase_descriptor()->value_count(),
            1 + static_cast<int>(std::size(phases)));
}

}  // namespace
}  // namespace kcache
