// The whole trainer path on a GPU: a real kcached (not compile-only) compiles
// and verifies an attention kernel on the device; kcache::Client fetches and
// loads it into the current context; the test launches it on random data and
// checks O and LSE against a float64 reference computed on the host.
// Label "gpu": skips, saying why, without a CUDA driver or a device.
#include <dlfcn.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "client/client.h"
#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "tests/cache/test_util.h"
#include "tests/common/daemon_process.h"

namespace kcache {
namespace {

using ::kcache::testing::DaemonProcess;
using ::kcache::testing::TempDir;

// The driver calls this test needs beyond the client's own.
struct Cuda {
  int (*cuInit)(unsigned);
  int (*cuDeviceGetCount)(int*);
  int (*cuDeviceGet)(int*, int);
  int (*cuDevicePrimaryCtxRetain)(void**, int);
  int (*cuCtxSetCurrent)(void*);
  int (*cuMemAlloc)(unsigned long long*, size_t);
  int (*cuMemFree)(unsigned long long);
  int (*cuMemcpyHtoD)(unsigned long long, const void*, size_t);
  int (*cuMemcpyDtoH)(void*, unsigned long long, size_t);
  int (*cuMemsetD8)(unsigned long long, unsigned char, size_t);
  int (*cuLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        void*, void**, void**);
  int (*cuCtxSynchronize)();
};

const Cuda* LoadCuda(std::string* why) {
  static Cuda cuda;
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (h == nullptr) {
    *why = "no CUDA driver (libcuda.so.1)";
    return nullptr;
  }
#define KC_SYM(name, sym)                                           \
  cuda.name = reinterpret_cast<decltype(cuda.name)>(dlsym(h, sym)); \
  if (cuda.name == nullptr) {                                       \
    *why = "libcuda lacks " sym;                                    \
    return nullptr;                                                 \
  }
  KC_SYM(cuInit, "cuInit");
  KC_SYM(cuDeviceGetCount, "cuDeviceGetCount");
  KC_SYM(cuDeviceGet, "cuDeviceGet");
  KC_SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  KC_SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
  KC_SYM(cuMemAlloc, "cuMemAlloc_v2");
  KC_SYM(cuMemFree, "cuMemFree_v2");
  KC_SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  KC_SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  KC_SYM(cuMemsetD8, "cuMemsetD8_v2");
  KC_SYM(cuLaunchKernel, "cuLaunchKernel");
  KC_SYM(cuCtxSynchronize, "cuCtxSynchronize");
#undef KC_SYM
  int n = 0;
  if (cuda.cuInit(0) != 0 || cuda.cuDeviceGetCount(&n) != 0 || n == 0) {
    *why = "no CUDA device";
    return nullptr;
  }
  return &cuda;
}

uint16_t ToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fff + ((b >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(b >> 16);
}
float FromBf16(uint16_t h) {
  uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

struct Case {
  int batch, hq, hkv, q_len, kv_len, d;
  bool bottom_right;
};

class ClientGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    cuda_ = LoadCuda(&why);
    if (cuda_ == nullptr) GTEST_SKIP() << "GPU test skipped: " << why;
    int dev = 0;
    ASSERT_EQ(cuda_->cuDeviceGet(&dev, 0), 0);
    ASSERT_EQ(cuda_->cuDevicePrimaryCtxRetain(&ctx_, dev), 0);
    ASSERT_EQ(cuda_->cuCtxSetCurrent(ctx_), 0);
  }

  // Runs one causal case through the daemon and the client; checks O and LSE.
  void RunCase(Client& client, const Case& c, bool expect_hit) {
    v1::AttentionSpec spec;
    spec.set_dtype(v1::DTYPE_BF16);
    spec.set_head_dim_qk(static_cast<uint32_t>(c.d));
    spec.set_num_q_heads(static_cast<uint32_t>(c.hq));
    spec.set_num_kv_heads(static_cast<uint32_t>(c.hkv));
    spec.set_return_lse(true);
    spec.mutable_mask()->mutable_causal()->set_alignment(
        c.bottom_right ? v1::CAUSAL_ALIGNMENT_BOTTOM_RIGHT : v1::CAUSAL_ALIGNMENT_TOP_LEFT);
    auto loaded = client.Load(spec);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const v1::KernelRecord& rec = (*loaded)->response->record();
    EXPECT_TRUE(rec.verified()) << "the daemon should verify on the GPU";
    EXPECT_FALSE(rec.verified_on().empty());
    EXPECT_EQ((*loaded)->response->cache_hit(), expect_hit);
    EXPECT_EQ(rec.abi_version(), kAttentionAbiVersion);
    const v1::EntryPoint* fwd = nullptr;
    for (const auto& e : rec.entry_points()) {
      if (e.role() == v1::ENTRY_ROLE_FORWARD) fwd = &e;
    }
    ASSERT_NE(fwd, nullptr);
    void* fn = (*loaded)->Function(v1::ENTRY_ROLE_FORWARD);
    ASSERT_NE(fn, nullptr);
    std::printf("kernel %s on %s: block %ux%u, %u threads, %u B smem, %d regs\n",
                rec.arch().c_str(), rec.verified_on().c_str(), fwd->block_m(), fwd->block_n(),
                fwd->threads(), fwd->dynamic_smem_bytes(), fwd->resources().registers());

    // Fresh random inputs, BHSD, bf16.
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto make = [&](int heads, int len) {
      std::vector<uint16_t> v(static_cast<size_t>(c.batch) * heads * len * c.d);
      for (auto& x : v) x = ToBf16(u(rng));
      return v;
    };
    auto q = make(c.hq, c.q_len), k = make(c.hkv, c.kv_len), v = make(c.hkv, c.kv_len);
    size_t o_elems = static_cast<size_t>(c.batch) * c.hq * c.q_len * c.d;
    size_t lse_elems = static_cast<size_t>(c.batch) * c.hq * c.q_len;
    unsigned long long dq, dk, dv, dout, dlse;
    ASSERT_EQ(cuda_->cuMemAlloc(&dq, q.size() * 2), 0);
    ASSERT_EQ(cuda_->cuMemAlloc(&dk, k.size() * 2), 0);
    ASSERT_EQ(cuda_->cuMemAlloc(&dv, v.size() * 2), 0);
    ASSERT_EQ(cuda_->cuMemAlloc(&dout, o_elems * 2), 0);
    ASSERT_EQ(cuda_->cuMemAlloc(&dlse, lse_elems * 4), 0);
    cuda_->cuMemcpyHtoD(dq, q.data(), q.size() * 2);
    cuda_->cuMemcpyHtoD(dk, k.data(), k.size() * 2);
    cuda_->cuMemcpyHtoD(dv, v.data(), v.size() * 2);
    // Poison: an element the kernel does not write reads as NaN.
    cuda_->cuMemsetD8(dout, 0xff, o_elems * 2);
    cuda_->cuMemsetD8(dlse, 0xff, lse_elems * 4);

    AttentionParams p;
    std::memset(&p, 0, sizeof(p));
    p.q = reinterpret_cast<const void*>(dq);
    p.k = reinterpret_cast<const void*>(dk);
    p.v = reinterpret_cast<const void*>(dv);
    p.o = reinterpret_cast<void*>(dout);
    p.lse = reinterpret_cast<float*>(dlse);
    auto strides = [&](int heads, int len, kc_i64& sb, kc_i64& sh, kc_i64& ss) {
      ss = c.d;
      sh = static_cast<kc_i64>(len) * c.d;
      sb = sh * heads;
    };
    strides(c.hq, c.q_len, p.q_stride_b, p.q_stride_h, p.q_stride_s);
    strides(c.hkv, c.kv_len, p.k_stride_b, p.k_stride_h, p.k_stride_s);
    strides(c.hkv, c.kv_len, p.v_stride_b, p.v_stride_h, p.v_stride_s);
    strides(c.hq, c.q_len, p.o_stride_b, p.o_stride_h, p.o_stride_s);
    p.lse_stride_h = c.q_len;
    p.lse_stride_b = static_cast<kc_i64>(c.hq) * c.q_len;
    p.batch = c.batch;
    p.num_q_heads = c.hq;
    p.num_kv_heads = c.hkv;
    p.q_len = c.q_len;
    p.kv_len = c.kv_len;
    void* args[] = {&p};
    unsigned grid_x = static_cast<unsigned>((c.q_len + fwd->block_m() - 1) / fwd->block_m());
    ASSERT_EQ(cuda_->cuLaunchKernel(fn, grid_x, static_cast<unsigned>(c.hq),
                                    static_cast<unsigned>(c.batch), fwd->threads(), 1, 1,
                                    fwd->dynamic_smem_bytes(), nullptr, args, nullptr),
              0);
    ASSERT_EQ(cuda_->cuCtxSynchronize(), 0);
    std::vector<uint16_t> o(o_elems);
    std::vector<float> lse(lse_elems);
    cuda_->cuMemcpyDtoH(o.data(), dout, o_elems * 2);
    cuda_->cuMemcpyDtoH(lse.data(), dlse, lse_elems * 4);
    for (unsigned long long ptr : {dq, dk, dv, dout, dlse}) cuda_->cuMemFree(ptr);

    // float64 reference.
    double err2 = 0, ref2 = 0, lse_err = 0;
    int masked_rows = 0;
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const int shift = c.bottom_right ? c.kv_len - c.q_len : 0;
    std::vector<double> s(static_cast<size_t>(c.kv_len));
    for (int b = 0; b < c.batch; ++b) {
      for (int h = 0; h < c.hq; ++h) {
        int hk = h / (c.hq / c.hkv);
        for (int i = 0; i < c.q_len; ++i) {
          const uint16_t* qi = &q[((static_cast<size_t>(b) * c.hq + h) * c.q_len + i) * c.d];
          double mx = -INFINITY;
          int last = std::min(c.kv_len - 1, i + shift);
          for (int j = 0; j <= last; ++j) {
            const uint16_t* kj = &k[((static_cast<size_t>(b) * c.hkv + hk) * c.kv_len + j) * c.d];
            double dot = 0;
            for (int x = 0; x < c.d; ++x) dot += double(FromBf16(qi[x])) * FromBf16(kj[x]);
            s[j] = dot * scale;
            mx = std::max(mx, s[j]);
          }
          size_t orow = ((static_cast<size_t>(b) * c.hq + h) * c.q_len + i);
          float got_lse = lse[orow];
          if (last < 0) {  // no visible key: O = 0, LSE = -inf exactly
            ++masked_rows;
            EXPECT_TRUE(std::isinf(got_lse) && got_lse < 0) << "row " << i << " lse " << got_lse;
            for (int x = 0; x < c.d; ++x) {
              ASSERT_EQ(FromBf16(o[orow * c.d + x]), 0.f) << "masked row " << i;
            }
            continue;
          }
          double sum = 0;
          for (int j = 0; j <= last; ++j) sum += std::exp(s[j] - mx);
          lse_err = std::max(lse_err, std::abs((mx + std::log(sum)) - got_lse));
          for (int x = 0; x < c.d; ++x) {
            double acc = 0;
            for (int j = 0; j <= last; ++j) {
              acc += std::exp(s[j] - mx) / sum *
                     FromBf16(v[((static_cast<size_t>(b) * c.hkv + hk) * c.kv_len + j) * c.d + x]);
            }
            double got = FromBf16(o[orow * c.d + x]);
            ASSERT_FALSE(std::isnan(got)) << "NaN at row " << i;
            err2 += (got - acc) * (got - acc);
            ref2 += acc * acc;
          }
        }
      }
    }
    double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
    std::printf("  B%d H%d/%d Lq%d Lk%d D%d %s: rel L2 %.2e, max |dLSE| %.2e, %d empty rows\n",
                c.batch, c.hq, c.hkv, c.q_len, c.kv_len, c.d,
                c.bottom_right ? "bottom-right" : "top-left", rel, lse_err, masked_rows);
    EXPECT_LE(rel, 1e-2);
    EXPECT_LE(lse_err, 1e-3);
    if (c.bottom_right && c.q_len > c.kv_len) EXPECT_GT(masked_rows, 0);
  }

  // A real kcached (verifying on the GPU, not compile-only) in a fresh
  // directory, and client_, a client of it. Call with ASSERT_NO_FATAL_FAILURE.
  void StartDaemonAndClient() {
    daemon_ = std::make_unique<DaemonProcess>(dir_.path(),
                                              std::vector<std::string>{"--compile_only=false"});
    ASSERT_NO_FATAL_FAILURE(daemon_->Start());
    options_.target = daemon_->target();
    client_ = NewClient();
    ASSERT_NE(client_, nullptr);
  }
  // Another client of the daemon (another trainer process).
  std::unique_ptr<Client> NewClient() {
    auto client = Client::Create(options_);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  const Cuda* cuda_ = nullptr;
  void* ctx_ = nullptr;
  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;  // outlives the clients
  ClientOptions options_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientGpuTest, DaemonCompilesAndVerifiesClientLoadsAndKernelIsCorrect) {
  ASSERT_NO_FATAL_FAILURE(StartDaemonAndClient());
  ASSERT_NO_FATAL_FAILURE(RunCase(*client_, {2, 8, 2, 333, 333, 128, false}, false));
  ASSERT_NO_FATAL_FAILURE(RunCase(*client_, {1, 4, 4, 300, 200, 64, true}, false));
  // The same spec again: memoized in the client, no RPC, same module.
  uint64_t rpcs = client_->rpc_count();
  ASSERT_NO_FATAL_FAILURE(RunCase(*client_, {2, 8, 2, 200, 256, 128, false}, false));
  EXPECT_EQ(client_->rpc_count(), rpcs);
  // A fresh client (another trainer process) gets a cache hit.
  std::unique_ptr<Client> second = NewClient();
  ASSERT_NE(second, nullptr);
  ASSERT_NO_FATAL_FAILURE(RunCase(*second, {1, 8, 2, 129, 129, 128, false}, true));
  v1::StatsResponse stats = daemon_->Stats();
  EXPECT_FALSE(stats.compile_only());
  EXPECT_EQ(stats.compiles(), 2u);
  ASSERT_GE(stats.devices_size(), 1);
  std::printf("daemon devices: %s\n", stats.devices(0).c_str());
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0);
}

// A spec with backward: its cubin is two images (the forward's kernels, the
// backward's; docs/kernel-contract.md), which the client loads as two modules,
// every entry point from the image that defines it.
TEST_F(ClientGpuTest, BackwardModuleLoadsAsTwoModulesWithEveryEntryPoint) {
  ASSERT_NO_FATAL_FAILURE(StartDaemonAndClient());
  v1::AttentionSpec spec;
  spec.set_dtype(v1::DTYPE_BF16);
  spec.set_head_dim_qk(128);
  spec.set_num_q_heads(8);
  spec.set_num_kv_heads(2);
  spec.set_backward(true);
  spec.mutable_mask()->mutable_causal();
  auto loaded = client_->Load(spec);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const v1::KernelRecord& rec = (*loaded)->response->record();
  EXPECT_TRUE(rec.verified());
  EXPECT_EQ((*loaded)->modules.size(), 2u);
  ASSERT_GE(rec.entry_points_size(), 4);
  for (const auto& e : rec.entry_points()) {
    EXPECT_NE((*loaded)->Function(e.role()), nullptr) << e.name();
  }
  EXPECT_NE((*loaded)->Function(v1::ENTRY_ROLE_FORWARD),
            (*loaded)->Function(v1::ENTRY_ROLE_BACKWARD));
  // Forward only: one image, one module.
  spec.set_backward(false);
  auto forward = client_->Load(spec);
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_EQ((*forward)->modules.size(), 1u);
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace kcache
