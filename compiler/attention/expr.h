// Shared vocabulary of the attention-spec expression trees (masks and score
// modifications): value types and the table that maps declared buffer names
// to launch-time buffer slots. Plain functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "kcache/v1/spec.pb.h"

namespace kcache::attention {

// The three value types of an expression: int (int32, wrapping), float
// (fp32) and bool.
enum class ExprType { kInt, kFloat, kBool };

absl::string_view ExprTypeName(ExprType t);

// A declared buffer as code generation sees it: its slot in
// AttentionParams::buffers (the position in the spec's buffer list, which
// normalization sorts by name) and its element type and rank.
struct ExprBuffer {
  int slot = 0;
  v1::ElemType type = v1::ELEM_TYPE_UNSPECIFIED;
  uint32_t rank = 0;
};

// Name -> buffer. Later duplicates do not replace earlier ones (validation
// rejects duplicates anyway).
using ExprBufferTable = absl::flat_hash_map<std::string, ExprBuffer>;
ExprBufferTable BuildBufferTable(const v1::AttentionSpec& spec);

// The value type of a buffer element, or nullopt-like false for an
// unspecified/unknown element type.
bool ElemTypeToExprType(v1::ElemType t, ExprType* out);

}  // namespace kcache::attention
