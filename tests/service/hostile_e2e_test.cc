// Issue 17 (service items): a real kcached in compile-only mode against
// hostile or mistaken input. Malformed protobuf on every method, invalid
// UTF-8, a Prefetch built to amplify memory, unknown fields outside the
// spec, a --socket_path that names some other file, the socket's mode while
// it is created, configuration errors' exit status, and the admin token over
// plaintext TCP, a compile worker killed while idle. Each test failed
// against the daemon before its fix.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_process.h"
#include "tests/common/distinct_spec.h"
#include "tests/common/raw_fixtures.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::DistinctSpec;
using ::kcache::testing::RawKernelFlags;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

std::shared_ptr<grpc::Channel> Unix(const DaemonProcess& d) {
  return grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials());
}

int TcpPort(const DaemonProcess& d) {
  const std::string log = ReadFileOrEmpty(d.log_path());
  const size_t at = log.rfind("tcp port ");
  return at == std::string::npos ? 0 : std::atoi(log.c_str() + at + 9);
}

struct RawResult {
  grpc::Status status;
  int messages = 0;
};

// Sends `bytes` as the one request message of `method` (any kind: the
// generic call writes one message, half-closes and reads every answer).
RawResult CallRaw(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                  const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  grpc::CompletionQueue cq;
  void* tag;
  bool ok;
  auto call = stub.PrepareCall(&ctx, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  call->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  RawResult r;
  for (;;) {
    grpc::ByteBuffer in;
    call->Read(&in, reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    if (!ok) break;
    ++r.messages;
  }
  call->Finish(&r.status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return r;
}

// Peak resident memory of a process, in bytes (VmHWM).
uint64_t PeakRss(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmHWM:")) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Runs kcached with `args` (after --compile_only) and returns its exit
// status (or -1), its output in `*log`.
int RunKcached(const TempDir& dir, const std::vector<std::string>& args, std::string* log) {
  const char* env = std::getenv("KCACHE_TEST_KCACHED");  // as KcachedProcess
  std::string cmd =
      absl::StrCat(env != nullptr ? env : KCACHE_TEST_KCACHED_PATH, " --compile_only=true");
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  const std::string out = dir.Sub("run.log");
  absl::StrAppend(&cmd, " >", out, " 2>&1 </dev/null");
  // A daemon that did start would serve forever: bound it.
  cmd = absl::StrCat("timeout -s KILL 60 ", cmd);
  const int rc = std::system(cmd.c_str());
  *log = ReadFileOrEmpty(out);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// --- item 7: every refusal has a code and a message ----------------------------

TEST(HostileE2E, MalformedProtobufIsInvalidArgumentWithAMessageOnEveryMethod) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  const std::string garbage = "\xff\xff\xff\xff";
  for (const char* method :
       {"/kcache.v1.KernelService/GetKernel", "/kcache.v1.KernelService/GetKernelStream",
        "/kcache.v1.KernelService/Prefetch", "/kcache.v1.AdminService/Stats",
        "/kcache.v1.AdminService/Inspect", "/kcache.v1.AdminService/Evict"}) {
    RawResult r = CallRaw(Unix(d), method, garbage);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << r.status.error_code() << " " << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr("not a valid kcache.v1.")) << method;
  }
  // The daemon is unharmed.
  EXPECT_EQ(d.Stats().compiles(), 0u);
}

TEST(HostileE2E, InvalidUtf8IsRefusedWithoutALogLinePerRequest) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  // target { arch: "\xff" }
  const std::string bad_arch("\x12\x03\x0a\x01\xff", 5);
  for (int i = 0; i < 20; ++i) {
    RawResult r = CallRaw(Unix(d), "/kcache.v1.KernelService/GetKernel", bad_arch);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_FALSE(r.status.error_message().empty());
  }
  const std::string log = ReadFileOrEmpty(d.log_path());
  int lines = 0;
  for (absl::string_view l : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(l, "UTF-8")) ++lines;
  }
  EXPECT_LE(lines, 1) << log;
}

// --- item 4: request sizes and counts bounded before allocation --------------

TEST(HostileE2E, PrefetchBuiltToAmplifyMemoryIsRefusedBeforeItIsParsed) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  // 10 MB of empty entries: 5 million GetKernelRequests once parsed.
  std::string bytes;
  bytes.reserve(10 << 20);
  while (bytes.size() < (10u << 20)) bytes.append("\x0a\x00", 2);
  RawResult r = CallRaw(Unix(d), "/kcache.v1.KernelService/Prefetch", bytes);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.status.error_message();
  EXPECT_THAT(r.status.error_message(), HasSubstr("max_prefetch_requests"));

  // One spec of 200,000 empty buffers (400 KB).
  v1::GetKernelRequest req;
  *req.mutable_spec() = DistinctSpec(0);
  req.mutable_target()->set_arch("sm_80");
  for (int i = 0; i < 200000; ++i) req.mutable_spec()->add_buffers();
  r = CallRaw(Unix(d), "/kcache.v1.KernelService/GetKernelStream", req.SerializeAsString());
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.status.error_message();
  EXPECT_THAT(r.status.error_message(), HasSubstr("fields"));

  // Before the fix the Prefetch alone took the daemon past 1.2 GB.
  EXPECT_LT(PeakRss(d.pid()), uint64_t{400} << 20);
  EXPECT_EQ(d.Stats().compiles(), 0u);
}

