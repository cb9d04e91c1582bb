// The kcache-store command line (stats, ls, verify, export, import, gc) as a
// library function, so that tests drive it without a process. Small on
// purpose: the full ops CLI talks to the daemon and comes later.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kcache {

// Runs one command. `args` excludes the program name. Writes results to
// `out` and one-line errors ("kcache-store: ...") to `err`. Returns the exit
// status: 0 success, 1 the operation failed, 2 bad arguments.
int RunStoreCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kcache
