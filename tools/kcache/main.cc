// kcache: the ops command line (see tools/kcache/cli.h).
#include <unistd.h>

#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "tools/kcache/cli.h"

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // `kcache ls | head` must not kill us mid-RPC
  return kcache::tools::RunKcache(std::vector<std::string>(argv + 1, argv + argc),
                                  {std::cout, std::cerr, isatty(STDERR_FILENO) == 1});
}