TEST(HostileE2E, MaxPrefetchRequestsIsAFlag) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--max_prefetch_requests=2"});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto stub = v1::KernelService::NewStub(Unix(d));
  v1::PrefetchRequest p;
  for (int i = 0; i < 3; ++i) {
    v1::GetKernelRequest* r = p.add_requests();
    r->mutable_target()->set_arch("sm_75");  // refused: nothing compiles
  }
  grpc::ClientContext ctx;
  v1::PrefetchResponse resp;
  grpc::Status st = stub->Prefetch(&ctx, p, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("more than 2 entries (max_prefetch_requests)"));
  p.mutable_requests()->RemoveLast();
  grpc::ClientContext ok_ctx;
  st = stub->Prefetch(&ok_ctx, p, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_EQ(resp.results(0).state(), v1::PrefetchResult::STATE_REJECTED);
}

// Plaintext TCP (no token, no raw kernels, no admin) receives at most 8 MiB
// a message, whatever --max_message_bytes allows the trusted listeners.
TEST(HostileE2E, PlaintextTcpReceivesAtMost8MiBAMessage) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--tcp_address=127.0.0.1:0"});
  ASSERT_NO_FATAL_FAILURE(d.Start());
  const int port = TcpPort(d);
  ASSERT_GT(port, 0);
  // spec { buffers { name: <9 MiB> } } target { arch: "sm_80" }: one
  // field, many bytes (a GetKernelRequest in protobuf's wire format).
  auto field = [](char tag, const std::string& payload) {
    std::string out(1, tag);
    for (uint64_t n = payload.size();; n >>= 7) {
      if (n < 0x80) {
        out.push_back(static_cast<char>(n));
        break;
      }
      out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    }
    return out + payload;
  };
  const std::string req = field('\x0a', field('\x4a', field('\x0a', std::string(9u << 20, 'a')))) +
                          field('\x12', field('\x0a', "sm_80"));
  auto tcp =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  RawResult r = CallRaw(tcp, "/kcache.v1.KernelService/GetKernel", req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << r.status.error_message();
  // The Unix socket's limit is --max_message_bytes (64 MiB): the same bytes
  // reach kcached, which refuses them by its per-request limit.
  r = CallRaw(Unix(d), "/kcache.v1.KernelService/GetKernel", req);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.status.error_message();
  EXPECT_THAT(r.status.error_message(), HasSubstr("bytes per GetKernelRequest"));
}

// --- item 10: unknown fields outside the spec ---------------------------------

