// Stand-in cubin bytes for the store tests and the store benchmark: no gtest
// here, so that the benchmark can include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

namespace kcache::testing {

// Deterministic pseudo-random bytes, compressible like real code (runs of
// repeated 16-byte words) so that zstd has work to do.
inline std::string MakeCubin(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + 1);
  std::string out;
  out.reserve(size + 16);
  while (out.size() < size) {
    uint64_t a = rng(), b = rng();
    int repeat = static_cast<int>(rng() % 4) + 1;
    for (int i = 0; i < repeat; ++i) {
      out.append(reinterpret_cast<const char*>(&a), 8);
      out.append(reinterpret_cast<const char*>(&b), 8);
    }
  }
  out.resize(size);
  return out;
}

}  // namespace kcache::testing
