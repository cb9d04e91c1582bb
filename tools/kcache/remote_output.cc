#include "tools/kcache/remote_output.h"

#include "absl/strings/str_cat.h"
#include "tools/kcache/output.h"

namespace kcache::tools {

std::string RemoteStatusLine(const v1::RemoteTierStats& r) {
  std::string state = r.connected() ? std::string("connected")
                                    : absl::StrCat("DOWN (", r.last_error(), "), running alone");
  return absl::StrCat(r.address(), "  ", state, "; ", r.hits(), " hits, ", r.misses(), " misses, ",
                      r.publishes(), " published, ", r.lease_waits(), " lease waits, ",
                      r.takeovers(), " takeovers, ", r.errors(), " errors, ", r.bad_entries(),
                      " bad entries refused");
}

void PrintRemoteStats(std::ostream& o, const v1::RemoteTierStats& r) {
  o << "remote            " << r.address() << (r.connected() ? " (connected)" : " (DOWN)") << "\n"
    << "  hits            " << r.hits() << "\n"
    << "  misses          " << r.misses() << "\n"
    << "  published       " << r.publishes() << "\n"
    << "  leases taken    " << r.leases() << "\n"
    << "  lease waits     " << r.lease_waits() << "\n"
    << "  takeovers       " << r.takeovers() << "\n"
    << "  wait timeouts   " << r.wait_timeouts() << "\n"
    << "  errors          " << r.errors() << "\n"
    << "  bad entries     " << r.bad_entries() << "\n"
    << "  bytes read      " << HumanBytes(r.bytes_read()) << "\n"
    << "  bytes written   " << HumanBytes(r.bytes_written()) << "\n"
    << "  reconnects      " << r.reconnects() << "\n";
  if (!r.connected() && !r.last_error().empty())
    o << "  last error      " << r.last_error() << "\n";
}

}  // namespace kcache::tools
