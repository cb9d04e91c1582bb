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
protobuf's JSON mapping. Refused values raise kcache.InvalidArgument (a
ValueError) or kcache.InvalidType (a TypeError).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Tuple, Union

from kcache import _protos
from kcache.errors import InvalidArgument, InvalidType

if TYPE_CHECKING:  # annotations only; the modules load on first use
    from kcache.v1 import spec_pb2

# What to_spec (and every function taking a spec) accepts.
SpecLike = Union["spec_pb2.AttentionSpec", str, bytes, Mapping[str, Any]]
# An Expr, or a Python constant that becomes one.
ExprLike = Union["Expr", bool, int, float]
# {buffer name: (element type "int32" / "float32" / "bool", rank[, trainable])}
BufferDecls = Dict[str, Tuple[Any, ...]]

_DTYPES = {"bf16": 1, "bfloat16": 1, "fp16": 2, "float16": 2, "half": 2}
_ELEM = {"int32": 1, "float32": 2, "float": 2, "bool": 3}


def _pb():
    return _protos.modules()[0]


# ---------------------------------------------------------------------------
# Masks and score modifications
# ---------------------------------------------------------------------------
def _alignment(bottom_right: bool) -> int:
    return 2 if bottom_right else 1


def no_mask() -> spec_pb2.MaskSpec:
    m = _pb().MaskSpec()
    m.none.SetInParent()
    return m


def causal(bottom_right: bool = False) -> spec_pb2.MaskSpec:
    """q_idx >= kv_idx (top-left), or aligned to the bottom-right corner."""
    m = _pb().MaskSpec()
    m.causal.alignment = _alignment(bottom_right)
    return m


def sliding_window(left: int, right: int = 0, bottom_right: bool = False
                   ) -> spec_pb2.MaskSpec:
    """Visible when -left <= kv_idx - q_idx <= right; a negative extent is unbounded."""
    m = _pb().MaskSpec()
    m.sliding_window.left = int(left)
    m.sliding_window.right = int(right)
    m.sliding_window.alignment = _alignment(bottom_right)
    return m


def document(causal: bool = False) -> spec_pb2.MaskSpec:
    """Packed sequences: q_seq_id / kv_seq_id (int32) are given at launch."""
    m = _pb().MaskSpec()
    m.document.causal = bool(causal)
    return m


def drafter(block_size: int, causal_within_block: bool = False,
            context_window: int = 0) -> spec_pb2.MaskSpec:
    """Block-diffusion drafter mask; anchors (and optional keep) are given at launch."""
    m = _pb().MaskSpec()
    m.drafter.block_size = int(block_size)
    m.drafter.causal_within_block = bool(causal_within_block)
    m.drafter.context_window = int(context_window)
    return m


def expr_mask(predicate: ExprLike) -> _Tagged:
    """An arbitrary boolean Expr over b, h, q_idx, kv_idx and named buffers."""
    e = _as_expr(predicate)
    m = _pb().MaskSpec()
    m.expr.predicate.CopyFrom(e.proto)
    return _Tagged(m, e.buffers)


def softcap(cap: float) -> spec_pb2.ScoreMod:
    """s -> cap * tanh(s / cap)."""
    s = _pb().ScoreMod()
    s.softcap.cap = float(cap)
    return s


def alibi() -> spec_pb2.ScoreMod:
    """s -> s + slope[h] * (kv_idx - q_idx); slopes given at launch."""
    s = _pb().ScoreMod()
    s.alibi.SetInParent()
    return s


def score_expr(value: ExprLike) -> _Tagged:
    """A float Expr of the score (kcache.score) and the indices."""
    e = _as_expr(value)
    s = _pb().ScoreMod()
    s.expr.value.CopyFrom(e.proto)
    return _Tagged(s, e.buffers)


class _Tagged:
    """A MaskSpec/ScoreMod with the buffer declarations its expression needs."""

    def __init__(self, msg: Any, buffers: Mapping[str, Tuple[Any, ...]]) -> None:
        self.msg = msg
        self.buffers = dict(buffers)


# ---------------------------------------------------------------------------
# Expressions
# ---------------------------------------------------------------------------
def _binary(op: int, swap: bool = False) -> Callable[[Expr, ExprLike], Expr]:
    """An Expr operator method building BinaryExpr `op` (operands swapped for __r*__)."""
    def method(self: Expr, other: ExprLike) -> Expr:
        return self._bin(op, other, swap)
    return method


def _unary(op: int) -> Callable[[Expr], Expr]:
    def method(self: Expr) -> Expr:
        return self._un(op)
    return method


