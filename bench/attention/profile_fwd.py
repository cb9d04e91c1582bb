"""One attention kernel variant launched a few times, for a profiler to pick one launch:

  ncu --clock-control none --set full -k regex:kcache_attn_fwd --launch-skip 2 \
      --launch-count 1 -o OUT python3 bench/attention/profile_fwd.py causal_d128

Cases: causal_d128, none_d128 (B4 H32 S4096, the dense benchmark shapes),
drafter_sorted and drafter_random (the drafter training shape of bwd_variants.py) and the
expression masks of bench_attention.py --expr (head_window_expr, neighbourhood_expr,
drafter_expr), whose kernels are the generator's translation units. sm_90a builds;
--backward also runs the backward sequence after each forward (its kernels' names start
with kcache_attn_bwd_). The mask build of an expression mask runs before each forward.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "kernels"))
import kc_attn as K  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=("causal_d128", "none_d128", "drafter_sorted",
                                     "drafter_random", "head_window_expr",
                                     "neighbourhood_expr", "drafter_expr"))
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--launches", type=int, default=4)
    args = ap.parse_args()
    expr = args.case.endswith("_expr")
    if expr:
        import expr_masks as E
        spec = K.generated_spec(E.load_source(args.case, "sm_90a"))
    else:
        mask = args.case.split("_")[0]
        spec = K.make_spec("bf16", 128, 128, mask=mask, backward=True, sm90a=True,
                           drafter_block=16)
    cubin, _ = K.compile_spec(spec)

    import torch
    import bench_attention as BA
    BA.torch = torch
    drafter = None
    if expr:
        B, Hq, Hkv, Lq, Lkv, D, bufs, _, _, _ = BA.expr_case_inputs(args.case)
    elif mask == "drafter":
        B, S, N, Bk = 2, 3072, 512, 16
        g = torch.Generator(device="cuda").manual_seed(1234)
        anc = torch.randint(1, S + 1, (B, N), device="cuda", dtype=torch.int32, generator=g)
        if args.case == "drafter_sorted":
            anc = torch.sort(anc, dim=1).values.contiguous()
        B, Hq, Hkv, Lq, Lkv, D, bufs = B, 32, 8, N * Bk, S + N * Bk, 128, {}
        drafter = (S, N, anc)
    else:
        B, Hq, Hkv, Lq, D, _ = BA.DENSE_CASES[args.case]
        Lkv, bufs = Lq, {}
    dt = torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=dt)
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, Lq, device="cuda", dtype=torch.float32)
    kern = K.Kernel(spec, cubin)
    p = K.make_params(q, k, v, o, lse)
    for i, t in bufs.items():
        K.set_buffer(p, i, t)
    if drafter is not None:
        S, N, anc = drafter
        p.drafter_anchor = anc.data_ptr()
        p.drafter_stride_b = anc.stride(0)
        p.drafter_context_len, p.drafter_num_blocks = S, N
    tc = None
    if expr:
        tc = kern.new_tile_classes(p)
    bl = None
    if args.backward:
        bl = kern.prepare_backward(p, torch.randn_like(q), torch.empty_like(q),
                                   torch.empty_like(k), torch.empty_like(v), classes=tc)
    for _ in range(args.launches):
        if tc is not None:
            kern.launch_mask_build(p)
        kern.launch(p)
        if bl is not None:
            bl.run()
    torch.cuda.synchronize()
    print("ran", args.case, args.launches, "times")


if __name__ == "__main__":
    main()
