// The one adapter from rocksdb::Status to absl::Status. Every RocksDB error in
// cache/ leaves through FromRocks; callers only test IsNotFound() first where
// "absent" is a normal answer rather than an error.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "rocksdb/status.h"

namespace kcache {

// Maps a RocksDB status to an absl::Status whose message starts with `what`
// (the operation, e.g. "open /var/kcache/store"). A held DB lock (another
// process has the store open for writing) becomes FailedPrecondition saying
// so; NotFound -> NotFound; Corruption -> DataLoss; IOError -> Unavailable;
// InvalidArgument/NotSupported -> InvalidArgument/Unimplemented; Busy,
// TimedOut, TryAgain -> Unavailable; Aborted -> Aborted; others -> Internal.
absl::Status FromRocks(const rocksdb::Status& s, std::string_view what);

}  // namespace kcache
