"""Recording of flex-style mask_mod / score_mod functions (kcache._record, kcache.flex),
checked against torch's own flex_attention on the CPU: the recorded tree, evaluated as the
kernel would (kcache._reference), equals torch's create_mask exactly, and its block
classification equals create_block_mask's; built-ins are recognized; every error path."""

import os
import threading
import warnings

import pytest

from flex_helpers import (require_torch, eval_recorded, block_classes, flex_block_classes,
                          causal, sliding, document, dflash, prefix_lm, block_diagonal, dilated,
                          head_dependent)

torch = require_torch()
from torch.nn.attention.flex_attention import create_block_mask as t_cbm  # noqa: E402
from torch.nn.attention.flex_attention import create_mask as t_mask  # noqa: E402

import kcache  # noqa: E402
from kcache import InvalidSpec, KcacheError  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
HERE = os.path.basename(__file__)


def _cases():
    g = torch.Generator().manual_seed(0)
    docs = torch.cumsum(torch.rand(2, 300, generator=g) < 0.05, dim=1)
    N, bs, S = 5, 16, 140
    anchors = torch.randint(-3, S + 5, (2, N), generator=g)  # past both ends too
    keep = torch.rand(2, N, generator=g) > 0.3
    prefix = torch.tensor([17, 200])
    return [
        ("causal", causal, 2, 1, 300, 300, "causal"),
        ("causal_rect", causal, 1, 1, 130, 270, "causal"),
        ("sliding", sliding(40), 1, 1, 257, 257, "sliding_window"),
        ("document", document(docs), 2, 1, 300, 300, "document"),
        ("document_bidir", document(docs, False), 2, 1, 300, 300, "document"),
        ("dflash", dflash(anchors, keep, S, bs), 2, 1, N * bs, S + N * bs, "drafter"),
        ("dflash_clamp", dflash(anchors, keep, S, bs, clamp=True), 2, 1, N * bs, S + N * bs,
         "drafter"),
        ("prefix_lm", prefix_lm(prefix), 2, 1, 256, 256, None),
        ("block_diagonal", block_diagonal(24), 1, 1, 200, 200, None),
        ("dilated", dilated, 1, 1, 150, 150, None),
        ("abs_window", lambda b, h, q, kv: abs(q - kv) <= 9, 1, 1, 140, 140, "sliding_window"),
        ("head_dependent", head_dependent, 1, 3, 130, 130, None),
    ]


@pytest.mark.parametrize("name,fn,B,H,L,KV,builtin", _cases(), ids=[c[0] for c in _cases()])
def test_recorded_mask_equals_torch_create_mask(name, fn, B, H, L, KV, builtin):
    bm = kcache.create_block_mask(fn, B, H, L, KV, device="cpu")
    assert bm.builtin == builtin
    got = eval_recorded(bm, B, H, L, KV)
    want = t_mask(fn, B, H, L, KV, device="cpu").expand(B, H, L, KV)
    assert torch.equal(got, want), "%s: %d of %d differ" % (name, (got != want).sum(),
                                                            got.numel())


@pytest.mark.parametrize("name,fn,B,H,L,KV,builtin", _cases()[:8], ids=[c[0] for c in
                                                                         _cases()[:8]])
def test_block_classes_equal_torch_create_block_mask(name, fn, B, H, L, KV, builtin):
    bs = 32 if name != "dflash" else 16
    bm = kcache.create_block_mask(fn, B, H, L, KV, device="cpu")
    tbm = t_cbm(fn, B, H, L, KV, device="cpu", BLOCK_SIZE=bs)
    assert torch.equal(block_classes(eval_recorded(bm, B, H, L, KV), bs, bs),
                       flex_block_classes(tbm).expand(B, H, -1, -1))


