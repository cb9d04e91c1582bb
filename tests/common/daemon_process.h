// A real kcached in a child process, for end-to-end tests: KcachedProcess
// with gtest assertions. Started on a temporary store and socket, stopped
// with SIGTERM or SIGKILL, restarted on the same store.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"
#include "tests/common/kcached_process.h"

namespace kcache::testing {

class DaemonProcess : public KcachedProcess {
 public:
  // `dir` holds the store, the socket and the daemon's log.
  explicit DaemonProcess(const std::string& dir, std::vector<std::string> extra_args = {})
      : KcachedProcess({.store_path = dir + "/store",
                        .socket_path = dir + "/kcached.sock",
                        .log_path = dir + "/kcached.log",
                        .extra_args = std::move(extra_args)}) {}
  explicit DaemonProcess(KcachedOptions options) : KcachedProcess(std::move(options)) {}

  // Starts kcached and waits until it accepts connections; a fatal failure
  // (with the daemon's log) if it does not.
  void Start() {
    absl::Status st = TryStart();
    ASSERT_TRUE(st.ok()) << st;
  }

  v1::StatsResponse Stats() {
    auto stub = v1::AdminService::NewStub(
        grpc::CreateChannel(target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::StatsResponse resp;
    grpc::Status st = stub->Stats(&ctx, v1::StatsRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }
};

}  // namespace kcache::testing
