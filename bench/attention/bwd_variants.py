"""Backward kernel variants side by side, for kernel work on a GPU machine (the full
benchmark is bench_attention.py --backward).

Per case (causal, none, d64, drafter_random, drafter_sorted: the shapes of
bench_attention.py; causal_gqa: B2, 32 / 8 heads, S4096, D128), flex_attention's forward
+ backward runs once (time; its gradients are the reference), then each variant of the
portable sm_90 build: its forward and whole backward sequence timed (median of CUDA
events), each backward kernel timed alone, the dK/dV kernel's registers and spills, and its
gradients' rel L2 against flex's (NaN-poisoned outputs first). Flex, cuDNN and the variants
are timed in ROUNDS interleaved rounds (default 3): on an H200 the same kernel ran up to
12 % slower late in a run than early in it (the card's clocks under its power limit), which
had favoured whatever ran first. Variants are
sets of extra defines (kernels/attention_bwd.cuh's KC_BWD_*):

  SM90A=1 VARIANTS="wg:;fa2:KC_BWD_WGMMA=0" python3 bench/attention/bwd_variants.py none causal

(The measurement switches KC_BWD_FA2, KC_BWD_WG_SPLIT and KC_BWD_HEAD_CHUNK left the
kernel once measured, issue 28; kernels/NOTES.md keeps what they showed. A new variant
is a new define in the kernel while it is being measured.) TILES=BMxBNxWxS in a variant
sets the forward's tiles (the spec's tuning) instead of a define, e.g. "t176:TILES=128x176x8x2".
LAYOUT=bshd in a variant runs it on (batch, sequence, head, dim) tensors (the same values, as
views with those strides: what a trainer's projections give), instead of (batch, head,
sequence, dim), e.g. VARIANTS="bhsd:;bshd:LAYOUT=bshd".

FLEX=0 skips flex (outputs are then compared with the first variant's; FLEX_MASK_COMPILE=0
builds flex's drafter block mask eagerly, the same mask without its compile); BWD=0 times and
checks the forward alone; SDPA=1 adds SDPA cuDNN's time (forward, + backward unless BWD=0)
on the dense cases and each variant's ratio to it. Cubins for every (case, variant)
compile in parallel first (NVRTC, into .devcarry/cubins like the other kernel tools).
"""
import os, sys, statistics, json
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "kernels"))
import kc_attn as K


def parse_variants():
    """(name, extra) per variant; extra: the defines, and ("TILES", (bm, bn, warps, stages))
    when the variant sets the forward's tiles."""
    out = []
    for item in os.environ.get("VARIANTS", "base:").split(";"):
        name, _, defs = item.partition(":")
        extra = []
        for x in defs.split(","):
            if not x: continue
            k, _, v = x.partition("=")
            extra.append((k, tuple(int(n) for n in v.split("x"))) if k == "TILES" else (k, v))
        out.append((name, tuple(extra)))
    return out


VARIANTS = parse_variants()
CASES = sys.argv[1:] or ["causal", "drafter_random", "drafter_sorted"]
FLEX = os.environ.get("FLEX", "1") == "1"
BWD = os.environ.get("BWD", "1") == "1"
# FLEX_MASK_COMPILE=0 builds the drafter's block mask eagerly: the same mask (only its
# build is slower), without the ~200 s compile of create_block_mask on a fresh machine.
FLEX_MASK_COMPILE = os.environ.get("FLEX_MASK_COMPILE", "1") == "1"
SDPA = os.environ.get("SDPA", "0") == "1"
# SM90A=1: sm_90a builds (wgmma forward; wgmma dK/dV unless a variant sets KC_BWD_WGMMA=0).
SM90A = os.environ.get("SM90A", "0") == "1"
# ROUNDS: interleaved timing rounds per case (each runner REPS launches per round; medians of
# the round medians are reported).
ROUNDS = int(os.environ.get("ROUNDS", "3"))
# DRAFTER_BATCH: the drafter cases' batch (bench_attention's 2 by default; more (batch, key
# head) pairs change the dK/dV's launch order's sharing, bwd_launch_model.py --batch).
DRAFTER_BATCH = int(os.environ.get("DRAFTER_BATCH", "2"))


