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
bench/attention/bwd_launch_model.py's Python copies of bands_for and launch_order_bands are
checked against the compiled ones too.

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

// `dump`: bands_for's choice for 1-300 pairs and launch_order_bands' sequence of some grids,
// for the Python copy of both in bench/attention/bwd_launch_model.py to be checked against.
static void dump() {
  for (int pairs = 1; pairs <= 300; ++pairs) {
    int lead = 0, band = 0;
    bands_for(pairs, lead, band);
    printf("B %d %d %d\n", pairs, lead, band);
  }
  struct G { int nt, ny, nz, lead, band; };
  for (const G& g : {G{88, 8, 2, 8, 4}, G{88, 8, 4, 0, 8}, G{88, 8, 8, 0, 16}, G{32, 8, 1, 8, 4},
                     G{7, 3, 2, 8, 4}, G{33, 5, 3, 3, 5}}) {
    gridDim = {g.nt, g.ny, g.nz};
    printf("S %d %d %d %d %d", g.nt, g.ny, g.nz, g.lead, g.band);
    for (int lin = 0; lin < g.nt * g.ny * g.nz; ++lin) {
      blockIdx = {lin % g.nt, lin / g.nt % g.ny, lin / (g.nt * g.ny)};
      int t = 0, y = 0, z = 0;
      launch_order_bands(t, y, z, g.lead, g.band);
      printf(" %d,%d", t, y + g.ny * z);
    }
    printf("\n");
  }
}

int main(int argc, char** argv) {
  if (argc > 1) {
    dump();
    return 0;
  }
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


def model_mismatches(dump):
    """Where bench/attention/bwd_launch_model.py's copies of bands_for and launch_order_bands
    (kernel_bands, bands) differ from the kernel's, from the driver's `dump` lines."""
    sys.path.insert(0, os.path.join(REPO, "bench", "attention"))
    import bwd_launch_model as model
    out = []
    for line in dump.splitlines():
        f = line.split()
        if f[0] == "B":
            pairs, lead, band = map(int, f[1:])
            if model.kernel_bands(pairs) != (lead, band):
                out.append("bands_for(%d) = (%d, %d), the model's kernel_bands %r"
                           % (pairs, lead, band, model.kernel_bands(pairs)))
        else:
            nt, ny, nz, lead, band = map(int, f[1:6])
            kernel = [tuple(int(v) for v in cta.split(",")) for cta in f[6:]]
            sh = argparse.Namespace(pairs=ny * nz, nkt=nt)
            if [(t, pr) for pr, t in model.bands(sh, lead, band)] != kernel:
                out.append("launch_order_bands on %d x %d x %d, lead %d, band %d: the model's "
                           "bands() gives another sequence" % (nt, ny, nz, lead, band))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cpp, exe = os.path.join(tmp, "launch_order.cc"), os.path.join(tmp, "launch_order")
        open(cpp, "w").write(host_source())
        subprocess.run([a.cxx, "-std=c++20", "-O2", cpp, "-o", exe], check=True)
        r = subprocess.run([exe], capture_output=True, text=True)
        dump = subprocess.run([exe, "dump"], capture_output=True, text=True, check=True).stdout
    print(r.stdout.strip())
    model = model_mismatches(dump)
    if model:
        print("\n".join(model[:5]))
    if r.returncode:
        print("FAILED: a launch order is not a permutation of its grid, or bands_for changed")
    elif model:
        print("FAILED: bench/attention/bwd_launch_model.py no longer models the kernel's order")
    else:
        print("ok")
    return 1 if r.returncode or model else 0


if __name__ == "__main__":
    sys.exit(main())
