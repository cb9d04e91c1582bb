// NVRTC with the real library (no GPU needed): compiles, logs, resource
// reports, errors, and a missing library.
#include "compiler/cuda/nvrtc.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "compiler/cuda/cubin_images.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/compiler/test_kernels.h"

namespace kcache {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

bool IsElf(const std::string& bytes) {
  return bytes.size() > 4 && bytes.compare(0, 4,
                                           "\x7f"
                                           "ELF") == 0;
}

CompileInput Tiny(const std::string& arch) {
  CompileInput in;
  in.source = testing::TinyKernelSource();
  in.program_name = "tiny.cu";
  in.arch = arch;
  return in;
}

class NvrtcTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NvrtcTest, CompilesTinyKernelAndReportsResources) {
  Nvrtc nvrtc;
  absl::StatusOr<CompileOutput> out = nvrtc.Compile(Tiny(GetParam()));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(IsElf(out->cubin));
  ASSERT_THAT(out->kernels, SizeIs(1)) << out->log;
  EXPECT_EQ(out->kernels[0].name, "kc_tiny");
  EXPECT_GT(out->kernels[0].registers, 0);
  EXPECT_EQ(out->kernels[0].static_smem_bytes, 128 * 4);
  EXPECT_EQ(out->kernels[0].spill_store_bytes, 0);
  EXPECT_THAT(out->log, HasSubstr("Used"));
  EXPECT_GT(out->wall_time, absl::ZeroDuration());
}

INSTANTIATE_TEST_SUITE_P(Archs, NvrtcTest,
                         ::testing::Values("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"));

TEST(NvrtcTest, NamedHeadersAreIncluded) {
  Nvrtc nvrtc;
  CompileInput in;
  in.arch = "sm_80";
  in.headers["kc_scale.h"] = "#define KC_SCALE 3.0f\n";
  in.source =
      "#include \"kc_scale.h\"\n"
      "extern \"C\" __global__ void kc_scale(float* x) { x[threadIdx.x] *= KC_SCALE; }\n";
  absl::StatusOr<CompileOutput> out = nvrtc.Compile(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(IsElf(out->cubin));
}

TEST(NvrtcTest, CompileErrorIsFailedPreconditionWithLog) {
  Nvrtc nvrtc;
  CompileInput in;
  in.arch = "sm_90a";
  in.program_name = "broken.cu";
  in.source = "extern \"C\" __global__ void k(float* x) { x[0] = undeclared_thing; }\n";
  absl::StatusOr<CompileOutput> out = nvrtc.Compile(in);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("undeclared_thing"));
  EXPECT_THAT(out.status().message(), HasSubstr("broken.cu"));
}

