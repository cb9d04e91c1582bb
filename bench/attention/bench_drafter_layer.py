#!/usr/bin/env python3
"""Issue 27's layer benchmark: forward + backward of one drafter decoder layer, the same
layer and weights with four attentions, in one process:

  kcache            kcache.attention with the built-in kcache.drafter spec (anchors and
                    keep as launch inputs: nothing to build per step)
  kcache_flex       kcache.flex_attention with SpecForge's DFlash mask_mod, recorded
                    each step by kcache.create_block_mask
  flex_eager_mask   torch.compile(flex_attention) with torch's create_block_mask built
                    eagerly each step (as SpecForge calls it)
  flex_compiled_mask  the same with create_block_mask(_compile=True): its first build
                    compiles for minutes (reported); --no-compiled-mask skips it
  no_attention      the layer with the attention replaced by a copy of its queries (the
                    floor: everything but attention)

The layer (pre-norm, as a Llama decoder layer): RMSNorm, Q from the draft tokens, K and V
from [context | draft tokens] (GQA), attention under the DFlash drafter mask (each block
of `block` draft tokens sees the context before its anchor and its own block), O
projection and residual, RMSNorm, SwiGLU MLP and residual. New anchors every step. Default
shape: B2, hidden 4096, 32/8 heads, D128, context 3072 + 512 blocks of 16, MLP 12288,
bf16. Prints per variant the first step (with its compiles) and the median step after
warm-up, then kcache's step against flex's best (target >= 1.1x). --profile N then runs N
more steps of each variant under torch.profiler and prints its CUDA kernels' time a step
(where a variant's share of the step goes, and how much of the step is host gaps).

  KCACHE_TARGET=unix:/path/kcached.sock python3 bench/attention/bench_drafter_layer.py
"""

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


class DrafterLayer(torch.nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, mlp):
        super().__init__()
        self.h, self.hkv, self.d = heads, kv_heads, head_dim
        self.n1 = torch.nn.Parameter(torch.ones(hidden))
        self.n2 = torch.nn.Parameter(torch.ones(hidden))
        self.q = torch.nn.Linear(hidden, heads * head_dim, bias=False)
        self.kv = torch.nn.Linear(hidden, 2 * kv_heads * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, hidden, bias=False)
        self.gate_up = torch.nn.Linear(hidden, 2 * mlp, bias=False)
        self.down = torch.nn.Linear(mlp, hidden, bias=False)

    def forward(self, ctx, draft, attend):
        B, N, _ = draft.shape
        x = rms_norm(draft, self.n1)
        keys = torch.cat([rms_norm(ctx, self.n1), x], dim=1)
        q = self.q(x).view(B, N, self.h, self.d).transpose(1, 2).contiguous()
        kv = self.kv(keys).view(B, -1, 2, self.hkv, self.d).permute(2, 0, 3, 1, 4)
        k, v = kv[0].contiguous(), kv[1].contiguous()
        a = attend(q, k, v)
        h = draft + self.o(a.transpose(1, 2).reshape(B, N, -1))
        g, u = self.gate_up(rms_norm(h, self.n2)).chunk(2, dim=-1)
        return h + self.down(F.silu(g) * u)


