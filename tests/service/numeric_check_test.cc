// The numeric check before serve (issue 28) in the daemon's kernel path, on
// the CPU: a real store and scheduler, a fake compiler whose "cubin" is the
// source it was given, a fake device that verifies anything, and a fake
// NumericRunner that "runs" a cubin by reading its softmax scale (the
// reference's is always right). With the code generator's test-only fault
// switch on, the kernel is wrong: the daemon refuses to publish it, every
// waiter gets the error naming the key and the worst difference, a metric
// counts it, and the next request compiles again (and, switch off, is
// published with its check recorded). A compile-only daemon marks records
// unchecked.
#include "compiler/numeric_check.h"

#include <memory>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "compiler/attention/codegen.h"
#include "compiler/scheduler/scheduler.h"
#include "compiler/toolchain.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/config.h"
#include "service/kernel_backend.h"
#include "service/metrics.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

// "Compiles" by returning the source as the cubin. While held, kernel
// compiles (not the reference's) wait for Release(), so that a test can make
// several requests join one compile without sleeping.
class EchoCompiler final : public Compiler {
 public:
  absl::StatusOr<CompileOutput> Compile(const CompileInput& in, absl::Time) override {
    absl::MutexLock lock(&mu_);
    if (!absl::StrContains(in.source, "attention_ref.cuh")) {
      mu_.Await(absl::Condition(
          +[](bool* held) { return !*held; }, &held_));
      ++kernel_compiles_;
    }
    CompileOutput out;
    out.cubin = in.source;
    return out;
  }
  int kernel_compiles() {
    absl::MutexLock lock(&mu_);
    return kernel_compiles_;
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }

 private:
  absl::Mutex mu_;
  int kernel_compiles_ ABSL_GUARDED_BY(mu_) = 0;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
};

// One sm_90 device that verifies every cubin.
class FakeDevices final : public Devices {
 public:
  absl::Status Availability() const override { return absl::OkStatus(); }
  std::vector<DeviceInfo> List() const override {
    DeviceInfo d;
    d.ordinal = 0;
    d.name = "Fake H200";
    d.cc_major = 9;
    d.arch = "sm_90";
    return {d};
  }
  absl::StatusOr<VerifyResult> Verify(int ordinal, absl::string_view, absl::string_view,
                                      const std::vector<EntryRequirement>& entries) override {
    VerifyResult r;
    r.device_ordinal = ordinal;
    r.device_name = "Fake H200";
    for (const auto& e : entries) r.entries.push_back(EntryResources{.name = e.name});
    return r;
  }
};

// The kernel is right when its scale is the reference's.
class FakeRunner final : public NumericRunner {
 public:
  absl::StatusOr<NumericDiff> Run(int, const v1::KernelRecord&, absl::string_view cubin,
                                  absl::string_view reference_cubin) override {
    NumericDiff d;
    d.device = "Fake H200";
    const bool same = Scale(cubin) == Scale(reference_cubin);
    d.rel_l2 = same ? 3e-3 : 0.31;
    d.max_abs = same ? 1e-2 : 0.87;
    return d;
  }

 private:
  static std::string Scale(absl::string_view src) {
    const size_t at = src.find("#define KC_SOFTMAX_SCALE ");
    return at == absl::string_view::npos ? "" : std::string(src.substr(at, 48));
  }
};

v1::GetKernelRequest Request(bool by_device) {
  v1::GetKernelRequest req;
  v1::AttentionSpec* spec = req.mutable_spec();
  spec->set_dtype(v1::DTYPE_BF16);
  spec->set_head_dim_qk(128);
  spec->set_num_q_heads(8);
  spec->set_num_kv_heads(8);
  spec->mutable_mask()->mutable_causal();
  if (by_device) {
    req.mutable_target()->set_device(0);
  } else {
    req.mutable_target()->set_arch("sm_90a");
  }
  return req;
}

class Fixture {
 public:
  explicit Fixture(bool with_gpu) {
    auto store = Store::Open(dir_.Sub("store"), StoreOptions{});
    if (!store.ok()) std::abort();
    store_ = *std::move(store);
    Scheduler::Options so;
    so.compile_threads = 1;
    scheduler_ = std::make_unique<Scheduler>(so);
    BackendDeps deps;
    deps.store = store_.get();
    deps.scheduler = scheduler_.get();
    deps.compiler = &compiler_;
    if (with_gpu) {
      deps.devices = &devices_;
      deps.numeric_runner = &runner_;
    }
    deps.toolchain = MakeToolchain("nvrtc", "13.0", "test", {});
    deps.config = DefaultDaemonConfig();
    deps.metrics = &metrics_;
    backend_ = std::make_unique<KernelBackend>(std::move(deps));
  }
  ~Fixture() {
    scheduler_->Shutdown(absl::InfiniteDuration()).IgnoreError();
    backend_.reset();
  }

