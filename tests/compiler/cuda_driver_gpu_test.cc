// GPU test (label "gpu"): device discovery, and a real compile + verify on
// each device. Skips, saying why, without libcuda or a device. Linked with
// static absl and no protobuf, so it runs where only glibc/libstdc++ exist
// (the GPU machine has no abseil/protobuf C++ libraries).
#include <thread>
#include <vector>

#include "compiler/cuda/cuda_driver.h"
#include "compiler/cuda/nvrtc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/compiler/test_kernels.h"

namespace kcache {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

class CudaDriverGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    devices_ = CudaDevices::Open();
    if (!devices_->Availability().ok()) {
      GTEST_SKIP() << "no GPU: " << devices_->Availability().message();
    }
    if (absl::Status s = nvrtc_.Load(); !s.ok()) GTEST_SKIP() << "no NVRTC: " << s.message();
  }

  // Compiles the tiny kernel (128 floats of static smem, 128 threads).
  CompileOutput CompileTiny(const std::string& arch) {
    CompileInput in;
    in.source = testing::TinyKernelSource();
    in.arch = arch;
    absl::StatusOr<CompileOutput> out = nvrtc_.Compile(in);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *std::move(out) : CompileOutput{};
  }

  Nvrtc nvrtc_;
  std::unique_ptr<CudaDevices> devices_;
};

TEST_F(CudaDriverGpuTest, DiscoversDevices) {
  std::vector<DeviceInfo> list = devices_->List();
  ASSERT_FALSE(list.empty());
  EXPECT_GE(devices_->driver_version(), 12000);
  for (size_t i = 0; i < list.size(); ++i) {
    const DeviceInfo& d = list[i];
    EXPECT_EQ(d.ordinal, static_cast<int>(i));
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.cc_major, 7);
    EXPECT_EQ(d.arch, ArchForComputeCapability(d.cc_major, d.cc_minor));
    EXPECT_GT(d.sm_count, 0);
    EXPECT_GT(d.total_memory_bytes, 1ull << 30);
    EXPECT_GE(d.max_smem_per_block_optin, 48 * 1024);
    std::printf("device %d: %s, %s, %d SMs, %.1f GiB, %d bytes smem/block opt-in\n", d.ordinal,
                d.name.c_str(), d.arch.c_str(), d.sm_count,
                d.total_memory_bytes / double(1ull << 30), d.max_smem_per_block_optin);
  }
}

TEST_F(CudaDriverGpuTest, CompilesAndVerifiesOnEachDevice) {
  for (const DeviceInfo& d : devices_->List()) {
    std::vector<std::string> archs = {d.arch};
    if (d.cc_major == 9 && d.cc_minor == 0) archs.push_back("sm_90a");
    for (const std::string& arch : archs) {
      SCOPED_TRACE(arch);
      CompileOutput out = CompileTiny(arch);
      ASSERT_FALSE(out.cubin.empty());
      absl::StatusOr<VerifyResult> v =
          devices_->Verify(d.ordinal, arch, out.cubin, {{"kc_tiny", 0, 128}});
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(v->device_ordinal, d.ordinal);
      EXPECT_EQ(v->device_name, d.name);
      ASSERT_THAT(v->entries, SizeIs(1));
      const EntryResources& e = v->entries[0];
      EXPECT_EQ(e.name, "kc_tiny");
      EXPECT_GT(e.registers, 0);
      EXPECT_EQ(e.static_smem_bytes, 128 * 4);
      EXPECT_EQ(e.local_bytes, 0);
      EXPECT_EQ(e.max_threads_per_block, 128);  // __launch_bounds__(128)
      // ptxas and the driver agree on what matters.
      ASSERT_THAT(out.kernels, SizeIs(1));
      EXPECT_EQ(out.kernels[0].registers, e.registers);
      EXPECT_EQ(out.kernels[0].static_smem_bytes, e.static_smem_bytes);
    }
  }
}

TEST_F(CudaDriverGpuTest, RaisesDynamicSharedMemoryUpToTheOptInLimit) {
  const DeviceInfo d = devices_->List()[0];
  CompileOutput out = CompileTiny(d.arch);
  const int most = d.max_smem_per_block_optin - 128 * 4;  // minus the static smem
  absl::StatusOr<VerifyResult> v = devices_->Verify(0, d.arch, out.cubin, {{"kc_tiny", most}});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->entries[0].max_dynamic_smem_bytes, most);

  absl::StatusOr<VerifyResult> too_much =
      devices_->Verify(0, d.arch, out.cubin, {{"kc_tiny", d.max_smem_per_block_optin + 1}});
  EXPECT_EQ(too_much.status().code(), absl::StatusCode::kFailedPrecondition) << too_much.status();
  EXPECT_THAT(too_much.status().message(), HasSubstr("dynamic shared memory"));
}

TEST_F(CudaDriverGpuTest, RejectsWhatCannotRun) {
  const DeviceInfo d = devices_->List()[0];
  CompileOutput out = CompileTiny(d.arch);
  // Missing entry point.
  absl::StatusOr<VerifyResult> v = devices_->Verify(0, d.arch, out.cubin, {{"kc_nope"}});
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition) << v.status();
  EXPECT_THAT(v.status().message(), HasSubstr("kc_nope"));
  // More threads than __launch_bounds__ allows.
  v = devices_->Verify(0, d.arch, out.cubin, {{"kc_tiny", 0, 256}});
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition) << v.status();
  // Not an image.
  v = devices_->Verify(0, d.arch, "definitely not a cubin", {{"kc_tiny"}});
  EXPECT_FALSE(v.ok());
  // An architecture this device does not verify.
  const std::string other = d.arch == "sm_80" ? "sm_86" : "sm_80";
  v = devices_->Verify(0, other, out.cubin, {{"kc_tiny"}});
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  // Unknown ordinal.
  v = devices_->Verify(static_cast<int>(devices_->List().size()), d.arch, out.cubin, {{"kc_tiny"}});
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDriverGpuTest, ConcurrentVerifiesFromManyThreads) {
  const DeviceInfo d = devices_->List()[0];
  CompileOutput out = CompileTiny(d.arch);
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(8);
  threads.reserve(results.size());
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 10 && results[i].ok(); ++k) {
        results[i] = devices_->Verify(0, d.arch, out.cubin, {{"kc_tiny", 4096, 128}}).status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace kcache
