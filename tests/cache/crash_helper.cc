// Child process of the crash test: publishes entries start, start+1, ... into
// the store at argv[1] forever and, after each Publish returns, writes the
// entry's number as one line to stdout (a pipe to the parent). The parent
// SIGKILLs it at a random moment.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cache/store.h"
#include "tests/cache/crash_util.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cache_crash_helper STORE_DIR START\n");
    return 2;
  }
  kcache::StoreOptions o;
  o.stats_flush_interval = absl::Milliseconds(1);  // flushes race the kill too
  auto store = kcache::Store::Open(argv[1], o);
  if (!store.ok()) {
    std::fprintf(stderr, "crash helper: %s\n", store.status().ToString().c_str());
    return 1;
  }
  for (long n = std::atol(argv[2]);; ++n) {
    auto e = (*store)->Publish(kcache::crashtest::Record(n), kcache::crashtest::Cubin(n));
    if (!e.ok()) {
      std::fprintf(stderr, "crash helper: %s\n", e.status().ToString().c_str());
      return 1;
    }
    (void)(*store)->Lookup(kcache::crashtest::Record(n).key());  // a hit to flush
    std::string line = std::to_string(n) + "\n";
    // write(2), not stdio: the line must leave the process before the next publish.
    if (write(1, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 1;
  }
}
