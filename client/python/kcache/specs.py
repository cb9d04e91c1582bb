"""Building kcache.v1.AttentionSpec messages from Python.

    kcache.spec(dtype="bf16", head_dim=128, q_heads=32, kv_heads=8, mask=kcache.causal())
    kcache.spec(..., mask=kcache.drafter(block_size=16), score_mod=kcache.softcap(30.0))
    prefix = kcache.buffer("prefix", "int32")
    kcache.spec(..., mask=kcache.expr_mask((kcache.kv_idx < prefix[kcache.b]) |
                                           (kcache.kv_idx <= kcache.q_idx)))

Expressions are typed trees (Expr) built with Python operators; `&`, `|`,
`~` are the boolean and/or/not, comparisons give bool. Buffers an
expression reads are declared in the spec automatically. Everything here is
data for the daemon's compiler: no text from the caller reaches CUDA source.
`to_spec` also accepts an AttentionSpec message, a JSON string or a dict in
protobuf's JSON mapping.
"""

from kcache import _protos

_DTYPES = {"bf16": 1, "bfloat16": 1, "fp16": 2, "float16": 2, "half": 2}
_ELEM = {"int32": 1, "float32": 2, "float": 2, "bool": 3}


def _pb():
    return _protos.modules()[0]


# ---------------------------------------------------------------------------
# Masks and score modifications
# ---------------------------------------------------------------------------
def _alignment(bottom_right):
    return 2 if bottom_right else 1


def no_mask():
    m = _pb().MaskSpec()
    m.none.SetInParent()
    return m


def causal(bottom_right=False):
    """q_idx >= kv_idx (top-left), or aligned to the bottom-right corner."""
    m = _pb().MaskSpec()
    m.causal.alignment = _alignment(bottom_right)
    return m


def sliding_window(left, right=0, bottom_right=False):
    """Visible when -left <= kv_idx - q_idx <= right; a negative extent is unbounded."""
    m = _pb().MaskSpec()
    m.sliding_window.left = int(left)
    m.sliding_window.right = int(right)
    m.sliding_window.alignment = _alignment(bottom_right)
    return m


def document(causal=False):
    """Packed sequences: q_seq_id / kv_seq_id (int32) are given at launch."""
    m = _pb().MaskSpec()
    m.document.causal = bool(causal)
    return m


def drafter(block_size, causal_within_block=False, context_window=0):
    """Block-diffusion drafter mask; anchors (and optional keep) are given at launch."""
    m = _pb().MaskSpec()
    m.drafter.block_size = int(block_size)
    m.drafter.causal_within_block = bool(causal_within_block)
    m.drafter.context_window = int(context_window)
    return m


def expr_mask(predicate):
    """An arbitrary boolean Expr over b, h, q_idx, kv_idx and named buffers."""
    e = _as_expr(predicate)
    m = _pb().MaskSpec()
    m.expr.predicate.CopyFrom(e.proto)
    return _Tagged(m, e.buffers)


def softcap(cap):
    """s -> cap * tanh(s / cap)."""
    s = _pb().ScoreMod()
    s.softcap.cap = float(cap)
    return s


def alibi():
    """s -> s + slope[h] * (kv_idx - q_idx); slopes given at launch."""
    s = _pb().ScoreMod()
    s.alibi.SetInParent()
    return s


def score_expr(value):
    """A float Expr of the score (kcache.score) and the indices."""
    e = _as_expr(value)
    s = _pb().ScoreMod()
    s.expr.value.CopyFrom(e.proto)
    return _Tagged(s, e.buffers)


class _Tagged:
    """A MaskSpec/ScoreMod with the buffer declarations its expression needs."""

    def __init__(self, msg, buffers):
        self.msg = msg
        self.buffers = dict(buffers)


