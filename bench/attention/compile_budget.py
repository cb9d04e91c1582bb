#!/usr/bin/env python3
"""Issue 27's compile budget: NVRTC CPU time, wall time and peak memory of the sm_90a
attention modules, compiled in process on this machine (no GPU needed), one process per
module so that each peak RSS is its own.

  python3 bench/attention/compile_budget.py [--repeat N] [--whole]

A module with backward compiles as two units, each into an image of its own, on two
threads at once (compiler/attention/codegen.h, CompileUnits in compiler/cuda/nvrtc.h): the
budget (<= 2 s of CPU) holds per unit, so the row gives each unit's CPU time (its thread's),
the module's total, its wall time (the units in parallel) and the process's peak RSS (both
units' NVRTC at once, as in a compile worker). --whole compiles every module as one
program instead (what the daemon did before, for comparison).

--repeat N compiles each module N times (each in its own process, the modules interleaved)
and prints the minimum CPU and wall times, the largest total CPU beside them, and the
largest peak RSS: on a shared machine single runs vary by +-15 % (2026-12-02).
"""
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "kernels"))
sys.path.insert(0, HERE)

REFERENCE = ("mma_sync_causal", False)
# A name is a mask, optionally _d64 (head dim 64; its default is three warpgroups over 192
# rows), _tBN (a tuned block_n: the ping-pong's 176-key tiles) and _mBM (a tuned block_m, 16
# rows a warp), or a generated expression module (_expr).
CASES = [REFERENCE, ("causal", False), ("causal", True), ("drafter", False), ("drafter", True),
         ("none", False), ("none_t176", False), ("causal_d64", False), ("causal_d64", True),
         ("drafter_expr", True), ("neighbourhood_expr", True), ("head_window_expr", True)]


def one(name, backward, whole=False):
    import kc_attn as K
    if name == REFERENCE[0]:
        spec = K.make_spec("bf16", 128, 128, mask="causal", tiles=K.select_tiles(80, 128, 128),
                           arch=80)
    elif name.endswith("_expr"):
        import expr_masks as E
        spec = K.generated_spec(E.load_source(name, "sm_90a"))
    else:
        import re
        mask, d64, bn, bm = re.fullmatch(r"([a-z]+)(_d64)?(?:_t(\d+))?(?:_m(\d+))?",
                                         name).groups()
        d = 64 if d64 else 128
        tiles = K.select_tiles(90, d, d, True, mask)
        if bn:
            tiles = (tiles[0], int(bn)) + tuple(tiles[2:])
        if bm:
            tiles = (int(bm), tiles[1], int(bm) // 16, tiles[3])
        spec = K.make_spec("bf16", d, d, mask=mask, tiles=tiles, sm90a=True, backward=backward)
    source = K.prelude(spec)
    units = [source] if whole else K.module_units(source)
    unit_cpu = [0.0] * len(units)

    def compile_unit(i):
        t = time.thread_time()
        K.nvrtc_compile(units[i], arch=spec["arch"], sm90a=spec["sm90a"])
        unit_cpu[i] = time.thread_time() - t

    import threading
    wall, cpu = time.time(), time.process_time()
    threads = [threading.Thread(target=compile_unit, args=(i,)) for i in range(1, len(units))]
    for t in threads:
        t.start()
    compile_unit(0)  # ctypes releases the GIL: the units compile at once
    for t in threads:
        t.join()
    print("%.4f %.4f %d %s" % (time.process_time() - cpu, time.time() - wall,
                               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                               " ".join("%.4f" % c for c in unit_cpu)))


def main():
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3] == "1", sys.argv[4:] == ["--whole"])
        return 0
    args = sys.argv[1:]
    whole = "--whole" in args
    if whole:
        args.remove("--whole")
    repeat = 1
    if len(args) == 2 and args[0] == "--repeat" and args[1].isdigit() and int(args[1]) >= 1:
        repeat = int(args[1])
    elif args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("bf16, D128 unless _d64, sm_90a but the reference (sm_80); %s; load average %.1f%s" % (
        "each module as one program (--whole)" if whole else
        "a module with backward as two units at once", os.getloadavg()[0],
        "; min of %d runs" % repeat if repeat > 1 else ""))
    runs = {case: [] for case in CASES}
    for _ in range(repeat):
        for name, bwd in CASES:
            out = subprocess.run([sys.executable, __file__, "--one", name, "1" if bwd else "0"]
                                 + (["--whole"] if whole else []),
                                 check=True, capture_output=True, text=True).stdout.split()
            runs[(name, bwd)].append((float(out[0]), float(out[1]), int(out[2]),
                                      [float(x) for x in out[3:]]))
    ref = min(x[0] for x in runs[REFERENCE])
    for (name, bwd), r in runs.items():
        spread = " (max total %5.2f s)" % max(x[0] for x in r) if repeat > 1 else ""
        cpu = min(x[0] for x in r)
        per_unit = ""
        if len(r[0][3]) > 1:
            cols = [[x[3][i] for x in r] for i in range(len(r[0][3]))]
            per_unit = "  units %s" % " / ".join("%.2f" % min(c) for c in cols)
            if repeat > 1:
                per_unit += " (median %s)" % " / ".join("%.2f" % statistics.median(c)
                                                        for c in cols)
        print("%-20s %-16s cpu %5.2f s = %4.1fx ref%s  wall %5.2f s  peak RSS %4d MB%s" % (
            name, "forward+backward" if bwd else "forward", cpu, cpu / ref, per_unit,
            min(x[1] for x in r), max(x[2] for x in r), spread))
    return 0


if __name__ == "__main__":
    sys.exit(main())
