#include "service/config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "service/build_info.h"
#include "service/logging.h"
#include "service/units.h"

namespace kcache {

namespace pb = google::protobuf;

v1::DaemonConfig DefaultDaemonConfig() {
  v1::DaemonConfig c;
  c.set_store_path(".kcache/store");
  c.set_memory_cache_bytes(256ull << 20);
  c.set_eviction_grace_ms(absl::ToInt64Milliseconds(absl::Hours(1)));
  c.set_stats_flush_ms(1000);
  c.set_socket_path(".kcache/kcached.sock");
  c.set_max_queue_depth(256);
  c.set_error_memo_ms(10000);
  c.set_default_deadline_ms(600000);
  c.set_max_message_bytes(64u << 20);
  c.set_max_expr_nodes(256);
  c.set_max_expr_depth(32);
  c.set_shutdown_grace_ms(30000);
  c.set_eviction_interval_ms(60000);
  c.set_max_raw_source_bytes(16u << 20);
  c.set_max_raw_kernel_names(64);
  c.set_max_prefetch_requests(1024);
  c.set_remote_timeout_ms(250);
  c.set_remote_lease_ms(10000);
  c.set_compile_limit_address_space_bytes(uint64_t{4} << 30);
  c.set_compile_limit_cpu_seconds(120);
  c.set_compile_limit_output_bytes(uint64_t{256} << 20);
  c.set_log_level("info");
  return c;
}

namespace {

// How a field's text is read: by the suffix of its name.
enum class Unit { kNone, kBytes, kMilliseconds, kSeconds };
Unit UnitOf(const pb::FieldDescriptor* f) {
  if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_UINT32 &&
      f->cpp_type() != pb::FieldDescriptor::CPPTYPE_UINT64) {
    return Unit::kNone;
  }
  if (absl::EndsWith(f->name(), "_bytes")) return Unit::kBytes;
  if (absl::EndsWith(f->name(), "_ms")) return Unit::kMilliseconds;
  if (absl::EndsWith(f->name(), "_seconds")) return Unit::kSeconds;
  return Unit::kNone;
}

const char* UnitHelp(Unit u) {
  switch (u) {
    case Unit::kBytes:
      return "size: bytes, or 512K, 64M, 20G, 512MiB";
    case Unit::kMilliseconds:
      return "duration: milliseconds, or 500ms, 30s, 10m, 2h, 1d";
    case Unit::kSeconds:
      return "duration: seconds, or 90s, 10m, 2h";
    case Unit::kNone:
      break;
  }
  return nullptr;
}

// A DaemonConfig field by its name, or by its JSON name (camelCase, which
// protobuf's JSON mapping also accepts in the older JSON files).
const pb::FieldDescriptor* FindField(const std::string& name) {
  const pb::Descriptor* d = v1::DaemonConfig::descriptor();
  const pb::FieldDescriptor* f = d->FindFieldByName(name);
  return f != nullptr ? f : d->FindFieldByCamelcaseName(name);
}

// Sets field `f` from `value`; `where` names it in messages ("--store_path",
// "kcached.yaml:3: store_path").
absl::Status SetField(v1::DaemonConfig& c, const pb::FieldDescriptor* f, const std::string& value,
                      const std::string& where) {
  const pb::Reflection* r = c.GetReflection();
  const Unit unit = UnitOf(f);
  auto bad = [&](absl::string_view why = "") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": '", value, "' is not a valid ",
                     unit == Unit::kNone ? f->type_name() : UnitHelp(unit), why.empty() ? "" : " (",
                     why, why.empty() ? "" : ")"));
  };
  uint64_t number = 0;
  if (unit == Unit::kBytes) {
    auto n = ParseSize(value);
    if (!n.ok()) return bad();
    number = *n;
  } else if (unit == Unit::kMilliseconds || unit == Unit::kSeconds) {
    const absl::Duration base = unit == Unit::kSeconds ? absl::Seconds(1) : absl::Milliseconds(1);
    auto d = ParseDurationText(value, base);
    if (!d.ok()) return bad();
    absl::Duration rest;
    const int64_t n = absl::IDivDuration(*d, base, &rest);
    if (rest != absl::ZeroDuration()) {
      return bad(unit == Unit::kSeconds ? "not whole seconds" : "not whole milliseconds");
    }
    number = static_cast<uint64_t>(n);
  }
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_STRING:
      r->SetString(&c, f, value);
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v;
      if (unit != Unit::kNone) {
        if (number > UINT32_MAX) return bad("too large");
        v = static_cast<uint32_t>(number);
      } else if (!absl::SimpleAtoi(value, &v)) {
        return bad();
      }
      r->SetUInt32(&c, f, v);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v = number;
      if (unit == Unit::kNone && !absl::SimpleAtoi(value, &v)) return bad();
      r->SetUInt64(&c, f, v);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      bool v;
      if (value.empty()) {
        v = true;
      } else if (!absl::SimpleAtob(value, &v)) {
        return bad();
      }
      r->SetBool(&c, f, v);
      break;
    }
    default:
      return absl::InternalError(absl::StrCat(where, ": field has an unsupported type"));
  }
  return absl::OkStatus();
}