class Expr:
    """A typed expression node (kcache.v1.Expr) plus the buffers it reads."""

    __hash__ = None  # type: ignore[assignment]  # == builds an expression

    def __init__(self, proto: spec_pb2.Expr,
                 buffers: Optional[Mapping[str, Tuple[Any, ...]]] = None) -> None:
        self.proto = proto
        self.buffers = dict(buffers or {})  # name -> (elem type, rank)

    def _bin(self, op: int, other: ExprLike, swap: bool = False) -> Expr:
        o = _as_expr(other)
        lhs, rhs = (o, self) if swap else (self, o)
        e = _pb().Expr()
        e.binary.op = op
        e.binary.lhs.CopyFrom(lhs.proto)
        e.binary.rhs.CopyFrom(rhs.proto)
        return Expr(e, _merge(lhs.buffers, rhs.buffers))

    def _un(self, op: int) -> Expr:
        e = _pb().Expr()
        e.unary.op = op
        e.unary.arg.CopyFrom(self.proto)
        return Expr(e, self.buffers)

    __add__ = _binary(1)
    __radd__ = _binary(1, swap=True)
    __sub__ = _binary(2)
    __rsub__ = _binary(2, swap=True)
    __mul__ = _binary(3)
    __rmul__ = _binary(3, swap=True)
    __truediv__ = _binary(4)
    __rtruediv__ = _binary(4, swap=True)
    __mod__ = _binary(5)
    __rmod__ = _binary(5, swap=True)
    __floordiv__ = _binary(16)
    __rfloordiv__ = _binary(16, swap=True)
    __eq__ = _binary(8)  # type: ignore[assignment]
    __ne__ = _binary(9)  # type: ignore[assignment]
    __lt__ = _binary(10)
    __le__ = _binary(11)
    __gt__ = _binary(12)
    __ge__ = _binary(13)
    __and__ = _binary(14)
    __rand__ = _binary(14, swap=True)
    __or__ = _binary(15)
    __ror__ = _binary(15, swap=True)
    __neg__ = _unary(1)
    __invert__ = _unary(2)
    __abs__ = _unary(3)

    def exp(self) -> Expr:
        return self._un(4)

    def tanh(self) -> Expr:
        return self._un(5)

    def to_float(self) -> Expr:
        return self._un(6)

    def __bool__(self) -> bool:
        raise InvalidType("a kcache.Expr has no truth value: use & | ~ instead of and/or/not, "
                          "and no chained comparisons")


def _merge(a: Mapping[str, Tuple[Any, ...]], b: Mapping[str, Tuple[Any, ...]]) -> BufferDecls:
    out = dict(a)
    for name, decl in b.items():
        if name in out and out[name] != decl:
            raise InvalidArgument("buffer %r used as %s and as %s" % (name, out[name], decl),
                                  name)
        out[name] = decl
    return out


def _as_expr(x: ExprLike) -> Expr:
    if isinstance(x, Expr):
        return x
    e = _pb().Expr()
    if isinstance(x, bool):
        e.bool_const = x
    elif isinstance(x, int):
        if not -2**31 <= x < 2**31:
            raise InvalidArgument("int constant %d outside int32" % x)
        e.int_const = x
    elif isinstance(x, float):
        e.float_const = x
    else:
        raise InvalidType("cannot use %r in a kcache expression" % (x,))
    return Expr(e)


def _index(v: int) -> Expr:
    e = _pb().Expr()
    e.index = v
    return Expr(e)


class _Lazy:
    """b, h, q_idx, kv_idx, score: built on first use (the proto modules may load late)."""

    def __init__(self, make):
        self._make = make

    def __get__(self, obj, owner):
        return self._make()


def where(cond: ExprLike, if_true: ExprLike, if_false: ExprLike) -> Expr:
    c, t, f = _as_expr(cond), _as_expr(if_true), _as_expr(if_false)
    e = _pb().Expr()
    e.select.cond.CopyFrom(c.proto)
    e.select.if_true.CopyFrom(t.proto)
    e.select.if_false.CopyFrom(f.proto)
    return Expr(e, _merge(_merge(c.buffers, t.buffers), f.buffers))


def minimum(a: ExprLike, b_: ExprLike) -> Expr:
    return _as_expr(a)._bin(6, b_)


def maximum(a: ExprLike, b_: ExprLike) -> Expr:
    return _as_expr(a)._bin(7, b_)