  KernelBackend& backend() { return *backend_; }
  EchoCompiler& compiler() { return compiler_; }
  MetricsRegistry& metrics() { return metrics_; }

 private:
  TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Scheduler> scheduler_;
  EchoCompiler compiler_;
  FakeDevices devices_;
  FakeRunner runner_;
  MetricsRegistry metrics_;
  std::unique_ptr<KernelBackend> backend_;
};

// Resets the fault switch whatever the test's outcome.
struct FaultOn {
  FaultOn() { attention::SetWrongKernelFaultForTesting(true); }
  ~FaultOn() { attention::SetWrongKernelFaultForTesting(false); }
};

TEST(NumericCheckTest, WrongKernelIsRefusedWaitersGetTheErrorNextRequestCompilesAgain) {
  Fixture f(/*with_gpu=*/true);
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  std::string key;
  {
    FaultOn fault;
    f.compiler().Hold();  // b joins a's compile before it can finish
    auto a = f.backend().Begin(Request(true), deadline);
    auto b = f.backend().Begin(Request(true), deadline);
    f.compiler().Release();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_NE(a->ticket, nullptr);
    ASSERT_NE(b->ticket, nullptr);
    auto ra = KernelBackend::Answer(a->ticket->Wait());
    auto rb = KernelBackend::Answer(b->ticket->Wait());
    auto resolved = f.backend().Resolve(Request(true));
    ASSERT_TRUE(resolved.ok());
    key = absl::BytesToHexString(resolved->id.key);
    for (const auto* r : {&ra, &rb}) {
      ASSERT_FALSE(r->ok());
      EXPECT_EQ(r->status().code(), absl::StatusCode::kInternal);
      EXPECT_THAT(r->status().message(), HasSubstr("numeric check failed for kernel " + key));
      EXPECT_THAT(r->status().message(), HasSubstr("worst |diff| 8.700e-01"));
      EXPECT_THAT(r->status().message(), HasSubstr("not published"));
    }
    EXPECT_EQ(f.compiler().kernel_compiles(), 1);  // the two waiters shared one compile
  }
  EXPECT_EQ(f.metrics().GetCounter("kcache_numeric_check_failures_total", "")->Value(), 1u);
  // Not published: the next request compiles again, now right, and is served.
  auto c = f.backend().Begin(Request(true), deadline);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_NE(c->ticket, nullptr) << "a refused kernel must not be in the store";
  auto rc = KernelBackend::Answer(c->ticket->Wait());
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(f.compiler().kernel_compiles(), 2);
  const v1::NumericCheck& nc = rc->record().numeric_check();
  EXPECT_EQ(nc.state(), v1::NUMERIC_CHECK_PASSED);
  EXPECT_EQ(nc.device(), "Fake H200");
  EXPECT_DOUBLE_EQ(nc.rel_l2_error(), 3e-3);
  EXPECT_DOUBLE_EQ(nc.tolerance(), 2e-2);
  EXPECT_TRUE(rc->record().verified());
  // And now it is a hit.
  auto d = f.backend().Begin(Request(true), deadline);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ticket, nullptr);
  EXPECT_TRUE(d->answer.hit);
}

TEST(NumericCheckTest, CompileOnlyDaemonMarksRecordsUnchecked) {
  Fixture f(/*with_gpu=*/false);
  auto a = f.backend().Begin(Request(false), absl::Now() + absl::Minutes(1));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(a->ticket, nullptr);
  auto r = KernelBackend::Answer(a->ticket->Wait());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->record().numeric_check().state(), v1::NUMERIC_CHECK_UNCHECKED);
  EXPECT_FALSE(r->record().verified());
}

TEST(NumericCheckTest, ReferenceSourceIsTheSamePreludeWithTheReferenceKernel) {
  v1::AttentionSpec spec = Request(false).spec();
  auto g = attention::GenerateAttentionSource(spec, "sm_90a");
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string& ref = g->reference_source;
  EXPECT_THAT(ref, HasSubstr("#include \"attention_ref.cuh\""));
  EXPECT_THAT(ref, ::testing::Not(HasSubstr("attention_fwd.cuh")));
  // Everything before the template include is the kernel's own prelude.
  const std::string prelude = ref.substr(0, ref.find("#include \"attention_ref.cuh\""));
  EXPECT_TRUE(absl::StartsWith(g->source, prelude));
  {
    FaultOn fault;
    auto bad = attention::GenerateAttentionSource(spec, "sm_90a");
    ASSERT_TRUE(bad.ok());
    EXPECT_NE(bad->source, g->source);                      // wrong on purpose
    EXPECT_EQ(bad->reference_source, g->reference_source);  // the reference is not
  }
}

}  // namespace
}  // namespace kcache
