// Conversions of the compiler's and the driver's resource figures to the
// wire's v1::Resources. Pure functions, thread-safe.
#pragma once

#include "compiler/cuda/compile.h"
#include "compiler/cuda/cuda_driver.h"
#include "kcache/v1/record.pb.h"

namespace kcache {

// From a loaded entry point (verified records). spill_bytes stays 0: the
// driver does not report spills; take them from the ptxas report.
v1::Resources ToResources(const EntryResources& e);

// From ptxas's report (compile-only records): registers, static smem,
// local_bytes = stack frame, spill_bytes = spill stores.
v1::Resources ToResources(const KernelReport& k);

// Verified figures, with spill_bytes filled in from the ptxas report.
v1::Resources ToResources(const EntryResources& e, const KernelReport& k);

}  // namespace kcache
