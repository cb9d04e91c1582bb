// The daemon's log: glog (Debian's libgoogle-glog, linked statically into
// kcached-static) writing to stderr, which is the journal under systemd.
// Every line starts with a UTC timestamp, the level and the source line:
//
//   2026-12-02T09:31:07.412Z INFO kernel_backend.cc:170] compile key=01d3... arch=sm_80 ...
//
// Levels, lowest first: debug (glog's VLOG(1)), info, warning, error. Events
// are one line each, as key=value pairs so that they grep and parse: a
// compile and its outcome, a compile failure, an eviction, a quarantine and
// an invalidation, each with the entry's key prefix (the 28 hex digits that
// `kcache ls` prints and `kcache show` takes) and a duration.
//
// Thread-safe after InitDaemonLogging (glog's own locking).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kcache {

// The levels --log_level accepts, for messages.
inline constexpr absl::string_view kLogLevels = "debug, info, warning, error";

// InvalidArgument naming log_level unless `level` is one of kLogLevels.
absl::Status ValidateLogLevel(absl::string_view level);

// Sends glog to stderr with kcache's prefix. Call once, first thing in
// main, before other threads start. Idempotent.
void InitDaemonLogging(const char* argv0);

// Sets the lowest level written (one of kLogLevels; "" = info). May be
// called at any time.
absl::Status SetLogLevel(absl::string_view level);

// A key as logs show it: its first 28 hex digits (as `kcache ls`).
std::string KeyPrefix(std::string_view key);

// "0.482s", "12.031s": milliseconds, for durations in log lines.
std::string LogSeconds(absl::Duration d);

// The first line of `message`, at most 300 bytes, quoted for a key=value log
// line ("..." with inner quotes and backslashes escaped).
std::string LogQuote(absl::string_view message);

}  // namespace kcache
