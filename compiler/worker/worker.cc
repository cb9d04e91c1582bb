// Compile-worker protocol: framing, conversions and the serve loop.
#include "compiler/worker/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "compiler/cuda/nvjitlink.h"
#include "compiler/cuda/nvrtc.h"

namespace kcache::worker {
namespace {

// Milliseconds poll() should wait for `deadline`; -1 for none.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
                        absl::ToInt64Milliseconds(absl::Hours(24))));
}

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFd(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, PollTimeoutMs(deadline));
    if (n > 0) return absl::OkStatus();  // ready, or HUP/ERR: the I/O call says which
    if (n == 0) {
      if (absl::Now() >= deadline)
        return absl::DeadlineExceededError("compile worker I/O deadline");
      continue;
    }
    if (errno != EINTR) return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
  }
}

absl::Status WriteAll(int fd, const char* data, size_t size, absl::Time deadline) {
  while (size > 0) {
    if (absl::Status s = WaitFd(fd, POLLOUT, deadline); !s.ok()) return s;
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EPIPE || errno == ECONNRESET) return absl::UnavailableError("peer closed");
      return absl::InternalError(absl::StrCat("send: ", strerror(errno)));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Reads exactly `size` bytes. `*got_any` tells a clean EOF from a torn frame.
absl::Status ReadAll(int fd, char* data, size_t size, absl::Time deadline, bool* got_any) {
  while (size > 0) {
    if (absl::Status s = WaitFd(fd, POLLIN, deadline); !s.ok()) return s;
    const ssize_t n = recv(fd, data, size, MSG_DONTWAIT);
    if (n == 0) {
      return *got_any ? absl::UnavailableError("peer closed mid-frame")
                      : absl::NotFoundError("peer closed");
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return absl::UnavailableError("peer reset the connection");
      return absl::InternalError(absl::StrCat("recv: ", strerror(errno)));
    }
    *got_any = true;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFrame(int fd, const std::string& payload, absl::Time deadline) {
  if (payload.size() > kMaxFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", payload.size(), " bytes exceeds ", kMaxFrameBytes));
  }
  const uint32_t n = static_cast<uint32_t>(payload.size());
  const char len[4] = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                       static_cast<char>((n >> 16) & 0xff), static_cast<char>((n >> 24) & 0xff)};
  if (absl::Status s = WriteAll(fd, len, 4, deadline); !s.ok()) return s;
  return WriteAll(fd, payload.data(), payload.size(), deadline);
}

absl::StatusOr<std::string> ReadFrame(int fd, absl::Time deadline) {
  unsigned char len[4];
  bool got_any = false;
  if (absl::Status s = ReadAll(fd, reinterpret_cast<char*>(len), 4, deadline, &got_any); !s.ok())
    return s;
  const uint32_t n =
      uint32_t{len[0]} | uint32_t{len[1]} << 8 | uint32_t{len[2]} << 16 | uint32_t{len[3]} << 24;
  if (n > kMaxFrameBytes)
    return absl::DataLossError(absl::StrCat("frame length ", n, " too large"));
  std::string payload(n, '\0');
  if (absl::Status s = ReadAll(fd, payload.data(), n, deadline, &got_any); !s.ok()) return s;
  return payload;
}

CompileRequest ToRequest(const CompileInput& input, absl::Time deadline) {
  CompileRequest r;
  r.set_source(input.source);
  r.set_program_name(input.program_name);
  for (const auto& [name, contents] : input.headers) {
    Header* h = r.add_headers();
    h->set_name(name);
    h->set_contents(contents);
  }
  r.set_arch(input.arch);
  for (const std::string& o : input.extra_options) r.add_extra_options(o);
  for (const std::string& u : input.more_units) r.add_more_units(u);
  if (deadline != absl::InfiniteFuture()) r.set_deadline_unix_us(absl::ToUnixMicros(deadline));
  if (input.raw.has_value()) {
    RawSource* raw = r.mutable_raw();
    raw->set_format(static_cast<int>(input.raw->format));
    raw->set_source(input.raw->bytes);
    for (const std::string& n : input.raw->kernel_names) raw->add_kernel_names(n);
  }
  return r;
}

CompileInput FromRequest(const CompileRequest& r, absl::Time* deadline) {
  CompileInput in;
  in.source = r.source();
  in.program_name = r.program_name();
  for (const Header& h : r.headers()) in.headers[h.name()] = h.contents();
  in.arch = r.arch();
  in.extra_options.assign(r.extra_options().begin(), r.extra_options().end());
  in.more_units.assign(r.more_units().begin(), r.more_units().end());
  if (r.has_raw()) {
    kcache::RawSource raw;
    raw.format = static_cast<RawFormat>(r.raw().format());
    raw.bytes = r.raw().source();
    raw.kernel_names.assign(r.raw().kernel_names().begin(), r.raw().kernel_names().end());
    in.raw = std::move(raw);
  }
  *deadline = r.deadline_unix_us() == 0 ? absl::InfiniteFuture()
                                        : absl::FromUnixMicros(r.deadline_unix_us());
  return in;
}

CompileResponse ToResponse(const absl::StatusOr<CompileOutput>& result) {
  CompileResponse r;
  if (!result.ok()) {
    r.set_status_code(static_cast<int>(result.status().code()));
    r.set_status_message(std::string(result.status().message()));
    return r;
  }
  r.set_cubin(result->cubin);
  r.set_log(result->log);
  for (const kcache::KernelReport& k : result->kernels) {
    worker::KernelReport* w = r.add_kernels();
    w->set_name(k.name);
    w->set_registers(k.registers);
    w->set_static_smem_bytes(k.static_smem_bytes);
    w->set_stack_frame_bytes(k.stack_frame_bytes);
    w->set_spill_store_bytes(k.spill_store_bytes);
    w->set_spill_load_bytes(k.spill_load_bytes);
  }
  r.set_wall_time_us(absl::ToInt64Microseconds(result->wall_time));
  return r;
}

absl::StatusOr<CompileOutput> FromResponse(const CompileResponse& r) {
  if (r.status_code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(r.status_code()), r.status_message());
  }
  CompileOutput out;
  out.cubin = r.cubin();
  out.log = r.log();
  for (const worker::KernelReport& w : r.kernels()) {
    out.kernels.push_back(kcache::KernelReport{w.name(), w.registers(), w.static_smem_bytes(),
                                               w.stack_frame_bytes(), w.spill_store_bytes(),
                                               w.spill_load_bytes()});
  }
  out.wall_time = absl::Microseconds(r.wall_time_us());
  return out;
}

namespace {

bool SetLimit(int resource, uint64_t value, const char* name) {
  rlimit r;
  if (getrlimit(resource, &r) != 0) r.rlim_max = RLIM_INFINITY;
  r.rlim_cur = static_cast<rlim_t>(value);
  if (r.rlim_max != RLIM_INFINITY && r.rlim_cur > r.rlim_max) r.rlim_cur = r.rlim_max;
  if (setrlimit(resource, &r) != 0) {
    std::fprintf(stderr, "kcache-compile-worker: setrlimit(%s): %s\n", name, strerror(errno));
    return false;
  }
  return true;
}

[[noreturn]] void OutOfMemory() {
  static const char msg[] = "kcache-compile-worker: out of memory (address-space limit)\n";
  (void)!write(2, msg, sizeof(msg) - 1);
  _exit(kExitOutOfMemory);
}

// Soft RLIMIT_CPU = CPU seconds used so far + the per-compile budget: the
// kernel sends SIGXCPU (default action: terminate) when it is reached.
void ArmCpuLimit(uint64_t budget_seconds) {
  if (budget_seconds == 0) return;
  rusage u;
  if (getrusage(RUSAGE_SELF, &u) != 0) return;
  const uint64_t used = static_cast<uint64_t>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1;
  SetLimit(RLIMIT_CPU, used + budget_seconds, "RLIMIT_CPU");
}

void AllocateUntilItFails() {
  std::fprintf(stderr, "kcache-compile-worker: test fault: allocating until it fails\n");
  std::fflush(stderr);
  std::vector<char*> blocks;
  for (int i = 0; i < 1024; ++i) {  // 64 MiB at a time, up to 64 GiB
    char* b = new char[size_t{64} << 20];
    b[0] = 1;  // address space is what is limited; touch one page only
    blocks.push_back(b);
  }
  for (char* b : blocks) delete[] b;
}

[[noreturn]] void SpinForever() {
  std::fprintf(stderr, "kcache-compile-worker: test fault: spinning\n");
  std::fflush(stderr);
  for (volatile uint64_t n = 0;; n = n + 1) {
  }
}

absl::Status ErrnoStatus(const char* what) {
  return absl::PermissionDeniedError(absl::StrCat(what, ": ", strerror(errno)));
}

// Writes `text` to /proc/self/`file` (uid_map, setgroups, gid_map).
absl::Status WriteProcSelf(const char* file, const std::string& text) {
  const std::string path = absl::StrCat("/proc/self/", file);
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(path.c_str());
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int saved = errno;
  close(fd);
  errno = saved;
  return ok ? absl::OkStatus() : ErrnoStatus(path.c_str());
}

}  // namespace

absl::Status DropNetwork() {
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  // A user namespace of our own is what lets an unprivileged process create
  // a network namespace; the new network namespace has only a loopback
  // interface, which is down.
  if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) {
    return ErrnoStatus("unshare(CLONE_NEWUSER|CLONE_NEWNET)");
  }
  // From here the network is gone whatever else fails. Map our ids to
  // themselves so that files keep their owners as seen from here.
  absl::Status ids = WriteProcSelf("uid_map", absl::StrCat(uid, " ", uid, " 1\n"));
  if (ids.ok()) ids = WriteProcSelf("setgroups", "deny\n");
  if (ids.ok()) ids = WriteProcSelf("gid_map", absl::StrCat(gid, " ", gid, " 1\n"));
  // The new user namespace gave this process every capability inside it:
  // give them back, and never gain any again (no set-uid, no file caps).
  // (Failures here are warnings: the network is gone either way.)
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  absl::Status caps =
      syscall(SYS_capset, &header, data) == 0 ? absl::OkStatus() : ErrnoStatus("capset");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 && caps.ok()) {
    caps = ErrnoStatus("PR_SET_NO_NEW_PRIVS");
  }
  for (const absl::Status& s : {ids, caps}) {
    if (!s.ok()) {
      std::fprintf(stderr, "kcache-compile-worker: in the new user namespace: %s\n",
                   std::string(s.message()).c_str());
    }
  }
  return absl::OkStatus();
}

