// The entries the crash helper publishes, shared with the crash test so that
// both sides agree on each entry's bytes.
#pragma once

#include <string>

#include "cache/key.h"
#include "kcache/v1/record.pb.h"

namespace kcache::crashtest {

inline v1::Toolchain Toolchain() {
  v1::Toolchain t;
  t.set_compiler("nvrtc");
  t.set_version("13.0");
  t.set_build("crash-test");
  return t;
}

inline v1::KernelRecord Record(long n) {
  v1::KernelRecord r;
  const v1::Toolchain t = Toolchain();
  const std::string spec = "crash-spec-" + std::to_string(n);
  const std::string digest(64, 'a');
  r.set_key(*ComputeKey(KeyParts{spec, digest, &t, "sm_90a"}));
  *r.mutable_toolchain() = t;
  r.set_arch("sm_90a");
  r.set_template_digest(digest);
  return r;
}

// Sizes vary from a few bytes to ~300 KB; every 5th entry shares the cubin of
// the entry before it (deduplicated blob).
inline std::string Cubin(long n) {
  const long m = n % 5 == 4 ? n - 1 : n;
  const size_t size = 16 + static_cast<size_t>((m * 7919) % 300'000);
  std::string s(size, '\0');
  uint64_t x = static_cast<uint64_t>(m) * 0x9e3779b97f4a7c15ULL + 7;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x);
  }
  return s;
}

}  // namespace kcache::crashtest
