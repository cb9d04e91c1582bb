#!/usr/bin/env python3
"""Issue 27's compile budget: NVRTC CPU time, wall time and peak memory of the sm_90a
attention modules, compiled in process on this machine (no GPU needed), one process per
module so that each peak RSS is its own.

  python3 bench/attention/compile_budget.py
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

CASES = [("causal", False), ("causal", True), ("drafter", False), ("drafter", True),
         ("drafter_expr", True), ("neighbourhood_expr", True), ("head_window_expr", True)]


def one(name, backward):
    import kc_attn as K
    if name.endswith("_expr"):
        import expr_masks as E
        spec = K.generated_spec(E.load_source(name, "sm_90a"))
    else:
        spec = K.make_spec("bf16", 128, 128, mask=name, tiles=K.select_tiles(90, 128, 128, True),
                           sm90a=True, backward=backward)
    wall, cpu = time.time(), time.process_time()
    K.nvrtc_compile(K.prelude(spec), arch=spec["arch"], sm90a=True)
    print("%-20s %-16s cpu %5.2f s  wall %5.2f s  peak RSS %4d MB" % (
        name, "forward+backward" if backward else "forward", time.process_time() - cpu,
        time.time() - wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))


def main():
    if len(sys.argv) == 3:
        one(sys.argv[1], sys.argv[2] == "1")
        return 0
    print("sm_90a, bf16, D128; load average %.1f" % os.getloadavg()[0])
    for name, bwd in CASES:
        subprocess.run([sys.executable, __file__, name, "1" if bwd else "0"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
