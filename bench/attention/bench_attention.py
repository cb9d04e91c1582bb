"""Forward-attention benchmark: kcache_attn_fwd beside flex_attention and SDPA.

Cases (docs: /work/shared/DEVICE.md): causal B4 H32 S4096 D128; no mask B4
H32 S4096 D128; causal B8 H32 S2048 D64; the drafter training shape (B2,
32 query / 8 kv heads, D128, context 3072, 512 blocks of 16: q_len 8192,
kv_len 11264) with sorted and with unsorted random anchors.

TFLOP/s count only visible (q, kv) pairs, counted exactly from the mask:
4 * pairs * D per head. Times: median of CUDA-event timings after warm-up.
Every input set is larger than the 60 MB L2, so no rotation is needed.

  python3 bench/attention/bench_attention.py [--no-flex] [--json FILE]
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


def tile_variants(d):
    """(tag, tiles, sm90a, extra defines) to time. "sm90" and "sm90a" are the
    defaults SelectAttentionTiles gives for plain sm_90 (portable mma.sync
    path) and sm_90a (wgmma); the others are alternatives kept for the notes."""
    nopp = (("KC_SM90A_PINGPONG", "0"),)
    out = [("sm90", K.select_tiles(90, d, d), False, ()),
           ("sm90a", K.select_tiles(90, d, d, True), True, ())]
    if d == 64:
        out += [("alt_128_128_8_2_sm90a", (128, 128, 8, 2), True, ())]
    else:
        out += [("alt_128_128_8_2_sm90a_nopp", (128, 128, 8, 2), True, nopp),
                ("alt_128_64_8_2_sm90a", (128, 64, 8, 2), True, ()),
                ("alt_128_128_8_2_sm90", (128, 128, 8, 2), False, ())]
    return out


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
    if mask == "causal":
        pairs = Lq * (Lq + 1) // 2
    elif mask == "none":
        pairs = Lq * Lkv
    else:
        S, N, Bk, anc = drafter
        a = anc[:, :N].clamp(max=S).long()
        pairs = int((Bk * (a + Bk)).sum().item()) / B  # per batch on average
    flops = 4.0 * pairs * D * Hq * B
    res["density"] = pairs / (Lq * Lkv)
    res["flop"] = flops

    ref = None
    if mask in ("causal", "none"):
        from torch.nn.attention import sdpa_kernel, SDPBackend
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                   is_causal=mask == "causal")
        for label, be in (("sdpa_fa2", SDPBackend.FLASH_ATTENTION),
                          ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    f = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                        q, k, v, is_causal=mask == "causal")
                    res[label] = time_ms(f)
            except Exception as e:  # a backend may refuse a shape
                res[label + "_error"] = str(e)[:200]

    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import flex_attention, create_block_mask
            flex = torch.compile(flex_attention, dynamic=False)
            if mask == "causal":
                def mm(b, h, qi, ki):
                    return qi >= ki
                bm = create_block_mask(mm, None, None, Lq, Lkv, device="cuda")
            elif mask == "none":
                bm = None
            else:
                S, N, Bk, anc = drafter
                anc_d = anc

                def mm(b, h, qi, ki):
                    j = qi // Bk
                    a = anc_d[b, j]
                    ctx = (ki < S) & (ki < a)
                    own = (ki >= S + j * Bk) & (ki < S + (j + 1) * Bk)
                    return ctx | own
                bm = create_block_mask(mm, B, None, Lq, Lkv, device="cuda", _compile=True)
                res["flex_block_mask_ms"] = time_ms(
                    lambda: create_block_mask(mm, B, None, Lq, Lkv, device="cuda", _compile=True),
                    warmup=2, rep=10)
            gqa = Hq != Hkv
            fo = flex(q, k, v, block_mask=bm, enable_gqa=gqa)
            res["flex"] = time_ms(lambda: flex(q, k, v, block_mask=bm, enable_gqa=gqa))
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
    for tag, tiles, sm90a, extra in tile_variants(D):
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
            t = time_ms(fn)
            kc[tag] = dict(ms=t, tflops=flops / t / 1e9, err=err, ptxas=r.ptxas,
                           tiles="%d_%d_%d_%d" % tiles)
        except Exception as e:
            kc[tag] = dict(error=str(e)[:300])
    res["kcache"] = kc
    rows.append(res)
    print(json.dumps(res), flush=True)
    del q, k, v, o, lse, ref
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None)
    ap.add_argument("--precompile", action="store_true", help="NVRTC only (no GPU, no torch)")
    args = ap.parse_args()
    if args.precompile:
        for mask, d in (("causal", 128), ("none", 128), ("causal", 64), ("drafter", 128)):
            for _, tiles, sm90a, extra in tile_variants(d):
                _, log = K.compile_spec(K.make_spec("bf16", d, d, mask=mask, tiles=tiles,
                                                    sm90a=sm90a, extra_defines=extra))
                print(mask, d, tiles, sm90a, extra, K.ptxas_summary(log))
        return
    global torch
    import torch as _torch
    torch = _torch
    print("torch", torch.__version__, "device", torch.cuda.get_device_name(0), flush=True)
    rows = []
    cases = ["causal_d128", "none_d128", "causal_d64", "drafter_sorted", "drafter_random"]
    if args.only:
        cases = args.only.split(",")
    for c in cases:
        if c == "causal_d128":
            run_case(c, 4, 32, 32, 4096, 4096, 128, "causal", args, rows)
        elif c == "none_d128":
            run_case(c, 4, 32, 32, 4096, 4096, 128, "none", args, rows)
        elif c == "causal_d64":
            run_case(c, 8, 32, 32, 2048, 2048, 64, "causal", args, rows)
        elif c.startswith("drafter"):
            S, N, Bk, B = 3072, 512, 16, 2
            g = torch.Generator(device="cuda").manual_seed(1234)
            anc = torch.randint(1, S + 1, (B, N), device="cuda", dtype=torch.int32, generator=g)
            if c == "drafter_sorted":
                anc = torch.sort(anc, dim=1).values
            run_case(c, B, 32, 8, N * Bk, S + N * Bk, 128, "drafter", args, rows,
                     drafter=(S, N, Bk, anc.contiguous()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
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
