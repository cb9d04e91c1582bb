#include "service/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace kcache {

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              Handler metrics) {
  std::pair<std::string, std::string> hp = absl::StrSplit(address, absl::MaxSplits(':', 1));
  int port = 0;
  if (hp.second.empty() || !absl::SimpleAtoi(hp.second, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address: '", address, "' is not host:port"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string host = hp.first.empty() ? "0.0.0.0" : hp.first;
  if (int rc = getaddrinfo(host.c_str(), hp.second.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    int err = errno;
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ", std::strerror(err)));
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int actual =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  // The pipe stops the serving thread; without it the thread could not be
  // joined, so its failure is a start-up error.
  int stop_pipe[2];
  if (pipe2(stop_pipe, O_CLOEXEC) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("metrics: pipe2: ", std::strerror(err)));
  }
  return std::unique_ptr<HttpServer>(new HttpServer(fd, actual, stop_pipe, std::move(metrics)));
}

HttpServer::HttpServer(int fd, int port, const int stop_pipe[2], Handler metrics)
    : listen_fd_(fd),
      port_(port),
      stop_pipe_{stop_pipe[0], stop_pipe[1]},
      metrics_(std::move(metrics)) {
  thread_ = std::thread([this] { Loop(); });
}

HttpServer::~HttpServer() {
  char c = 0;
  (void)!write(stop_pipe_[1], &c, 1);
  thread_.join();
  close(listen_fd_);
  close(stop_pipe_[0]);
  close(stop_pipe_[1]);
}

void HttpServer::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (fds[0].revents & POLLIN) {
      int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        Serve(c);
        close(c);
      }
    }
  }
}

void HttpServer::Serve(int client) {
  std::string req;
  char buf[1024];
  absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (!absl::StrContains(req, "\r\n\r\n") && req.size() < 8192) {
    int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{client, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) return;
    ssize_t n = read(client, buf, sizeof(buf));
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  std::string status = "200 OK", body, type = "text/plain; version=0.0.4";
  // HEAD is GET without the body (RFC 9110 9.3.2): probes and load
  // balancers use it to see that the endpoint is there.
  const bool head = absl::StartsWith(req, "HEAD ");
  const size_t from = head ? 5 : 4;  // the request has at least "\r\n\r\n"
  std::string target = req.substr(from, req.find_first_of(" \r\n", from) - from);
  target = target.substr(0, target.find('?'));  // a scraper's query string
  const bool get = head || absl::StartsWith(req, "GET ");
  if (get && target == "/metrics") {
    body = metrics_();
  } else if (get && target == "/healthz") {
    body = "ok\n";
  } else {
    status = "404 Not Found";
    body = "not found\n";
    type = "text/plain";
  }
  std::string resp = absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                                  "\r\nContent-Length: ", body.size(),
                                  "\r\nConnection: close\r\n\r\n", head ? "" : body);
  // Same deadline for the answer: a scraper that stops reading must not
  // hold the serving thread (and so shutdown). MSG_NOSIGNAL: no SIGPIPE.
  size_t off = 0;
  while (off < resp.size()) {
    int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{client, POLLOUT, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) return;
    ssize_t n = send(client, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace kcache
