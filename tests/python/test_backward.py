"""kcache.attention's backward plan (kcache.autograd), without torch or a GPU: which entry
points of a record are launched, in which order, on which grids."""

import pytest

import kcache
from kcache import _protos, cuda
from kcache.attention import Plan
from kcache.autograd import backward_launches, backward_spec, trainable_buffers


def record(deterministic=False, mask=None, drop=()):
    _, record_pb2, _, _ = _protos.modules()
    r = record_pb2.KernelRecord()
    r.key = b"\x01" * 41
    r.spec.CopyFrom(kcache.spec(dtype="bf16", head_dim=128, q_heads=8, kv_heads=2, mask=mask,
                                backward=True, deterministic=deterministic))
    r.deterministic_backward = deterministic
    entries = [
        ("kcache_attn_fwd", cuda.ENTRY_ROLE_FORWARD, 256, 168000, 128, 128),
        ("kcache_attn_bwd_preprocess", cuda.ENTRY_ROLE_BACKWARD_PREPROCESS, 256, 0, 64, 0),
        # Backward tiles 64 x 128, 8 warps: a dK/dV CTA owns 128 keys.
        ("kcache_attn_bwd_dkdv", cuda.ENTRY_ROLE_BACKWARD, 256, 154640, 64, 128),
    ]
    if deterministic:
        # A dQ CTA owns 128 query rows; the entry states them as its block_m.
        entries.append(("kcache_attn_bwd_dq", cuda.ENTRY_ROLE_BACKWARD_DQ, 256, 137232, 128,
                        64))
    else:
        entries.append(("kcache_attn_bwd_dq_convert", cuda.ENTRY_ROLE_BACKWARD_POSTPROCESS, 256,
                        0, 0, 0))  # no block_m: 64 rows per CTA
    if r.spec.mask.WhichOneof("kind") == "expr":
        # Classified with the backward's tiles (sm_90a head dim 128): one classification
        # serves the forward and the backward.
        entries.append(("kcache_attn_mask_build", cuda.ENTRY_ROLE_MASK_BUILD, 128, 0, 64, 128))
        entries.append(("kcache_attn_bwd_mask_build", cuda.ENTRY_ROLE_BACKWARD_MASK_BUILD, 128,
                        0, 64, 128))
    for name, role, threads, smem, bm, bn in entries:
        if name in drop:
            continue
        e = r.entry_points.add()
        e.name, e.role, e.threads, e.dynamic_smem_bytes, e.block_m, e.block_n = (
            name, role, threads, smem, bm, bn)
    return r


PLAN = Plan(batch=3, num_q_heads=8, num_kv_heads=2, q_len=1000, kv_len=1500, head_dim_qk=128,
            head_dim_v=128)


def names_and_grids(launches):
    return [(e.name, grid, e.threads, e.dynamic_smem_bytes) for _, e, grid in launches]


def test_default_sequence_converts_the_dq_accumulator():
    assert names_and_grids(backward_launches(record(), PLAN)) == [
        ("kcache_attn_bwd_preprocess", (16, 8, 3), 256, 0),
        ("kcache_attn_bwd_dkdv", (12, 2, 3), 256, 154640),  # ceil(1500 / 128) key tiles, kv heads
        ("kcache_attn_bwd_dq_convert", (16, 8, 3), 256, 0),
    ]


def test_deterministic_sequence_runs_the_dq_kernel():
    assert names_and_grids(backward_launches(record(deterministic=True), PLAN)) == [
        ("kcache_attn_bwd_preprocess", (16, 8, 3), 256, 0),
        ("kcache_attn_bwd_dkdv", (12, 2, 3), 256, 154640),
        ("kcache_attn_bwd_dq", (8, 8, 3), 256, 137232),  # ceil(1000 / 128) query tiles
    ]


def test_expression_masks_build_the_backward_tile_classes_first():
    prefix = kcache.buffer("prefix", "int32")
    mask = kcache.expr_mask((kcache.kv_idx < prefix[kcache.b]) | (kcache.kv_idx <= kcache.q_idx))
    got = names_and_grids(backward_launches(record(mask=mask), PLAN))
    assert got[0] == ("kcache_attn_bwd_mask_build", (16, 8, 3), 128, 0)
    assert [g[0] for g in got[1:]] == ["kcache_attn_bwd_preprocess", "kcache_attn_bwd_dkdv",
                                       "kcache_attn_bwd_dq_convert"]


class _Tensor:  # what _shared_classes reads of a tensor
    def __init__(self, *shape):
        self.shape = shape


def test_the_forwards_tile_classes_replace_the_backward_mask_build():
    from kcache.attention import TileClasses
    from kcache.autograd import _shared_classes
    prefix = kcache.buffer("prefix", "int32")
    mask = kcache.expr_mask((kcache.kv_idx < prefix[kcache.b]) | (kcache.kv_idx <= kcache.q_idx))
    r = record(mask=mask)
    got = names_and_grids(backward_launches(r, PLAN, have_classes=True))
    assert [g[0] for g in got] == ["kcache_attn_bwd_preprocess", "kcache_attn_bwd_dkdv",
                                   "kcache_attn_bwd_dq_convert"]
    # [B, Hq, ceil(1000 / 64), ceil(1500 / 128)]: the backward's tiles.
    good = _Tensor(3, 8, 16, 12)
    assert _shared_classes(r, PLAN, TileClasses(r.key, good)) is good
    assert _shared_classes(r, PLAN, None) is None
    # Another record's classes, or classes of another shape: the backward classifies.
    assert _shared_classes(r, PLAN, TileClasses(b"\x02" * 41, good)) is None
    assert _shared_classes(r, PLAN, TileClasses(r.key, _Tensor(3, 8, 8, 12))) is None


