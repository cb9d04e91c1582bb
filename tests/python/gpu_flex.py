"""kcache.flex_attention on a GPU against torch's flex_attention (compiled), with a
compile-only kcached on an empty store (the client loads and launches the cubins itself).

  - every mask kind (causal, sliding window, document, drafter, expression masks with
    captured tensors, // and %) with every score modification (none, softcap, relative
    bias, ALiBi-like, a learnable bias table): forward and backward, bf16, relative L2
    error <= 1e-2 for O, dQ, dK, dV and the bias table's gradient;
  - a torch.compile(fullgraph=True) model (inductor) calling kcache.flex_attention;
  - forward + backward captured in a CUDA graph, replayed with new inputs: identical to
    eager (O, dK, dV bit for bit; dQ, accumulated with atomics, within 1e-3);
  - three threads making their first call at once on an empty cache: one compile.

Skips, saying why, without torch >= 2.5 or a CUDA device. Not named test_*.py so that the
CPU suite leaves it out.

  PYTHONPATH=client/python:BUILD/client/python/gen KCACHE_TEST_KCACHED=BUILD/bin/kcached \\
    python3 -m pytest -q -rs tests/python/gpu_flex.py
"""

import threading
import warnings

import pytest

from flex_helpers import (require_torch, causal, sliding, document, dflash, prefix_lm,
                          block_diagonal, dilated, softcap, relative_bias, alibi_like,
                          bias_table)

torch = require_torch()
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: kcache.flex_attention GPU tests need one",
                allow_module_level=True)

import kcache  # noqa: E402
from kcache import client as kclient  # noqa: E402
from torch.nn.attention import flex_attention as tfa  # noqa: E402

warnings.filterwarnings("ignore")
DEV = "cuda"
_t_flex = torch.compile(tfa.flex_attention, dynamic=False)


def _use_daemon(target):
    with kclient._default_lock:
        if kclient._default is not None:
            kclient._default.close()
        kclient._default = kcache.Client(target)
    return kclient._default


@pytest.fixture(scope="module")
def gpu_daemon(tmp_path_factory):
    import tempfile
    from conftest import Daemon
    d = Daemon(tempfile.mkdtemp(prefix="kcgf")).start()
    _use_daemon(d.target)
    yield d
    d.stop()


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _cases():
    g = torch.Generator().manual_seed(7)
    B, L = 2, 512
    docs = torch.cumsum(torch.rand(B, L, generator=g) < 0.01, 1).to(DEV)
    N, bs, S = 8, 16, 384
    anchors = torch.randint(0, S, (B, N), generator=g).to(DEV)
    keep = (torch.rand(B, N, generator=g) > 0.2).to(DEV)
    table = torch.randn(8, 512, generator=g).to(DEV) * 0.5
    slopes = torch.rand(8, generator=g).to(DEV) * 0.1
    prefix = torch.tensor([37, 300]).to(DEV)
    return [
        # name, mask_mod, score_mod, Q_LEN, KV_LEN, expected built-in, trainable tensor
        ("causal", causal, None, L, L, "causal", None),
        ("causal_softcap", causal, softcap, L, L, "causal", None),
        ("sliding_relbias", sliding(100), relative_bias, L, L, "sliding_window", None),
        ("document_alibi", document(docs), alibi_like(slopes), L, L, "document", None),
        ("drafter", dflash(anchors, keep, S, bs), None, N * bs, S + N * bs, "drafter", None),
        ("drafter_softcap", dflash(anchors, keep, S, bs), softcap, N * bs, S + N * bs,
         "drafter", None),
        ("prefix_expr_table", prefix_lm(prefix), bias_table(table), L, L, None, table),
        ("blockdiag_expr", block_diagonal(64), None, L, L, None, None),
        ("dilated_expr_relbias", dilated, relative_bias, L, L, None, None),
        ("none_table", None, bias_table(table), L, L, None, table),
    ]


@pytest.mark.parametrize("case", _cases(), ids=[c[0] for c in _cases()])
def test_forward_backward_match_torch_flex(gpu_daemon, case):
    name, mm, sm, L, KV, builtin, trainable = case
    B, Hq, Hkv, D = 2, 8, 2, 128
    g = torch.Generator(device=DEV).manual_seed(11)
    q = torch.randn(B, Hq, L, D, device=DEV, generator=g, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, KV, D, device=DEV, generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, KV, D, device=DEV, generator=g, dtype=torch.bfloat16)
    gout = torch.randn(B, Hq, L, D, device=DEV, generator=g, dtype=torch.bfloat16)
    if trainable is not None:
        trainable.requires_grad_(True)

    def run(flex, make_mask):
        xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        if trainable is not None:
            trainable.grad = None
        bm = make_mask(mm, B, None, L, KV, device=DEV) if mm is not None else None
        out, lse = flex(*xs, score_mod=sm, block_mask=bm, enable_gqa=True, return_lse=True)
        out.backward(gout)
        grads = [x.grad for x in xs]
        if trainable is not None:
            grads.append(trainable.grad.clone())
        return bm, out, lse, grads

    bm, out, lse, grads = run(kcache.flex_attention, kcache.create_block_mask)
    _, want, wlse, wgrads = run(_t_flex, tfa.create_block_mask)
    if mm is not None:
        assert bm.builtin == builtin
    assert rel(out, want) <= 1e-2, name
    seen = ~torch.isinf(wlse)
    assert torch.equal(torch.isinf(lse), ~seen), name
    assert rel(lse[seen], wlse[seen]) <= 1e-2, name
    for what, a, b in zip(("dq", "dk", "dv", "dtable"), grads, wgrads):
        assert rel(a, b) <= 1e-2, "%s %s: %.3g" % (name, what, rel(a, b))
    if trainable is not None:
        trainable.requires_grad_(False)


