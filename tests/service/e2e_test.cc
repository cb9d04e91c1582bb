// End-to-end tests of kcached in compile-only mode: a real daemon in a child
// process on a temporary store and socket, real NVRTC, the C++ client.
#include <grpcpp/grpcpp.h>

#include <barrier>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_client.h"
#include "tests/common/daemon_process.h"
#include "tests/common/distinct_spec.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::DistinctSpec;
using ::kcache::testing::NewClient;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::Sm80;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

std::string ReadLog(const DaemonProcess& d) { return ReadFileOrEmpty(d.log_path()); }

// 32 threads (each with its own client, so nothing is shared on the client
// side) ask for 8 distinct specs at once, from cold.
std::vector<std::shared_ptr<const v1::GetKernelResponse>> ColdStorm(const DaemonProcess& d,
                                                                    float scale = 0) {
  constexpr int kThreads = 32;
  std::vector<std::shared_ptr<const v1::GetKernelResponse>> out(kThreads);
  std::vector<absl::Status> errors(kThreads);
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto client = NewClient(d);
      start.arrive_and_wait();
      auto r = client->Fetch(DistinctSpec(t % 8, scale), Sm80(), absl::Minutes(5));
      if (r.ok()) {
        out[t] = *r;
      } else {
        errors[t] = r.status();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(errors[t].ok()) << t << ": " << errors[t];
  return out;
}

TEST(DaemonE2E, ColdStormCompilesOncePerKernelThenRestartServesHits) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto first = ColdStorm(d);
  v1::StatsResponse stats = d.Stats();
  EXPECT_EQ(stats.compiles(), 8u) << ReadLog(d);
  EXPECT_EQ(stats.compile_failures(), 0u);
  EXPECT_EQ(stats.entries(), 8u);
  EXPECT_TRUE(stats.compile_only());
  // Every thread asking for one spec got the same record and bytes.
  std::map<int, std::string> key_of;
  for (int t = 0; t < 32; ++t) {
    ASSERT_NE(first[t], nullptr);
    const auto& r = first[t]->record();
    EXPECT_FALSE(r.verified());  // compile-only mode
    EXPECT_EQ(r.arch(), "sm_80");
    EXPECT_FALSE(first[t]->cubin().empty());
    auto [it, inserted] = key_of.emplace(t % 8, r.key());
    if (!inserted) {
      EXPECT_EQ(it->second, r.key());
      EXPECT_EQ(first[t]->cubin(), first[t % 8]->cubin());
      EXPECT_EQ(r.SerializeAsString(), first[t % 8]->record().SerializeAsString());
    }
  }
  std::set<std::string> distinct;
  for (auto& [i, k] : key_of) distinct.insert(k);
  EXPECT_EQ(distinct.size(), 8u);

  // A restart serves everything from the store: zero compiles.
  EXPECT_EQ(d.Stop(SIGTERM), 0) << ReadLog(d);
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto second = ColdStorm(d);
  stats = d.Stats();
  EXPECT_EQ(stats.compiles(), 0u);
  EXPECT_EQ(stats.hits(), 32u);
  for (int t = 0; t < 32; ++t) {
    ASSERT_NE(second[t], nullptr);
    EXPECT_TRUE(second[t]->cache_hit());
    EXPECT_EQ(second[t]->record().key(), first[t]->record().key());
    EXPECT_EQ(second[t]->cubin(), first[t]->cubin());
  }
}

TEST(DaemonE2E, SigkillDuringCompilesThenRestartWaitingClientsSucceed) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  constexpr int kThreads = 8;
  std::vector<absl::Status> results(kThreads);
  std::vector<std::string> keys(kThreads);
  std::barrier started(kThreads + 1);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto client = NewClient(d);
      started.arrive_and_wait();
      auto r = client->Fetch(DistinctSpec(t, 0.125f), Sm80(), absl::Minutes(5));
      results[t] = r.status();
      if (r.ok()) keys[t] = (*r)->record().key();
    });
  }
  started.arrive_and_wait();
  // Kill once the daemon is busy compiling (a queue reports busy).
  absl::Time until = absl::Now() + absl::Seconds(60);
  bool busy = false;
  while (!busy && absl::Now() < until) {
    v1::StatsResponse stats = d.Stats();
    for (const auto& q : stats.queues()) busy |= q.busy();
  }
  EXPECT_TRUE(busy);
  d.Kill();
  ASSERT_NO_FATAL_FAILURE(d.Start());
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(results[t].ok()) << t << ": " << results[t];

  auto stub = v1::AdminService::NewStub(
      grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::VerifyResponse vr;
  ASSERT_TRUE(stub->Verify(&ctx, v1::VerifyRequest(), &vr).ok());
  EXPECT_EQ(vr.corrupt(), 0u);
  EXPECT_EQ(vr.checked(), static_cast<uint64_t>(kThreads));
}