TEST(HostileE2E, UnknownFieldsAtTheTopLevelAndInTargetAreRefusedNamingThem) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto stub = v1::KernelService::NewStub(Unix(d));
  v1::GetKernelRequest top;
  *top.mutable_spec() = DistinctSpec(0);
  top.mutable_target()->set_arch("sm_80");
  v1::GetKernelRequest target = top;
  top.GetReflection()->MutableUnknownFields(&top)->AddVarint(99, 1);
  target.mutable_target()
      ->GetReflection()
      ->MutableUnknownFields(target.mutable_target())
      ->AddVarint(9, 1);
  for (const auto& [req, expected] : {std::pair{top, "request: unknown field number 99"},
                                      std::pair{target, "target: unknown field number 9"}}) {
    grpc::ClientContext ctx;
    v1::GetKernelResponse resp;
    grpc::Status st = stub->GetKernel(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr(expected));
  }
  EXPECT_EQ(d.Stats().compiles(), 0u);
}

// --- item 5: --socket_path never deletes another file -------------------------

TEST(HostileE2E, SocketPathNamingAnotherFileIsRefusedAndTheFileKept) {
  TempDir dir;
  std::filesystem::create_directories(dir.Sub("store"));
  // The store's own CURRENT, or any regular file: kept, byte for byte.
  const std::string file = dir.Sub("CURRENT");
  std::ofstream(file) << "MANIFEST-000005\n";
  std::filesystem::create_directory(dir.Sub("empty-dir"));
  std::filesystem::create_symlink(file, dir.Sub("link"));
  for (const std::string& path : {file, dir.Sub("empty-dir"), dir.Sub("link")}) {
    std::string log;
    const int rc =
        RunKcached(dir, {"--store_path=" + dir.Sub("store"), "--socket_path=" + path}, &log);
    EXPECT_EQ(rc, 2) << path << ": " << log;
    EXPECT_THAT(log, HasSubstr("not a socket")) << path;
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::symlink_status(path))) << path;
  }
  EXPECT_EQ(ReadFileOrEmpty(file), "MANIFEST-000005\n");
  EXPECT_TRUE(std::filesystem::is_symlink(dir.Sub("link")));
}

TEST(HostileE2E, StaleSocketIsReplaced) {
  TempDir dir;
  const std::string path = dir.Sub("kcached.sock");
  // A socket with no listener: what a killed daemon leaves.
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  EXPECT_EQ(d.Stats().compiles(), 0u);
}

// --- item 10: the socket never exists with the umask's mode -------------------

TEST(HostileE2E, SocketAppearsUnderItsNameWithMode0660Only) {
  TempDir dir;
  const int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(in, 0);
  ASSERT_GE(inotify_add_watch(in, dir.path().c_str(), IN_CREATE | IN_MOVED_TO), 0);
  const mode_t old_umask = umask(0);  // inherited by the daemon: the worst case
  DaemonProcess d(dir.path());
  absl::Status started = d.TryStart();
  umask(old_umask);
  ASSERT_TRUE(started.ok()) << started;
  // Created elsewhere and moved into place (so that it was never reachable
  // under its name with the umask's mode before the chmod), never created
  // there.
  bool moved_in = false, created = false;
  alignas(inotify_event) char buf[64 * 1024];
  ssize_t n;
  while ((n = read(in, buf, sizeof(buf))) > 0) {
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(p);
      if (ev->len > 0 && std::string(ev->name) == "kcached.sock") {
        if (ev->mask & IN_CREATE) created = true;
        if (ev->mask & IN_MOVED_TO) moved_in = true;
      }
      p += sizeof(inotify_event) + ev->len;
    }
  }
  close(in);
  EXPECT_FALSE(created);
  EXPECT_TRUE(moved_in);
  struct stat st;
  ASSERT_EQ(lstat(d.socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  // No leftovers of the private directory it was bound in.
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_THAT(e.path().filename().string(), ::testing::Not(HasSubstr(".kcached-")));
  }
}

// --- item 10: configuration errors found at start exit 2 ----------------------

