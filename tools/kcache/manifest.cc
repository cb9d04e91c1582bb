// Manifest parsing for `kcache warm` (see manifest.h). YAML nodes become
// protobuf JSON for compiler/attention/spec_json.h, so the manifest accepts
// exactly the field and enum names that the spec's JSON form does.
#include "tools/kcache/manifest.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compiler/attention/spec_json.h"

namespace kcache::tools {
namespace {

// YAML scalars are untyped; plain ones that read as booleans or numbers
// become JSON booleans and numbers, quoted ones stay strings.
nlohmann::json ToJson(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& kv : n) j[kv.first.as<std::string>()] = ToJson(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& v : n) j.push_back(ToJson(v));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
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
    if (!a.IsScalar() || a.Scalar().rfind("sm_", 0) != 0 || a.Scalar().size() < 5) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "[", i, "]: not an architecture like sm_90a"));
    }
    out.push_back(a.Scalar());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<WarmItem>> ParseManifest(std::string_view text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError("manifest: expected a mapping with 'specs' (and 'archs')");
  }
  for (const auto& kv : root) {
    std::string k = kv.first.as<std::string>();
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
    if (e["name"]) absl::StrAppend(&where, " (", e["name"].as<std::string>(), ")");
    for (const auto& kv : e) {
      std::string k = kv.first.as<std::string>();
      if (k != "name" && k != "archs" && k != "spec") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown key '", k, "' (expected name, archs, spec)"));
      }
    }
    if (!e["spec"] || !e["spec"].IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'spec' (a mapping) is missing"));
    }
    auto spec = attention::ParseSpecJson(ToJson(e["spec"]).dump());
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
    std::string name = e["name"] ? e["name"].as<std::string>() : attention::DescribeSpec(*spec);
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name '", name, "' is used twice (names must be unique)"));
    }
    for (const std::string& arch : archs) out.push_back({name, *spec, arch});
  }
  return out;
}

absl::StatusOr<std::vector<WarmItem>> LoadManifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("manifest ", path, ": cannot read it"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = ParseManifest(ss.str());
  if (!r.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", r.status().message()));
  }
  return r;
}

}  // namespace kcache::tools
