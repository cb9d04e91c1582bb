// kcached: the kcache node daemon. A thin main over service/daemon.h.
#include <glog/logging.h>

#include <csignal>
#include <iostream>

#include "absl/synchronization/mutex.h"
#include "service/config.h"
#include "service/daemon.h"
#include "service/logging.h"

int main(int argc, char** argv) {
  // Debian's abseil is built without NDEBUG, which leaves absl::Mutex's
  // deadlock detector on: every lock (gRPC's own mutexes included) updates a
  // process-wide lock graph under a global lock and may record a stack trace.
  // On the hit path that was a measurable share of the daemon's CPU and a
  // point of contention between server threads (bench/service). Lock order is
  // checked by -Wthread-safety and by the unit tests, which keep the detector.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  kcache::InitDaemonLogging(argv[0]);
  auto command = kcache::ParseDaemonCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  if (!command.ok()) {
    std::cerr << "kcached: " << command.status().message() << "\n";
    return 2;
  }
  switch (command->action) {
    case kcache::DaemonCommandLine::Action::kPrintUsage:
      std::cout << kcache::DaemonUsage();
      return 0;
    case kcache::DaemonCommandLine::Action::kPrintVersion:
      std::cout << kcache::DaemonVersion();
      return 0;
    case kcache::DaemonCommandLine::Action::kServe:
      break;
  }
  const kcache::v1::DaemonConfig& config = command->config;
  (void)kcache::SetLogLevel(config.log_level());  // validated with the configuration
  // Signals are taken synchronously by this thread, so shutdown runs here
  // and not in a handler.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto daemon = kcache::Daemon::Start(config);
  if (!daemon.ok()) {
    LOG(ERROR) << "cannot start: " << daemon.status().message();
    // InvalidArgument is a configuration error found at start (an unreadable
    // or empty token or TLS file, a bad --metrics_address, a --socket_path
    // that is not a socket): restarting will not fix it, and exit 2 tells
    // systemd so (RestartPreventExitStatus=2 in docker/kcached.service).
    return daemon.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  LOG(INFO) << "signal " << sig << ", shutting down";
  absl::Status st = (*daemon)->Shutdown();
  if (!st.ok()) {
    LOG(ERROR) << "shutdown: " << st.message();
    return 1;
  }
  LOG(INFO) << "stopped";
  return 0;
}
