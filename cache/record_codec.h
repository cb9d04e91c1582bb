// Decoding and validation of stored KernelRecords (the records column family
// and bundle frames hold serialized kcache.v1.KernelRecord). Pure functions;
// thread-safe. Fuzzed by tests/cache/fuzz_decode.cc.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kcache/v1/record.pb.h"

namespace kcache {

// The record format version this code writes (KernelRecord.format_version).
inline constexpr uint32_t kRecordFormatVersion = 1;

// Parses a stored record and checks what the store relies on: a well-formed
// key whose toolchain id matches the record's toolchain, a 32-byte
// cubin_sha256, a known format version. DataLoss naming the problem otherwise.
absl::StatusOr<v1::KernelRecord> DecodeRecord(std::string_view bytes);

// Checks the same invariants on an in-memory record (InvalidArgument naming
// the field); used before writing.
absl::Status ValidateRecord(const v1::KernelRecord& record);

// The mask kind of a record's spec: the name of the MaskSpec oneof field
// that is set ("causal", "sliding_window", ...); "none" when unset.
std::string MaskKind(const v1::KernelRecord& record);

}  // namespace kcache