static std::string DescribeNetwork() {
  std::vector<std::string> names;
  if (struct if_nameindex* ifs = if_nameindex(); ifs != nullptr) {
    for (struct if_nameindex* i = ifs; i->if_index != 0; ++i) names.emplace_back(i->if_name);
    if_freenameindex(ifs);
  }
  // A UDP connect sends nothing: it only asks the kernel for a route.
  // 192.0.2.1 is TEST-NET-1 (RFC 5737), never a real host.
  std::string reach;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    reach = absl::StrCat("socket: ", strerror(errno));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(9);
    a.sin_addr.s_addr = htonl(0xC0000201);
    reach = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0
                ? std::string("routed")
                : std::string(strerror(errno));
    close(fd);
  }
  return absl::StrCat("interfaces ",
                      names.empty() ? std::string("none") : absl::StrJoin(names, ","),
                      "; connect 192.0.2.1: ", reach);
}

std::string DescribeSandbox(const SandboxReport& r) {
  return absl::StrCat("network ",
                      r.network.ok() ? "dropped (own user and network namespace)"
                                     : absl::StrCat("kept (", r.network.message(), ")"),
                      "; ", DescribeNetwork());
}

static SandboxReport ApplySandbox(const ServeOptions& options) {
  SandboxReport r;
  // The namespaces first: unshare(CLONE_NEWUSER) needs a single-threaded
  // process, and nothing has started a thread yet.
  r.network = options.drop_network ? DropNetwork() : absl::CancelledError("--keep-network");
  // Limits before NVRTC or LLVM allocate anything.
  SetLimit(RLIMIT_CORE, 0, "RLIMIT_CORE");
  if (options.limit_as_bytes > 0) SetLimit(RLIMIT_AS, options.limit_as_bytes, "RLIMIT_AS");
  if (options.limit_fsize_bytes > 0) {
    SetLimit(RLIMIT_FSIZE, options.limit_fsize_bytes, "RLIMIT_FSIZE");
  }
  std::set_new_handler(&OutOfMemory);
  return r;
}

