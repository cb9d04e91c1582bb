"""Recording flex_attention-style functions into kcache expression trees.

`record_mask(mask_mod)` / `record_score(score_mod)` call the function once on
symbolic values (Sym) and return a Recording: a typed node tree, the captured
tensors it indexes, and lowering to kcache.v1.Expr. Sym defines Python's
operators and `__torch_function__`, so `torch.where`, `torch.minimum`, indexing
a captured tensor with symbolic indices, `.clamp()` and the like build nodes
instead of computing. Nothing here is global or mutable across calls: each
recording owns its state, so any thread may record at any time.

Integer floor division (`//` by a positive constant) has no node in the wire
format. It is removed while lowering: in comparisons both sides are scaled by
the divisor (c * (A // c) == A - A % c), and a captured tensor indexed with
`A // c` is read as the tensor repeated c times along that dimension, at A
(the repeat is done per launch, O(tensor size * c)).
"""

import math
import sys

from kcache.errors import InvalidSpec


# Binary op codes of kcache.v1.BinaryExpr / UnaryExpr.
ADD, SUB, MUL, DIV, MOD, MIN, MAX, EQ, NE, LT, LE, GT, GE, AND, OR = range(1, 16)
NEG, NOT, ABS, EXP, TANH, TO_FLOAT = range(1, 7)
_CMP = (EQ, NE, LT, LE, GT, GE)
_SWAP_CMP = {EQ: EQ, NE: NE, LT: GT, LE: GE, GT: LT, GE: LE}
VAR_B, VAR_H, VAR_Q, VAR_KV = 1, 2, 3, 4
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def _user_site():
    """file:line of the innermost frame outside kcache and torch (the user's code)."""
    f = sys._getframe(1)
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if not (mod == "kcache" or mod.startswith(("kcache.", "torch"))):
            return "%s:%d" % (f.f_code.co_filename, f.f_lineno)
        f = f.f_back
    return "<unknown>"


def _fail(what):
    raise InvalidSpec("kcache: cannot record %s (at %s): kcache records mask_mod/score_mod "
                      "functions made of arithmetic, comparisons, & | ~, // and %% by constants, "
                      "torch.where/minimum/maximum/clamp/abs/exp/tanh and captured tensors "
                      "indexed by them" % (what, _user_site()), field="mask_mod")


# ---------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------
class Node:
    """A typed, immutable expression node. kind: var, score, const, un, bin, sel, read, fdiv.
    type: 'int', 'float' or 'bool'. key: a hashable structural identity."""

    __slots__ = ("kind", "op", "args", "type", "value", "key", "site")

    def __init__(self, kind, type_, op=0, args=(), value=None, site=None):
        self.kind, self.type, self.op, self.args, self.value = kind, type_, op, tuple(args), value
        self.site = site
        self.key = (kind, op, value if kind != "read" else value[0],
                    tuple([a.key for a in self.args]))

    def has_div(self):
        if self.kind == "fdiv":
            return True
        if self.kind == "read":
            return False  # indices are lowered on their own
        return any(a.has_div() for a in self.args)

    def divisors(self, out):
        if self.kind == "fdiv":
            out.add(self.value)
        if self.kind != "read":
            for a in self.args:
                a.divisors(out)
        return out

    def __repr__(self):
        return "Node%r" % (self.key,)


def const(x):
    if isinstance(x, bool):
        return Node("const", "bool", value=bool(x))
    if isinstance(x, int):
        if not INT32_MIN <= x <= INT32_MAX:
            _fail("the int constant %d (outside int32)" % x)
        return Node("const", "int", value=int(x))
    if isinstance(x, float):
        if not math.isfinite(x):  # allowed only as where(cond, score, -inf): see record_score
            return Node("const", "float", value=float(x), site=_user_site())
        return Node("const", "float", value=float(x))
    return None


def _is_const(n, t=None):
    return n.kind == "const" and (t is None or n.type == t)


def to_float(n):
    if n.type == "float":
        return n
    if n.type == "bool":
        return sel(n, const(1.0), const(0.0))
    if n.kind == "const":
        return const(float(n.value))
    return Node("un", "float", TO_FLOAT, (n,))


def to_int(n):
    if n.type == "int":
        return n
    if n.type == "bool":
        return sel(n, const(1), const(0))
    _fail("a float to int conversion")


