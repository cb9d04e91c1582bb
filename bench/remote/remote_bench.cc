// Benchmark of the shared remote tier (issue 16), in one run on one machine:
// two compile-only kcached nodes (A, B) with their own stores sharing one
// redis-server on loopback, clients over each node's Unix socket.
//   compile       A fetches a kernel nobody has (remote miss, lease, NVRTC
//                 compile in a worker, local publish, remote publish);
//   local hit     A fetches it again (its store's in-memory layer);
//   remote hit    B fetches it with its local entry invalidated first (local
//                 miss, scheduler job, Redis GET record + blob, digest and
//                 record checks, local atomic publish), repeated;
//   hand-over     A and B ask for a new kernel at once: B waits on A's lease
//                 and gets A's result; reported as B's time and B - A.
// Also Redis memory per kernel (INFO used_memory delta / kernels) and bytes
// per kernel published. `--smoke` runs a few of each (CTest).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cache/remote/redis_client.h"
#include "kcache/v1/service.grpc.pb.h"
#include "tests/common/distinct_spec.h"
#include "tests/common/kcached_process.h"
#include "tests/common/redis_process.h"

namespace kcache {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "remote_bench: %s\n", why.c_str());
  std::exit(1);
}

v1::Target Sm80() {
  v1::Target t;
  t.set_arch("sm_80");
  return t;
}

// Kernel `n`: DistinctSpec's 8 shapes times softmax scales.
v1::AttentionSpec Spec(int n) {
  return testing::DistinctSpec(n % 8, n < 8 ? 0.0f : 0.01f * static_cast<float>(n / 8));
}

struct Node {
  std::unique_ptr<testing::KcachedProcess> process;
  // A plain stub, not kcache::Client: the client memoizes per spec, and
  // every call here must reach the daemon.
  std::unique_ptr<v1::KernelService::Stub> kernels;
  std::unique_ptr<v1::AdminService::Stub> admin;

  v1::StatsResponse Stats() {
    grpc::ClientContext ctx;
    v1::StatsResponse r;
    if (!admin->Stats(&ctx, v1::StatsRequest(), &r).ok()) Die("Stats failed");
    return r;
  }
  void Invalidate(const std::string& key) {
    grpc::ClientContext ctx;
    v1::InvalidateRequest req;
    req.set_key(key);
    v1::InvalidateResponse resp;
    grpc::Status st = admin->Invalidate(&ctx, req, &resp);
    if (!st.ok()) Die("Invalidate: " + st.error_message());
  }
  // Seconds, and the response.
  double Fetch(int n, std::shared_ptr<const v1::GetKernelResponse>* out = nullptr) {
    v1::GetKernelRequest req;
    *req.mutable_spec() = Spec(n);
    *req.mutable_target() = Sm80();
    auto resp = std::make_shared<v1::GetKernelResponse>();
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(10)));
    absl::Time t0 = absl::Now();
    grpc::Status st = kernels->GetKernel(&ctx, req, resp.get());
    double s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!st.ok()) Die(absl::StrCat("GetKernel: ", st.error_message()));
    if (out != nullptr) *out = std::move(resp);
    return s;
  }
};

Node Start(const std::string& dir, const std::string& name, const std::string& url) {
  fs::create_directories(dir + "/" + name);
  Node n;
  n.process = std::make_unique<testing::KcachedProcess>(
      testing::KcachedOptions{.store_path = dir + "/" + name + "/store",
                              .socket_path = dir + "/" + name + "/kcached.sock",
                              .log_path = dir + "/" + name + "/kcached.log",
                              .extra_args = {"--remote=" + url}});
  if (absl::Status st = n.process->TryStart(); !st.ok()) Die(std::string(st.message()));
  auto channel = grpc::CreateChannel(n.process->target(), grpc::InsecureChannelCredentials());
  n.kernels = v1::KernelService::NewStub(channel);
  n.admin = v1::AdminService::NewStub(channel);
  return n;
}

struct Summary {
  double p50, p90, mean;
  size_t n;
};
Summary Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {at(0.5), at(0.9), sum / v.size(), v.size()};
}
void Row(const char* name, const Summary& s) {
  std::printf("%-34s %6zu %12.3f %12.3f %12.3f\n", name, s.n, s.p50 * 1e3, s.p90 * 1e3,
              s.mean * 1e3);
}

