// End-to-end tests of the shared remote tier (issue 16): compile-only
// kcached processes, each with its own store, sharing one real redis-server
// started on a loopback port. Counts come from each daemon's Stats.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <barrier>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cache/remote/remote_tier.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_client.h"
#include "tests/common/daemon_process.h"
#include "tests/common/distinct_spec.h"
#include "tests/common/redis_process.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::DistinctSpec;
using ::kcache::testing::NewClient;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::RedisProcess;
using ::kcache::testing::Sm80;
using ::kcache::testing::TempDir;

// A node: its own directory (store, socket, log), the shared Redis.
std::unique_ptr<DaemonProcess> Node(const TempDir& dir, const std::string& name,
                                    const RedisProcess& redis,
                                    std::vector<std::string> extra = {}) {
  std::string sub = dir.Sub(name);
  std::filesystem::create_directories(sub);
  extra.push_back("--remote=" + redis.url());
  return std::make_unique<DaemonProcess>(sub, std::move(extra));
}

std::string Logs(const std::vector<DaemonProcess*>& nodes) {
  std::string out;
  for (DaemonProcess* n : nodes) {
    absl::StrAppend(&out, "==== ", n->log_path(), "\n", ReadFileOrEmpty(n->log_path()));
  }
  return out;
}

// A worker that sleeps, then becomes the real kcache-compile-worker: makes a
// compile last long enough to kill its daemon in the middle of it.
std::string SlowWorker(const TempDir& dir, int seconds) {
  const char* env = std::getenv("KCACHE_TEST_KCACHED");
  std::filesystem::path kcached = env != nullptr ? env : KCACHE_TEST_KCACHED_PATH;
  std::string real = (kcached.parent_path() / "kcache-compile-worker").string();
  std::string path = dir.Sub("slow-worker.sh");
  std::ofstream(path) << "#!/bin/sh\nsleep " << seconds << "\nexec '" << real << "' \"$@\"\n";
  chmod(path.c_str(), 0755);
  return path;
}

// GET /metrics from the daemon's Prometheus port (read from its log).
std::string ScrapeMetrics(const DaemonProcess& d) {
  std::string log = ReadFileOrEmpty(d.log_path());
  size_t at = log.rfind("metrics port ");
  if (at == std::string::npos) return "";
  int port = std::atoi(log.c_str() + at + 13);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

struct Got {
  absl::Status status;
  std::shared_ptr<const v1::GetKernelResponse> response;
};

// `threads_per_node` client threads on every node ask for specs[t % size]
// at once (one barrier across all nodes).
std::vector<std::vector<Got>> Storm(const std::vector<DaemonProcess*>& nodes, int threads_per_node,
                                    const std::vector<int>& specs) {
  std::vector<std::vector<Got>> out(nodes.size(), std::vector<Got>(threads_per_node));
  std::barrier start(static_cast<std::ptrdiff_t>(nodes.size()) * threads_per_node);
  std::vector<std::thread> threads;
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (int t = 0; t < threads_per_node; ++t) {
      threads.emplace_back([&, n, t] {
        auto client = NewClient(*nodes[n]);
        start.arrive_and_wait();
        auto r = client->Fetch(DistinctSpec(specs[t % specs.size()]), Sm80(), absl::Minutes(8));
        out[n][t].status = r.status();
        if (r.ok()) out[n][t].response = *r;
      });
    }
  }
  for (auto& th : threads) th.join();
  return out;
}

void ExpectAllOk(const std::vector<std::vector<Got>>& got,
                 const std::vector<DaemonProcess*>& nodes) {
  for (size_t n = 0; n < got.size(); ++n) {
    for (size_t t = 0; t < got[n].size(); ++t) {
      ASSERT_TRUE(got[n][t].status.ok())
          << "node " << n << " thread " << t << ": " << got[n][t].status << "\n"
          << Logs(nodes);
      ASSERT_FALSE(got[n][t].response->cubin().empty());
    }
  }
}

