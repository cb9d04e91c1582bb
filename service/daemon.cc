#include "service/daemon.h"

#include <glog/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cache/key.h"
#include "cache/store.h"
#include "compiler/cuda/cuda_driver.h"
#include "compiler/cuda/nvrtc.h"
#include "compiler/scheduler/scheduler.h"
#include "compiler/toolchain.h"
#include "compiler/worker/worker_pool.h"
#include "google/protobuf/stubs/logging.h"
#include "service/admin_service.h"
#include "service/build_info.h"
#include "service/config.h"
#include "service/grpc_status.h"
#include "service/http_server.h"
#include "service/kernel_backend.h"
#include "service/kernel_service.h"
#include "service/logging.h"
#include "service/metrics.h"
#include "service/remote_hook.h"

namespace kcache {

namespace fs = std::filesystem;

struct Daemon::Impl {
  v1::DaemonConfig config;
  MetricsRegistry metrics;
  ServingState state;
  std::unique_ptr<Store> store;
  std::unique_ptr<SharedTier> remote;  // outlives the scheduler's jobs
  std::unique_ptr<Nvrtc> nvrtc;
  std::unique_ptr<NvJitLink> nvjitlink;  // only with enable_raw_kernels
  std::unique_ptr<CudaDevices> devices;
  std::unique_ptr<CudaNumericRunner> numeric;  // the numeric check before serve
  std::unique_ptr<WorkerPool> workers;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<KernelBackend> backend;
  std::unique_ptr<KernelServiceImpl> kernel_service;
  std::unique_ptr<KernelServiceImpl> kernel_service_tcp;  // one instance per server
  std::unique_ptr<AdminServiceImpl> admin_local;
  std::unique_ptr<AdminServiceImpl> admin_tcp;
  std::unique_ptr<grpc::Server> local_server;
  std::unique_ptr<grpc::Server> tcp_server;
  std::unique_ptr<HttpServer> http;
  int tcp_port = 0;
  absl::Mutex shutdown_mu;
  bool shut_down ABSL_GUARDED_BY(shutdown_mu) = false;

  // Keeps the store within max_store_bytes: evicts LRU entries every
  // eviction_interval_ms (never pinned ones, never ones used within the
  // grace period).
  absl::Mutex janitor_mu;
  bool janitor_stop ABSL_GUARDED_BY(janitor_mu) = false;
  std::thread janitor;

  void JanitorLoop() {
    Counter* evicted =
        metrics.GetCounter("kcache_evictions_total", "Entries evicted from the store");
    absl::MutexLock lock(&janitor_mu);
    const absl::Duration every = absl::Milliseconds(config.eviction_interval_ms());
    while (!janitor_mu.AwaitWithTimeout(absl::Condition(&janitor_stop), every)) {
      janitor_mu.Unlock();  // no lock across RocksDB I/O
      const absl::Time start = absl::Now();
      auto r = store->Evict(config.max_store_bytes());
      if (r.ok()) {
        evicted->Inc(r->evicted_entries());
        if (r->evicted_entries() > 0) {
          LOG(INFO) << "eviction entries=" << r->evicted_entries()
                    << " freed_bytes=" << r->freed_bytes()
                    << " duration=" << LogSeconds(absl::Now() - start)
                    << " (to stay within max_store_bytes=" << config.max_store_bytes() << ")";
        }
      } else {
        LOG(ERROR) << "eviction failed duration=" << LogSeconds(absl::Now() - start)
                   << " error=" << LogQuote(r.status().message());
      }
      janitor_mu.Lock();
    }
  }
};

namespace {

// Protobuf's parser logs a line (at ERROR) for each string field that is
// not UTF-8 before it refuses the message: from clients, a line per bad
// request, which a hostile one turns into a log flood (issue 17, item 7).
// The request itself is answered INVALID_ARGUMENT, so keep the first such
// line in each minute and count the rest.
void RateLimitedProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                            const std::string& message) {
  static absl::Mutex mu(absl::kConstInit);
  static absl::Time window_start ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  static int64_t dropped ABSL_GUARDED_BY(mu) = 0;
  if (level < google::protobuf::LOGLEVEL_FATAL) {
    absl::MutexLock lock(&mu);
    const absl::Time now = absl::Now();
    if (now - window_start < absl::Minutes(1)) {
      ++dropped;
      return;
    }
    window_start = now;
    if (dropped > 0) {
      LOG(WARNING) << "protobuf: " << dropped
                   << " further protobuf log lines dropped in the last minute";
      dropped = 0;
    }
  }
  const google::LogSeverity severity =
      level >= google::protobuf::LOGLEVEL_ERROR     ? google::GLOG_ERROR
      : level == google::protobuf::LOGLEVEL_WARNING ? google::GLOG_WARNING
                                                    : google::GLOG_INFO;
  google::LogMessage(file, line, severity).stream() << "protobuf: " << message;
}

void InstallRateLimitedProtobufLog() {
  static absl::once_flag once;
  absl::call_once(once, [] { google::protobuf::SetLogHandler(&RateLimitedProtobufLog); });
}

// What lstat found at a path, for messages.
const char* FileKind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "a file of an unknown kind";
}

