// The toolchain fingerprint: which compiler, which build of it, and which
// options produced a cubin. Its id is the key prefix under which all entries
// of one toolchain live, so retiring a toolkit is one range delete.
//
// All functions are thread-safe (no shared state besides the Nvrtc passed in).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/cuda/nvjitlink.h"
#include "compiler/cuda/nvrtc.h"
#include "kcache/v1/record.pb.h"

namespace kcache {

// Builds a toolchain from explicit fields and fills in its id:
// cache/key.h's ToolchainIdHex (hex of the first 8 bytes of SHA-256 over
// the length-prefixed fields), so the id always equals the store's key
// prefix. NvrtcToolchain and RawToolchain below build theirs with it; tests
// use it to put two toolchains on one store.
v1::Toolchain MakeToolchain(std::string compiler, std::string version, std::string build,
                            std::vector<std::string> options);

// The fingerprint of the NVRTC that `nvrtc` loads: compiler "nvrtc", version
// "13.0" (nvrtcVersion), build "sha256:<hex>" of the library file's bytes
// (stable across machines with the identical toolkit, unlike paths or
// mtimes), options CanonicalNvrtcOptions(). Reads the ~100 MB library once
// (a few hundred ms): call it once at start. Unavailable when NVRTC cannot be
// loaded; Internal when its file cannot be read.
absl::StatusOr<v1::Toolchain> NvrtcToolchain(const Nvrtc& nvrtc);

// The fingerprint of the raw-kernel path (compiler/worker/raw_compile.h): compiler
// "llvm-nvptx+nvjitlink", version "llvm <X.Y.Z> nvjitlink <M.m>" (llvm "none"
// when built without LLVM), build "sha256:<hex>" of the nvJitLink library
// file, options: the NVPTX codegen settings then CanonicalNvJitLinkOptions().
// Its id differs from the NVRTC toolchain's, so raw entries live under a key
// prefix of their own. Unavailable when nvJitLink cannot be loaded.
absl::StatusOr<v1::Toolchain> RawToolchain(const NvJitLink& linker);

}  // namespace kcache
