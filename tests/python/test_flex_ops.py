"""kcache.flex_attention on the CPU (kcache::flex_fwd / flex_bwd run the dense reference
there): flex's signature and semantics against torch's flex_attention, gradients against
autograd through the user's own functions, trainable captured tensors, torch.compile with
fullgraph, torch.library.opcheck, and the argument errors."""

import math
import warnings

import pytest

from flex_helpers import (require_torch, causal, sliding, document, dflash, prefix_lm,
                          block_diagonal, softcap, relative_bias, alibi_like, bias_table)

torch = require_torch()
from torch.nn.attention import flex_attention as tfa  # noqa: E402

import kcache  # noqa: E402
from kcache import InvalidSpec  # noqa: E402

warnings.filterwarnings("ignore")


def _qkv(B, Hq, Hkv, L, KV, D=64, dtype=torch.bfloat16, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h, n: torch.randn(B, h, n, D, generator=g).to(dtype).requires_grad_(grad)  # noqa
    return mk(Hq, L), mk(Hkv, KV), mk(Hkv, KV)


def _dense(q, k, v, mask_mod=None, score_mod=None, scale=None):
    """Attention through the user's functions on index tensors (autograd does the rest)."""
    B, Hq, L, D = q.shape
    KV = k.shape[2]
    if k.shape[1] != Hq:
        k = k.repeat_interleave(Hq // k.shape[1], 1)
        v = v.repeat_interleave(Hq // v.shape[1], 1)
    b, h = torch.arange(B).view(B, 1, 1, 1), torch.arange(Hq).view(1, Hq, 1, 1)
    qi, ki = torch.arange(L).view(1, 1, L, 1), torch.arange(KV).view(1, 1, 1, KV)
    s = q.float() @ k.float().transpose(-1, -2) * (scale or 1 / math.sqrt(D))
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki).expand_as(s), -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(lse.isinf(), 0, lse)[..., None])
    return p @ v.float(), lse


def _cases():
    g = torch.Generator().manual_seed(3)
    docs = torch.cumsum(torch.rand(2, 128, generator=g) < 0.06, dim=1)
    anchors = torch.randint(0, 64, (2, 4), generator=g)
    keep = torch.tensor([[True, False, True, True], [True, True, True, False]])
    table = torch.randn(4, 128, generator=g)
    slopes = torch.rand(4, generator=g)
    return [
        ("causal", causal, None, 128, 128),
        ("sliding_softcap", sliding(32), softcap, 128, 128),
        ("document_relbias", document(docs), relative_bias, 128, 128),
        ("dflash", dflash(anchors, keep, 64, 16), None, 64, 128),
        ("prefix_alibi", prefix_lm(torch.tensor([5, 40])), alibi_like(slopes), 96, 96),
        ("blockdiag_table", block_diagonal(16), bias_table(table), 128, 128),
        ("none", None, None, 64, 80),
    ]


@pytest.mark.parametrize("name,mm,sm,L,KV", _cases(), ids=[c[0] for c in _cases()])
def test_forward_matches_torch_flex(name, mm, sm, L, KV):
    B, H = 2, 4
    q, k, v = _qkv(B, H, H, L, KV)
    bm = kcache.create_block_mask(mm, B, None, L, KV, device="cpu") if mm else None
    out, lse = kcache.flex_attention(q, k, v, score_mod=sm, block_mask=bm, return_lse=True)
    tbm = tfa.create_block_mask(mm, B, None, L, KV, device="cpu") if mm else None
    want, wlse = tfa.flex_attention(q, k, v, score_mod=sm, block_mask=tbm, return_lse=True)
    assert out.dtype == q.dtype and out.shape == want.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    seen = ~torch.isinf(wlse)
    assert torch.equal(torch.isinf(lse), ~seen)
    torch.testing.assert_close(lse[seen], wlse[seen], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("name,mm,sm,L,KV", _cases(), ids=[c[0] for c in _cases()])
def test_gradients_match_autograd_of_the_functions(name, mm, sm, L, KV):
    B, H = 2, 4
    q, k, v = _qkv(B, H, H, L, KV, dtype=torch.float16, grad=True)
    bm = kcache.create_block_mask(mm, B, None, L, KV, device="cpu") if mm else None
    out = kcache.flex_attention(q, k, v, score_mod=sm, block_mask=bm)
    g = torch.randn(out.shape)
    out.float().backward(g)
    got = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want, _ = _dense(q, k, v, mm, sm)
    want.backward(g)
    for a, b in zip(got, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


def test_gqa_scale_and_lse_convention():
    q, k, v = _qkv(1, 8, 2, 64, 64)
    with pytest.raises(ValueError, match="enable_gqa"):
        kcache.flex_attention(q, k, v)
    out, lse = kcache.flex_attention(q, k, v, scale=0.05, enable_gqa=True, return_lse=True)
    want, wlse = tfa.flex_attention(q, k, v, scale=0.05, enable_gqa=True, return_lse=True)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, wlse, atol=1e-3, rtol=1e-3)  # natural log, like flex


def test_a_captured_tensor_with_requires_grad_is_trainable():
    g = torch.Generator().manual_seed(5)
    table = torch.randn(4, 96, generator=g).requires_grad_()
    slopes = torch.rand(4, generator=g).requires_grad_()

    def sm(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx] + slopes[h] * (kv_idx - q_idx)
    q, k, v = _qkv(2, 4, 4, 64, 96, dtype=torch.float16, grad=True)
    bm = kcache.create_block_mask(causal, None, None, 64, 96, device="cpu")
    out = kcache.flex_attention(q, k, v, score_mod=sm, block_mask=bm)
    gout = torch.randn(out.shape)
    out.float().backward(gout)
    got = table.grad.clone(), slopes.grad.clone()
    table.grad = slopes.grad = None
    want, _ = _dense(q, k, v, causal, sm)
    want.backward(gout)
    torch.testing.assert_close(got[0], table.grad, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[1], slopes.grad, atol=2e-2, rtol=2e-2)
    assert got[0].abs().sum() > 0


def test_torch_block_mask_is_accepted():
    anchors, keep = torch.tensor([[10, 30]]), torch.tensor([[True, True]])
    mm = dflash(anchors, keep, 32, 16)
    tbm = tfa.create_block_mask(mm, 1, None, 32, 64, device="cpu", BLOCK_SIZE=16)
    q, k, v = _qkv(1, 2, 2, 32, 64)
    out = kcache.flex_attention(q, k, v, block_mask=tbm)
    want = tfa.flex_attention(q, k, v, block_mask=tbm)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_torch_block_mask_from_block_tables_is_refused():
    kv_num = torch.ones(1, 1, 1, dtype=torch.int32)
    kv_idx = torch.zeros(1, 1, 1, 1, dtype=torch.int32)
    tbm = tfa.BlockMask.from_kv_blocks(kv_num, kv_idx, BLOCK_SIZE=64)
    q, k, v = _qkv(1, 2, 2, 64, 64)
    with pytest.raises(InvalidSpec, match="block tables"):
        kcache.flex_attention(q, k, v, block_mask=tbm)


def test_argument_errors():
    q, k, v = _qkv(1, 2, 2, 64, 64)
    with pytest.raises(InvalidSpec, match="float32 .*bfloat16 or float16|bfloat16 or float16"):
        kcache.flex_attention(q.float(), k.float(), v.float())
    q48, k48, v48 = _qkv(1, 2, 2, 64, 64, D=48)
    with pytest.raises(InvalidSpec, match="head dim 48"):
        kcache.flex_attention(q48, k48, v48)
    with pytest.raises(ValueError, match="4-D"):
        kcache.flex_attention(q[0], k, v)
    with pytest.raises(ValueError, match="dtypes differ"):
        kcache.flex_attention(q, k.half(), v)
    bm = kcache.create_block_mask(causal, None, None, 128, 128, device="cpu")
    with pytest.raises(ValueError, match="lengths"):
        kcache.flex_attention(q, k, v, block_mask=bm)
    qh, kh, vh = _qkv(1, 6, 4, 64, 64)
    with pytest.raises(ValueError, match="multiple"):
        kcache.flex_attention(qh, kh, vh, enable_gqa=True)
    with pytest.raises(Exception, match="under torch.compile, pass a kcache"):
        torch.compile(lambda q, k, v, m: kcache.flex_attention(q, k, v, block_mask=m),
                      fullgraph=True, backend="eager")(
            q, k, v, tfa.create_block_mask(causal, None, None, 64, 64, device="cpu"))


# ---------------------------------------------------------------------------
# torch.compile and the custom operators
# ---------------------------------------------------------------------------
def test_compiled_model_with_fullgraph_has_no_graph_break():
    import torch._dynamo as dynamo
    anchors, keep = torch.tensor([[10, 30, 50, 60]]), torch.ones(1, 4, dtype=torch.bool)
    bm = kcache.create_block_mask(dflash(anchors, keep, 64, 16), 1, None, 64, 128,
                                  device="cpu")

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64, dtype=torch.bfloat16)

        def forward(self, q, k, v, block_mask):
            o = kcache.flex_attention(self.proj(q), k, v, score_mod=softcap,
                                      block_mask=block_mask)
            return o.float().square().mean()

    layer = Layer()
    q, k, v = _qkv(1, 2, 2, 64, 128, grad=True)
    dynamo.reset()
    expl = dynamo.explain(layer)(q, k, v, bm)
    assert expl.graph_break_count == 0, expl.break_reasons
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v, bm)
    loss.backward()
    gq = q.grad.clone()
    q.grad = None
    ref = layer(q, k, v, bm)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(gq, q.grad)
    # new anchors, same compiled graph
    anchors.copy_(torch.tensor([[0, 5, 9, 63]]))
    torch.testing.assert_close(compiled(q, k, v, bm), layer(q, k, v, bm))


