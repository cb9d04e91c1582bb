// A kernel's cubin blob: one or more executable ELF images, one after another.
// An attention module with backward has two (its forward's kernels, then its
// backward's: compiler/attention/codegen.h says why); every other kernel one.
// Loaders load each image as its own module and look an entry point up in
// the image that defines it. Header-only (absl only), so that the clients
// share the one reader with the daemon.
//
// An image's size is where its ELF ends: the furthest of its section header
// table, program header table and non-empty section contents. The writers
// (JoinCubinImages, CheckCubinImage on every compile's output) check that
// this is each image's whole length, so the reader's cut cannot drift. ELF
// extended numbering (e_shnum 0 with the count in section 0, e_phnum 0xffff)
// is not read: no cubin NVRTC or nvJitLink writes uses it, and the writers'
// check refuses one that would.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kcache {

// The length of the 64-bit little-endian ELF image at the start of `bytes`.
// InvalidArgument (naming the flaw) when it is not one or runs past `bytes`.
inline absl::StatusOr<size_t> CubinImageSize(std::string_view bytes) {
  const auto u16 = [&](size_t at) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + at, sizeof v);
    return static_cast<uint64_t>(v);
  };
  const auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, bytes.data() + at, sizeof v);
    return static_cast<uint64_t>(v);
  };
  const auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, bytes.data() + at, sizeof v);
    return v;
  };
  constexpr size_t kHeader = 64;  // Elf64_Ehdr
  if (bytes.size() < kHeader || bytes.substr(0, 4) != std::string_view("\x7f"
                                                                       "ELF",
                                                                       4)) {
    return absl::InvalidArgumentError("cubin: not an ELF image");
  }
  if (bytes[4] != 2 || bytes[5] != 1) {
    return absl::InvalidArgumentError("cubin: not a 64-bit little-endian ELF");
  }
  const uint64_t size = bytes.size();
  // Tables: (offset, count, entry size) must lie within the bytes.
  const auto table_end = [&](uint64_t off, uint64_t n, uint64_t entsize,
                             const char* what) -> absl::StatusOr<uint64_t> {
    if (n == 0) return uint64_t{0};
    if (off > size || entsize == 0 || n > (size - off) / entsize) {
      return absl::InvalidArgumentError(
          absl::StrCat("cubin: ELF ", what, " table runs past ", size, " bytes"));
    }
    return off + n * entsize;
  };
  const uint64_t shoff = u64(0x28), phoff = u64(0x20);
  const uint64_t phentsize = u16(0x36), phnum = u16(0x38);
  const uint64_t shentsize = u16(0x3A), shnum = u16(0x3C);
  absl::StatusOr<uint64_t> sh_end = table_end(shoff, shnum, shentsize, "section header");
  if (!sh_end.ok()) return sh_end.status();
  absl::StatusOr<uint64_t> ph_end = table_end(phoff, phnum, phentsize, "program header");
  if (!ph_end.ok()) return ph_end.status();
  uint64_t end = std::max<uint64_t>({kHeader, *sh_end, *ph_end});
  if (shnum > 0 && shentsize < 64) {
    return absl::InvalidArgumentError("cubin: ELF section headers too small");
  }
  for (uint64_t i = 0; i < shnum; ++i) {
    const size_t at = static_cast<size_t>(shoff + i * shentsize);
    constexpr uint64_t kNoBits = 8;  // SHT_NOBITS: no bytes in the file
    if (u32(at + 4) == kNoBits) continue;
    const uint64_t off = u64(at + 0x18), len = u64(at + 0x20);
    if (off > size || len > size - off) {
      return absl::InvalidArgumentError(
          absl::StrCat("cubin: ELF section ", i, " runs past ", size, " bytes"));
    }
    end = std::max(end, off + len);
  }
  return static_cast<size_t>(end);
}

// The images of a blob, in order (views into `blob`). InvalidArgument when
// the blob is empty, or any part of it is not a whole ELF image.
inline absl::StatusOr<std::vector<std::string_view>> SplitCubinImages(std::string_view blob) {
  if (blob.empty()) return absl::InvalidArgumentError("cubin: empty");
  std::vector<std::string_view> images;
  while (!blob.empty()) {
    absl::StatusOr<size_t> n = CubinImageSize(blob);
    if (!n.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(n.status().message(), " (image ", images.size(), ")"));
    }
    images.push_back(blob.substr(0, *n));
    blob.remove_prefix(*n);
  }
  return images;
}

// OK when `image` is exactly one whole ELF image, as SplitCubinImages reads
// it; Internal otherwise (`what` names it): a compiler's output that the
// loaders would refuse or cut elsewhere is never published.
inline absl::Status CheckCubinImage(std::string_view image, const std::string& what) {
  absl::StatusOr<size_t> n = CubinImageSize(image);
  if (!n.ok()) return absl::InternalError(absl::StrCat(what, ": ", n.status().message()));
  if (*n != image.size()) {
    return absl::InternalError(
        absl::StrCat(what, ": ", image.size(), " bytes, but its ELF ends at ", *n));
  }
  return absl::OkStatus();
}

// One blob of `images` (each checked by CheckCubinImage, so that
// SplitCubinImages cuts the blob back into them).
inline absl::StatusOr<std::string> JoinCubinImages(const std::vector<std::string>& images) {
  std::string blob;
  for (size_t i = 0; i < images.size(); ++i) {
    if (absl::Status s = CheckCubinImage(images[i], absl::StrCat("cubin of unit ", i)); !s.ok()) {
      return s;
    }
    blob += images[i];
  }
  return blob;
}

// The loaders' two steps, shared by the daemon (compiler/cuda/cuda_driver.cc)
// and the C++ client (client/client.cc), which call the driver through
// different tables of entry points: templates over the call, so that neither
// needs the other's table.

// Calls `load(const char* image)` (returning absl::Status: load one module)
// for each image of `blob`, in order, until one fails; that failure, or the
// split's, is the answer. Each image is passed as a copy: an image after the
// first starts where the one before ends, 8-byte aligned at best, and a
// std::string is allocated as new aligns. `load` keeps what it loaded, for
// the caller to unload on every path.
template <typename LoadImage>
absl::Status LoadCubinImages(std::string_view blob, LoadImage&& load) {
  absl::StatusOr<std::vector<std::string_view>> images = SplitCubinImages(blob);
  if (!images.ok()) return images.status();
  for (std::string_view image : *images) {
    const std::string aligned(image);
    if (absl::Status s = load(aligned.data()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// CUDA_ERROR_NOT_FOUND: cuModuleGetFunction's answer for a name that the
// module does not define.
inline constexpr int kCudaErrorNotFound = 500;

// An entry point from the first image that defines it: `get(module)` (one
// cuModuleGetFunction into the caller's CUfunction, returning its CUresult)
// for each of `modules` in order until one answers other than NOT_FOUND.
// Returns that answer (success, or the driver's own error, which stops the
// search), else NOT_FOUND.
template <typename Module, typename GetFunction>
auto FindCubinFunction(const std::vector<Module>& modules, GetFunction&& get)
    -> decltype(get(modules.front())) {
  using Result = decltype(get(modules.front()));
  Result rc = static_cast<Result>(kCudaErrorNotFound);
  for (const Module& m : modules) {
    rc = get(m);
    if (static_cast<int>(rc) != kCudaErrorNotFound) break;
  }
  return rc;
}

}  // namespace kcache
