// Flag parsing and value parsers for `kcache` (see args.h).
#include "tools/kcache/args.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kcache::tools {

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& argv,
                                     const std::vector<FlagSpec>& known) {
  ParsedArgs out;
  bool flags_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (flags_done || a.size() < 2 || a[0] != '-' || a == "-") {
      out.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    std::string name, value;
    bool has_value = false;
    if (a == "-h") {
      name = "help";
    } else if (!absl::StartsWith(a, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", a, "'"));
    } else {
      size_t eq = a.find('=');
      name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
        has_value = true;
      }
    }
    auto spec =
        std::find_if(known.begin(), known.end(), [&](const FlagSpec& f) { return f.name == name; });
    if (spec == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (spec->takes_value && !has_value) {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (", spec->value, ")"));
      }
      value = argv[++i];
    } else if (!spec->takes_value && has_value) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
    }
    if (!out.flags.emplace(name, value).second) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " given twice"));
    }
  }
  return out;
}

namespace {

// "30d" -> 30 days; false when `text` is not a number with a unit.
bool ParseUnitDuration(const std::string& text, absl::Duration* out) {
  if (text.size() < 2) return false;
  char unit = text.back();
  int64_t n = 0;
  if (!absl::SimpleAtoi(text.substr(0, text.size() - 1), &n) || n < 0) return false;
  switch (unit) {
    case 's':
      *out = absl::Seconds(n);
      return true;
    case 'm':
      *out = absl::Minutes(n);
      return true;
    case 'h':
      *out = absl::Hours(n);
      return true;
    case 'd':
      *out = absl::Hours(n) * 24;  // saturates, as the others do
      return true;
    case 'w':
      *out = absl::Hours(n) * 24 * 7;
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<absl::Time> ParseWhen(const std::string& text, absl::Time now) {
  if (text.empty()) return absl::InvalidArgumentError("empty time");
  if (text[0] == '@') {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(text.substr(1), &ms) || ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "': @ must be followed by Unix milliseconds"));
    }
    return absl::FromUnixMillis(ms);
  }
  absl::Duration ago;
  if (ParseUnitDuration(text, &ago)) return now - ago;
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &err)) return t;
  if (absl::ParseTime("%Y-%m-%d", text, absl::UTCTimeZone(), &t, &err)) return t;
  return absl::InvalidArgumentError(absl::StrCat(
      "'", text, "' is not a time (use 2026-11-30, 2026-11-30T12:00:00Z, 30d, 12h or @UNIX_MS)"));
}

absl::StatusOr<uint64_t> ParseBytes(const std::string& text) {
  std::string s = absl::AsciiStrToUpper(text);
  if (absl::EndsWith(s, "IB")) {
    s.resize(s.size() - 2);
  } else if (s.size() > 1 && absl::EndsWith(s, "B")) {
    s.resize(s.size() - 1);
  }
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
        mult = uint64_t{1} << 10;
        break;
      case 'M':
        mult = uint64_t{1} << 20;
        break;
      case 'G':
        mult = uint64_t{1} << 30;
        break;
      case 'T':
        mult = uint64_t{1} << 40;
        break;
      default:
        break;
    }
    if (mult != 1) s.pop_back();
  }
  uint64_t n = 0;
  if (s.empty() || !absl::SimpleAtoi(s, &n) || (n != 0 && UINT64_MAX / n < mult)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a size (use e.g. 1048576, 512M, 10G)"));
  }
  return n * mult;
}

absl::StatusOr<absl::Duration> ParseDurationArg(const std::string& text) {
  absl::Duration d;
  int64_t secs = 0;
  if (absl::SimpleAtoi(text, &secs) && secs >= 0) return absl::Seconds(secs);
  if (ParseUnitDuration(text, &d)) return d;
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a duration (use e.g. 30s, 10m, 2h, 1d)"));
}

}  // namespace kcache::tools
