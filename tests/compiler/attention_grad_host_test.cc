// The reverse sweep of kc_expr_score_grad, checked numerically on the CPU:
// the device code the daemon generates for a set of score modifications
// (written at build time by attention_grad_gen) is compiled here as host
// C++, and its gradients, with respect to the score and to every element of
// every trainable buffer, are compared with central finite differences of
// the generated kc_expr_score itself. Points where the function has a kink
// (select, min/max, abs) are recognised by two step sizes disagreeing and
// skipped. No GPU, no NVRTC.
#include <math.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_params.h"

// The device code's vocabulary, on the host.
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wreserved-macro-identifier"
#pragma clang diagnostic ignored "-Wunknown-warning-option"
#define __device__  // NOLINT(bugprone-reserved-identifier): CUDA's name, empty on the host
#define __forceinline__ inline  // NOLINT(bugprone-reserved-identifier): CUDA's name
#pragma clang diagnostic pop
namespace {
// Single-threaded here, so a plain add.
float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}

struct GradCase {
  const char* name;
  float (*score)(float, int, int, int, int, const kcache::AttentionParams&);
  float (*grad)(float, float, int, int, int, int, const kcache::AttentionParams&, bool);
  int num_buffers;
  int rank[kcache::kMaxExprBuffers];
  bool trainable[kcache::kMaxExprBuffers];
};

#include "attention_grad_cases.inc"

constexpr int kExtent = 6;  // per dimension
constexpr int kPitch = 7;   // row stride of rank-2 buffers (not contiguous)

struct HostBuffer {
  std::vector<float> data, grad;
};

// Buffers with values in [-1.5, 1.5] (deterministic), wired into p.
std::vector<HostBuffer> MakeBuffers(const GradCase& c, kcache::AttentionParams* p) {
  std::vector<HostBuffer> bufs(static_cast<size_t>(c.num_buffers));
  for (int i = 0; i < c.num_buffers; ++i) {
    HostBuffer& hb = bufs[static_cast<size_t>(i)];
    const int rank = c.rank[i];
    const size_t size = rank == 1 ? kExtent : static_cast<size_t>(kExtent * kPitch);
    hb.data.resize(size);
    hb.grad.assign(size, 0.0f);
    for (size_t j = 0; j < size; ++j) {
      hb.data[j] = 1.5f * std::sin(static_cast<float>(3 * j + 7 * static_cast<size_t>(i) + 1));
    }
    kcache::KcBuffer& kb = p->buffers[i];
    kb.ptr = hb.data.data();
    kb.rank = rank;
    for (int d = 0; d < rank; ++d) kb.extent[d] = kExtent;
    kb.stride[rank - 1] = 1;
    if (rank == 2) kb.stride[0] = kPitch;
    p->buffer_grads[i] = c.trainable[i] ? hb.grad.data() : nullptr;
  }
  return bufs;
}

// d f / d x by central differences with step h, f evaluated in float.
template <typename F>
double CentralDiff(F f, float x, float h) {
  return (static_cast<double>(f(x + h)) - static_cast<double>(f(x - h))) / (2.0 * h);
}

// Whether the derivative at x is well defined numerically (no kink nearby):
// two step sizes agree.
template <typename F>
bool Smooth(F f, float x, float h, double* fd) {
  const double a = CentralDiff(f, x, h);
  const double b = CentralDiff(f, x, h / 2);
  *fd = b;
  return std::isfinite(a) && std::isfinite(b) &&
         std::fabs(a - b) <= 2e-3 * std::fmax(1.0, std::fabs(b));
}

bool Close(double ad, double fd) {
  return std::fabs(ad - fd) <= 5e-3 * std::fmax(1.0, std::fabs(fd));
}