// A YAML node's position for messages: "FILE:LINE".
std::string At(const std::string& path, const YAML::Node& n) {
  return absl::StrCat(path, ":", n.Mark().line + 1);
}

// Reads a configuration file: a YAML mapping of DaemonConfig fields (JSON,
// the older form, is YAML too). Comments, units ("20G", "30s") and the
// protobuf JSON mapping's quoted numbers are all accepted.
absl::Status MergeConfigFile(v1::DaemonConfig& c, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--config: cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(ss.str());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config: ", path, ":", e.mark.line + 1, ": ", e.msg));
  }
  if (root.IsNull()) return absl::OkStatus();  // empty, or only comments
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config: ", At(path, root), ": expected a mapping of field: value"));
  }
  for (const auto& kv : root) {
    if (!kv.first.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config: ", At(path, kv.first), ": expected a field name"));
    }
    const std::string name = kv.first.Scalar();
    const pb::FieldDescriptor* f = FindField(name);
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--config: ", At(path, kv.first),
                                                     ": unknown field '", name, "' (see --help)"));
    }
    if (kv.second.IsNull()) continue;  // "field:" with no value keeps the default
    if (!kv.second.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config: ", At(path, kv.second), ": ", name, ": expected a single value"));
    }
    if (absl::Status st =
            SetField(c, f, kv.second.Scalar(), absl::StrCat(At(path, kv.second), ": ", name));
        !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--config: ", st.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DaemonUsage() {
  std::string u =
      "usage: kcached [--config FILE.yaml] [--FIELD VALUE | --FIELD=VALUE ...] [--version]\n"
      "Every field of kcache.v1.DaemonConfig (proto/kcache/v1/daemon_config.proto) is a flag\n"
      "and a key of the YAML configuration file (flags win over the file). Sizes take units\n"
      "(512M, 20G, 512MiB), durations too (500ms, 30s, 10m, 2h, 1d); plain numbers are bytes,\n"
      "and milliseconds or seconds as the field's name says. A bool flag alone means true.\n";
  const pb::Descriptor* d = v1::DaemonConfig::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    const char* unit = UnitHelp(UnitOf(f));
    absl::StrAppend(&u, "  --", f->name(), " (", unit != nullptr ? unit : f->type_name(), ")\n");
  }
  absl::StrAppend(&u, "  --log_level: ", kLogLevels, "\n");
  return u;
}

std::string DaemonVersion() {
  return absl::StrCat("kcached ", KCACHE_VERSION_STRING, "\n", "build: ", KCACHE_BUILD_INFO, "\n");
}

