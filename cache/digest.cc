#include "cache/digest.h"

#include <openssl/evp.h>

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kcache {

struct Sha256Hasher::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256Hasher::Sha256Hasher() : impl_(new Impl) {
  impl_->ctx = EVP_MD_CTX_new();
  // Allocation failure in OpenSSL is not recoverable here.
  if (impl_->ctx == nullptr || EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1) {
    std::abort();
  }
}

Sha256Hasher::~Sha256Hasher() {
  EVP_MD_CTX_free(impl_->ctx);
  delete impl_;
}

void Sha256Hasher::Update(std::string_view data) {
  EVP_DigestUpdate(impl_->ctx, data.data(), data.size());
}

void Sha256Hasher::UpdateField(std::string_view data) {
  uint8_t len[8];
  uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  EVP_DigestUpdate(impl_->ctx, len, sizeof(len));
  Update(data);
}

Sha256Digest Sha256Hasher::Finish() {
  Sha256Digest out{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(impl_->ctx, out.data(), &n);
  return out;
}

Sha256Digest Sha256(std::string_view data) {
  Sha256Digest out{};
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), out.data(), &n, EVP_sha256(), nullptr);
  return out;
}

std::string ToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.resize(bytes.size() * 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto b = static_cast<uint8_t>(bytes[i]);
    out[2 * i] = kDigits[b >> 4];
    out[2 * i + 1] = kDigits[b & 15];
  }
  return out;
}

absl::StatusOr<std::string> FromHex(std::string_view hex) {
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hex string has odd length ", hex.size()));
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("not a hex digit at offset ", hi < 0 ? 2 * i : 2 * i + 1));
    }
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace kcache
