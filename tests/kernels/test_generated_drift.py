"""CPU drift test (CI): tests/kernels/kc_attn.py is a second writer of the generated
prelude (its make_spec/prelude predate `kcache-compile --source`), and
bench/attention/generated/ keeps translation units of the real generator for the GPU
machine, which has no kcache build. This test keeps both honest against
compiler/attention (through kcache-compile --source-only, no NVRTC):

  1. every file in bench/attention/generated/ is byte for byte what the generator
     writes today for its case in bench/attention/expr_masks.py;
  2. for a set of built-in specs, kc_attn.prelude() has the same KC_* defines (same
     values) and the same includes, in the same order, as the generator's translation
     unit. Expression bodies are not compared: the tests' hand-written ones
     (kc_attn.EXPR_*) are not generated; the expression cases use the generated files.

  python3 tests/kernels/test_generated_drift.py BIN   (BIN: build/bin/kcache-compile)
"""

import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "bench", "attention"))
import kc_attn as K  # noqa: E402
import expr_masks as E  # noqa: E402


def generate(binary, spec_json, arch):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "k.cu")
        subprocess.run([binary, "-", "--arch=" + arch, "--source=" + out, "--source-only"],
                       input=json.dumps(spec_json).encode(), check=True)
        with open(out) as f:
            return f.read()


def _value(v):
    v = v.strip("()")
    try:
        return int(v)
    except ValueError:
        return float.fromhex(v.rstrip("f"))


def shape(src):
    """The KC_* defines (name, value; numbers compared as numbers, so that "(-1)" and "-1",
    or two spellings of one hex float, agree) and the includes of a translation unit, in
    order. KC_DRAFTER_* are left out unless the mask is the drafter's (other masks never
    read them; kc_attn writes its default block of 16 there, the generator 0)."""
    out = []
    drafter = re.search(r"^#define KC_MASK 4$", src, re.M) is not None
    for ln in src.splitlines():
        m = re.match(r"\s*#define (KC_\w+) (\S+)\s*$", ln)
        if m:
            if m.group(1).startswith("KC_DRAFTER_") and not drafter:
                continue
            out.append((m.group(1), _value(m.group(2))))
        elif re.match(r'\s*#include "', ln):
            out.append(ln.strip())
    return out


def builtin_pairs():
    """(description, spec JSON, arch, kc_attn spec) that must agree."""
    out = []
    base = {"dtype": "DTYPE_BF16", "head_dim_qk": 128, "num_q_heads": 8, "num_kv_heads": 8,
            "return_lse": True}
    masks = [
        ("causal", {"causal": {}}, dict(mask="causal")),
        ("causal_br", {"causal": {"alignment": "CAUSAL_ALIGNMENT_BOTTOM_RIGHT"}},
         dict(mask="causal", bottom_right=True)),
        ("window", {"sliding_window": {"left": 37, "right": 0}}, dict(mask="window", window=(37, 0))),
        ("doc_causal", {"document": {"causal": True}}, dict(mask="document", doc_causal=True)),
        ("drafter", {"drafter": {"block_size": 16, "causal_within_block": True}},
         dict(mask="drafter", drafter_block=16, drafter_causal=True)),
        ("none", {"none": {}}, dict(mask="none")),
    ]
    for name, m, kw in masks:
        for arch, sm90a in (("sm_90", False), ("sm_90a", True)):
            for bwd in (False, True):
                s = dict(base, mask=m)
                if bwd:
                    s["backward"] = True
                out.append(("%s %s%s" % (name, arch, " bwd" if bwd else ""), s, arch,
                            K.make_spec("bf16", 128, 128, sm90a=sm90a, backward=bwd, **kw)))
    s = dict(base, mask={"causal": {}}, score_mod={"softcap": {"cap": 30.0}})
    out.append(("softcap sm_90", s, "sm_90", K.make_spec("bf16", 128, 128, mask="causal",
                                                          score="softcap", softcap=30.0)))
    return out


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build", "bin",
                                                                 "kcache-compile")
    bad = []
    n = 0
    for name in sorted(E.CASES):
        for arch in E.ARCHES:
            n += 1
            want = generate(binary, E.CASES[name], arch)
            path = E.generated_path(name, arch)
            have = open(path).read() if os.path.exists(path) else None
            if have != want:
                bad.append("%s is stale: run python3 bench/attention/expr_masks.py --regen"
                           % os.path.relpath(path, REPO))
    for desc, sj, arch, spec in builtin_pairs():
        n += 1
        gen = shape(generate(binary, sj, arch))
        mine = shape(K.prelude(spec))
        if gen != mine:
            diff = [(a, b) for a, b in zip(gen + [""] * len(mine), mine + [""] * len(gen))
                    if a != b][:4]
            bad.append("kc_attn.prelude differs from the generator for %s: %s" % (desc, diff))
    for b in bad:
        print("FAIL", b)
    print("%d checks, %d failed" % (n, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
