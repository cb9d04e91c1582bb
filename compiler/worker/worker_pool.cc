// WorkerPool: kcache-compile-worker processes started with posix_spawn (a
// fork+exec that is safe in a multithreaded daemon), talked to over a Unix
// socket, killed at the request's deadline.
#include "compiler/worker/worker_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "compiler/worker/worker.h"

extern char** environ;

namespace kcache {

struct WorkerPool::Worker {
  pid_t pid = -1;
  int fd = -1;         // our end of the socket
  int stderr_fd = -1;  // memfd holding the worker's stdout/stderr
  ~Worker() {
    if (fd >= 0) close(fd);
    if (stderr_fd >= 0) close(stderr_fd);
  }
};

namespace {

std::string DefaultWorkerPath() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "kcache-compile-worker";
  std::string self(buf, static_cast<size_t>(n));
  const size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) +
         "/kcache-compile-worker";
}

// The last `max` bytes the worker wrote to stdout/stderr, as a message suffix.
std::string StderrTail(int fd, size_t max = 4096) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) return "";
  const size_t size = static_cast<size_t>(st.st_size);
  const size_t n = std::min(size, max);
  std::string tail(n, '\0');
  const ssize_t got = pread(fd, tail.data(), n, static_cast<off_t>(size - n));
  if (got <= 0) return "";
  tail.resize(static_cast<size_t>(got));
  return absl::StrCat("; worker output", size > n ? " (tail)" : "", ":\n", tail);
}

}  // namespace

WorkerPool::WorkerPool(WorkerPoolOptions options)
    : options_(std::move(options)),
      worker_path_(options_.worker_path.empty() ? DefaultWorkerPath() : options_.worker_path) {}

WorkerPool::~WorkerPool() {
  std::vector<std::unique_ptr<Worker>> idle;
  {
    absl::MutexLock lock(&mu_);
    idle.swap(idle_);
    live_ -= static_cast<int>(idle.size());
  }
  for (auto& w : idle) {
    // End of stream makes an idle worker exit; then reap it.
    close(w->fd);
    w->fd = -1;
    int status;
    while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

int WorkerPool::live_workers() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

absl::StatusOr<std::unique_ptr<WorkerPool::Worker>> WorkerPool::Spawn(bool probe) const {
  auto w = std::make_unique<Worker>();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::UnavailableError(absl::StrCat("socketpair: ", strerror(errno)));
  }
  w->fd = sv[0];
  // High descriptors for the child's ends, so that dup2 onto 1, 2, 3 never
  // meets an fd that is already in place (and would keep FD_CLOEXEC).
  const int child_sock = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
  close(sv[1]);
  w->stderr_fd = memfd_create("kcache-compile-worker-output", MFD_CLOEXEC);
  if (child_sock < 0 || w->stderr_fd < 0) {
    if (child_sock >= 0) close(child_sock);
    return absl::UnavailableError(absl::StrCat("worker descriptors: ", strerror(errno)));
  }
  // Appending (shared with the child) keeps the output at the start of the
  // file after each ftruncate(0).
  fcntl(w->stderr_fd, F_SETFL, O_APPEND);
  const int child_err = fcntl(w->stderr_fd, F_DUPFD_CLOEXEC, 10);

  std::vector<std::string> args = {worker_path_, "--fd=3"};
  if (!options_.nvrtc_path.empty()) args.push_back("--nvrtc=" + options_.nvrtc_path);
  if (!options_.nvjitlink_path.empty()) {
    args.push_back("--nvjitlink=" + options_.nvjitlink_path);
  }
  args.push_back(absl::StrCat("--limit-as=", options_.limit_as_bytes));
  args.push_back(absl::StrCat("--limit-cpu=", options_.limit_cpu_seconds));
  args.push_back(absl::StrCat("--limit-fsize=", options_.limit_fsize_bytes));
  if (options_.enable_test_faults) args.push_back("--enable-test-faults");
  if (probe) args.push_back("--probe");
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, child_err, 1);
  posix_spawn_file_actions_adddup2(&actions, child_err, 2);
  posix_spawn_file_actions_adddup2(&actions, child_sock, 3);
  const int rc =
      posix_spawn(&w->pid, worker_path_.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(child_sock);
  if (child_err >= 0) close(child_err);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot start compile worker ", worker_path_, ": ", strerror(rc)));
  }
  return w;
}