absl::StatusOr<DaemonCommandLine> ParseDaemonCommandLine(const std::vector<std::string>& args) {
  DaemonCommandLine out;
  v1::DaemonConfig& c = out.config;
  c = DefaultDaemonConfig();
  std::vector<std::pair<const pb::FieldDescriptor*, std::string>> flags;
  std::vector<std::string> config_files;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h" || a == "--version") {
      out.action = a == "--version" ? DaemonCommandLine::Action::kPrintVersion
                                    : DaemonCommandLine::Action::kPrintUsage;
      return out;
    }
    if (!absl::StartsWith(a, "--") || a.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "' (see --help)"));
    }
    const std::string body = a.substr(2);
    const size_t eq = body.find('=');
    const std::string name = body.substr(0, eq);
    std::optional<std::string> value;
    if (eq != std::string::npos) value = body.substr(eq + 1);
    const pb::FieldDescriptor* f = name == "config" ? nullptr : FindField(name);
    if (name != "config" && f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    const bool is_bool = f != nullptr && f->cpp_type() == pb::FieldDescriptor::CPPTYPE_BOOL;
    if (!value.has_value()) {
      // "--name value": the next argument, unless it is a flag. A bool flag
      // alone is true; "--name true|false" is read too.
      const bool next_is_value = i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--");
      bool next_is_bool = false;
      if (next_is_value && is_bool) {
        bool ignored;
        next_is_bool = absl::SimpleAtob(args[i + 1], &ignored);
      }
      if (next_is_value && (!is_bool || next_is_bool)) {
        value = args[++i];
      } else if (!is_bool) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": needs a value"));
      } else {
        value = "";
      }
    }
    if (name == "config") {
      config_files.push_back(*value);
    } else {
      flags.emplace_back(f, *value);
    }
  }
  // The file first, whatever its place among the flags: flags win.
  for (const std::string& path : config_files) {
    if (absl::Status st = MergeConfigFile(c, path); !st.ok()) return st;
  }
  for (const auto& [f, value] : flags) {
    if (absl::Status st = SetField(c, f, value, absl::StrCat("--", f->name())); !st.ok()) return st;
  }
  if (absl::Status st = ValidateDaemonConfig(c); !st.ok()) return st;
  return out;
}

absl::Status ValidateDaemonConfig(const v1::DaemonConfig& c) {
  if (c.store_path().empty()) return absl::InvalidArgumentError("store_path: must not be empty");
  if (absl::Status st = ValidateLogLevel(c.log_level()); !st.ok()) return st;
  if (c.socket_path().empty() && c.tcp_address().empty()) {
    return absl::InvalidArgumentError("socket_path and tcp_address: at least one must be set");
  }
  if (c.socket_path().size() >= 100) {
    return absl::InvalidArgumentError("socket_path: longer than a Unix socket path may be (<100)");
  }
  if (!c.tcp_address().empty() && (c.tls_cert_path().empty() != c.tls_key_path().empty())) {
    return absl::InvalidArgumentError("tls_cert_path and tls_key_path: set both or neither");
  }
  if (c.max_queue_depth() == 0) return absl::InvalidArgumentError("max_queue_depth: must be > 0");
  if (c.max_store_bytes() > 0 && c.eviction_interval_ms() == 0) {
    return absl::InvalidArgumentError("eviction_interval_ms: must be > 0 with max_store_bytes");
  }
  if (c.enable_raw_kernels() && c.admin_token_path().empty()) {
    return absl::InvalidArgumentError(
        "enable_raw_kernels: needs admin_token_path (raw kernels are code: admin-token only)");
  }
  if (c.enable_raw_kernels() && (c.max_raw_source_bytes() == 0 || c.max_raw_kernel_names() == 0)) {
    return absl::InvalidArgumentError("max_raw_source_bytes and max_raw_kernel_names: must be > 0");
  }
  if (c.max_prefetch_requests() == 0) {
    return absl::InvalidArgumentError("max_prefetch_requests: must be > 0");
  }
  if (!c.remote().empty() && !absl::StartsWith(c.remote(), "redis://")) {
    return absl::InvalidArgumentError("remote: expected redis://HOST:PORT[/DB]");
  }
  if (c.remote().empty() && !c.remote_password_file().empty()) {
    return absl::InvalidArgumentError("remote_password_file: set remote too");
  }
  if (c.max_message_bytes() < 4096 || c.max_message_bytes() > (1u << 30)) {
    return absl::InvalidArgumentError("max_message_bytes: must be between 4096 and 1 GiB");
  }
  return absl::OkStatus();
}

std::string DaemonConfigToJson(const v1::DaemonConfig& c) {
  std::string out;
  pb::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  (void)pb::util::MessageToJsonString(c, &out, opts);
  return out;
}

}  // namespace kcache
