// GPU test (label "gpu"; skips without libcuda or a device): the daemon's
// numeric check (CudaDevices::RunAttentionCheck, the run behind
// CudaNumericRunner) on translation units the real code generator wrote
// (bench/attention/generated/*.cu, from `kcache-compile --source`): every one
// passes within its dtype's tolerance, and the same kernel with the fault
// switch's wrong scale is refused. Cubins are compiled with NVRTC here, or
// taken from KC_CHECK_CUBINS/<name>.cubin and <name>.ref.cubin when present
// (the GPU machine's time is scarce; tests/kernels/export_check_cubins.py).
// Linked like cuda_driver_gpu_test: static absl, no protobuf.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "compiler/cuda/cuda_driver.h"
#include "compiler/cuda/nvrtc.h"
#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/attention_tiles.h"

namespace kcache {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string RepoRoot() {
  const char* r = std::getenv("KC_REPO");
  return r != nullptr ? r : KCACHE_SOURCE_DIR;
}

std::map<std::string, int> Defines(const std::string& src) {
  std::map<std::string, int> out;
  static const std::regex re(R"(#define (KC_\w+) \(?(-?\d+)\)?\s*\n)");
  for (auto it = std::sregex_iterator(src.begin(), src.end(), re); it != std::sregex_iterator();
       ++it) {
    out[(*it)[1]] = std::stoi((*it)[2]);
  }
  return out;
}

// The reference's translation unit: the kernel's prelude, then attention_ref.cuh.
std::string ReferenceSource(const std::string& src) {
  const size_t at = src.find("#include \"attention_fwd.cuh\"");
  return src.substr(0, at) + "#include \"attention_ref.cuh\"\n";
}

AttentionCheckKernel Describe(const std::string& src) {
  auto d = Defines(src);
  AttentionCheckKernel k;
  k.bf16 = d["KC_DTYPE_BF16"] == 1;
  k.head_dim_qk = d["KC_HEAD_DIM_QK"];
  k.head_dim_v = d["KC_HEAD_DIM_V"];
  k.mask = d["KC_MASK"];
  k.score = d["KC_SCORE_MOD"];
  k.drafter_block = d["KC_DRAFTER_BLOCK"];
  // Heads are not in the prelude (launch values): GQA 4 heads over 2.
  k.num_q_heads = 4;
  k.num_kv_heads = 2;
  const AttentionTiles t = MakeAttentionTiles(d["KC_BLOCK_M"], d["KC_BLOCK_N"], d["KC_NUM_WARPS"],
                                              d["KC_STAGES"], k.head_dim_qk, k.head_dim_v);
  k.forward = {"kcache_attn_fwd",
               AttentionFwdThreads(t, d["KC_ARCH_SM90A"] == 1, k.head_dim_qk, k.head_dim_v),
               t.smem_bytes, t.block_m, t.block_n};
  // The mask build classifies in rows of KC_CLASS_BLOCK_M (the backward's block_m where the
  // forward's classes also serve the backward), as the record's MASK_BUILD entry says.
  const int class_block_m = d.count("KC_CLASS_BLOCK_M") ? d["KC_CLASS_BLOCK_M"] : t.block_m;
  if (k.mask == KC_MASK_EXPR)
    k.mask_build = {"kcache_attn_mask_build", 128, 0, class_block_m, t.block_n};
  // Buffers: slot -> (type, rank) from the read helpers' signatures.
  static const std::regex rd(
      R"(__device__ __forceinline__ (int|float|bool) kc_read_(\d+)\(const kcache::AttentionParams& p((?:, int i\d)*)\))");
  for (auto it = std::sregex_iterator(src.begin(), src.end(), rd); it != std::sregex_iterator();
       ++it) {
    const std::string ty = (*it)[1];
    const size_t slot = static_cast<size_t>(std::stoi((*it)[2]));
    const std::string idx = (*it)[3];
    if (k.buffers.size() <= slot) k.buffers.resize(slot + 1);
    k.buffers[slot].type = ty == "int" ? 1 : ty == "float" ? 2 : 3;
    k.buffers[slot].rank = static_cast<int>(std::count(idx.begin(), idx.end(), ','));
  }
  return k;
}

class NumericCheckGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    devices_ = CudaDevices::Open();
    if (!devices_->Availability().ok()) {
      GTEST_SKIP() << "no GPU: " << devices_->Availability().message();
    }
    if (devices_->List()[0].arch != "sm_90") GTEST_SKIP() << "the generated files are sm_90/sm_90a";
  }

  std::string Cubin(const std::string& name, const std::string& src, const std::string& arch,
                    bool reference) {
    const char* dir = std::getenv("KC_CHECK_CUBINS");
    if (dir != nullptr) {
      const fs::path p = fs::path(dir) / (name + (reference ? ".ref.cubin" : ".cubin"));
      if (fs::exists(p)) return ReadFile(p);
    }
    if (absl::Status s = nvrtc_.Load(); !s.ok()) {
      ADD_FAILURE() << "no NVRTC and no cubin for " << name << ": " << s.message();
      return "";
    }
    CompileInput in;
    in.source = reference ? ReferenceSource(src) : src;
    in.arch = arch;
    for (const auto& e : fs::directory_iterator(fs::path(RepoRoot()) / "kernels")) {
      const std::string f = e.path().filename().string();
      if (f.ends_with(".cuh") || (f.ends_with(".h") && f != "embedded.h")) {
        in.headers[f] = ReadFile(e.path());
      }
    }
    auto out = nvrtc_.Compile(in);
    EXPECT_TRUE(out.ok()) << name << ": " << out.status();
    return out.ok() ? out->cubin : "";
  }

  Nvrtc nvrtc_;
  std::unique_ptr<CudaDevices> devices_;
};

