// The Prometheus registry's exposition format and the daemon's config flags.
#include "service/metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/config.h"

namespace kcache {
namespace {

using ::testing::HasSubstr;

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

TEST(DaemonConfig, FlagsOverrideDefaultsAndBadFlagsAreNamed) {
  auto c = ParseDaemonConfig({"--store_path=/tmp/s", "--max_queue_depth=7", "--compile_only"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store_path(), "/tmp/s");
  EXPECT_EQ(c->max_queue_depth(), 7u);
  EXPECT_TRUE(c->compile_only());
  EXPECT_EQ(c->socket_path(), ".kcache/kcached.sock");

  auto bad = ParseDaemonConfig({"--max_queue_depth=lots"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--max_queue_depth"));
  auto unknown = ParseDaemonConfig({"--frobnicate=1"});
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown flag --frobnicate"));
  auto zero = ParseDaemonConfig({"--max_queue_depth=0"});
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("max_queue_depth"));
  auto help = ParseDaemonConfig({"--help"});
  EXPECT_EQ(help.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(help.status().message()), HasSubstr("--store_path"));
}

}  // namespace
}  // namespace kcache
