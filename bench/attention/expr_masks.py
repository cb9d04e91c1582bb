"""Expression-mask cases of issue 28, as specs (protobuf JSON) for the real code generator.

Each case is written as a flex_attention mask_mod would be (the Python form is in the
comment) and as the expression tree the Python client records from it. The CUDA
translation units the daemon compiles for them come from `kcache-compile --source
--source-only` (compiler/attention, the real generator) and are kept in generated/
(sm_90 and sm_90a); the GPU machine has no kcache build, so the benchmark and the GPU
tests compile these files with NVRTC as they are. tests/kernels/test_generated_drift.py
(CPU, CI) checks that they are what the generator emits today.

  python3 bench/attention/expr_masks.py --regen [--bin build/bin/kcache-compile]
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GENERATED = os.path.join(HERE, "generated")
ARCHES = ("sm_90", "sm_90a")


def idx(v):
    return {"index": "INDEX_VAR_" + v}


def const(i):
    return {"int_const": i}


def binop(op, a, b):
    return {"binary": {"op": "OP_" + op, "lhs": a, "rhs": b}}


def unop(op, a):
    return {"unary": {"op": "OP_" + op, "arg": a}}


def read(name, *index):
    return {"read": {"buffer": name, "index": list(index)}}


def AND(a, b):
    return binop("AND", a, b)


def OR(a, b):
    return binop("OR", a, b)


# Drafter training shape (BENCHMARKS.md): context S, N blocks of BLK tokens.
DRAFTER_S, DRAFTER_BLK = 3072, 16


def drafter_predicate(S=DRAFTER_S, blk=DRAFTER_BLK):
    # def mask_mod(b, h, q, kv):
    #     j = q // blk
    #     return ((kv < S) & (kv < anchors[b, j])) | ((kv >= S) & ((kv - S) // blk == j))
    q, kv = idx("Q_IDX"), idx("KV_IDX")
    j = binop("FLOORDIV", q, const(blk))
    ctx = AND(binop("LT", kv, const(S)), binop("LT", kv, read("anchors", idx("B"), j)))
    own = AND(binop("GE", kv, const(S)),
              binop("EQ", binop("FLOORDIV", binop("SUB", kv, const(S)), const(blk)), j))
    return OR(ctx, own)


def neighbourhood_predicate(width=48, radius=3):
    # def mask_mod(b, h, q, kv):
    #     return ((q // 48 - kv // 48).abs() <= 3) & ((q % 48 - kv % 48).abs() <= 3)
    q, kv = idx("Q_IDX"), idx("KV_IDX")
    dr = unop("ABS", binop("SUB", binop("FLOORDIV", q, const(width)),
                           binop("FLOORDIV", kv, const(width))))
    dc = unop("ABS", binop("SUB", binop("MOD", q, const(width)), binop("MOD", kv, const(width))))
    return AND(binop("LE", dr, const(radius)), binop("LE", dc, const(radius)))


def head_window_predicate():
    # def mask_mod(b, h, q, kv):
    #     return (kv <= q) & (q - kv < window[h])
    q, kv = idx("Q_IDX"), idx("KV_IDX")
    return AND(binop("LE", kv, q), binop("LT", binop("SUB", q, kv), read("window", idx("H"))))


def spec_json(predicate, buffers, hq, hkv, d=128, backward=True):
    s = {"dtype": "DTYPE_BF16", "head_dim_qk": d, "num_q_heads": hq, "num_kv_heads": hkv,
         "mask": {"expr": {"predicate": predicate}}, "return_lse": True}
    if buffers:
        s["buffers"] = [{"name": n, "type": "ELEM_TYPE_INT32", "rank": r} for n, r in buffers]
    if backward:
        s["backward"] = True
    return s


# name -> spec JSON (the bench shapes; B and sequence lengths are launch values).
CASES = {
    "drafter_expr": spec_json(drafter_predicate(), [("anchors", 2)], 32, 8),
    "neighbourhood_expr": spec_json(neighbourhood_predicate(), [], 16, 16),
    "head_window_expr": spec_json(head_window_predicate(), [("window", 1)], 16, 16),
    # Built-in kinds, forward only, for the numeric check's GPU test
    # (tests/compiler/numeric_check_gpu_test.cc).
    "check_drafter_causal": {"dtype": "DTYPE_BF16", "head_dim_qk": 128, "num_q_heads": 4,
                             "num_kv_heads": 2, "return_lse": True,
                             "mask": {"drafter": {"block_size": 16, "causal_within_block": True}},
                             "score_mod": {"alibi": {}}},
    "check_doc_softcap_fp16": {"dtype": "DTYPE_FP16", "head_dim_qk": 64, "num_q_heads": 4,
                               "num_kv_heads": 2, "return_lse": True,
                               "mask": {"document": {"causal": True}},
                               "score_mod": {"softcap": {"cap": 5.0}}},
}


def generated_path(name, arch):
    return os.path.join(GENERATED, "%s_%s.cu" % (name, arch))


def load_source(name, arch):
    with open(generated_path(name, arch)) as f:
        return f.read()


def generate(name, arch, binary, out_path):
    spec = json.dumps(CASES[name])
    subprocess.run([binary, "-", "--arch=" + arch, "--source=" + out_path, "--source-only"],
                   input=spec.encode(), check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regen", action="store_true")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin", "kcache-compile"))
    a = ap.parse_args()
    if not a.regen:
        print("\n".join(sorted(CASES)))
        return 0
    os.makedirs(GENERATED, exist_ok=True)
    for name in sorted(CASES):
        for arch in ARCHES:
            generate(name, arch, a.bin, generated_path(name, arch))
            print("wrote", generated_path(name, arch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
