"""Forward-attention benchmark: kcache_attn_fwd beside flex_attention and SDPA.

Cases (docs: /work/shared/DEVICE.md): causal B4 H32 S4096 D128; no mask B4
H32 S4096 D128; causal B8 H32 S2048 D64; the drafter training shape (B2,
32 query / 8 kv heads, D128, context 3072, 512 blocks of 16: q_len 8192,
kv_len 11264) with sorted and with unsorted random anchors.

TFLOP/s count only visible (q, kv) pairs, counted exactly from the mask:
4 * pairs * D per head. Times: median of CUDA-event timings after warm-up.
Every input set is larger than the 60 MB L2, so no rotation is needed.

With --backward: forward + backward through autograd for the peers (flex's
block mask still built once, outside the timed region) and kcache's forward
plus every launch of its backward sequence (preprocess, dK/dV, dQ or the dQ
conversion; the drafter's anchors are read in-kernel, nothing to build);
TFLOP/s with 3.5x the forward's FLOP; our O/dQ/dK/dV checked against flex's
(else SDPA FA2's) output and gradients. Variants: plain sm_90 and sm_90a
defaults, and sm_90a with the deterministic dQ.

Each case's runners (SDPA, flex, kcache variants) are timed in --rounds interleaved rounds
(default 3; time_rounds), so that the card's clocks falling as a run goes on do not favour
whichever ran first.

  python3 bench/attention/bench_attention.py [--no-flex] [--json FILE] [--only CASES] [--rounds N]
  python3 bench/attention/bench_attention.py --backward [--json FILE]
  python3 bench/attention/bench_attention.py --precompile [--backward]   # CPU: NVRTC only
"""

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "kernels"))
import kc_attn as K  # noqa: E402

torch = None  # imported in main(), so that --precompile runs without torch


def time_ms(fn, warmup=5, rep=25):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    evs = []
    for _ in range(rep):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        evs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in evs)


ROUNDS = 3  # --rounds


def round_times(timers, rounds, timer=None):
    """key -> [time of each round] for each (key, fn) in timers: `rounds` interleaved rounds,
    each timing every fn once (timer, default time_ms). Timed one after the other instead,
    the same kernel ran up to 12 % slower late in a run than early in it on an H200 (its
    clocks fall under the power limit as it warms), which favours whatever is timed first
    (kernels/NOTES.md, session 21). Each round starts one place further along the list:
    in a fixed order, the kernel timed right after cuDNN's forward + backward measured
    ~8 % slower than the same cubin timed last in the round (H100, session 34)."""
    timer = timer or time_ms
    per = {key: [] for key, _ in timers}
    n = len(timers)
    for r in range(rounds):
        for i in range(n):
            key, fn = timers[(r + i) % n]
            per[key].append(timer(fn))
    return per


def time_rounds(timers):
    """key -> the median of its round medians over ROUNDS rounds (round_times)."""
    return {key: statistics.median(ts) for key, ts in round_times(timers, ROUNDS).items()}


def in_backend(fn, backend):
    """fn under torch's SDPA backend `backend`."""
    from torch.nn.attention import sdpa_kernel

    def run():
        with sdpa_kernel(backend):
            return fn()
    return run


def rel_err(a, b):
    a = a.float()
    b = b.float()
    return ((a - b).norm() / b.norm()).item()


class KcacheRunner:
    def __init__(self, spec):
        cubin, log = K.compile_spec(spec)
        self.kern = K.Kernel(spec, cubin)
        self.spec = spec
        self.ptxas = K.ptxas_summary(log)

    def prepare(self, q, k, v, o, lse, drafter=None):
        p = K.make_params(q, k, v, o, lse)
        if drafter is not None:
            anc, S, N = drafter
            p.drafter_anchor = anc.data_ptr()
            p.drafter_stride_b = anc.stride(0)
            p.drafter_context_len, p.drafter_num_blocks = S, N
        self.p = p
        return lambda: self.kern.launch(self.p)


# The dense cases: (batch, query heads, kv heads, sequence length, head dim, mask). The
# drafter cases (main) draw their anchors at run time.
DENSE_CASES = {
    "causal_d128": (4, 32, 32, 4096, 128, "causal"),
    "none_d128": (4, 32, 32, 4096, 128, "none"),
    "causal_d64": (8, 32, 32, 2048, 64, "causal"),
}


def bwd_variants(d, mask):
    """(tag, forward tiles, sm90a, deterministic) timed by --backward: the defaults of plain
    sm_90 (portable mma.sync forward) and sm_90a, and sm_90a with the deterministic dQ."""
    return [("sm90", K.select_tiles(90, d, d, False, mask), False, False),
            ("sm90a", K.select_tiles(90, d, d, True, mask), True, False),
            ("sm90a_det", K.select_tiles(90, d, d, True, mask), True, True)]


def bwd_spec(d, mask, tiles, sm90a, det, drafter_block=16):
    return K.make_spec("bf16", d, d, mask=mask, tiles=tiles, sm90a=sm90a,
                       drafter_block=drafter_block, backward=True, deterministic=det)


