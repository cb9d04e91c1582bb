// Reads the kernels out of a cubin (an NVIDIA GPU ELF) with LLVM's Object
// library: no GPU, no NVIDIA disassembler. Registers and stack figures come
// from NVIDIA's undocumented .nv.info attribute sections (EIATTR_REGCOUNT,
// EIATTR_FRAME_SIZE, ...; codes as cuobjdump -elf names them); static shared
// memory and code size from each kernel's .nv.shared.<name> and
// .text.<name> sections. A figure that could not be read is -1, never a
// guess. Only built with KCACHE_WITH_LLVM. Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kcache {

struct CubinKernel {
  std::string name;
  bool entry = false;       // a kernel (STO_CUDA_ENTRY), not a device function
  int64_t code_bytes = -1;  // size of .text.<name>
  int64_t registers = -1;   // EIATTR_REGCOUNT
  // Size of .nv.shared.<name> (0 when absent). From sm_90 on it includes
  // the shared memory the driver reserves (see CubinInfo::notes).
  int64_t static_smem_bytes = -1;
  int64_t frame_bytes = -1;      // EIATTR_FRAME_SIZE (local memory per thread)
  int64_t max_stack_bytes = -1;  // EIATTR_MAX_STACK_SIZE
  int64_t param_bytes = -1;      // EIATTR_CBANK_PARAM_SIZE
  int64_t max_threads = -1;      // EIATTR_MAX_THREADS (x*y*z), when declared
  // Which image of the cubin it is in (0 for a cubin of one image): a
  // device function both images define is listed once for each.
  int image = 0;
};

struct CubinInfo {
  // "sm_80", "sm_90a": from e_flags, with the suffix from ptxas's command
  // line (.note.nv.tkinfo) where the header does not carry it.
  std::string arch;
  // Entries first, then device functions; by name, then image.
  std::vector<CubinKernel> kernels;
  int images = 0;  // how many ELF images the cubin holds
  // What could not be read (unknown attribute formats, truncated sections).
  std::vector<std::string> notes;
};

// Every image of `cubin` (compiler/cuda/cubin_images.h): their kernels
// together, the first image's arch. InvalidArgument when `cubin` is not
// whole ELF images, or an image is not one LLVM can read, or not for EM_CUDA.
absl::StatusOr<CubinInfo> ReadCubin(absl::string_view cubin);

}  // namespace kcache
