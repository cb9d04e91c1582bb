// The daemon's configuration: defaults, a YAML file (a mapping of
// kcache.v1.DaemonConfig fields, with comments; the older JSON files, in
// protobuf's JSON mapping, are YAML too and read the same) and flags
// (`--field value` or `--field=value`), applied in that order. Every
// DaemonConfig field is also a flag of the same name. Sizes (`_bytes`
// fields) and durations (`_ms`, `_seconds`) take units: service/units.h.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kcache/v1/daemon_config.pb.h"

namespace kcache {

// The built-in defaults (store and socket under .kcache/ in the working dir).
v1::DaemonConfig DefaultDaemonConfig();

// What a kcached command line asks for: to serve with a configuration, or
// to print the usage (`--help`, `-h`) or the version (`--version`) and exit.
struct DaemonCommandLine {
  enum class Action { kServe, kPrintUsage, kPrintVersion };
  Action action = Action::kServe;
  v1::DaemonConfig config;  // kServe: the validated configuration
};

// Parses argv (without argv[0]): `--config FILE` is read first, then each
// flag overrides. Unknown flags or keys, malformed values and a config file
// that does not parse are InvalidArgument naming the flag, or the file and
// line. `--help` or `--version` ends the parse where it stands (an error in
// an argument before it is still reported).
absl::StatusOr<DaemonCommandLine> ParseDaemonCommandLine(const std::vector<std::string>& args);

// Checks cross-field rules (admin over TCP needs TLS and a token, ...).
absl::Status ValidateDaemonConfig(const v1::DaemonConfig& config);

// The effective configuration as one JSON object, for the start-up log.
std::string DaemonConfigToJson(const v1::DaemonConfig& config);

// The text `--help` prints: the synopsis and every flag with its unit.
std::string DaemonUsage();

// "kcached 0.5.0\nbuild: ...\n": the project version (VERSION) and how this
// binary was built (compiler, build type, CUDA headers, libraries; no git).
std::string DaemonVersion();

}  // namespace kcache
