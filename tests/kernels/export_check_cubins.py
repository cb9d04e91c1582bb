"""Writes the cubins numeric_check_gpu_test needs into DIR (default .devcarry/check), so
that the GPU machine does not spend its time in NVRTC: for each generated translation
unit in bench/attention/generated/, NAME.cubin (the kernel) and NAME.ref.cubin (its
reference, kernels/attention_ref.cuh), compiled as kc_attn does (its cubin cache); plus
fault.cu / fault.cubin / fault.ref.cubin: one forward-only kernel with the fault
switch's wrong scale and the right reference.

  python3 tests/kernels/export_check_cubins.py [DIR]
"""

import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "bench", "attention"))
import kc_attn as K  # noqa: E402
import expr_masks as E  # noqa: E402


def ref_source(src):
    return src[:src.index('#include "attention_fwd.cuh"')] + '#include "attention_ref.cuh"\n'


def forward_only(src):
    src = src.replace("#define KC_BACKWARD 1", "#define KC_BACKWARD 0")
    return src.replace('#include "attention_bwd.cuh"\n', "")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, ".devcarry", "check")
    os.makedirs(out, exist_ok=True)
    jobs = []
    for name in sorted(E.CASES):
        for arch in E.ARCHES:
            src = E.load_source(name, arch)
            sp = K.generated_spec(src)
            jobs.append(("%s_%s" % (name, arch), sp, dict(sp, source=ref_source(src),
                                                          backward=False)))
    base = E.load_source("neighbourhood_expr", "sm_90a")
    good = forward_only(base)
    bad = re.sub(r"#define KC_SOFTMAX_SCALE (\S+)",
                 lambda m: "#define KC_SOFTMAX_SCALE (1.25f * %s)" % m.group(1), good)
    fsp = dict(K.generated_spec(good), source=bad, backward=False)
    jobs.append(("fault", fsp, dict(fsp, source=ref_source(good))))
    specs = [s for _, a, b in jobs for s in (a, b)]
    res = K.compile_many(specs)
    errs = [e for _, e in res if e]
    if errs:
        print(errs[0][-2000:])
        return 1
    for (name, a, b), i in zip(jobs, range(0, len(res), 2)):
        with open(os.path.join(out, name + ".cubin"), "wb") as f:
            f.write(res[i][0][0])
        with open(os.path.join(out, name + ".ref.cubin"), "wb") as f:
            f.write(res[i + 1][0][0])
    with open(os.path.join(out, "fault.cu"), "w") as f:
        f.write(bad)
    print("wrote %d kernel/reference pairs to %s" % (len(jobs), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
