// The `kcache warm` manifest: a list of attention specs, each compiled for a
// list of architectures. YAML (or JSON, which YAML reads as well):
//
//   archs: [sm_80, sm_90a]          # default targets of every spec
//   specs:
//     - name: causal-bf16-d128      # optional; default: DescribeSpec
//       archs: [sm_90a]             # optional; overrides the default
//       spec:                       # kcache.v1.AttentionSpec, protobuf JSON names
//         dtype: DTYPE_BF16
//         head_dim_qk: 128
//         num_q_heads: 32
//         num_kv_heads: 8
//         mask: {causal: {}}
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kcache/v1/spec.pb.h"

namespace kcache::tools {

// One compile to warm: a spec for one architecture.
struct WarmItem {
  std::string name;  // the spec's name in the manifest
  v1::AttentionSpec spec;
  std::string arch;
};

// Parses manifest text into (spec, arch) items, in manifest order (spec
// by spec, its archs in order). InvalidArgument naming the entry and the
// reason ("specs[2] (drafter): spec JSON: ...") for YAML syntax errors,
// unknown keys, specs that do not parse, missing or malformed archs and
// duplicate names. The specs are parsed, not validated: the daemon
// validates them and warm reports each rejection.
absl::StatusOr<std::vector<WarmItem>> ParseManifest(std::string_view text);

// Reads and parses the file; InvalidArgument naming the path when unreadable.
absl::StatusOr<std::vector<WarmItem>> LoadManifest(const std::string& path);

}  // namespace kcache::tools