# ---------------------------------------------------------------------------
# Expressions
# ---------------------------------------------------------------------------
class Expr:
    """A typed expression node (kcache.v1.Expr) plus the buffers it reads."""

    __hash__ = None  # == builds an expression

    def __init__(self, proto, buffers=None):
        self.proto = proto
        self.buffers = dict(buffers or {})  # name -> (elem type, rank)

    def _bin(self, op, other, swap=False):
        o = _as_expr(other)
        lhs, rhs = (o, self) if swap else (self, o)
        e = _pb().Expr()
        e.binary.op = op
        e.binary.lhs.CopyFrom(lhs.proto)
        e.binary.rhs.CopyFrom(rhs.proto)
        return Expr(e, _merge(lhs.buffers, rhs.buffers))

    def _un(self, op):
        e = _pb().Expr()
        e.unary.op = op
        e.unary.arg.CopyFrom(self.proto)
        return Expr(e, self.buffers)

    __add__ = lambda s, o: s._bin(1, o)  # noqa: E731
    __radd__ = lambda s, o: s._bin(1, o, True)  # noqa: E731
    __sub__ = lambda s, o: s._bin(2, o)  # noqa: E731
    __rsub__ = lambda s, o: s._bin(2, o, True)  # noqa: E731
    __mul__ = lambda s, o: s._bin(3, o)  # noqa: E731
    __rmul__ = lambda s, o: s._bin(3, o, True)  # noqa: E731
    __truediv__ = lambda s, o: s._bin(4, o)  # noqa: E731
    __rtruediv__ = lambda s, o: s._bin(4, o, True)  # noqa: E731
    __mod__ = lambda s, o: s._bin(5, o)  # noqa: E731
    __rmod__ = lambda s, o: s._bin(5, o, True)  # noqa: E731
    __floordiv__ = lambda s, o: s._bin(16, o)  # noqa: E731
    __rfloordiv__ = lambda s, o: s._bin(16, o, True)  # noqa: E731
    __eq__ = lambda s, o: s._bin(8, o)  # noqa: E731
    __ne__ = lambda s, o: s._bin(9, o)  # noqa: E731
    __lt__ = lambda s, o: s._bin(10, o)  # noqa: E731
    __le__ = lambda s, o: s._bin(11, o)  # noqa: E731
    __gt__ = lambda s, o: s._bin(12, o)  # noqa: E731
    __ge__ = lambda s, o: s._bin(13, o)  # noqa: E731
    __and__ = lambda s, o: s._bin(14, o)  # noqa: E731
    __rand__ = lambda s, o: s._bin(14, o, True)  # noqa: E731
    __or__ = lambda s, o: s._bin(15, o)  # noqa: E731
    __ror__ = lambda s, o: s._bin(15, o, True)  # noqa: E731
    __neg__ = lambda s: s._un(1)  # noqa: E731
    __invert__ = lambda s: s._un(2)  # noqa: E731
    __abs__ = lambda s: s._un(3)  # noqa: E731

    def exp(self):
        return self._un(4)

    def tanh(self):
        return self._un(5)

    def to_float(self):
        return self._un(6)

    def __bool__(self):
        raise TypeError("a kcache.Expr has no truth value: use & | ~ instead of and/or/not, "
                        "and no chained comparisons")


def _merge(a, b):
    out = dict(a)
    for name, decl in b.items():
        if name in out and out[name] != decl:
            raise ValueError("buffer %r used as %s and as %s" % (name, out[name], decl))
        out[name] = decl
    return out


def _as_expr(x):
    if isinstance(x, Expr):
        return x
    e = _pb().Expr()
    if isinstance(x, bool):
        e.bool_const = x
    elif isinstance(x, int):
        if not -2**31 <= x < 2**31:
            raise ValueError("int constant %d outside int32" % x)
        e.int_const = x
    elif isinstance(x, float):
        e.float_const = x
    else:
        raise TypeError("cannot use %r in a kcache expression" % (x,))
    return Expr(e)


def _index(v):
    e = _pb().Expr()
    e.index = v
    return Expr(e)


class _Lazy:
    """b, h, q_idx, kv_idx, score: built on first use (the proto modules may load late)."""

    def __init__(self, make):
        self._make = make

    def __get__(self, obj, owner):
        return self._make()


def where(cond, if_true, if_false):
    c, t, f = _as_expr(cond), _as_expr(if_true), _as_expr(if_false)
    e = _pb().Expr()
    e.select.cond.CopyFrom(c.proto)
    e.select.if_true.CopyFrom(t.proto)
    e.select.if_false.CopyFrom(f.proto)
    return Expr(e, _merge(_merge(c.buffers, t.buffers), f.buffers))


def minimum(a, b_):
    return _as_expr(a)._bin(6, b_)