def tile_variants(d, mask):
    """(tag, tiles, sm90a, extra defines) to time. "sm90" and "sm90a" are the
    defaults SelectAttentionTiles gives for plain sm_90 (portable mma.sync
    path) and sm_90a (wgmma); the others are alternatives kept for the notes."""
    out = [("sm90", K.select_tiles(90, d, d, False, mask), False, ()),
           ("sm90a", K.select_tiles(90, d, d, True, mask), True, ())]
    if d == 64:
        out += [("alt_128_128_8_2_sm90a", (128, 128, 8, 2), True, ())]
    else:
        out += [("alt_128_64_8_2_sm90a", (128, 64, 8, 2), True, ()),
                ("alt_128_128_8_2_sm90", (128, 128, 8, 2), False, ())]
    return out


def flex_block_mask(mask, B, Lq, Lkv, drafter, res, compiled=True):
    """flex_attention's block mask for a case, built once (outside any timed region); for
    the drafter also the time a create_block_mask takes per step (anchors change every
    step) into res["flex_block_mask_ms"] (compiled) or res["flex_block_mask_eager_ms"].
    compiled=False (--flex-mask eager) skips the mask builder's compile, minutes on the
    drafter shape: the block mask, and so flex's kernel times, are the same."""
    from torch.nn.attention.flex_attention import create_block_mask
    if mask == "causal":
        def mm(b, h, qi, ki):
            return qi >= ki
        return create_block_mask(mm, None, None, Lq, Lkv, device="cuda")
    if mask == "none":
        return None
    S, N, Bk, anc = drafter
    anc_d = anc

    def mm(b, h, qi, ki):  # noqa: F811
        j = qi // Bk
        a = anc_d[b, j]
        ctx = (ki < S) & (ki < a)
        own = (ki >= S + j * Bk) & (ki < S + (j + 1) * Bk)
        return ctx | own
    bm = create_block_mask(mm, B, None, Lq, Lkv, device="cuda", _compile=compiled)
    res["flex_block_mask_ms" if compiled else "flex_block_mask_eager_ms"] = time_ms(
        lambda: create_block_mask(mm, B, None, Lq, Lkv, device="cuda", _compile=compiled),
        warmup=2, rep=10)
    return bm


def case_pairs(mask, B, Lq, Lkv, drafter):
    """Visible (q, kv) pairs per (batch, head), on average over the batch."""
    if mask == "causal":
        return Lq * (Lq + 1) // 2
    if mask == "none":
        return Lq * Lkv
    S, N, Bk, anc = drafter
    a = anc[:, :N].clamp(max=S).long()
    return int((Bk * (a + Bk)).sum().item()) / B


def run_case(name, B, Hq, Hkv, Lq, Lkv, D, mask, args, rows, drafter=None):
    dt = torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt)
    o = torch.empty(B, Hq, Lq, D, device="cuda", dtype=dt)
    lse = torch.empty(B, Hq, Lq, device="cuda", dtype=torch.float32)
    res = {"case": name}

    # Pairs and the reference output.
    pairs = case_pairs(mask, B, Lq, Lkv, drafter)
    flops = 4.0 * pairs * D * Hq * B
    res["density"] = pairs / (Lq * Lkv)
    res["flop"] = flops

    ref = None
    timers = []  # (key, fn), timed together at the end (time_rounds)
    if mask in ("causal", "none"):
        from torch.nn.attention import sdpa_kernel, SDPBackend
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                   is_causal=mask == "causal")
        for label, be in (("sdpa_fa2", SDPBackend.FLASH_ATTENTION),
                          ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                f = in_backend(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=mask == "causal"), be)
                f()
                timers.append((label, f))
            except Exception as e:  # a backend may refuse a shape
                res[label + "_error"] = str(e)[:200]

    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
            bm = flex_block_mask(mask, B, Lq, Lkv, drafter, res, args.flex_mask == "compiled")
            gqa = Hq != Hkv
            fo = flex(q, k, v, block_mask=bm, enable_gqa=gqa)
            timers.append(("flex", lambda: flex(q, k, v, block_mask=bm, enable_gqa=gqa)))
            if ref is None:
                ref = fo
            else:
                res["flex_err"] = rel_err(fo, ref)
        except Exception as e:  # report and go on: kcache and SDPA still run
            res["flex_error"] = str(e)[:300]
            print("flex failed:", res["flex_error"], flush=True)

    if ref is None and mask == "drafter":
        # Reference through SDPA with an explicit boolean mask (GQA expanded).
        S, N, Bk, anc = drafter
        qi = torch.arange(Lq, device="cuda")
        ki = torch.arange(Lkv, device="cuda")
        j = qi // Bk
        a = anc[:, j].long()
        vis = ((ki[None, None] < S) & (ki[None, None] < a[:, :, None])) | (
            (ki[None, None] >= (S + j * Bk)[None, :, None]) &
            (ki[None, None] < (S + (j + 1) * Bk)[None, :, None]))
        rep_ = Hq // Hkv
        ref = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(rep_, 1), v.repeat_interleave(rep_, 1),
            attn_mask=vis[:, None])
        del vis

    kc = {}
    for tag, tiles, sm90a, extra in tile_variants(D, mask):
        spec = K.make_spec("bf16", D, D, mask=mask, tiles=tiles, sm90a=sm90a,
                           drafter_block=drafter[2] if drafter else 16, extra_defines=extra)
        try:
            r = KcacheRunner(spec)
            dr = (drafter[3], drafter[0], drafter[1]) if drafter else None
            fn = r.prepare(q, k, v, o, lse, dr)
            o.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = rel_err(o, ref) if ref is not None else float("nan")
            timers.append((("kcache", tag), fn))
            kc[tag] = dict(err=err, ptxas=r.ptxas, tiles="%d_%d_%d_%d" % tiles)
        except Exception as e:
            kc[tag] = dict(error=str(e)[:300])
    for key, t in time_rounds(timers).items():
        if isinstance(key, tuple):
            kc[key[1]].update(ms=t, tflops=flops / t / 1e9)
        else:
            res[key] = t
    res["rounds"] = ROUNDS
    res["kcache"] = kc
    rows.append(res)
    print(json.dumps(res), flush=True)
    del q, k, v, o, lse, ref
    torch.cuda.empty_cache()


