// The raw-kernel compile (compiler/worker/raw_compile.h) in process, with the real
// LLVM NVPTX backend and nvJitLink (CPU only): committed IR, bitcode and PTX
// fixtures become cubins for sm_80 and sm_90a, whose kernels the cubin reader
// (compiler/llvm/cubin_elf.h) lists with the registers ptxas reported.
#include "compiler/worker/raw_compile.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "compiler/cuda/cubin_images.h"
#include "compiler/cuda/nvjitlink.h"
#include "compiler/cuda/nvrtc.h"
#include "compiler/llvm/cubin_elf.h"
#include "compiler/llvm/llvm_nvptx.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"
#include "tests/common/raw_fixtures.h"
#include "tests/compiler/test_kernels.h"

namespace kcache {
namespace {

using ::kcache::testing::RawFixture;
using ::kcache::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

class RawCompileTest : public ::testing::TestWithParam<std::string> {
 protected:
  RawCompileOptions Options() {
    RawCompileOptions o;
    o.linker = &linker_;
    o.ir_to_ptx = &LlvmIrToPtx;
    return o;
  }
  NvJitLink linker_;
};

RawSource Source(RawFormat format, const std::string& file, std::vector<std::string> names) {
  return RawSource{format, RawFixture(file), std::move(names)};
}

void ExpectKernels(const CompileOutput& out, const std::string& arch,
                   const std::vector<std::string>& names) {
  auto info = ReadCubin(out.cubin);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch, arch);
  for (const std::string& n : names) {
    const CubinKernel* k = nullptr;
    for (const CubinKernel& c : info->kernels) {
      if (c.name == n) k = &c;
    }
    ASSERT_NE(k, nullptr) << n;
    EXPECT_TRUE(k->entry) << n;
    EXPECT_GT(k->code_bytes, 0) << n;
    EXPECT_GT(k->registers, 0) << n;
    // The ELF's register count is what ptxas reported.
    bool reported = false;
    for (const KernelReport& r : out.kernels) {
      if (r.name == n) {
        reported = true;
        EXPECT_EQ(k->registers, r.registers) << n;
        // From sm_90 on the section also holds the driver's reserved 1 KiB
        // whenever the kernel uses shared memory (static, or dynamic only as
        // Triton's kernels do, which ptxas reports as 0).
        if (arch >= "sm_90" && k->static_smem_bytes != r.static_smem_bytes) {
          EXPECT_EQ(k->static_smem_bytes, r.static_smem_bytes + 1024) << n;
        } else {
          EXPECT_EQ(k->static_smem_bytes, r.static_smem_bytes) << n;
        }
      }
    }
    EXPECT_TRUE(reported) << n << " not in the ptxas report:\n" << out.log;
  }
}

TEST_P(RawCompileTest, LlvmIrText) {
  auto out = CompileRaw(Source(RawFormat::kLlvmIr, "vadd.ll", {"kc_vadd"}), GetParam(), Options());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->log, HasSubstr(absl::StrCat("LLVM ", LinkedLlvmVersion().text)));
  ExpectKernels(*out, GetParam(), {"kc_vadd"});
}

// Line-table debug info as Triton emits it: LLVM marks the PTX
// ".target sm_XX, debug", and ptxas refused that ("Optimized debugging not
// supported") until llvm_nvptx.cc dropped the flag.
TEST_P(RawCompileTest, LlvmIrWithDebugInfo) {
  auto out = CompileRaw(Source(RawFormat::kLlvmIr, "vadd_debug.ll", {"kc_vadd_debug"}), GetParam(),
                        Options());
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectKernels(*out, GetParam(), {"kc_vadd_debug"});
}

TEST_P(RawCompileTest, LlvmBitcode) {
  auto out =
      CompileRaw(Source(RawFormat::kLlvmBitcode, "vadd.bc", {"kc_vadd"}), GetParam(), Options());
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectKernels(*out, GetParam(), {"kc_vadd"});
}

