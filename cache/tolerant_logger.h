// RocksDB's info log for the store: a logger that never aborts the process.
// Internal to the store (cache/store.cc).
#pragma once

#include <memory>
#include <string>

#include "rocksdb/env.h"

namespace kcache {

// RocksDB's info log. RocksDB's own file logger writes through a
// WritableFileWriter, which asserts (aborting the daemon) when it is used
// again after a failed write, e.g. "no space left" during the very recovery
// from a full disk. This one writes each line with write(2) and drops what
// it cannot write. Lines go to `path` (rotated to path.old past 16 MiB) when
// given, and errors also to stderr (at most one a second).
// An empty `path` writes no file (read-only opens). Thread-safe.
std::shared_ptr<rocksdb::Logger> NewTolerantLogger(std::string path);

}  // namespace kcache