absl::StatusOr<std::string> WorkerPool::Probe() const {
  absl::StatusOr<std::unique_ptr<Worker>> w = Spawn(/*probe=*/true);
  if (!w.ok()) return w.status();
  // It exits at once; wait for that without blocking forever on a worker
  // that does not.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  int status = 0;
  pid_t r;
  while ((r = waitpid((*w)->pid, &status, WNOHANG)) == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (r <= 0) {
    Reap(**w, /*kill_first=*/true);
    return absl::UnavailableError("compile worker probe did not answer within 10 s");
  }
  (*w)->pid = -1;
  std::string out = StderrTail((*w)->stderr_fd);
  // StderrTail's "; worker output:\n" prefix, and the final newline.
  if (const size_t nl = out.find('\n'); nl != std::string::npos) out.erase(0, nl + 1);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(
        absl::StrCat("compile worker probe failed (wait status ", status, "): ", out));
  }
  // Only the last line is the description; earlier ones are warnings.
  if (const size_t nl = out.rfind('\n'); nl != std::string::npos) out.erase(0, nl + 1);
  return out;
}

std::string WorkerPool::Reap(Worker& w, bool kill_first, int* wait_status) {
  if (wait_status != nullptr) *wait_status = 0;
  // Never signal a pid <= 0: kill(-1, ...) would hit every process we may
  // signal, and kill(0, ...) our own process group. A worker already reaped
  // has pid -1.
  if (w.pid <= 0) return "compile worker already reaped";
  if (kill_first) kill(w.pid, SIGKILL);
  int status = 0;
  pid_t r;
  while ((r = waitpid(w.pid, &status, kill_first ? 0 : WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r == 0) {
    // It closed its socket but is still running: not a worker we can trust.
    kill(w.pid, SIGKILL);
    while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  w.pid = -1;
  if (wait_status != nullptr) *wait_status = status;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("compile worker crashed with signal ", sig, " (", strsignal(sig), ")");
  }
  if (WIFEXITED(status)) {
    return absl::StrCat("compile worker exited with status ", WEXITSTATUS(status));
  }
  return "compile worker ended";
}

bool WorkerPool::WorkerAvailable() const { return !idle_.empty() || live_ < options_.max_workers; }

int64_t WorkerPool::retried_compiles() const {
  absl::MutexLock lock(&mu_);
  return retried_;
}

const char* WorkerPool::LimitName(Limit l) {
  switch (l) {
    case kAddressSpace:
      return "address_space";
    case kCpuTime:
      return "cpu_time";
    case kOutputSize:
      return "output_size";
    default:
      return "unknown";
  }
}

int64_t WorkerPool::limit_exceeded(Limit l) const {
  absl::MutexLock lock(&mu_);
  return l >= 0 && l < kNumLimits ? limit_exceeded_[l] : 0;
}

std::vector<pid_t> WorkerPool::idle_worker_pids() const {
  absl::MutexLock lock(&mu_);
  std::vector<pid_t> out;
  for (const auto& w : idle_) out.push_back(w->pid);
  return out;
}

namespace {

// An idle worker sends nothing and keeps its socket open; a hang-up (it
// died, or closed its end) or unsolicited bytes mean it cannot take a
// request.
bool IdleWorkerIsSound(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  int n;
  while ((n = poll(&p, 1, 0)) < 0 && errno == EINTR) {
  }
  return n == 0;
}

}  // namespace

absl::StatusOr<CompileOutput> WorkerPool::Compile(const CompileInput& input, absl::Time deadline) {
  std::unique_ptr<Worker> w;
  {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(this, &WorkerPool::WorkerAvailable), deadline)) {
      return absl::DeadlineExceededError("no compile worker became free before the deadline");
    }
    if (!idle_.empty()) {
      w = std::move(idle_.back());
      idle_.pop_back();
    } else {
      ++live_;  // reserve the slot; spawn without the lock
    }
  }
  // From here this call holds one slot of live_ until it returns the worker
  // to idle_ or gives the slot back.
  auto release_slot = [this] {
    absl::MutexLock lock(&mu_);
    --live_;
  };
  if (w != nullptr && !IdleWorkerIsSound(w->fd)) {
    // It died (or broke) while idle: not this request's failure. Replace it
    // in the same slot.
    Reap(*w, /*kill_first=*/true);
    w.reset();
  }

  // A worker that dies under a compile (a crash, the OOM killer) is retried
  // once on a fresh worker: the death may have nothing to do with this input
  // (or this input may crash every worker: then it costs two). A compile
  // that ran past its deadline, or that the worker answered (a compile
  // error included), is not retried.
  std::string first_death;
  for (int attempt = 0;; ++attempt) {
    if (w == nullptr) {
      absl::StatusOr<std::unique_ptr<Worker>> spawned = Spawn();
      if (!spawned.ok()) {
        release_slot();
        return spawned.status();
      }
      w = *std::move(spawned);
    }
    Attempt a = RunOnce(*w, input, deadline);
    if (a.outcome == Attempt::kAnswered) {
      absl::MutexLock lock(&mu_);
      idle_.push_back(std::move(w));
      return std::move(a.result);
    }
    w.reset();  // reaped by RunOnce
    if (a.outcome == Attempt::kLimit) {
      // Not retried: the same input would hit the same limit.
      absl::MutexLock lock(&mu_);
      ++limit_exceeded_[a.limit];
      --live_;
      return std::move(a.result);
    }
    if (a.outcome == Attempt::kDied && attempt == 0 && absl::Now() < deadline) {
      first_death = std::string(a.result.status().message());
      absl::MutexLock lock(&mu_);
      ++retried_;
      continue;  // same slot, fresh worker
    }
    release_slot();
    if (!first_death.empty() && !a.result.ok()) {
      return absl::Status(
          a.result.status().code(),
          absl::StrCat(a.result.status().message(),
                       "\n(retried once on a fresh compile worker; the first ", first_death, ")"));
    }
    return std::move(a.result);
  }
}

