// kcache::LaunchRaw (client/raw_launch.h) against a fake CUDA driver: the
// shared-memory limit raised once per function over 48 KiB, launches over the
// device's maximum refused before the driver sees them, required clusters
// launched through cuLaunchKernelEx. No GPU.
#include "client/raw_launch.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

namespace ci = client_internal;
using ::kcache::testing::StatusIs;
using ::testing::HasSubstr;

// The fake driver's state: attributes it reports and the calls it saw.
struct Fake {
  int static_shared = 0;
  int cluster[3] = {0, 0, 0};
  int must_be_set = 0;
  std::vector<std::pair<int, int>> set_attrs;  // cuFuncSetAttribute(attr, value)
  int launches = 0;
  std::vector<ci::CuLaunchConfig> ex;
  std::vector<ci::CuLaunchAttribute> ex_attrs;
  int pushes = 0, pops = 0;
};
Fake* fake = nullptr;

ci::CudaApi FakeApi() {
  ci::CudaApi api{};
  api.cuCtxPushCurrent = [](ci::CUcontext) { return ++fake->pushes, 0; };
  api.cuCtxPopCurrent = [](ci::CUcontext*) { return ++fake->pops, 0; };
  api.cuCtxGetDevice = [](ci::CUdevice* d) { return *d = 0, 0; };
  api.cuDeviceGetAttribute = [](int* v, int attr, ci::CUdevice) {
    *v = attr == 97 ? 232448 : 0;  // H200's opt-in shared memory per block
    return 0;
  };
  api.cuFuncGetAttribute = [](int* v, int attr, ci::CUfunction) {
    *v = attr == 1                    ? fake->static_shared
         : attr == 10                 ? fake->must_be_set
         : (attr >= 11 && attr <= 13) ? fake->cluster[attr - 11]
                                      : 0;
    return 0;
  };
  api.cuFuncSetAttribute = [](ci::CUfunction, int attr, int value) {
    fake->set_attrs.push_back({attr, value});
    return 0;
  };
  api.cuLaunchKernel = [](ci::CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, unsigned, ci::CUstream, void**,
                          void**) { return ++fake->launches, 0; };
  api.cuLaunchKernelEx = [](const ci::CuLaunchConfig* c, ci::CUfunction, void**, void**) {
    fake->ex.push_back(*c);
    for (unsigned i = 0; i < c->num_attrs; ++i) fake->ex_attrs.push_back(c->attrs[i]);
    return 0;
  };
  api.cuGetErrorName = [](int, const char** s) { return *s = "fake", 0; };
  return api;
}

class RawLaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake = &f_;
    kernel_.context = reinterpret_cast<void*>(0x10);
    kernel_.functions["k"] = reinterpret_cast<void*>(0x20);
    kernel_.raw_launch_state = std::make_shared<ci::RawLaunchState>();
  }
  void TearDown() override { fake = nullptr; }
  absl::Status Launch(const RawLaunchConfig& c) {
    return ci::LaunchRawWith(api_, kernel_, "k", c, nullptr);
  }
  Fake f_;
  ci::CudaApi api_ = FakeApi();
  LoadedKernel kernel_;
};

TEST_F(RawLaunchTest, RaisesTheSharedLimitOncePerFunctionOver48KiB) {
  f_.static_shared = 1024;
  RawLaunchConfig c{.grid = {4}, .block = {128}, .shared_bytes = 1024};
  ASSERT_TRUE(Launch(c).ok());
  EXPECT_TRUE(f_.set_attrs.empty());
  c.shared_bytes = 98304;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Launch(c).ok());
  EXPECT_EQ(f_.set_attrs, (std::vector<std::pair<int, int>>{{8, 232448 - 1024}}));
  EXPECT_EQ(f_.launches, 4);
  EXPECT_EQ(f_.pushes, 4);
  EXPECT_EQ(f_.pops, 4);
}

TEST_F(RawLaunchTest, RefusesMoreSharedMemoryThanTheDeviceHas) {
  f_.static_shared = 1024;
  absl::Status s = Launch({.grid = {1}, .block = {128}, .shared_bytes = 232448});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("k: shared_bytes=232448 bytes of dynamic shared memory plus "
                                     "1024 static is over this device's maximum of 232448"));
  EXPECT_THAT(s.message(), HasSubstr("at most 231424 dynamic"));
  EXPECT_EQ(f_.launches, 0);
  EXPECT_TRUE(f_.set_attrs.empty());
  EXPECT_EQ(f_.pops, f_.pushes);
}

TEST_F(RawLaunchTest, RequiredClusterLaunchesThroughLaunchKernelEx) {
  f_.cluster[0] = 2, f_.cluster[1] = 1, f_.cluster[2] = 1;  // .reqnctapercluster 2, 1, 1
  ASSERT_TRUE(Launch({.grid = {8, 2}, .block = {128}, .shared_bytes = 0}).ok());
  ASSERT_EQ(f_.ex.size(), 1u);
  EXPECT_EQ(f_.launches, 0);
  EXPECT_EQ(f_.ex[0].grid_x, 8u);
  EXPECT_EQ(f_.ex[0].grid_y, 2u);
  EXPECT_EQ(f_.ex[0].block_x, 128u);
  ASSERT_EQ(f_.ex_attrs.size(), 2u);
  EXPECT_EQ(f_.ex_attrs[0].id, 4);  // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
  EXPECT_EQ(f_.ex_attrs[0].value.cluster_dim.x, 2u);
  EXPECT_EQ(f_.ex_attrs[0].value.cluster_dim.y, 1u);
  EXPECT_EQ(f_.ex_attrs[0].value.cluster_dim.z, 1u);

  absl::Status odd = Launch({.grid = {7}, .block = {128}});
  EXPECT_THAT(odd, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(odd.message(), HasSubstr("grid x=7 is not a multiple of the cluster's x=2"));
  absl::Status other = Launch({.grid = {8}, .block = {128}, .cluster = Dim3{4, 1, 1}});
  EXPECT_THAT(other.message(), HasSubstr("compiled for clusters of (2, 1, 1)"));
}

TEST_F(RawLaunchTest, ExplicitClusterNeedsAShapeAndLargeClustersOptIn) {
  f_.must_be_set = 1;
  absl::Status none = Launch({.grid = {16}, .block = {128}});
  EXPECT_THAT(none, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(none.message(), HasSubstr(".explicitcluster"));
  ASSERT_TRUE(Launch({.grid = {16}, .block = {128}, .cluster = Dim3{16, 1, 1}}).ok());
  EXPECT_EQ(f_.set_attrs, (std::vector<std::pair<int, int>>{{14, 1}}));
  ASSERT_EQ(f_.ex.size(), 1u);
}

TEST_F(RawLaunchTest, UnknownNameIsNotFound) {
  EXPECT_THAT(ci::LaunchRawWith(api_, kernel_, "nope", {}, nullptr),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(PlanRawLaunch, PlainKernelsLaunchWithoutACluster) {
  RawFunctionLimits l;
  l.max_shared_optin = 232448;
  auto p = PlanRawLaunch("k", {.grid = {3}, .block = {64}, .shared_bytes = 200000}, l);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->has_value());
  auto one = PlanRawLaunch("k", {.grid = {3}, .block = {64}, .cluster = Dim3{}}, l);
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->has_value());
  EXPECT_THAT(PlanRawLaunch("k", {.grid = {0}, .block = {64}}, l).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kcache
