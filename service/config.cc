#include "service/config.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "service/logging.h"

namespace kcache {

namespace pb = google::protobuf;

v1::DaemonConfig DefaultDaemonConfig() {
  v1::DaemonConfig c;
  c.set_store_path(".kcache/store");
  c.set_memory_cache_bytes(256ull << 20);
  c.set_eviction_grace_ms(3600 * 1000);
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

absl::Status SetField(v1::DaemonConfig& c, const std::string& name, const std::string& value) {
  const pb::Descriptor* d = c.GetDescriptor();
  const pb::FieldDescriptor* f = d->FindFieldByName(name);
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
  }
  const pb::Reflection* r = c.GetReflection();
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", value, "' is not a valid ", f->type_name()));
  };
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_STRING:
      r->SetString(&c, f, value);
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v;
      if (!absl::SimpleAtoi(value, &v)) return bad();
      r->SetUInt32(&c, f, v);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v;
      if (!absl::SimpleAtoi(value, &v)) return bad();
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
      return absl::InternalError(absl::StrCat("flag --", name, " has an unsupported type"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DaemonUsage() {
  std::string u =
      "usage: kcached [--config=FILE.json] [--FIELD=VALUE ...]\n"
      "Every field of kcache.v1.DaemonConfig (proto/kcache/v1/daemon_config.proto) is a flag:\n";
  const pb::Descriptor* d = v1::DaemonConfig::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    absl::StrAppend(&u, "  --", d->field(i)->name(), " (", d->field(i)->type_name(), ")\n");
  }
  return u;
}

absl::StatusOr<v1::DaemonConfig> ParseDaemonConfig(const std::vector<std::string>& args) {
  v1::DaemonConfig c = DefaultDaemonConfig();
  std::vector<std::pair<std::string, std::string>> flags;
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") return absl::CancelledError(DaemonUsage());
    if (!absl::StartsWith(a, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "' (see --help)"));
    }
    std::string body = a.substr(2);
    size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : body.substr(eq + 1);
    if (name == "config") {
      std::ifstream in(value);
      if (!in) return absl::InvalidArgumentError(absl::StrCat("--config: cannot read '", value, "'"));
      std::stringstream ss;
      ss << in.rdbuf();
      v1::DaemonConfig file;
      auto st = pb::util::JsonStringToMessage(ss.str(), &file);
      if (!st.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--config: ", value, ": ", st.message().as_string()));
      }
      c.MergeFrom(file);  // set fields of the file override the defaults
    } else {
      flags.emplace_back(name, value);
    }
  }
  for (const auto& [name, value] : flags) {
    if (absl::Status st = SetField(c, name, value); !st.ok()) return st;
  }
  if (absl::Status st = ValidateDaemonConfig(c); !st.ok()) return st;
  return c;
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