struct InvalidCase {
  std::string name;
  std::function<void(v1::GetKernelRequest&)> mutate;
  std::string expected;  // substring of the message: the field's path
};

TEST(DaemonE2E, EachInvalidFieldIsNamed) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  std::vector<InvalidCase> cases = {
      {"no dtype", [](auto& r) { r.mutable_spec()->clear_dtype(); }, "spec.dtype"},
      {"head dim", [](auto& r) { r.mutable_spec()->set_head_dim_qk(96); }, "spec.head_dim_qk"},
      {"v head dim", [](auto& r) { r.mutable_spec()->set_head_dim_v(80); }, "spec.head_dim_v"},
      {"no heads", [](auto& r) { r.mutable_spec()->set_num_q_heads(0); }, "spec.num_q_heads"},
      {"gqa", [](auto& r) { r.mutable_spec()->set_num_kv_heads(3); }, "spec.num_kv_heads"},
      {"scale", [](auto& r) { r.mutable_spec()->set_softmax_scale(-1); }, "spec.softmax_scale"},
      {"softcap",
       [](auto& r) { r.mutable_spec()->mutable_score_mod()->mutable_softcap()->set_cap(-2); },
       "spec.score_mod.softcap.cap"},
      {"window",
       [](auto& r) { r.mutable_spec()->mutable_mask()->mutable_sliding_window()->set_left(-7); },
       "spec.mask.sliding_window.left"},
      {"expr type",
       [](auto& r) {
         r.mutable_spec()->mutable_mask()->mutable_expr()->mutable_predicate()->set_int_const(1);
       },
       "spec.mask.expr.predicate"},
      {"buffer",
       [](auto& r) {
         auto* read =
             r.mutable_spec()->mutable_mask()->mutable_expr()->mutable_predicate()->mutable_read();
         read->set_buffer("nope");
       },
       "spec.mask.expr.predicate.read"},
      // Tiles are checked at admission, not by a failed compile: 176 keys
      // exist only on sm_90a's ping-pong, 96 nowhere.
      {"tuning for another target",
       [](auto& r) { r.mutable_spec()->mutable_tuning()->set_block_n(176); },
       "spec.tuning: block_m=128 block_n=176"},
      {"tuning", [](auto& r) { r.mutable_spec()->mutable_tuning()->set_block_n(96); },
       "spec.tuning: block_m=128 block_n=96"},
      {"no target", [](auto& r) { r.clear_target(); }, "target"},
      {"bad arch", [](auto& r) { r.mutable_target()->set_arch("sm_70"); }, "target.arch"},
      {"no device", [](auto& r) { r.mutable_target()->set_device(3); }, "target.device"},
  };
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  for (const auto& c : cases) {
    v1::GetKernelRequest req;
    *req.mutable_spec() = DistinctSpec(0);
    *req.mutable_target() = Sm80();
    c.mutate(req);
    grpc::ClientContext ctx;
    v1::GetKernelResponse resp;
    grpc::Status st = stub->GetKernel(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr(c.expected)) << c.name;
  }
  EXPECT_EQ(d.Stats().compiles(), 0u);
}

TEST(DaemonE2E, OversizedMessageIsRefused) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--max_message_bytes=65536"});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  v1::GetKernelRequest req;
  *req.mutable_spec() = DistinctSpec(0);
  *req.mutable_target() = Sm80();
  for (int i = 0; i < 5000; ++i) {
    auto* b = req.mutable_spec()->add_buffers();
    b->set_name(absl::StrCat("buffer_", i));
    b->set_type(v1::ELEM_TYPE_INT32);
    b->set_rank(1);
  }
  ASSERT_GT(req.ByteSizeLong(), 65536u);
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::GetKernelResponse resp;
  grpc::Status st = stub->GetKernel(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  // The daemon is unharmed.
  EXPECT_EQ(d.Stats().compiles(), 0u);
}