// Three nodes, 16 client threads each, the same 8 specs at once on empty
// stores: the fleet compiles each kernel exactly once, and every client of
// every node gets the same bytes for a spec.
TEST(RemoteTierE2E, ThreeNodesCompileEachKernelOnceAcrossTheFleet) {
  TempDir dir;
  RedisProcess redis(dir.Sub("redis.log"));
  ASSERT_TRUE(redis.Start().ok());
  auto a = Node(dir, "a", redis), b = Node(dir, "b", redis), c = Node(dir, "c", redis);
  ASSERT_NO_FATAL_FAILURE(a->Start());
  ASSERT_NO_FATAL_FAILURE(b->Start());
  ASSERT_NO_FATAL_FAILURE(c->Start());
  std::vector<DaemonProcess*> nodes = {a.get(), b.get(), c.get()};

  absl::Time start = absl::Now();
  auto got = Storm(nodes, 16, {0, 1, 2, 3, 4, 5, 6, 7});
  std::cerr << "fleet storm: " << absl::FormatDuration(absl::Now() - start) << "\n";
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(got, nodes));

  uint64_t compiles = 0, remote_hits = 0, leases = 0, waits = 0, bad = 0, publishes = 0;
  for (DaemonProcess* n : nodes) {
    v1::StatsResponse s = n->Stats();
    std::cerr << n->log_path() << ": compiles " << s.compiles() << ", remote "
              << s.remote().ShortDebugString() << "\n";
    ASSERT_TRUE(s.has_remote());
    EXPECT_TRUE(s.remote().connected());
    EXPECT_EQ(s.compile_failures(), 0u);
    EXPECT_EQ(s.entries(), 8u);  // every node ends with every kernel locally
    compiles += s.compiles();
    remote_hits += s.remote().hits();
    leases += s.remote().leases();
    waits += s.remote().lease_waits();
    bad += s.remote().bad_entries();
    publishes += s.remote().publishes();
  }
  EXPECT_EQ(compiles, 8u) << Logs(nodes);
  EXPECT_EQ(leases, 8u);
  EXPECT_EQ(publishes, 8u);
  EXPECT_EQ(remote_hits, 16u);  // 8 kernels x 2 nodes that did not compile them
  EXPECT_EQ(bad, 0u);
  std::cerr << "lease waits across the fleet: " << waits << "\n";
  // One kernel per spec across the fleet: same key and bytes everywhere.
  std::map<int, std::pair<std::string, std::string>> first;
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (int t = 0; t < 16; ++t) {
      const auto& r = *got[n][t].response;
      auto [it, inserted] = first.emplace(t % 8, std::make_pair(r.record().key(), r.cubin()));
      if (!inserted) {
        EXPECT_EQ(it->second.first, r.record().key());
        EXPECT_EQ(it->second.second, r.cubin());
      }
    }
  }
  EXPECT_EQ(first.size(), 8u);
}

