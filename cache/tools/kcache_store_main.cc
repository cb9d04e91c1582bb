// kcache-store: inspect and maintain a kcache store directory (see store_cli.h).
#include <iostream>
#include <string>
#include <vector>

#include "cache/tools/store_cli.h"

int main(int argc, char** argv) {
  return kcache::RunStoreCli(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
