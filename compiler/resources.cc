// v1::Resources from driver attributes and ptxas reports.
#include "compiler/resources.h"

namespace kcache {

v1::Resources ToResources(const EntryResources& e) {
  v1::Resources r;
  r.set_registers(e.registers);
  r.set_static_smem_bytes(e.static_smem_bytes);
  r.set_max_dynamic_smem_bytes(e.max_dynamic_smem_bytes);
  r.set_local_bytes(e.local_bytes);
  r.set_max_threads_per_block(e.max_threads_per_block);
  return r;
}

v1::Resources ToResources(const KernelReport& k) {
  v1::Resources r;
  r.set_registers(k.registers);
  r.set_static_smem_bytes(k.static_smem_bytes);
  r.set_local_bytes(k.stack_frame_bytes);
  r.set_spill_bytes(k.spill_store_bytes);
  return r;
}

v1::Resources ToResources(const EntryResources& e, const KernelReport& k) {
  v1::Resources r = ToResources(e);
  r.set_spill_bytes(k.spill_store_bytes);
  return r;
}

}  // namespace kcache
