// Load benchmark of kcached's hit path (issue 4): a real daemon in compile-only
// mode on a temporary store, a few sm_80 specs compiled once, then GetKernel
// hits from 1, 8 and 64 client threads over the Unix socket, beside floors
// measured in the same run:
//   - an empty RPC on the same server: grpc.health.v1.Health/Check, and a
//     GetKernel refused at once (no spec) through the same sync handler;
//   - in process, after the daemon has stopped, on its store: the daemon's
//     whole non-gRPC hit path (KernelBackend::Begin: validate, normalize,
//     key, lookup) and Store::Lookup alone.
//
// Two load shapes. Closed loop: each thread sends its next request as soon as
// the last returns (peak throughput; latency = threads / throughput). Paced:
// the threads together send at a fixed rate, each request timed from when it
// was due (so a stall also counts against the requests that queue behind it).
// Client threads have their own channel and connection ("own") or share one
// ("shared"). Columns: dCPU = the daemon's CPU time (user + system, all
// threads, from /proc) per request; cCPU = this process's, i.e. the clients'.
// On a 2-core machine their sum bounds the throughput.
//
// A plain program rather than Google Benchmark: it needs one daemon for all
// cases, many client threads per case with merged latency percentiles, and
// the paced mode. `--smoke` runs a few hundred requests per case (CTest).
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cache/store.h"
#include "compiler/scheduler/scheduler.h"
#include "kcache/v1/service.grpc.pb.h"
#include "service/config.h"
#include "service/kernel_backend.h"
#include "service/metrics.h"
#include "tests/common/distinct_spec.h"
#include "tests/common/kcached_process.h"

