// NVRTC compile time per kernel variant, in process and through a compile
// worker, plus the one-time costs (loading NVRTC, the toolchain fingerprint).
//
//   nvrtc_bench [benchmark flags] [--source=FILE] [--headers_dir=DIR]
//               [--arch=sm_90a] [--opt=OPTION]...
//
// Without --source it measures two built-in kernels: a tiny elementwise one
// and a mid-size attention-like kernel on mma.sync (bf16, m16n8k16, online
// softmax). --source points it at any translation unit (e.g. a generated
// attention TU); every file of --headers_dir becomes a named header.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "compiler/cuda/nvrtc.h"
#include "compiler/toolchain.h"
#include "compiler/worker/worker_pool.h"

namespace kcache {
namespace {

const char* const kTinyKernel = R"(
extern "C" __global__ void __launch_bounds__(128) kc_tiny(float* out, const float* in, int n) {
  __shared__ float tile[128];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? in[i] : 0.0f;
  __syncthreads();
  if (i < n) out[i] = tile[127 - threadIdx.x] * 2.0f + 1.0f;
}
)";

// A flash-attention-shaped forward: 4 warps, 64 query rows per block, KV in
// tiles of 32, head dim 128, bf16 inputs, fp32 accumulators, mma.sync
// m16n8k16. Not tuned or tested for correctness: it exists to be compiled.
const char* const kMmaKernel = R"(
// No host headers (NVRTC 13 has no built-in cuda_bf16.h): bf16 is raw bits.
typedef unsigned short bf16;
#define HD 128
#define BM 64
#define BN 32
#define WARPS 4
struct Params { const bf16* q; const bf16* k; const bf16* v;
                bf16* o; int seqlen; float scale_log2; };

__device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ unsigned pack(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float tofloat(bf16 x) { return __uint_as_float((unsigned)x << 16); }
__device__ __forceinline__ unsigned lds32(const bf16* p) {
  return *reinterpret_cast<const unsigned*>(p);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
kc_attn_like(const Params p) {
  __shared__ __align__(16) bf16 sq[BM][HD + 8];
  __shared__ __align__(16) bf16 sk[BN][HD + 8];
  __shared__ __align__(16) bf16 sv[BN][HD + 8];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = blockIdx.x * BM;
  const size_t head = (size_t)blockIdx.y * p.seqlen * HD;
  for (int i = tid; i < BM * HD / 8; i += WARPS * 32) {
    int r = i / (HD / 8), c = (i % (HD / 8)) * 8;
    *reinterpret_cast<uint4*>(&sq[r][c]) =
        row0 + r < p.seqlen ? *reinterpret_cast<const uint4*>(p.q + head + (size_t)(row0 + r) * HD + c)
                            : make_uint4(0, 0, 0, 0);
  }
  float acc[HD / 8][4];
  #pragma unroll
  for (int j = 0; j < HD / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m_i[2] = {__int_as_float(0xff800000), __int_as_float(0xff800000)}, l_i[2] = {0.f, 0.f};
  const int wr = warp * 16, g = lane / 4, t = lane % 4;
  for (int n0 = 0; n0 < p.seqlen; n0 += BN) {
    __syncthreads();
    for (int i = tid; i < BN * HD / 8; i += WARPS * 32) {
      int r = i / (HD / 8), c = (i % (HD / 8)) * 8;
      bool in = n0 + r < p.seqlen;
      *reinterpret_cast<uint4*>(&sk[r][c]) = in ? *reinterpret_cast<const uint4*>(p.k + head + (size_t)(n0 + r) * HD + c) : make_uint4(0,0,0,0);
      *reinterpret_cast<uint4*>(&sv[r][c]) = in ? *reinterpret_cast<const uint4*>(p.v + head + (size_t)(n0 + r) * HD + c) : make_uint4(0,0,0,0);
    }
    __syncthreads();
    float s[BN / 8][4];
    #pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      #pragma unroll
      for (int k = 0; k < HD; k += 16) {
        unsigned a[4] = {lds32(&sq[wr + g][k + 2 * t]), lds32(&sq[wr + g + 8][k + 2 * t]),
                         lds32(&sq[wr + g][k + 2 * t + 8]), lds32(&sq[wr + g + 8][k + 2 * t + 8])};
        unsigned b[2] = {lds32(&sk[j * 8 + g][k + 2 * t]), lds32(&sk[j * 8 + g][k + 2 * t + 8])};
        mma16816(s[j], a, b);
      }
    }
    float m_new[2] = {m_i[0], m_i[1]};
    #pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        int col = n0 + j * 8 + 2 * t + (e & 1);
        s[j][e] = col < p.seqlen ? s[j][e] * p.scale_log2 : __int_as_float(0xff800000);
        m_new[e / 2] = fmaxf(m_new[e / 2], s[j][e]);
      }
    }
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_new[h] = fmaxf(m_new[h], __shfl_xor_sync(0xffffffff, m_new[h], 1));
      m_new[h] = fmaxf(m_new[h], __shfl_xor_sync(0xffffffff, m_new[h], 2));
    }
    float corr[2] = {exp2f(m_i[0] - m_new[0]), exp2f(m_i[1] - m_new[1])};
    float rs[2] = {0.f, 0.f};
    #pragma unroll
    for (int j = 0; j < BN / 8; ++j)
      #pragma unroll
      for (int e = 0; e < 4; ++e) { s[j][e] = exp2f(s[j][e] - m_new[e / 2]); rs[e / 2] += s[j][e]; }
    #pragma unroll
    for (int h = 0; h < 2; ++h) { l_i[h] = l_i[h] * corr[h] + rs[h]; m_i[h] = m_new[h]; }
    #pragma unroll
    for (int j = 0; j < HD / 8; ++j) { acc[j][0] *= corr[0]; acc[j][1] *= corr[0]; acc[j][2] *= corr[1]; acc[j][3] *= corr[1]; }
    #pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned a[4] = {pack(s[2 * kk][0], s[2 * kk][1]), pack(s[2 * kk][2], s[2 * kk][3]),
                       pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      #pragma unroll
      for (int j = 0; j < HD / 8; ++j) {
        bf16 v0 = sv[kk * 16 + 2 * t][j * 8 + g], v1 = sv[kk * 16 + 2 * t + 1][j * 8 + g];
        bf16 v2 = sv[kk * 16 + 2 * t + 8][j * 8 + g], v3 = sv[kk * 16 + 2 * t + 9][j * 8 + g];
        unsigned b[2] = {pack(tofloat(v0), tofloat(v1)),
                         pack(tofloat(v2), tofloat(v3))};
        mma16816(acc[j], a, b);
      }
    }
  }
  #pragma unroll
  for (int h = 0; h < 2; ++h) { l_i[h] += __shfl_xor_sync(0xffffffff, l_i[h], 1); l_i[h] += __shfl_xor_sync(0xffffffff, l_i[h], 2); }
  #pragma unroll
  for (int j = 0; j < HD / 8; ++j) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      int r = row0 + wr + g + 8 * h;
      if (r < p.seqlen) {
        *reinterpret_cast<unsigned*>(p.o + head + (size_t)r * HD + j * 8 + 2 * t) =
            pack(acc[j][2 * h] / l_i[h], acc[j][2 * h + 1] / l_i[h]);
      }
    }
  }
}
)";