def test_builtins_give_the_builtin_specs():
    anchors, keep = torch.zeros(1, 4, dtype=torch.int64), torch.ones(1, 4, dtype=torch.bool)
    docs = torch.zeros(1, 64, dtype=torch.int32)
    mk = lambda f, L=64, KV=64: kcache.create_block_mask(f, 1, 1, L, KV).spec_mask()  # noqa
    assert mk(causal) == kcache.causal()
    assert mk(lambda b, h, q, kv: kv <= q) == kcache.causal()
    assert mk(lambda b, h, q, kv: q - kv >= 0) == kcache.causal()
    assert mk(sliding(16)) == kcache.sliding_window(16, 0)
    assert mk(lambda b, h, q, kv: (q - kv < 16) & (kv - q < 4)) == kcache.sliding_window(15, 3)
    assert mk(lambda b, h, q, kv: abs(q - kv) < 5) == kcache.sliding_window(4, 4)
    assert mk(lambda b, h, q, kv: (kv - q).abs() <= 7) == kcache.sliding_window(7, 7)
    assert mk(lambda b, h, q, kv: abs(q - kv) > 5).WhichOneof("kind") == "expr"
    assert mk(lambda b, h, q, kv: q > kv).WhichOneof("kind") == "expr"  # strict: no built-in
    assert mk(document(docs)) == kcache.document(causal=True)
    assert mk(document(docs, False)) == kcache.document()
    assert mk(lambda b, h, q, kv: True) == kcache.no_mask()
    assert mk(dflash(anchors, keep, 100, 16), 64, 164) == kcache.drafter(16)
    assert mk(dflash(anchors, keep, 100, 16, clamp=True), 64, 164) == kcache.drafter(16)
    # context window and causal-within-block variants
    S, bs = 100, 16

    def windowed(b, h, q, kv):
        j = q // bs
        ctx = (kv < S) & (kv < anchors[b, j]) & (kv >= anchors[b, j] - 31)
        draft = (kv >= S) & (j == (kv - S) // bs) & (kv - S <= q)
        return (ctx | draft) & keep[b, j]
    assert mk(windowed, 64, 164) == kcache.drafter(16, causal_within_block=True,
                                                   context_window=31)
    # S that does not match KV_LEN - Q_LEN: not the drafter, still exact as an expression
    assert mk(dflash(anchors, keep, 90, 16), 64, 164).WhichOneof("kind") == "expr"


def test_new_tensor_values_keep_the_spec_and_change_the_buffers():
    from kcache.flex import mask_launch
    g = torch.Generator().manual_seed(1)
    a1, a2 = torch.randint(0, 60, (2, 4), generator=g), torch.randint(0, 60, (2, 4), generator=g)
    keep = torch.ones(2, 4, dtype=torch.bool)
    bm1 = kcache.create_block_mask(dflash(a1, keep, 60, 16), 2, 1, 64, 124)
    bm2 = kcache.create_block_mask(dflash(a2, keep, 60, 16), 2, 1, 64, 124)
    assert bm1._part.text == bm2._part.text
    n1, t1 = mask_launch(bm1._part, bm1.tensors, 2, 64, 124)
    n2, t2 = mask_launch(bm2._part, bm2.tensors, 2, 64, 124)
    assert n1 == n2 == ["@anchors", "@keep"]
    assert torch.equal(t1[0], a1.int()) and torch.equal(t2[0], a2.int())
    # expression masks too: same spec, buffers from the new values
    p1, p2 = torch.tensor([3, 9]), torch.tensor([30, 1])
    e1 = kcache.create_block_mask(prefix_lm(p1), 2, 1, 64, 64)
    e2 = kcache.create_block_mask(prefix_lm(p2), 2, 1, 64, 64)
    assert e1._part.text == e2._part.text and e1.builtin is None
    assert torch.equal(mask_launch(e2._part, e2.tensors, 2, 64, 64)[1][0], p2.int())


def test_score_mods_record_to_expressions():
    from kcache import _record, _reference
    from kcache.flex import _lower_score
    from flex_helpers import softcap, relative_bias, alibi_like, bias_table
    slopes = torch.rand(3)
    table = torch.randn(3, 40)
    s = torch.randn(2, 3, 24, 40)
    idx = _reference.grid(2, 3, 24, 40)
    for fn in (softcap, relative_bias, alibi_like(slopes), bias_table(table),
               lambda sc, b, h, q, kv: torch.where(q >= kv, sc, sc - 1.0) * 0.5,
               lambda sc, b, h, q, kv: sc + table[h, kv // 2] + (q // 4).float()):
        part = _lower_score(_record.record_score(fn))
        from kcache import _protos
        from kcache.flex import parse
        spec = _protos.modules()[0].AttentionSpec()
        spec.score_mod.CopyFrom(parse(_protos.modules()[0].ScoreMod, part.text))
        bufs = {u.name: u.make(part.tensors, torch) for u in part.uses}
        got = _reference.score_values(spec, s, bufs)
        want = fn(s, idx["b"], idx["h"], idx["q"], idx["kv"])
        torch.testing.assert_close(got, want.float().expand_as(got))


def test_recording_is_thread_safe_and_fast():
    import time
    anchors, keep = torch.zeros(2, 8, dtype=torch.int64), torch.ones(2, 8, dtype=torch.bool)
    fn = dflash(anchors, keep, 500, 16)
    out, errors = [], []

    def work():
        try:
            for _ in range(50):
                out.append(kcache.create_block_mask(fn, 2, 1, 128, 628)._part.text)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and len(set(out)) == 1 and len(out) == 200
    t0 = time.perf_counter()
    for _ in range(20):
        kcache.create_block_mask(fn, 2, 1, 128, 628)
    assert (time.perf_counter() - t0) / 20 < 0.02  # milliseconds at most, even on a busy CI


# ---------------------------------------------------------------------------
# Errors: each names the operation and the user's line
# ---------------------------------------------------------------------------
def _line_of(fn, text):
    import inspect
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return start + i
    raise AssertionError(text)


def _data_dependent_if(b, h, q_idx, kv_idx):
    if q_idx > kv_idx:  # MARK
        return True
    return False


def _item(b, h, q_idx, kv_idx):
    return q_idx.item() > 3  # MARK


def _unsupported_op(b, h, q_idx, kv_idx):
    return torch.sin(q_idx) > 0  # MARK


def _bitwise_int(b, h, q_idx, kv_idx):
    return (q_idx & 3) == 0  # MARK


def _float_floordiv(score, b, h, q_idx, kv_idx):
    return score // 2.0  # MARK


def _var_mod(b, h, q_idx, kv_idx):
    return q_idx % kv_idx == 0  # MARK


def _method(b, h, q_idx, kv_idx):
    return q_idx.sum() > 0  # MARK


_T = torch.arange(10)


def _unindexed(b, h, q_idx, kv_idx):
    return _T > q_idx  # MARK


def _float_index(b, h, q_idx, kv_idx):
    return _T[q_idx / 2] > 0  # MARK


def _slice_index(b, h, q_idx, kv_idx):
    return _T2[q_idx, 1:3] > 0  # MARK


_T2 = torch.zeros(3, 4)


def _partial(b, h, q_idx, kv_idx):
    return _T2[b] > 0  # MARK


def _div_in_index(b, h, q_idx, kv_idx):
    return _T[q_idx // 2 * 3] > 0  # MARK


def _chained(b, h, q_idx, kv_idx):
    return 0 <= q_idx < kv_idx  # MARK


@pytest.mark.parametrize("fn,what", [
    (_data_dependent_if, "truth test"), (_item, ".item()"), (_unsupported_op, "sin"),
    (_bitwise_int, "&"), (_var_mod, "%"), (_method, ".sum"),
    (_unindexed, "without indexing"), (_float_index, "float"), (_slice_index, "slice"),
    (_partial, "rank 2 indexed with 1"), (_chained, "truth test")])
def test_unrecordable_masks_name_the_operation_and_line(fn, what):
    with pytest.raises(InvalidSpec) as ei:
        kcache.create_block_mask(fn, 1, 1, 16, 16)
    msg = str(ei.value)
    assert what in msg, msg
    assert "%s:%d" % (HERE, _line_of(fn, "MARK")) in msg, msg
    assert isinstance(ei.value, KcacheError)


def test_unrecordable_score_mods_and_divisions():
    from kcache import _record
    with pytest.raises(InvalidSpec, match=r"//.*%s:%d" % (HERE, _line_of(_float_floordiv,
                                                                          "MARK"))):
        _record.record_score(_float_floordiv)
    bm = None
    with pytest.raises(InvalidSpec, match="integer division.*%s:%d" % (
            HERE, _line_of(_div_in_index, "MARK"))):
        bm = kcache.create_block_mask(_div_in_index, 1, 1, 16, 16)
    assert bm is None
    with pytest.raises(InvalidSpec, match="returned a float"):
        kcache.create_block_mask(lambda b, h, q, kv: q * 0.5, 1, 1, 16, 16)
    with pytest.raises(InvalidSpec, match="returned str"):
        kcache.create_block_mask(lambda b, h, q, kv: "x", 1, 1, 16, 16)
    with pytest.raises(InvalidSpec, match="returned a bool"):
        _record.record_score(lambda s, b, h, q, kv: s > 0)
    with pytest.raises(InvalidSpec, match="division by zero"):
        kcache.create_block_mask(lambda b, h, q, kv: q // 0 == 1, 1, 1, 16, 16)
    with pytest.raises(InvalidSpec, match="not callable"):
        kcache.create_block_mask(None, 1, 1, 16, 16)


def test_block_mask_surface():
    bm = kcache.create_block_mask(causal, None, None, 256, 512, device="cpu", BLOCK_SIZE=64)
    assert bm.shape == (None, None, 256, 512) and bm.seq_lengths == (256, 512)
    assert bm.BLOCK_SIZE == (64, 64) and bm.mask_mod is causal
    assert "causal" in repr(bm)
    docs = torch.zeros(1, 32, dtype=torch.int64)
    bm2 = kcache.create_block_mask(document(docs), 1, 1, 32, 32).to("cpu")
    assert bm2.builtin == "document" and bm2.tensors[0].device.type == "cpu"
    assert bm2.spec_mask() == kcache.document(causal=True)


def test_expression_language_trainable_buffer():
    bias = kcache.buffer("bias", "float32", rank=2, trainable=True)
    s = kcache.spec(q_heads=4, score_mod=kcache.score_expr(kcache.score + bias[kcache.h,
                                                                               kcache.kv_idx]))
    assert [(d.name, d.trainable) for d in s.buffers] == [("bias", True)]
    with pytest.raises(ValueError, match="float32"):
        kcache.buffer("x", "int32", trainable=True)


def test_torch_mask_combinators_record():
    from torch.nn.attention.flex_attention import and_masks, or_masks, noop_mask
    prefix = torch.tensor([20, 3])
    for fn, builtin in ((noop_mask, "none"), (and_masks(causal, sliding(8)), "sliding_window"),
                        (or_masks(causal, prefix_lm(prefix)), None),
                        (and_masks(noop_mask, causal), "causal")):
        bm = kcache.create_block_mask(fn, 2, 1, 100, 100, device="cpu")
        assert bm.builtin == builtin
        assert torch.equal(eval_recorded(bm, 2, 1, 100, 100),
                           t_mask(fn, 2, 1, 100, 100, device="cpu").expand(2, 1, 100, 100))