// The node holding the lease is SIGKILLed in the middle of its compile: the
// other node, waiting on that lease, takes over once it expires and its
// client gets the kernel.
TEST(RemoteTierE2E, LeaseHolderKilledMidCompileAnotherNodeTakesOver) {
  TempDir dir;
  RedisProcess redis(dir.Sub("redis.log"));
  ASSERT_TRUE(redis.Start().ok());
  auto a =
      Node(dir, "a", redis, {"--remote_lease_ms=2000", "--worker_path=" + SlowWorker(dir, 30)});
  auto b = Node(dir, "b", redis, {"--remote_lease_ms=2000"});
  ASSERT_NO_FATAL_FAILURE(a->Start());
  ASSERT_NO_FATAL_FAILURE(b->Start());
  std::vector<DaemonProcess*> nodes = {a.get(), b.get()};

  // A takes the lease and starts its (slow) compile. The worker wrapper
  // outlives A's SIGKILL; 30 s of sleep bounds how long it lingers.
  // (Its client fails once A is gone: the client retries until this deadline.)
  std::thread doomed(
      [&] { (void)NewClient(*a)->Fetch(DistinctSpec(0), Sm80(), absl::Seconds(20)); });
  RedisClientOptions ro;
  ro.address = *ParseRedisUrl(redis.url());
  RedisClient inspect(ro);
  absl::Time until = absl::Now() + absl::Seconds(60);
  bool leased = false;
  while (!leased && absl::Now() < until) {
    auto keys = inspect.Command({"KEYS", "kcache:v1:*:lease:*"});
    leased = keys.ok() && !keys->elements.empty();
    if (!leased) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(leased) << Logs(nodes);

  // B's client asks for the same kernel: B finds the lease and waits.
  Got got;
  absl::Time answered;
  std::thread waiter([&] {
    auto r = NewClient(*b)->Fetch(DistinctSpec(0), Sm80(), absl::Minutes(5));
    answered = absl::Now();
    got.status = r.status();
    if (r.ok()) got.response = *r;
  });
  until = absl::Now() + absl::Seconds(30);
  while (b->Stats().remote().lease_waits() == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(b->Stats().remote().lease_waits(), 1u) << Logs(nodes);
  a->Kill();
  absl::Time killed = absl::Now();
  waiter.join();
  doomed.join();
  std::cerr << "kernel on node b " << absl::FormatDuration(answered - killed)
            << " after the holder was killed (lease 2 s)\n";
  ASSERT_TRUE(got.status.ok()) << got.status << "\n" << Logs(nodes);
  EXPECT_FALSE(got.response->cubin().empty());
  v1::StatsResponse s = b->Stats();
  EXPECT_EQ(s.compiles(), 1u);
  EXPECT_EQ(s.remote().takeovers(), 1u);
  EXPECT_EQ(s.remote().publishes(), 1u);
  EXPECT_EQ(s.remote().wait_timeouts(), 0u);
}

// Redis is SIGKILLed while clients of two nodes wait for compiles and is
// restarted (empty): no client sees an error, the nodes compile alone while
// it is down, keep what they acknowledged, and use Redis again once back.
TEST(RemoteTierE2E, RedisKilledMidRunAndRestartedNoClientError) {
  TempDir dir;
  RedisProcess redis(dir.Sub("redis.log"));
  ASSERT_TRUE(redis.Start().ok());
  auto a = Node(dir, "a", redis), b = Node(dir, "b", redis);
  ASSERT_NO_FATAL_FAILURE(a->Start());
  ASSERT_NO_FATAL_FAILURE(b->Start());
  std::vector<DaemonProcess*> nodes = {a.get(), b.get()};

  // Spec 0 through the tier: compiled on one node, fetched by the other.
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(Storm(nodes, 4, {0}), nodes));

  std::vector<std::vector<Got>> got;
  std::thread storm([&] { got = Storm(nodes, 8, {1, 2, 3, 4}); });
  // Kill once a compile is under way on some node.
  absl::Time until = absl::Now() + absl::Seconds(60);
  bool busy = false;
  while (!busy && absl::Now() < until) {
    for (DaemonProcess* n : nodes) {
      v1::StatsResponse s = n->Stats();
      for (const auto& q : s.queues()) busy |= q.busy();
    }
  }
  redis.Stop(SIGKILL);
  storm.join();
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(got, nodes));
  for (DaemonProcess* n : nodes) {
    v1::StatsResponse s = n->Stats();
    EXPECT_EQ(s.entries(), 5u) << n->log_path();  // 0..4, all kept locally
    EXPECT_FALSE(s.remote().connected());
    EXPECT_GT(s.remote().errors(), 0u);
  }

  ASSERT_TRUE(redis.Start().ok());
  until = absl::Now() + absl::Seconds(30);
  auto both_connected = [&] {
    return a->Stats().remote().connected() && b->Stats().remote().connected();
  };
  while (!both_connected() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(both_connected()) << Logs(nodes);
  // Back in use: a compiles spec 5 and publishes it; b gets it from Redis.
  uint64_t b_compiles = b->Stats().compiles();
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(Storm({a.get()}, 2, {5}), nodes));
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(Storm({b.get()}, 2, {5}), nodes));
  v1::StatsResponse sb = b->Stats();
  EXPECT_EQ(sb.compiles(), b_compiles);
  EXPECT_GE(sb.remote().hits(), 1u);
  EXPECT_EQ(sb.remote().reconnects(), 1u);
  EXPECT_EQ(a->Stats().remote().reconnects(), 1u);
  // Nothing acknowledged was lost: a restarted node serves all six locally.
  EXPECT_EQ(a->Stop(SIGTERM), 0);
  ASSERT_NO_FATAL_FAILURE(a->Start());
  EXPECT_EQ(a->Stats().entries(), 6u);
}

