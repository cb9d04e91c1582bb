// rocksdb::Status -> absl::Status (see rocks_status.h).
#include "cache/rocks_status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/string_view_compat.h"

namespace kcache {

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(AbslView(what), ": ", s.ToString());
  switch (s.code()) {
    case rocksdb::Status::kNotFound:
      return absl::NotFoundError(msg);
    case rocksdb::Status::kCorruption:
      return absl::DataLossError(msg);
    case rocksdb::Status::kNotSupported:
      return absl::UnimplementedError(msg);
    case rocksdb::Status::kInvalidArgument:
      return absl::InvalidArgumentError(msg);
    case rocksdb::Status::kIOError:
      // RocksDB reports a held LOCK file as an IOError ("While lock file:
      // ... Resource temporarily unavailable"); say plainly what it means.
      if (absl::StrContains(s.ToString(), "lock file") || absl::StrContains(s.ToString(), "LOCK")) {
        return absl::FailedPreconditionError(
            absl::StrCat(AbslView(what),
                         ": the store is locked by another process (a running kcached?); "
                         "open it read-only instead (",
                         s.ToString(), ")"));
      }
      return absl::UnavailableError(msg);
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kTryAgain:
    case rocksdb::Status::kIncomplete:
      return absl::UnavailableError(msg);
    case rocksdb::Status::kAborted:
      return absl::AbortedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace kcache
