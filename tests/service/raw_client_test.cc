// kcache::Client's raw-kernel path (FetchRaw / LoadRaw, ClientOptions'
// admin token) against a real kcached in compile-only mode: the committed
// fixtures (PTX, LLVM IR, bitcode) come back as cubins with one entry point
// per kernel name, memoized per request; the daemon's refusals reach the
// caller with their codes and say what to do (no token, wrong token, raw
// kernels disabled, malformed IR with the verifier's message). Loading needs
// a GPU: here LoadRaw must fail cleanly before any RPC.
#include <fstream>

#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_process.h"
#include "tests/common/raw_fixtures.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::RawFixture;
using ::kcache::testing::RawKernelFlags;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kToken[] = "raw-client-token";

v1::RawKernel Raw(v1::RawKernel::Format format, const std::string& file,
                  const std::vector<std::string>& names) {
  v1::RawKernel r;
  r.set_format(format);
  r.set_source(RawFixture(file));
  for (const std::string& n : names) r.add_kernel_names(n);
  return r;
}

v1::Target Arch(const std::string& arch) {
  v1::Target t;
  t.set_arch(arch);
  return t;
}

// A daemon with raw kernels on; the token file is `dir`/admin.token.
std::unique_ptr<DaemonProcess> RawDaemon(const TempDir& dir) {
  return std::make_unique<DaemonProcess>(dir.path(), RawKernelFlags(dir.path(), kToken));
}

