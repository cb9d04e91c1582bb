// Specs as text: JSON (protobuf's JSON mapping, as used by the offline
// command and the CLI) and a one-line human description for `kcache show`
// and logs. Thread-safe (pure functions).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kcache/v1/spec.pb.h"

namespace kcache::attention {

// Parses a v1.AttentionSpec in protobuf's JSON mapping (field names in
// lowerCamelCase or as in the proto; enums by name or number). Unknown
// fields are an error. InvalidArgument("spec JSON: <parser message>") on
// failure. The result is parsed, not validated.
absl::StatusOr<v1::AttentionSpec> ParseSpecJson(absl::string_view json);

// The spec as JSON (proto field names, enums by name); for tools and logs.
std::string SpecToJson(const v1::AttentionSpec& spec);

// One line, e.g. "bf16 d128 h32/8 causal(top-left) softcap=30 lse".
// Shows what the kernel is: dtype, head dims ("d128" or "d192/128"), heads,
// mask, score modification, scale when not the default, passes
// (lse, bwd, det), buffers, tuning. Never includes buffer names' bytes
// beyond valid names (invalid ones print as '?').
std::string DescribeSpec(const v1::AttentionSpec& spec);

}  // namespace kcache::attention
