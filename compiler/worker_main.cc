// kcache-compile-worker: one isolated NVRTC compiler process, started and
// reused by WorkerPool (compiler/worker_pool.h). Not meant to be run by hand.
#include <cstdio>

#include "compiler/worker.h"

int main(int argc, char** argv) {
  absl::StatusOr<kcache::worker::ServeOptions> options = kcache::worker::ParseWorkerArgs(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "kcache-compile-worker: %s\n", options.status().ToString().c_str());
    return 2;
  }
  return kcache::worker::Serve(*options);
}