int Serve(const ServeOptions& options) {
  const SandboxReport sandbox = ApplySandbox(options);
  if (options.probe) {
    // kcached's start-up check (WorkerPool::Probe): the same protections as a
    // serving worker, described on one line, then exit.
    std::printf("%s\n", DescribeSandbox(sandbox).c_str());
    std::fflush(stdout);
    return 0;
  }
  // Die with the daemon even when stuck inside NVRTC: the daemon's end of the
  // socket closes when it exits, which this thread sees as POLLRDHUP/POLLHUP
  // without consuming requests. (PR_SET_PDEATHSIG would fire when the
  // *thread* that spawned us exits, which in a thread pool is any time.)
  std::thread([fd = options.fd] {
    for (;;) {
      pollfd p{fd, POLLRDHUP, 0};
      if (poll(&p, 1, -1) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) {
        _exit(0);
      }
    }
  }).detach();
  Nvrtc nvrtc(options.nvrtc_path);
  NvJitLink linker(options.nvjitlink_path);
  RawCompileOptions raw_options;
  raw_options.linker = &linker;
  raw_options.ir_to_ptx = options.ir_to_ptx;
  raw_options.enable_test_faults = options.enable_raw_test_faults;
  for (;;) {
    absl::StatusOr<std::string> frame = ReadFrame(options.fd);
    if (!frame.ok()) return absl::IsNotFound(frame.status()) ? 0 : 1;
    CompileRequest request;
    if (!request.ParseFromString(*frame)) {
      std::fprintf(stderr, "kcache-compile-worker: unparsable request\n");
      return 1;
    }
    absl::Time deadline;
    CompileInput input = FromRequest(request, &deadline);
    ArmCpuLimit(options.limit_cpu_seconds);
    bool answered = false;  // by a test fault
    if (options.enable_raw_test_faults && input.raw.has_value()) {
      // The same two limit faults for raw kernels so named, which a test can
      // send through kcached (KCACHE_TEST_RAW_FAULTS=1; see worker.h).
      for (const std::string& n : input.raw->kernel_names) {
        if (n == "kcache_test_alloc") AllocateUntilItFails();
        if (n == "kcache_test_spin") SpinForever();
      }
    }
    if (options.enable_test_faults) {
      for (auto it = input.extra_options.begin(); it != input.extra_options.end();) {
        const std::string& o = *it;
        if (o == "kcache-test-crash") {
          std::fprintf(stderr, "kcache-compile-worker: test fault: crashing\n");
          std::fflush(stderr);
          abort();
        }
        if (o == "kcache-test-alloc") {
          AllocateUntilItFails();
          it = input.extra_options.erase(it);
          continue;
        }
        if (o == "kcache-test-spin") SpinForever();
        if (o == "kcache-test-sandbox") {
          // Answers with the protections this serving worker runs under.
          const CompileResponse response =
              ToResponse(absl::FailedPreconditionError(DescribeSandbox(sandbox)));
          std::string bytes;
          if (!response.SerializeToString(&bytes)) return 1;
          if (!WriteFrame(options.fd, bytes).ok()) return 1;
          answered = true;
          break;
        }
        if (o == "kcache-test-hang") {
          std::fprintf(stderr, "kcache-compile-worker: test fault: hanging\n");
          std::fflush(stderr);
          for (;;) pause();
        }
        if (absl::StartsWith(o, "kcache-test-crash-once=")) {
          // The first worker to see it creates the marker file and crashes;
          // any later one compiles normally (the option is dropped).
          const std::string marker(absl::StripPrefix(o, "kcache-test-crash-once="));
          const int fd = open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
          if (fd >= 0) {
            close(fd);
            std::fprintf(stderr, "kcache-compile-worker: test fault: crashing once\n");
            std::fflush(stderr);
            abort();
          }
          it = input.extra_options.erase(it);
          continue;
        }
        ++it;
      }
    }
    if (answered) continue;
    // LLVM and nvJitLink have no cancellation: the pool kills this process
    // at the deadline instead.
    absl::StatusOr<CompileOutput> result = input.raw.has_value()
                                               ? CompileRaw(*input.raw, input.arch, raw_options)
                                               : CompileUnits(nvrtc, input, deadline);
    // NVRTC's out-of-memory answer under an address-space limit: the same
    // exit as a failed operator new, so the pool names the limit (and this
    // process, its heap possibly exhausted, is replaced).
    if (options.limit_as_bytes > 0 && absl::IsResourceExhausted(result.status())) {
      std::fprintf(stderr, "kcache-compile-worker: %s\n", result.status().ToString().c_str());
      std::fflush(stderr);
      _exit(kExitOutOfMemory);
    }
    const CompileResponse response = ToResponse(result);
    std::string bytes;
    if (!response.SerializeToString(&bytes)) return 1;
    if (!WriteFrame(options.fd, bytes).ok()) return 1;
  }
}

