#include "service/logging.h"

#include <glog/logging.h>

#include <ctime>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/key.h"

namespace kcache {

namespace {

// "2026-12-02T09:31:07.412Z INFO kernel_backend.cc:170] ": UTC, so that the
// lines of nodes in different zones sort together.
void Prefix(std::ostream& s, const google::LogMessageInfo& l, void*) {
  std::tm tm{};
  const std::time_t t = l.time.timestamp();
  gmtime_r(&t, &tm);
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(l.time.usec() / 1000));
  s << buf << ' ' << l.severity << ' ' << l.filename << ':' << l.line_number << "]";
}

}  // namespace

absl::Status ValidateLogLevel(absl::string_view level) {
  const std::string l = absl::AsciiStrToLower(level);
  if (l.empty() || l == "debug" || l == "info" || l == "warning" || l == "error") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("log_level: '", level, "' is not one of ", kLogLevels));
}

void InitDaemonLogging(const char* argv0) {
  static std::once_flag once;
  std::call_once(once, [argv0] {
    FLAGS_logtostderr = true;  // no log files: stderr is the journal
    FLAGS_colorlogtostderr = false;
    google::InitGoogleLogging(argv0, &Prefix, nullptr);
  });
}

absl::Status SetLogLevel(absl::string_view level) {
  if (absl::Status st = ValidateLogLevel(level); !st.ok()) return st;
  const std::string l = absl::AsciiStrToLower(level);
  FLAGS_v = l == "debug" ? 1 : 0;
  FLAGS_minloglevel = l == "warning" ? google::GLOG_WARNING
                      : l == "error" ? google::GLOG_ERROR
                                     : google::GLOG_INFO;
  return absl::OkStatus();
}

std::string KeyPrefix(std::string_view key) { return KeyToHex(key).substr(0, 28); }

std::string LogSeconds(absl::Duration d) {
  return absl::StrFormat("%.3fs", absl::ToDoubleSeconds(d));
}

std::string LogQuote(absl::string_view message) {
  absl::string_view first = message.substr(0, message.find('\n'));
  const bool cut = first.size() > 300 || first.size() < message.size();
  first = first.substr(0, 300);
  std::string out = "\"";
  for (char c : first) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c == '\r' || c == '\t' ? ' ' : c);
  }
  if (cut) out += "...";
  out.push_back('"');
  return out;
}

}  // namespace kcache