TEST_P(RawCompileTest, AnnotatedKernelsWithSharedMemory) {
  auto out = CompileRaw(Source(RawFormat::kLlvmIr, "block_sum.ll", {"kc_block_sum", "kc_scale"}),
                        GetParam(), Options());
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectKernels(*out, GetParam(), {"kc_block_sum", "kc_scale"});
  auto info = ReadCubin(out->cubin);
  ASSERT_TRUE(info.ok());
  for (const CubinKernel& k : info->kernels) {
    if (k.name == "kc_block_sum") {
      EXPECT_EQ(k.static_smem_bytes, GetParam() == "sm_80" ? 1024 : 2048);
    }
  }
}

TEST_P(RawCompileTest, Ptx) {
  auto out =
      CompileRaw(Source(RawFormat::kPtx, "vadd.ptx", {"kc_vadd_ptx"}), GetParam(), Options());
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectKernels(*out, GetParam(), {"kc_vadd_ptx"});
}

INSTANTIATE_TEST_SUITE_P(Archs, RawCompileTest, ::testing::Values("sm_80", "sm_90", "sm_90a"));

// Triton 3.6's own output (tests/fixtures/raw/triton, generate.py): PTX and
// LLVM IR of an elementwise kernel, a 128x128x64 bf16 tl.dot (wgmma on
// sm_90a, over 48 KiB of shared memory) and a num_ctas=2 kernel (clusters),
// each for the target Triton compiled it for.
struct TritonCase {
  std::string base;  // tests/fixtures/raw/triton/<base>.{ptx,ll}
  std::string kernel;
  std::string arch;
};

void PrintTo(const TritonCase& c, std::ostream* os) { *os << c.base << " (" << c.arch << ")"; }

class TritonFixtureTest : public ::testing::TestWithParam<TritonCase> {};

TEST_P(TritonFixtureTest, PtxAndLlvmIrCompile) {
  const TritonCase& c = GetParam();
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  for (const auto& [format, ext] :
       {std::pair{RawFormat::kPtx, ".ptx"}, std::pair{RawFormat::kLlvmIr, ".ll"}}) {
    SCOPED_TRACE(c.base + ext);
    auto out = CompileRaw(Source(format, "triton/" + c.base + ext, {c.kernel}), c.arch, o);
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectKernels(*out, c.arch, {c.kernel});
  }
}

// The elementwise kernel's IR names no sm_90 feature: Triton's sm_80 IR also
// compiles for sm_90a.
TEST(TritonFixture, Sm80IrCompilesForSm90a) {
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  auto out = CompileRaw(Source(RawFormat::kLlvmIr, "triton/add_kernel.sm80.ll", {"add_kernel"}),
                        "sm_90a", o);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectKernels(*out, "sm_90a", {"add_kernel"});
}

INSTANTIATE_TEST_SUITE_P(
    Triton36, TritonFixtureTest,
    ::testing::Values(TritonCase{"add_kernel.sm80", "add_kernel", "sm_80"},
                      TritonCase{"add_kernel.sm90a", "add_kernel", "sm_90a"},
                      TritonCase{"matmul_kernel.sm80", "matmul_kernel", "sm_80"},
                      TritonCase{"matmul_kernel.sm90a", "matmul_kernel", "sm_90a"},
                      TritonCase{"cluster_add_kernel.sm90a", "add_kernel", "sm_90a"}),
    [](const ::testing::TestParamInfo<TritonCase>& i) {
      std::string n = i.param.base;
      for (char& ch : n) {
        if (ch == '.') ch = '_';
      }
      return n;
    });

TEST(RawCompile, VerifierRejectsMalformedIr) {
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  auto out = CompileRaw(
      RawSource{RawFormat::kLlvmIr, RawFixture("malformed_verifier.ll"), {"kc_bad"}}, "sm_80", o);
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(out.status().message(), HasSubstr("verifier"));
  EXPECT_THAT(out.status().message(), HasSubstr("does not dominate all uses"));
}

