"""Per-kernel device times of one forward + backward, kcache's sm_90a kernels beside SDPA
cuDNN's, under torch.profiler (CUPTI sees the driver-API launches of kcache's cubins too):
which kernel of a backward sequence holds the gap.

  python3 bench/attention/kernel_times.py [causal_d128|none_d128|causal_d64] [--reps 10]

kcache's cubin comes from .devcarry/cubins (compiled with NVRTC when missing; KC_EXTRA_DEFINES
applies, as in the other kernel tools). cuDNN's gradients are taken with torch.autograd.grad, so
that no accumulation into .grad adds kernels of its own. Times are means over --reps calls
after three warm-ups.
"""
import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "kernels"))
import bench_attention as BA  # noqa: E402
import kc_attn as K  # noqa: E402


def kernel_table(torch, fn, reps):
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name][0] += 1
            agg[e.name][1] += e.device_time  # microseconds
    return sorted(((t / reps, c / reps, n) for n, (c, t) in agg.items()), reverse=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", nargs="?", default="causal_d128", choices=sorted(BA.DENSE_CASES))
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    B, H, _, S, D, mask = BA.DENSE_CASES[args.case]
    # bench_attention's sm_90a forward + backward kernel of the case, the same cubin.
    spec = BA.bwd_spec(D, mask, K.select_tiles(90, D, D, True, mask), True, False)
    cubin, _ = K.compile_spec(spec)

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    kern = K.Kernel(spec, cubin)
    o = torch.empty_like(q)
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    p = K.make_params(q, k, v, o, lse)
    bl = kern.prepare_backward(p, do, torch.empty_like(q), torch.empty_like(k),
                               torch.empty_like(v))

    def kcache():
        kern.launch(p)
        bl.run()

    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv,
                                                                   is_causal=mask == "causal")
        torch.autograd.grad(out, (qq, kk, vv), do)

    print("%s B%d H%d S%d D%d, bf16, forward + backward; %s; mean of %d calls" %
          (args.case, B, H, S, D, torch.cuda.get_device_name(), args.reps))
    for name, fn in (("kcache sm_90a", kcache), ("SDPA cuDNN", cudnn)):
        rows = kernel_table(torch, fn, args.reps)
        print("== %s: %.3f ms of kernels" % (name, sum(t for t, _, _ in rows) / 1000))
        for t, c, n in rows:
            print("  %9.1f us  x%-4g %s" % (t, c, n[:140]))


if __name__ == "__main__":
    main()
