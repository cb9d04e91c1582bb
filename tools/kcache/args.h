// Command-line parsing for `kcache`: flags of the form --name=value,
// --name value or --name (booleans), checked against a table per command,
// and the value parsers shared by the commands (times, sizes, durations).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kcache::tools {

struct FlagSpec {
  std::string name;   // without the dashes
  bool takes_value;   // false: a boolean switch
  std::string value;  // placeholder for help, e.g. "PATH"
  std::string help;
};

struct ParsedArgs {
  std::map<std::string, std::string> flags;  // name -> value ("" for switches)
  std::vector<std::string> positional;
  bool has(const std::string& name) const { return flags.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
};

// Parses `argv` against `known`. "-h" means --help; "--" ends the flags.
// InvalidArgument (one line, naming the flag) for an unknown flag, a
// missing value, a value given to a switch or a flag given twice.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& argv,
                                     const std::vector<FlagSpec>& known);

// A point in time, for --before / --created-before / --unused-since:
//   RFC 3339 ("2026-11-30T12:00:00Z"), a date ("2026-11-30", UTC midnight),
//   a Unix time in milliseconds ("@1764504000000"), or an age ("30d", "12h",
//   "90m", "45s": that long before `now`).
absl::StatusOr<absl::Time> ParseWhen(const std::string& text, absl::Time now);

// A byte count: "1048576", "512K", "64M", "10G", "1T" (powers of 1024; an
// optional trailing "B" or "iB" is accepted).
absl::StatusOr<uint64_t> ParseBytes(const std::string& text);

// A duration: "90s", "10m", "2h", "1d", or plain seconds ("30").
absl::StatusOr<absl::Duration> ParseDurationArg(const std::string& text);

}  // namespace kcache::tools
