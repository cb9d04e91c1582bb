#!/usr/bin/env python3
"""Issue 27's compile budget: NVRTC CPU time, wall time and peak memory of the sm_90a
attention modules, compiled in process on this machine (no GPU needed), one process per
module so that each peak RSS is its own.

  python3 bench/attention/compile_budget.py [--repeat N]

--repeat N compiles each module N times (each in its own process, the modules interleaved)
and prints the minimum CPU and wall time, the largest CPU time beside it, and the largest
peak RSS: on a shared machine single runs vary by +-15 % (2026-12-02).
"""
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "kernels"))
sys.path.insert(0, HERE)

REFERENCE = ("mma_sync_causal", False)
CASES = [REFERENCE, ("causal", False), ("causal", True), ("drafter", False), ("drafter", True),
         ("drafter_expr", True), ("neighbourhood_expr", True), ("head_window_expr", True)]


def one(name, backward):
    import kc_attn as K
    if name == REFERENCE[0]:
        spec = K.make_spec("bf16", 128, 128, mask="causal", tiles=K.select_tiles(80, 128, 128),
                           arch=80)
    elif name.endswith("_expr"):
        import expr_masks as E
        spec = K.generated_spec(E.load_source(name, "sm_90a"))
    else:
        spec = K.make_spec("bf16", 128, 128, mask=name, tiles=K.select_tiles(90, 128, 128, True),
                           sm90a=True, backward=backward)
    wall, cpu = time.time(), time.process_time()
    K.nvrtc_compile(K.prelude(spec), arch=spec["arch"], sm90a=spec["sm90a"])
    print("%.4f %.4f %d" % (time.process_time() - cpu, time.time() - wall,
                            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3] == "1")
        return 0
    repeat = 1
    if len(sys.argv) == 3 and sys.argv[1] == "--repeat" and sys.argv[2].isdigit() \
            and int(sys.argv[2]) >= 1:
        repeat = int(sys.argv[2])
    elif len(sys.argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("bf16, D128, sm_90a but the reference (sm_80); load average %.1f%s" % (
        os.getloadavg()[0], "; min of %d runs" % repeat if repeat > 1 else ""))
    runs = {case: [] for case in CASES}
    for _ in range(repeat):
        for name, bwd in CASES:
            out = subprocess.run([sys.executable, __file__, "--one", name, "1" if bwd else "0"],
                                 check=True, capture_output=True, text=True).stdout.split()
            runs[(name, bwd)].append((float(out[0]), float(out[1]), int(out[2])))
    ref = min(x[0] for x in runs[REFERENCE])
    for (name, bwd), r in runs.items():
        spread = " (max cpu %5.2f s)" % max(x[0] for x in r) if repeat > 1 else ""
        cpu = min(x[0] for x in r)
        print("%-20s %-16s cpu %5.2f s = %4.1fx ref  wall %5.2f s  peak RSS %4d MB%s" % (
            name, "forward+backward" if bwd else "forward", cpu, cpu / ref,
            min(x[1] for x in r), max(x[2] for x in r), spread))
    return 0


if __name__ == "__main__":
    sys.exit(main())
