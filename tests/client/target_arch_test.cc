// The device -> target rule of the C++ client and the daemon
// (client/target_arch.h) against target_arch_table.txt, the table that
// test_target_arch.py checks the Python client's rule against: the rule
// cannot change in one place without a test failing.
#include "client/target_arch.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace kcache {
namespace {

TEST(TargetArch, MatchesTheTableThePythonClientIsCheckedAgainst) {
  std::ifstream in(KCACHE_TARGET_ARCH_TABLE);
  ASSERT_TRUE(in) << "cannot read " << KCACHE_TARGET_ARCH_TABLE;
  int rows = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int major = 0, minor = 0;
    std::string arch;
    ASSERT_TRUE(fields >> major >> minor >> arch) << "malformed row: " << line;
    EXPECT_EQ(TargetArchForCapability(major, minor), arch) << "row: " << line;
    ++rows;
  }
  EXPECT_GE(rows, 5);  // the table was read, not skipped
}

}  // namespace
}  // namespace kcache