TEST(RawCompile, DebugInfoKeepsLineTablesButNotTheDebugTarget) {
  IrToPtxOptions o;
  o.arch = "sm_80";
  o.kernel_names = {"kc_vadd_debug"};
  auto ptx = LlvmIrToPtx(RawFixture("vadd_debug.ll"), o);
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  EXPECT_THAT(*ptx, HasSubstr("\n.target sm_80\n"));
  EXPECT_THAT(*ptx, Not(HasSubstr(", debug")));
  EXPECT_THAT(*ptx, HasSubstr(".loc"));
  EXPECT_THAT(*ptx, HasSubstr("vadd.py"));
}

// IR from a newer LLVM that does not say so can call intrinsics this one
// lacks (as Triton 3.6's IR called llvm.nvvm.barrier.cta.* of LLVM 21 when
// kcache linked LLVM 19); they pass the verifier as plain external functions,
// and ptxas used to answer with a bare syntax error. A declaration nobody
// calls is harmless and accepted.
TEST(RawCompile, UnknownIntrinsicIsInvalidArgumentNamingIt) {
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  const std::string head =
      "target triple = \"nvptx64-nvidia-cuda\"\n"
      "declare void @llvm.nvvm.kcache.future.sync(i32)\n"
      "define ptx_kernel void @kc_sync() {\n";
  const std::string call = "  call void @llvm.nvvm.kcache.future.sync(i32 0)\n";
  auto used = CompileRaw(
      RawSource{RawFormat::kLlvmIr, head + call + "  ret void\n}\n", {"kc_sync"}}, "sm_80", o);
  EXPECT_THAT(used.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(used.status().message(), HasSubstr("@llvm.nvvm.kcache.future.sync"));
  EXPECT_THAT(used.status().message(),
              HasSubstr(absl::StrCat("not an intrinsic of LLVM ", LinkedLlvmVersion().text)));
  auto unused =
      CompileRaw(RawSource{RawFormat::kLlvmIr, head + "  ret void\n}\n", {"kc_sync"}}, "sm_80", o);
  EXPECT_TRUE(unused.ok()) << unused.status();
}

// IR from older releases keeps compiling: vadd.bc is LLVM 19's bitcode,
// block_sum.ll uses LLVM 19's llvm.nvvm.barrier0 and !nvvm.annotations, both
// upgraded on reading (Archs/RawCompileTest above compiles them).
TEST(RawCompile, DeclaredVersionOfOlderBitcode) {
  auto v = DeclaredLlvmVersion(RawFixture("vadd.bc"), /*bitcode=*/true);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->major, 19);
  EXPECT_EQ(v->minor, 1);
  EXPECT_EQ(v->text, "19.1.7");
  EXPECT_FALSE(DeclaredLlvmVersion(RawFixture("vadd.ll"), false).has_value());
  EXPECT_GE(LinkedLlvmVersion().major, 22);
  EXPECT_EQ(LinkedLlvmVersion().text.rfind(
                absl::StrCat(LinkedLlvmVersion().major, ".", LinkedLlvmVersion().minor, "."), 0),
            0u);
}

TEST(RawCompile, DeclaredVersionOfText) {
  auto ident = [](const std::string& s) {
    return absl::StrCat("target triple = \"nvptx64-nvidia-cuda\"\n!llvm.ident = !{!0, !1}\n",
                        "!0 = !{!\"", s, "\"}\n!1 = !{!\"some other tool 1.0\"}\n");
  };
  auto clang = DeclaredLlvmVersion(ident("clang version 23.0.0git (https://x y)"), false);
  ASSERT_TRUE(clang.has_value());
  EXPECT_EQ(clang->major, 23);
  EXPECT_EQ(clang->minor, 0);
  EXPECT_EQ(clang->text, "23.0.0git");
  auto llvm = DeclaredLlvmVersion(ident("mycompiler 2.0 (LLVM 21.1.3)"), false);
  ASSERT_TRUE(llvm.has_value());
  EXPECT_EQ(llvm->text, "21.1.3");
  EXPECT_FALSE(DeclaredLlvmVersion(ident("rustc version 1.80.0"), false).has_value());
  EXPECT_FALSE(DeclaredLlvmVersion("!llvm.ident = !{!0", false).has_value());
}