def dflash_mask_mod(anchors, keep, S, block):
    def mask_mod(b, h, q_idx, kv_idx):
        j = q_idx // block
        context = (kv_idx < S) & (kv_idx < anchors[b, j])
        own = (kv_idx >= S) & (j == (kv_idx - S) // block)
        return (context | own) & keep[b, j]
    return mask_mod


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mlp", type=int, default=12288)
    ap.add_argument("--context", type=int, default=3072)
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated variant names")
    ap.add_argument("--no-compiled-mask", action="store_true")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="after timing, profile STEPS more steps of each variant (torch.profiler) "
                         "and print its CUDA kernels' time per step and the GPU's idle time")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_drafter_layer: needs a CUDA GPU", file=sys.stderr)
        return 2
    import kcache
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dev, dt = "cuda", torch.bfloat16
    B, S, N, bs = args.batch, args.context, args.blocks, args.block
    L, KV = N * bs, S + N * bs
    torch.manual_seed(0)
    layer = DrafterLayer(args.hidden, args.heads, args.kv_heads, args.head_dim,
                         args.mlp).to(dev, dt)
    ctx = torch.randn(B, S, args.hidden, device=dev, dtype=dt)
    draft = torch.randn(B, L, args.hidden, device=dev, dtype=dt, requires_grad=True)
    gout = torch.randn(B, L, args.hidden, device=dev, dtype=dt)
    keep = torch.ones(B, N, dtype=torch.bool, device=dev)
    flex = torch.compile(flex_attention, dynamic=False)
    spec = dict(mask=kcache.drafter(bs))

    def step_inputs():
        return torch.randint(1, S, (B, N), device=dev)  # new anchors every step

    def kcache_builtin(anchors):
        a32 = anchors.to(torch.int32)
        return lambda q, k, v: kcache.attention(q, k, v, spec, anchors=a32, keep=keep)

    def kcache_flex(anchors):
        bm = kcache.create_block_mask(dflash_mask_mod(anchors, keep, S, bs), B, None, L, KV,
                                      device=dev)
        return lambda q, k, v: kcache.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)

    def flex_with(compiled):
        def make(anchors):
            bm = create_block_mask(dflash_mask_mod(anchors, keep, S, bs), B, None, L, KV,
                                   device=dev, _compile=compiled)
            return lambda q, k, v: flex(q, k, v, block_mask=bm, enable_gqa=True)
        return make

    def no_attention(anchors):
        del anchors
        return lambda q, k, v: q * 1.0  # keeps q's graph: the layer without attention

    variants = [("kcache", kcache_builtin), ("kcache_flex", kcache_flex),
                ("flex_eager_mask", flex_with(False))]
    if not args.no_compiled_mask:
        variants.append(("flex_compiled_mask", flex_with(True)))
    variants.append(("no_attention", no_attention))
    if args.only:
        keep_names = set(args.only.split(","))
        variants = [v for v in variants if v[0] in keep_names]

    def run(make):
        layer.zero_grad(set_to_none=True)
        draft.grad = None
        attend = make(step_inputs())  # the mask build is part of the step
        layer(ctx, draft, attend).backward(gout)

    res = {}
    print("layer: B%d hidden %d heads %d/%d D%d MLP %d, context %d + %d blocks of %d, bf16, "
          "fwd+bwd, new anchors each step; %s" % (
              B, args.hidden, args.heads, args.kv_heads, args.head_dim, args.mlp, S, N, bs,
              torch.cuda.get_device_name(0)), flush=True)
    for name, make in variants:
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(make)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            for _ in range(args.warmup):
                run(make)
            times = []
            for _ in range(args.steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                run(make)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            res[name] = statistics.median(times) * 1e3
            print("%-19s first step %8.1f ms   step %7.2f ms (median of %d; min %.2f)" % (
                name, first * 1e3, res[name], args.steps, min(times) * 1e3), flush=True)
            if args.profile > 0:
                profile_steps(name, lambda: run(make), args.profile)
        except Exception as e:  # report and go on to the next variant
            print("%-19s ERROR %s" % (name, str(e)[:300]), flush=True)
    flex_best = min((res[n] for n in ("flex_eager_mask", "flex_compiled_mask") if n in res),
                    default=None)
    if flex_best is not None:
        for n in ("kcache", "kcache_flex"):
            if n in res:
                print("%s vs flex's best: %.3fx (target >= 1.1x)" % (n, flex_best / res[n]))
    if "no_attention" in res:
        for n, t in res.items():
            if n != "no_attention":
                print("%-19s attention's share of the step: %.2f ms" % (n, t - res["no_attention"]))
    return 0


def profile_steps(name, step, steps):
    """CUDA kernels of `steps` steps by time (ms a step), and the step's GPU time against its
    wall time: where attention's share of the step goes, kernels or host gaps."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / steps
    kernels = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels[ev.name] = kernels.get(ev.name, 0.0) + ev.device_time_total / 1e3 / steps
    busy = sum(kernels.values())
    print("%-19s profile: wall %.2f ms a step, CUDA work %.2f ms (the rest: host gaps)" % (
        name, wall, busy), flush=True)
    for k, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]:
        print("    %7.3f ms  %s" % (t, k[:110]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
