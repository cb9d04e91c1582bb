// Expression-tree vocabulary shared by validation and lowering.
#include "compiler/attention/expr.h"

namespace kcache::attention {

absl::string_view ExprTypeName(ExprType t) {
  switch (t) {
    case ExprType::kInt:
      return "int";
    case ExprType::kFloat:
      return "float";
    case ExprType::kBool:
      return "bool";
  }
  return "?";
}

bool ElemTypeToExprType(v1::ElemType t, ExprType* out) {
  switch (t) {
    case v1::ELEM_TYPE_INT32:
      *out = ExprType::kInt;
      return true;
    case v1::ELEM_TYPE_FLOAT32:
      *out = ExprType::kFloat;
      return true;
    case v1::ELEM_TYPE_BOOL:
      *out = ExprType::kBool;
      return true;
    default:
      return false;
  }
}

ExprBufferTable BuildBufferTable(const v1::AttentionSpec& spec) {
  ExprBufferTable table;
  for (int i = 0; i < spec.buffers_size(); ++i) {
    const v1::BufferDecl& d = spec.buffers(i);
    table.try_emplace(d.name(), ExprBuffer{i, d.type(), d.rank()});
  }
  return table;
}

}  // namespace kcache::attention