std::unique_ptr<Client> NewClient(const DaemonProcess& d, const std::string& token = kToken,
                                  const std::string& token_path = "") {
  ClientOptions o;
  o.target = d.target();
  o.admin_token = token;
  o.admin_token_path = token_path;
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

TEST(RawClient, FetchRawReturnsCubinsWithOneEntryPerNameMemoized) {
  TempDir dir;
  auto d = RawDaemon(dir);
  ASSERT_NO_FATAL_FAILURE(d->Start());
  // The token from the daemon's own file (trailing newline stripped).
  auto client = NewClient(*d, "", dir.path() + "/admin.token");
  ASSERT_NE(client, nullptr);
  struct Case {
    v1::RawKernel::Format format;
    std::string file;
    std::vector<std::string> names;
  };
  const std::vector<Case> cases = {
      {v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"}},
      {v1::RawKernel::FORMAT_LLVM_IR, "vadd.ll", {"kc_vadd"}},
      {v1::RawKernel::FORMAT_LLVM_BITCODE, "vadd.bc", {"kc_vadd"}},
      {v1::RawKernel::FORMAT_LLVM_IR, "block_sum.ll", {"kc_block_sum", "kc_scale"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    auto r = client->FetchRaw(Raw(c.format, c.file, c.names), Arch("sm_80"));
    ASSERT_TRUE(r.ok()) << r.status() << "\n" << ReadFileOrEmpty(d->log_path());
    const v1::KernelRecord& rec = (*r)->record();
    EXPECT_FALSE((*r)->cache_hit());
    EXPECT_EQ(rec.arch(), "sm_80");
    EXPECT_EQ(rec.raw().format(), c.format);
    EXPECT_EQ((*r)->cubin().substr(0, 4),
              "\x7f"
              "ELF");
    EXPECT_EQ(rec.cubin_size(), (*r)->cubin().size());
    ASSERT_EQ(rec.entry_points_size(), static_cast<int>(c.names.size()));
    for (size_t i = 0; i < c.names.size(); ++i) {
      EXPECT_EQ(rec.entry_points(static_cast<int>(i)).name(), c.names[i]);
    }
  }
  // The same request again: memoized, no RPC, the same response object.
  const uint64_t rpcs = client->rpc_count();
  auto first = client->FetchRaw(Raw(cases[0].format, cases[0].file, cases[0].names), Arch("sm_80"));
  auto again = client->FetchRaw(Raw(cases[0].format, cases[0].file, cases[0].names), Arch("sm_80"));
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(client->rpc_count(), rpcs);
  EXPECT_EQ(first->get(), again->get());
  // Another client (its token given inline) gets the daemon's cached entry.
  auto other = NewClient(*d);
  auto hit = other->FetchRaw(Raw(cases[0].format, cases[0].file, cases[0].names), Arch("sm_80"));
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_TRUE((*hit)->cache_hit());
  EXPECT_EQ((*hit)->record().key(), (*first)->record().key());
  EXPECT_EQ(d->Stats().compiles(), cases.size());
}

TEST(RawClient, NoTokenOrAWrongTokenIsPermissionDeniedAndSaysWhichOptionToSet) {
  TempDir dir;
  auto d = RawDaemon(dir);
  ASSERT_NO_FATAL_FAILURE(d->Start());
  const v1::RawKernel raw = Raw(v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"});

  auto none = NewClient(*d, "");
  auto r = none->FetchRaw(raw, Arch("sm_80"));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("admin token"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("ClientOptions.admin_token"));
  // Refusals are not memoized: each call asks again.
  EXPECT_THAT(none->FetchRaw(raw, Arch("sm_80")), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(none->rpc_count(), 2u);

  auto wrong = NewClient(*d, "not-the-token");
  r = wrong->FetchRaw(raw, Arch("sm_80"));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("refused this client's admin token"));
  EXPECT_EQ(d->Stats().compiles(), 0u);
}

TEST(RawClient, RawKernelsDisabledIsFailedPreconditionNamingTheFlag) {
  TempDir dir;
  DaemonProcess d(dir.path());  // raw kernels off (the default)
  ASSERT_NO_FATAL_FAILURE(d.Start());
  auto client = NewClient(d);
  auto r =
      client->FetchRaw(Raw(v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"}), Arch("sm_80"));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("disabled"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--enable_raw_kernels"));
}

TEST(RawClient, MalformedIrIsInvalidArgumentWithTheVerifierMessage) {
  TempDir dir;
  auto d = RawDaemon(dir);
  ASSERT_NO_FATAL_FAILURE(d->Start());
  auto client = NewClient(*d);
  auto bad = client->FetchRaw(
      Raw(v1::RawKernel::FORMAT_LLVM_IR, "malformed_verifier.ll", {"kc_bad"}), Arch("sm_90a"));
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("verifier"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("does not dominate all uses"));
  auto missing =
      client->FetchRaw(Raw(v1::RawKernel::FORMAT_LLVM_IR, "vadd.ll", {"kc_nope"}), Arch("sm_80"));
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("raw.kernel_names[0]"));
}

TEST(RawClient, AdminTokenOptionsAreChecked) {
  TempDir dir;
  ClientOptions both;
  both.admin_token = "t";
  both.admin_token_path = dir.path() + "/t";
  EXPECT_THAT(Client::Create(both), StatusIs(absl::StatusCode::kInvalidArgument));
  ClientOptions missing;
  missing.admin_token_path = dir.path() + "/no-such-file";
  auto c = Client::Create(missing);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("ClientOptions.admin_token_path"));
  std::ofstream(dir.path() + "/empty") << "  \n";
  ClientOptions empty;
  empty.admin_token_path = dir.path() + "/empty";
  EXPECT_THAT(Client::Create(empty), StatusIs(absl::StatusCode::kInvalidArgument));
}

// No GPU here: LoadRaw fails before asking the daemon (no driver, or no
// current context on a machine with a driver).
TEST(RawClient, LoadRawWithoutAContextFailsBeforeAnyRpc) {
  TempDir dir;
  auto d = RawDaemon(dir);
  ASSERT_NO_FATAL_FAILURE(d->Start());
  auto client = NewClient(*d);
  auto r = client->LoadRaw(Raw(v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"}));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsUnavailable(r.status()) || absl::IsFailedPrecondition(r.status()))
      << r.status();
  EXPECT_EQ(client->rpc_count(), 0u);
}

}  // namespace
}  // namespace kcache
