// How `kcache status` and `kcache stats` show a daemon's shared remote tier
// (issue 16). Pure functions over the Stats answer; thread-safe.
#pragma once

#include <ostream>
#include <string>

#include "kcache/v1/service.pb.h"

namespace kcache::tools {

// One line for `kcache status`: "redis://h:6379  connected, 12 hits, ..."
// or "redis://h:6379  DOWN (why), running alone; ...".
std::string RemoteStatusLine(const v1::RemoteTierStats& r);

// The tier's counters, aligned like the rest of `kcache stats`.
void PrintRemoteStats(std::ostream& o, const v1::RemoteTierStats& r);

}  // namespace kcache::tools
