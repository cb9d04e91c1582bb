"""A dense reference of kcache's attention semantics in torch, for the CPU and for tests.

eval_expr() interprets a kcache.v1.Expr over broadcast index tensors (the kernel's
rules: int arithmetic, % with a result >= 0, reads outside a buffer's extent give 0);
mask_values() / score_values() evaluate a spec's mask and score modification on the
[B, H, Q_LEN, KV_LEN] grid, built-ins included; attention() is softmax attention with
them, O(Q_LEN x KV_LEN) memory: the path kcache.flex_attention takes for CPU tensors.
"""

import math

from kcache import _protos
from kcache.errors import InvalidSpec


def _pb():
    return _protos.modules()[0]


def eval_expr(e, env, buffers):
    """Value of Expr `e`; env: {'b','h','q','kv'} int64 tensors (broadcastable) and 'score'
    (float32) where the expression may use it; buffers: {name: tensor}."""
    import torch
    k = e.WhichOneof("node")
    if k == "index":
        return env[{1: "b", 2: "h", 3: "q", 4: "kv"}[e.index]]
    if k == "int_const":
        return torch.tensor(e.int_const, dtype=torch.int64)
    if k == "float_const":
        return torch.tensor(e.float_const, dtype=torch.float32)
    if k == "bool_const":
        return torch.tensor(e.bool_const)
    if k == "score":
        return env["score"]
    if k == "unary":
        a = eval_expr(e.unary.arg, env, buffers)
        op = e.unary.op
        return {1: torch.neg, 2: torch.logical_not, 3: torch.abs, 4: torch.exp, 5: torch.tanh,
                6: lambda x: x.to(torch.float32)}[op](a)
    if k == "binary":
        a = eval_expr(e.binary.lhs, env, buffers)
        b = eval_expr(e.binary.rhs, env, buffers)
        op = e.binary.op
        if op == 5:
            return torch.remainder(a, b.abs())
        f = {1: torch.add, 2: torch.sub, 3: torch.mul, 4: torch.div, 6: torch.minimum,
             7: torch.maximum, 8: torch.eq, 9: torch.ne, 10: torch.lt, 11: torch.le,
             12: torch.gt, 13: torch.ge, 14: torch.logical_and, 15: torch.logical_or}[op]
        return f(a, b)
    if k == "select":
        c = eval_expr(e.select.cond, env, buffers)
        return torch.where(c, eval_expr(e.select.if_true, env, buffers),
                           eval_expr(e.select.if_false, env, buffers))
    if k == "read":
        t = buffers[e.read.buffer]
        idx = [eval_expr(i, env, buffers) for i in e.read.index]
        idx = torch.broadcast_tensors(*idx)
        ok = torch.ones(idx[0].shape, dtype=torch.bool)
        safe = []
        for d, i in enumerate(idx):
            ok = ok & (i >= 0) & (i < t.shape[d])
            safe.append(torch.where(ok, i, torch.zeros_like(i)).clamp(0, max(t.shape[d] - 1, 0)))
        v = t[tuple(safe)]
        if t.dtype == torch.bool:
            return v & ok
        if t.dtype.is_floating_point:
            return torch.where(ok, v.to(torch.float32), torch.zeros((), dtype=torch.float32))
        return torch.where(ok, v.to(torch.int64), torch.zeros((), dtype=torch.int64))
    raise InvalidSpec("the reference cannot evaluate expression node %r" % k, "spec.mask")


def grid(B, H, q_len, kv_len):
    import torch
    return dict(b=torch.arange(B).view(B, 1, 1, 1), h=torch.arange(H).view(1, H, 1, 1),
                q=torch.arange(q_len).view(1, 1, q_len, 1),
                kv=torch.arange(kv_len).view(1, 1, 1, kv_len))


def mask_values(spec, B, H, q_len, kv_len, buffers=None, inputs=None):
    """bool [B, H, q_len, kv_len] (broadcast dims may be 1): which keys each query sees."""
    import torch
    env = grid(B, H, q_len, kv_len)
    q, kv, b = env["q"], env["kv"], env["b"]
    m = spec.mask
    kind = m.WhichOneof("kind") or "none"
    inputs = inputs or {}
    if kind == "none":
        out = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool)
    elif kind in ("causal", "sliding_window"):
        w = m.causal if kind == "causal" else m.sliding_window
        left, right = (-1, 0) if kind == "causal" else (w.left, w.right)
        qa = q + (kv_len - q_len if w.alignment == 2 else 0)
        out = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool)
        if left >= 0:
            out = out & (kv - qa >= -left)
        if right >= 0:
            out = out & (kv - qa <= right)
    elif kind == "document":
        qs, ks = inputs["q_seq_id"].long(), inputs["kv_seq_id"].long()
        out = qs[:, None, :q_len, None] == ks[:, None, None, :kv_len]
        if m.document.causal:
            out = out & (kv <= q)
    elif kind == "drafter":
        d = m.drafter
        bs, S = d.block_size, kv_len - q_len
        j = q // bs
        a = inputs["anchors"].long()[:, :q_len // bs]
        keep = inputs.get("keep")
        A = a[b.view(-1), :][:, None, :, None].repeat_interleave(bs, dim=2)  # [B,1,q,1]
        y = A.clamp(max=S).clamp(min=0)
        x = (A - d.context_window).clamp(min=0) if d.context_window > 0 else torch.zeros_like(A)
        x = torch.minimum(x, y)
        z = S + j * bs
        w = S + q + 1 if d.causal_within_block else S + (j + 1) * bs
        out = ((kv >= x) & (kv < y)) | ((kv >= z) & (kv < w))
        if keep is not None:
            kp = keep.bool()[:, :q_len // bs][:, None, :, None].repeat_interleave(bs, dim=2)
            out = out & kp
    elif kind == "expr":
        out = eval_expr(m.expr.predicate, env, buffers or {})
    else:
        raise InvalidSpec("the reference has no mask kind %s" % kind, "spec.mask")
    return out


def score_values(spec, s, buffers=None, inputs=None):
    """The score modification applied to scaled scores s [B, H, q_len, kv_len] (float32)."""
    import torch
    kind = spec.score_mod.WhichOneof("kind") or "none"
    B, H, L, S = s.shape
    env = grid(B, H, L, S)
    if kind == "none":
        return s
    if kind == "softcap":
        c = spec.score_mod.softcap.cap
        return c * torch.tanh(s / c)
    if kind == "alibi":
        sl = (inputs or {})["alibi_slopes"].float()
        return s + sl.view(1, H, 1, 1) * (env["kv"] - env["q"]).float()
    env["score"] = s
    return eval_expr(spec.score_mod.expr.value, env, buffers or {}).to(torch.float32) + \
        torch.zeros_like(s)


def attention(spec, q, k, v, buffers=None, inputs=None):
    """(out [B, Hq, Lq, Dv] in q's dtype, lse float32 [B, Hq, Lq], natural log, -inf on
    rows that see no key) for [B, H, L, D] tensors; differentiable in everything."""
    import torch
    B, Hq, Lq, D = q.shape
    Hkv, Lkv = k.shape[1], k.shape[2]
    if Hkv != Hq:
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
    scale = spec.softmax_scale or 1.0 / math.sqrt(spec.head_dim_qk or D)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    s = score_values(spec, s, buffers, inputs)
    m = mask_values(spec, B, Hq, Lq, Lkv, buffers, inputs)
    s = s.masked_fill(~m, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    out = torch.matmul(p, v.float())
    return out.to(q.dtype), lse
