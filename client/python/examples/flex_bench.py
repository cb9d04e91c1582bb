#!/usr/bin/env python3
"""GPU measurements for kcache.flex_attention (issue 15):

  first   a new process's first attention result against a warm daemon, beside torch's own
          first-call floor (the first SDPA call) in the same process;
  drafter a training step (forward + backward) of the DFlash mask written as a SpecForge
          mask_mod through kcache.flex_attention (recorded each step, new anchors), against
          kcache.attention with the built-in kcache.drafter spec on the same tensors.

  KCACHE_TARGET=unix:/path/kcached.sock python3 client/python/examples/flex_bench.py first
  KCACHE_TARGET=... python3 client/python/examples/flex_bench.py drafter [--context 4096 ...]

"first" needs the kernel in the daemon's store already (run it twice: the second run is the
measurement, the script says which it saw).
"""

import argparse
import statistics
import sys
import time

T0 = time.perf_counter()


def first(args):
    import torch
    import kcache
    t_import = time.perf_counter() - T0
    dev = "cuda"
    q = torch.randn(1, 8, 1024, 128, device=dev, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    t_sdpa = time.perf_counter() - t0
    prof = None
    if args.profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    bm = kcache.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, 1, None, 1024,
                                  1024, device=dev)
    out = kcache.flex_attention(q, k, v, block_mask=bm)
    torch.cuda.synchronize()
    t_first = time.perf_counter() - t0
    if prof is not None:
        # Where the first result's time goes (cProfile inflates small calls: the total
        # above is the figure; this is the breakdown).
        import pstats
        prof.disable()
        st = pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative")
        st.print_stats(45)
        st.sort_stats("tottime").print_stats(25)
    t0 = time.perf_counter()
    kcache.flex_attention(q, k, v, block_mask=bm)
    torch.cuda.synchronize()
    t_second = time.perf_counter() - t0
    hit = kcache.default_client().get_kernel(
        kcache.flex.parse(kcache._protos.modules()[0].AttentionSpec,
                          kcache.flex.spec_text(bm._part.text, None, (), (), "bf16", 128, 128,
                                                8, 8, None)),
        arch=kcache.arch_for_capability(*torch.cuda.get_device_capability())).cache_hit
    print("import kcache+torch %.1f ms" % (t_import * 1e3))
    print("torch first SDPA call (floor) %.1f ms" % (t_sdpa * 1e3))
    print("kcache first flex_attention result %.1f ms (daemon cache hit: %s)"
          % (t_first * 1e3, hit))
    print("kcache second call %.2f ms" % (t_second * 1e3))
    del out


def drafter(args):
    import torch
    import kcache
    dev = "cuda"
    B, S, N, bs, Hq, Hkv, D = (args.batch, args.context, args.blocks, args.block_size, 32, 8,
                               128)
    L, KV = N * bs, S + N * bs
    q = torch.randn(B, Hq, L, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, Hkv, KV, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, Hkv, KV, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    gout = torch.randn(B, Hq, L, D, device=dev, dtype=torch.bfloat16)
    keep = torch.ones(B, N, dtype=torch.bool, device=dev)

    def flex_step():
        anchors = torch.randint(1, S, (B, N), device=dev)

        def mask_mod(b, h, q_idx, kv_idx):
            j = q_idx // bs
            context = (kv_idx < S) & (kv_idx < anchors[b, j])
            own = (kv_idx >= S) & (j == (kv_idx - S) // bs)
            return (context | own) & keep[b, j]
        bm = kcache.create_block_mask(mask_mod, B, None, L, KV, device=dev)
        kcache.flex_attention(q, k, v, block_mask=bm, enable_gqa=True).backward(gout)

    spec = dict(mask=kcache.drafter(bs))

    def builtin_step():
        # The built-in drafter reads int32 anchors; the mask_mod above takes a
        # trainer's int64 ones (kcache converts them at launch, inside the timing).
        anchors = torch.randint(1, S, (B, N), device=dev, dtype=torch.int32)
        kcache.attention(q, k, v, spec, anchors=anchors, keep=keep).backward(gout)

    res = {}
    for name, fn in (("flex mask_mod", flex_step), ("kcache.drafter", builtin_step)):
        for _ in range(3):
            fn()
        times = []
        for _ in range(args.iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        res[name] = statistics.median(times) * 1e3
        print("%-16s fwd+bwd %.3f ms (median of %d)" % (name, res[name], args.iters))
    print("ratio %.3f (target <= 1.10)" % (res["flex mask_mod"] / res["kcache.drafter"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("first", "drafter"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--profile", action="store_true",
                    help="first: print a cProfile breakdown of the first result")
    args = ap.parse_args()
    {"first": first, "drafter": drafter}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
