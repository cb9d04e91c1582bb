// Crash test: a child process (cache_crash_helper) publishes entries in a
// loop and reports each Publish that returned; the parent SIGKILLs it at
// random moments, 60 times. After every kill the parent reopens the store and
// checks that every reported entry is present and whole, and that every
// entry present verifies (a crash never leaves a torn entry).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <set>
#include <string>

#include "cache/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/crash_util.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::IsOk;
using ::kcache::testing::TempDir;

constexpr int kKills = 60;

// Reads what is available on `fd` into `buf`, waiting at most `timeout_ms`
// for the first byte. Returns false at EOF.
bool ReadSome(int fd, std::string& buf, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return true;
  char chunk[4096];
  ssize_t n = read(fd, chunk, sizeof(chunk));
  if (n <= 0) return false;
  buf.append(chunk, static_cast<size_t>(n));
  return true;
}

std::set<long> TakeLines(std::string& buf) {
  std::set<long> out;
  size_t pos;
  while ((pos = buf.find('\n')) != std::string::npos) {
    out.insert(std::stol(buf.substr(0, pos)));
    buf.erase(0, pos + 1);
  }
  return out;
}

TEST(CrashTest, KilledPublisherNeverLosesAReturnedPublishNorTearsAnEntry) {
  TempDir dir;
  const std::string store_dir = dir.Sub("store");
  std::mt19937 rng(20261130);
  std::set<long> acked;
  long next = 0;
  int killed_mid_run = 0;
  for (int round = 0; round < kKills; ++round) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      const std::string start = std::to_string(next);
      execl(KCACHE_CRASH_HELPER, KCACHE_CRASH_HELPER, store_dir.c_str(), start.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    // Wait for a random number of acknowledged publishes (0..6), then kill
    // after a random extra delay (0..3 ms) so that the kill lands anywhere:
    // during open, inside a WriteBatch, between a write and its ack.
    std::string buf;
    const size_t want = rng() % 7;
    std::set<long> got;
    bool eof = false;
    while (got.size() < want && !eof) {
      eof = !ReadSome(fds[0], buf, 5000);
      auto lines = TakeLines(buf);
      got.insert(lines.begin(), lines.end());
    }
    ASSERT_FALSE(eof) << "the helper exited on its own in round " << round;
    usleep(rng() % 3000);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "round " << round;
    ++killed_mid_run;
    // Acks written before the kill are still in the pipe.
    while (ReadSome(fds[0], buf, 0)) {
    }
    auto lines = TakeLines(buf);
    got.insert(lines.begin(), lines.end());
    close(fds[0]);
    acked.insert(got.begin(), got.end());

    // Reopen (this recovers the WAL) and check.
    StoreOptions o;
    o.stats_flush_interval = absl::ZeroDuration();
    o.hot_cache_bytes = 0;
    auto store = Store::Open(store_dir, o);
    ASSERT_THAT(store, IsOk()) << "round " << round;
    for (long n : acked) {
      auto e = (*store)->Lookup(crashtest::Record(n).key());
      ASSERT_THAT(e, IsOk());
      ASSERT_NE(*e, nullptr) << "round " << round << ": acknowledged entry " << n << " lost";
      ASSERT_EQ((*e)->cubin, crashtest::Cubin(n)) << "round " << round << ", entry " << n;
    }
    auto v = (*store)->Verify();
    ASSERT_THAT(v, IsOk());
    ASSERT_EQ(v->corrupt(), 0u) << "round " << round << ": a torn entry";
    auto s = (*store)->Stats();
    ASSERT_THAT(s, IsOk());
    ASSERT_EQ(s->quarantined(), 0u);
    ASSERT_GE(s->entries(), acked.size());
    // The next child starts after everything that may have been written.
    next = (acked.empty() ? next : *acked.rbegin() + 1) + 100;
    ASSERT_THAT((*store)->Close(), IsOk());
  }
  EXPECT_EQ(killed_mid_run, kKills);
  EXPECT_GT(acked.size(), static_cast<size_t>(kKills));
  // Leaks after crashes are allowed; garbage collection must clean them and
  // leave every entry intact.
  StoreOptions o;
  o.stats_flush_interval = absl::ZeroDuration();
  auto store = Store::Open(store_dir, o);
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT((*store)->CollectGarbage(), IsOk());
  auto v = (*store)->Verify();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->corrupt(), 0u);
}

}  // namespace
}  // namespace kcache
