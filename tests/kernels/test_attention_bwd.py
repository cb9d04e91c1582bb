"""GPU correctness harness for the attention backward (kernels/attention_bwd.cuh).

Each case runs our forward (kcache_attn_fwd of the backward spec's cubin; its
LSE is the only state the backward gets) and then the backward sequence of
docs/kernel-contract.md ((bwd mask build) -> preprocess -> dkdv -> dq or
dq_convert), and compares O, LSE, dQ, dK, dV (and the gradient of a trainable
expression buffer) with float64 PyTorch autograd through
softmax(score_mod(Q K^T * scale) masked) @ V, GQA expanded by repeat_interleave
(autograd sums the group). Rows with no visible key have P = 0 in the
reference, and must give exactly zero dQ; keys no query sees must give exactly
zero dK and dV. Fresh random inputs per case (shapes, layouts and mask inputs
from test_attention_fwd.build_case); every output is poisoned with NaN before
the launch, and the padding of padded outputs must stay NaN. Deterministic
variants: the first cases of each run the backward 5 times and require
bit-identical dQ/dK/dV. Prints one line per case, "N passed, M failed" last.

Tolerances: rel L2 <= 1e-2 (bf16) / 3e-3 (fp16) for O, dQ, dK, dV, where dQ
and dK errors are taken relative to max(|grad|, 0.1 * |its terms before
softmax's centring|) (rows with one visible key have dS = 0 exactly, and a
correct kernel leaves rounding noise there), and the reference's delta is the
kernel's own (from its rounded O, as the kernel's must be); the trainable bias
gradient gets 5x (it is a small remainder of large terms). A float32 FA2-style
model of the backward with bf16/fp16-rounded P, dS and O passed 200/200 cases on
the CPU with worst errors dQ 4.1e-3 bf16 / 6.1e-4 fp16, d bias 1.1e-2 bf16
(tests/python/test_bwd_reference.py runs such a model in CI).

  python3 tests/kernels/test_attention_bwd.py [--cases 200] [--seed 1] [--select RE] [--log F]
  python3 tests/kernels/test_attention_bwd.py --compile-only [--jobs 2]  # CPU: NVRTC only
  --sm90a: every variant built for sm_90a (wgmma dK/dV, kernels/attention_bwd.cuh kWg)
"""

import argparse
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kc_attn as K  # noqa: E402
import test_attention_fwd as F  # noqa: E402  (case shapes, mask inputs, reference mask)

BWD_ENTRIES = ("kcache_attn_bwd_preprocess", "kcache_attn_bwd_dkdv", "kcache_attn_bwd_dq",
               "kcache_attn_bwd_dq_convert", "kcache_attn_bwd_mask_build")
DET_REPEATS = 5
DET_CASES_PER_VARIANT = 2