def test_compiled_model_fullgraph(gpu_daemon):
    B, H, D = 2, 8, 128
    anchors = torch.randint(0, 128, (B, 8), device=DEV)
    keep = torch.ones(B, 8, dtype=torch.bool, device=DEV)
    bm = kcache.create_block_mask(dflash(anchors, keep, 128, 16), B, None, 128, 256,
                                  device=DEV)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(D, 3 * D, device=DEV, dtype=torch.bfloat16)

        def forward(self, x, ctx, block_mask):
            q = self.qkv(x)[..., :D]
            kv = self.qkv(ctx)
            k, v = kv[..., D:2 * D].contiguous(), kv[..., 2 * D:].contiguous()
            return kcache.flex_attention(q.contiguous(), k, v, score_mod=softcap,
                                         block_mask=block_mask).float().square().mean()

    layer = Layer()
    x = torch.randn(B, H, 128, D, device=DEV, dtype=torch.bfloat16)
    ctx = torch.randn(B, H, 256, D, device=DEV, dtype=torch.bfloat16)
    compiled = torch.compile(layer, fullgraph=True)
    loss = compiled(x, ctx, bm)
    loss.backward()
    g1 = layer.qkv.weight.grad.clone()
    layer.qkv.weight.grad = None
    ref = layer(x, ctx, bm)
    ref.backward()
    assert rel(loss, ref) <= 1e-2 and rel(g1, layer.qkv.weight.grad) <= 1e-2


def test_cuda_graph_capture_and_replay(gpu_daemon):
    B, H, D = 2, 4, 128
    anchors = torch.randint(0, 128, (B, 8), device=DEV)
    keep = torch.ones(B, 8, dtype=torch.bool, device=DEV)
    table = torch.randn(H, 256, device=DEV, requires_grad=True)
    bm = kcache.create_block_mask(dflash(anchors, keep, 128, 16), B, None, 128, 256,
                                  device=DEV)
    rs = kcache.record_score_mod(bias_table(table))
    q = torch.randn(B, H, 128, D, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, H, 256, D, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, H, 256, D, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    gout = torch.randn(B, H, 128, D, device=DEV, dtype=torch.bfloat16)

    def step():
        for t in (q, k, v, table):
            t.grad = None
        out = kcache.flex_attention(q, k, v, score_mod=rs, block_mask=bm)
        out.backward(gout)
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # first call: fetch and load; then the launch path only
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    for t in (q, k, v, table):
        t.grad = None
    with torch.cuda.graph(graph):
        out = kcache.flex_attention(q, k, v, score_mod=rs, block_mask=bm)
        out.backward(gout)
    static = (out, q.grad, k.grad, v.grad, table.grad)
    # new inputs and new anchors, in place; replay vs eager
    with torch.no_grad():
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        anchors.copy_(torch.randint(0, 128, (B, 8), device=DEV))
        gout.copy_(torch.randn_like(gout))
    graph.replay()
    torch.cuda.synchronize()
    got = [t.clone() for t in static]
    e_out = step()
    want = (e_out, q.grad, k.grad, v.grad, table.grad)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])
    torch.testing.assert_close(got[1].float(), want[1].float(), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(got[4], want[4], atol=1e-3, rtol=1e-3)


def test_three_threads_first_call_one_compile(make_daemon):
    d = make_daemon().start()  # empty store
    c = _use_daemon(d.target)
    B, H, L, D = 1, 4, 256, 64
    bm = kcache.create_block_mask(sliding(37), None, None, L, L, device=DEV)
    xs = [torch.randn(B, H, L, D, device=DEV, dtype=torch.float16, requires_grad=True)
          for _ in range(3)]
    barrier = threading.Barrier(3)
    outs, errors = [None] * 3, []

    def run(i):
        try:
            barrier.wait()
            o = kcache.flex_attention(xs[0], xs[1], xs[2], block_mask=bm)
            o.float().sum().backward()
            outs[i] = o.detach()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    st = c.stats()
    assert st.compiles == 1 and st.compile_failures == 0, st
    assert c.rpc_count == 1
