"""GPU test (label gpu; skips without a GPU): the numeric check before serve (issue 28) on
every forward variant of the kernel suite and on the generated expression-mask cases.

For each variant: the kernel, and beside it the plain reference kernel
(kernels/attention_ref.cuh: one thread per row, fp32) compiled from the same prelude
with attention_ref.cuh in place of attention_fwd.cuh, run on small random inputs that
exercise the mask and the score modification (test_attention_fwd.build_case). It checks
  - the reference kernel against the torch reference of test_attention_fwd (the
    reference is right), and
  - the kernel against the reference kernel, with the check's tolerance (rel L2 of O
    <= 2e-2 bf16 / 5e-3 fp16, no NaN, fully masked rows O == 0): what the daemon's
    check does (compiler/numeric_check.h).
Then the fault switch: one kernel compiled with KC_SOFTMAX_SCALE off by 25 % in its own
translation unit only (the reference keeps the right one) must FAIL the check.

  python3 tests/kernels/test_numeric_check.py [--select RE] [--cases 2] [--log F]
"""

import argparse
import random
import re
import sys
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "attention"))
import kc_attn as K  # noqa: E402
import test_attention_fwd as T  # noqa: E402

TOL = {"bf16": 2e-2, "fp16": 5e-3}


def ref_source(spec):
    """The reference kernel's translation unit: the kernel's prelude with
    attention_ref.cuh in place of the attention templates."""
    src = K.prelude(spec)
    src = re.sub(r'#if KC_BACKWARD\n#include "attention_bwd.cuh"\n#endif\n', "", src)
    src = src.replace('#include "attention_bwd.cuh"\n', "")
    assert '#include "attention_fwd.cuh"' in src
    return src.replace('#include "attention_fwd.cuh"', '#include "attention_ref.cuh"')


def load_ref(spec):
    import ctypes
    sp = dict(spec, source=ref_source(spec), backward=False)
    cubin, _ = K.compile_spec(sp)
    cu = K._lib_cuda()
    buf = ctypes.create_string_buffer(cubin, len(cubin))
    mod = ctypes.c_void_p()
    K._check(cu.cuModuleLoadData(ctypes.byref(mod), buf), "cuModuleLoadData(ref)")
    fn = ctypes.c_void_p()
    K._check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"kcache_attn_ref_fwd"), "ref fn")
    return (buf, mod, fn)