@pytest.mark.parametrize("drop, role", [
    ("kcache_attn_bwd_dkdv", "BACKWARD"),
    ("kcache_attn_bwd_preprocess", "BACKWARD_PREPROCESS"),
    ("kcache_attn_bwd_dq_convert", "BACKWARD_POSTPROCESS"),
])
def test_a_missing_entry_point_is_named(drop, role):
    with pytest.raises(RuntimeError, match=r"has no %s entry point" % role):
        backward_launches(record(drop=(drop,)), PLAN)


def test_forward_only_record_says_so():
    _, record_pb2, _, _ = _protos.modules()
    r = record_pb2.KernelRecord()
    r.key = b"\x02" * 41
    e = r.entry_points.add()
    e.name, e.role, e.threads = "kcache_attn_fwd", cuda.ENTRY_ROLE_FORWARD, 128
    with pytest.raises(RuntimeError, match="built with backward: true"):
        backward_launches(r, PLAN)


def test_backward_spec_and_trainable_buffers():
    bias = kcache.buffer("bias", "float32")
    s = kcache.spec(dtype="bf16", head_dim=64, q_heads=4,
                    score_mod=kcache.score_expr(kcache.score + bias[kcache.h]))
    s.buffers[0].trainable = True
    b = backward_spec(s)
    assert b.backward and b.return_lse and not b.deterministic
    assert not s.backward  # a copy
    assert backward_spec(s, deterministic=True).deterministic
    assert trainable_buffers(b) == ["bias"]


def test_autograd_function_plumbing(monkeypatch):
    """kcache.attention's autograd wiring (arguments, layouts, trainable buffer gradients)
    with the launches replaced by torch math on the CPU."""
    torch = pytest.importorskip("torch")
    import kcache.autograd as ag

    def ref(q, k, v, bias):
        rep = q.shape[1] // k.shape[1]
        s = q @ k.repeat_interleave(rep, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
        s = s + bias[None, :, None, None]
        return torch.softmax(s, -1) @ v.repeat_interleave(rep, 1)

    calls = []

    def fake_forward(q, k, v, spec, *, lse, buffers, client, timeout, **mask_inputs):
        calls.append(("fwd", spec.backward, spec.return_lse, spec.deterministic))
        assert lse and set(buffers) == {"bias"} and mask_inputs["anchors"] is None
        with torch.no_grad():
            return (ref(q, k, v, buffers["bias"]), torch.zeros(q.shape[:3])), "classes"

    def fake_backward(spec, q, k, v, o, lse, dout, *, buffers, client, timeout, tile_classes,
                      **mask_inputs):
        calls.append(("bwd", tuple(q.shape), tuple(dout.shape), tile_classes))
        with torch.enable_grad():
            qq, kk, vv, bb = (t.detach().requires_grad_() for t in (q, k, v, buffers["bias"]))
            g = torch.autograd.grad(ref(qq, kk, vv, bb), (qq, kk, vv, bb), dout)
        return g[0], g[1], g[2], {"bias": g[3]}

    monkeypatch.setattr(ag, "_attention_forward", fake_forward)
    monkeypatch.setattr(ag, "attention_backward", fake_backward)
    torch.manual_seed(0)
    q = torch.randn(2, 5, 4, 64, requires_grad=True)  # bshd: [B, L, Hq, D]
    k = torch.randn(2, 7, 2, 64, requires_grad=True)
    v = torch.randn(2, 7, 2, 64, requires_grad=True)
    bias = torch.randn(4, requires_grad=True)
    bdecl = kcache.buffer("bias", "float32")
    s = kcache.spec(dtype="bf16", head_dim=64, q_heads=4, kv_heads=2,
                    score_mod=kcache.score_expr(kcache.score + bdecl[kcache.h]))
    s.buffers[0].trainable = True
    o = kcache.attention(q, k, v, s, layout="bshd", buffers={"bias": bias}, deterministic=False)
    assert o.shape == (2, 5, 4, 64)
    w = torch.randn_like(o)
    (o * w).sum().backward()
    assert calls[0] == ("fwd", True, True, False)
    assert calls[1] == ("bwd", (2, 4, 5, 64), (2, 4, 5, 64), "classes")  # the forward's
    q2, k2, v2, b2 = (t.detach().clone().requires_grad_() for t in (q, k, v, bias))
    o2 = ref(q2.transpose(1, 2), k2.transpose(1, 2), v2.transpose(1, 2), b2).transpose(1, 2)
    (o2 * w).sum().backward()
    for a, b_ in ((o, o2), (q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad),
                  (bias.grad, b2.grad)):
        assert torch.allclose(a, b_, atol=1e-5), (a - b_).abs().max()
