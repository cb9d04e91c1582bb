// Store keys: the binary, versioned, toolchain-prefixed address of one
// compiled kernel, and their hex form for people. Pure functions; thread-safe.
//
// Layout (kKeySize = 41 bytes):
//   [1 byte key-format version][8 bytes toolchain id][32 bytes SHA-256]
// The SHA-256 covers, each as a length-prefixed field (Sha256Hasher::UpdateField):
//   key-format version (one byte), the normalized spec's canonical bytes,
//   the template digest (hex), the toolchain fingerprint (compiler, version,
//   build, option count in decimal, each option), and the target arch.
// Because the toolchain id follows the version byte, all entries of one
// toolchain form one contiguous key range (see ToolchainRange).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kcache/v1/record.pb.h"

namespace kcache {

inline constexpr uint8_t kKeyFormatVersion = 1;
inline constexpr size_t kToolchainIdSize = 8;
inline constexpr size_t kKeyHashSize = 32;
inline constexpr size_t kKeySize = 1 + kToolchainIdSize + kKeyHashSize;

// The inputs of a key. Views must outlive the call only.
struct KeyParts {
  // Canonical bytes of the normalized spec, produced by the compiler; opaque here.
  std::string_view spec_canonical;
  // Hex SHA-256 of the kernel template sources (64 hex digits).
  std::string_view template_digest;
  const v1::Toolchain* toolchain = nullptr;
  // Target architecture, e.g. "sm_90a".
  std::string_view arch;
};

// The 8 raw bytes of a toolchain's id: the first 8 bytes of SHA-256 over its
// canonical fields (compiler, version, build, option count, options; each
// length-prefixed). Toolchain.id is ignored as an input.
std::string ToolchainId(const v1::Toolchain& toolchain);
// Hex of ToolchainId (16 digits): the value Toolchain.id should hold.
std::string ToolchainIdHex(const v1::Toolchain& toolchain);
// Parses a 16-digit hex toolchain id into its 8 raw bytes; InvalidArgument otherwise.
absl::StatusOr<std::string> ParseToolchainIdHex(std::string_view hex);

// Computes the store key. InvalidArgument naming the field when an input is
// missing or malformed (empty spec bytes, template digest not 64 hex digits,
// no toolchain or an empty compiler, empty arch or arch with spaces/controls).
absl::StatusOr<std::string> ComputeKey(const KeyParts& parts);

// OK when `key` is a well-formed store key of the current format; otherwise
// InvalidArgument saying why (length, version byte).
absl::Status ValidateKey(std::string_view key);

// The raw toolchain id inside a well-formed key (8 bytes).
inline std::string_view KeyToolchainId(std::string_view key) {
  return key.substr(1, kToolchainIdSize);
}

// The key prefix shared by every entry of a toolchain: [version][id] (9 bytes).
std::string ToolchainPrefix(std::string_view toolchain_id_raw);

// Half-open key range [begin, end) holding every entry of one toolchain.
struct KeyRange {
  std::string begin;
  std::string end;
};
KeyRange ToolchainRange(std::string_view toolchain_id_raw);
// Smallest string greater than every string that starts with `prefix`;
// empty when there is none (prefix all 0xff).
std::string PrefixSuccessor(std::string_view prefix);

// Hex form for people (82 lower-case digits). People may also type a
// prefix of one: ParseHexKeyPrefix below.
std::string KeyToHex(std::string_view key);

// A hex key prefix as typed by a person (1..82 hex digits, possibly odd):
// `bytes` holds the whole bytes; `odd_nibble` is the trailing half byte, or
// -1. Store::ResolveKeyPrefix resolves one against the store.
struct HexKeyPrefix {
  std::string bytes;
  int odd_nibble = -1;
  // True when `key` starts with this prefix.
  bool Matches(std::string_view key) const;
};
absl::StatusOr<HexKeyPrefix> ParseHexKeyPrefix(std::string_view hex);

}  // namespace kcache