struct Flags {
  std::string source_path, headers_dir, arch = "sm_90a";
  std::vector<std::string> options;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CompileInput MakeInput(const std::string& source, const Flags& f) {
  CompileInput in;
  in.source = source;
  in.program_name = "bench.cu";
  in.arch = f.arch;
  in.extra_options = f.options;
  if (!f.headers_dir.empty()) {
    if (DIR* d = opendir(f.headers_dir.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string path = f.headers_dir + "/" + e->d_name;
        struct stat st;
        if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
          in.headers[e->d_name] = ReadFile(path);
      }
      closedir(d);
    }
  }
  return in;
}

void Report(benchmark::State& state, const CompileOutput& out) {
  if (!out.kernels.empty()) {
    state.counters["regs"] = out.kernels[0].registers;
    state.counters["smem"] = out.kernels[0].static_smem_bytes;
    state.counters["spill"] = out.kernels[0].spill_store_bytes;
  }
  state.counters["cubin_KiB"] = out.cubin.size() / 1024.0;
}

void BM_InProcess(benchmark::State& state, const Nvrtc* nvrtc, CompileInput input) {
  CompileOutput last;
  for (auto _ : state) {
    absl::StatusOr<CompileOutput> out = nvrtc->Compile(input);
    if (!out.ok()) {
      state.SkipWithError(std::string(out.status().message()).c_str());
      return;
    }
    last = *std::move(out);
  }
  Report(state, last);
}

void BM_Worker(benchmark::State& state, WorkerPool* pool, CompileInput input) {
  CompileOutput last;
  for (auto _ : state) {
    absl::StatusOr<CompileOutput> out = pool->Compile(input, absl::Now() + absl::Minutes(10));
    if (!out.ok()) {
      state.SkipWithError(std::string(out.status().message()).c_str());
      return;
    }
    last = *std::move(out);
  }
  Report(state, last);
}

void BM_ToolchainFingerprint(benchmark::State& state, const Nvrtc* nvrtc) {
  for (auto _ : state) benchmark::DoNotOptimize(NvrtcToolchain(*nvrtc));
}

}  // namespace
}  // namespace kcache

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  kcache::Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* prefix) { return a.substr(std::strlen(prefix)); };
    if (a.rfind("--source=", 0) == 0)
      f.source_path = value("--source=");
    else if (a.rfind("--headers_dir=", 0) == 0)
      f.headers_dir = value("--headers_dir=");
    else if (a.rfind("--arch=", 0) == 0)
      f.arch = value("--arch=");
    else if (a.rfind("--opt=", 0) == 0)
      f.options.push_back(value("--opt="));
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  // One-time costs, measured once in this fresh process (dlopen and NVRTC's
  // own lazy initialisation are cached after the first time).
  static kcache::Nvrtc nvrtc;
  absl::Time t0 = absl::Now();
  if (absl::Status s = nvrtc.Load(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const absl::Duration load = absl::Now() - t0;
  t0 = absl::Now();
  {
    kcache::CompileInput first = kcache::MakeInput(kcache::kTinyKernel, f);
    absl::StatusOr<kcache::CompileOutput> out = nvrtc.Compile(first);
    if (!out.ok()) std::fprintf(stderr, "%s\n", out.status().ToString().c_str());
  }
  std::printf(
      "cold: NVRTC dlopen %.1f ms; first compile of the tiny kernel in this process %.1f ms\n",
      absl::ToDoubleMilliseconds(load), absl::ToDoubleMilliseconds(absl::Now() - t0));
  // The worker sits next to this binary's build dir: build/bench/compiler ->
  // build/compiler/kcache-compile-worker.
  kcache::WorkerPoolOptions wo;
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, n) : ".";
  dir = dir.substr(0, dir.rfind('/'));
  wo.worker_path = dir + "/../../compiler/kcache-compile-worker";
  wo.max_workers = 1;
  static kcache::WorkerPool pool(wo);

  std::vector<std::pair<std::string, std::string>> sources;
  if (!f.source_path.empty()) {
    sources.emplace_back(f.source_path, kcache::ReadFile(f.source_path));
  } else {
    sources.emplace_back("tiny", kcache::kTinyKernel);
    sources.emplace_back("mma_attention_like", kcache::kMmaKernel);
  }
  benchmark::RegisterBenchmark("ToolchainFingerprint", kcache::BM_ToolchainFingerprint, &nvrtc)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(3);
  for (const auto& [name, src] : sources) {
    kcache::CompileInput in = kcache::MakeInput(src, f);
    benchmark::RegisterBenchmark(("InProcess/" + name + "/" + f.arch).c_str(), kcache::BM_InProcess,
                                 &nvrtc, in)
        ->Unit(benchmark::kMillisecond)
        ->MeasureProcessCPUTime()
        ->UseRealTime();
    benchmark::RegisterBenchmark(("Worker/" + name + "/" + f.arch).c_str(), kcache::BM_Worker,
                                 &pool, in)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