absl::StatusOr<ServeOptions> ParseWorkerArgs(int argc, char** argv) {
  ServeOptions o;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--fd=")) {
      if (!absl::SimpleAtoi(a, &o.fd) || o.fd < 0) {
        return absl::InvalidArgumentError(absl::StrCat("--fd: not a descriptor: ", argv[i]));
      }
    } else if (absl::ConsumePrefix(&a, "--nvrtc=")) {
      o.nvrtc_path = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--nvjitlink=")) {
      o.nvjitlink_path = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--limit-as=")) {
      if (!absl::SimpleAtoi(a, &o.limit_as_bytes)) {
        return absl::InvalidArgumentError(absl::StrCat("--limit-as: not a number: ", argv[i]));
      }
    } else if (absl::ConsumePrefix(&a, "--limit-cpu=")) {
      if (!absl::SimpleAtoi(a, &o.limit_cpu_seconds)) {
        return absl::InvalidArgumentError(absl::StrCat("--limit-cpu: not a number: ", argv[i]));
      }
    } else if (absl::ConsumePrefix(&a, "--limit-fsize=")) {
      if (!absl::SimpleAtoi(a, &o.limit_fsize_bytes)) {
        return absl::InvalidArgumentError(absl::StrCat("--limit-fsize: not a number: ", argv[i]));
      }
    } else if (a == "--probe") {
      o.probe = true;
    } else if (a == "--keep-network") {
      o.drop_network = false;
    } else if (a == "--enable-test-faults") {
      o.enable_test_faults = true;
      o.enable_raw_test_faults = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument: ", argv[i]));
    }
  }
  if (const char* f = getenv("KCACHE_TEST_RAW_FAULTS"); f != nullptr && std::string(f) == "1") {
    o.enable_raw_test_faults = true;
  }
  return o;
}

}  // namespace kcache::worker