def fwd_bwd(fn, q, k, v, dout):
    """A closure running fn(q, k, v) and autograd back to (dq, dk, dv) for dout."""
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def run():
        out = fn(qg, kg, vg)
        return (out,) + torch.autograd.grad(out, (qg, kg, vg), dout)
    return run


def run_case_bwd(name, B, Hq, Hkv, Lq, Lkv, D, mask, args, rows, drafter=None):
    """Forward + backward: kcache (forward, then every launch of the backward sequence)
    beside flex_attention and SDPA FA2 / cuDNN through autograd. Our dQ/dK/dV are checked
    against flex's (else FA2's) gradients."""
    from torch.nn.attention import SDPBackend
    dt = torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt)
    dout = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    res = {"case": name, "mode": "fwd+bwd"}
    pairs = case_pairs(mask, B, Lq, Lkv, drafter)
    flops = 3.5 * 4.0 * pairs * D * Hq * B
    res["density"] = pairs / (Lq * Lkv)
    res["flop"] = flops
    ref, ref_name = None, None  # (O, dQ, dK, dV)
    timers = []  # (key, fn), timed together at the end (time_rounds)

    if mask in ("causal", "none") and Hq == Hkv:
        for label, be in (("sdpa_fa2", SDPBackend.FLASH_ATTENTION),
                          ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                sdpa = torch.nn.functional.scaled_dot_product_attention
                f = in_backend(fwd_bwd(lambda a, b_, c_: sdpa(a, b_, c_, is_causal=mask == "causal"),
                                       q, k, v, dout), be)
                out = f()
                timers.append((label, f))
                if label == "sdpa_fa2":
                    ref, ref_name = out, "sdpa_fa2"
                del out
            except Exception as e:  # a backend may refuse a shape
                res[label + "_error"] = str(e)[:200]

    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
            bm = flex_block_mask(mask, B, Lq, Lkv, drafter, res, args.flex_mask == "compiled")
            gqa = Hq != Hkv
            f = fwd_bwd(lambda a, b_, c_: flex(a, b_, c_, block_mask=bm, enable_gqa=gqa),
                        q, k, v, dout)
            out = f()
            timers.append(("flex", f))
            if ref is not None:
                res["flex_vs_fa2"] = [rel_err(x, y) for x, y in zip(out, ref)]
            ref, ref_name = out, "flex"
            del out
        except Exception as e:  # report and go on: kcache and SDPA still run
            res["flex_error"] = str(e)[:300]
            print("flex failed:", res["flex_error"], flush=True)
    res["reference"] = ref_name

    o = torch.empty(B, Hq, Lq, D, device="cuda", dtype=dt)
    lse = torch.empty(B, Hq, Lq, device="cuda", dtype=torch.float32)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    kc = {}
    for tag, tiles, sm90a, det in bwd_variants(D, mask):
        spec = bwd_spec(D, mask, tiles, sm90a, det, drafter[2] if drafter else 16)
        try:
            cubin, log = K.compile_spec(spec)
            kern = K.Kernel(spec, cubin)
            p = K.make_params(q, k, v, o, lse)
            if drafter is not None:
                S, N, Bk, anc = drafter
                p.drafter_anchor = anc.data_ptr()
                p.drafter_stride_b = anc.stride(0)
                p.drafter_context_len, p.drafter_num_blocks = S, N
            bl = kern.prepare_backward(p, dout, dq, dk, dv)

            def fn(kern=kern, p=p, bl=bl):
                kern.launch(p)
                bl.run()
            for t in (o, dq, dk, dv):
                t.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            errs = ([rel_err(x, y) for x, y in zip((o, dq, dk, dv), ref)] if ref is not None
                    else [float("nan")] * 4)
            timers.append((("kcache", tag, "ms"), fn))
            timers.append((("kcache", tag, "bwd_ms"), bl.run))
            kc[tag] = dict(err_o=errs[0],
                           err_dq=errs[1], err_dk=errs[2], err_dv=errs[3],
                           tiles="%d_%d_%d_%d" % tiles, bwd_tiles="%d_%d_%d" % spec["bwd_tiles"],
                           ptxas={e: K.ptxas_summary(log, e) for e in (
                               "kcache_attn_fwd", "kcache_attn_bwd_dkdv",
                               "kcache_attn_bwd_dq" if det else "kcache_attn_bwd_dq_convert")})
        except Exception as e:
            kc[tag] = dict(error=str(e)[:300])
    for key, t in time_rounds(timers).items():
        if isinstance(key, tuple):
            kc[key[1]][key[2]] = t
            if key[2] == "ms":
                kc[key[1]]["tflops"] = flops / t / 1e9
        else:
            res[key] = t
    res["rounds"] = ROUNDS
    del timers
    res["kcache"] = kc
    rows.append(res)
    print(json.dumps(res), flush=True)
    del q, k, v, o, lse, dout, dq, dk, dv, ref
    torch.cuda.empty_cache()


def print_bwd_table(rows):
    """kcache fwd+bwd (sm_90a, sm_90, sm_90a deterministic) beside the peers; ratio = peer
    time / kcache time (> 1: kcache faster); correctness against the reference's grads."""
    def fmt(r, ms):
        return "%.3f ms %4.0f TF" % (ms, r["flop"] / ms / 1e9) if ms else "-"

    def ok(x):
        return ("ms" in x and all(x[e] == x[e] and x[e] < 2e-2
                                  for e in ("err_o", "err_dq", "err_dk", "err_dv")))

    def unchecked(r):
        # No reference (the drafter under --no-flex has no peer to check against): its
        # results are timed and marked unchecked, not called failures.
        return r.get("reference") is None

    def cell(r, x):
        if ok(x):
            return fmt(r, x["ms"])
        return fmt(r, x["ms"]) + " ?" if "ms" in x and unchecked(r) else "FAIL"
    print("\nforward + backward (TF/s = 3.5 x forward FLOP over visible pairs)")
    print("%-15s %6s | %-17s | %-17s | %-17s | %-17s | %-17s | %-17s | %s" %
          ("case", "dens", "kcache sm_90a", "kcache sm_90", "kcache sm_90a det", "flex",
           "sdpa fa2", "sdpa cudnn", "sm_90a vs flex/fa2/cudnn"))
    for r in rows:
        kc = r["kcache"]
        a, p, d = kc.get("sm90a", {}), kc.get("sm90", {}), kc.get("sm90a_det", {})
        ratios = ["%.2fx" % (r[peer] / a["ms"]) if ok(a) and r.get(peer) else "-"
                  for peer in ("flex", "sdpa_fa2", "sdpa_cudnn")]
        print("%-15s %5.1f%% | %-17s | %-17s | %-17s | %-17s | %-17s | %-17s | %s" % (
            r["case"], 100 * r["density"], cell(r, a), cell(r, p), cell(r, d),
            fmt(r, r.get("flex")), fmt(r, r.get("sdpa_fa2")), fmt(r, r.get("sdpa_cudnn")),
            "/".join(ratios)))
        for tag in ("sm90a", "sm90", "sm90a_det"):
            x = kc.get(tag, {})
            if "ms" in x and unchecked(r):
                print("%-15s   %-9s bwd alone %.3f ms; ? not checked: no reference (flex "
                      "left out)" % ("", tag, x["bwd_ms"]))
            elif "ms" in x:
                print("%-15s   %-9s bwd alone %.3f ms; rel L2 vs %s: O %.2e dQ %.2e dK %.2e "
                      "dV %.2e" % ("", tag, x["bwd_ms"], r.get("reference"), x["err_o"],
                                   x["err_dq"], x["err_dk"], x["err_dv"]))
            elif x:
                print("%-15s   %-9s ERROR %s" % ("", tag, x.get("error")))
        if "flex_block_mask_ms" in r:
            print("%-15s flex create_block_mask (compiled) per step: %.3f ms; kcache needs none "
                  "(anchors read in-kernel)" % ("", r["flex_block_mask_ms"]))


# ---------------------------------------------------------------------------
# Expression masks (issue 28): the translation units the real code generator
# writes (bench/attention/generated/, from expr_masks.py), beside flex_attention
# on the same mask_mod and, for the drafter, the built-in drafter mask.
# ---------------------------------------------------------------------------
def expr_case_inputs(name):
    """(B, Hq, Hkv, Lq, Lkv, D, buffers {slot: tensor}, dense bool mask fn(b, h) -> [Lq, Lkv],
    flex mask_mod, built-in drafter tuple or None)."""
    if name.startswith("drafter_expr"):
        S, N, Bk, B = 3072, 512, 16, 2
        g = torch.Generator(device="cuda").manual_seed(1234)
        anc = torch.randint(1, S + 1, (B, N), device="cuda", dtype=torch.int32, generator=g)
        if not name.endswith("random"):
            anc = torch.sort(anc, dim=1).values
        anc = anc.contiguous()
        Lq, Lkv = N * Bk, S + N * Bk

        def mm(b, h, qi, ki):
            j = qi // Bk
            return ((ki < S) & (ki < anc[b, j])) | ((ki >= S) & ((ki - S) // Bk == j))

        def dense(b, h):
            qi = torch.arange(Lq, device="cuda")[:, None]
            ki = torch.arange(Lkv, device="cuda")[None, :]
            return mm(b, h, qi, ki)
        return B, 32, 8, Lq, Lkv, 128, {0: anc}, dense, mm, (S, N, Bk, anc)
    if name == "neighbourhood_expr":
        W, R, B, H = 48, 3, 4, 16
        L = W * W

        def mm(b, h, qi, ki):
            return ((qi // W - ki // W).abs() <= R) & ((qi % W - ki % W).abs() <= R)

        def dense(b, h):
            qi = torch.arange(L, device="cuda")[:, None]
            ki = torch.arange(L, device="cuda")[None, :]
            return mm(b, h, qi, ki)
        return B, H, H, L, L, 128, {}, dense, mm, None
    if name == "head_window_expr":
        B, H, L = 2, 16, 8192
        win = torch.tensor([128, 256, 512, 1024] * (H // 4), device="cuda", dtype=torch.int32)

        def mm(b, h, qi, ki):
            return (ki <= qi) & (qi - ki < win[h])

        def dense(b, h):
            qi = torch.arange(L, device="cuda")[:, None]
            ki = torch.arange(L, device="cuda")[None, :]
            return mm(b, h, qi, ki)
        return B, H, H, L, L, 128, {0: win}, dense, mm, None
    raise ValueError(name)


def tile_classes_ref(dense, B, H, Lq, Lkv, bm, bn, reads_b, reads_h):
    """Exact classes per (b, h, query tile, key tile) from the dense mask: 0 / 1 / 2."""
    out = {}
    mt, nt = -(-Lq // bm), -(-Lkv // bn)
    for b in range(B if reads_b else 1):
        for h in range(H if reads_h else 1):
            m = dense(b, h)
            pad = torch.zeros(mt * bm, nt * bn, device="cuda", dtype=torch.int32)
            val = torch.zeros_like(pad)
            pad[:Lq, :Lkv] = m.int()
            val[:Lq, :Lkv] = 1
            vis = pad.view(mt, bm, nt, bn).sum((1, 3))
            cnt = val.view(mt, bm, nt, bn).sum((1, 3))
            out[(b, h)] = torch.where(vis == 0, 0, torch.where(vis == cnt, 2, 1)).to(torch.int8)
    return out


def run_expr_case(name, args, rows):
    import re
    import expr_masks as E
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    B, Hq, Hkv, Lq, Lkv, D, bufs, dense, mm, drafter = expr_case_inputs(name)
    base = "drafter_expr" if name.startswith("drafter_expr") else name
    dt = torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt)
    dout = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    res = {"case": name, "shape": [B, Hq, Hkv, Lq, Lkv, D]}
    gqa = Hq != Hkv

    o = torch.empty(B, Hq, Lq, D, device="cuda", dtype=dt)
    lse = torch.empty(B, Hq, Lq, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kc = {}
    variants = [("expr_" + a, K.generated_spec(E.load_source(base, a)), None) for a in E.ARCHES]
    for t in (args.tiles.split(",") if args.tiles else []):
        # Forward tile sweeps: the generator's translation unit with other KC_BLOCK_M/N,
        # KC_NUM_WARPS and KC_STAGES (what spec.tuning would make it write).
        # "+det": the deterministic backward (dQ kernel instead of fp32 atomics).
        a, dims = t.split(":")
        bm, bn, nw, st = (int(x) for x in dims.split("+")[0].split("x"))
        src = E.load_source(base, a)
        for key, val in (("BLOCK_M", bm), ("BLOCK_N", bn), ("NUM_WARPS", nw), ("STAGES", st),
                         ("DETERMINISTIC", int(dims.endswith("+det")))):
            src = re.sub(r"^#define KC_%s \d+$" % key, "#define KC_%s %d" % (key, val), src,
                         flags=re.M)
        variants.append(("expr_%s_%s" % (a, dims), K.generated_spec(src), None))
    if args.define:
        # A/B of a measurement switch: the sm_90a generated translation unit again with
        # the defines first (the kernels' switches are #ifndef-guarded), once per set, in
        # order; an empty set times the default again (interleaved runs: A;;A;).
        for n, defs in enumerate(args.define.split(";")):
            head = "".join("#define %s %s\n" % tuple(d.split("=", 1))
                           for d in defs.split(",") if d)
            variants.append(("expr_sm_90a+%s#%d" % (defs or "default", n), K.generated_spec(
                head + E.load_source(base, "sm_90a")), None))
    if drafter is not None:
        for a, sm90a in (("sm_90", False), ("sm_90a", True)):
            variants.append(("builtin_" + a, bwd_spec(D, "drafter",
                                                       K.select_tiles(90, D, D, sm90a, "drafter"),
                                                       sm90a, False, drafter[2]), drafter))
    for tag, spec, dr in variants:
        try:
            cubin, log = K.compile_spec(spec)
            kern = K.Kernel(spec, cubin)
            p = K.make_params(q, k, v, o, lse)
            tc = None
            if dr is not None:
                S, N, Bk, anc = dr
                p.drafter_anchor = anc.data_ptr()
                p.drafter_stride_b = anc.stride(0)
                p.drafter_context_len, p.drafter_num_blocks = S, N
            else:
                for i, t in bufs.items():
                    K.set_buffer(p, i, t)
                tc = kern.new_tile_classes(p)
            # The forward's classes serve the backward where the kernel allows it (as
            # kcache's client runs them): one classification per forward + backward.
            bl = kern.prepare_backward(p, dout, dq, dk, dv, classes=tc)

            def fwd(kern=kern, p=p, tc=tc):
                if tc is not None:
                    kern.launch_mask_build(p)
                kern.launch(p)

            def fwdbwd(fwd=fwd, bl=bl):
                fwd()
                bl.run()
            for t in (o, dq, dk, dv):
                t.fill_(float("nan"))
            fwdbwd()
            torch.cuda.synchronize()
            outs = [t.clone() for t in (o, dq, dk, dv)]  # checked against flex's below
            x = dict(fwd_ms=time_ms(fwd), fwdbwd_ms=time_ms(fwdbwd), outs=outs,
                     kernel_fwd_ms=time_ms(lambda: kern.launch(p)),
                     tiles=spec["tiles"], bwd_tiles=spec["bwd_tiles"],
                     ptxas={e: K.ptxas_summary(log, e) for e in (
                         "kcache_attn_fwd", "kcache_attn_mask_build", "kcache_attn_bwd_dkdv")})
            # Each backward launch alone (after a full run, so that its inputs are real).
            x["classes_shared"] = not bl.own_build
            x["bwd_launch_ms"] = {
                n.replace("kcache_attn_bwd_", ""): round(time_ms(
                    lambda n=n, g=g, t=t, sm=sm: kern._launch(kern.bwd[n], g, t, sm, bl.params)),
                    4) for n, g, t, sm in bl.launches()}
            if tc is not None:
                # Classification cost alone, and its exactness against the dense mask.
                x["mask_build_ms"] = time_ms(lambda: kern.launch_mask_build(p))
                src = spec["source"]
                rb = re.search(r"#define KC_EXPR_MASK_READS_B (\d)", src).group(1) == "1"
                rh = re.search(r"#define KC_EXPR_MASK_READS_H (\d)", src).group(1) == "1"
                want = tile_classes_ref(dense, B, Hq, Lq, Lkv, kern.class_block_m, kern.block_n,
                                        rb, rh)
                bad = sum(int((tc[b_, h_] != w).sum().item()) for (b_, h_), w in want.items())
                x["class_mismatch"] = bad
                x["class_hist"] = [int((want[(0, 0)] == c).sum().item()) for c in (0, 1, 2)]
            kc[tag] = x
            del bl, p, kern
        except Exception as e:
            import traceback
            traceback.print_exc()
            kc[tag] = dict(error=str(e)[:400])
    print("kcache %s: %s" % (name, json.dumps({t: {a: b for a, b in x.items() if a != "outs"}
                                               for t, x in kc.items()}, default=str)), flush=True)
    # flex: the same mask_mod, block mask built once outside the timed region (its build
    # time per call reported apart); fwd and fwd+bwd through autograd. After kcache's
    # timings: its first compile takes minutes on a fresh machine (run 2026-12-02).
    try:
        if args.no_flex:
            raise RuntimeError("not run (--no-flex)")
        flex = torch.compile(flex_attention, dynamic=False)
        bmask = create_block_mask(mm, B, Hq, Lq, Lkv, device="cuda", _compile=True)
        res["flex_block_mask_ms"] = time_ms(
            lambda: create_block_mask(mm, B, Hq, Lq, Lkv, device="cuda", _compile=True),
            warmup=2, rep=5)
        res["flex_fwd"] = time_ms(lambda: flex(q, k, v, block_mask=bmask, enable_gqa=gqa))
        f = fwd_bwd(lambda a, b_, c_: flex(a, b_, c_, block_mask=bmask, enable_gqa=gqa), q, k,
                    v, dout)
        ref = f()
        res["flex_fwdbwd"] = time_ms(f)
        del f
        for tag, x in kc.items():
            if "outs" in x:
                x.update(zip(("err_o", "err_dq", "err_dk", "err_dv"),
                             [rel_err(a_, b_) for a_, b_ in zip(x.pop("outs"), ref)]))
    except Exception as e:  # report and go on
        res["flex_error"] = str(e)[:300]
    for x in kc.values():
        x.pop("outs", None)
    res["kcache"] = kc
    rows.append(res)
    print(json.dumps(res), flush=True)
    del q, k, v, o, lse, dout, dq, dk, dv
    torch.cuda.empty_cache()


def print_expr_table(rows):
    for r in rows:
        r.setdefault("flex_fwd", float("nan"))
        r.setdefault("flex_fwdbwd", float("nan"))
        r.setdefault("flex_block_mask_ms", float("nan"))
    print("\nexpression masks (issue 28): ms, fwd / fwd+bwd; kcache includes its tile "
          "classification; flex's block mask is built outside the timed region")
    for r in rows:
        print("%s %s  flex %.3f / %.3f ms (create_block_mask %.3f ms)" % (
            r["case"], r["shape"], r["flex_fwd"], r["flex_fwdbwd"], r["flex_block_mask_ms"]))
        for tag, x in r["kcache"].items():
            if "fwd_ms" not in x:
                print("   %-14s ERROR %s" % (tag, x.get("error")))
                continue
            ok = all(x.get(e, 1.0) == x.get(e, 1.0) and x.get(e, 1.0) < 2e-2
                     for e in ("err_o", "err_dq", "err_dk", "err_dv"))
            extra = ""
            if "mask_build_ms" in x:
                extra = " build %.3f ms, class mismatches %d, classes 0/1/2 %s" % (
                    x["mask_build_ms"], x["class_mismatch"], x["class_hist"])
            extra += " (forward kernel alone %.3f ms; backward launches %s)" % (
                x.get("kernel_fwd_ms", float("nan")), x.get("bwd_launch_ms"))
            print("   %-14s %.3f / %.3f ms  vs flex %.2fx / %.2fx  err O %.1e dQ %.1e dK %.1e "
                  "dV %.1e %s%s" % (tag, x["fwd_ms"], x["fwdbwd_ms"], r["flex_fwd"] / x["fwd_ms"],
                                    r["flex_fwdbwd"] / x["fwdbwd_ms"], x.get("err_o", -1),
                                    x.get("err_dq", -1), x.get("err_dk", -1), x.get("err_dv", -1),
                                    "ok" if ok else "FAIL (or no flex reference)", extra))
        kc = r["kcache"]
        for a in ("sm_90", "sm_90a"):
            e, b = kc.get("expr_" + a, {}), kc.get("builtin_" + a, {})
            if "fwd_ms" in e and "fwd_ms" in b:
                print("   expr/builtin %s: fwd %.2fx, fwd+bwd %.2fx (target <= 1.25x)" % (
                    a, e["fwd_ms"] / b["fwd_ms"], e["fwdbwd_ms"] / b["fwdbwd_ms"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None)
    ap.add_argument("--precompile", action="store_true", help="NVRTC only (no GPU, no torch)")
    ap.add_argument("--backward", action="store_true",
                    help="forward + backward (kcache's backward sequence, flex and SDPA "
                    "through autograd) instead of the forward")
    ap.add_argument("--jobs", type=int, default=None, help="parallel NVRTC processes")
    ap.add_argument("--tiles", default=None,
                    help="with --expr: extra forward tilings to time, ARCH:BMxBNxWARPSxSTAGES,... "
                    "(e.g. sm_90a:64x64x4x2; a +det suffix: the deterministic backward)")
    ap.add_argument("--define", default=None,
                    help="with --expr: also time the sm_90a generated kernels with these "
                    "defines first, NAME=VALUE,... (a measurement switch's other side); "
                    "several sets separated by ';', an empty one the default again")
    ap.add_argument("--flex-mask", choices=("compiled", "eager"), default="compiled",
                    help="how flex's drafter block mask is built: compiled (the per-step "
                    "figure trainers would see; its first compile takes minutes) or eager "
                    "(same mask, so the same flex kernel times, without that compile)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved timing rounds per case (time_rounds)")
    ap.add_argument("--expr", action="store_true",
                    help="the expression-mask cases (issue 28): drafter_expr, drafter_expr_random, "
                    "neighbourhood_expr, head_window_expr (or --only)")
    args = ap.parse_args()
    if args.define and any("=" not in d for defs in args.define.split(";")
                           for d in defs.split(",") if d):
        ap.error("--define: each define is NAME=VALUE (sets separated by ';', defines by ',')")
    global torch, ROUNDS
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    ROUNDS = args.rounds
    if args.expr:
        import torch as _t
        torch = _t
        sys.path.insert(0, HERE)
        print("torch", torch.__version__, "device", torch.cuda.get_device_name(0), flush=True)
        rows = []
        for c in (args.only.split(",") if args.only else
                  ["drafter_expr", "neighbourhood_expr", "head_window_expr",
                   "drafter_expr_random"]):
            run_expr_case(c, args, rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1, default=str)
        print_expr_table(rows)
        return
    if args.backward:
        # Compile every backward variant first, in parallel (before torch touches the GPU).
        specs = [bwd_spec(d, mask, tiles, sm90a, det)
                 for mask, d in (("causal", 128), ("none", 128), ("causal", 64), ("drafter", 128))
                 for _, tiles, sm90a, det in bwd_variants(d, mask)]
        for sp, (cl, err) in zip(specs, K.compile_many(specs, args.jobs)):
            desc = "%s d%d sm90a=%s det=%s" % (sp["mask"], sp["dqk"], sp["sm90a"],
                                                sp["deterministic"])
            if err:
                print("COMPILE FAIL", desc, err[-2000:])
            elif args.precompile:
                print(desc, "; ".join("%s %s" % (e, K.ptxas_summary(cl[1], e)) for e in (
                    "kcache_attn_fwd", "kcache_attn_bwd_dkdv", "kcache_attn_bwd_dq",
                    "kcache_attn_bwd_dq_convert") if "'%s'" % e in cl[1]))
        if args.precompile:
            return
    if args.precompile:
        for mask, d in (("causal", 128), ("none", 128), ("causal", 64), ("drafter", 128)):
            for _, tiles, sm90a, extra in tile_variants(d, mask):
                _, log = K.compile_spec(K.make_spec("bf16", d, d, mask=mask, tiles=tiles,
                                                    sm90a=sm90a, extra_defines=extra))
                print(mask, d, tiles, sm90a, extra, K.ptxas_summary(log))
        return
    import torch as _torch
    torch = _torch
    print("torch", torch.__version__, "device", torch.cuda.get_device_name(0), flush=True)
    rows = []
    cases = ["causal_d128", "none_d128", "causal_d64", "drafter_sorted", "drafter_random"]
    if args.only:
        cases = args.only.split(",")
    run = run_case_bwd if args.backward else run_case
    for c in cases:
        if c in DENSE_CASES:
            B, Hq, Hkv, L, D, mask = DENSE_CASES[c]
            run(c, B, Hq, Hkv, L, L, D, mask, args, rows)
        elif c.startswith("drafter"):
            S, N, Bk, B = 3072, 512, 16, 2
            g = torch.Generator(device="cuda").manual_seed(1234)
            anc = torch.randint(1, S + 1, (B, N), device="cuda", dtype=torch.int32, generator=g)
            if c == "drafter_sorted":
                anc = torch.sort(anc, dim=1).values
            run(c, B, 32, 8, N * Bk, S + N * Bk, 128, "drafter", args, rows,
                drafter=(S, N, Bk, anc.contiguous()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.backward:
        print_bwd_table(rows)
        return
    # Short table last: the two defaults (sm_90a wgmma, plain sm_90 mma.sync)
    # beside the peers; ratio = peer time / kcache time (> 1: kcache faster).
    def fmt(r, ms):
        return "%.3f ms %4.0f TF" % (ms, r["flop"] / ms / 1e9) if ms else "-"
    print("\n%-15s %6s | %-17s | %-17s | %-17s | %-17s | %-17s | %s" %
          ("case", "dens", "kcache sm_90a", "kcache sm_90", "flex", "sdpa fa2", "sdpa cudnn",
           "sm_90a vs flex/fa2/cudnn; sm_90 vs flex"))
    for r in rows:
        a = r["kcache"].get("sm90a", {})
        p = r["kcache"].get("sm90", {})
        ok = lambda v: "ms" in v and v["err"] == v["err"] and v["err"] < 2e-2  # noqa: E731
        ratios = []
        for peer in ("flex", "sdpa_fa2", "sdpa_cudnn"):
            if ok(a) and r.get(peer):
                ratios.append("%.2fx" % (r[peer] / a["ms"]))
            else:
                ratios.append("-")
        rp = "%.2fx" % (r["flex"] / p["ms"]) if ok(p) and r.get("flex") else "-"
        print("%-15s %5.1f%% | %-17s | %-17s | %-17s | %-17s | %-17s | %s; %s" %
              (r["case"], 100 * r["density"], fmt(r, a.get("ms")) if ok(a) else "FAIL",
               fmt(r, p.get("ms")) if ok(p) else "FAIL", fmt(r, r.get("flex")),
               fmt(r, r.get("sdpa_fa2")), fmt(r, r.get("sdpa_cudnn")), "/".join(ratios), rp))
        if "flex_block_mask_ms" in r:
            print("%-15s flex create_block_mask (compiled) per step: %.3f ms; kcache needs none "
                  "(anchors read in-kernel)" % ("", r["flex_block_mask_ms"]))


if __name__ == "__main__":
    main()