def variants():
    """(name, spec) for every backward variant the cases draw from."""
    masks = K.mask_variants()
    m = dict(masks)
    bias = dict(score="expr", expr_score_code=K.EXPR_SCORE_BIAS,
                expr_score_grad_code=K.EXPR_SCORE_BIAS_GRAD)
    out = []

    def add(name, dtype, dqk, dv=None, **kw):
        kw.setdefault("backward", True)
        out.append((name, K.make_spec(dtype, dqk, dv, **kw)))

    for dtype in ("bf16", "fp16"):
        for d in (128, 64):
            for mname, mk in masks:
                add("%s_d%d_%s" % (dtype, d, mname), dtype, d, **mk)
    # Deterministic dQ (no atomics).
    for dtype, d in (("bf16", 128), ("fp16", 64)):
        for mname in ("none", "causal", "causal_br", "win100_20_br", "doc_causal", "drafter16",
                      "drafter7_w50", "expr_prefix"):
            add("%s_d%d_%s_det" % (dtype, d, mname), dtype, d, deterministic=True, **m[mname])
    # Score modifications; the bias expression's buffer gradient is checked.
    add("bf16_d128_causal_softcap", "bf16", 128, mask="causal", score="softcap", softcap=20.0)
    add("fp16_d64_doc_softcap", "fp16", 64, mask="document", score="softcap", softcap=5.0)
    add("bf16_d64_none_softcap_det", "bf16", 64, score="softcap", softcap=10.0,
        deterministic=True)
    add("fp16_d64_none_alibi", "fp16", 64, score="alibi")
    add("bf16_d128_drafter_alibi", "bf16", 128, mask="drafter", score="alibi")
    add("fp16_d128_causal_alibi_det", "fp16", 128, mask="causal", score="alibi",
        deterministic=True)
    add("bf16_d128_causal_exprscore", "bf16", 128, mask="causal", **bias)
    add("fp16_d128_exprmask_exprscore", "fp16", 128, **dict(m["expr_prefix"], **bias))
    add("bf16_d64_win37_exprscore", "bf16", 64, **dict(m["win37_0"], **bias))
    add("fp16_d64_drafter16_exprscore", "fp16", 64, **dict(m["drafter16"], **bias))
    add("bf16_d128_none_scale0.3", "bf16", 128, scale=0.3)
    # Head dims that differ.
    for dtype in ("bf16", "fp16"):
        for dqk, dv in ((128, 64), (64, 128)):
            for mname in ("none", "causal", "drafter16"):
                add("%s_d%d_%d_%s" % (dtype, dqk, dv, mname), dtype, dqk, dv, **m[mname])
    # sm_90a builds (the forward runs wgmma there; the cubin the client gets on an H200).
    for dtype, d, mname, det in (("bf16", 128, "causal", False), ("fp16", 128, "doc", False),
                                 ("bf16", 64, "drafter16", False),
                                 ("fp16", 128, "drafter16", False),  # the producer's runs
                                 ("bf16", 128, "none", True), ("fp16", 64, "expr_prefix", True),
                                 ("bf16", 128, "win100_20_br", False)):
        add("%s_d%d_%s%s_sm90a" % (dtype, d, mname, "_det" if det else ""), dtype, d,
            sm90a=True, deterministic=det, **m[mname])
    add("bf16_d128_causal_exprscore_sm90a", "bf16", 128, mask="causal", sm90a=True, **bias)
    return out


# ---------------------------------------------------------------------------
# Inputs, reference and checks (torch)
# ---------------------------------------------------------------------------
def poisoned(torch, b, h, s, d, dtype, layout):
    """A NaN-filled [b, h, s, d] output view and the tensor it lives in (for padded
    layouts the padding must stay NaN)."""
    if layout == "bhsd":
        t = torch.full((b, h, s, d), float("nan"), device="cuda", dtype=dtype)
        return t, t
    if layout == "bshd":
        t = torch.full((b, s, h, d), float("nan"), device="cuda", dtype=dtype)
        return t.permute(0, 2, 1, 3), t
    pad = 8 * random.randint(1, 4)
    t = torch.full((b, s, h, d + pad), float("nan"), device="cuda", dtype=dtype)
    return t[..., :d].permute(0, 2, 1, 3), t


def trainable_bias(spec):
    """The expression score's bias buffer gets a gradient unless deterministic (the contract
    refuses trainable buffers with deterministic: true)."""
    return spec["score"] == "expr" and not spec["deterministic"]


def build_bwd_case(torch, spec, rng):
    c = F.build_case(torch, spec, rng)
    B, Hq, Lq, dt = c["B"], c["Hq"], c["Lq"], c["dtype"]
    # Our own amplitude for Q (build_case's goes to 4, where bf16 P and dS lose more than
    # a backward tolerance of 1e-2 allows in a few rows).
    c["amp"] = rng.choice([1.0, 1.0, 2.0, 3.0])
    c["q"] = F.rand_layout(torch, B, Hq, Lq, spec["dqk"], dt, c["layouts"][0], c["amp"])
    lay = lambda: rng.choice(["bhsd", "bshd", "padded"])  # noqa: E731
    c["glayouts"] = (lay(), lay(), lay(), lay())  # dO, dQ, dK, dV
    c["dout"] = F.rand_layout(torch, B, Hq, Lq, spec["dv"], dt, c["glayouts"][0])
    return c