def maximum(a, b_):
    return _as_expr(a)._bin(7, b_)


class buffer:  # noqa: N801 (reads like a function at the call site)
    """A named launch-time buffer: `buffer("prefix", "int32")[kcache.b]`.

    rank defaults to 1; indexing with fewer or more indices than the rank is
    an error. The tensor is passed to attention_forward(buffers={name: t})."""

    def __init__(self, name, dtype="int32", rank=1):
        if dtype not in _ELEM:
            raise ValueError("buffer %r: dtype must be one of %s" % (name, sorted(_ELEM)))
        self.name, self.dtype, self.rank = name, dtype, int(rank)

    def __getitem__(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.rank:
            raise ValueError("buffer %r has rank %d, indexed with %d" % (self.name, self.rank,
                                                                         len(idx)))
        e = _pb().Expr()
        e.read.buffer = self.name
        bufs = {self.name: (self.dtype, self.rank)}
        for i in idx:
            ie = _as_expr(i)
            e.read.index.add().CopyFrom(ie.proto)
            bufs = _merge(bufs, ie.buffers)
        return Expr(e, bufs)


def _score():
    e = _pb().Expr()
    e.score = True
    return Expr(e)


class _Vars:
    b = _Lazy(lambda: _index(1))
    h = _Lazy(lambda: _index(2))
    q_idx = _Lazy(lambda: _index(3))
    kv_idx = _Lazy(lambda: _index(4))
    score = _Lazy(_score)


def __getattr__(name):  # module attributes b, h, q_idx, kv_idx, score
    if name in ("b", "h", "q_idx", "kv_idx", "score"):
        return getattr(_Vars, name)
    raise AttributeError(name)


# ---------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------
def spec(dtype="bf16", head_dim=128, q_heads=None, kv_heads=None, *, head_dim_v=None, mask=None,
         score_mod=None, softmax_scale=None, buffers=None, return_lse=False, backward=False,
         deterministic=False, tuning=None):
    """A kcache.v1.AttentionSpec. mask / score_mod: from the helpers above (or the messages).

    buffers: extra {name: (dtype, rank)} declarations; those read by
    expressions are declared automatically. tuning: dict of block_m, block_n,
    num_warps, stages."""
    pb = _pb()
    if dtype not in _DTYPES:
        raise ValueError("dtype: %r is not one of %s" % (dtype, sorted(_DTYPES)))
    if q_heads is None:
        raise ValueError("q_heads: required")
    s = pb.AttentionSpec()
    s.dtype = _DTYPES[dtype]
    s.head_dim_qk = int(head_dim)
    s.head_dim_v = int(head_dim_v or 0)
    s.num_q_heads = int(q_heads)
    s.num_kv_heads = int(kv_heads or 0)
    if softmax_scale:
        s.softmax_scale = float(softmax_scale)
    decls = dict(buffers or {})
    for part, field in ((mask, s.mask), (score_mod, s.score_mod)):
        if part is None:
            continue
        if isinstance(part, _Tagged):
            decls = _merge(decls, part.buffers)
            part = part.msg
        field.CopyFrom(part)
    for name in sorted(decls):
        dt, rank = decls[name]
        d = s.buffers.add()
        d.name, d.type, d.rank = name, _ELEM[dt], int(rank)
    s.return_lse = bool(return_lse)
    s.backward = bool(backward)
    s.deterministic = bool(deterministic)
    if tuning:
        for k_, v_ in tuning.items():
            setattr(s.tuning, k_, int(v_))
    return s


def to_spec(x):
    """An AttentionSpec from a message, a JSON string, or a dict (protobuf JSON mapping)."""
    pb = _pb()
    from google.protobuf import json_format
    if isinstance(x, pb.AttentionSpec):
        return x
    if isinstance(x, (str, bytes)):
        try:
            return json_format.Parse(x, pb.AttentionSpec())
        except json_format.ParseError as e:
            raise ValueError("spec JSON: %s" % e) from e
    if isinstance(x, dict):
        try:
            return json_format.ParseDict(x, pb.AttentionSpec())
        except json_format.ParseError as e:
            raise ValueError("spec JSON: %s" % e) from e
    raise TypeError("spec: expected kcache.v1.AttentionSpec, JSON text or dict, got %s" %
                    type(x).__name__)