def test_recorded_score_mod_with_captured_tensor_under_compile():
    table = torch.randn(2, 64)
    rs = kcache.record_score_mod(bias_table(table))
    q, k, v = _qkv(1, 2, 2, 64, 64)
    f = torch.compile(lambda q, k, v: kcache.flex_attention(q, k, v, score_mod=rs),
                      fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(f(q, k, v), kcache.flex_attention(q, k, v,
                                                                score_mod=bias_table(table)))
    g = torch.compile(lambda q, k, v: kcache.flex_attention(q, k, v,
                                                            score_mod=bias_table(table)),
                      fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception):  # dynamo cannot make the captured tensor a constant
        g(q, k, v)


def test_opcheck_of_the_custom_ops():
    from kcache import ops  # noqa: F401
    from kcache.flex import spec_text, mask_launch
    docs = torch.tensor([[0] * 20 + [1] * 44])
    bm = kcache.create_block_mask(prefix_lm(torch.tensor([9])), 1, None, 64, 64,
                                  device="cpu")
    table = torch.randn(2, 64, requires_grad=True)
    rs = kcache.record_score_mod(bias_table(table))
    names, tensors = mask_launch(bm._part, bm.tensors, 1, 64, 64)
    names.append(rs._part.uses[0].name)
    tensors.append(table)
    spec = spec_text(bm._part.text, rs._part.text, bm._part.decls + rs._part.decls,
                     (rs._part.uses[0].name,), "fp16", 64, 64, 2, 2, None)
    q, k, v = _qkv(1, 2, 2, 64, 64, dtype=torch.float16, grad=True)
    args = (q, k, v, spec, ",".join(names), tensors)
    # the CPU reference is the real implementation here; the CUDA kernel is checked by
    # tests/python/gpu_flex.py
    torch.library.opcheck(torch.ops.kcache.flex_fwd.default, args)
    out, lse = torch.ops.kcache.flex_fwd(*args)
    dout = torch.randn_like(out)
    bargs = (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), dout, spec,
             ",".join(names), [t.detach() for t in tensors])
    grads = torch.ops.kcache.flex_bwd(*bargs)
    assert len(grads) == 4 and grads[3].shape == table.shape  # dq, dk, dv, dtable
    torch.library.opcheck(torch.ops.kcache.flex_bwd.default, bargs)
    del docs


