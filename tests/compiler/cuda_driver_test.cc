// The CUDA driver wrapper where there is no driver (CI): compile-only mode,
// and the architecture rules. The GPU half is cuda_driver_gpu_test.cc.
#include "compiler/cuda/cuda_driver.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kcache {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(CudaDriverTest, MissingDriverMeansCompileOnlyMode) {
  std::unique_ptr<CudaDevices> devices = CudaDevices::Open("/nonexistent/libcuda.so.1");
  ASSERT_NE(devices, nullptr);
  EXPECT_EQ(devices->Availability().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(devices->Availability().message(), HasSubstr("compile-only mode"));
  EXPECT_THAT(devices->Availability().message(), HasSubstr("/nonexistent/libcuda.so.1"));
  EXPECT_THAT(devices->List(), IsEmpty());
  EXPECT_EQ(devices->driver_version(), 0);
  EXPECT_EQ(devices
                ->Verify(0, "sm_90",
                         "\x7f"
                         "ELF",
                         {{"k"}})
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

TEST(CudaDriverTest, DefaultOpenNeverFails) {
  // With or without a GPU: either devices, or compile-only mode saying why.
  std::unique_ptr<CudaDevices> devices = CudaDevices::Open();
  ASSERT_NE(devices, nullptr);
  if (devices->Availability().ok()) {
    EXPECT_FALSE(devices->List().empty());
  } else {
    EXPECT_THAT(devices->Availability().message(), HasSubstr("compile-only mode"));
  }
}

TEST(CudaDriverTest, ArchForComputeCapability) {
  EXPECT_EQ(ArchForComputeCapability(9, 0), "sm_90");
  EXPECT_EQ(ArchForComputeCapability(8, 6), "sm_86");
  EXPECT_EQ(ArchForComputeCapability(12, 0), "sm_120");
}

TEST(CudaDriverTest, CanVerifyArch) {
  DeviceInfo h200;
  h200.arch = "sm_90";
  EXPECT_TRUE(CanVerifyArch(h200, "sm_90"));
  EXPECT_TRUE(CanVerifyArch(h200, "sm_90a"));
  EXPECT_FALSE(CanVerifyArch(h200, "sm_80"));
  EXPECT_FALSE(CanVerifyArch(h200, "sm_900"));
  EXPECT_FALSE(CanVerifyArch(h200, "sm_9"));
  DeviceInfo a6000;
  a6000.arch = "sm_86";
  EXPECT_TRUE(CanVerifyArch(a6000, "sm_86"));
  EXPECT_FALSE(CanVerifyArch(a6000, "sm_80"));  // runs there, but is not "of that arch"
}

}  // namespace
}  // namespace kcache
