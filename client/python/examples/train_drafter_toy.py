#!/usr/bin/env python3
"""Trains a toy drafter-attention layer for a few steps with kcache.flex_attention and with
torch's flex_attention (compiled), from the same initial weights and data, and prints both
losses and step times. The mask is SpecForge's DFlash mask_mod (context before each
block's anchor, plus the block itself), with new anchors every step: kcache records it in
microseconds; torch's create_block_mask builds its block tables each step.

  KCACHE_TARGET=unix:/path/kcached.sock python3 client/python/examples/train_drafter_toy.py

Needs a CUDA GPU, torch >= 2.5 and a running kcached (compile-only is enough).
"""

import argparse
import copy
import time

import torch
from torch.nn.attention import flex_attention as tfa

import kcache


def dflash_mask_mod(anchors, keep, S, block_size):
    def mask_mod(b, h, q_idx, kv_idx):
        j = q_idx // block_size
        context = (kv_idx < S) & (kv_idx < anchors[b, j])
        own_block = (kv_idx >= S) & (j == (kv_idx - S) // block_size)
        return (context | own_block) & keep[b, j]
    return mask_mod


class DrafterAttention(torch.nn.Module):
    """Queries from the draft blocks; keys and values from [context | draft blocks]."""

    def __init__(self, dim, heads, kv_heads, head_dim):
        super().__init__()
        self.h, self.hkv, self.d = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(dim, heads * head_dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, ctx, draft, block_mask, attention):
        B, N, _ = draft.shape
        keys = torch.cat([ctx, draft], dim=1)
        q = self.q(draft).view(B, N, self.h, self.d).transpose(1, 2)
        k, v = self.kv(keys).view(B, -1, 2, self.hkv, self.d).permute(2, 0, 3, 1, 4)
        out = attention(q.contiguous(), k.contiguous(), v.contiguous(), block_mask=block_mask,
                        enable_gqa=True)
        return self.o(out.transpose(1, 2).reshape(B, N, -1))


def train(name, model, data, attention, make_mask, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, losses = [], []
    for step in range(steps):
        ctx, draft, target, anchors, keep, S, bs = data[step]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mask_mod = dflash_mask_mod(anchors, keep, S, bs)
        bm = make_mask(mask_mod, ctx.shape[0], None, draft.shape[1], S + draft.shape[1],
                       device="cuda")
        loss = torch.nn.functional.mse_loss(model(ctx, draft, bm, attention).float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        print("%-6s step %2d  loss %.5f  %.2f ms" % (name, step, losses[-1], times[-1] * 1e3))
    return losses, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dim", type=int, default=1024)
    args = ap.parse_args()
    torch.manual_seed(0)
    B, S, N, bs, dim = args.batch, args.context, args.blocks, args.block_size, args.dim
    data = []
    for _ in range(args.steps):
        data.append((torch.randn(B, S, dim, device="cuda", dtype=torch.bfloat16),
                     torch.randn(B, N * bs, dim, device="cuda", dtype=torch.bfloat16),
                     torch.randn(B, N * bs, dim, device="cuda"),
                     torch.randint(1, S, (B, N), device="cuda"),
                     torch.rand(B, N, device="cuda") > 0.1, S, bs))
    base = DrafterAttention(dim, 16, 4, 128).cuda().to(torch.bfloat16)
    flex = torch.compile(tfa.flex_attention)
    runs = [("kcache", kcache.flex_attention, kcache.create_block_mask),
            ("flex", flex, tfa.create_block_mask)]
    results = {}
    for name, attention, make_mask in runs:
        results[name] = train(name, copy.deepcopy(base), data, attention, make_mask, args.steps)
    print()
    for name, (losses, times) in results.items():
        warm = sorted(times[2:]) or times
        print("%-6s final loss %.5f  median step (after 2 warm-up steps) %.2f ms"
              % (name, losses[-1], warm[len(warm) // 2] * 1e3))


if __name__ == "__main__":
    main()
