// kcache-compile-worker: one isolated NVRTC compiler process, started and
// reused by WorkerPool (compiler/worker/worker_pool.h). Not meant to be run by hand.
// Built with LLVM (KCACHE_WORKER_WITH_LLVM, the static build included) it
// also compiles raw LLVM IR; without it those requests answer Unimplemented.
#include <cstdio>

#include "compiler/worker/worker.h"
#ifdef KCACHE_WORKER_WITH_LLVM
#include "compiler/llvm/llvm_nvptx.h"
#endif

int main(int argc, char** argv) {
  absl::StatusOr<kcache::worker::ServeOptions> options =
      kcache::worker::ParseWorkerArgs(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "kcache-compile-worker: %s\n", options.status().ToString().c_str());
    return 2;
  }
#ifdef KCACHE_WORKER_WITH_LLVM
  options->ir_to_ptx = &kcache::LlvmIrToPtx;
#endif
  return kcache::worker::Serve(*options);
}