// A socket left by a daemon that died is removed; anything else at the path
// is refused, never deleted (issue 17, item 5: a mistyped --socket_path
// pointing at the store's CURRENT file deleted it), and so is a socket that
// a live daemon answers on (two daemons on one socket).
absl::Status PrepareSocketPath(const std::string& path) {
  std::error_code ec;
  fs::create_directories(
      fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path(), ec);
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("socket_path: cannot inspect ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket_path: ", path, " exists and is ", FileKind(st.st_mode),
        ", not a socket; kcached only ever replaces a stale socket. Move it away or choose "
        "another --socket_path"));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  const int connect_errno = errno;
  close(fd);
  if (live) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket_path: another process is serving on ", path));
  }
  if (connect_errno != ECONNREFUSED) {
    // Not provably stale (e.g. no permission to connect): leave it.
    return absl::FailedPreconditionError(
        absl::StrCat("socket_path: ", path, " is a socket that cannot be probed (",
                     std::strerror(connect_errno), "); not removing it"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "socket_path: cannot remove the stale socket ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Starts `builder`'s server listening on the Unix socket `path` with mode
// 0660 from its first moment: it is bound in a fresh private directory
// (0700, so nobody else can reach it there whatever the umask gave it),
// chmod-ed, then renamed into place (issue 17, item 10).
absl::StatusOr<std::unique_ptr<grpc::Server>> ListenOnUnixSocket(grpc::ServerBuilder& builder,
                                                                 const std::string& path) {
  const fs::path final_path = fs::absolute(path);
  std::string dir = (final_path.parent_path() / ".kcached-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("socket_path: cannot create a directory beside ",
                                               final_path.string(), ": ", std::strerror(errno)));
  }
  const std::string temp = dir + "/s";
  auto cleanup = [&] {
    unlink(temp.c_str());
    rmdir(dir.c_str());
  };
  if (temp.size() >= sizeof(sockaddr_un::sun_path)) {
    cleanup();
    return absl::InvalidArgumentError(
        absl::StrCat("socket_path: ", final_path.string(), " is too long for a Unix socket"));
  }
  builder.AddListeningPort(absl::StrCat("unix:", temp), grpc::InsecureServerCredentials());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    cleanup();
    return absl::UnavailableError(
        absl::StrCat("socket_path: cannot listen on ", final_path.string()));
  }
  if (chmod(temp.c_str(), 0660) != 0 || rename(temp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    server->Shutdown();
    cleanup();
    return absl::InternalError(absl::StrCat("socket_path: cannot put the socket in place at ",
                                            final_path.string(), ": ", std::strerror(err)));
  }
  rmdir(dir.c_str());
  return server;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const v1::DaemonConfig& config) {
  if (absl::Status st = ValidateDaemonConfig(config); !st.ok()) return st;
  InstallRateLimitedProtobufLog();
  auto d = std::make_unique<Impl>();
  d->config = config;
  const v1::DaemonConfig& c = d->config;

  // The store first: a store held by another daemon is the commonest
  // start-up error, and it costs nothing else.
  StoreOptions so;
  // One line per entry the store removes (the admin calls and the janitor
  // log the call itself, with its duration).
  so.on_removed = [](std::string_view kind, std::string_view key, std::string_view detail) {
    if (kind == "quarantined") {
      LOG(WARNING) << "quarantine key=" << KeyPrefix(key)
                   << " reason=" << LogQuote(absl::string_view(detail.data(), detail.size()))
                   << " (never served; compiled again on the next request)";
    } else {
      LOG(INFO) << (kind == "evicted" ? "evict" : "invalidate") << " key=" << KeyPrefix(key);
    }
  };
  so.hot_cache_bytes = c.memory_cache_bytes();
  so.stats_flush_interval = absl::Milliseconds(c.stats_flush_ms());
  so.eviction_grace_period = absl::Milliseconds(c.eviction_grace_ms());
  auto store = Store::Open(c.store_path(), so);
  if (!store.ok()) {
    return absl::Status(store.status().code(), absl::StrCat("store_path ", c.store_path(), ": ",
                                                            store.status().message()));
  }
  d->store = *std::move(store);

  // NVRTC and the toolchain. A missing NVRTC is not fatal: the daemon still
  // serves admin calls, and kernel requests say why they cannot compile.
  d->nvrtc = std::make_unique<Nvrtc>(c.nvrtc_path());
  v1::Toolchain toolchain;
  absl::Status toolchain_status;
  if (auto tc = NvrtcToolchain(*d->nvrtc); tc.ok()) {
    toolchain = *tc;
    if (!c.toolchain_salt().empty()) {
      // Tests: pose as another toolchain (another build of the compiler).
      std::vector<std::string> opts(toolchain.options().begin(), toolchain.options().end());
      toolchain = MakeToolchain(toolchain.compiler(), toolchain.version(),
                                absl::StrCat(toolchain.build(), "+", c.toolchain_salt()), opts);
    }
  } else {
    toolchain_status = tc.status();
  }

  // Raw kernels: only when enabled (their fingerprint reads the ~100 MB
  // nvJitLink library). A missing nvJitLink leaves attention kernels alone.
  v1::Toolchain raw_toolchain;
  absl::Status raw_toolchain_status =
      absl::FailedPreconditionError("raw kernels are disabled (enable_raw_kernels)");
  std::string raw_token;
  if (c.enable_raw_kernels()) {
    auto token = ReadFile(c.admin_token_path(), "admin_token_path");
    if (!token.ok()) return token.status();
    raw_token = std::string(absl::StripAsciiWhitespace(*token));
    if (raw_token.empty()) {
      return absl::InvalidArgumentError("admin_token_path: the token file is empty");
    }
    d->nvjitlink = std::make_unique<NvJitLink>(c.nvjitlink_path());
    if (auto tc = RawToolchain(*d->nvjitlink); tc.ok()) {
      raw_toolchain = *tc;
      raw_toolchain_status = absl::OkStatus();
    } else {
      raw_toolchain_status = tc.status();
    }
  }

  auto remote = MakeSharedTier(c);
  if (!remote.ok()) return remote.status();
  d->remote = *std::move(remote);

  d->devices = CudaDevices::Open();
  WorkerPoolOptions wo;
  wo.worker_path = c.worker_path();
  wo.nvrtc_path = c.nvrtc_path();
  wo.nvjitlink_path = c.nvjitlink_path();
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  int threads =
      c.compile_threads() ? static_cast<int>(c.compile_threads()) : static_cast<int>(cores);
  wo.max_workers = c.compile_workers() ? static_cast<int>(c.compile_workers()) : threads;
  wo.limit_as_bytes = c.compile_limit_address_space_bytes();
  wo.limit_cpu_seconds = c.compile_limit_cpu_seconds();
  wo.limit_fsize_bytes = c.compile_limit_output_bytes();
  {
    auto show = [](uint64_t v, const char* unit) {
      return v == 0 ? std::string("unlimited") : absl::StrCat(v, unit);
    };
    LOG(INFO) << "compile worker limits: address space " << show(wo.limit_as_bytes, " bytes")
              << ", CPU time " << show(wo.limit_cpu_seconds, " s per compile")
              << ", output file size " << show(wo.limit_fsize_bytes, " bytes")
              << ", core dumps off";
  }
  d->workers = std::make_unique<WorkerPool>(wo);
  {
    // What a compile worker actually gets here (the platform may refuse the
    // network drop: user namespaces off, or systemd's RestrictNamespaces=).
    absl::StatusOr<std::string> sandbox = d->workers->Probe();
    LOG(INFO) << "compile worker sandbox: "
              << (sandbox.ok() ? *sandbox
                               : absl::StrCat("unknown (", sandbox.status().ToString(), ")"));
  }

  Scheduler::Options sched;
  sched.compile_threads = threads;
  sched.max_queue_depth = static_cast<int>(c.max_queue_depth());
  sched.error_ttl = absl::Milliseconds(c.error_memo_ms());
  d->scheduler = std::make_unique<Scheduler>(sched);

  BackendDeps deps;
  deps.store = d->store.get();
  deps.scheduler = d->scheduler.get();
  deps.compiler = d->workers.get();
  deps.devices = d->devices.get();
  if (d->devices->Availability().ok()) {
    d->numeric = std::make_unique<CudaNumericRunner>(d->devices.get());
    deps.numeric_runner = d->numeric.get();
  }
  deps.toolchain = toolchain;
  deps.toolchain_status = toolchain_status;
  deps.raw_toolchain = raw_toolchain;
  deps.raw_toolchain_status = raw_toolchain_status;
  deps.config = c;
  deps.metrics = &d->metrics;
  deps.remote = d->remote.get();
  d->backend = std::make_unique<KernelBackend>(std::move(deps));

  // Metrics that are read at scrape time.
  Scheduler* sp = d->scheduler.get();
  d->metrics.AddGauge("kcache_queue_depth", "Compiles queued per queue", [sp] {
    std::vector<std::pair<std::string, double>> out;
    for (const QueueStats& q : sp->Stats()) {
      out.emplace_back(absl::StrCat("queue=\"", q.name, "\""), q.depth);
    }
    return out;
  });
  if (d->remote != nullptr) AddRemoteMetrics(d->metrics, d->remote.get());
  // Bytes and counts are separate metrics (a metric has one unit). Store
  // statistics scan the records, so the three gauges of one scrape share one
  // scan: a result is reused for a second.
  struct StoreStatsCache {
    Store* store;
    absl::Mutex mu;
    absl::Time taken ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    std::optional<v1::StatsResponse> stats ABSL_GUARDED_BY(mu);
    std::optional<v1::StatsResponse> Get() {
      absl::MutexLock lock(&mu);  // held across the scan: one scan at a time
      if (absl::Now() - taken > absl::Seconds(1)) {
        auto s = store->Stats();
        stats = s.ok() ? std::optional<v1::StatsResponse>(*std::move(s)) : std::nullopt;
        taken = absl::Now();
      }
      return stats;
    }
  };
  auto store_stats = std::make_shared<StoreStatsCache>();
  store_stats->store = d->store.get();
  auto store_gauge = [store_stats](uint64_t (v1::StatsResponse::*field)() const) {
    return [store_stats, field] {
      std::vector<std::pair<std::string, double>> out;
      if (auto s = store_stats->Get()) out.emplace_back("", static_cast<double>(((*s).*field)()));
      return out;
    };
  };
  d->metrics.AddGauge("kcache_store_bytes", "Distinct cubin bytes in the store",
                      store_gauge(&v1::StatsResponse::blob_bytes));
  d->metrics.AddGauge("kcache_store_entries", "Entries (records) in the store",
                      store_gauge(&v1::StatsResponse::entries));
  d->metrics.AddGauge("kcache_store_quarantined_entries",
                      "Entries in the quarantine (failed a digest or decoding check)",
                      store_gauge(&v1::StatsResponse::quarantined));

  // The build, as a constant 1 with labels (Prometheus' *_build_info):
  // `kcached --version` says the same, and nvrtc is the library found at run
  // time ("none" when the daemon cannot compile).
  {
    std::string labels = absl::StrCat(
        "version=\"", KCACHE_VERSION_STRING, "\",cuda=\"", KCACHE_CUDA_HEADERS_VERSION,
        "\",nvrtc=\"", toolchain_status.ok() ? toolchain.version() : std::string("none"), "\"");
    d->metrics.AddGauge("kcache_build_info", "kcached's version and build (always 1)", [labels] {
      return std::vector<std::pair<std::string, double>>{{labels, 1}};
    });
  }

  WorkerPool* pool = d->workers.get();
  d->metrics.AddCounterFunc("kcache_compile_worker_retries_total",
                            "Compiles retried on a fresh worker after their worker died", [pool] {
                              return std::vector<std::pair<std::string, double>>{
                                  {"", static_cast<double>(pool->retried_compiles())}};
                            });

  d->metrics.AddCounterFunc(
      "kcache_compile_limit_exceeded_total",
      "Compiles that hit a compile worker's resource limit, by limit (not retried)", [pool] {
        std::vector<std::pair<std::string, double>> out;
        for (int l = 0; l < WorkerPool::kNumLimits; ++l) {
          const auto limit = static_cast<WorkerPool::Limit>(l);
          out.emplace_back(absl::StrCat("limit=\"", WorkerPool::LimitName(limit), "\""),
                           static_cast<double>(pool->limit_exceeded(limit)));
        }
        return out;
      });

  // gRPC.
  uint64_t max_spec = std::min<uint64_t>(c.max_message_bytes(), 1u << 20);
  RawKernelPolicy raw_policy;
  raw_policy.enabled = c.enable_raw_kernels();
  raw_policy.token = raw_token;
  raw_policy.max_source_bytes = c.max_raw_source_bytes();
  // What one request may make the daemon allocate, checked before it is
  // parsed (service/request_parse.h): a spec of at most max_spec bytes, or a
  // raw kernel's source when those are on, plus room for the rest.
  RequestLimits limits;
  constexpr uint64_t kEnvelopeBytes = 64u << 10;  // target, names, field headers
  limits.max_request_bytes = std::min<uint64_t>(
      c.max_message_bytes(),
      max_spec + kEnvelopeBytes + (c.enable_raw_kernels() ? c.max_raw_source_bytes() : 0));
  limits.max_prefetch_requests = c.max_prefetch_requests();
  d->kernel_service = std::make_unique<KernelServiceImpl>(
      d->backend.get(), &d->state, max_spec, absl::Milliseconds(c.default_deadline_ms()),
      raw_policy, limits);
  d->admin_local = std::make_unique<AdminServiceImpl>(d->store.get(), d->backend.get(), &d->state,
                                                      "", &d->metrics);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  if (!c.socket_path().empty()) {
    if (absl::Status s = PrepareSocketPath(c.socket_path()); !s.ok()) return s;
    grpc::ServerBuilder b;
    b.SetMaxReceiveMessageSize(static_cast<int>(c.max_message_bytes()));
    b.SetMaxSendMessageSize(static_cast<int>(c.max_message_bytes()));
    b.experimental().SetInterceptorCreators(MalformedRequestInterceptors());
    b.RegisterService(d->kernel_service.get());
    b.RegisterService(d->admin_local.get());
    auto server = ListenOnUnixSocket(b, c.socket_path());
    if (!server.ok()) return server.status();
    d->local_server = *std::move(server);
  }
  if (!c.tcp_address().empty()) {
    grpc::ServerBuilder b;
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    bool tls = !c.tls_cert_path().empty();
    if (tls) {
      auto cert = ReadFile(c.tls_cert_path(), "tls_cert_path");
      if (!cert.ok()) return cert.status();
      auto key = ReadFile(c.tls_key_path(), "tls_key_path");
      if (!key.ok()) return key.status();
      grpc::SslServerCredentialsOptions ssl;
      ssl.pem_key_cert_pairs.push_back({*key, *cert});
      creds = grpc::SslServerCredentials(ssl);
    }
    b.AddListeningPort(c.tcp_address(), creds, &d->tcp_port);
    // Plaintext TCP is unauthenticated and serves neither raw kernels nor
    // admin calls: no request there needs more than a spec's bytes, and a
    // Prefetch of specs fits in 8 MiB. Its receive limit bounds what any
    // caller can make gRPC buffer per call before kcached sees a byte.
    RequestLimits tcp_limits = limits;
    uint64_t tcp_max_receive = c.max_message_bytes();
    if (!tls) {
      tcp_limits.max_request_bytes =
          std::min<uint64_t>(limits.max_request_bytes, max_spec + kEnvelopeBytes);
      tcp_max_receive = std::min<uint64_t>(
          c.max_message_bytes(), std::max<uint64_t>(tcp_limits.max_request_bytes, 8u << 20));
    }
    b.SetMaxReceiveMessageSize(static_cast<int>(tcp_max_receive));
    b.SetMaxSendMessageSize(static_cast<int>(c.max_message_bytes()));
    b.experimental().SetInterceptorCreators(MalformedRequestInterceptors());
    // The admin token (which raw kernels need) counts only where admin
    // calls are accepted: never over plaintext TCP.
    RawKernelPolicy tcp_raw = raw_policy;
    tcp_raw.token_accepted_here = tls;
    d->kernel_service_tcp = std::make_unique<KernelServiceImpl>(
        d->backend.get(), &d->state, max_spec, absl::Milliseconds(c.default_deadline_ms()), tcp_raw,
        tcp_limits);
    b.RegisterService(d->kernel_service_tcp.get());
    // Admin over TCP only with TLS and a token; otherwise the Unix socket
    // (and its file mode) is the only way in.
    if (tls && !c.admin_token_path().empty()) {
      auto token = ReadFile(c.admin_token_path(), "admin_token_path");
      if (!token.ok()) return token.status();
      std::string t(absl::StripAsciiWhitespace(*token));
      if (t.empty()) return absl::InvalidArgumentError("admin_token_path: the token file is empty");
      d->admin_tcp = std::make_unique<AdminServiceImpl>(d->store.get(), d->backend.get(), &d->state,
                                                        t, &d->metrics);
      b.RegisterService(d->admin_tcp.get());
    }
    d->tcp_server = b.BuildAndStart();
    if (d->tcp_server == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("tcp_address: cannot listen on ", c.tcp_address()));
    }
  }
  if (!c.metrics_address().empty()) {
    MetricsRegistry* m = &d->metrics;
    auto http = HttpServer::Start(c.metrics_address(), [m] { return m->Render(); });
    if (!http.ok()) return http.status();
    d->http = *std::move(http);
  }

  if (c.max_store_bytes() > 0) {
    Impl* raw = d.get();
    d->janitor = std::thread([raw] { raw->JanitorLoop(); });
  }

  // The start-up report: effective configuration, toolchain, devices.
  LOG(INFO) << "configuration " << DaemonConfigToJson(c);
  if (toolchain_status.ok()) {
    LOG(INFO) << "toolchain " << toolchain.compiler() << " " << toolchain.version() << " id "
              << toolchain.id();
  } else {
    LOG(WARNING) << "cannot compile: " << toolchain_status.message()
                 << " (kernel requests are answered FAILED_PRECONDITION)";
  }
  if (c.enable_raw_kernels()) {
    if (raw_toolchain_status.ok()) {
      LOG(INFO) << "raw kernels enabled (admin token only): toolchain " << raw_toolchain.compiler()
                << " " << raw_toolchain.version() << " id " << raw_toolchain.id();
    } else {
      LOG(WARNING) << "raw kernels enabled but cannot compile: " << raw_toolchain_status.message();
    }
  }
  if (!d->backend->compile_only()) {
    for (const DeviceInfo& dev : d->backend->devices()) {
      LOG(INFO) << "device " << dev.ordinal << ": " << dev.name << " (" << dev.arch << ", "
                << dev.sm_count << " SMs)";
    }
  } else {
    absl::Status a = d->devices->Availability();
    // Availability's message starts with "compile-only mode: ...".
    LOG(INFO) << (c.compile_only() ? std::string("compile-only mode (configured)")
                                   : std::string(a.message()));
  }
  LOG(INFO) << "serving on " << (c.socket_path().empty() ? "" : "unix:" + c.socket_path())
            << (c.tcp_address().empty() ? "" : absl::StrCat(" tcp port ", d->tcp_port))
            << (d->http ? absl::StrCat(" metrics port ", d->http->port()) : "");
  return std::unique_ptr<Daemon>(new Daemon(std::move(d)));
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() { (void)Shutdown(); }

int Daemon::metrics_port() const { return impl_->http ? impl_->http->port() : 0; }
int Daemon::tcp_port() const { return impl_->tcp_port; }

absl::Status Daemon::Shutdown() {
  Impl& d = *impl_;
  absl::MutexLock lock(&d.shutdown_mu);
  if (d.shut_down) return absl::OkStatus();
  d.shut_down = true;
  d.state.shutting_down.store(true);
  if (d.remote) d.remote->Stop();  // compiles waiting on another node's lease go on alone
  // Queued compiles fail with UNAVAILABLE now; running ones may finish.
  absl::Status sched = d.scheduler->Shutdown(absl::Milliseconds(d.config.shutdown_grace_ms()));
  // Calls still waiting for a compile that outlived the grace are answered
  // UNAVAILABLE now (clients retry), not cancelled at the servers' deadline.
  if (d.kernel_service) d.kernel_service->AbandonWaits();
  if (d.kernel_service_tcp) d.kernel_service_tcp->AbandonWaits();
  auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(5);
  if (d.local_server) d.local_server->Shutdown(deadline);
  if (d.tcp_server) d.tcp_server->Shutdown(deadline);
  d.http.reset();
  if (d.janitor.joinable()) {
    {
      absl::MutexLock jl(&d.janitor_mu);
      d.janitor_stop = true;
    }
    d.janitor.join();
  }
  if (!sched.ok()) {
    // A compile still running uses the backend and publishes to the store:
    // it must end before the store closes (and before ~Impl frees the
    // backend, which is destroyed before the scheduler). Its worker is
    // killed at the compile's deadline, so this wait is bounded by it.
    LOG(WARNING) << sched.message() << "; waiting for them before closing the store";
    d.scheduler->Shutdown(absl::InfiniteDuration()).IgnoreError();
  }
  absl::Status closed = d.store->Close();
  if (!d.config.socket_path().empty()) {
    // Ours, unless something replaced it meanwhile: remove only a socket.
    struct stat st;
    if (lstat(d.config.socket_path().c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      unlink(d.config.socket_path().c_str());
    }
  }
  if (!sched.ok()) return sched;
  return closed;
}

}  // namespace kcache
