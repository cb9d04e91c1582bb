// End-to-end tests of raw kernels (GetKernelRequest.raw: LLVM IR, bitcode,
// PTX) through a real kcached in compile-only mode: committed fixtures
// compile to cubins for sm_80 and sm_90a in the daemon's compile workers;
// the path is off by default and admin-token only; malformed IR and
// oversized input are refused; an input that makes LLVM abort costs that
// compile and the daemon answers the next request.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "compiler/llvm/cubin_elf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kcache/v1/service.grpc.pb.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_process.h"
#include "tests/common/raw_fixtures.h"
#include "tools/kcache/cli.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::RawFixture;
using ::kcache::testing::RawKernelFlags;
using ::kcache::testing::ReadFileOrEmpty;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kToken[] = "raw-e2e-token";

v1::GetKernelRequest RawRequest(v1::RawKernel::Format format, const std::string& file,
                                const std::vector<std::string>& names, const std::string& arch) {
  v1::GetKernelRequest r;
  r.mutable_raw()->set_format(format);
  r.mutable_raw()->set_source(RawFixture(file));
  for (const std::string& n : names) r.mutable_raw()->add_kernel_names(n);
  r.mutable_target()->set_arch(arch);
  return r;
}

// Starts a daemon with raw kernels on (token file in `dir`), plus `extra`.
std::unique_ptr<DaemonProcess> RawDaemon(const TempDir& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = RawKernelFlags(dir.path(), kToken);
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<DaemonProcess>(dir.path(), args);
}

struct Call {
  grpc::Status status;
  v1::GetKernelResponse response;
};

std::string KeyToHexForTest(const std::string& key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : key) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

Call Get(const DaemonProcess& d, const v1::GetKernelRequest& req,
         const std::string& token = kToken) {
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(d.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  Call c;
  c.status = stub->GetKernel(&ctx, req, &c.response);
  return c;
}

TEST(RawE2E, FixturesCompileForSm80AndSm90aThenHit) {
  TempDir dir;
  auto d = RawDaemon(dir);
  ASSERT_NO_FATAL_FAILURE(d->Start());
  struct Case {
    v1::RawKernel::Format format;
    std::string file;
    std::vector<std::string> names;
  };
  const std::vector<Case> cases = {
      {v1::RawKernel::FORMAT_LLVM_IR, "vadd.ll", {"kc_vadd"}},
      {v1::RawKernel::FORMAT_LLVM_BITCODE, "vadd.bc", {"kc_vadd"}},
      {v1::RawKernel::FORMAT_LLVM_IR, "block_sum.ll", {"kc_block_sum", "kc_scale"}},
      {v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"}},
  };
  std::set<std::string> keys;
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.file + " " + arch);
      Call call = Get(*d, RawRequest(c.format, c.file, c.names, arch));
      ASSERT_TRUE(call.status.ok()) << call.status.error_message() << "\n"
                                    << ReadFileOrEmpty(d->log_path());
      const v1::KernelRecord& rec = call.response.record();
      EXPECT_FALSE(call.response.cache_hit());
      EXPECT_EQ(rec.arch(), arch);
      EXPECT_EQ(rec.toolchain().compiler(), "llvm-nvptx+nvjitlink");
      EXPECT_THAT(rec.toolchain().version(), HasSubstr("llvm 22."));
      EXPECT_THAT(rec.toolchain().version(), HasSubstr("nvjitlink 13."));
      EXPECT_EQ(rec.raw().format(), c.format);
      EXPECT_EQ(rec.raw().source_size(), RawFixture(c.file).size());
      ASSERT_EQ(rec.entry_points_size(), static_cast<int>(c.names.size()));
      for (size_t i = 0; i < c.names.size(); ++i) {
        EXPECT_EQ(rec.entry_points(static_cast<int>(i)).name(), c.names[i]);
        EXPECT_GT(rec.entry_points(static_cast<int>(i)).resources().registers(), 0);
      }
      auto info = ReadCubin(call.response.cubin());
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->arch, arch);
      for (const std::string& n : c.names) {
        EXPECT_TRUE(std::any_of(info->kernels.begin(), info->kernels.end(),
                                [&](const CubinKernel& k) { return k.name == n && k.entry; }))
            << n;
      }
      keys.insert(rec.key());
      // The same input again is a hit under the same key.
      Call again = Get(*d, RawRequest(c.format, c.file, c.names, arch));
      ASSERT_TRUE(again.status.ok()) << again.status.error_message();
      EXPECT_TRUE(again.response.cache_hit());
      EXPECT_EQ(again.response.record().key(), rec.key());
      EXPECT_EQ(again.response.cubin(), call.response.cubin());
    }
  }
  EXPECT_EQ(keys.size(), 8u);  // input bytes, format, names and arch are all in the key
  v1::StatsResponse stats = d->Stats();
  EXPECT_EQ(stats.compiles(), 8u);
  EXPECT_EQ(stats.compile_failures(), 0u);
}

