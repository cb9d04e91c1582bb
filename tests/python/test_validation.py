"""attention_forward's launcher-side checks (kcache.validate_inputs) and spec helpers,
without torch or a GPU: stand-in tensors carry shape, strides, dtype, device and pointer."""

import pytest

import kcache
from kcache.attention import resolve_spec


class Dev:
    def __init__(self, type_="cuda", index=0):
        self.type, self.index = type_, index


class T:
    """A stand-in for a torch tensor: contiguous unless strides are given."""

    def __init__(self, shape, dtype="bfloat16", strides=None, ptr=0x7f0000000000, dev=None):
        self.shape = tuple(shape)
        self.dtype = "torch." + dtype
        if strides is None:
            strides, acc = [], 1
            for n in reversed(self.shape):
                strides.insert(0, acc)
                acc *= max(n, 1)
        self._strides = tuple(strides)
        self._ptr = ptr
        self.device = dev or Dev()

    def stride(self, i=None):
        return self._strides if i is None else self._strides[i]

    def data_ptr(self):
        return self._ptr

    def dim(self):
        return len(self.shape)


def qkv(B=2, Hq=8, Hkv=2, Lq=100, Lkv=130, D=128, Dv=None, dtype="bfloat16"):
    return (T((B, Hq, Lq, D), dtype), T((B, Hkv, Lkv, D), dtype), T((B, Hkv, Lkv, Dv or D), dtype))


SPEC = dict(dtype="bf16", head_dim=128, q_heads=8, kv_heads=2)


def err(spec, *tensors, **kw):
    with pytest.raises(ValueError) as ei:
        kcache.validate_inputs(spec, *tensors, **kw)
    return str(ei.value)


def test_valid_inputs_give_a_plan():
    plan = kcache.validate_inputs(kcache.spec(**SPEC), *qkv())
    assert (plan.batch, plan.num_q_heads, plan.num_kv_heads, plan.q_len, plan.kv_len) == \
        (2, 8, 2, 100, 130)
    # BSHD views (permuted strides) are fine: head dim contiguous, strides multiples of 8.
    q = T((2, 8, 100, 128), strides=(100 * 8 * 128, 128, 8 * 128, 1))
    kcache.validate_inputs(kcache.spec(**SPEC), q, *qkv()[1:])


def test_dtype_shape_and_gqa_errors():
    s = kcache.spec(**SPEC)
    assert "q: dtype float16, expected bfloat16" in err(s, *qkv(dtype="float16"))
    q, k, v = qkv()
    assert "q: heads (dim 1) is 4, expected 8" in err(s, T((2, 4, 100, 128)), k, v)
    assert "k: heads (dim 1) is 4, expected 2" in err(s, q, T((2, 4, 130, 128)), v)
    assert "q: head dim (dim 3) is 64, expected 128" in err(s, T((2, 8, 100, 64)), k, v)
    assert "v: seq len (dim 2) is 7, expected 130" in err(s, q, k, T((2, 2, 7, 128)))
    assert "k: batch (dim 0) is 3, expected 2" in err(s, q, T((3, 2, 130, 128)), v)
    assert "q: expected 4 dimensions" in err(s, T((2, 100, 128)), k, v)
    bad = kcache.spec(dtype="bf16", head_dim=128, q_heads=8, kv_heads=3)
    assert "not a multiple of num_kv_heads 3" in err(bad, q, k, v)
    mixed = kcache.spec(dtype="bf16", head_dim=128, head_dim_v=64, q_heads=8, kv_heads=2)
    assert "v: head dim (dim 3) is 128, expected 64" in err(mixed, q, k, v)
    kcache.validate_inputs(mixed, *qkv(Dv=64))


def test_layout_alignment_and_device_errors():
    s = kcache.spec(**SPEC)
    q, k, v = qkv()
    nc = T((2, 8, 100, 128), strides=(8 * 100 * 256, 100 * 256, 256, 2))
    assert "q: the head dimension (last) must be contiguous" in err(s, nc, k, v)
    odd = T((2, 8, 100, 128), strides=(8 * 100 * 132, 100 * 132, 132, 1))
    assert "q: the sequence stride 132 is not a multiple of 8" in err(s, odd, k, v)
    assert "k: data pointer 0x7f0000000008 is not 16-byte aligned" in err(
        s, q, T((2, 2, 130, 128), ptr=0x7f0000000008), v)
    assert "q: on cpu, expected a CUDA tensor" in err(s, T((2, 8, 100, 128), dev=Dev("cpu")), k, v)
    assert "v: on cuda:1, expected cuda:0" in err(s, q, k, T((2, 2, 130, 128), dev=Dev("cuda", 1)))
    out_bad = T((2, 8, 100, 128), strides=(8 * 100 * 129, 100 * 129, 129, 1))
    assert "out: the sequence stride 129 is not a multiple of 2" in err(s, q, k, v, out=out_bad)


