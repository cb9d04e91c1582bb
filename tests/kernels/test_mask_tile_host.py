"""CPU test (CI): the generated interval evaluation kc_expr_mask_tile is sound, and what
it saves. The generated expression functions of bench/attention/generated/ (the real
generator's output) are compiled as host C++ (c++ -std=c++20; __device__ and
__forceinline__ defined away) with a driver that, for the benchmark shapes and fresh
random buffers, classifies every tile both ways:
  - interval: kc_expr_mask_tile over the tile, then per element only where undecided
    (what classify_expr_tiles does, without its early exit);
  - brute force: kc_expr_mask on every pair.
Fails if the interval ever claims empty/full for a tile that is not. Prints, per case,
the tiles the interval settles and the predicate evaluations of the old classification
(every pair of every (b, h)) against the new one (undecided tiles only, once per shared
(b, h) row).

  python3 tests/kernels/test_mask_tile_host.py [--cxx c++]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GEN = os.path.join(REPO, "bench", "attention", "generated")

DRIVER = r'''
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
int main(int argc, char** argv) {
  const int B = atoi(argv[1]), H = atoi(argv[2]), Lq = atoi(argv[3]), Lkv = atoi(argv[4]);
  const int BM = atoi(argv[5]), BN = atoi(argv[6]), kind = atoi(argv[7]), sorted = atoi(argv[8]);
  std::mt19937 rng(1234 + sorted);
  kcache::AttentionParams p{};
  std::vector<int> buf;
  if (kind == 0) {  // drafter anchors [B, N]
    const int N = Lq / 16, S = 3072;
    buf.resize(B * N);
    for (auto& a : buf) a = 1 + rng() % S;
    if (sorted) for (int b = 0; b < B; ++b) std::sort(buf.begin() + b * N, buf.begin() + (b + 1) * N);
    p.buffers[0] = {buf.data(), 2, 0, {B, N, 0, 0}, {N, 1, 0, 0}};
  } else if (kind == 2) {  // per-head window [H]
    buf.resize(H);
    for (int h = 0; h < H; ++h) buf[h] = 128 << (h % 4);
    p.buffers[0] = {buf.data(), 1, 0, {H, 0, 0, 0}, {1, 0, 0, 0}};
  }
  const int mt = (Lq + BM - 1) / BM, nt = (Lkv + BN - 1) / BN;
  long long old_evals = (long long)B * H * Lq * Lkv, new_evals = 0, unsound = 0;
  long long tiles = 0, settled = 0, cls_hist[3] = {0, 0, 0};
  long long split_bad = 0;  // kc_expr_mask_rd(kc_expr_mask_row(...)) != kc_expr_mask
  for (int b = 0; b < (KC_EXPR_MASK_READS_B ? B : 1); ++b)
    for (int h = 0; h < (KC_EXPR_MASK_READS_H ? H : 1); ++h)
      for (int m = 0; m < mt; ++m)
        for (int t = 0; t < nt; ++t) {
          const int q0 = m * BM, q1 = std::min(q0 + BM, Lq) - 1;
          const int k0 = t * BN, k1 = std::min(k0 + BN, Lkv) - 1;
          const int c = kc_expr_mask_tile(b, h, q0, q1, k0, k1, p);
          bool any = false, all = true;
          for (int q = q0; q <= q1; ++q) {
#if KC_EXPR_MASK_ROW
            const int4 row = kc_expr_mask_row(b, h, q, p);
#endif
            for (int kv = k0; kv <= k1; ++kv) {
              const bool v = kc_expr_mask(b, h, q, kv, p);
              any = any || v;
              all = all && v;
#if KC_EXPR_MASK_ROW
              split_bad += kc_expr_mask_rd(row, b, h, q, kv, p) != v;
#endif
            }
          }
          const int exact = any ? (all ? 2 : 1) : 0;
          ++tiles;
          ++cls_hist[exact];
          if (c != 1) {
            ++settled;
            if (c != exact) ++unsound;
          } else {
            new_evals += (long long)(q1 - q0 + 1) * (k1 - k0 + 1);
          }
        }
  printf("tiles %lld (empty %lld, partial %lld, full %lld), settled by interval %lld; "
         "predicate evaluations old %.3g, new <= %.3g (%.0fx fewer); unsound %lld; "
         "row split %s, %lld pairs differ\n",
         tiles, cls_hist[0], cls_hist[1], cls_hist[2], settled, (double)old_evals,
         (double)new_evals, new_evals ? (double)old_evals / new_evals : 0.0, unsound,
         KC_EXPR_MASK_ROW ? "on" : "off", split_bad);
  return unsound || split_bad ? 1 : 0;
}
'''

# (generated file, kind, B, H, Lq, Lkv, sorted): the benchmark shapes.
CASES = [
    ("drafter_expr_sm_90a", 0, 2, 32, 8192, 11264, 1),
    ("drafter_expr_sm_90", 0, 2, 32, 8192, 11264, 1),
    ("drafter_expr_sm_90a", 0, 2, 32, 8192, 11264, 0),
    ("neighbourhood_expr_sm_90a", 1, 4, 16, 2304, 2304, 0),
    ("neighbourhood_expr_sm_90", 1, 4, 16, 2304, 2304, 0),
    ("head_window_expr_sm_90a", 2, 2, 16, 8192, 8192, 0),
    ("head_window_expr_sm_90", 2, 2, 16, 8192, 8192, 0),
]


def host_source(path):
    src = open(path).read()
    d = dict(re.findall(r"^#define (KC_\w+) (\S+)$", src, re.M))
    body = src[src.index("// --- generated from the spec's expression trees ---"):
               src.index('#include "attention_fwd.cuh"')]
    # int4 as the device's vector type (kc_expr_mask_row packs into one).
    return d, ("#include <algorithm>\n#define __device__\n#define __forceinline__ inline\n"
               "struct int4 { int x, y, z, w; };\n"
               '#include "kernels/attention_params.h"\n' + body + DRIVER)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    a = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        built = {}
        for name, kind, B, H, Lq, Lkv, srt in CASES:
            d, src = host_source(os.path.join(GEN, name + ".cu"))
            if name not in built:
                cpp = os.path.join(tmp, name + ".cc")
                exe = os.path.join(tmp, name)
                open(cpp, "w").write(src)
                subprocess.run([a.cxx, "-std=c++20", "-O2", "-I", REPO, cpp, "-o", exe],
                               check=True)
                built[name] = exe
            bm, bn = int(d["KC_BLOCK_M"]), int(d["KC_BLOCK_N"])
            for tag, tbm, tbn in (("fwd", bm, bn), ("bwd", int(d.get("KC_BWD_BLOCK_M", 64)),
                                                    int(d.get("KC_BWD_BLOCK_N", 128)))):
                r = subprocess.run([built[name], str(B), str(H), str(Lq), str(Lkv), str(tbm),
                                    str(tbn), str(kind), str(srt)], capture_output=True, text=True)
                print("%-26s %s %s %dx%d: %s" % (name, "sorted" if srt else "random", tag, tbm,
                                                 tbn, r.stdout.strip()))
                bad += r.returncode != 0
    print("FAILED: the interval classification is unsound, or the row split differs from the "
          "predicate" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
