// End-to-end: kcached shutting down while a compile runs past the shutdown
// grace. The compile is made slow on purpose by a worker wrapper that sleeps
// before it becomes the real kcache-compile-worker.
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_process.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::SlowWorkerScript;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

// A client waiting for a compile that outlives the shutdown grace is told to
// retry (UNAVAILABLE), not cancelled; it gets its kernel from the restarted
// daemon. The old daemon waits for the running compile before it closes the
// store, and exits without crashing.
TEST(DaemonE2E, ShutdownWithACompilePastTheGraceTellsWaitersToRetry) {
  TempDir dir;
  // A compile of 8 s: longer than the servers' 5 s shutdown deadline in
  // Daemon::Shutdown.
  DaemonProcess d(dir.path(),
                  {"--shutdown_grace_ms=1", "--worker_path=" + SlowWorkerScript(dir.path(), 8)});
  d.Start();

  v1::AttentionSpec spec;
  spec.set_dtype(v1::DTYPE_BF16);
  spec.set_head_dim_qk(64);
  spec.set_num_q_heads(8);
  spec.set_num_kv_heads(8);
  spec.mutable_mask()->mutable_causal();
  v1::Target target;
  target.set_arch("sm_80");

  ClientOptions o;
  o.target = d.target();
  // The daemon is down for the 8 s compile it waits for plus a restart: more
  // than the default 10 s connect budget on a loaded machine.
  o.connect_timeout = absl::Minutes(2);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<std::shared_ptr<const v1::GetKernelResponse>> got;
  std::thread waiter([&] { got = (*client)->Fetch(spec, target, absl::Minutes(3)); });

  // The compile is running (its worker is asleep in the wrapper).
  absl::Time until = absl::Now() + absl::Seconds(60);
  bool busy = false;
  while (!busy && absl::Now() < until) {
    v1::StatsResponse stats = d.Stats();  // not a temporary: the loop keeps a reference
    for (const auto& q : stats.queues()) busy |= q.busy();
    if (!busy) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(busy) << "the compile never started";

  int status = d.Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status)) << "wait status " << status << "; "
                                 << ReadFileOrEmpty(d.log_path());
  EXPECT_THAT(ReadFileOrEmpty(d.log_path()),
              HasSubstr("waiting for them before closing the store"));

  DaemonProcess again(dir.path());
  again.Start();
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE((*got)->cubin().empty());
}

}  // namespace
}  // namespace kcache