TEST(AttentionGradHostTest, ReverseSweepMatchesFiniteDifferences) {
  const float scores[] = {-7.3f, -1.1f, -0.2f, 0.3f, 1.2f, 2.4f, 9.0f};
  for (const GradCase& c : kGradCases) {
    SCOPED_TRACE(c.name);
    kcache::AttentionParams p{};
    std::vector<HostBuffer> bufs = MakeBuffers(c, &p);
    int checked = 0, kinks = 0;
    for (int h = 0; h < 3; ++h) {
      for (int q = 0; q < kExtent; ++q) {
        for (int kv = 0; kv < kExtent; kv += 2) {
          for (float s : scores) {
            for (HostBuffer& hb : bufs) hb.grad.assign(hb.grad.size(), 0.0f);
            const float upstream = 0.75f;
            const float ds = c.grad(s, upstream, 0, h, q, kv, p, true);
            // The forward value, unchanged by the gradient's evaluation.
            ASSERT_EQ(c.score(s, 0, h, q, kv, p), c.score(s, 0, h, q, kv, p));
            const auto f_of_score = [&](float x) { return c.score(x, 0, h, q, kv, p); };
            double fd;
            const float step = 1e-2f * std::fmax(1.0f, std::fabs(s));
            if (Smooth(f_of_score, s, step, &fd)) {
              EXPECT_TRUE(Close(ds, upstream * fd))
                  << "d/dscore at h=" << h << " q=" << q << " kv=" << kv << " s=" << s
                  << ": reverse " << ds << ", finite differences " << upstream * fd;
              ++checked;
            } else {
              ++kinks;
            }
            // Every element of every buffer: trainable ones must match, the
            // others must be untouched (their gradient pointer is null).
            for (int i = 0; i < c.num_buffers; ++i) {
              HostBuffer& hb = bufs[static_cast<size_t>(i)];
              for (size_t j = 0; j < hb.data.size(); ++j) {
                const float saved = hb.data[j];
                const auto f_of_elem = [&](float x) {
                  hb.data[j] = x;
                  const float v = c.score(s, 0, h, q, kv, p);
                  hb.data[j] = saved;
                  return v;
                };
                if (!c.trainable[i]) continue;
                if (!Smooth(f_of_elem, saved, 1e-2f, &fd)) {
                  ++kinks;
                  continue;
                }
                EXPECT_TRUE(Close(hb.grad[j], upstream * fd))
                    << "d/dbuffer" << i << "[" << j << "] at h=" << h << " q=" << q << " kv=" << kv
                    << " s=" << s << ": reverse " << hb.grad[j] << ", finite differences "
                    << upstream * fd;
                ++checked;
              }
            }
          }
        }
      }
    }
    // Kinks are the exception, not the rule.
    EXPECT_GT(checked, 20 * kinks) << checked << " checked, " << kinks << " skipped";
    std::printf("%-28s %6d derivatives checked, %d kinks skipped\n", c.name, checked, kinks);
  }
}

// buffer_grads = false, or a null gradient pointer: no buffer is written,
// and the score's gradient is the same.
TEST(AttentionGradHostTest, BufferGradsOffOrNullWritesNothing) {
  for (const GradCase& c : kGradCases) {
    SCOPED_TRACE(c.name);
    kcache::AttentionParams p{};
    std::vector<HostBuffer> bufs = MakeBuffers(c, &p);
    const float with = c.grad(0.7f, 1.0f, 0, 1, 2, 3, p, true);
    for (HostBuffer& hb : bufs) hb.grad.assign(hb.grad.size(), 0.0f);
    EXPECT_EQ(c.grad(0.7f, 1.0f, 0, 1, 2, 3, p, false), with);
    for (int i = 0; i < c.num_buffers; ++i) p.buffer_grads[i] = nullptr;
    EXPECT_EQ(c.grad(0.7f, 1.0f, 0, 1, 2, 3, p, true), with);
    for (const HostBuffer& hb : bufs) {
      for (float g : hb.grad) EXPECT_EQ(g, 0.0f);
    }
  }
}

}  // namespace
