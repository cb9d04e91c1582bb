// gMock matchers on absl::Status and absl::StatusOr<T>: match the status
// code (StatusIs), not merely "not OK", so that a test fails when a call
// fails for another reason than the one it checks (CONVENTIONS.md, 9).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

namespace kcache::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// EXPECT_THAT(store->Pin(key, ""), StatusIs(absl::StatusCode::kNotFound));
MATCHER_P(StatusIs, code, absl::StrCat("has status code ", absl::StatusCodeToString(code))) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code;
}
MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.ok();
}

}  // namespace kcache::testing

#define KC_ASSERT_OK(expr) ASSERT_THAT((expr), ::kcache::testing::IsOk())
#define KC_EXPECT_OK(expr) EXPECT_THAT((expr), ::kcache::testing::IsOk())
