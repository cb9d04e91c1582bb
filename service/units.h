// Sizes and durations as people write them in kcached's flags and
// configuration file: "20G", "512MiB", "30s", "500ms", "10m", "1h30m".
// Plain numbers keep their old meaning (bytes; the field's own unit for
// durations), so existing configurations read the same.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kcache {

// A byte count: "1048576", "512K", "64M", "20G", "1T", with an optional "B"
// or "iB" ("512MiB", "20GB"); units are powers of 1024 (as `kcache gc
// --max-bytes`). InvalidArgument saying what is accepted.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);

// A duration: a number with a unit, or several ("500ms", "30s", "10m", "2h",
// "1d", "1h30m"; also "us", "ns"), or a plain number of `plain_unit`
// ("30000" with absl::Milliseconds(1) is 30 s). Not negative.
absl::StatusOr<absl::Duration> ParseDurationText(absl::string_view text, absl::Duration plain_unit);

}  // namespace kcache