def run_ref(torch, kern, ref, spec, c):
    """O (fp32) and LSE of the reference kernel for case c (mask inputs as run_kernel)."""
    B, Hq, Lq = c["B"], c["Hq"], c["Lq"]
    o = torch.full((B, Hq, Lq, spec["dv"]), float("nan"), device="cuda", dtype=torch.float32)
    lse = torch.full((B, Hq, Lq), float("nan"), device="cuda", dtype=torch.float32)
    p = K.make_params(c["q"], c["k"], c["v"], o, lse)
    saved_o, c["o"] = c["o"], o
    try:
        keep = []
        # the same mask inputs as the kernel (set by run_kernel's code path)
        if spec["mask"] == "document":
            p.q_seq_id, p.kv_seq_id = c["qid"].data_ptr(), c["kvid"].data_ptr()
            p.q_seq_id_stride_b, p.kv_seq_id_stride_b = c["qid"].stride(0), c["kvid"].stride(0)
        if spec["mask"] == "drafter":
            p.drafter_anchor = c["anchor"].data_ptr()
            p.drafter_keep = c["keep"].data_ptr() if c["keep"] is not None else None
            p.drafter_stride_b = c["dstride"]
            p.drafter_context_len, p.drafter_num_blocks = c["S"], c["N"]
        if spec["score"] == "alibi":
            p.alibi_slopes = c["slopes"].data_ptr()
        for i, t in c.get("buffers", {}).items():
            K.set_buffer(p, i, t)
        if "prefix" in c:
            K.set_buffer(p, 0, c["prefix"])
            K.set_buffer(p, 1, c["bias"])
        kern._launch(ref[2], (-(-Lq // 128), Hq, B), 128, 0, p)
        torch.cuda.synchronize()
        del keep
    finally:
        c["o"] = saved_o
    return o, lse


def compare(torch, spec, o, o_ref, lse_ref):
    """The check: (ok, rel L2, max abs diff, message)."""
    o = o.double()
    o_ref = o_ref.double()
    if torch.isnan(o).any():
        return False, float("nan"), float("nan"), "NaN in O"
    dead = torch.isinf(lse_ref) & (lse_ref < 0)
    if dead.any() and not torch.equal(o[dead], torch.zeros_like(o[dead])):
        return False, float("nan"), float("nan"), "fully masked rows: O != 0"
    diff = (o - o_ref).abs()
    worst = diff.max().item() if diff.numel() else 0.0
    den = o_ref.norm().item()
    rel = (o - o_ref).norm().item() / den if den > 0 else worst
    ok = rel <= TOL[spec["dtype"]]
    return ok, rel, worst, "" if ok else "rel L2 %.3e > %.1e" % (rel, TOL[spec["dtype"]])


def generated_variants():
    import expr_masks as E
    out = []
    for name in sorted(n for n in E.CASES if n.endswith("_expr")):
        for arch in E.ARCHES:
            sp = K.generated_spec(E.load_source(name, arch))
            out.append(("gen_%s_%s" % (name, arch), sp))
    return out


def generated_case(torch, name, spec, rng):
    """Small inputs for a generated case: its buffers, shapes that fit its constants."""
    B = 2
    if "drafter" in name:
        S, N, blk = 3072, rng.choice([8, 24]), 16
        Lq, Lkv = N * blk, S + N * blk
        anc = torch.randint(0, S + 1, (B, N), device="cuda", dtype=torch.int32)
        bufs = {0: anc}
    elif "neighbourhood" in name:
        Lq = Lkv = 48 * rng.choice([5, 9])
        bufs = {}
    else:
        Lq = Lkv = rng.choice([300, 517])
        bufs = {0: torch.randint(1, 200, (spec.get("_h", 16),), device="cuda",
                                 dtype=torch.int32)}
    Hq = 32 if "drafter" in name else 16
    Hkv = 8 if "drafter" in name else 16
    dt = torch.bfloat16
    c = dict(B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lkv=Lkv, buffers=bufs)
    c["q"] = torch.randn(B, Hq, Lq, spec["dqk"], device="cuda", dtype=dt)
    c["k"] = torch.randn(B, Hkv, Lkv, spec["dqk"], device="cuda", dtype=dt)
    c["v"] = torch.randn(B, Hkv, Lkv, spec["dv"], device="cuda", dtype=dt)
    c["o"] = torch.empty(B, Hq, Lq, spec["dv"], device="cuda", dtype=dt)
    c["lse"] = torch.empty(B, Hq, Lq, device="cuda", dtype=torch.float32)
    return c


def run_generated_kernel(torch, kern, spec, c):
    p = K.make_params(c["q"], c["k"], c["v"], c["o"], c["lse"])
    for i, t in c["buffers"].items():
        K.set_buffer(p, i, t)
    tc = kern.new_tile_classes(p)
    kern.launch_mask_build(p)
    kern.launch(p)
    torch.cuda.synchronize()
    return tc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--select", default=None)
    ap.add_argument("--cases", type=int, default=2, help="inputs per variant")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--log", default=None)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    vs = [(n, sp) for n, sp in T.variants()] + generated_variants()
    if args.select:
        vs = [(n, sp) for n, sp in vs if re.search(args.select, n)]
    t0 = time.time()
    specs = []
    for _, sp in vs:
        specs += [sp, dict(sp, source=ref_source(sp), backward=False)]
    fault_name, fault_spec = next((n, sp) for n, sp in T.variants() if n == "bf16_d128_causal")
    fault = dict(fault_spec, source=re.sub(
        r"#define KC_SOFTMAX_SCALE (\S+)",
        lambda m: "#define KC_SOFTMAX_SCALE (1.25f * %s)" % m.group(1), K.prelude(fault_spec)))
    specs.append(fault)
    res = K.compile_many(specs)
    errs = [e for _, e in res if e]
    print("compiled %d kernels in %.1fs, %d failed" % (len(specs), time.time() - t0, len(errs)),
          flush=True)
    for e in errs[:3]:
        print("COMPILE FAIL", e[-1500:])
    if args.compile_only or errs:
        return 1 if errs else 0
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError("no GPU")
    except ImportError as e:
        print("SKIP: %s" % e)
        return 0
    logf = open(args.log, "w") if args.log else None
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    npass = nfail = 0
    lines = []
    for name, spec in vs:
        cubin, _ = K.compile_spec(spec)
        kern = K.Kernel(spec, cubin)
        ref = load_ref(spec)
        for i in range(args.cases):
            t = time.time()
            if name.startswith("gen_"):
                c = generated_case(torch, name, spec, rng)
                run_generated_kernel(torch, kern, spec, c)
                o_ref, lse_ref = run_ref(torch, kern, ref, spec, c)
                ref_ok = True
                note = ""
            else:
                c = T.build_case(torch, spec, rng)
                hold = T.run_kernel(torch, kern, spec, c)
                o_ref, lse_ref = run_ref(torch, kern, ref, spec, c)
                # The reference kernel itself against the torch reference.
                o_t, lse_t = T.reference(torch, spec, c)
                rmsgs = []
                live = ~(torch.isinf(lse_t) & (lse_t < 0))
                rerr = ((o_ref.double() - o_t.double()).norm() /
                        max(o_t.double().norm().item(), 1e-30)).item()
                if not rerr <= 1e-4:
                    rmsgs.append("ref kernel vs torch rel L2 %.2e" % rerr)
                if live.any() and not ((lse_ref[live].double() - lse_t[live].double()).abs().max()
                                       .item() <= 1e-3):
                    rmsgs.append("ref kernel LSE")
                ref_ok = not rmsgs
                note = "; ".join(rmsgs)
                del hold
            ok, rel, worst, msg = compare(torch, spec, c["o"], o_ref, lse_ref)
            good = ok and ref_ok
            npass += good
            nfail += not good
            line = "%-48s case %d Lq%d Lkv%d rel %.2e worst %.2e %.2fs %s %s %s" % (
                name, i, c["Lq"], c["Lkv"], rel, worst, time.time() - t,
                "pass" if good else "FAIL", msg, note)
            lines.append(line)
            if logf:
                logf.write(line + "\n")
            if not good:
                print(line, flush=True)
    # The fault switch: a wrong kernel must be refused.
    kern = K.Kernel(fault, K.compile_spec(fault)[0])
    ref = load_ref(fault_spec)
    c = T.build_case(torch, fault_spec, rng)
    hold = T.run_kernel(torch, kern, fault_spec, c)
    o_ref, lse_ref = run_ref(torch, kern, ref, fault_spec, c)
    ok, rel, worst, msg = compare(torch, fault_spec, c["o"], o_ref, lse_ref)
    del hold
    fault_caught = not ok
    print("fault switch (%s, scale x1.25 in the kernel only): %s (rel %.2e, worst %.2e)" % (
        fault_name, "refused" if fault_caught else "NOT CAUGHT", rel, worst))
    print("numeric check: %d/%d variant-cases passed (%d variants)" % (
        npass, npass + nfail, len(vs)))
    return 0 if nfail == 0 and fault_caught else 1


if __name__ == "__main__":
    sys.exit(main())
