// What every gRPC service of one daemon shares about serving: whether
// shutdown has begun. Owned by the daemon, read by the services.
#pragma once

#include <atomic>

namespace kcache {

struct ServingState {
  // Set once shutdown begins: new requests are answered UNAVAILABLE.
  std::atomic<bool> shutting_down{false};
};

}  // namespace kcache
