// The unit of work the compile scheduler hands to every waiter of one key: a
// finished record and its cubin bytes, exactly what the store publishes and
// serves (cache/entry.h). Shared as std::shared_ptr<const CompiledKernel>, so
// all waiters of one compile see the very same object; immutable once shared.
#pragma once

#include "cache/entry.h"

namespace kcache {

using CompiledKernel = Entry;

}  // namespace kcache
