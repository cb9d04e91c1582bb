#include "service/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "compiler/cuda/compile.h"
#include "google/protobuf/descriptor.h"

namespace kcache {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

void SetRetryHint(grpc::ServerContextBase* context, int retry_after_ms) {
  context->AddTrailingMetadata("retry-after-ms", std::to_string(retry_after_ms));
}

grpc::Status Reply(grpc::ServerContextBase* context, const absl::Status& status) {
  constexpr int kRetryAfterMs = 500;
  if ((status.code() == absl::StatusCode::kResourceExhausted && !IsCompileLimitExceeded(status)) ||
      status.code() == absl::StatusCode::kUnavailable) {
    SetRetryHint(context, kRetryAfterMs);
  }
  return ToGrpcStatus(status);
}

namespace {

class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit MalformedRequestInterceptor(std::string input_type)
      : input_type_(std::move(input_type)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status st = methods->GetSendStatus();
      if (st.error_code() == grpc::StatusCode::INTERNAL && st.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("request: not a valid ", input_type_,
                         " (malformed protobuf, or a string field that is not UTF-8)")));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string input_type_;
};

class MalformedRequestInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // "/kcache.v1.AdminService/Stats" -> "kcache.v1.AdminService.Stats".
    std::string name(absl::StripPrefix(info->method(), "/"));
    absl::StrReplaceAll({{"/", "."}}, &name);
    const google::protobuf::MethodDescriptor* m =
        google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name);
    if (m == nullptr || m->service()->file()->package() != "kcache.v1") return nullptr;
    return new MalformedRequestInterceptor(m->input_type()->full_name());
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
MalformedRequestInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> v;
  v.push_back(std::make_unique<MalformedRequestInterceptorFactory>());
  return v;
}

}  // namespace kcache