namespace kcache {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Flags {
  bool smoke = false;
  std::string kcached;  // default: next to this binary
  std::string dir;      // default: a fresh temp dir, removed at the end
  std::vector<int> threads = {1, 8, 64};
  double seconds = 5;
  int specs = 4;
  std::vector<double> rates = {5000, 10000, 20000};  // paced runs, 64 threads
  int smoke_requests = 300;
  std::vector<std::string> daemon_args;  // --daemon_arg=--foo=bar
  std::string only;                      // run only cases whose name has this
};

Flags g;

v1::GetKernelRequest Request(int i) {
  v1::GetKernelRequest r;
  *r.mutable_spec() = testing::DistinctSpec(i);  // distinct specs, distinct kernels
  r.mutable_target()->set_arch("sm_80");
  return r;
}

pid_t g_daemon_pid = -1;  // killed by Die: exit() runs no destructors

[[noreturn]] void Die(const std::string& msg) {
  std::cerr << "load_bench: " << msg << std::endl;
  if (g_daemon_pid > 0) kill(g_daemon_pid, SIGKILL);
  std::exit(1);
}

// CPU time (user + system, seconds) of a process, from /proc.
double ProcessCpuSeconds(pid_t pid) {
  FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[4096];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Fields after the ")" closing the command name; utime and stime are
  // fields 14 and 15 (1-based).
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  std::vector<std::string> fields = absl::StrSplit(p + 2, ' ');
  if (fields.size() < 13) return 0;
  double ticks =
      std::strtod(fields[11].c_str(), nullptr) + std::strtod(fields[12].c_str(), nullptr);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// --- measurement -------------------------------------------------------------

struct Result {
  std::string name;
  int threads = 0;
  uint64_t requests = 0;
  uint64_t errors = 0;
  double seconds = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
  double daemon_cpu_us = 0;  // daemon CPU per request (-1: not applicable)
  double client_cpu_us = 0;  // this process's CPU per request (all its threads)
  double rps() const { return seconds > 0 ? static_cast<double>(requests) / seconds : 0; }
};

// One call: returns true on success.
using CallFn = std::function<bool(int thread, uint64_t i)>;

// Runs `call` from `threads` threads, each `setup` first (not timed). Closed
// loop when `rate` is 0, else paced at `rate` requests/s in all. Bounded by
// g.seconds, or by g.smoke_requests in all in smoke mode.
Result Run(const std::string& name, int threads, const std::function<CallFn(int)>& setup,
           double rate = 0, pid_t daemon = -1) {
  if (!g.only.empty() && name.find(g.only) == std::string::npos) return Result{name, threads};
  std::vector<std::vector<int64_t>> lat(static_cast<size_t>(threads));
  std::vector<uint64_t> errors(static_cast<size_t>(threads), 0);
  std::barrier ready(threads + 1);
  std::atomic<bool> stop{false};
  Clock::time_point t0;
  const uint64_t per_thread_cap =
      g.smoke ? std::max<uint64_t>(1, static_cast<uint64_t>(g.smoke_requests / threads))
              : UINT64_MAX;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      CallFn call = setup(t);
      auto& l = lat[static_cast<size_t>(t)];
      l.reserve(g.smoke ? per_thread_cap : 1 << 16);
      ready.arrive_and_wait();  // setup done
      ready.arrive_and_wait();  // t0 set
      // Paced: thread t sends at t0 + (t + k * threads) / rate.
      const double period_s = rate > 0 ? threads / rate : 0;
      const double offset_s = rate > 0 ? t / rate : 0;
      for (uint64_t i = 0; i < per_thread_cap && !stop.load(std::memory_order_relaxed); ++i) {
        Clock::time_point start = Clock::now();
        if (rate > 0) {
          auto due = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                              offset_s + static_cast<double>(i) * period_s));
          if (due > start) std::this_thread::sleep_until(due);
          start = due;  // late sends count their wait
        }
        bool ok = call(t, i);
        int64_t ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        if (ok) {
          l.push_back(ns);
        } else {
          ++errors[static_cast<size_t>(t)];
        }
      }
    });
  }
  ready.arrive_and_wait();
  double cpu0 = daemon > 0 ? ProcessCpuSeconds(daemon) : 0;
  double own0 = ProcessCpuSeconds(getpid());
  t0 = Clock::now();
  ready.arrive_and_wait();
  if (!g.smoke) {
    std::this_thread::sleep_for(std::chrono::duration<double>(g.seconds));
    stop.store(true);
  }
  for (auto& th : ts) th.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  double cpu1 = daemon > 0 ? ProcessCpuSeconds(daemon) : 0;
  double own1 = ProcessCpuSeconds(getpid());

  Result r;
  r.name = name;
  r.threads = threads;
  r.seconds = elapsed;
  std::vector<int64_t> all;
  for (int t = 0; t < threads; ++t) {
    all.insert(all.end(), lat[static_cast<size_t>(t)].begin(), lat[static_cast<size_t>(t)].end());
    r.errors += errors[static_cast<size_t>(t)];
  }
  r.requests = all.size();
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    if (all.empty()) return 0.0;
    size_t i = std::min(all.size() - 1, static_cast<size_t>(p * static_cast<double>(all.size())));
    return static_cast<double>(all[i]) / 1e3;
  };
  r.p50_us = pct(0.50);
  r.p99_us = pct(0.99);
  r.p999_us = pct(0.999);
  r.max_us = all.empty() ? 0 : static_cast<double>(all.back()) / 1e3;
  r.daemon_cpu_us =
      daemon > 0 && r.requests > 0 ? (cpu1 - cpu0) * 1e6 / static_cast<double>(r.requests) : -1;
  r.client_cpu_us = r.requests > 0 ? (own1 - own0) * 1e6 / static_cast<double>(r.requests) : 0;
  return r;
}

void Print(const Result& r, double floor_p50 = 0) {
  if (!g.only.empty() && r.name.find(g.only) == std::string::npos) return;
  std::printf("%-52s %4d %9.0f %9.1f %9.1f %9.1f %9.1f", r.name.c_str(), r.threads, r.rps(),
              r.p50_us, r.p99_us, r.p999_us, r.max_us);
  if (r.daemon_cpu_us >= 0) {
    std::printf(" %8.1f", r.daemon_cpu_us);
  } else {
    std::printf(" %8s", "-");
  }
  std::printf(" %8.1f", r.client_cpu_us);
  if (floor_p50 > 0) {
    std::printf(" %7.2fx", r.p50_us / floor_p50);
  } else {
    std::printf(" %8s", "");
  }
  if (r.errors > 0) std::printf("  (%llu errors)", static_cast<unsigned long long>(r.errors));
  std::printf("\n");
  std::fflush(stdout);
}