TEST(HostileE2E, ConfigurationErrorsFoundAtStartExit2) {
  TempDir dir;
  std::ofstream(dir.Sub("empty.token")) << "\n";
  const std::vector<std::string> common = {"--store_path=" + dir.Sub("store"),
                                           "--socket_path=" + dir.Sub("kcached.sock")};
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--enable_raw_kernels=true", "--admin_token_path=" + dir.Sub("missing.token")},
       "admin_token_path"},
      {{"--enable_raw_kernels=true", "--admin_token_path=" + dir.Sub("empty.token")},
       "admin_token_path"},
      {{"--metrics_address=not-an-address"}, "metrics"},
      {{"--tcp_address=127.0.0.1:0", "--tls_cert_path=" + dir.Sub("missing.crt"),
        "--tls_key_path=" + dir.Sub("missing.key")},
       "tls_cert_path"},
  };
  for (const auto& [extra, expected] : cases) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    std::string log;
    EXPECT_EQ(RunKcached(dir, args, &log), 2) << extra[0] << ": " << log;
    EXPECT_THAT(log, HasSubstr(expected));
  }
}

// --- item 6: the admin token never counts on plaintext TCP --------------------

TEST(HostileE2E, RawKernelWithTheTokenIsRefusedOverPlaintextTcp) {
  TempDir dir;
  constexpr char kToken[] = "hostile-e2e-token";
  std::vector<std::string> args = RawKernelFlags(dir.path(), kToken);
  args.push_back("--tcp_address=127.0.0.1:0");
  DaemonProcess d(dir.path(), args);
  ASSERT_NO_FATAL_FAILURE(d.Start());
  const int port = TcpPort(d);
  ASSERT_GT(port, 0);
  v1::GetKernelRequest req;
  req.mutable_raw()->set_format(v1::RawKernel::FORMAT_PTX);
  req.mutable_raw()->set_source("not ptx");
  req.mutable_raw()->add_kernel_names("k");
  req.mutable_target()->set_arch("sm_80");
  auto call = [&](const std::shared_ptr<grpc::Channel>& ch) {
    auto stub = v1::KernelService::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(1)));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::GetKernelResponse resp;
    return stub->GetKernel(&ctx, req, &resp);
  };
  grpc::Status tcp = call(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(tcp.error_code(), grpc::StatusCode::PERMISSION_DENIED) << tcp.error_message();
  EXPECT_THAT(tcp.error_message(), HasSubstr("plaintext TCP"));
  // On the Unix socket the same token is accepted (the PTX is then refused
  // as PTX, or compiled: anything but a permission error).
  grpc::Status local = call(Unix(d));
  EXPECT_NE(local.error_code(), grpc::StatusCode::PERMISSION_DENIED) << local.error_message();
}

// --- item 8: a compile worker that died while idle -----------------------------

// The processes whose parent is `pid`.
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');  // comm may hold spaces
    if (close == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
    if (f.size() > 1 && std::atoi(f[1].c_str()) == pid) out.push_back(std::stoi(name));
  }
  return out;
}

TEST(HostileE2E, CompileWorkerKilledWhileIdleDoesNotFailTheNextCompile) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto stub = v1::KernelService::NewStub(Unix(d));
  auto fetch = [&](int i) {
    v1::GetKernelRequest req;
    *req.mutable_spec() = DistinctSpec(i);
    req.mutable_target()->set_arch("sm_80");
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
    v1::GetKernelResponse resp;
    return stub->GetKernel(&ctx, req, &resp);
  };
  grpc::Status first = fetch(0);
  ASSERT_TRUE(first.ok()) << first.error_message();
  const std::vector<pid_t> workers = ChildrenOf(d.pid());
  ASSERT_FALSE(workers.empty());
  for (pid_t w : workers) kill(w, SIGKILL);  // the OOM killer, say
  grpc::Status next = fetch(1);              // another kernel: needs a compile
  EXPECT_TRUE(next.ok()) << next.error_code() << " " << next.error_message();
  EXPECT_EQ(d.Stats().compile_failures(), 0u);
}

}  // namespace
}  // namespace kcache