class buffer:  # noqa: N801 (reads like a function at the call site)
    """A named launch-time buffer: `buffer("prefix", "int32")[kcache.b]`.

    rank defaults to 1; indexing with fewer or more indices than the rank is
    an error. The tensor is passed to attention_forward(buffers={name: t}).
    trainable (float32, score modifications): kcache.attention returns its gradient."""

    def __init__(self, name: str, dtype: str = "int32", rank: int = 1,
                 trainable: bool = False) -> None:
        if dtype not in _ELEM:
            raise InvalidArgument("buffer %r: dtype must be one of %s" % (name, sorted(_ELEM)),
                                  "dtype")
        if trainable and _ELEM[dtype] != _ELEM["float32"]:
            raise InvalidArgument("buffer %r: a trainable buffer is float32, not %s"
                                  % (name, dtype), "trainable")
        self.name, self.dtype, self.rank = name, dtype, int(rank)
        self.trainable = bool(trainable)

    def __getitem__(self, idx: Union[ExprLike, Tuple[ExprLike, ...]]) -> Expr:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.rank:
            raise InvalidArgument("buffer %r has rank %d, indexed with %d"
                                  % (self.name, self.rank, len(idx)), self.name)
        e = _pb().Expr()
        e.read.buffer = self.name
        bufs = {self.name: (self.dtype, self.rank) + ((True,) if self.trainable else ())}
        for i in idx:
            ie = _as_expr(i)
            e.read.index.add().CopyFrom(ie.proto)
            bufs = _merge(bufs, ie.buffers)
        return Expr(e, bufs)


def _score() -> Expr:
    e = _pb().Expr()
    e.score = True
    return Expr(e)


class _Vars:
    b = _Lazy(lambda: _index(1))
    h = _Lazy(lambda: _index(2))
    q_idx = _Lazy(lambda: _index(3))
    kv_idx = _Lazy(lambda: _index(4))
    score = _Lazy(_score)


def __getattr__(name: str) -> Expr:  # module attributes b, h, q_idx, kv_idx, score
    if name in ("b", "h", "q_idx", "kv_idx", "score"):
        return getattr(_Vars, name)
    raise AttributeError(name)


# ---------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------
def spec(dtype: str = "bf16", head_dim: int = 128, q_heads: Optional[int] = None,
         kv_heads: Optional[int] = None, *, head_dim_v: Optional[int] = None,
         mask: Union[spec_pb2.MaskSpec, _Tagged, None] = None,
         score_mod: Union[spec_pb2.ScoreMod, _Tagged, None] = None,
         softmax_scale: Optional[float] = None,
         buffers: Optional[Mapping[str, Tuple[Any, ...]]] = None, return_lse: bool = False,
         backward: bool = False, deterministic: bool = False,
         tuning: Optional[Mapping[str, int]] = None) -> spec_pb2.AttentionSpec:
    """A kcache.v1.AttentionSpec. mask / score_mod: from the helpers above (or the messages).

    buffers: extra {name: (dtype, rank[, trainable])} declarations; those read by
    expressions are declared automatically. tuning: dict of block_m, block_n,
    num_warps, stages (the daemon refuses a configuration the target cannot build, e.g.
    block_n 176 or 12 warps anywhere but sm_90a's ping-pong; docs/kernel-contract.md)."""
    pb = _pb()
    if dtype not in _DTYPES:
        raise InvalidArgument("dtype: %r is not one of %s" % (dtype, sorted(_DTYPES)), "dtype")
    if q_heads is None:
        raise InvalidArgument("q_heads: required", "q_heads")
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
        dt, rank = decls[name][:2]
        d = s.buffers.add()
        d.name, d.type, d.rank = name, _ELEM[dt], int(rank)
        d.trainable = len(decls[name]) > 2 and bool(decls[name][2])
    s.return_lse = bool(return_lse)
    s.backward = bool(backward)
    s.deterministic = bool(deterministic)
    if tuning:
        for k_, v_ in tuning.items():
            setattr(s.tuning, k_, int(v_))
    return s


def to_spec(x: SpecLike) -> spec_pb2.AttentionSpec:
    """An AttentionSpec from a message, a JSON string, or a dict (protobuf JSON mapping)."""
    pb = _pb()
    from google.protobuf import json_format
    if isinstance(x, pb.AttentionSpec):
        return x
    if isinstance(x, (str, bytes)):
        try:
            return json_format.Parse(x, pb.AttentionSpec())
        except json_format.ParseError as e:
            raise InvalidArgument("spec JSON: %s" % e, "spec") from e
    if isinstance(x, dict):
        try:
            return json_format.ParseDict(x, pb.AttentionSpec())
        except json_format.ParseError as e:
            raise InvalidArgument("spec JSON: %s" % e, "spec") from e
    raise InvalidType("spec: expected kcache.v1.AttentionSpec, JSON text or dict, got %s" %
                      type(x).__name__)