def sel(c, t, f):
    if c.type != "bool":
        c = binary(NE, c, const(0) if c.type == "int" else const(0.0))
    if t.type != f.type:
        if "float" in (t.type, f.type):
            t, f = to_float(t), to_float(f)
        else:
            t, f = to_int(t), to_int(f)
    if _is_const(c):
        return t if c.value else f
    return Node("sel", t.type, args=(c, t, f))


def unary(op, a):
    if op == NOT:
        if a.type != "bool":
            _fail("~ of a non-bool value (bitwise not)")
        if _is_const(a):
            return const(not a.value)
        return Node("un", "bool", NOT, (a,))
    if op in (EXP, TANH):
        a = to_float(a)
        return Node("un", "float", op, (a,))
    if a.type == "bool":
        a = to_int(a)
    if op == NEG and _is_const(a):
        return const(-a.value)
    if op == ABS and _is_const(a):
        return const(abs(a.value))
    return Node("un", a.type, op, (a,))


def floordiv(a, c, site=None):
    """a // c for an int node a and an int constant c != 0, with the division kept at the
    top (hoisted through + const, min/max const) where it can be."""
    if c == 0:
        _fail("an integer division by zero")
    if c < 0:
        return floordiv(unary(NEG, a), -c, site)
    if c == 1:
        return a
    if _is_const(a):
        return const(a.value // c)
    if a.kind == "fdiv":  # (A // d) // c == A // (d * c)
        return floordiv(a.args[0], a.value * c, site)
    if a.has_div():  # E // c == (m * E) // (m * c), m the divisors' lcm: E's divisions go away
        m = _lcm(a.divisors(set()))
        return floordiv(scale(a, m), m * c, site)
    return Node("fdiv", "int", value=c, args=(a,), site=site or _user_site())


def _lcm(vals):
    out = 1
    for v in vals:
        out = out * v // math.gcd(out, v)
    return out


def binary(op, a, b):
    if op in (AND, OR):
        if a.type != "bool" or b.type != "bool":
            _fail("%s of non-bool values (bitwise %s)" % ("&" if op == AND else "|",
                                                          "and" if op == AND else "or"))
        for x, y in ((a, b), (b, a)):
            if _is_const(x):
                if op == AND:
                    return y if x.value else const(False)
                return const(True) if x.value else y
        return Node("bin", "bool", op, (a, b))
    if op == MOD:
        if a.type != "int" or b.type != "int":
            _fail("% of float values")
        if not _is_const(b) or b.value <= 0:
            _fail("% by something other than a positive constant")
        if _is_const(a):
            return const(a.value % b.value)
        return Node("bin", "int", MOD, (a, b))
    if op == DIV:
        a, b = to_float(a), to_float(b)
        return Node("bin", "float", DIV, (a, b))
    if a.type == "bool" or b.type == "bool":
        if op in (EQ, NE) and a.type == b.type == "bool":  # bool == bool -> (a & b) | (~a & ~b)
            same = binary(OR, binary(AND, a, b), binary(AND, unary(NOT, a), unary(NOT, b)))
            return same if op == EQ else unary(NOT, same)
        a, b = to_int(a) if a.type == "bool" else a, to_int(b) if b.type == "bool" else b
    if a.type != b.type:
        a, b = to_float(a), to_float(b)
    t = "bool" if op in _CMP else a.type
    if _is_const(a) and _is_const(b) and a.type == "int":
        x, y = a.value, b.value
        v = {ADD: x + y, SUB: x - y, MUL: x * y, MIN: min(x, y), MAX: max(x, y), EQ: x == y,
             NE: x != y, LT: x < y, LE: x <= y, GT: x > y, GE: x >= y}[op]
        return const(v)
    if a.type == "int" and op in (ADD, SUB, MIN, MAX):  # hoist a division outward
        for x, y, swapped in ((a, b, False), (b, a, True)):
            if x.kind == "fdiv" and _is_const(y) and not (swapped and op == SUB):
                c, k = x.value, y.value
                if op == ADD:
                    return floordiv(binary(ADD, x.args[0], const(k * c)), c, x.site)
                if op == SUB:
                    return floordiv(binary(SUB, x.args[0], const(k * c)), c, x.site)
                if op == MIN:  # min(A // c, k) == min(A, k*c + c - 1) // c
                    return floordiv(binary(MIN, x.args[0], const(k * c + c - 1)), c, x.site)
                return floordiv(binary(MAX, x.args[0], const(k * c)), c, x.site)
        if a.kind == "fdiv" and b.kind == "fdiv" and a.value == b.value and op in (MIN, MAX):
            return floordiv(binary(op, a.args[0], b.args[0]), a.value, a.site)
    return Node("bin", t, op, (a, b))


def scale(n, c):
    """A division-free int node equal to c * n (c > 0; every divisor in n divides c)."""
    if c == 1 and not n.has_div():
        return n
    if not n.has_div():
        if _is_const(n):
            return const(n.value * c)
        return binary(MUL, n, const(c))
    k = n.kind
    if k == "fdiv":  # c * (A // d) == (c / d) * (A - A % d)
        a, d = n.args[0], n.value
        exact = binary(SUB, a, binary(MOD, a, const(d)))
        return exact if c == d else binary(MUL, exact, const(c // d))
    if k == "bin" and n.op in (ADD, SUB, MIN, MAX):
        return binary(n.op, scale(n.args[0], c), scale(n.args[1], c))
    if k == "bin" and n.op == MUL:
        a, b = n.args
        if not a.has_div():
            return binary(MUL, a, scale(b, c))
        if not b.has_div():
            return binary(MUL, scale(a, c), b)
    if k == "bin" and n.op == MOD:  # c * (A % m) == (c*A) % (c*m)
        return binary(MOD, scale(n.args[0], c), const(n.args[1].value * c))
    if k == "un" and n.op in (NEG, ABS):
        return unary(n.op, scale(n.args[0], c))
    if k == "sel":
        return sel(n.args[0], scale(n.args[1], c), scale(n.args[2], c))
    raise InvalidSpec("kcache: cannot record an integer division (at %s) inside a product of "
                      "two divided values: kcache's expressions have no integer division"
                      % _first_site(n), field="mask_mod")


def _first_site(n):
    if n.kind == "fdiv":
        return n.site
    for a in n.args:
        if a.has_div():
            return _first_site(a)
    return "<unknown>"


# ---------------------------------------------------------------------------
# Symbolic values
# ---------------------------------------------------------------------------
def _node(x, rec):
    if isinstance(x, Sym):
        return x._n
    if isinstance(x, _Partial):
        x._incomplete()
    c = const(x)
    if c is not None:
        return c
    torch = rec.torch
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dim() == 0:  # a captured scalar tensor: a one-element buffer
            return rec.read(x.reshape(1), (const(0),), source=x)
        _fail("a captured tensor of shape %s used without indexing it by b, h, q_idx or "
              "kv_idx" % (list(x.shape),))
    _fail("a value of type %s" % type(x).__name__)


def _sym(n, rec):
    return Sym(n, rec)


class Sym:
    """A symbolic int/float/bool value while a mask_mod or score_mod is recorded."""

    __slots__ = ("_n", "_rec")
    __hash__ = None

    def __init__(self, node, rec):
        self._n, self._rec = node, rec

    def _b(self, op, other, swap=False):
        o = _node(other, self._rec)
        a, b = (o, self._n) if swap else (self._n, o)
        return Sym(binary(op, a, b), self._rec)

    __add__ = lambda s, o: s._b(ADD, o)  # noqa: E731
    __radd__ = lambda s, o: s._b(ADD, o, True)  # noqa: E731
    __sub__ = lambda s, o: s._b(SUB, o)  # noqa: E731
    __rsub__ = lambda s, o: s._b(SUB, o, True)  # noqa: E731
    __mul__ = lambda s, o: s._b(MUL, o)  # noqa: E731
    __rmul__ = lambda s, o: s._b(MUL, o, True)  # noqa: E731
    __truediv__ = lambda s, o: s._b(DIV, o)  # noqa: E731
    __rtruediv__ = lambda s, o: s._b(DIV, o, True)  # noqa: E731
    __mod__ = lambda s, o: s._b(MOD, o)  # noqa: E731
    __rmod__ = lambda s, o: s._b(MOD, o, True)  # noqa: E731
    __eq__ = lambda s, o: s._b(EQ, o)  # noqa: E731
    __ne__ = lambda s, o: s._b(NE, o)  # noqa: E731
    __lt__ = lambda s, o: s._b(LT, o)  # noqa: E731
    __le__ = lambda s, o: s._b(LE, o)  # noqa: E731
    __gt__ = lambda s, o: s._b(GT, o)  # noqa: E731
    __ge__ = lambda s, o: s._b(GE, o)  # noqa: E731
    __and__ = lambda s, o: s._b(AND, o)  # noqa: E731
    __rand__ = lambda s, o: s._b(AND, o, True)  # noqa: E731
    __or__ = lambda s, o: s._b(OR, o)  # noqa: E731
    __ror__ = lambda s, o: s._b(OR, o, True)  # noqa: E731

    def __floordiv__(self, o):
        c = _node(o, self._rec)
        if self._n.type != "int" or not _is_const(c, "int"):
            _fail("// other than an integer divided by an integer constant")
        return Sym(floordiv(self._n, c.value, _user_site()), self._rec)

    def __rfloordiv__(self, o):
        _fail("// by a symbolic value")

    def __xor__(self, o):
        a, b = self._n, _node(o, self._rec)
        if a.type != "bool" or b.type != "bool":
            _fail("^ of non-bool values")
        return Sym(binary(OR, binary(AND, a, unary(NOT, b)), binary(AND, unary(NOT, a), b)),
                   self._rec)

    __rxor__ = __xor__

    def __neg__(self):
        return Sym(unary(NEG, self._n), self._rec)

    def __pos__(self):
        return self

    def __invert__(self):
        return Sym(unary(NOT, self._n), self._rec)

    def __abs__(self):
        return Sym(unary(ABS, self._n), self._rec)

    def __bool__(self):
        _fail("a Python truth test (if/and/or/not/chained comparison) of a symbolic value; "
              "use torch.where and & | ~")

    def __index__(self):
        _fail("a symbolic value used as a Python int")

    def __int__(self):
        _fail("int() of a symbolic value")

    def __float__(self):
        _fail("float() of a symbolic value")

    def __len__(self):
        _fail("len() of a symbolic value")

    def __iter__(self):
        _fail("iteration over a symbolic value")

    def __getitem__(self, idx):
        _fail("indexing a symbolic value (only captured tensors can be indexed)")

    def __setitem__(self, idx, v):
        _fail("assignment into a symbolic value")

    def __array__(self, *a, **k):
        _fail("conversion of a symbolic value to a NumPy array")

    def item(self):
        _fail(".item() of a symbolic value")

    def tolist(self):
        _fail(".tolist() of a symbolic value")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _fail("the tensor method or attribute .%s" % name)

    # Tensor methods with a node.
    def abs(self):
        return self.__abs__()

    def exp(self):
        return Sym(unary(EXP, self._n), self._rec)

    def tanh(self):
        return Sym(unary(TANH, self._n), self._rec)

    def sigmoid(self):  # 1 / (1 + exp(-x))
        return 1.0 / (1.0 + Sym(unary(EXP, unary(NEG, to_float(self._n))), self._rec))

    def neg(self):
        return self.__neg__()

    def logical_not(self):
        return self.__invert__()

    def logical_and(self, o):
        return self._b(AND, o)

    def logical_or(self, o):
        return self._b(OR, o)

    def clamp(self, min=None, max=None):  # noqa: A002 (torch's names)
        n = self._n
        if min is not None:
            n = binary(MAX, n, _node(min, self._rec))
        if max is not None:
            n = binary(MIN, n, _node(max, self._rec))
        return Sym(n, self._rec)

    clip = clamp

    def clamp_min(self, m):
        return self.clamp(min=m)

    def clamp_max(self, m):
        return self.clamp(max=m)

    def minimum(self, o):
        return self._b(MIN, o)

    def maximum(self, o):
        return self._b(MAX, o)

    def where(self, cond, other):
        return Sym(sel(_node(cond, self._rec), self._n, _node(other, self._rec)), self._rec)

    def remainder(self, o):
        return self._b(MOD, o)

    def floor_divide(self, o):
        return self.__floordiv__(o)

    def div(self, o, rounding_mode=None):
        if rounding_mode == "floor":
            return self.__floordiv__(o)
        if rounding_mode is not None:
            _fail("div with rounding_mode=%r" % rounding_mode)
        return self._b(DIV, o)

    def add(self, o, alpha=1):
        return self._b(ADD, o if alpha == 1 else o * alpha)

    def sub(self, o, alpha=1):
        return self._b(SUB, o if alpha == 1 else o * alpha)

    def mul(self, o):
        return self._b(MUL, o)

    def eq(self, o):
        return self._b(EQ, o)

    def ne(self, o):
        return self._b(NE, o)

    def lt(self, o):
        return self._b(LT, o)

    def le(self, o):
        return self._b(LE, o)

    def gt(self, o):
        return self._b(GT, o)

    def ge(self, o):
        return self._b(GE, o)

    def to(self, *args, **kwargs):
        dt = kwargs.get("dtype")
        for a in args:
            if self._rec.torch is not None and isinstance(a, self._rec.torch.dtype):
                dt = a
        return self._cast(dt)

    def _cast(self, dt):
        torch = self._rec.torch
        if dt is None:
            return self
        if dt.is_floating_point:
            return Sym(to_float(self._n), self._rec)
        if dt == torch.bool:
            n = self._n
            if n.type != "bool":
                n = binary(NE, n, const(0) if n.type == "int" else const(0.0))
            return Sym(n, self._rec)
        return Sym(to_int(self._n), self._rec)

    def float(self):
        return Sym(to_float(self._n), self._rec)

    def int(self):
        return Sym(to_int(self._n), self._rec)

    long = int

    def bool(self):
        return self._cast(self._rec.torch.bool)

    # Scalars made from a symbolic value (torch's noop_mask, and_masks, or_masks).
    def new_ones(self, size=(), dtype=None, **kw):
        return self._new_scalar(size, 1, dtype)

    def new_zeros(self, size=(), dtype=None, **kw):
        return self._new_scalar(size, 0, dtype)

    def new_full(self, size, fill_value, dtype=None, **kw):
        return self._new_scalar(size, fill_value, dtype)

    def _new_scalar(self, size, value, dtype):
        if tuple(size) != ():
            _fail("a new tensor of size %s from a symbolic value (only scalars, size ())"
                  % (tuple(size),))
        torch = self._rec.torch
        if dtype is None:
            dtype = self.dtype
        if dtype == torch.bool:
            return Sym(const(bool(value)), self._rec)
        if dtype.is_floating_point:
            return Sym(const(float(value)), self._rec)
        return Sym(const(int(value)), self._rec)

    @property
    def device(self):
        return None

    @property
    def dtype(self):
        torch = self._rec.torch
        return {"int": torch.int32, "float": torch.float32, "bool": torch.bool}[self._n.type]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = None
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, (Sym, _Partial)):
                rec = a._rec
                break
            if isinstance(a, (tuple, list)):
                for x in a:
                    if isinstance(x, (Sym, _Partial)):
                        rec = x._rec
        return rec.torch_function(func, args, kwargs)


class _Partial:
    """A captured tensor indexed with fewer indices than its rank (t[b] of a 2-D t)."""

    __slots__ = ("_t", "_idx", "_rec")
    __hash__ = None

    def __init__(self, t, idx, rec):
        self._t, self._idx, self._rec = t, tuple(idx), rec

    def __getitem__(self, idx):
        return self._rec.index(self._t, self._idx + _tuple(idx))

    def _incomplete(self):
        _fail("a captured tensor of rank %d indexed with %d indices" % (self._t.dim(),
                                                                       len(self._idx)))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self._incomplete()

    def __bool__(self):
        self._incomplete()

    def _any(self, *a, **k):
        self._incomplete()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _any
    __rtruediv__ = __floordiv__ = __mod__ = __eq__ = __ne__ = __lt__ = __le__ = _any
    __gt__ = __ge__ = __and__ = __rand__ = __or__ = __ror__ = __neg__ = __invert__ = _any

    __torch_function__ = Sym.__torch_function__


def _tuple(idx):
    return idx if isinstance(idx, tuple) else (idx,)


# ---------------------------------------------------------------------------
# A recording
# ---------------------------------------------------------------------------
_ELEM_OF = {"int": "int32", "float": "float32", "bool": "bool"}


class Recording:
    """One call of a mask_mod / score_mod on symbolic values.

    root: the result node; tensors: the captured tensors in order of first use (each a
    buffer source); reads keep (tensor slot, per-dimension repeat factors)."""

    def __init__(self, torch):
        self.torch = torch
        self.tensors = []  # captured tensors, in order of first use
        self._slot = {}  # id(tensor) -> slot
        self.root = None
        self.mask_pred = None  # score_mod only: where the score is not -inf

    # -- tensors ------------------------------------------------------------
    def slot(self, t):
        s = self._slot.get(id(t))
        if s is None:
            s = self._slot[id(t)] = len(self.tensors)
            self.tensors.append(t)
        return s

    def elem_type(self, t):
        torch = self.torch
        if t.dtype == torch.bool:
            return "bool"
        if t.dtype.is_floating_point:
            return "float"
        if t.dtype.is_complex:
            _fail("a captured complex tensor")
        return "int"

    def read(self, t, idx_nodes, source=None):
        src = source if source is not None else t
        s = self.slot(src)
        if t.dim() > 4:
            _fail("a captured tensor of rank %d (at most 4)" % t.dim())
        n = Node("read", self.elem_type(t), args=tuple(idx_nodes),
                 value=(("t", s, source is not None), t.dim()))
        return n

    def index(self, t, idx):
        if len(idx) > t.dim():
            _fail("a captured tensor of rank %d indexed with %d indices" % (t.dim(), len(idx)))
        nodes = []
        for i in idx:
            if isinstance(i, Sym):
                n = i._n
            elif isinstance(i, bool) or not isinstance(i, int):
                _fail("a captured tensor indexed with %s (only ints, b, h, q_idx, kv_idx and "
                      "expressions of them)" % type(i).__name__)
            else:
                n = const(i)
            if n.type == "bool":
                _fail("a captured tensor indexed with a bool (a mask index)")
            if n.type != "int":
                _fail("a captured tensor indexed with a float")
            nodes.append(n)
        if len(idx) < t.dim():
            return _Partial(t, idx, self)
        return Sym(self.read(t, nodes), self)

    # -- torch functions ----------------------------------------------------
    def torch_function(self, func, args, kwargs):
        torch = self.torch
        T = torch.Tensor
        name = getattr(func, "__name__", str(func))
        if func is T.__getitem__:
            t, idx = args
            if isinstance(t, _Partial):
                return t[idx]
            if isinstance(t, Sym):
                t[idx]
            return self.index(t, _tuple(idx))
        n = lambda x: _node(x, self)  # noqa: E731
        if func is torch.where:
            if len(args) + len(kwargs) != 3:
                _fail("torch.where with one argument (nonzero)")
            c, a, b = (list(args) + [kwargs.get("input"), kwargs.get("other")])[:3]
            return Sym(sel(n(c), n(a), n(b)), self)
        simple = {torch.minimum: MIN, torch.maximum: MAX, torch.min: MIN, torch.max: MAX,
                  torch.eq: EQ, torch.ne: NE, torch.lt: LT, torch.le: LE, torch.gt: GT,
                  torch.ge: GE, torch.logical_and: AND, torch.logical_or: OR,
                  torch.remainder: MOD, torch.add: ADD, torch.sub: SUB, torch.mul: MUL,
                  torch.true_divide: DIV}
        if func in simple and len(args) == 2 and not kwargs:
            return Sym(binary(simple[func], n(args[0]), n(args[1])), self)
        if func is torch.div and len(args) == 2:
            rm = kwargs.get("rounding_mode")
            if rm == "floor":
                return Sym(n(args[0]), self).__floordiv__(args[1])
            if rm is None:
                return Sym(binary(DIV, n(args[0]), n(args[1])), self)
        if func is torch.floor_divide and len(args) == 2:
            return Sym(n(args[0]), self).__floordiv__(args[1])
        un = {torch.abs: ABS, torch.neg: NEG, torch.exp: EXP, torch.tanh: TANH,
              torch.logical_not: NOT}
        if func in un and len(args) == 1 and not kwargs:
            return Sym(unary(un[func], n(args[0])), self)
        if func in (torch.clamp, torch.clip):
            return Sym(n(args[0]), self).clamp(*args[1:], **kwargs)
        if func is torch.sigmoid and len(args) == 1:
            return Sym(n(args[0]), self).sigmoid()
        # Tensor methods reached through torch's dispatch (t.__add__(sym) of a captured
        # scalar t, sym.clamp(...) and the like).
        first = args[0] if args else None
        if first is not None and not isinstance(first, Sym) and isinstance(first, T):
            first = Sym(n(first), self)
        if isinstance(first, Sym):
            meth = getattr(Sym, name, None)
            if meth is not None and callable(meth) and name not in ("__torch_function__",):
                return meth(first, *args[1:], **kwargs)
        _fail("%s" % _func_name(func))


def _func_name(func):
    mod = getattr(func, "__module__", None) or ""
    qn = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    if "TensorBase" in qn or qn.startswith("Tensor."):
        return "Tensor.%s" % qn.split(".")[-1]
    return "%s.%s" % ("torch" if mod.startswith("torch") or not mod else mod, qn)


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def _record(fn, args_nodes, rec, what):
    syms = [Sym(a, rec) for a in args_nodes]
    out = fn(*syms)
    if isinstance(out, _Partial):
        out._incomplete()
    if isinstance(out, Sym):
        return out._n
    c = const(out) if isinstance(out, (bool, int, float)) else None
    if c is not None:
        return c
    torch = rec.torch
    if torch is not None and isinstance(out, torch.Tensor) and out.dim() == 0:
        return const(out.item() if out.dtype != torch.bool else bool(out.item()))
    raise InvalidSpec("kcache: %s returned %s, not a symbolic value (at %s)"
                      % (what, type(out).__name__, _fn_site(fn)), field=what)


def _fn_site(fn):
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    return "%s:%d" % (code.co_filename, code.co_firstlineno)


def _index_vars():
    return [Node("var", "int", value=v) for v in (VAR_B, VAR_H, VAR_Q, VAR_KV)]


def record_mask(mask_mod):
    """Records mask_mod(b, h, q_idx, kv_idx) (-> bool). Returns a Recording."""
    rec = Recording(_torch())
    root = _record(mask_mod, _index_vars(), rec, "mask_mod")
    if root.type != "bool":
        if root.type == "int":
            root = binary(NE, root, const(0))
        else:
            raise InvalidSpec("kcache: mask_mod returned a float value, expected bool (%s)"
                              % _fn_site(mask_mod), field="mask_mod")
    rec.root = root
    return rec


def record_score(score_mod):
    """Records score_mod(score, b, h, q_idx, kv_idx) (-> float). Returns a Recording.

    kcache's expressions have no infinite constants, so flex's idiom of masking in the
    score_mod, torch.where(cond, score, -inf) at the top (nested too), is taken apart:
    rec.root is the score where visible and rec.mask_pred the condition (None when there
    is none); flex_attention ANDs it into the mask. Any other non-finite constant is an
    error."""
    rec = Recording(_torch())
    root = _record(score_mod, [Node("score", "float")] + _index_vars(), rec, "score_mod")
    if root.type == "bool":
        raise InvalidSpec("kcache: score_mod returned a bool value, expected float (%s)"
                          % _fn_site(score_mod), field="score_mod")
    root = to_float(root)
    pred = None
    while root.kind == "sel":
        c, t, f = root.args
        if _is_neg_inf(f):
            cond, root = c, t
        elif _is_neg_inf(t):
            cond, root = unary(NOT, c), f
        else:
            break
        pred = cond if pred is None else binary(AND, pred, cond)
    bad = _non_finite(root) or (_non_finite(pred) if pred is not None else None)
    if bad is not None:
        raise InvalidSpec("kcache: cannot record the non-finite constant %r (at %s): kcache's "
                          "expressions hold finite numbers; a score_mod may use -inf only as "
                          "torch.where(cond, score, -inf) around its result"
                          % (bad.value, bad.site), field="score_mod")
    rec.root, rec.mask_pred = root, pred
    return rec


def _is_neg_inf(n):
    return n.kind == "const" and n.type == "float" and n.value == -math.inf


def _non_finite(n):
    if n.kind == "const" and n.type == "float" and not math.isfinite(n.value):
        return n
    for a in n.args:
        r = _non_finite(a)
        if r is not None:
            return r
    return None


def reslot(n, offset):
    """n with every captured-tensor slot moved by `offset` (to join two recordings)."""
    if offset == 0:
        return n
    args = tuple(reslot(a, offset) for a in n.args)
    if n.kind == "read":
        (tag, slot, scalar), rank = n.value
        return Node("read", n.type, args=args, value=((tag, slot + offset, scalar), rank))
    if not args:
        return n
    return Node(n.kind, n.type, n.op, args, n.value, n.site)


def join_masks(mask_rec, score_rec):
    """A Recording of mask_rec's mask AND score_rec's mask_pred (mask_rec may be None), with
    the captured tensors of both (the mask's first)."""
    rec = Recording(score_rec.torch)
    mt = list(mask_rec.tensors) if mask_rec is not None else []
    rec.tensors = mt + list(score_rec.tensors)
    pred = reslot(score_rec.mask_pred, len(mt))
    rec.root = pred if mask_rec is None else binary(AND, mask_rec.root, pred)
    return rec


# ---------------------------------------------------------------------------
# Lowering to kcache.v1.Expr
# ---------------------------------------------------------------------------
class BufferUse:
    """A launch buffer: a captured tensor (slot), repeated `factors[d]` times along each
    dimension d, as elem type `elem`. name is the spec's buffer name."""

    __slots__ = ("name", "slot", "factors", "elem", "rank")

    def __init__(self, name, slot, factors, elem, rank):
        self.name, self.slot, self.factors, self.elem, self.rank = name, slot, factors, elem, rank

    def key(self):
        return (self.slot, self.factors, self.elem)

    def make(self, tensors, torch):
        """The launch tensor from the captured tensors' current values."""
        t = tensors[self.slot]
        if t.dim() == 0:
            t = t.reshape(1)
        want = {"int": torch.int32, "float": torch.float32, "bool": torch.bool}[self.elem]
        if t.dtype != want:
            t = t.to(want)
        for d, f in enumerate(self.factors):
            if f > 1:  # t'[.., i, ..] = t[.., i // f, ..]: a copy with no host sync
                shp = list(t.shape)
                t = t.unsqueeze(d + 1).expand(*shp[:d + 1], f, *shp[d + 1:]).reshape(
                    *shp[:d], shp[d] * f, *shp[d + 1:])
        return t

    def __repr__(self):
        return "BufferUse(%s: slot %d x %s %s)" % (self.name, self.slot, self.factors, self.elem)


class Lowering:
    """Lowers nodes of one or more recordings to kcache.v1.Expr with shared buffer names
    (prefix + number, in order of first use)."""

    def __init__(self, prefix):
        from kcache import _protos
        self.pb = _protos.modules()[0]
        self.prefix = prefix
        self.uses = []
        self._by_key = {}

    def buffer(self, slot, factors, elem, rank):
        k = (slot, factors, elem)
        u = self._by_key.get(k)
        if u is None:
            u = BufferUse("%s%d" % (self.prefix, len(self.uses)), slot, factors, elem, rank)
            self._by_key[k] = u
            self.uses.append(u)
        return u

    def lower(self, n):
        e = self.pb.Expr()
        self._into(n, e)
        return e

    def _into(self, n, e):
        k = n.kind
        if n.has_div():
            if n.type == "bool":
                if k == "bin" and n.op in _CMP:
                    a, b = n.args
                    c = _lcm(a.divisors(b.divisors(set())))
                    e.binary.op = n.op
                    self._into(scale(a, c), e.binary.lhs)
                    self._into(scale(b, c), e.binary.rhs)
                    return
            elif n.type == "float":
                if k == "un" and n.op == TO_FLOAT:  # float(E) == float(c*E) / c
                    c = _lcm(n.divisors(set()))
                    e.binary.op = DIV
                    self._into(to_float(scale(n.args[0], c)), e.binary.lhs)
                    e.binary.rhs.float_const = float(c)
                    return
            elif k == "fdiv":
                raise InvalidSpec("kcache: cannot record the integer division at %s here: "
                                  "kcache's expressions have no integer division; it is "
                                  "supported in comparisons, float() and as a whole index of "
                                  "a captured tensor" % n.site, field="mask_mod")
        if k == "var":
            e.index = n.value
        elif k == "score":
            e.score = True
        elif k == "const":
            if n.type == "bool":
                e.bool_const = n.value
            elif n.type == "int":
                e.int_const = n.value
            else:
                e.float_const = n.value
        elif k == "un":
            e.unary.op = n.op
            self._into(n.args[0], e.unary.arg)
        elif k == "bin":
            e.binary.op = n.op
            self._into(n.args[0], e.binary.lhs)
            self._into(n.args[1], e.binary.rhs)
        elif k == "sel":
            self._into(n.args[0], e.select.cond)
            self._into(n.args[1], e.select.if_true)
            self._into(n.args[2], e.select.if_false)
        elif k == "read":
            (_, slot, _scalar), rank = n.value
            factors, idx = [], []
            for i in n.args:
                if i.kind == "fdiv":
                    factors.append(i.value)
                    idx.append(i.args[0])
                elif i.has_div():
                    raise InvalidSpec(
                        "kcache: cannot record the integer division at %s: a captured tensor "
                        "index may be `expr // constant` as a whole (or with + - min max of "
                        "constants), not a division inside a larger index" % _first_site(i),
                        field="mask_mod")
                else:
                    factors.append(1)
                    idx.append(i)
            u = self.buffer(slot, tuple(factors), n.type, rank)
            e.read.buffer = u.name
            for i in idx:
                self._into(i, e.read.index.add())
        else:  # fdiv without division left is impossible
            raise AssertionError(k)