TEST(DaemonE2E, StreamReportsProgressThenTheResult) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  v1::GetKernelRequest req;
  *req.mutable_spec() = DistinctSpec(3);
  *req.mutable_target() = Sm80();
  grpc::ClientContext ctx;
  auto reader = stub->GetKernelStream(&ctx, req);
  std::vector<v1::GetKernelEvent> events;
  v1::GetKernelEvent ev;
  while (reader->Read(&ev)) events.push_back(ev);
  grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_GE(events.size(), 2u);
  EXPECT_TRUE(events.front().has_progress());
  bool saw_compiling = false;
  for (const auto& e : events) {
    if (e.has_progress() && e.progress().phase() == v1::Progress::PHASE_COMPILING)
      saw_compiling = true;
  }
  EXPECT_TRUE(saw_compiling);
  ASSERT_TRUE(events.back().has_result());
  EXPECT_FALSE(events.back().result().cubin().empty());
  EXPECT_FALSE(events.back().result().cache_hit());
}

TEST(DaemonE2E, ClientSaysSoWhenNoDaemonAnswers) {
  TempDir dir;
  ClientOptions o;
  o.target = "unix:" + dir.Sub("nobody.sock");
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  auto r = (*client)->Fetch(DistinctSpec(0), Sm80(), absl::Milliseconds(500));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no kcache daemon"));
}

TEST(DaemonE2E, SecondDaemonOnTheSameStoreIsRefused) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  DaemonProcess second(dir.path());
  // Same socket and store: the socket check answers first.
  std::string cmd =
      absl::StrCat(KCACHE_TEST_KCACHED_PATH, " --compile_only --store_path=", dir.Sub("store"),
                   " --socket_path=", dir.Sub("other.sock"), " 2>", dir.Sub("second.log"));
  int rc = std::system(cmd.c_str());
  EXPECT_NE(rc, 0);
  EXPECT_THAT(ReadFileOrEmpty(dir.Sub("second.log")), HasSubstr("store_path"));
}

}  // namespace
}  // namespace kcache

namespace kcache {
namespace {

// Over TCP without TLS and a token, only the kernel service is served: the
// admin service stays on the Unix socket.
TEST(DaemonE2E, AdminIsNotServedOverPlainTcp) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--tcp_address=127.0.0.1:0"});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  std::string log = ReadLog(d);
  size_t at = log.find("tcp port ");
  ASSERT_NE(at, std::string::npos) << log;
  int port = std::atoi(log.c_str() + at + 9);
  ASSERT_GT(port, 0);
  auto tcp =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  {
    auto admin = v1::AdminService::NewStub(tcp);
    grpc::ClientContext ctx;
    v1::StatsResponse resp;
    EXPECT_EQ(admin->Stats(&ctx, v1::StatsRequest(), &resp).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  {
    auto kernels = v1::KernelService::NewStub(tcp);
    grpc::ClientContext ctx;
    v1::GetKernelRequest req;
    *req.mutable_spec() = DistinctSpec(0);
    req.mutable_target()->set_arch("sm_75");
    v1::GetKernelResponse resp;
    grpc::Status st = kernels->GetKernel(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  }
  // The Unix socket still has the admin service.
  EXPECT_EQ(d.Stats().compiles(), 0u);
}

}  // namespace
}  // namespace kcache

namespace kcache {
namespace {

// max_store_bytes is enforced in the background: entries past the grace
// period are evicted until the store fits, and the metric counts them.
TEST(DaemonE2E, MaxStoreBytesEvictsInTheBackground) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--max_store_bytes=1", "--eviction_grace_ms=0",
                               "--eviction_interval_ms=100", "--metrics_address=127.0.0.1:0"});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto client = NewClient(d);
  for (int i = 0; i < 2; ++i) {
    auto r = client->Fetch(DistinctSpec(i), Sm80(), absl::Minutes(2));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // Poll the observable state with a deadline: eviction runs on its own timer.
  absl::Time until = absl::Now() + absl::Seconds(30);
  uint64_t entries = 1;
  while (entries > 0 && absl::Now() < until) entries = d.Stats().entries();
  EXPECT_EQ(entries, 0u);
  // The janitor logs the run once it has returned, which may be just after
  // the entries are gone: read the log until its summary is there.
  std::string log = ReadLog(d);
  while (!absl::StrContains(log, "to stay within max_store_bytes") && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
    log = ReadLog(d);
  }
  EXPECT_THAT(log, HasSubstr("to stay within max_store_bytes"));
  // Before it, one line per evicted entry with its key prefix (issue 19).
  EXPECT_THAT(log, ::testing::ContainsRegex("\\] evict key=[0-9a-f]{28}\n"));
}

}  // namespace
}  // namespace kcache