TEST(NvrtcTest, BadArchIsInvalidArgument) {
  Nvrtc nvrtc;
  CompileInput in = Tiny("compute_90");
  EXPECT_EQ(nvrtc.Compile(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.arch = "sm_90";
  in.extra_options = {"-arch=sm_80"};
  EXPECT_EQ(nvrtc.Compile(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.extra_options = {"--no-such-option"};
  EXPECT_EQ(nvrtc.Compile(in).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NvrtcTest, ArchNvrtcDoesNotKnowIsInvalidArgument) {
  Nvrtc nvrtc;
  // Well-formed, but not an architecture NVRTC 13 compiles for.
  EXPECT_EQ(nvrtc.Compile(Tiny("sm_99")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NvrtcTest, PassedDeadlineIsDeadlineExceeded) {
  Nvrtc nvrtc;
  EXPECT_EQ(nvrtc.Compile(Tiny("sm_80"), absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(NvrtcTest, MissingLibraryIsUnavailableAtFirstUse) {
  Nvrtc nvrtc("/nonexistent/libnvrtc.so.13");  // constructing must not fail
  absl::StatusOr<CompileOutput> out = nvrtc.Compile(Tiny("sm_80"));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(out.status().message(), HasSubstr("/nonexistent/libnvrtc.so.13"));
  EXPECT_EQ(nvrtc.Version().status().code(), absl::StatusCode::kUnavailable);
}

TEST(NvrtcTest, VersionAndPath) {
  Nvrtc nvrtc;
  absl::StatusOr<NvrtcVersion> v = nvrtc.Version();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_GE(v->major, 12);
  absl::StatusOr<std::string> path = nvrtc.LibraryPath();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_THAT(*path, HasSubstr("libnvrtc"));
}

TEST(NvrtcTest, ConcurrentCompilesOfSeparateProgramsSucceed) {
  Nvrtc nvrtc;
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  threads.reserve(results.size());
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      CompileInput in = Tiny(i % 2 ? "sm_80" : "sm_90a");
      in.source = testing::TinyKernelSource("kc_tiny_" + std::to_string(i));
      results[i] = nvrtc.Compile(in).status();
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

// A module of two units (an attention module with backward): one image each,
// joined, both units' kernels and logs; the images cut back exactly.
TEST(CompileUnitsTest, EachUnitIsAnImageOfItsOwn) {
  Nvrtc nvrtc;
  CompileInput in = Tiny("sm_90a");
  in.source = testing::TinyKernelSource("kc_unit_a");
  in.more_units = {testing::TinyKernelSource("kc_unit_b")};
  absl::StatusOr<CompileOutput> out = CompileUnits(nvrtc, in, absl::InfiniteFuture());
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<std::vector<std::string_view>> images = SplitCubinImages(out->cubin);
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_THAT(*images, SizeIs(2));
  EXPECT_EQ(images->front().size() + images->back().size(), out->cubin.size());
  ASSERT_THAT(out->kernels, SizeIs(2)) << out->log;
  EXPECT_EQ(out->kernels[0].name, "kc_unit_a");
  EXPECT_EQ(out->kernels[1].name, "kc_unit_b");
  EXPECT_THAT(out->log, HasSubstr("unit 0:"));
  EXPECT_THAT(out->log, HasSubstr("unit 1:"));
  // Each image is what compiling its unit alone gives.
  CompileInput b = Tiny("sm_90a");
  b.source = in.more_units[0];
  absl::StatusOr<CompileOutput> alone = nvrtc.Compile(b);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(images->back(), alone->cubin);
  // One unit: exactly Nvrtc::Compile.
  in.more_units.clear();
  out = CompileUnits(nvrtc, in, absl::InfiniteFuture());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->kernels, SizeIs(1));
}

TEST(CompileUnitsTest, FailingUnitAnswersAndIsNamed) {
  Nvrtc nvrtc;
  CompileInput in = Tiny("sm_90a");
  in.program_name = "module.cu";
  in.more_units = {"extern \"C\" __global__ void k(float* x) { x[0] = undeclared_thing; }\n"};
  absl::StatusOr<CompileOutput> out = CompileUnits(nvrtc, in, absl::InfiniteFuture());
  ASSERT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("module.cu (unit 1)"));
  EXPECT_THAT(out.status().message(), HasSubstr("undeclared_thing"));
  EXPECT_EQ(CompileUnits(nvrtc, in, absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// A kernel that keeps NVRTC busy for a while (a long unrolled loop), so that
// a sibling unit's failure usually comes while it compiles.
std::string SlowKernelSource() {
  return "extern \"C\" __global__ void kc_slow(float* x) {\n"
         "  float a = x[threadIdx.x];\n"
         "#pragma unroll\n"
         "  for (int i = 0; i < 4000; ++i) a = a * 1.0001f + __sinf(a + i);\n"
         "  x[threadIdx.x] = a;\n"
         "}\n";
}

// The cancel flag reaches NVRTC through the flow callback: a compile whose
// flag is already set stops, Cancelled (not DeadlineExceeded).
TEST(NvrtcTest, CancelFlagStopsTheCompile) {
  Nvrtc nvrtc;
  CompileInput in = Tiny("sm_90a");
  in.source = SlowKernelSource();
  std::atomic<bool> cancel{true};
  absl::StatusOr<CompileOutput> out = nvrtc.Compile(in, absl::InfiniteFuture(), &cancel);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kCancelled) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("another unit of the module failed"));
  cancel = false;
  EXPECT_TRUE(nvrtc.Compile(Tiny("sm_90a"), absl::InfiniteFuture(), &cancel).ok());
}

// The second unit fails while the first still compiles: the first is
// cancelled, and the failure, not the cancellation, answers.
TEST(CompileUnitsTest, AFailingUnitAnswersNotTheUnitItCancelled) {
  Nvrtc nvrtc;
  CompileInput in = Tiny("sm_90a");
  in.program_name = "module.cu";
  in.source = SlowKernelSource();
  in.more_units = {"extern \"C\" __global__ void k(float* x) { x[0] = undeclared_thing; }\n"};
  absl::StatusOr<CompileOutput> out = CompileUnits(nvrtc, in, absl::InfiniteFuture());
  ASSERT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("module.cu (unit 1)"));
  EXPECT_THAT(out.status().message(), HasSubstr("undeclared_thing"));
}

// Units compiled by a stand-in: a good unit runs until the flag tells it to
// stop (bounded, so that a missing cancellation fails rather than hangs), a
// bad one fails at once. Records which units saw the flag.
struct FakeUnits {
  std::atomic<int> cancelled{0};
  std::atomic<int> compiled{0};
  UnitCompile compile() {
    return [this](const CompileInput& unit, absl::Time,
                  const std::atomic<bool>* cancel) -> absl::StatusOr<CompileOutput> {
      ++compiled;
      if (unit.source == "bad") {
        return absl::FailedPreconditionError(absl::StrCat(unit.program_name, " is bad"));
      }
      const absl::Time give_up = absl::Now() + absl::Minutes(2);
      while (cancel != nullptr && absl::Now() < give_up) {
        if (cancel->load()) {
          ++cancelled;
          return absl::CancelledError(absl::StrCat(unit.program_name, " cancelled"));
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
      return absl::InternalError(absl::StrCat(unit.program_name, " was never cancelled"));
    };
  }
};

TEST(CompileUnitsTest, TheFirstFailureCancelsTheOtherUnit) {
  for (const bool bad_first : {false, true}) {
    SCOPED_TRACE(bad_first ? "unit 0 fails" : "unit 1 fails");
    FakeUnits fake;
    CompileInput in = Tiny("sm_90a");
    in.program_name = "module.cu";
    in.source = bad_first ? "bad" : "good";
    in.more_units = {bad_first ? "good" : "bad"};
    absl::StatusOr<CompileOutput> out = CompileUnits(fake.compile(), in, absl::InfiniteFuture());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
    EXPECT_THAT(out.status().message(),
                HasSubstr(bad_first ? "module.cu (unit 0) is bad" : "module.cu (unit 1) is bad"));
    // The good unit saw the flag, or (unit 0 failing on this thread before
    // unit 1's thread started) was not started at all.
    EXPECT_EQ(fake.cancelled + (2 - fake.compiled), 1);
  }
}

TEST(CompileUnitsTest, NvrtcCompileRefusesSeveralUnits) {
  Nvrtc nvrtc;
  CompileInput in = Tiny("sm_80");
  in.more_units = {testing::TinyKernelSource("kc_other")};
  absl::StatusOr<CompileOutput> out = nvrtc.Compile(in);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("more_units"));
}

TEST(CubinImagesTest, SplitRefusesWhatIsNotWholeImages) {
  Nvrtc nvrtc;
  absl::StatusOr<CompileOutput> out = nvrtc.Compile(Tiny("sm_80"));
  ASSERT_TRUE(out.ok()) << out.status();
  const std::string& image = out->cubin;
  absl::StatusOr<std::vector<std::string_view>> one = SplitCubinImages(image);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(*one, SizeIs(1));
  EXPECT_EQ(SplitCubinImages("").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<std::string_view>> bad = SplitCubinImages("not an elf at all");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("image 0"));
  // A truncated image, alone or after a whole one; trailing bytes.
  const std::string cut = image.substr(0, image.size() - 1);
  EXPECT_EQ(SplitCubinImages(cut).status().code(), absl::StatusCode::kInvalidArgument);
  bad = SplitCubinImages(image + cut);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("image 1"));
  EXPECT_EQ(SplitCubinImages(image + "junk").status().code(), absl::StatusCode::kInvalidArgument);
  // An empty table's offset means nothing: with no program headers (ptxas
  // writes them last) image 0 ends before them, and what follows is not an
  // image; entries of size 0 are refused (client/python/kcache/cuda.py's
  // cubin_images reads the same).
  std::string far = image;
  const uint64_t past = image.size() + 4096;
  const uint16_t zero = 0;
  std::memcpy(far.data() + 0x20, &past, sizeof past);  // e_phoff
  std::memcpy(far.data() + 0x38, &zero, sizeof zero);  // e_phnum
  bad = SplitCubinImages(far);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("not an ELF image (image 1)"));
  std::string flat = image;
  std::memcpy(flat.data() + 0x3A, &zero, sizeof zero);  // e_shentsize
  EXPECT_EQ(SplitCubinImages(flat).status().code(), absl::StatusCode::kInvalidArgument);
  // Join refuses an image with bytes past its ELF's end (the reader would lose its place).
  absl::StatusOr<std::string> joined = JoinCubinImages({image, image});
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(*joined, image + image);
  EXPECT_EQ(JoinCubinImages({image + "x"}).status().code(), absl::StatusCode::kInternal);
}

TEST(PtxasReportTest, ParsesEveryField) {
  const char* log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'kc_a' for 'sm_90a'\n"
      "ptxas info    : Function properties for kc_a\n"
      "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 16384 bytes smem, 400 bytes cmem[0]\n"
      "ptxas info    : Function properties for helper\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Compiling entry function 'kc_b' for 'sm_90a'\n"
      "ptxas info    : Function properties for kc_b\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 8 registers, 380 bytes cmem[0]\n";
  std::vector<KernelReport> r = ParsePtxasReport(log);
  ASSERT_THAT(r, SizeIs(2));
  EXPECT_EQ(r[0].name, "kc_a");
  EXPECT_EQ(r[0].registers, 168);
  EXPECT_EQ(r[0].static_smem_bytes, 16384);
  EXPECT_EQ(r[0].stack_frame_bytes, 16);
  EXPECT_EQ(r[0].spill_store_bytes, 8);
  EXPECT_EQ(r[0].spill_load_bytes, 12);
  EXPECT_EQ(r[1].name, "kc_b");
  EXPECT_EQ(r[1].registers, 8);
  EXPECT_EQ(r[1].static_smem_bytes, 0);
}

}  // namespace
}  // namespace kcache
