// Store key computation, validation and hex forms (see key.h).
#include "cache/key.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/digest.h"

namespace kcache {
namespace {

void HashToolchain(Sha256Hasher& h, const v1::Toolchain& t) {
  h.UpdateField(t.compiler());
  h.UpdateField(t.version());
  h.UpdateField(t.build());
  h.UpdateField(absl::StrCat(t.options_size()));
  for (const auto& o : t.options()) h.UpdateField(o);
}

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c - 'A' + 10;
}

}  // namespace

std::string ToolchainId(const v1::Toolchain& toolchain) {
  Sha256Hasher h;
  HashToolchain(h, toolchain);
  Sha256Digest d = h.Finish();
  return std::string(AsBytes(d).substr(0, kToolchainIdSize));
}

std::string ToolchainIdHex(const v1::Toolchain& toolchain) { return ToHex(ToolchainId(toolchain)); }

absl::StatusOr<std::string> ParseToolchainIdHex(std::string_view hex) {
  if (hex.size() != 2 * kToolchainIdSize) {
    return absl::InvalidArgumentError(absl::StrCat("toolchain_id: expected ", 2 * kToolchainIdSize,
                                                   " hex digits, got ", hex.size()));
  }
  auto raw = FromHex(hex);
  if (!raw.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("toolchain_id: ", raw.status().message()));
  }
  return raw;
}

absl::StatusOr<std::string> ComputeKey(const KeyParts& p) {
  if (p.spec_canonical.empty()) {
    return absl::InvalidArgumentError("spec_canonical: empty");
  }
  if (p.template_digest.size() != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("template_digest: expected 64 hex digits, got ", p.template_digest.size()));
  }
  for (char c : p.template_digest) {
    if (!IsHexDigit(c)) return absl::InvalidArgumentError("template_digest: not hex");
  }
  if (p.toolchain == nullptr) return absl::InvalidArgumentError("toolchain: missing");
  if (p.toolchain->compiler().empty()) {
    return absl::InvalidArgumentError("toolchain.compiler: empty");
  }
  if (p.arch.empty()) return absl::InvalidArgumentError("arch: empty");
  for (char c : p.arch) {
    if (static_cast<unsigned char>(c) <= ' ' || static_cast<unsigned char>(c) >= 0x7f) {
      return absl::InvalidArgumentError("arch: contains a space or control character");
    }
  }
  Sha256Hasher h;
  const char version = static_cast<char>(kKeyFormatVersion);
  h.UpdateField(std::string_view(&version, 1));
  h.UpdateField(p.spec_canonical);
  h.UpdateField(p.template_digest);
  HashToolchain(h, *p.toolchain);
  h.UpdateField(p.arch);
  Sha256Digest d = h.Finish();
  std::string key;
  key.reserve(kKeySize);
  key.push_back(version);
  key += ToolchainId(*p.toolchain);
  key += AsBytes(d);
  return key;
}

absl::Status ValidateKey(std::string_view key) {
  if (key.size() != kKeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: expected ", kKeySize, " bytes, got ", key.size()));
  }
  if (static_cast<uint8_t>(key[0]) != kKeyFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key: format version ", static_cast<uint8_t>(key[0]), ", expected ", kKeyFormatVersion));
  }
  return absl::OkStatus();
}

std::string ToolchainPrefix(std::string_view toolchain_id_raw) {
  std::string p(1, static_cast<char>(kKeyFormatVersion));
  p += toolchain_id_raw;
  return p;
}

std::string PrefixSuccessor(std::string_view prefix) {
  std::string s(prefix);
  while (!s.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(s.back());
    if (c != 0xff) {
      ++c;
      return s;
    }
    s.pop_back();
  }
  return s;
}

KeyRange ToolchainRange(std::string_view toolchain_id_raw) {
  std::string begin = ToolchainPrefix(toolchain_id_raw);
  std::string end = PrefixSuccessor(begin);
  return {std::move(begin), std::move(end)};
}

std::string KeyToHex(std::string_view key) { return ToHex(key); }

bool HexKeyPrefix::Matches(std::string_view key) const {
  if (key.substr(0, bytes.size()) != bytes) return false;
  if (odd_nibble < 0) return true;
  if (key.size() <= bytes.size()) return false;
  return (static_cast<uint8_t>(key[bytes.size()]) >> 4) == odd_nibble;
}

absl::StatusOr<HexKeyPrefix> ParseHexKeyPrefix(std::string_view hex) {
  if (hex.empty()) return absl::InvalidArgumentError("key prefix: empty");
  if (hex.size() > 2 * kKeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("key prefix: longer than a key (", hex.size(), " hex digits)"));
  }
  for (char c : hex) {
    if (!IsHexDigit(c)) return absl::InvalidArgumentError("key prefix: not hex");
  }
  HexKeyPrefix p;
  size_t whole = hex.size() / 2 * 2;
  auto raw = FromHex(hex.substr(0, whole));
  if (!raw.ok()) return raw.status();
  p.bytes = *std::move(raw);
  if (whole < hex.size()) p.odd_nibble = HexValue(hex.back());
  return p;
}

}  // namespace kcache
