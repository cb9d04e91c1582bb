// For the raw-kernel tests: the committed fixtures (tests/fixtures/raw; the
// test target defines KCACHE_RAW_FIXTURES as that directory) and the kcached
// flags that turn raw kernels on behind an admin token.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kcache::testing {

// The bytes of fixture `name`; a test failure (and "") when it cannot be read.
inline std::string RawFixture(const std::string& name) {
  std::ifstream in(std::string(KCACHE_RAW_FIXTURES) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `token` to `dir`/admin.token and returns the flags that enable raw
// kernels with that file as the admin token.
inline std::vector<std::string> RawKernelFlags(const std::string& dir, const std::string& token) {
  const std::string token_path = dir + "/admin.token";
  std::ofstream(token_path) << token << "\n";
  return {"--enable_raw_kernels=true", "--admin_token_path=" + token_path};
}

}  // namespace kcache::testing
