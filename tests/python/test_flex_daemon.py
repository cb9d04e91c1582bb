"""Recorded flex functions against a real compile-only kcached: the spec kcache.flex_attention
would ask for (backward on) compiles for sm_90a with no GPU, new captured values give the
same kernel, and kcache.prefetch schedules kernels without waiting."""

import pytest

from flex_helpers import require_torch, dflash, prefix_lm, bias_table, block_diagonal

torch = require_torch()

import kcache  # noqa: E402
from kcache import _protos  # noqa: E402
from kcache.flex import parse, spec_text  # noqa: E402

ARCH = "sm_90a"


def _spec(bm, rs, dtype="bf16", d=128, hq=8, hkv=2):
    mask_text = bm._part.text if bm is not None else None
    decls = (bm._part.decls if bm is not None else ()) + (rs._part.decls if rs else ())
    trainable = tuple(u.name for u in rs._part.uses
                      if rs._part.tensors[u.slot].requires_grad) if rs else ()
    t = spec_text(mask_text, rs._part.text if rs else None, decls, trainable, dtype, d, d, hq,
                  hkv, None)
    return parse(_protos.modules()[0].AttentionSpec, t)


def test_recorded_specs_compile_and_new_values_reuse_the_kernel(daemon):
    c = kcache.Client(daemon.target)
    table = torch.randn(8, 512, requires_grad=True)
    rs = kcache.record_score_mod(bias_table(table))
    bm = kcache.create_block_mask(prefix_lm(torch.tensor([3, 70])), 2, None, 256, 512)
    s = _spec(bm, rs)
    assert s.mask.WhichOneof("kind") == "expr" and s.backward
    assert [(d.name, d.trainable) for d in s.buffers] == [("mask0", False), ("score0", True)]
    r = c.get_kernel(s, arch=ARCH, timeout=600)
    roles = {e.role for e in r.record.entry_points}
    assert r.cubin[:4] == b"\x7fELF" and 1 in roles and len(roles) >= 4  # fwd + backward set
    # new values, same shapes: the same spec, the memoized kernel
    bm2 = kcache.create_block_mask(prefix_lm(torch.tensor([99, 1])), 2, None, 256, 512)
    rs2 = kcache.record_score_mod(bias_table(torch.randn(8, 512, requires_grad=True)))
    before = c.rpc_count
    assert c.get_kernel(_spec(bm2, rs2), arch=ARCH).key == r.key
    assert c.rpc_count == before
    c.close()


def test_recorded_drafter_and_division_masks_compile(daemon):
    c = kcache.Client(daemon.target)
    anchors = torch.randint(0, 100, (2, 4))
    keep = torch.ones(2, 4, dtype=torch.bool)
    bm = kcache.create_block_mask(dflash(anchors, keep, 100, 16), 2, None, 64, 164)
    s = _spec(bm, None)
    assert s.mask == kcache.drafter(16)
    r = c.get_kernel(s, arch=ARCH, timeout=600)
    assert r.record.spec.mask.WhichOneof("kind") == "drafter"
    # // and % by constants, lowered without integer division
    bd = kcache.create_block_mask(block_diagonal(64), None, None, 256, 256)
    r2 = c.get_kernel(_spec(bd, None, dtype="fp16", d=64, hq=4, hkv=4), arch=ARCH, timeout=600)
    assert r2.cubin[:4] == b"\x7fELF"
    c.close()


def test_prefetch_schedules_without_waiting(daemon):
    c = kcache.Client(daemon.target)
    anchors, keep = torch.zeros(1, 4, dtype=torch.int64), torch.ones(1, 4, dtype=torch.bool)
    res = kcache.prefetch(
        [dflash(anchors, keep, 100, 16),
         kcache.spec(dtype="fp16", head_dim=64, q_heads=4, mask=kcache.causal())],
        [dict(q_heads=8, kv_heads=2, head_dim=128, q_len=64, kv_len=164)],
        arch=ARCH, client=c)
    assert len(res) == 2
    assert all(r.state in (1, 2) for r in res), res  # CACHED or QUEUED
    # the prefetched drafter kernel is the one flex_attention asks for
    bm = kcache.create_block_mask(dflash(anchors, keep, 100, 16), 1, None, 64, 164)
    r = c.get_kernel(_spec(bm, None), arch=ARCH, timeout=600)
    assert r.record.key == res[0].key
    with pytest.raises(kcache.InvalidSpec, match="need shapes"):
        kcache.prefetch([dflash(anchors, keep, 100, 16)], [], arch=ARCH, client=c)
    c.close()


def test_prefetch_keys_equal_flex_attentions(daemon):
    """Functions with captured tensors and a -inf score_mod: prefetch asks for exactly the
    kernel flex_attention will."""
    from kcache.flex import launch_args
    c = kcache.Client(daemon.target)
    anchors, keep = torch.zeros(2, 4, dtype=torch.int64), torch.ones(2, 4, dtype=torch.bool)
    table = torch.randn(8, 164, requires_grad=True)

    def sm(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx < 150, score + table[h, kv_idx], -float("inf"))
    item = dict(mask_mod=dflash(anchors, keep, 100, 16), score_mod=sm)
    shape = dict(q_heads=8, kv_heads=2, head_dim=128, q_len=64, kv_len=164)
    res = kcache.prefetch([item], [shape], arch=ARCH, client=c)
    q = torch.empty(2, 8, 64, 128, dtype=torch.bfloat16)
    k = v = torch.empty(2, 2, 164, 128, dtype=torch.bfloat16)
    bm = kcache.create_block_mask(dflash(anchors, keep, 100, 16), 2, None, 64, 164)
    text, _, _ = launch_args(q, k, v, sm, bm, None, True)
    r = c.get_kernel(parse(_protos.modules()[0].AttentionSpec, text), arch=ARCH, timeout=600)
    assert res[0].state in (1, 2) and r.record.key == res[0].key
    c.close()