def test_drafter_inputs():
    s = kcache.spec(**SPEC, mask=kcache.drafter(block_size=16))
    q, k, v = qkv(Lq=64, Lkv=64 + 300)
    anchors = T((2, 4), "int32")
    plan = kcache.validate_inputs(s, q, k, v, anchors=anchors)
    assert (plan.num_blocks, plan.context_len) == (4, 300)
    kcache.validate_inputs(s, q, k, v, anchors=T((2, 7), "int32"), keep=T((2, 7), "bool"))
    assert "anchors: required by the spec, not given" in err(s, q, k, v)
    assert "anchors: dtype int64, expected int32" in err(s, q, k, v, anchors=T((2, 4), "int64"))
    assert "anchors: shape [2, 3], expected [2, >=4]" in err(s, q, k, v,
                                                             anchors=T((2, 3), "int32"))
    assert "keep: batch stride 9 differs from anchors' 4" in err(
        s, q, k, v, anchors=anchors, keep=T((2, 9), "int8"))
    q2, k2, v2 = qkv(Lq=60, Lkv=400)
    assert "q_len 60 is not a multiple of the drafter block_size 16" in err(
        s, q2, k2, v2, anchors=anchors)
    q3, k3, v3 = qkv(Lq=64, Lkv=32)
    assert "kv_len 32 is shorter than q_len 64" in err(s, q3, k3, v3, anchors=anchors)


def test_document_alibi_and_unused_inputs():
    q, k, v = qkv()
    doc = kcache.spec(**SPEC, mask=kcache.document(causal=True))
    kcache.validate_inputs(doc, q, k, v, q_seq_id=T((2, 100), "int32"),
                           kv_seq_id=T((2, 130), "int32"))
    assert "kv_seq_id: required" in err(doc, q, k, v, q_seq_id=T((2, 100), "int32"))
    assert "q_seq_id: shape [2, 130], expected [2, 100]" in err(
        doc, q, k, v, q_seq_id=T((2, 130), "int32"), kv_seq_id=T((2, 130), "int32"))
    al = kcache.spec(**SPEC, score_mod=kcache.alibi())
    kcache.validate_inputs(al, q, k, v, alibi_slopes=T((8,), "float32"))
    assert "alibi_slopes: expected a contiguous float32 [8]" in err(
        al, q, k, v, alibi_slopes=T((2,), "float32"))
    causal = kcache.spec(**SPEC, mask=kcache.causal())
    assert "anchors: given, but the spec's mask is causal" in err(
        causal, q, k, v, anchors=T((2, 4), "int32"))
    assert "buffers: given, but the spec has no expression" in err(
        causal, q, k, v, buffers={"x": T((2,), "int32")})


def test_expression_buffers():
    prefix = kcache.buffer("prefix", "int32")
    bias = kcache.buffer("bias", "float32", rank=2)
    s = kcache.spec(**SPEC, mask=kcache.expr_mask(kcache.kv_idx < prefix[kcache.b]),
                    score_mod=kcache.score_expr(kcache.score + bias[kcache.b, kcache.h]))
    assert [b.name for b in s.buffers] == ["bias", "prefix"]  # sorted: the launch order
    q, k, v = qkv()
    good = {"prefix": T((2,), "int32"), "bias": T((2, 8), "float32")}
    kcache.validate_inputs(s, q, k, v, buffers=good)
    assert "buffers['bias']: declared by the spec (float32, rank 2), not given" in err(
        s, q, k, v, buffers={"prefix": good["prefix"]})
    assert "buffers['zzz']: not declared by the spec" in err(
        s, q, k, v, buffers=dict(good, zzz=T((1,), "int32")))
    assert "buffers['prefix']: dtype float32, expected int32" in err(
        s, q, k, v, buffers=dict(good, prefix=T((2,), "float32")))
    assert "buffers['bias']: expected 2 dimensions" in err(
        s, q, k, v, buffers=dict(good, bias=T((8,), "float32")))


def test_spec_helpers():
    with pytest.raises(TypeError, match="no truth value"):
        bool(kcache.q_idx < kcache.kv_idx)
    with pytest.raises(ValueError, match="rank 1, indexed with 2"):
        kcache.buffer("x", "int32")[kcache.b, kcache.h]
    with pytest.raises(ValueError, match="used as"):
        kcache.buffer("x", "int32")[kcache.b] + kcache.buffer("x", "float32")[kcache.b]
    with pytest.raises(ValueError, match="dtype"):
        kcache.spec(dtype="fp32", q_heads=1)
    with pytest.raises(ValueError, match="spec JSON"):
        kcache.to_spec('{"headDim": 3}')
    w = kcache.sliding_window(128, 0, bottom_right=True)
    assert w.sliding_window.left == 128 and w.sliding_window.alignment == 2
    e = kcache.where(kcache.q_idx % 2 == 0, 1.0, kcache.score.tanh())
    assert e.proto.WhichOneof("node") == "select"


def test_resolve_spec_fills_from_tensors():
    q, k, v = qkv(D=64, Dv=128)
    s = resolve_spec({"mask": kcache.causal()}, q, k, v, lse=True)
    assert (s.dtype, s.head_dim_qk, s.head_dim_v, s.num_q_heads, s.num_kv_heads) == \
        (1, 64, 128, 8, 2)
    assert s.return_lse and s.mask.HasField("causal")
    base = kcache.spec(**SPEC)
    assert resolve_spec(base, *qkv(), lse=False) is base
    with_lse = resolve_spec(base, *qkv(), lse=True)
    assert with_lse.return_lse and not base.return_lse  # a copy; the caller's spec is untouched
