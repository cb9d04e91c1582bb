// The unit of work the compile scheduler hands to every waiter of one key: a
// finished record and its cubin bytes. Shared as
// std::shared_ptr<const CompiledKernel>, so all waiters of one compile see the
// very same object; it is immutable once shared.
#pragma once

#include <string>

#include "kcache/v1/record.pb.h"

namespace kcache {

struct CompiledKernel {
  v1::KernelRecord record;
  std::string cubin;
};

}  // namespace kcache