def spec_for(case, extra):
    mask = {"causal": "causal", "causal_gqa": "causal", "none": "none",
            "d64": "causal"}.get(case, "drafter")
    D = 64 if case == "d64" else 128
    tiles = dict(extra).get("TILES")
    return K.make_spec("bf16", D, D, mask=mask, backward=BWD, deterministic=False, arch=90,
                       sm90a=SM90A, drafter_block=16, tiles=tiles,
                       extra_defines=tuple(e for e in extra if e[0] not in ("TILES", "LAYOUT")))


specs = [spec_for(c, ex) for c in CASES for _, ex in VARIANTS]
for (r, err) in K.compile_many(specs, jobs=16):
    if err: print("COMPILE ERROR", err[-3000:], flush=True)

import torch
import bench_attention as BA  # noqa: E402 (round_times: the interleaved rounds)


def time_ms(fn, warmup=int(os.environ.get("WARMUP", "3")), rep=int(os.environ.get("REPS", "20"))):
    for _ in range(warmup): fn()
    torch.cuda.synchronize()
    evs = []
    for _ in range(rep):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); evs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in evs)


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_case(case):
    dt = torch.bfloat16
    drafter = None
    if case == "causal": B, Hq, Hkv, Lq, Lkv, D, mask = 4, 32, 32, 4096, 4096, 128, "causal"
    elif case == "none": B, Hq, Hkv, Lq, Lkv, D, mask = 4, 32, 32, 4096, 4096, 128, "none"
    # causal_gqa: causal with 4 query heads per key head (the wgmma dK/dV's GQA launch order).
    elif case == "causal_gqa": B, Hq, Hkv, Lq, Lkv, D, mask = 2, 32, 8, 4096, 4096, 128, "causal"
    elif case == "d64": B, Hq, Hkv, Lq, Lkv, D, mask = 8, 32, 32, 2048, 2048, 64, "causal"
    else:
        B, S, N, Bk = DRAFTER_BATCH, 3072, 512, 16
        g = torch.Generator(device="cuda").manual_seed(1234)
        anc = torch.randint(1, S + 1, (B, N), device="cuda", dtype=torch.int32, generator=g)
        if case == "drafter_sorted": anc = torch.sort(anc, dim=1).values.contiguous()
        Hq, Hkv, Lq, Lkv, D, mask = 32, 8, N * Bk, S + N * Bk, 128, "drafter"
        drafter = (S, N, Bk, anc)
    torch.manual_seed(0)
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt, requires_grad=True)
    do = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    key = "total" if BWD else "fwd"
    # Everything timed for this case: (name, fn). Timed in ROUNDS interleaved rounds, each
    # runner once per round, so that a card warming up over the run (clocks falling under
    # its power limit) slows every runner alike instead of whichever runs last.
    timers = []
    rows = []  # each variant's result, its times filled in after the rounds
    ref = ref_o = None
    if FLEX:
        from torch.nn.attention.flex_attention import flex_attention, create_block_mask
        flex = torch.compile(flex_attention, dynamic=False)
        if mask == "causal":
            bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, Lq, Lkv, device="cuda")
        elif mask == "none":
            bm = None
        else:
            S, N, Bk, anc = drafter
            def mm(b, h, qi, ki):
                j = qi // Bk; a = anc[b, j]
                return ((ki < S) & (ki < a)) | ((ki >= S + j * Bk) & (ki < S + (j + 1) * Bk))
            bm = create_block_mask(mm, B, None, Lq, Lkv, device="cuda", _compile=FLEX_MASK_COMPILE)
        def fb():
            out = flex(q, k, v, block_mask=bm, enable_gqa=Hq != Hkv)
            if BWD: out.backward(do)
            return out
        ref_o = fb().detach().clone(); torch.cuda.synchronize()
        ref = (q.grad.clone(), k.grad.clone(), v.grad.clone()) if BWD else None
        timers.append(("flex", fb))
    if SDPA and mask in ("causal", "none") and Hq == Hkv:
        from torch.nn.attention import sdpa_kernel, SDPBackend
        def sd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal")
                if BWD: out.backward(do)
        sd(); torch.cuda.synchronize()
        timers.append(("cudnn", sd))
    for name, extra in VARIANTS:
        spec = spec_for(case, extra)
        cubin, log = K.compile_spec(spec)
        kern = K.Kernel(spec, cubin)
        bshd = dict(extra).get("LAYOUT") == "bshd"
        # bshd: the same values in (B, L, H, D) memory, seen as (B, H, L, D) views.
        lay = (lambda t: t.detach().transpose(1, 2).contiguous().transpose(1, 2)) if bshd else \
            (lambda t: t.detach())
        vq, vk, vv, vdo = lay(q), lay(k), lay(v), lay(do)
        o = lay(torch.empty(B, Hq, Lq, D, device="cuda", dtype=dt))
        lse = torch.empty(B, Hq, Lq, device="cuda", dtype=torch.float32)
        p = K.make_params(vq, vk, vv, o, lse)
        if drafter:
            S, N, Bk, anc = drafter
            p.drafter_anchor = anc.data_ptr(); p.drafter_stride_b = anc.stride(0)
            p.drafter_context_len, p.drafter_num_blocks = S, N
        dq, dk, dv = (lay(torch.full_like(t, float("nan"))) for t in (q, k, v))
        fwd = lambda kern=kern, p=p: kern.launch(p)
        fwd(); torch.cuda.synchronize()
        if not FLEX and ref_o is None:
            ref_o = o.clone()  # without flex, outputs are compared with the first variant's
        r = {"case": case, "variant": name}
        r["ptxas"] = K.ptxas_summary(log) if not BWD else K.ptxas_summary(log, "kcache_attn_bwd_dkdv")
        r["err_o"] = round(rel_l2(o, ref_o), 5)
        timers.append((name + ".fwd", fwd))
        if BWD:
            bl = kern.prepare_backward(p, vdo, dq, dk, dv)
            bl.run(); torch.cuda.synchronize()
            if ref is not None:
                r.update(err_dq=round(rel_l2(dq, ref[0]), 5), err_dk=round(rel_l2(dk, ref[1]), 5),
                         err_dv=round(rel_l2(dv, ref[2]), 5))
            timers.append((name + ".bwd", bl.run))
            per = {}
            for nm, grid, th, sm in bl.launches():
                per[nm.replace("kcache_attn_bwd_", "")] = round(time_ms(lambda kern=kern, nm=nm, grid=grid, th=th, sm=sm, bl=bl: kern._launch(kern.bwd[nm], grid, th, sm, bl.params)), 3)
            r["per"] = per
        rows.append(r)
    rounds = BA.round_times(timers, ROUNDS, time_ms)
    med = {nm: statistics.median(ts) for nm, ts in rounds.items()}
    res = {"case": case, "rounds": ROUNDS}
    if "flex" in med: res["flex_" + key] = round(med["flex"], 3)
    if "cudnn" in med: res["cudnn_" + key] = round(med["cudnn"], 3)
    for nm in ("flex", "cudnn"):
        if nm in rounds: res[nm + "_rounds"] = [round(t, 3) for t in rounds[nm]]
    print(json.dumps(res), flush=True)
    for r in rows:
        name = r["variant"]
        t_f = med[name + ".fwd"]
        r["fwd"] = round(t_f, 3)
        total = t_f
        if BWD:
            t_b = med[name + ".bwd"]
            total = t_f + t_b
            r.update(bwd=round(t_b, 3), total=round(total, 3))
        parts = [rounds[name + ".fwd"]] + ([rounds[name + ".bwd"]] if BWD else [])
        r["rounds"] = [round(sum(ts), 3) for ts in zip(*parts)]  # fwd (+ bwd) of each round
        if "flex" in med: r["ratio"] = round(med["flex"] / total, 3)
        if "cudnn" in med: r["vs_cudnn"] = round(med["cudnn"] / total, 3)
        print(json.dumps(r), flush=True)


for c in CASES:
    run_case(c)
