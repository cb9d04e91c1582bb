// The numeric check before serve (issue 28): a daemon with a GPU runs each
// new attention kernel once on small inputs that exercise its mask and score
// modification, against a reference computed another way (the plain
// one-thread-per-row kernel of kernels/attention_ref.cuh, compiled from the
// same generated prelude), and refuses to publish a kernel whose output
// differs beyond the dtype's tolerance.
//
// The device work sits behind the narrow NumericRunner interface, so that
// CPU tests use a fake; CheckAttentionNumerics (compile the reference, run,
// judge) is shared by every caller. Thread-safe: no shared state here;
// NumericRunner implementations must allow concurrent calls.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "compiler/attention_compile.h"
#include "compiler/cuda/compile.h"
#include "compiler/cuda/cuda_driver.h"
#include "kcache/v1/record.pb.h"

namespace kcache {

// How far a kernel's output is from the reference's.
struct NumericDiff {
  double rel_l2 = 0;   // ||kernel - reference|| / ||reference|| over O (NaN: any NaN)
  double max_abs = 0;  // worst |kernel - reference| element
  std::string device;  // device name
};

class NumericRunner {
 public:
  virtual ~NumericRunner() = default;
  // Runs the forward of `record` (an attention kernel: spec and entry
  // points; `cubin` its image or images, compiler/cuda/cubin_images.h) and the reference
  // `reference_cubin` (entry kcache_attn_ref_fwd) on device `ordinal` on the same small random
  // inputs (mask inputs and expression buffers included), and compares O. An out-of-tolerance
  // result is still OK here (the caller judges); errors are for runs that could not happen (load,
  // launch, memory), as the driver reports them.
  virtual absl::StatusOr<NumericDiff> Run(int ordinal, const v1::KernelRecord& record,
                                          absl::string_view cubin,
                                          absl::string_view reference_cubin) = 0;
};

// The runner of a daemon with GPUs: CudaDevices::RunAttentionCheck on the
// record's spec and entry points. `devices` must outlive it.
class CudaNumericRunner final : public NumericRunner {
 public:
  explicit CudaNumericRunner(CudaDevices* devices) : devices_(devices) {}
  absl::StatusOr<NumericDiff> Run(int ordinal, const v1::KernelRecord& record,
                                  absl::string_view cubin,
                                  absl::string_view reference_cubin) override;

 private:
  CudaDevices* devices_;
};

// Tolerance on NumericDiff::rel_l2 by dtype: bf16 2e-2, fp16 5e-3 (the
// kernels land near 3e-3 / 4e-4 on the suites).
double NumericTolerance(v1::DType dtype);

// Compiles build.reference_source with `compiler` by `deadline`, runs both
// with `runner` on `ordinal`, and judges. OK: the record's NumericCheck
// (state PASSED, errors, tolerance, device, time). Internal "numeric check
// failed for kernel <key hex> (<spec>, <arch>): rel L2 error X > T, worst
// |diff| Y on <device>; not published" when out of tolerance or NaN (not a
// FailedPrecondition: the scheduler remembers those, and a refused kernel
// must be compiled again by the next request); the reference's
// compile errors and the runner's errors prefixed "numeric check: ".
absl::StatusOr<v1::NumericCheck> CheckAttentionNumerics(const AttentionBuild& build,
                                                        Compiler& compiler, NumericRunner& runner,
                                                        int ordinal, absl::Time deadline);

}  // namespace kcache
