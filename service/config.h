// The daemon's configuration: defaults, a JSON file (protobuf JSON mapping
// of kcache.v1.DaemonConfig) and `--field=value` flags, applied in that
// order. Every DaemonConfig field is also a flag of the same name.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kcache/v1/daemon_config.pb.h"

namespace kcache {

// The built-in defaults (store and socket under .kcache/ in the working dir).
v1::DaemonConfig DefaultDaemonConfig();

// Parses argv (without argv[0]): `--config=FILE` is read first, then each
// `--field=value` overrides. Unknown flags, malformed values and a config
// file that does not parse are InvalidArgument naming the flag or file.
// `--help` yields a status of kind Cancelled carrying the usage text.
absl::StatusOr<v1::DaemonConfig> ParseDaemonConfig(const std::vector<std::string>& args);

// Checks cross-field rules (admin over TCP needs TLS and a token, ...).
absl::Status ValidateDaemonConfig(const v1::DaemonConfig& config);

// The effective configuration as one JSON object, for the start-up log.
std::string DaemonConfigToJson(const v1::DaemonConfig& config);

std::string DaemonUsage();

}  // namespace kcache
