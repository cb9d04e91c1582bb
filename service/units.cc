#include "service/units.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace kcache {

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  std::string s = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(std::string(text)));
  if (absl::EndsWith(s, "IB")) {
    s.resize(s.size() - 2);
  } else if (s.size() > 1 && absl::EndsWith(s, "B")) {
    s.resize(s.size() - 1);
  }
  int shift = 0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift != 0) s.pop_back();
  }
  uint64_t n = 0;
  if (s.empty() || !absl::SimpleAtoi(s, &n) || (shift != 0 && n > (UINT64_MAX >> shift))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a size (bytes, or with a unit: 512K, 64M, 20G, 1T, 512MiB)"));
  }
  return n << shift;
}

absl::StatusOr<absl::Duration> ParseDurationText(absl::string_view text,
                                                 absl::Duration plain_unit) {
  const std::string s(absl::StripAsciiWhitespace(std::string(text)));
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a duration (with a unit: 500ms, 30s, 10m, 2h, 1d, 1h30m)"));
  };
  uint64_t n = 0;
  if (absl::SimpleAtoi(s, &n)) return plain_unit * static_cast<int64_t>(n);
  if (s.empty() || s[0] == '-' || s[0] == '+') return bad();
  // absl::ParseDuration knows ns, us, ms, s, m, h; days are spelled out
  // here ("1d" -> "24h", "1d12h" -> "24h12h").
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != 'd') {
      t.push_back(s[i]);
      continue;
    }
    size_t j = t.size();
    while (j > 0 && (absl::ascii_isdigit(t[j - 1]) || t[j - 1] == '.')) --j;
    double days = 0;
    if (j == t.size() || !absl::SimpleAtod(t.substr(j), &days)) return bad();
    t.resize(j);
    absl::StrAppend(&t, days * 24, "h");
  }
  absl::Duration d;
  if (!absl::ParseDuration(t, &d) || d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return bad();
  }
  return d;
}

}  // namespace kcache
