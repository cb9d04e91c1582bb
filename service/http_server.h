// A minimal HTTP/1.0 server for the Prometheus scrape endpoint (GET
// /metrics) and a liveness probe (GET /healthz). One thread; each request is
// read, answered and closed. Not a general web server: requests are capped
// at 8 KiB and 2 s.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace kcache {

class HttpServer {
 public:
  using Handler = std::function<std::string()>;  // body of GET /metrics

  // Binds "host:port" (port 0 picks one). Starts serving at once.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           Handler metrics);
  ~HttpServer();  // stops and joins
  int port() const { return port_; }

 private:
  HttpServer(int fd, int port, const int stop_pipe[2], Handler metrics);
  void Loop();
  void Serve(int client);

  int listen_fd_;
  int port_;
  int stop_pipe_[2];
  Handler metrics_;
  std::thread thread_;
};

}  // namespace kcache
