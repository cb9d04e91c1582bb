// Tables, JSON, sizes, times and progress for `kcache` (see output.h).
#include "tools/kcache/output.h"

#include <algorithm>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "google/protobuf/util/json_util.h"

namespace kcache::tools {

void Table::Print(std::ostream& out) const {
  std::vector<size_t> w(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string cell = i < r.size() ? r[i] : "";
      const std::string pad(w[i] - cell.size(), ' ');
      bool right = i < right_.size() && right_[i];
      if (i > 0) s += "  ";
      s += right ? pad + cell : cell + (i + 1 < w.size() ? pad : "");
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    out << s << "\n";
  };
  line(header_);
  for (const auto& r : rows_) line(r);
}

namespace {

const std::set<std::string>& HexFields() {
  static const auto* s = new std::set<std::string>{"key",        "cubin_sha256", "quarantined_keys",
                                                   "key_prefix", "page_token",   "next_page_token"};
  return *s;
}

std::string Base64ToHex(const std::string& b64) {
  std::string raw;
  if (!absl::Base64Unescape(b64, &raw)) return b64;
  return ToHex(raw);
}

void PatchHex(nlohmann::json& j) {
  if (j.is_object()) {
    for (auto& [k, v] : j.items()) {
      if (HexFields().count(k)) {
        if (v.is_string()) v = Base64ToHex(v.get<std::string>());
        if (v.is_array()) {
          for (auto& e : v) {
            if (e.is_string()) e = Base64ToHex(e.get<std::string>());
          }
        }
      } else {
        PatchHex(v);
      }
    }
  } else if (j.is_array()) {
    for (auto& e : j) PatchHex(e);
  }
}

// Protobuf's JSON writes 64-bit integers as strings; scripts want numbers.
void Int64AsNumbers(const google::protobuf::Message& m, nlohmann::json& j) {
  using google::protobuf::FieldDescriptor;
  if (!j.is_object()) return;
  const auto* d = m.GetDescriptor();
  const auto* refl = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    auto it = j.find(f->name());
    if (it == j.end()) continue;
    auto convert = [&](nlohmann::json& v) {
      if (!v.is_string()) return;
      const std::string s = v.get<std::string>();
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
        v = static_cast<uint64_t>(std::stoull(s));
      } else {
        v = static_cast<int64_t>(std::stoll(s));
      }
    };
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT64 ||
        f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
      if (f->is_repeated()) {
        for (auto& v : *it) convert(v);
      } else {
        convert(*it);
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map()) {
      if (f->is_repeated()) {
        for (int k = 0; k < refl->FieldSize(m, f) && k < static_cast<int>(it->size()); ++k) {
          Int64AsNumbers(refl->GetRepeatedMessage(m, f, k), (*it)[k]);
        }
      } else if (refl->HasField(m, f)) {
        Int64AsNumbers(refl->GetMessage(m, f), *it);
      }
    }
  }
}

}  // namespace

nlohmann::json ProtoToJson(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  nlohmann::json j = nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
  Int64AsNumbers(m, j);
  PatchHex(j);
  return j;
}

std::string HumanBytes(uint64_t b) {
  if (b < 1024) return absl::StrCat(b, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b) / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, units[u]);
}

std::string FormatUnixMs(int64_t ms) {
  if (ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%SZ", absl::FromUnixMillis(ms), absl::UTCTimeZone());
}

std::string ShortKey(const std::string& key) { return KeyToHex(key).substr(0, 28); }

void Progress::Update(uint64_t done, const std::string& detail) {
  if (!tty_) return;
  constexpr int kWidth = 24;
  int filled = total_ == 0 ? kWidth : static_cast<int>(kWidth * done / total_);
  std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '-');
  std::string line = absl::StrCat(label_, " [", bar, "] ", done, "/", total_, "  ", detail);
  if (line.size() > 100) line.resize(100);
  err_ << "\r\033[K" << line << std::flush;
  drawn_ = true;
}

void Progress::Finish() {
  if (tty_ && drawn_) err_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

}  // namespace kcache::tools
