// kcached's configuration (issue 19): the YAML file with comments and units,
// the older JSON form, `--name value` flags, sizes and durations with units,
// --version. No daemon is started.
#include "service/config.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/units.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

std::string Write(const TempDir& dir, const std::string& name, const std::string& text) {
  std::string path = dir.Sub(name);
  std::ofstream(path) << text;
  return path;
}

std::string Message(const absl::Status& st) { return std::string(st.message()); }

TEST(Units, SizesAndDurations) {
  EXPECT_EQ(*ParseSize("1048576"), 1048576u);
  EXPECT_EQ(*ParseSize("512K"), 512u << 10);
  EXPECT_EQ(*ParseSize("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(*ParseSize("20G"), uint64_t{20} << 30);
  EXPECT_EQ(*ParseSize("20gb"), uint64_t{20} << 30);
  EXPECT_EQ(*ParseSize("1T"), uint64_t{1} << 40);
  EXPECT_FALSE(ParseSize("20X").ok());
  EXPECT_FALSE(ParseSize("-1G").ok());
  EXPECT_FALSE(ParseSize("99999999999T").ok());  // overflows

  const absl::Duration ms = absl::Milliseconds(1);
  EXPECT_EQ(*ParseDurationText("30000", ms), absl::Seconds(30));
  EXPECT_EQ(*ParseDurationText("500ms", ms), absl::Milliseconds(500));
  EXPECT_EQ(*ParseDurationText("30s", ms), absl::Seconds(30));
  EXPECT_EQ(*ParseDurationText("10m", ms), absl::Minutes(10));
  EXPECT_EQ(*ParseDurationText("1h30m", ms), absl::Minutes(90));
  EXPECT_EQ(*ParseDurationText("1d", ms), absl::Hours(24));
  EXPECT_EQ(*ParseDurationText("120", absl::Seconds(1)), absl::Minutes(2));
  EXPECT_FALSE(ParseDurationText("-5s", ms).ok());
  EXPECT_FALSE(ParseDurationText("soon", ms).ok());
  EXPECT_FALSE(ParseDurationText("5 parsecs", ms).ok());
}

TEST(DaemonConfig, FlagsTakeUnitsAndSpaceSeparatedValues) {
  auto c = ParseDaemonCommandLine({"--store_path", "/tmp/s", "--max_store_bytes", "20G",
                                   "--eviction_grace_ms=30m", "--default_deadline_ms", "500ms",
                                   "--compile_limit_cpu_seconds", "2m", "--compile_only",
                                   "--memory_cache_bytes=512MiB", "--log_level", "debug"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.store_path(), "/tmp/s");
  EXPECT_EQ(c->config.max_store_bytes(), uint64_t{20} << 30);
  EXPECT_EQ(c->config.eviction_grace_ms(), 30u * 60 * 1000);
  EXPECT_EQ(c->config.default_deadline_ms(), 500u);
  EXPECT_EQ(c->config.compile_limit_cpu_seconds(), 120u);
  EXPECT_TRUE(c->config.compile_only());
  EXPECT_EQ(c->config.memory_cache_bytes(), uint64_t{512} << 20);
  EXPECT_EQ(c->config.log_level(), "debug");

  // A bool flag alone is true and does not take the next flag as its value;
  // "--flag false" is read as a value.
  c = ParseDaemonCommandLine({"--compile_only", "--max_queue_depth", "7"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->config.compile_only());
  EXPECT_EQ(c->config.max_queue_depth(), 7u);
  c = ParseDaemonCommandLine({"--compile_only", "false"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->config.compile_only());
  // Plain numbers keep their old unit.
  c = ParseDaemonCommandLine({"--error_memo_ms=2500", "--max_store_bytes=1000"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.error_memo_ms(), 2500u);
  EXPECT_EQ(c->config.max_store_bytes(), 1000u);

  EXPECT_THAT(Message(ParseDaemonCommandLine({"--max_store_bytes", "lots"}).status()),
              HasSubstr("--max_store_bytes: 'lots' is not a valid size"));
  EXPECT_THAT(Message(ParseDaemonCommandLine({"--error_memo_ms", "10 parsecs"}).status()),
              HasSubstr("--error_memo_ms: '10 parsecs' is not a valid duration"));
  EXPECT_THAT(Message(ParseDaemonCommandLine({"--compile_limit_cpu_seconds", "1500ms"}).status()),
              HasSubstr("not whole seconds"));
  EXPECT_THAT(Message(ParseDaemonCommandLine({"--max_message_bytes", "8G"}).status()),
              HasSubstr("too large"));
  EXPECT_THAT(Message(ParseDaemonCommandLine({"--store_path"}).status()),
              HasSubstr("--store_path: needs a value"));
}

TEST(DaemonConfig, YamlFileWithCommentsAndUnitsThenFlagsWin) {
  TempDir dir;
  const std::string path = Write(dir, "kcached.yaml", R"(# a comment
store_path: /var/lib/kcache/store   # trailing comment
max_store_bytes: 20G
eviction_grace_ms: 1h
compile_only: true
log_level: warning
tcp_address:
)");
  auto c = ParseDaemonCommandLine({"--config", path, "--log_level=error"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.store_path(), "/var/lib/kcache/store");
  EXPECT_EQ(c->config.max_store_bytes(), uint64_t{20} << 30);
  EXPECT_EQ(c->config.eviction_grace_ms(), 3600u * 1000);
  EXPECT_TRUE(c->config.compile_only());
  EXPECT_EQ(c->config.log_level(), "error");     // the flag wins, wherever it stands
  EXPECT_EQ(c->config.tcp_address(), "");        // an empty value keeps the default
  EXPECT_EQ(c->config.max_queue_depth(), 256u);  // not in the file: the default
}

TEST(DaemonConfig, OlderJsonFilesReadTheSame) {
  TempDir dir;
  // As written before: protobuf's JSON mapping, 64-bit numbers quoted,
  // camelCase names accepted.
  const std::string path = Write(dir, "kcached.json", R"({
  "store_path": "/srv/store",
  "maxStoreBytes": "1073741824",
  "error_memo_ms": 2500,
  "compile_only": true
})");
  auto c = ParseDaemonCommandLine({"--config=" + path});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.store_path(), "/srv/store");
  EXPECT_EQ(c->config.max_store_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(c->config.error_memo_ms(), 2500u);
  EXPECT_TRUE(c->config.compile_only());
}

TEST(DaemonConfig, FileErrorsNameTheFileLineAndKey) {
  TempDir dir;
  auto unknown =
      ParseDaemonCommandLine({"--config", Write(dir, "a.yaml", "store_path: /s\nfrobnicate: 1\n")});
  EXPECT_THAT(Message(unknown.status()),
              MatchesRegex(".*a\\.yaml:2: unknown field 'frobnicate'.*"));
  auto bad =
      ParseDaemonCommandLine({"--config", Write(dir, "b.yaml", "\n\nmax_store_bytes: many\n")});
  EXPECT_THAT(Message(bad.status()),
              MatchesRegex(".*b\\.yaml:3: max_store_bytes: 'many' is not a valid size.*"));
  auto nested = ParseDaemonCommandLine({"--config", Write(dir, "c.yaml", "store_path: [a, b]\n")});
  EXPECT_THAT(Message(nested.status()), HasSubstr("store_path: expected a single value"));
  auto broken =
      ParseDaemonCommandLine({"--config", Write(dir, "d.yaml", "store_path: /s\n  - bad: [\n")});
  EXPECT_THAT(Message(broken.status()), HasSubstr("d.yaml:"));
  auto missing = ParseDaemonCommandLine({"--config", dir.Sub("nope.yaml")});
  EXPECT_THAT(Message(missing.status()), HasSubstr("cannot read"));
}

TEST(DaemonConfig, TheExampleFileParses) {
  auto c = ParseDaemonCommandLine({"--config", KCACHE_EXAMPLE_CONFIG});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.max_store_bytes(), uint64_t{20} << 30);
  EXPECT_EQ(c->config.compile_limit_cpu_seconds(), 120u);
  EXPECT_EQ(c->config.socket_path(), "/run/kcache/kcached.sock");
}

TEST(DaemonConfig, VersionAndHelp) {
  auto v = ParseDaemonCommandLine({"--version"});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->action, DaemonCommandLine::Action::kPrintVersion);
  EXPECT_THAT(
      DaemonVersion(),
      MatchesRegex("kcached [0-9]+\\.[0-9]+\\.[0-9]+\nbuild: .*CUDA headers [0-9]+\\.[0-9]+.*\n"));
  for (const char* flag : {"--help", "-h"}) {
    auto help = ParseDaemonCommandLine({"--store_path=/s", flag, "--frobnicate"});
    ASSERT_TRUE(help.ok()) << flag << ": " << help.status();
    EXPECT_EQ(help->action, DaemonCommandLine::Action::kPrintUsage) << flag;
  }
  // An error before it is still reported.
  EXPECT_THAT(ParseDaemonCommandLine({"--frobnicate", "--help"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DaemonUsage(), HasSubstr("--max_store_bytes (size: bytes, or 512K"));
  EXPECT_THAT(DaemonUsage(), HasSubstr("--error_memo_ms (duration: milliseconds, or 500ms"));
}

}  // namespace
}  // namespace kcache
