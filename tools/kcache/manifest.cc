// Manifest parsing for `kcache warm` (see manifest.h). YAML nodes become
// protobuf JSON for compiler/attention/spec_json.h, so the manifest accepts
// exactly the field and enum names that the spec's JSON form does.
#include "tools/kcache/manifest.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compiler/attention/spec_json.h"

namespace kcache::tools {
namespace {

// Bounds on what a manifest may make us build: a YAML alias repeated inside
// aliases (an "alias bomb") expands exponentially when converted.
constexpr size_t kMaxManifestBytes = size_t{16} << 20;
constexpr size_t kMaxNodes = 1'000'000;
constexpr int kMaxDepth = 64;

// Thrown (and caught in ParseManifest) for input that does not fit.
struct ManifestError {
  std::string message;
};

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// A scalar's text: the node must be a scalar of valid UTF-8.
std::string Text(const YAML::Node& n, const std::string& where) {
  if (!n.IsScalar()) {
    throw ManifestError{absl::StrCat(where, ": expected a plain value, not a ",
                                     n.IsMap()        ? "mapping"
                                     : n.IsSequence() ? "list"
                                                      : "null")};
  }
  if (!ValidUtf8(n.Scalar())) throw ManifestError{absl::StrCat(where, ": not valid UTF-8")};
  return n.Scalar();
}

// YAML scalars are untyped; plain ones that read as booleans or numbers
// become JSON booleans and numbers, quoted ones stay strings. `budget`
// counts the nodes converted (aliases count each time they are expanded).
nlohmann::json ToJson(const YAML::Node& n, const std::string& where, size_t& budget,
                      int depth = 0) {
  if (budget == 0 || --budget == 0) {
    throw ManifestError{absl::StrCat(where, ": too large (more than ", kMaxNodes,
                                     " values once aliases are expanded)")};
  }
  if (depth > kMaxDepth) throw ManifestError{absl::StrCat(where, ": nested too deeply")};
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& kv : n) {
        std::string k = Text(kv.first, absl::StrCat(where, ": a key"));
        j[k] = ToJson(kv.second, absl::StrCat(where, ".", k), budget, depth + 1);
      }
      return j;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json j = nlohmann::json::array();
      size_t i = 0;
      for (const auto& v : n)
        j.push_back(ToJson(v, absl::StrCat(where, "[", i++, "]"), budget, depth + 1));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = Text(n, where);
      if (n.Tag() == "!") return s;  // quoted
      if (s == "true" || s == "True") return true;
      if (s == "false" || s == "False") return false;
      int64_t i = 0;
      if (absl::SimpleAtoi(s, &i)) return i;
      double d = 0;
      if (absl::SimpleAtod(s, &d) && s.find_first_of("0123456789") != std::string::npos) return d;
      return s;
    }
    default:
      return nullptr;
  }
}

absl::StatusOr<std::vector<std::string>> Archs(const YAML::Node& n, const std::string& where) {
  if (!n.IsSequence() || n.size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a non-empty list of architectures, e.g. [sm_80, sm_90a]"));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < n.size(); ++i) {
    const YAML::Node& a = n[i];
    if (!a.IsScalar() || !absl::StartsWith(a.Scalar(), "sm_") || a.Scalar().size() < 5 ||
        a.Scalar().size() > 32 ||
        a.Scalar().find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") !=
            std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "[", i, "]: not an architecture like sm_90a"));
    }
    out.push_back(a.Scalar());
  }
  return out;
}

}  // namespace

namespace {

absl::StatusOr<std::vector<WarmItem>> Parse(std::string_view text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", e.what()));
  }
  size_t budget = kMaxNodes;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError("manifest: expected a mapping with 'specs' (and 'archs')");
  }
  for (const auto& kv : root) {
    std::string k = Text(kv.first, "manifest: a top-level key");
    if (k != "archs" && k != "specs") {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest: unknown key '", k, "' (expected archs, specs)"));
    }
  }
  std::vector<std::string> default_archs;
  if (root["archs"]) {
    auto a = Archs(root["archs"], "archs");
    if (!a.ok()) return a.status();
    default_archs = *a;
  }
  const YAML::Node specs = root["specs"];
  if (!specs || !specs.IsSequence() || specs.size() == 0) {
    return absl::InvalidArgumentError("manifest: 'specs' must be a non-empty list");
  }
  std::vector<WarmItem> out;
  std::set<std::string> names;
  for (size_t i = 0; i < specs.size(); ++i) {
    const YAML::Node e = specs[i];
    std::string where = absl::StrCat("specs[", i, "]");
    if (!e.IsMap()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected a mapping"));
    std::optional<std::string> given_name;
    if (e["name"]) {
      given_name = Text(e["name"], absl::StrCat(where, ".name"));
      absl::StrAppend(&where, " (", *given_name, ")");
    }
    for (const auto& kv : e) {
      std::string k = Text(kv.first, absl::StrCat(where, ": a key"));
      if (k != "name" && k != "archs" && k != "spec") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown key '", k, "' (expected name, archs, spec)"));
      }
    }
    if (!e["spec"] || !e["spec"].IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'spec' (a mapping) is missing"));
    }
    auto spec = attention::ParseSpecJson(ToJson(e["spec"], where + ".spec", budget).dump());
    if (!spec.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", spec.status().message()));
    }
    std::vector<std::string> archs = default_archs;
    if (e["archs"]) {
      auto a = Archs(e["archs"], absl::StrCat(where, ".archs"));
      if (!a.ok()) return a.status();
      archs = *a;
    }
    if (archs.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no archs (give 'archs' here or at the top)"));
    }
    std::string name = given_name ? *given_name : attention::DescribeSpec(*spec);
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name '", name, "' is used twice (names must be unique)"));
    }
    for (const std::string& arch : archs) out.push_back({name, *spec, arch});
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<WarmItem>> ParseManifest(std::string_view text) {
  if (text.size() > kMaxManifestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest: larger than ", kMaxManifestBytes, " bytes"));
  }
  // Every way a hostile manifest can fail ends here as InvalidArgument:
  // yaml-cpp and nlohmann::json report bad input by throwing.
  try {
    return Parse(text);
  } catch (const ManifestError& e) {
    return absl::InvalidArgumentError(e.message);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", e.what()));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::InvalidArgumentError("manifest: too large to hold in memory");
  }
}

absl::StatusOr<std::vector<WarmItem>> LoadManifest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("manifest ", path, ": cannot read it"));
  // Bounded read: /dev/zero or a huge file is refused, not loaded.
  std::string text(kMaxManifestBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxManifestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": larger than ", kMaxManifestBytes, " bytes, not a manifest"));
  }
  auto r = ParseManifest(text);
  if (!r.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", r.status().message()));
  }
  return r;
}

}  // namespace kcache::tools