def new_grads(torch, spec, c):
    """Poisoned dQ, dK, dV views and their backing tensors."""
    B, Hq, Hkv, Lq, Lkv, dt = c["B"], c["Hq"], c["Hkv"], c["Lq"], c["Lkv"], c["dtype"]
    dq, dqb = poisoned(torch, B, Hq, Lq, spec["dqk"], dt, c["glayouts"][1])
    dk, dkb = poisoned(torch, B, Hkv, Lkv, spec["dqk"], dt, c["glayouts"][2])
    dv, dvb = poisoned(torch, B, Hkv, Lkv, spec["dv"], dt, c["glayouts"][3])
    return (dq, dk, dv), (dqb, dkb, dvb)


def masked_scores(torch, spec, c, q, ke, bias):
    """The float64 scores of q against ke (the key heads repeated per query head): the
    spec's scale, score modification and mask (-inf where hidden). Returns (scale, the
    modified and masked scores, softcap's derivative d S / d raw score (None for other score
    modifications; no gradient), the bias expression's c(q, kv), the visibility
    [B or 1, 1, Lq, Lkv], the dead rows). bias: the bias buffer (float64) or None."""
    scale = float(torch.tensor(spec["scale"], dtype=torch.float32))
    s_raw = (q @ ke.transpose(-1, -2)) * scale
    s = s_raw
    dcap = None
    qi = torch.arange(c["Lq"], device="cuda", dtype=torch.float64)[:, None]
    ki = torch.arange(c["Lkv"], device="cuda", dtype=torch.float64)[None, :]
    cmul = torch.remainder(qi - ki, 7)[None, None]  # the bias expression's c(q, kv)
    if spec["score"] == "softcap":
        cap = spec["softcap"]
        s = cap * torch.tanh(s / cap)
        dcap = 1 - torch.tanh(s_raw.detach() / cap) ** 2
    elif spec["score"] == "alibi":
        s = s + c["slopes"].double()[None, :, None, None] * (ki - qi)[None, None]
    elif spec["score"] == "expr":
        s = s + bias[None, :, None, None] * cmul
    vis = F.ref_mask(torch, spec, c)
    dead = ~vis.any(dim=-1, keepdim=True)  # rows with no visible key
    return scale, s.masked_fill(~vis, float("-inf")), dcap, cmul, vis, dead