// IR that says a newer LLVM wrote it is refused before LLVM reads it, with
// both releases named; the fixtures would otherwise compile (newer_llvm.bc is
// vadd.bc with only its producer string changed).
TEST(RawCompile, IrFromNewerLlvmIsRefusedNamingBothVersions) {
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  for (const auto& [format, file, name, version] :
       {std::tuple{RawFormat::kLlvmIr, "newer_llvm.ll", "kc_vadd_newer", "99.0.0git"},
        std::tuple{RawFormat::kLlvmBitcode, "newer_llvm.bc", "kc_vadd", "99.1.7"}}) {
    for (const char* arch : {"sm_80", "sm_90a"}) {
      auto out = CompileRaw(Source(format, file, {name}), arch, o);
      EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kInvalidArgument)) << file;
      EXPECT_THAT(out.status().message(),
                  HasSubstr(absl::StrCat("raw.source: written by LLVM ", version,
                                         ", newer than the LLVM ", LinkedLlvmVersion().text)))
          << file;
    }
  }
}

// Most IR does not say which LLVM wrote it (Triton's does not): a parse error
// then names the linked release and the likely cause.
TEST(RawCompile, UnparseableIrHintsAtANewerLlvm) {
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  const std::string ir =
      "target triple = \"nvptx64-nvidia-cuda\"\n"
      "define ptx_kernel void @f(ptr addrspace(1) readnone kcache_future(none) %a) {\n"
      "  ret void\n}\n";
  auto out = CompileRaw(RawSource{RawFormat::kLlvmIr, ir, {"f"}}, "sm_80", o);
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(out.status().message(),
              HasSubstr(absl::StrCat("LLVM ", LinkedLlvmVersion().text, " cannot parse it")));
  EXPECT_THAT(out.status().message(), HasSubstr("raw.source:2:"));
  EXPECT_THAT(out.status().message(),
              HasSubstr(absl::StrCat("IR from an LLVM newer than ", LinkedLlvmVersion().text)));
}

TEST(RawCompile, ParseErrorIsInvalidArgumentWithLocation) {
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  auto out = CompileRaw(RawSource{RawFormat::kLlvmIr, "define void @f( {", {"f"}}, "sm_80", o);
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(out.status().message(), HasSubstr("raw.source:1:"));
}