void Header(const char* title) {
  std::printf("\n%s\n%-52s %4s %9s %9s %9s %9s %9s %8s %8s %8s\n", title, "case", "thr", "req/s",
              "p50 us", "p99 us", "p99.9 us", "max us", "dCPU us", "cCPU us", "p50/flr");
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target, bool own_connection) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Channels with equal arguments share one connection (the global subchannel
  // pool); a local pool gives this channel its own.
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto ch = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!ch->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10)))) {
    Die("cannot connect to " + target);
  }
  return ch;
}

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> out;
  for (const std::string& p : std::vector<std::string>(absl::StrSplit(s, ',', absl::SkipEmpty()))) {
    int v = 0;
    if (!absl::SimpleAtoi(p, &v) || v <= 0) Die(absl::StrCat("bad number '", p, "'"));
    out.push_back(v);
  }
  return out;
}

int Main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const std::string& flag) -> std::optional<std::string> {
      const std::string prefix = flag + "=";
      if (a.compare(0, prefix.size(), prefix) == 0) return a.substr(prefix.size());
      return std::nullopt;
    };
    if (a == "--smoke") {
      g.smoke = true;
    } else if (auto v = val("--kcached")) {
      g.kcached = *v;
    } else if (auto v = val("--dir")) {
      g.dir = *v;
    } else if (auto v = val("--threads")) {
      g.threads = ParseInts(*v);
    } else if (auto v = val("--seconds")) {
      if (!absl::SimpleAtod(*v, &g.seconds) || g.seconds <= 0) Die("bad --seconds");
    } else if (auto v = val("--specs")) {
      if (!absl::SimpleAtoi(*v, &g.specs) || g.specs < 1 || g.specs > 8) Die("--specs: 1..8");
    } else if (auto v = val("--rates")) {
      g.rates.clear();
      for (int r : ParseInts(*v)) g.rates.push_back(r);
    } else if (auto v = val("--only")) {
      g.only = *v;
    } else if (auto v = val("--daemon_arg")) {
      g.daemon_args.push_back(*v);
    } else {
      std::cerr
          << "usage: load_bench [--smoke] [--seconds=5] [--threads=1,8,64] [--specs=4]\n"
             "  [--rates=5000,10000,20000] [--kcached=PATH] [--dir=DIR] [--daemon_arg=--x=y]\n"
             "  [--only=SUBSTRING_OF_CASE_NAMES]\n";
      return 2;
    }
  }
  // Debian's abseil is built without NDEBUG, so absl::Mutex (gRPC's mutex
  // too) runs its deadlock detector on every lock: a global graph update that
  // costs more than the work measured here. kcached turns it off; so do we,
  // so that the client side and the in-process floors match the daemon.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (g.smoke) {
    g.specs = 1;
    g.rates = {2000};
  }
  if (g.kcached.empty()) {
    g.kcached = (fs::read_symlink("/proc/self/exe").parent_path() / "kcached").string();
  }
  bool own_dir = g.dir.empty();
  if (own_dir) {
    g.dir = (fs::temp_directory_path() / absl::StrCat("kcache-load-bench-", getpid())).string();
  }
  fs::create_directories(g.dir);
  signal(SIGPIPE, SIG_IGN);

  // A real kcached (tests/common/kcached_process.h) on g.dir.
  testing::KcachedProcess d({.binary = g.kcached,
                             .store_path = g.dir + "/store",
                             .socket_path = g.dir + "/kcached.sock",
                             .log_path = g.dir + "/kcached.log",
                             .extra_args = g.daemon_args});
  absl::Status started = d.TryStart();
  g_daemon_pid = d.pid();
  if (!started.ok()) Die(std::string(started.message()));
  std::printf("kcached %s, store %s, %u CPUs\n", g.kcached.c_str(), d.store().c_str(),
              std::thread::hardware_concurrency());
  std::fflush(stdout);

  // Warm: compile the specs once (not measured), keep the keys.
  std::vector<v1::GetKernelRequest> reqs;
  std::vector<v1::GetKernelResponse> warm;
  {
    auto stub = v1::KernelService::NewStub(NewChannel(d.target(), false));
    for (int i = 0; i < g.specs; ++i) {
      reqs.push_back(Request(i));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
      v1::GetKernelResponse resp;
      absl::Time t = absl::Now();
      grpc::Status st = stub->GetKernel(&ctx, reqs.back(), &resp);
      if (!st.ok())
        Die(absl::StrCat("warm-up compile ", i, ": ", st.error_message(), "; see ", d.log_path()));
      std::printf("spec %d: compiled in %.2f s, cubin %zu bytes, record %zu bytes\n", i,
                  absl::ToDoubleSeconds(absl::Now() - t), resp.cubin().size(),
                  resp.record().ByteSizeLong());
      std::fflush(stdout);
      warm.push_back(std::move(resp));
    }
  }

  // GetKernel hits, round-robin over the warmed specs.
  auto hits = [&](bool own_connection) {
    auto shared = own_connection ? nullptr : NewChannel(d.target(), false);
    return [&, own_connection, shared](int) -> CallFn {
      auto ch = own_connection ? NewChannel(d.target(), true) : shared;
      auto stub = std::shared_ptr<v1::KernelService::Stub>(v1::KernelService::NewStub(ch));
      return [&, stub](int t, uint64_t i) {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
        v1::GetKernelResponse resp;
        const auto& req = reqs[static_cast<size_t>(t + static_cast<int>(i)) % reqs.size()];
        grpc::Status st = stub->GetKernel(&ctx, req, &resp);
        return st.ok() && resp.cache_hit() && !resp.cubin().empty();
      };
    };
  };
  // Health/Check: the request (empty service name) encodes to no bytes.
  auto health = [&](bool own_connection) {
    auto shared = own_connection ? nullptr : NewChannel(d.target(), false);
    return [&, own_connection, shared](int) -> CallFn {
      auto ch = own_connection ? NewChannel(d.target(), true) : shared;
      return [ch](int, uint64_t) {
        static const grpc::internal::RpcMethod kCheck("/grpc.health.v1.Health/Check",
                                                      grpc::internal::RpcMethod::NORMAL_RPC);
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
        grpc::Slice empty;  // a ByteBuffer with no slice is not a message
        grpc::ByteBuffer req(&empty, 1), resp;
        grpc::Status st = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            ch.get(), kCheck, &ctx, req, &resp);
        return st.ok();
      };
    };
  };
  // GetKernel refused at once (no spec): the sync handler path, no work.
  auto refused = [&](bool own_connection) {
    auto shared = own_connection ? nullptr : NewChannel(d.target(), false);
    return [&, own_connection, shared](int) -> CallFn {
      auto ch = own_connection ? NewChannel(d.target(), true) : shared;
      auto stub = std::shared_ptr<v1::KernelService::Stub>(v1::KernelService::NewStub(ch));
      return [stub](int, uint64_t) {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
        v1::GetKernelRequest req;
        v1::GetKernelResponse resp;
        grpc::Status st = stub->GetKernel(&ctx, req, &resp);
        return st.error_code() == grpc::StatusCode::INVALID_ARGUMENT;
      };
    };
  };

  std::vector<std::pair<Result, double>> rows;  // result, floor p50
  Header(
      "Over the Unix socket (closed loop; p50/flr = p50 over the Health/Check p50 of the same "
      "threads and channel kind)");
  for (int n : g.threads) {
    for (bool own : {true, false}) {
      if (n == 1 && !own) continue;  // one thread: one channel either way
      std::string ch = own ? "own channel" : "shared channel";
      Result h = Run(absl::StrCat("floor: Health/Check, ", ch), n, health(own), 0, d.pid());
      Print(h);
      Result z = Run(absl::StrCat("floor: GetKernel refused (no spec), ", ch), n, refused(own), 0,
                     d.pid());
      Print(z, h.p50_us);
      Result k = Run(absl::StrCat("GetKernel hit, ", ch), n, hits(own), 0, d.pid());
      Print(k, h.p50_us);
      if (k.errors > 0 || (k.requests == 0 && g.only.empty()))
        Die("GetKernel hits failed; see " + d.log_path());
    }
  }
  if (!g.rates.empty()) {
    int n = g.smoke ? 8 : 64;
    Header(
        "Paced: the threads together send at a fixed rate; latency from when each request was due");
    for (double rate : g.rates) {
      Result h = Run(absl::StrCat("floor: Health/Check @ ", rate, "/s, own channel"), n,
                     health(true), rate, d.pid());
      Print(h);
      Result k = Run(absl::StrCat("GetKernel hit @ ", rate, "/s, own channel"), n, hits(true), rate,
                     d.pid());
      Print(k, h.p50_us);
    }
  }

  // In process, on the daemon's store (the daemon holds its lock; stop it).
  int status = d.Stop(SIGTERM);
  g_daemon_pid = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    Die("kcached did not stop cleanly; see " + d.log_path());
  {
    StoreOptions so;  // the daemon's defaults: 256 MiB in-memory layer
    auto store = Store::Open(d.store(), so);
    if (!store.ok()) Die(absl::StrCat("open store: ", store.status().message()));
    MetricsRegistry metrics;
    // Hits only: a scheduler that is already shut down refuses any miss
    // (there is no compiler here).
    Scheduler::Options sched_opts;
    sched_opts.compile_threads = 1;
    Scheduler scheduler(sched_opts);
    (void)scheduler.Shutdown(absl::ZeroDuration());
    BackendDeps deps;
    deps.store = store->get();
    deps.scheduler = &scheduler;
    deps.toolchain = warm[0].record().toolchain();  // the daemon's, with its id
    deps.metrics = &metrics;
    deps.config = DefaultDaemonConfig();  // the daemon's spec limits
    KernelBackend backend(std::move(deps));
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto p = backend.Begin(reqs[i], absl::InfiniteFuture());
      if (!p.ok() || p->ticket != nullptr || p->answer.record().key() != warm[i].record().key()) {
        Die(absl::StrCat("in process, request ", i, " does not hit the daemon's entry (",
                         p.ok() ? "a miss: another key?" : p.status().ToString(), ")"));
      }
    }
    Header("In process, on the same store (no gRPC)");
    for (int n : g.threads) {
      Result b = Run("floor: KernelBackend::Begin hit (resolve+lookup)", n, [&](int) -> CallFn {
        return [&](int t, uint64_t i) {
          auto p = backend.Begin(reqs[static_cast<size_t>(t + static_cast<int>(i)) % reqs.size()],
                                 absl::InfiniteFuture());
          return p.ok() && p->ticket == nullptr && !p->answer.cubin().empty();
        };
      });
      Print(b);
      Result r = Run("floor: KernelBackend::Resolve (validate+key)", n, [&](int) -> CallFn {
        return [&](int t, uint64_t i) {
          return backend.Resolve(reqs[static_cast<size_t>(t + static_cast<int>(i)) % reqs.size()])
              .ok();
        };
      });
      Print(r);
      Result s = Run("floor: Store::Lookup", n, [&](int) -> CallFn {
        return [&](int t, uint64_t i) {
          auto e = (*store)->Lookup(
              warm[static_cast<size_t>(t + static_cast<int>(i)) % warm.size()].record().key());
          return e.ok() && *e != nullptr;
        };
      });
      Print(s);
    }
    (void)(*store)->Close();
  }
  if (own_dir) {
    std::error_code ec;
    fs::remove_all(g.dir, ec);
  }
  return 0;
}

}  // namespace
}  // namespace kcache

int main(int argc, char** argv) { return kcache::Main(argc, argv); }
