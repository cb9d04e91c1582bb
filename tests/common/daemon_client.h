// What end-to-end tests that talk to a DaemonProcess through the C++ client
// share: a client on the daemon's socket and an sm_80 compile target (the
// compile-only daemons of CI have no GPU).
#pragma once

#include <memory>

#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/common/daemon_process.h"

namespace kcache::testing {

inline v1::Target Sm80() {
  v1::Target t;
  t.set_arch("sm_80");
  return t;
}

inline std::unique_ptr<Client> NewClient(const DaemonProcess& d) {
  ClientOptions o;
  o.target = d.target();
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

}  // namespace kcache::testing