def test_compiled_function_follows_the_mask_and_score_mod_it_is_given():
    q, k, v = _qkv(1, 2, 2, 64, 64)
    docs = torch.zeros(1, 64, dtype=torch.int64)
    docs[:, 30:] = 1

    def f(q, k, v, bm, sm):
        return kcache.flex_attention(q, k, v, block_mask=bm, score_mod=sm)
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    for bm in (kcache.create_block_mask(causal, None, None, 64, 64, device="cpu"),
               kcache.create_block_mask(sliding(5), None, None, 64, 64, device="cpu"),
               kcache.create_block_mask(document(docs), 1, None, 64, 64, device="cpu")):
        for sm in (softcap, relative_bias):
            assert torch.equal(cf(q, k, v, bm, sm), f(q, k, v, bm, sm)), (bm, sm)


def test_score_mod_masking_with_minus_inf_joins_the_mask():
    q, k, v = _qkv(2, 2, 2, 96, 96)
    prefix = torch.tensor([10, 50])

    def causal_by_score(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score * 0.5, -float("inf"))

    def prefix_by_score(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx < prefix[b], -float("inf"), score)

    bm = kcache.create_block_mask(sliding(20), None, None, 96, 96, device="cpu")
    tbm = tfa.create_block_mask(sliding(20), None, None, 96, 96, device="cpu")
    for sm, m, tm in ((causal_by_score, None, None), (prefix_by_score, bm, tbm),
                      (causal_by_score, bm, tbm)):
        out, lse = kcache.flex_attention(q, k, v, score_mod=sm, block_mask=m, return_lse=True)
        want, wlse = tfa.flex_attention(q, k, v, score_mod=sm, block_mask=tm, return_lse=True)
        torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
        assert torch.equal(torch.isinf(lse), torch.isinf(wlse))
    from kcache import _record
    from kcache.flex import _lower_mask
    joined = _record.join_masks(None, _record.record_score(causal_by_score))
    assert _lower_mask(joined, 96, 96).builtin.kind == "causal"