// `kcache show` lists the kernels inside the cached cubin, read from its ELF:
// through the daemon, then on the store directly once the daemon is gone.
TEST(RawE2E, KcacheShowListsTheCubinsKernels) {
  TempDir dir;
  auto d = RawDaemon(dir);
  ASSERT_NO_FATAL_FAILURE(d->Start());
  Call call = Get(*d, RawRequest(v1::RawKernel::FORMAT_LLVM_IR, "block_sum.ll",
                                 {"kc_block_sum", "kc_scale"}, "sm_80"));
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  const std::string key = KeyToHexForTest(call.response.record().key());
  int regs = call.response.record().entry_points(0).resources().registers();
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "store" : "daemon");
    if (direct) EXPECT_EQ(d->Stop(SIGTERM), 0);
    std::ostringstream out, err;
    const std::vector<std::string> conn = direct
                                              ? std::vector<std::string>{"--store", d->store()}
                                              : std::vector<std::string>{"--socket", d->socket()};
    std::vector<std::string> args = conn;
    args.push_back("show");
    args.push_back(key.substr(0, 20));
    ASSERT_EQ(tools::RunKcache(args, {out, err}), tools::kExitOk) << err.str();
    const std::string text = out.str();
    EXPECT_THAT(text, HasSubstr("raw kernel (FORMAT_LLVM_IR: kc_block_sum, kc_scale)"));
    EXPECT_THAT(text, HasSubstr("cubin kernels (from the ELF, sm_80)"));
    // One table row per kernel: name, kind, registers, shared memory.
    EXPECT_THAT(text,
                ::testing::ContainsRegex(absl::StrCat("kc_block_sum +kernel +", regs, " +1024 ")));
    EXPECT_THAT(text, ::testing::ContainsRegex("kc_scale +kernel +[0-9]+ +0 "));

    // `kcache status` names both toolchains, and the raw one's entry is
    // current, not one to invalidate.
    std::ostringstream sout, serr;
    args = conn;
    args.push_back("status");
    ASSERT_EQ(tools::RunKcache(args, {sout, serr}), tools::kExitOk) << serr.str();
    const std::string tc_id = call.response.record().toolchain().id();
    EXPECT_THAT(sout.str(), ::testing::ContainsRegex(absl::StrCat(
                                "\nraw +llvm-nvptx\\+nvjitlink llvm 22\\.[0-9.]+ nvjitlink "
                                "[0-9.]+  id ",
                                tc_id)))
        << sout.str();
    EXPECT_THAT(sout.str(),
                ::testing::ContainsRegex(tc_id + " +1 +.* +sm_80 +current \\(raw kernels\\)"))
        << sout.str();
    EXPECT_THAT(sout.str(), ::testing::Not(HasSubstr("invalidate --toolchain " + tc_id)));
  }
}

