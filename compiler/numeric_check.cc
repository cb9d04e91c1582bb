#include "compiler/numeric_check.h"

#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "compiler/attention/spec_json.h"
#include "kernels/attention_params.h"
#include "kernels/embedded.h"

namespace kcache {

absl::StatusOr<NumericDiff> CudaNumericRunner::Run(int ordinal, const v1::KernelRecord& record,
                                                   absl::string_view cubin,
                                                   absl::string_view reference_cubin) {
  const v1::AttentionSpec& spec = record.spec();
  AttentionCheckKernel k;
  k.bf16 = spec.dtype() != v1::DTYPE_FP16;
  k.head_dim_qk = static_cast<int>(spec.head_dim_qk());
  k.head_dim_v = static_cast<int>(spec.head_dim_v() != 0 ? spec.head_dim_v() : spec.head_dim_qk());
  k.num_q_heads = static_cast<int>(spec.num_q_heads());
  k.num_kv_heads =
      static_cast<int>(spec.num_kv_heads() != 0 ? spec.num_kv_heads() : spec.num_q_heads());
  const v1::MaskSpec& m = spec.mask();
  k.mask = m.has_causal()           ? KC_MASK_CAUSAL
           : m.has_sliding_window() ? KC_MASK_SLIDING_WINDOW
           : m.has_document()       ? KC_MASK_DOCUMENT
           : m.has_drafter()        ? KC_MASK_DRAFTER
           : m.has_expr()           ? KC_MASK_EXPR
                                    : KC_MASK_NONE;
  k.drafter_block = m.has_drafter() ? static_cast<int>(m.drafter().block_size()) : 0;
  for (const v1::BufferDecl& b : spec.buffers()) {
    k.buffers.push_back({static_cast<int>(b.type()), static_cast<int>(b.rank())});
  }
  for (const v1::EntryPoint& e : record.entry_points()) {
    AttentionCheckKernel::Entry x{e.name(), static_cast<int>(e.threads()),
                                  static_cast<int>(e.dynamic_smem_bytes()),
                                  static_cast<int>(e.block_m()), static_cast<int>(e.block_n())};
    if (e.role() == v1::ENTRY_ROLE_FORWARD) k.forward = x;
    if (e.role() == v1::ENTRY_ROLE_MASK_BUILD) k.mask_build = x;
  }
  auto d = devices_->RunAttentionCheck(ordinal, k, cubin, reference_cubin);
  if (!d.ok()) return d.status();
  return NumericDiff{d->rel_l2, d->max_abs, d->device};
}

double NumericTolerance(v1::DType dtype) { return dtype == v1::DTYPE_FP16 ? 5e-3 : 2e-2; }

absl::StatusOr<v1::NumericCheck> CheckAttentionNumerics(const AttentionBuild& build,
                                                        Compiler& compiler, NumericRunner& runner,
                                                        int ordinal, absl::Time deadline) {
  const absl::Time start = absl::Now();
  const v1::KernelRecord& rec = build.record;
  if (build.reference_source.empty()) {
    return absl::FailedPreconditionError("numeric check: the build has no reference source");
  }
  CompileInput in;
  in.source = build.reference_source;
  in.program_name = "kcache_attention_ref.cu";
  in.headers = TemplateHeaders();
  in.arch = rec.arch();
  auto ref = compiler.Compile(in, deadline);
  if (!ref.ok()) {
    return absl::Status(ref.status().code(),
                        absl::StrCat("numeric check: reference compile: ", ref.status().message()));
  }
  auto diff = runner.Run(ordinal, rec, build.cubin, ref->cubin);
  if (!diff.ok()) {
    return absl::Status(diff.status().code(),
                        absl::StrCat("numeric check: ", diff.status().message()));
  }
  const double tol = NumericTolerance(rec.spec().dtype());
  if (!(diff->rel_l2 <= tol)) {  // NaN fails too
    // Internal, not FailedPrecondition: a wrong kernel is our bug (generator
    // or toolchain), and the scheduler does not remember it, so the next
    // request compiles again.
    return absl::InternalError(absl::StrFormat(
        "numeric check failed for kernel %s (%s, %s): rel L2 error %.3e > %.0e, worst |diff| "
        "%.3e on %s; not published",
        absl::BytesToHexString(rec.key()), attention::DescribeSpec(rec.spec()), rec.arch(),
        diff->rel_l2, tol, diff->max_abs, diff->device));
  }
  v1::NumericCheck out;
  out.set_state(v1::NUMERIC_CHECK_PASSED);
  out.set_rel_l2_error(diff->rel_l2);
  out.set_max_abs_error(diff->max_abs);
  out.set_tolerance(tol);
  out.set_device(diff->device);
  out.set_check_time_us(static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start)));
  return out;
}

}  // namespace kcache