int64_t UsedMemory(RedisClient& rc) {
  auto info = rc.Command({"INFO", "memory"});
  if (!info.ok()) Die("INFO");
  for (absl::string_view line : absl::StrSplit(info->str, "\r\n")) {
    if (absl::ConsumePrefix(&line, "used_memory:")) {
      int64_t v = 0;
      if (absl::SimpleAtoi(line, &v)) return v;
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  bool smoke = false;
  int compiles = 6, hits = 200, remote_hits = 100, handovers = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--smoke") {
      smoke = true;
    } else if (absl::StartsWith(a, "--compiles=")) {
      if (!absl::SimpleAtoi(a.substr(11), &compiles)) Die(a);
    } else {
      Die("usage: remote_bench [--smoke] [--compiles=6]");
    }
  }
  if (smoke) {
    compiles = 1;
    hits = 10;
    remote_hits = 5;
    handovers = 1;
  }
  signal(SIGPIPE, SIG_IGN);
  std::string dir =
      (fs::temp_directory_path() / absl::StrCat("kcache-remote-bench-", getpid())).string();
  fs::create_directories(dir);
  testing::RedisProcess redis(dir + "/redis.log");
  if (absl::Status st = redis.Start(); !st.ok()) Die(std::string(st.message()));
  RedisClientOptions ro;
  ro.address = *ParseRedisUrl(redis.url());
  RedisClient rc(ro);
  for (int i = 0; i < 500 && !rc.connected(); ++i) absl::SleepFor(absl::Milliseconds(10));
  Node a = Start(dir, "a", redis.url());
  Node b = Start(dir, "b", redis.url());
  std::printf("two compile-only kcached + redis-server on loopback, %u CPUs, dir %s\n\n",
              std::thread::hardware_concurrency(), dir.c_str());
  const int64_t mem0 = UsedMemory(rc);

  std::vector<double> t_compile, t_local, t_remote, t_b, t_lag;
  std::vector<std::string> keys;
  for (int n = 0; n < compiles; ++n) {
    std::shared_ptr<const v1::GetKernelResponse> r;
    t_compile.push_back(a.Fetch(n, &r));
    if (r->cache_hit()) Die("expected a compile");
    keys.push_back(r->record().key());
  }
  const int64_t mem1 = UsedMemory(rc);
  for (int i = 0; i < hits; ++i) t_local.push_back(a.Fetch(i % compiles));
  const uint64_t b_compiles0 = b.Stats().compiles();
  for (int i = 0; i < remote_hits; ++i) {
    int n = i % compiles;
    if (i >= compiles) b.Invalidate(keys[n]);  // the first round finds B empty
    t_remote.push_back(b.Fetch(n));
  }
  v1::StatsResponse sb = b.Stats();
  if (sb.compiles() != b_compiles0) Die("B compiled: remote hits were not hits");
  if (sb.remote().hits() < static_cast<uint64_t>(remote_hits)) Die("B's remote hits missing");
  for (int h = 0; h < handovers; ++h) {
    int n = compiles + h;
    absl::Time a_done, b_done;
    absl::Time t0 = absl::Now();
    std::thread ta([&] {
      a.Fetch(n);
      a_done = absl::Now();
    });
    absl::SleepFor(absl::Milliseconds(100));  // A takes the lease first
    std::thread tb([&] {
      b.Fetch(n);
      b_done = absl::Now();
    });
    ta.join();
    tb.join();
    t_b.push_back(absl::ToDoubleSeconds(b_done - t0));
    t_lag.push_back(absl::ToDoubleSeconds(b_done - a_done));
  }
  v1::StatsResponse sa = a.Stats();
  sb = b.Stats();
  if (sb.remote().lease_waits() < static_cast<uint64_t>(handovers))
    Die("B never waited on a lease");

  std::printf("%-34s %6s %12s %12s %12s\n", "GetKernel (client-side, ms)", "n", "p50", "p90",
              "mean");
  Row("compile (node A, fleet miss)", Summarize(t_compile));
  Row("local hit (node A)", Summarize(t_local));
  Row("remote hit (node B, local miss)", Summarize(t_remote));
  Row("hand-over: B's total, asked +0.1s", Summarize(t_b));
  Row("hand-over: B done - A done", Summarize(t_lag));
  uint64_t published = sa.remote().publishes();
  std::printf(
      "\nper kernel in Redis: %.0f bytes written (record + cubin), %.0f bytes of "
      "used_memory (%d kernels)\n",
      static_cast<double>(sa.remote().bytes_written()) / published,
      static_cast<double>(mem1 - mem0) / compiles, compiles);
  std::printf(
      "node A: compiles %lu, remote publishes %lu; node B: compiles %lu, remote hits %lu, "
      "lease waits %lu\n",
      static_cast<unsigned long>(sa.compiles()), static_cast<unsigned long>(published),
      static_cast<unsigned long>(sb.compiles()), static_cast<unsigned long>(sb.remote().hits()),
      static_cast<unsigned long>(sb.remote().lease_waits()));
  a.process->Stop();
  b.process->Stop();
  redis.Stop();
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace kcache

int main(int argc, char** argv) { return kcache::Main(argc, argv); }