TEST(RawE2E, OffByDefault) {
  TempDir dir;
  DaemonProcess d(dir.path());
  ASSERT_NO_FATAL_FAILURE(d.Start());
  Call call = Get(d, RawRequest(v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"}, "sm_80"));
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(call.status.error_message(), HasSubstr("disabled"));
  EXPECT_THAT(call.status.error_message(), HasSubstr("--enable_raw_kernels"));
}

TEST(RawE2E, EnablingNeedsAnAdminToken) {
  TempDir dir;
  DaemonProcess d(dir.path(), {"--enable_raw_kernels=true"});
  absl::Status st = d.TryStart();
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr("admin_token_path"));
}

TEST(RawE2E, RefusesCallersWithoutTheToken) {
  TempDir dir;
  auto d = RawDaemon(dir);
  ASSERT_NO_FATAL_FAILURE(d->Start());
  auto req = RawRequest(v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"}, "sm_80");
  Call none = Get(*d, req, "");
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(none.status.error_message(), HasSubstr("admin token"));
  Call wrong = Get(*d, req, "not-the-token");
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Prefetch is held to the same rule.
  auto stub = v1::KernelService::NewStub(
      grpc::CreateChannel(d->target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::PrefetchRequest pre;
  *pre.add_requests() = req;
  v1::PrefetchResponse resp;
  grpc::Status st = stub->Prefetch(&ctx, pre, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(d->Stats().compiles(), 0u);
}

TEST(RawE2E, MalformedInputIsInvalidArgument) {
  TempDir dir;
  auto d = RawDaemon(dir, {"--max_raw_source_bytes=65536", "--max_message_bytes=1048576"});
  ASSERT_NO_FATAL_FAILURE(d->Start());
  Call bad = Get(
      *d, RawRequest(v1::RawKernel::FORMAT_LLVM_IR, "malformed_verifier.ll", {"kc_bad"}, "sm_90a"));
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), HasSubstr("verifier"));
  EXPECT_THAT(bad.status.error_message(), HasSubstr("does not dominate all uses"));

  // IR that says a newer LLVM wrote it: refused naming both releases.
  for (const auto& [format, file, name] :
       {std::tuple{v1::RawKernel::FORMAT_LLVM_IR, "newer_llvm.ll", "kc_vadd_newer"},
        std::tuple{v1::RawKernel::FORMAT_LLVM_BITCODE, "newer_llvm.bc", "kc_vadd"}}) {
    Call newer = Get(*d, RawRequest(format, file, {name}, "sm_90a"));
    EXPECT_EQ(newer.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << file;
    EXPECT_THAT(newer.status.error_message(), HasSubstr("written by LLVM 99.")) << file;
    EXPECT_THAT(newer.status.error_message(), HasSubstr("newer than the LLVM 22.")) << file;
  }

  Call missing =
      Get(*d, RawRequest(v1::RawKernel::FORMAT_LLVM_IR, "vadd.ll", {"kc_nope"}, "sm_80"));
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(missing.status.error_message(), HasSubstr("raw.kernel_names[0]"));

  auto both = RawRequest(v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"}, "sm_80");
  both.mutable_spec()->set_head_dim_qk(128);
  EXPECT_EQ(Get(*d, both).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  auto big = RawRequest(v1::RawKernel::FORMAT_PTX, "vadd.ptx", {"kc_vadd_ptx"}, "sm_80");
  big.mutable_raw()->mutable_source()->append(100000, ' ');
  Call over = Get(*d, big);
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(over.status.error_message(), HasSubstr("max_raw_source_bytes"));
  // Over the transport's message limit: gRPC itself refuses it.
  big.mutable_raw()->mutable_source()->append(2 << 20, ' ');
  EXPECT_EQ(Get(*d, big).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST(RawE2E, LlvmAbortIsContainedAndTheDaemonAnswersTheNextRequest) {
  TempDir dir;
  // Inherited by kcached and its compile workers: arms the test-only hook
  // that makes LLVM report_fatal_error (abort) on kcache_test_llvm_fatal.
  setenv("KCACHE_TEST_RAW_FAULTS", "1", 1);
  auto d = RawDaemon(dir);
  ASSERT_NO_FATAL_FAILURE(d->Start());
  unsetenv("KCACHE_TEST_RAW_FAULTS");
  Call crash = Get(*d, RawRequest(v1::RawKernel::FORMAT_LLVM_IR, "llvm_fatal.ll",
                                  {"kcache_test_llvm_fatal"}, "sm_90a"));
  EXPECT_EQ(crash.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(crash.status.error_message(), HasSubstr("compile worker crashed with signal 6"));
  EXPECT_THAT(crash.status.error_message(), HasSubstr("LLVM ERROR"));
  Call next = Get(*d, RawRequest(v1::RawKernel::FORMAT_LLVM_IR, "vadd.ll", {"kc_vadd"}, "sm_90a"));
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_FALSE(next.response.cubin().empty());
  v1::StatsResponse stats = d->Stats();
  EXPECT_EQ(stats.compile_failures(), 1u);
}

}  // namespace
}  // namespace kcache
