// The export/import bundle: one self-contained file of records with their
// cubins. Holds no paths; every field is checked on decode. Thread-safe
// (no shared state); a BundleWriter is used by one thread.
//
// Format version 1, all integers little-endian:
//   header   "KCBUNDLE" (8 bytes) | u32 version = 1 | u32 flags = 0
//   frame*   u8 'R' | u32 record_len | KernelRecord bytes | u64 cubin_len | cubin
//   trailer  u8 'E' | u64 frame count | SHA-256 over every byte before it
// Nothing may follow the trailer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/digest.h"
#include "kcache/v1/record.pb.h"

namespace kcache {

inline constexpr std::string_view kBundleMagic = "KCBUNDLE";
inline constexpr uint32_t kBundleVersion = 1;
inline constexpr uint32_t kBundleMaxRecordBytes = 16u << 20;

// Streams a bundle into `sink` (called with consecutive pieces).
class BundleWriter {
 public:
  explicit BundleWriter(std::function<absl::Status(std::string_view)> sink);
  absl::Status Begin();
  // `record` must name `cubin` (cubin_sha256, cubin_size); not re-checked here.
  absl::Status Add(const v1::KernelRecord& record, std::string_view cubin);
  absl::Status Finish();
  uint64_t count() const { return count_; }

 private:
  absl::Status Emit(std::string_view bytes);
  std::function<absl::Status(std::string_view)> sink_;
  Sha256Hasher hasher_;
  uint64_t count_ = 0;
};

struct BundleEntry {
  v1::KernelRecord record;
  std::string_view cubin;  // points into the decoded buffer
};

// Decodes and checks a whole bundle: magic, version, flags, every frame's
// bounds, record validity (cache/record_codec.h), each cubin against its
// record's digest and size, the count and the checksum. Errors name the
// problem and the frame: InvalidArgument for a file that is not a bundle or
// of an unknown version; DataLoss for a damaged one.
absl::StatusOr<std::vector<BundleEntry>> DecodeBundle(std::string_view bundle);

// The largest bundle ReadBundleFile reads into memory by default.
inline constexpr uint64_t kBundleMaxFileBytes = uint64_t{8} << 30;

// Reads a bundle file into memory, bounded: InvalidArgument (naming the
// path) when it does not start with the bundle magic (checked on the first
// bytes, so /dev/zero or a wrong file is refused at once) or grows past
// `max_bytes`; NotFound when it cannot be opened; Unavailable on a read error.
absl::StatusOr<std::string> ReadBundleFile(const std::string& path,
                                           uint64_t max_bytes = kBundleMaxFileBytes);

}  // namespace kcache