TEST_F(NumericCheckGpuTest, GeneratedKernelsPassAndAWrongOneIsRefused) {
  const fs::path dir = fs::path(RepoRoot()) / "bench" / "attention" / "generated";
  int checked = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".cu") continue;
    const std::string name = e.path().stem().string();
    const std::string src = ReadFile(e.path());
    const std::string arch = Defines(src)["KC_ARCH_SM90A"] == 1 ? "sm_90a" : "sm_90";
    const AttentionCheckKernel k = Describe(src);
    const std::string cubin = Cubin(name, src, arch, false);
    const std::string ref = Cubin(name, src, arch, true);
    ASSERT_FALSE(cubin.empty() || ref.empty()) << name;
    auto d = devices_->RunAttentionCheck(0, k, cubin, ref);
    ASSERT_TRUE(d.ok()) << name << ": " << d.status();
    const double tol = k.bf16 ? 2e-2 : 5e-3;  // compiler/numeric_check.cc NumericTolerance
    std::printf("%-32s rel L2 %.3e worst |diff| %.3e on %s\n", name.c_str(), d->rel_l2, d->max_abs,
                d->device.c_str());
    EXPECT_LE(d->rel_l2, tol) << name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
  // The fault switch's kernel (softmax scale x1.25 in the kernel only).
  const char* fault = std::getenv("KC_CHECK_CUBINS");
  if (fault != nullptr && fs::exists(fs::path(fault) / "fault.cubin")) {
    const std::string src = ReadFile(fs::path(fault) / "fault.cu");
    auto d =
        devices_->RunAttentionCheck(0, Describe(src), ReadFile(fs::path(fault) / "fault.cubin"),
                                    ReadFile(fs::path(fault) / "fault.ref.cubin"));
    ASSERT_TRUE(d.ok()) << d.status();
    std::printf("fault switch kernel: rel L2 %.3e worst |diff| %.3e (must exceed the tolerance)\n",
                d->rel_l2, d->max_abs);
    EXPECT_GT(d->rel_l2, 2e-2);
  }
}

}  // namespace
}  // namespace kcache
