// KernelService request parsing (service/request_parse.h): budgets checked
// on the wire bytes before the parse, malformed bytes and unknown fields
// refused with INVALID_ARGUMENT naming the limit or the field; the admin
// token check (service/admin_token.h).
#include "service/request_parse.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "service/admin_token.h"
#include "tests/cache/test_util.h"
#include "tests/common/distinct_spec.h"

namespace kcache {
namespace {

using ::kcache::testing::DistinctSpec;
using ::kcache::testing::StatusIs;
using ::testing::HasSubstr;

v1::GetKernelRequest Valid() {
  v1::GetKernelRequest r;
  *r.mutable_spec() = DistinctSpec(0);
  r.mutable_target()->set_arch("sm_80");
  return r;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(RequestParse, AValidRequestParsesToItself) {
  const v1::GetKernelRequest r = Valid();
  auto parsed = ParseGetKernelRequest(r.SerializeAsString(), RequestLimits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->SerializeAsString(), r.SerializeAsString());
  v1::PrefetchRequest p;
  for (int i = 0; i < 3; ++i) *p.add_requests() = r;
  auto pre = ParsePrefetchRequest(p.SerializeAsString(), RequestLimits());
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_EQ(pre->requests_size(), 3);
}

// Issue 17, item 7: gRPC's own parse answered INTERNAL with no message.
TEST(RequestParse, MalformedBytesAreInvalidArgumentWithAMessage) {
  for (const std::string& bytes : {std::string("\xff\xff\xff"), std::string("\x0a\x05\x01", 3),
                                   std::string("\x12\x02\x0a\x05", 4)}) {
    auto r = ParseGetKernelRequest(bytes, RequestLimits());
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(Message(r.status()), HasSubstr("not a valid kcache.v1.GetKernelRequest"));
    // (The last is a well-formed unknown field of a PrefetchRequest.)
    auto p = ParsePrefetchRequest(bytes, RequestLimits());
    EXPECT_THAT(p, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_FALSE(Message(p.status()).empty());
  }
  EXPECT_THAT(Message(ParsePrefetchRequest("\xff\xff", RequestLimits()).status()),
              HasSubstr("not a valid kcache.v1.PrefetchRequest"));
  // target.arch that is not UTF-8.
  std::string bytes = "\x12\x03\x0a\x01\xff";
  EXPECT_THAT(ParseGetKernelRequest(bytes, RequestLimits()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Issue 17, item 4: 10 MB of empty Prefetch entries took the daemon to
// 1.26 GB. The count is refused before anything is parsed.
TEST(RequestParse, TooManyPrefetchEntriesAreRefusedNamingTheLimit) {
  std::string bytes;
  for (int i = 0; i < 5000; ++i) bytes += std::string("\x0a\x00", 2);  // requests {}
  RequestLimits limits;
  limits.max_prefetch_requests = 1024;
  absl::Status s = CheckPrefetchRequestBudget(bytes, limits);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Message(s), HasSubstr("more than 1024 entries (max_prefetch_requests)"));
  EXPECT_THAT(ParsePrefetchRequest(bytes, limits), StatusIs(absl::StatusCode::kInvalidArgument));
  limits.max_prefetch_requests = 5000;
  EXPECT_TRUE(ParsePrefetchRequest(bytes, limits).ok());
}

// Two bytes on the wire (an empty submessage) become an object of a hundred
// bytes or more: fields are counted, not only bytes.
TEST(RequestParse, FieldsAreCountedBeforeTheParse) {
  v1::GetKernelRequest r = Valid();
  for (int i = 0; i < 70000; ++i) r.mutable_spec()->add_buffers();
  const std::string bytes = r.SerializeAsString();
  ASSERT_LT(bytes.size(), 200000u);
  absl::Status s = CheckGetKernelRequestBudget(bytes, RequestLimits());
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Message(s), HasSubstr("more than 65536 fields"));

  v1::PrefetchRequest p;
  *p.add_requests() = Valid();
  *p.add_requests() = r;
  s = CheckPrefetchRequestBudget(p.SerializeAsString(), RequestLimits());
  EXPECT_THAT(Message(s), HasSubstr("requests[1]: more than 65536 fields"));

  // Within each entry's budget, but not the whole Prefetch's.
  v1::GetKernelRequest mid = Valid();
  for (int i = 0; i < 60000; ++i) mid.mutable_spec()->add_buffers();
  v1::PrefetchRequest many;
  for (int i = 0; i < 5; ++i) *many.add_requests() = mid;
  s = CheckPrefetchRequestBudget(many.SerializeAsString(), RequestLimits());
  EXPECT_THAT(Message(s), HasSubstr("fields in all"));

  // A real request is far within a small budget.
  RequestLimits small;
  small.max_request_fields = 100;
  EXPECT_TRUE(CheckGetKernelRequestBudget(Valid().SerializeAsString(), small).ok());
}

TEST(RequestParse, OversizedRequestIsRefusedNamingTheLimit) {
  v1::GetKernelRequest r = Valid();
  r.mutable_spec()->add_buffers()->set_name(std::string(5000, 'a'));
  RequestLimits limits;
  limits.max_request_bytes = 4096;
  auto s = ParseGetKernelRequest(r.SerializeAsString(), limits);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Message(s.status()), HasSubstr("over this daemon's limit of 4096 bytes"));
  v1::PrefetchRequest p;
  *p.add_requests() = r;
  EXPECT_THAT(Message(CheckPrefetchRequestBudget(p.SerializeAsString(), limits)),
              HasSubstr("requests[0]: "));
}

// Issue 17, item 10: unknown fields were refused inside `spec` but ignored
// at the request's top level and in `target`.
TEST(RequestParse, UnknownFieldsOutsideTheSpecAreRefusedNamingWhere) {
  v1::GetKernelRequest top = Valid();
  top.GetReflection()->MutableUnknownFields(&top)->AddVarint(99, 1);
  auto s = ParseGetKernelRequest(top.SerializeAsString(), RequestLimits());
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Message(s.status()), HasSubstr("request: unknown field number 99"));

  v1::GetKernelRequest target = Valid();
  target.mutable_target()
      ->GetReflection()
      ->MutableUnknownFields(target.mutable_target())
      ->AddLengthDelimited(7, "x");
  s = ParseGetKernelRequest(target.SerializeAsString(), RequestLimits());
  EXPECT_THAT(Message(s.status()), HasSubstr("target: unknown field number 7"));

  v1::GetKernelRequest raw;
  raw.mutable_raw()->set_source("x");
  raw.mutable_raw()->GetReflection()->MutableUnknownFields(raw.mutable_raw())->AddVarint(12, 3);
  s = ParseGetKernelRequest(raw.SerializeAsString(), RequestLimits());
  EXPECT_THAT(Message(s.status()), HasSubstr("raw: unknown field number 12"));

  v1::PrefetchRequest p;
  *p.add_requests() = Valid();
  *p.add_requests() = target;
  auto ps = ParsePrefetchRequest(p.SerializeAsString(), RequestLimits());
  EXPECT_THAT(ps, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Message(ps.status()), HasSubstr("requests[1].target: unknown field number 7"));
  v1::PrefetchRequest ptop;
  ptop.GetReflection()->MutableUnknownFields(&ptop)->AddVarint(5, 1);
  EXPECT_THAT(Message(ParsePrefetchRequest(ptop.SerializeAsString(), RequestLimits()).status()),
              HasSubstr("request: unknown field number 5"));
}

TEST(BearerToken, MatchesExactlyTheBearerValue) {
  EXPECT_TRUE(BearerTokenMatches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cretX", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3creT", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches(std::string("Bearer s3cret\0", 14), "s3cret"));
}

TEST(AdminToken, IsReadFromTheCallsAuthorizationMetadata) {
  std::multimap<grpc::string_ref, grpc::string_ref> md;
  EXPECT_FALSE(CarriesAdminToken(md, "s3cret"));
  md.emplace("x-other", "Bearer s3cret");
  EXPECT_FALSE(CarriesAdminToken(md, "s3cret"));
  md.emplace("authorization", "Bearer wrong");
  EXPECT_FALSE(CarriesAdminToken(md, "s3cret"));
  std::multimap<grpc::string_ref, grpc::string_ref> good;
  good.emplace("authorization", "Bearer s3cret");
  EXPECT_TRUE(CarriesAdminToken(good, "s3cret"));
}

}  // namespace
}  // namespace kcache