WorkerPool::Attempt WorkerPool::RunOnce(Worker& w, const CompileInput& input,
                                        absl::Time deadline) const {
  // Each request's output starts empty, so the tail on failure is its own.
  if (ftruncate(w.stderr_fd, 0) != 0) {
    // Harmless: the tail may then include an earlier request's output.
  }
  std::string request;
  worker::ToRequest(input, deadline).SerializeToString(&request);
  absl::Status io = worker::WriteFrame(w.fd, request, deadline);
  absl::StatusOr<std::string> reply;
  if (io.ok()) {
    reply = worker::ReadFrame(w.fd, deadline);
    io = reply.status();
  }
  worker::CompileResponse response;
  if (io.ok() && !response.ParseFromString(*reply)) {
    io = absl::InternalError("compile worker sent an unparsable response");
  }
  if (io.ok()) return {Attempt::kAnswered, worker::FromResponse(response)};

  // The worker is finished either way: killed at the deadline, dead already
  // (end of stream), or not speaking the protocol.
  const bool timed_out = absl::IsDeadlineExceeded(io);
  const bool peer_gone = absl::IsNotFound(io) || absl::IsUnavailable(io);
  const pid_t pid = w.pid;
  int status = 0;
  const std::string how = Reap(w, /*kill_first=*/!peer_gone, &status);
  const std::string tail = StderrTail(w.stderr_fd);
  if (peer_gone) {
    // Ended on one of its own resource limits: SIGXCPU (RLIMIT_CPU),
    // SIGXFSZ (RLIMIT_FSIZE), or the worker's out-of-memory exit (an
    // allocation failed under RLIMIT_AS).
    const bool sig = WIFSIGNALED(status);
    std::optional<Limit> limit;
    std::string what;
    if (sig && WTERMSIG(status) == SIGXCPU && options_.limit_cpu_seconds > 0) {
      limit = kCpuTime;
      what = absl::StrCat("CPU-time limit (", options_.limit_cpu_seconds,
                          " s per compile; --compile_limit_cpu_seconds)");
    } else if (sig && WTERMSIG(status) == SIGXFSZ && options_.limit_fsize_bytes > 0) {
      limit = kOutputSize;
      what = absl::StrCat("output-file-size limit (", options_.limit_fsize_bytes,
                          " bytes; --compile_limit_output_bytes)");
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == worker::kExitOutOfMemory) {
      limit = kAddressSpace;
      what = absl::StrCat("address-space (memory) limit (", options_.limit_as_bytes,
                          " bytes; --compile_limit_address_space_bytes)");
    }
    if (limit.has_value()) {
      const std::string key = input.raw.has_value() ? std::string("raw kernel")
                                                    : absl::StrCat("'", input.program_name, "'");
      Attempt a{Attempt::kLimit,
                absl::ResourceExhaustedError(absl::StrCat(
                    "compile of ", key, " for ", input.arch, " ", kCompileLimitExceeded, " ", what,
                    "; limit=", LimitName(*limit), "; ", how, tail))};
      a.limit = *limit;
      return a;
    }
  }
  if (timed_out) {
    return {Attempt::kFailed,
            absl::DeadlineExceededError(absl::StrCat(
                "compile did not finish by its deadline; compile worker ", pid, " killed", tail))};
  }
  if (peer_gone) return {Attempt::kDied, absl::InternalError(absl::StrCat(how, tail))};
  return {Attempt::kFailed, absl::InternalError(absl::StrCat(io.message(), " (", how, ")", tail))};
}

}  // namespace kcache