// A damaged cubin and a record for the wrong key, placed in Redis by hand:
// detected, never served, and replaced by the node that compiles instead.
TEST(RemoteTierE2E, DamagedCubinAndWrongKeyRecordAreRefusedAndReplaced) {
  TempDir dir;
  RedisProcess redis(dir.Sub("redis.log"));
  ASSERT_TRUE(redis.Start().ok());
  auto a = Node(dir, "a", redis), b = Node(dir, "b", redis), c = Node(dir, "c", redis);
  ASSERT_NO_FATAL_FAILURE(a->Start());
  std::vector<DaemonProcess*> nodes = {a.get(), b.get(), c.get()};
  auto first = Storm({a.get()}, 2, {0, 1});
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(first, nodes));
  const v1::KernelRecord r0 = first[0][0].response->record();
  const v1::KernelRecord r1 = first[0][1].response->record();
  const std::string cubin0 = first[0][0].response->cubin();
  const std::string cubin1 = first[0][1].response->cubin();

  RedisClientOptions ro;
  ro.address = *ParseRedisUrl(redis.url());
  RedisClient rc(ro);
  for (int i = 0; i < 200 && !rc.connected(); ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(rc.connected());
  std::string damaged = cubin0;
  damaged[damaged.size() / 2] ^= 0x40;
  ASSERT_TRUE(rc.Command({"SET", RemoteTier::BlobKey(r0.key(), r0.cubin_sha256()), damaged}).ok());
  auto rec0 = rc.Command({"GET", RemoteTier::RecordKey(r0.key())});
  ASSERT_TRUE(rec0.ok() && rec0->type == RedisReply::Type::kString);
  // Spec 1's key now holds spec 0's (valid, signed-by-digest) record.
  ASSERT_TRUE(rc.Command({"SET", RemoteTier::RecordKey(r1.key()), rec0->str}).ok());

  ASSERT_NO_FATAL_FAILURE(b->Start());
  auto got = Storm({b.get()}, 4, {0, 1});
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(got, nodes));
  for (int t = 0; t < 4; ++t) {
    const auto& r = *got[0][t].response;
    EXPECT_EQ(r.record().key(), t % 2 == 0 ? r0.key() : r1.key());
    EXPECT_EQ(r.cubin(), t % 2 == 0 ? cubin0 : cubin1);  // never the damaged bytes
  }
  v1::StatsResponse sb = b->Stats();
  EXPECT_EQ(sb.compiles(), 2u);
  EXPECT_EQ(sb.remote().hits(), 0u);
  EXPECT_GE(sb.remote().bad_entries(), 2u);
  EXPECT_EQ(sb.remote().publishes(), 2u);

  // Replaced: a third node gets both from Redis, compiling nothing.
  ASSERT_NO_FATAL_FAILURE(c->Start());
  auto third = Storm({c.get()}, 2, {0, 1});
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(third, nodes));
  v1::StatsResponse sc = c->Stats();
  EXPECT_EQ(sc.compiles(), 0u);
  EXPECT_EQ(sc.remote().hits(), 2u);
  EXPECT_EQ(sc.remote().bad_entries(), 0u);
  EXPECT_EQ(third[0][0].response->cubin(), cubin0);
  EXPECT_EQ(third[0][1].response->cubin(), cubin1);
}

// The password reaches Redis from --remote_password_file; a URL carrying
// credentials or another scheme is a configuration error (exit status 2).
TEST(RemoteTierE2E, PasswordFromFileAndBadRemoteFlags) {
  TempDir dir;
  RedisProcess redis(dir.Sub("redis.log"), {"--requirepass", "fleet-secret"});
  ASSERT_TRUE(redis.Start().ok());
  std::string pw = dir.Sub("redis-password");
  std::ofstream(pw) << "fleet-secret\n";
  auto a = Node(dir, "a", redis, {"--remote_password_file=" + pw, "--metrics_address=127.0.0.1:0"});
  ASSERT_NO_FATAL_FAILURE(a->Start());
  ASSERT_NO_FATAL_FAILURE(ExpectAllOk(Storm({a.get()}, 1, {0}), {a.get()}));
  v1::StatsResponse s = a->Stats();
  EXPECT_TRUE(s.remote().connected()) << s.remote().last_error();
  EXPECT_EQ(s.remote().publishes(), 1u);
  EXPECT_EQ(s.remote().errors(), 0u);
  EXPECT_THAT(ReadFileOrEmpty(a->log_path()), ::testing::Not(::testing::HasSubstr("fleet-secret")));
  std::string metrics = ScrapeMetrics(*a);
  EXPECT_THAT(metrics, ::testing::HasSubstr("kcache_remote_connected 1"));
  EXPECT_THAT(metrics, ::testing::HasSubstr("kcache_remote_events_total{kind=\"publishes\"} 1"));
  EXPECT_THAT(metrics, ::testing::HasSubstr("kcache_remote_events_total{kind=\"misses\"} 1"));

  for (const std::string& bad : {std::string("--remote=http://127.0.0.1:1"),
                                 std::string("--remote=redis://u:pw@127.0.0.1:1")}) {
    DaemonProcess d(dir.Sub("bad-" + std::to_string(bad.size())), {bad});
    std::filesystem::create_directories(dir.Sub("bad-" + std::to_string(bad.size())));
    absl::Status st = d.TryStart();
    EXPECT_FALSE(st.ok()) << bad;
  }
}

}  // namespace
}  // namespace kcache
