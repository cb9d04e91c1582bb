// SHA-256 digests and hex encoding: the hash behind every kernel key and
// blob address. Thread-safe (no shared state).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kcache {

using Sha256Digest = std::array<uint8_t, 32>;

// One-shot SHA-256 of `data`.
Sha256Digest Sha256(std::string_view data);

// Incremental SHA-256. Not thread-safe; one instance per stream.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(std::string_view data);
  // Appends a length-prefixed field, so that ("ab","c") and ("a","bc")
  // hash differently. Use for canonical, multi-field inputs.
  void UpdateField(std::string_view data);
  Sha256Digest Finish();

 private:
  struct Impl;
  Impl* impl_;
};

std::string ToHex(std::string_view bytes);
inline std::string ToHex(const Sha256Digest& d) {
  return ToHex(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}
inline std::string_view AsBytes(const Sha256Digest& d) {
  return std::string_view(reinterpret_cast<const char*>(d.data()), d.size());
}
// Parses lower- or upper-case hex; InvalidArgument on odd length or a
// non-hex character.
absl::StatusOr<std::string> FromHex(std::string_view hex);

}  // namespace kcache
