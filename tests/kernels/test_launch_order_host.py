"""CPU test (CI): the attention kernels' launch orders are permutations of their grids.

The dK/dV kernel under GQA maps each CTA's linear block index to (key tile, key head, batch)
by launch_order_bands, with the lead and band width bands_for picks from the pair count;
one-head-per-key-head launches and the forward use launch_order. A CTA that two block indices
map to is computed twice and another never (its dK / dV rows stay unwritten), and the GPU
suites draw at most 6 (batch, key head) pairs, where bands_for keeps its lead of 8 and bands
of 4. So this compiles those functions, as they are in kernels/, as host C++ (c++ -std=c++20;
__device__ and __forceinline__ defined away, gridDim and blockIdx as globals) with a driver
that walks every block index of many grids, under bands_for's choice and under fixed leads and
bands, and checks that each (tile, y, z) comes exactly once, that a lead's tiles come first,
and bands_for's choices at the pair counts measured in kernels/NOTES.md (sessions 28-29).

  python3 tests/kernels/test_launch_order_host.py [--cxx c++]
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

PRELUDE = r'''
#include <cstdio>
#include <vector>
#define __device__
#define __forceinline__ inline
struct Dim3 { int x, y, z; };
static Dim3 gridDim, blockIdx;
inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }
'''

DRIVER = r'''
// Walks every block index of an (nt, ny, nz) grid through `order`; returns the failures.
template <typename Order>
static int check_grid(int nt, int ny, int nz, int lead, Order order, const char* what) {
  gridDim = {nt, ny, nz};
  std::vector<int> seen(static_cast<size_t>(nt) * ny * nz, 0);
  int bad = 0;
  for (int z = 0; z < nz; ++z)
    for (int y = 0; y < ny; ++y)
      for (int x = 0; x < nt; ++x) {
        blockIdx = {x, y, z};
        const int lin = x + nt * (y + ny * z);
        int tile = -1, oy = -1, oz = -1;
        order(tile, oy, oz);
        if (tile < 0 || tile >= nt || oy < 0 || oy >= ny || oz < 0 || oz >= nz) {
          if (bad++ < 5) printf("%s grid %d x %d x %d: block %d -> (%d, %d, %d) out of range\n",
                                what, nt, ny, nz, lin, tile, oy, oz);
          continue;
        }
        ++seen[tile + static_cast<size_t>(nt) * (oy + ny * oz)];
        // The lead's tiles (the heavy ones) are the first lead * ny * nz blocks.
        if (lin < imin(lead, nt) * ny * nz && tile >= lead) {
          if (bad++ < 5) printf("%s grid %d x %d x %d: block %d in the lead -> tile %d\n", what, nt,
                                ny, nz, lin, tile);
        }
      }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != 1 && bad++ < 5) {
      printf("%s grid %d x %d x %d: CTA %zu launched %d times\n", what, nt, ny, nz, i, seen[i]);
    }
  }
  return bad;
}

int main() {
  int bad = 0;
  long long grids = 0;
  // bands_for's choices where they were measured (H100, kernels/NOTES.md).
  struct Want { int pairs, lead, band; };
  for (const Want& w : {Want{8, 8, 4}, Want{16, 8, 4}, Want{32, 0, 8}, Want{64, 0, 16},
                        Want{128, 0, 16}}) {
    int lead = -1, band = -1;
    bands_for(w.pairs, lead, band);
    if (lead != w.lead || band != w.band) {
      printf("bands_for(%d) = lead %d, band %d; measured best: lead %d, band %d\n", w.pairs, lead,
             band, w.lead, w.band);
      ++bad;
    }
  }
  const int tiles[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 31, 32, 33, 64, 88, 100};
  for (int nt : tiles)
    for (int ny = 1; ny <= 9; ++ny)
      for (int nz = 1; nz <= 9; ++nz) {
        int lead = 0, band = 0;
        bands_for(ny * nz, lead, band);
        bad += check_grid(nt, ny, nz, lead, [&](int& t, int& y, int& z) {
          launch_order_bands(t, y, z, lead, band);
        }, "bands_for");
        for (int fl : {0, 1, 3, 8, 1000})
          for (int fb : {1, 2, 4, 5, 8, 16}) {
            bad += check_grid(nt, ny, nz, fl, [&](int& t, int& y, int& z) {
              launch_order_bands(t, y, z, fl, fb);
            }, "launch_order_bands");
          }
        for (int chunk : {1, 2, 4, 0x7fffffff}) {
          bad += check_grid(nt, ny, nz, 0, [&](int& t, int& y, int& z) {
            launch_order(t, y, z, chunk);
          }, "launch_order");
        }
        grids += 1 + 5 * 6 + 4;
      }
  printf("%lld grid walks, %d failures\n", grids, bad);
  return bad ? 1 : 0;
}
'''


def function_text(src, signature):
    """The text of the function whose definition starts with `signature`: up to the first
    closing brace at the start of a line."""
    i = src.index(signature)
    return src[i:src.index("\n}\n", i) + 3]


def host_source():
    fwd = open(os.path.join(REPO, "kernels", "attention_fwd.cuh")).read()
    bwd = open(os.path.join(REPO, "kernels", "attention_bwd.cuh")).read()
    # From the switches to the end of launch_order_bands: the switches, the constants and
    # bands_for, all as the kernel compiles them.
    start = bwd.index("#ifndef KC_BWD_LEAD")
    bands = bwd[start:]
    bands = bands[:bands.index("\n}\n", bands.index("void launch_order_bands(")) + 3]
    return (PRELUDE + function_text(fwd, "__device__ __forceinline__ void launch_order(")
            + bands + DRIVER)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cpp, exe = os.path.join(tmp, "launch_order.cc"), os.path.join(tmp, "launch_order")
        open(cpp, "w").write(host_source())
        subprocess.run([a.cxx, "-std=c++20", "-O2", cpp, "-o", exe], check=True)
        r = subprocess.run([exe], capture_output=True, text=True)
    print(r.stdout.strip())
    print("FAILED: a launch order is not a permutation of its grid, or bands_for changed"
          if r.returncode else "ok")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