def _inf_inside(score, b, h, q_idx, kv_idx):
    return torch.maximum(score, torch.where(q_idx > 3, -float("inf"), score))  # MARK


def test_other_non_finite_constants_are_refused():
    from kcache import _record
    with pytest.raises(InvalidSpec, match="non-finite constant -inf .*test_flex_ops.py:%d"
                       % (_inf_inside.__code__.co_firstlineno + 1)):
        _record.record_score(_inf_inside)
    with pytest.raises(InvalidSpec, match="non-finite"):
        _record.record_score(lambda s, b, h, q, kv: s + float("nan"))


class _AsCuda:
    """A CPU tensor that says it is on cuda:0, for kcache.validate_inputs (which reads only
    shape, stride, dtype, device and data_ptr)."""

    def __init__(self, t):
        self.t = t
        self.shape, self.dtype = t.shape, t.dtype
        self.device = torch.device("cuda", 0)

    def stride(self, *a):
        return self.t.stride(*a)

    def data_ptr(self):
        return self.t.data_ptr()

    def dim(self):
        return self.t.dim()

    def view(self, dtype):
        return _AsCuda(self.t.view(dtype))


@pytest.mark.parametrize("name,mm,sm,L,KV", _cases(), ids=[c[0] for c in _cases()])
def test_launch_arguments_pass_the_launchers_validation(name, mm, sm, L, KV):
    """What the CUDA path would hand kcache.attention_forward / attention_backward passes
    their checks (buffer names, ranks and dtypes, built-in mask inputs)."""
    from kcache import _protos
    from kcache.attention import normalize_drafter_inputs, validate_inputs
    from kcache.flex import launch_args, parse
    B, H = 2, 4
    q, k, v = _qkv(B, H, 2, L, KV, D=128)
    bm = kcache.create_block_mask(mm, B, None, L, KV, device="cpu") if mm else None
    text, names, tensors = launch_args(q, k, v, sm, bm, None, True)
    spec = parse(_protos.modules()[0].AttentionSpec, text)
    assert spec.backward and spec.return_lse and spec.num_kv_heads == 2
    bufs = {n: _AsCuda(t) for n, t in zip(names, tensors) if not n.startswith("@")}
    inputs = {n[1:]: t for n, t in zip(names, tensors) if n.startswith("@")}
    if "anchors" in inputs:
        inputs["anchors"], inputs["keep"] = normalize_drafter_inputs(
            torch, inputs["anchors"], inputs.get("keep"))
    inputs = {n: _AsCuda(t) if t is not None else None for n, t in inputs.items()}
    o = torch.empty(B, H, L, 128, dtype=q.dtype)
    plan = validate_inputs(spec, _AsCuda(q), _AsCuda(k), _AsCuda(v), out=_AsCuda(o),
                           buffers=bufs or None, **inputs)
    assert plan.num_kv_heads == 2 and plan.q_len == L and plan.kv_len == KV


def test_eager_first_call_does_not_import_dynamo():
    # A torch.library operator imports torch._dynamo on its first call (~3 s of a new
    # process's first attention on the H200); outside torch.compile flex_attention runs
    # the same implementation through an autograd.Function instead.
    import os
    import subprocess
    import sys
    code = (
        "import sys, torch, kcache\n"
        "q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16, requires_grad=True)\n"
        "bm = kcache.create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, None, 64, 64, "
        "device='cpu')\n"
        "o = kcache.flex_attention(q, q.detach(), q.detach(), block_mask=bm)\n"
        "print('dynamo' if 'torch._dynamo' in sys.modules else 'no dynamo')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("no dynamo"), out.stdout + out.stderr
