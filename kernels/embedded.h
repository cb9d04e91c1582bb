// The kernel templates under kernels/, embedded into the binary at build time
// (kernels/embed.cmake), and their digest. Code generation hands these to
// NVRTC as named headers; the digest is part of every kernel key, so a change
// to any template gives new keys. Immutable data; thread-safe.
#pragma once

#include <span>
#include <string_view>

namespace kcache::kernels {

struct TemplateFile {
  std::string_view name;  // file name, as used in #include "name"
  std::string_view contents;
};

// Every template file, sorted by name.
std::span<const TemplateFile> TemplateFiles();

// Hex SHA-256 over each file's name and SHA-256, in order.
std::string_view TemplateDigestHex();

}  // namespace kcache::kernels