TEST(RawCompile, MissingOrNonKernelNamesAreRefused) {
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  auto missing = CompileRaw(Source(RawFormat::kLlvmIr, "vadd.ll", {"nope"}), "sm_80", o);
  EXPECT_THAT(missing.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(missing.status().message(), HasSubstr("raw.kernel_names[0]"));
  const std::string device_fn =
      "target triple = \"nvptx64-nvidia-cuda\"\ndefine void @f() {\n  ret void\n}\n";
  auto not_kernel = CompileRaw(RawSource{RawFormat::kLlvmIr, device_fn, {"f"}}, "sm_80", o);
  EXPECT_THAT(not_kernel.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(not_kernel.status().message(), HasSubstr("not a kernel"));
  auto ptx = CompileRaw(Source(RawFormat::kPtx, "vadd.ptx", {"kc_vadd"}), "sm_80", o);
  EXPECT_THAT(ptx.status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(RawCompile, WrongFormatTripleAndArchAreRefused) {
  NvJitLink linker;
  RawCompileOptions o{&linker, &LlvmIrToPtx, false};
  auto bc_as_text = CompileRaw(Source(RawFormat::kLlvmIr, "vadd.bc", {"kc_vadd"}), "sm_80", o);
  EXPECT_THAT(bc_as_text.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  auto text_as_bc = CompileRaw(Source(RawFormat::kLlvmBitcode, "vadd.ll", {"kc_vadd"}), "sm_80", o);
  EXPECT_THAT(text_as_bc.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::string x86 =
      "target triple = \"x86_64-pc-linux-gnu\"\ndefine void @f() {\n  ret void\n}\n";
  auto triple = CompileRaw(RawSource{RawFormat::kLlvmIr, x86, {"f"}}, "sm_80", o);
  EXPECT_THAT(triple.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(triple.status().message(), HasSubstr("x86_64"));
  auto arch = CompileRaw(Source(RawFormat::kLlvmIr, "vadd.ll", {"kc_vadd"}), "sm_99", o);
  EXPECT_THAT(arch.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(arch.status().message(), HasSubstr("target.arch"));
}

TEST(RawCompile, WithoutLlvmIrIsUnimplementedButPtxWorks) {
  NvJitLink linker;
  RawCompileOptions o{&linker, nullptr, false};
  auto ir = CompileRaw(Source(RawFormat::kLlvmIr, "vadd.ll", {"kc_vadd"}), "sm_80", o);
  EXPECT_THAT(ir.status(), StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(ir.status().message(), HasSubstr("KCACHE_WITH_LLVM"));
  auto ptx = CompileRaw(Source(RawFormat::kPtx, "vadd.ptx", {"kc_vadd_ptx"}), "sm_80", o);
  EXPECT_TRUE(ptx.ok()) << ptx.status();
}

TEST(RawCompile, ValidateRawSource) {
  EXPECT_THAT(ValidateRawSource({RawFormat::kPtx, "x", {}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateRawSource({RawFormat::kPtx, "", {"k"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateRawSource({RawFormat::kPtx, "x", {"k", "k"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateRawSource({RawFormat::kPtx, "x", {"a b"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateRawSource({static_cast<RawFormat>(9), "x", {"k"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(ValidateRawSource({RawFormat::kPtx, "x", {"k", "_Z3fooPf", "a$b.c"}}).ok());
}

// A cubin of two images (an attention module with backward): both images'
// kernels, the first image's arch.
TEST(CubinElf, ReadsEveryImage) {
  Nvrtc nvrtc;
  CompileInput in;
  in.arch = "sm_90a";
  in.source = testing::TinyKernelSource("kc_first");
  in.more_units = {testing::TinyKernelSource("kc_second")};
  absl::StatusOr<CompileOutput> out = CompileUnits(nvrtc, in, absl::InfiniteFuture());
  ASSERT_TRUE(out.ok()) << out.status();
  auto info = ReadCubin(out->cubin);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch, "sm_90a");
  std::vector<std::string> names;
  for (const CubinKernel& k : info->kernels) {
    if (k.entry) names.push_back(k.name);
  }
  EXPECT_THAT(names, ::testing::ElementsAre("kc_first", "kc_second"));
  EXPECT_EQ(info->images, 2);
  for (const CubinKernel& k : info->kernels) {
    if (k.entry) EXPECT_EQ(k.image, k.name == "kc_first" ? 0 : 1) << k.name;
  }
  auto images = SplitCubinImages(out->cubin);
  ASSERT_TRUE(images.ok()) << images.status();
  auto one = ReadCubin(std::string(images->front()));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->images, 1);
  // A damaged second image is named.
  auto bad = ReadCubin(out->cubin.substr(0, out->cubin.size() - 8));
  EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(bad.status().message(), HasSubstr("image 1"));
}

TEST(CubinElf, RefusesNonElf) {
  EXPECT_THAT(ReadCubin("not an elf").status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kcache
