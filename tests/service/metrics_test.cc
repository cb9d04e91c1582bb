// The Prometheus registry's exposition format and the daemon's config flags.
#include "service/metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/config.h"

namespace kcache {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Metrics, RendersCountersHistogramsAndGauges) {
  MetricsRegistry m;
  m.GetCounter("kcache_hits_total", "Hits")->Inc(3);
  Histogram* h = m.GetHistogram("kcache_compile_seconds", "Compile time", {1, 2});
  h->Observe(0.5);
  h->Observe(1.5);
  h->Observe(9);
  m.AddGauge("kcache_queue_depth", "Depth", [] {
    return std::vector<std::pair<std::string, double>>{{"queue=\"gpu0\"", 2}};
  });
  std::string text = m.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE kcache_hits_total counter\nkcache_hits_total 3\n"));
  EXPECT_THAT(text, HasSubstr("kcache_compile_seconds_bucket{le=\"1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kcache_compile_seconds_bucket{le=\"2\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("kcache_compile_seconds_bucket{le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("kcache_compile_seconds_count 3\n"));
  EXPECT_THAT(text, HasSubstr("kcache_compile_seconds_sum 11\n"));
  EXPECT_THAT(text, HasSubstr("kcache_queue_depth{queue=\"gpu0\"} 2\n"));
}

// Bucket bounds and values print in their shortest exact form (Prometheus
// reads `le="0.10000000000000001"` as another bucket than `le="0.1"`).
TEST(Metrics, NumbersPrintCleanly) {
  MetricsRegistry m;
  Histogram* h =
      m.GetHistogram("kcache_x_seconds", "X", {0.0005, 0.1, 0.25, 2.5, 600}, "outcome=\"hit\"");
  h->Observe(0.3);
  m.AddGauge("kcache_g", "G", [] {
    return std::vector<std::pair<std::string, double>>{{"", 0.1}, {"k=\"b\"", 1e-7}};
  });
  m.AddCounterFunc("kcache_c_total", "C", [] {
    return std::vector<std::pair<std::string, double>>{{"kind=\"a\"", 12}};
  });
  std::string text = m.Render();
  EXPECT_THAT(text, HasSubstr("kcache_x_seconds_bucket{outcome=\"hit\",le=\"0.0005\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("kcache_x_seconds_bucket{outcome=\"hit\",le=\"0.1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("kcache_x_seconds_bucket{outcome=\"hit\",le=\"2.5\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kcache_x_seconds_bucket{outcome=\"hit\",le=\"600\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kcache_x_seconds_sum{outcome=\"hit\"} 0.3\n"));
  EXPECT_THAT(text, HasSubstr("kcache_g 0.1\n"));
  EXPECT_THAT(text, HasSubstr("kcache_g{k=\"b\"} 1e-07\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE kcache_c_total counter\nkcache_c_total{kind=\"a\"} 12\n"));
  EXPECT_THAT(text, Not(HasSubstr("0000000")));
}

TEST(DaemonConfig, FlagsOverrideDefaultsAndBadFlagsAreNamed) {
  auto c = ParseDaemonCommandLine({"--store_path=/tmp/s", "--max_queue_depth=7", "--compile_only"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.store_path(), "/tmp/s");
  EXPECT_EQ(c->config.max_queue_depth(), 7u);
  EXPECT_TRUE(c->config.compile_only());
  EXPECT_EQ(c->config.socket_path(), ".kcache/kcached.sock");

  auto bad = ParseDaemonCommandLine({"--max_queue_depth=lots"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--max_queue_depth"));
  auto unknown = ParseDaemonCommandLine({"--frobnicate=1"});
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown flag --frobnicate"));
  auto zero = ParseDaemonCommandLine({"--max_queue_depth=0"});
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("max_queue_depth"));
  auto huge = ParseDaemonCommandLine({"--max_message_bytes=4000000000"});
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("max_message_bytes"));
  auto help = ParseDaemonCommandLine({"--help"});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_EQ(help->action, DaemonCommandLine::Action::kPrintUsage);
  EXPECT_THAT(DaemonUsage(), HasSubstr("--store_path"));
}

}  // namespace
}  // namespace kcache

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "service/http_server.h"

namespace kcache {
namespace {

std::string HttpGet(int port, const std::string& path, const std::string& method = "GET") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  std::string req = method + " " + path + " HTTP/1.0\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  return resp;
}

TEST(HttpServer, ServesMetricsAndHealthAndRefusesTheRest) {
  auto server = HttpServer::Start("127.0.0.1:0", [] { return std::string("kcache_up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  int port = (*server)->port();
  ASSERT_GT(port, 0);
  std::string m = HttpGet(port, "/metrics");
  EXPECT_THAT(m, HasSubstr("200 OK"));
  EXPECT_THAT(m, HasSubstr("\r\n\r\nkcache_up 1\n"));
  EXPECT_THAT(HttpGet(port, "/healthz"), HasSubstr("200 OK"));
  EXPECT_THAT(HttpGet(port, "/secrets"), HasSubstr("404"));
  // HEAD: the same status and headers, no body.
  std::string head = HttpGet(port, "/metrics", "HEAD");
  EXPECT_THAT(head, HasSubstr("HTTP/1.0 200 OK\r\n"));
  EXPECT_THAT(head, HasSubstr("Content-Length: 12\r\n"));
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n");
  EXPECT_THAT(HttpGet(port, "/healthz", "HEAD"), HasSubstr("200 OK"));
  EXPECT_THAT(HttpGet(port, "/metrics?x=1"), HasSubstr("\r\n\r\nkcache_up 1\n"));
  EXPECT_THAT(HttpGet(port, "/metricsfoo"), HasSubstr("404"));
  EXPECT_THAT(HttpGet(port, "/metrics", "POST"), HasSubstr("404"));
  // A client that connects and sends nothing is dropped after 2 s; the
  // server still answers the next one.
  int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("kcache_up 1"));
  close(idle);
}

TEST(HttpServer, BadAddressIsNamed) {
  auto server = HttpServer::Start("localhost", [] { return std::string(); });
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("metrics_address"));
}

}  // namespace
}  // namespace kcache