def reference(torch, spec, c):
    """float64 O, LSE and the gradients of Q, K, V (and the bias buffer) for dO."""
    rep = c["Hq"] // c["Hkv"]
    q = c["q"].double().requires_grad_()
    k = c["k"].double().requires_grad_()
    v = c["v"].double().requires_grad_()
    bias = c["bias"].double().requires_grad_() if spec["score"] == "expr" else None
    ke = k.repeat_interleave(rep, dim=1)
    ve = v.repeat_interleave(rep, dim=1)
    scale, s, dcap, cmul, vis, dead = masked_scores(torch, spec, c, q, ke, bias)
    with torch.no_grad():
        lse = torch.logsumexp(s, dim=-1)  # -inf on dead rows
    # Dead rows: P = 0 (a finite row keeps softmax's gradient free of NaN).
    p = torch.softmax(s.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    o = p @ ve
    dout = c["dout"].double()
    o.backward(dout)
    grads = dict(dQ=q.grad, dK=k.grad, dV=v.grad)
    if bias is not None:
        grads["dbias"] = bias.grad
    # The size of each gradient's terms before softmax's centring: dS = P * (dP - delta)
    # cancels to ~0 where P is nearly one-hot (or one key is visible), and there a rel L2
    # measures only rounding (delta comes from the rounded O). Errors are taken relative
    # to max(|grad|, FLOOR * |uncentred terms|); see rel_err().
    with torch.no_grad():
        pd = p.detach()
        # The kernel's delta is rowsum(dO * O) of its own, rounded O (the contract's, as in
        # every FA-style backward), so its dS is the exact one moved by P * shift, shift =
        # delta_exact - delta_kernel: dQ, dK and d bias take that shift here. Without it a
        # float64 model of a correct fp16 kernel missed 3e-3 on tiny causal cases (Lq 3,
        # amp 2: up to 7e-3, 9 of 400), with it under 5e-4 (kernels/NOTES.md, session 26);
        # d bias, a small remainder of large terms (Sum_kv dS = 0 on every row), missed
        # 1e-2 bf16 now and then (up to 1.9e-2), and an fp16 case with one head and 16 live
        # rows by 3.0e-2, every other gradient at 2.9e-4.
        shift = (dout * o.detach()).sum(-1) - (dout * torch.nan_to_num(c["o"].double())).sum(-1)
        w = pd * shift[..., None]
        u = pd * (dout @ ve.detach().transpose(-1, -2))  # P * dP, w.r.t. the modified score
        scale_of = {}
        if dcap is not None:
            u, w = u * dcap, w * dcap
        if bias is not None:
            grads["dbias"] = grads["dbias"] + (w * cmul).sum(dim=(0, 2, 3))
            # d bias[h] = sum over (b, q, kv) of dS c: its uncentred terms P dP c.
            scale_of["dbias"] = (u * cmul).sum(dim=(0, 2, 3)).norm().item()
        u, w = u * scale, w * scale
        B, Hkv, Lkv = c["B"], c["Hkv"], c["Lkv"]
        grads["dQ"] = grads["dQ"] + w @ ke.detach()
        grads["dK"] = grads["dK"] + (w.transpose(-1, -2) @ q.detach()).view(
            B, Hkv, rep, Lkv, -1).sum(2)
        scale_of["dQ"] = (u @ ke.detach()).norm().item()
        scale_of["dK"] = (u.transpose(-1, -2) @ q.detach()).view(
            B, Hkv, rep, Lkv, -1).sum(2).norm().item()
        scale_of["dV"] = 0.0
        del u, w, pd
    unseen = ~vis.any(dim=-2)  # [B or 1, 1, Lkv]: keys no query sees
    return o.detach(), lse, grads, dead[..., 0], unseen, scale_of


FLOOR = 0.1
# d bias is a small remainder of its terms on every case (check()), so its floor is
# far lower: it only keeps a bias gradient that is exactly zero (one visible key per row,
# e.g. kv_len 1, where P = 1 and dS = dP - delta is rounding alone) from dividing by 0.
DBIAS_FLOOR = 1e-3
DBIAS_TOL_FACTOR = 5


def rel_l2(torch, got, ref, floor=0.0):
    """|got - ref| / max(|ref|, floor) (L2); NaN in got counts as a huge error."""
    diff = torch.nan_to_num(got.double() - ref, nan=1e30, posinf=1e30, neginf=1e30)
    den = max(ref.norm().item(), floor)
    if den == 0.0:
        return 0.0 if diff.norm().item() == 0.0 else float("inf")
    return diff.norm().item() / den


def run_case(torch, kern, spec, c, det_repeats):
    """Forward, then backward; returns (outputs dict, failure messages from the repeats)."""
    msgs = []
    hold = F.run_kernel(torch, kern, spec, c)  # our forward: fills c["o"], c["lse"]
    # An expression mask's forward classes serve the backward where the kernel allows it
    # (kern.shares_classes), as kcache's client runs them; the deterministic repeats
    # below classify again (the backward's own mask build) and must match bit for bit.
    classes = hold[-1] if spec["mask"] == "expr" else None
    p = K.make_params(c["q"], c["k"], c["v"], c["o"], c["lse"])
    K.set_mask_inputs(p, spec, c)
    (dq, dk, dv), backing = new_grads(torch, spec, c)
    bgrads = {}
    if trainable_bias(spec):
        bgrads[1] = torch.zeros_like(c["bias"])
    bl = kern.prepare_backward(p, c["dout"], dq, dk, dv, buffer_grads=bgrads, classes=classes)
    bl.run()
    torch.cuda.synchronize()
    out = dict(dQ=dq, dK=dk, dV=dv, backing=backing)
    if bgrads:
        out["dbias"] = bgrads[1]
    for rep in range(1, det_repeats):
        (dq2, dk2, dv2), _ = new_grads(torch, spec, c)
        bl2 = kern.prepare_backward(p, c["dout"], dq2, dk2, dv2)
        bl2.run()
        torch.cuda.synchronize()
        for name, a, b_ in (("dQ", dq, dq2), ("dK", dk, dk2), ("dV", dv, dv2)):
            if not torch.equal(a, b_):
                msgs.append("deterministic: %s of run %d differs from run 1 (%d elements)"
                            % (name, rep + 1, int((a != b_).sum())))
    return out, msgs


def check(torch, spec, c, got, ref):
    o_ref, lse_ref, grads, dead, unseen, scale_of = ref
    tol = 1e-2 if spec["dtype"] == "bf16" else 3e-3
    msgs = []
    errs = {}
    # The forward (same cubin).
    o = c["o"].double()
    live = ~dead.expand(c["B"], c["Hq"], c["Lq"])
    errs["O"] = rel_l2(torch, o, o_ref)
    if torch.isnan(o).any():
        msgs.append("NaN in O")
    if not errs["O"] <= tol:
        msgs.append("O rel L2 %.3e > %.0e" % (errs["O"], tol))
    lse = c["lse"].double()
    if live.any():
        le = torch.nan_to_num((lse[live] - lse_ref[live]).abs(), nan=1e30).max().item()
        if not le <= 2e-3 + 1e-3 * lse_ref[live].abs().max().item():
            msgs.append("LSE err %.3e" % le)
    if (~live).any() and not (torch.isinf(lse[~live]) & (lse[~live] < 0)).all():
        msgs.append("rows with no visible key: LSE != -inf")
    # Gradients.
    for name in ("dQ", "dK", "dV"):
        g = got[name]
        nn = int(torch.isnan(g).sum())
        if nn:
            msgs.append("NaN in %s (%d of %d; unwritten or computed)" % (name, nn, g.numel()))
        errs[name] = rel_l2(torch, g, grads[name], FLOOR * scale_of[name])
        if not errs[name] <= tol:
            msgs.append("%s rel L2 %.3e > %.0e" % (name, errs[name], tol))
    for name, t in zip(("dQ", "dK", "dV"), got["backing"]):
        if t.shape[-1] != got[name].shape[-1]:  # padded: the padding stays NaN
            padding = t[..., got[name].shape[-1]:]
            if not torch.isnan(padding).all():
                msgs.append("%s: written past the head dimension (padding)" % name)
    dq = got["dQ"]
    if (~live).any() and not torch.equal(dq[~live], torch.zeros_like(dq[~live])):
        msgs.append("rows with no visible key: dQ != 0 (%d rows)" % int((~live).sum()))
    un = unseen.expand(c["B"], c["Hkv"], c["Lkv"])
    for name in ("dK", "dV"):
        g = got[name]
        if un.any() and not torch.equal(g[un], torch.zeros_like(g[un])):
            msgs.append("keys no query sees: %s != 0" % name)
    if "dbias" in got:
        # Against the kernel's own delta, as dQ and dK (reference()).
        errs["dbias"] = rel_l2(torch, got["dbias"], grads["dbias"],
                               DBIAS_FLOOR * scale_of["dbias"])
        if not errs["dbias"] <= DBIAS_TOL_FACTOR * tol:
            msgs.append("d bias (trainable buffer) rel L2 %.3e > %.1e" % (
                errs["dbias"], DBIAS_TOL_FACTOR * tol))
    return msgs, errs, int((~live).sum()), int(un.sum())


def compile_all(vs, jobs):
    t0 = time.time()
    res = K.compile_many([sp for _, sp in vs], jobs)
    compiled, failed = {}, []
    for (name, spec), (cl, err) in zip(vs, res):
        if err:
            failed.append((name, err))
        else:
            compiled[name] = (spec,) + tuple(cl)
    print("compiled %d backward variants in %.1fs (%d failed)" % (len(vs), time.time() - t0,
                                                                  len(failed)), flush=True)
    for name, err in failed[:3]:
        print("COMPILE FAIL %s:\n%s" % (name, err[-3000:]))
    for name, err in failed[3:]:
        print("COMPILE FAIL %s (log above is for the first ones)" % name)
    return compiled, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", default=None)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--jobs", type=int, default=None, help="parallel NVRTC processes")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--select", default=None, help="regex on variant names")
    ap.add_argument("--sm90a", action="store_true",
                    help="every variant as an sm_90a build (wgmma forward and dK/dV)")
    args = ap.parse_args()

    K.check_params_layout()
    K.check_tiles_against_header()
    K.check_bwd_tiles_against_header()
    if not os.path.exists(os.path.join(K.KERNELS, K.BWD_HEADER)):
        print("kernels/%s does not exist yet" % K.BWD_HEADER)
        print("0 passed, 1 failed")
        return 1
    vs = variants()
    if args.select:
        vs = [(n, sp) for n, sp in vs if re.search(args.select, n)]
    if args.sm90a:
        vs = [(n if sp["sm90a"] else n + "_sm90a",
               sp if sp["sm90a"] else dict(sp, arch=90, sm90a=True,
                                           tiles=K.select_tiles(90, sp["dqk"], sp["dv"], True,
                                                                sp["mask"])))
              for n, sp in vs]
    vs = [(n, sp if sp["sm90a"] else dict(sp, arch=args.arch)) for n, sp in vs]
    if not vs:
        print("no variant matches --select %r" % args.select)
        return 1
    compiled, cfailed = compile_all(vs, args.jobs)
    if args.compile_only:
        for name, (spec, cubin, log) in compiled.items():
            print("%-36s %s" % (name, "; ".join(
                "%s %s" % (e.replace("kcache_attn_", ""), K.ptxas_summary(log, e))
                for e in ("kcache_attn_fwd",) + BWD_ENTRIES if ("'%s'" % e) in log)))
        print("%d compiled, %d failed" % (len(compiled), len(cfailed)))
        return 1 if cfailed else 0

    import torch
    logf = open(args.log, "w") if args.log else None
    rng = random.Random(args.seed)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    names = [n for n, _ in vs]
    order = names * 2
    while len(order) < args.cases:
        order.append(rng.choice(names))
    rng.shuffle(order)
    kernels = {}
    det_done = {}
    npass, nfail = 0, len(cfailed)
    worst = {}
    failures = ["%s :: compile failed" % n for n, _ in cfailed]
    t0 = time.time()
    for i, name in enumerate(order):
        if name not in compiled:
            continue
        spec, cubin, _ = compiled[name]
        c = None
        det = 1
        try:
            if name not in kernels:
                kernels[name] = K.Kernel(spec, cubin)
            c = build_bwd_case(torch, spec, rng)
            if spec["deterministic"] and det_done.get(name, 0) < DET_CASES_PER_VARIANT:
                det_done[name] = det_done.get(name, 0) + 1
                det = DET_REPEATS
            got, msgs = run_case(torch, kernels[name], spec, c, det)
            ref = reference(torch, spec, c)
            more, errs, ndead, nunseen = check(torch, spec, c, got, ref)
            msgs += more
            del got, ref
        except Exception as e:  # a launch error is a failure; later cases may still run
            msgs, errs, ndead, nunseen = ["exception: %s: %s" % (type(e).__name__, e)], {}, 0, 0
        shape = ("B%d H%d/%d Lq%d Lkv%d %s|%s amp%g" % (
            c["B"], c["Hq"], c["Hkv"], c["Lq"], c["Lkv"], "/".join(c["layouts"][:3]),
            "/".join(c["glayouts"]), c["amp"]) if c and "glayouts" in c else "")
        desc = "%3d %-36s %s %s dead=%d unseen=%d%s" % (
            i, name, shape, " ".join("%s=%.2e" % kv for kv in errs.items()), ndead, nunseen,
            " det x%d" % det if det > 1 else "")
        if msgs:
            nfail += 1
            failures.append(desc + " :: " + "; ".join(msgs))
        else:
            npass += 1
            for k_, v_ in errs.items():
                key = (spec["dtype"], k_)
                worst[key] = max(worst.get(key, 0.0), v_)
        line = desc + (" FAIL " + "; ".join(msgs) if msgs else " ok")
        print(line, flush=True)
        if logf:
            logf.write(line + "\n")
    for f in failures[:40]:
        print("FAIL", f)
    print("cases took %.1fs; worst passing rel L2: %s" % (
        time.time() - t0, ", ".join("%s %s %.2e" % (d, n, v) for (d, n), v in sorted(
            worst.items()))))
    print("%d passed, %d failed" % (npass, nfail))
    return 0 if nfail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
