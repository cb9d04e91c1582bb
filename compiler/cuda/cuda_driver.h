// The CUDA driver, loaded at run time (dlopen "libcuda.so.1"), behind the
// narrow Devices interface: list devices, and verify a cubin by loading it on
// a device of its architecture and reading each entry point's resources.
// Everything but the GPU tests runs without libcuda; the scheduler and
// service tests use fakes of Devices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kcache {

struct CudaDriverApi;  // internal: the resolved driver entry points

struct DeviceInfo {
  int ordinal = 0;   // CUDA device ordinal (as CUDA_VISIBLE_DEVICES numbers it)
  std::string name;  // "NVIDIA H200"
  int cc_major = 0;
  int cc_minor = 0;
  std::string arch;  // "sm_90": the plain architecture of the device
  int sm_count = 0;
  uint64_t total_memory_bytes = 0;
  int max_smem_per_block_optin = 0;  // upper bound for static + dynamic smem
};

// "sm_<major><minor>", e.g. (9, 0) -> "sm_90".
std::string ArchForComputeCapability(int major, int minor);

// Whether a cubin built for `cubin_arch` is verified by loading it on
// `device`: exactly the device's own architecture, or its arch-specific
// variant ("sm_90a" on an sm_90 device). Binary compatibility across minor
// versions (an sm_80 cubin runs on sm_86) is deliberately not counted:
// verification means "loaded on a device of that architecture".
bool CanVerifyArch(const DeviceInfo& device, absl::string_view cubin_arch);

// What the caller needs from one entry point.
struct EntryRequirement {
  std::string name;            // symbol in the cubin (extern "C")
  int dynamic_smem_bytes = 0;  // > 0: raise MAX_DYNAMIC_SHARED_SIZE_BYTES to it
  int threads_per_block = 0;   // > 0: must not exceed MAX_THREADS_PER_BLOCK
};

// The driver's view of one loaded entry point (mirrors v1::Resources; see
// compiler/resources.h for the conversion).
struct EntryResources {
  std::string name;
  int registers = 0;               // CU_FUNC_ATTRIBUTE_NUM_REGS
  int static_smem_bytes = 0;       // SHARED_SIZE_BYTES
  int max_dynamic_smem_bytes = 0;  // MAX_DYNAMIC_SHARED_SIZE_BYTES (after raising)
  int local_bytes = 0;             // LOCAL_SIZE_BYTES (per thread)
  int max_threads_per_block = 0;   // MAX_THREADS_PER_BLOCK
};

struct VerifyResult {
  int device_ordinal = 0;
  std::string device_name;
  std::vector<EntryResources> entries;  // in the order requested
};

// The numeric check's run (issue 28; compiler/numeric_check.h), described
// without protobuf so that it stays in the runtime library: an attention
// forward kernel and its reference kernel (kcache_attn_ref_fwd, one thread
// per row, kernels/attention_ref.cuh) run on the same small random inputs.
struct AttentionCheckKernel {
  bool bf16 = true;  // else fp16
  int head_dim_qk = 0, head_dim_v = 0;
  int num_q_heads = 0, num_kv_heads = 0;
  int mask = 0;           // KC_MASK_* (kernels/attention_params.h)
  int score = 0;          // KC_SCORE_*
  int drafter_block = 0;  // KC_MASK_DRAFTER
  struct Buffer {
    int type = 1;  // 1 int32, 2 float32, 3 bool (v1::ElemType numbering)
    int rank = 1;
  };
  std::vector<Buffer> buffers;  // expression buffers, by slot
  struct Entry {
    std::string name;
    int threads = 0, dynamic_smem_bytes = 0, block_m = 0, block_n = 0;
  };
  Entry forward;
  Entry mask_build;  // name empty unless the mask is an expression
};
struct AttentionCheckDiff {
  double rel_l2 = 0;   // ||O - O_ref|| / ||O_ref||; NaN when O has a NaN
  double max_abs = 0;  // worst |O - O_ref|
  std::string device;
};

// Thread-safe: implementations must allow concurrent calls from any thread.
class Devices {
 public:
  virtual ~Devices() = default;

  // OK when the driver is loaded and at least one device was found.
  // Otherwise Unavailable, with a message the daemon prints as is, e.g.
  // "compile-only mode: libcuda.so.1 not loadable (...)".
  virtual absl::Status Availability() const = 0;

  // Devices found at start; empty in compile-only mode.
  virtual std::vector<DeviceInfo> List() const = 0;

  // Loads every image of `cubin` (compiler/cuda/cubin_images.h) on device
  // `ordinal`, looks up every entry point in the image that defines it, reads
  // its attributes, applies the requirements, and unloads the modules.
  // Errors: InvalidArgument (unknown ordinal, empty cubin or not whole ELF
  // images, no entries, or `arch` the device cannot verify), Unavailable
  // (compile-only mode), FailedPrecondition (an image does not load, an entry
  // point is missing, a requirement cannot be met; the message names which),
  // others as the driver reports them.
  virtual absl::StatusOr<VerifyResult> Verify(int ordinal, absl::string_view arch,
                                              absl::string_view cubin,
                                              const std::vector<EntryRequirement>& entries) = 0;
};

// Devices backed by the real driver. Each device's primary context is
// retained once at Open (released by the destructor) and pushed/popped
// around every Verify on the calling thread, so concurrent Verify calls on
// any threads are safe and leave the callers' current contexts untouched.
// libcuda is never unloaded.
class CudaDevices final : public Devices {
 public:
  // Never fails: without libcuda, when cuInit fails, or with no device, the
  // result is in compile-only mode and Availability() says why.
  static std::unique_ptr<CudaDevices> Open(const std::string& library_path = "libcuda.so.1");
  ~CudaDevices() override;
  CudaDevices(const CudaDevices&) = delete;
  CudaDevices& operator=(const CudaDevices&) = delete;

  absl::Status Availability() const override;
  std::vector<DeviceInfo> List() const override;
  absl::StatusOr<VerifyResult> Verify(int ordinal, absl::string_view arch, absl::string_view cubin,
                                      const std::vector<EntryRequirement>& entries) override;

  // Runs `kernel` (from `cubin`) and the reference (from `reference_cubin`)
  // on device `ordinal` on the same random inputs (batch 2, odd lengths
  // spanning several tiles; mask inputs and expression buffers filled) and
  // compares O. Errors as Verify's; Unavailable in compile-only mode.
  absl::StatusOr<AttentionCheckDiff> RunAttentionCheck(int ordinal,
                                                       const AttentionCheckKernel& kernel,
                                                       absl::string_view cubin,
                                                       absl::string_view reference_cubin);

  // The driver's version as cuDriverGetVersion reports it (13000 = 13.0);
  // 0 in compile-only mode.
  int driver_version() const { return driver_version_; }

 private:
  struct Device;
  CudaDevices();

  std::unique_ptr<CudaDriverApi> api_;  // null in compile-only mode
  std::vector<Device> devices_;
  absl::Status availability_;
  int driver_version_ = 0;
};

}  // namespace kcache
