// Stored-record decoding and validation (see record_codec.h).
#include "cache/record_codec.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/digest.h"
#include "cache/key.h"

namespace kcache {

absl::Status ValidateRecord(const v1::KernelRecord& r) {
  if (auto s = ValidateKey(r.key()); !s.ok()) return s;
  if (r.format_version() != kRecordFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("format_version: ", r.format_version(), ", expected ", kRecordFormatVersion));
  }
  if (r.cubin_sha256().size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("cubin_sha256: expected 32 bytes, got ", r.cubin_sha256().size()));
  }
  const std::string tid = ToolchainId(r.toolchain());
  if (KeyToolchainId(r.key()) != tid) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: toolchain id ", ToHex(KeyToolchainId(r.key())),
                     " does not match the record's toolchain (", ToHex(tid), ")"));
  }
  if (!r.toolchain().id().empty() && r.toolchain().id() != ToHex(tid)) {
    return absl::InvalidArgumentError(absl::StrCat("toolchain.id: '", r.toolchain().id(),
                                                   "' is not the toolchain's id ", ToHex(tid)));
  }
  if (r.arch().empty()) return absl::InvalidArgumentError("arch: empty");
  return absl::OkStatus();
}

absl::StatusOr<v1::KernelRecord> DecodeRecord(std::string_view bytes) {
  v1::KernelRecord r;
  if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("record: not a valid KernelRecord message");
  }
  if (auto s = ValidateRecord(r); !s.ok()) {
    return absl::DataLossError(absl::StrCat("record: ", s.message()));
  }
  return r;
}

std::string MaskKind(const v1::KernelRecord& record) {
  const auto& mask = record.spec().mask();
  const auto* oneof = mask.GetDescriptor()->FindOneofByName("kind");
  const auto* field = mask.GetReflection()->GetOneofFieldDescriptor(mask, oneof);
  return field == nullptr ? "none" : field->name();
}

}  // namespace kcache
