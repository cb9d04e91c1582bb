"""Recognizing recorded masks that equal one of kcache's built-in masks.

recognize(recording, q_len, kv_len) returns a Builtin (the MaskSpec and which captured
tensors feed its launch inputs) or None. The match is syntactic over a normal form
(conjunctions of comparisons of linear forms), so it is exact: a mask is lowered to a
built-in only when it is the built-in on every (b, h, q_idx < q_len, kv_idx < kv_len).
"""

from kcache import _record as R


class Builtin:
    """kind: causal | sliding_window | document | drafter | none; args: the kcache.specs
    helper's arguments; inputs: {launch input name: (tensor slot, elem, rank)}."""

    def __init__(self, kind, args=None, inputs=None):
        self.kind, self.args, self.inputs = kind, dict(args or {}), dict(inputs or {})

    def mask_spec(self):
        from kcache import specs
        if self.kind == "none":
            return specs.no_mask()
        return getattr(specs, self.kind)(**self.args)

    def __repr__(self):
        return "Builtin(%s, %r, %r)" % (self.kind, self.args, self.inputs)


Q, KV, B, H = ("var", 0, R.VAR_Q, ()), ("var", 0, R.VAR_KV, ()), ("var", 0, R.VAR_B, ()), \
    ("var", 0, R.VAR_H, ())


def lin(n):
    """(coefficients {term key: int}, constant) of an int node; non-linear parts are terms."""
    if n.kind == "const" and n.type == "int":
        return {}, n.value
    if n.kind == "bin" and n.op in (R.ADD, R.SUB):
        a, ca = lin(n.args[0])
        b, cb = lin(n.args[1])
        s = 1 if n.op == R.ADD else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + s * v
        return {k: v for k, v in out.items() if v}, ca + s * cb
    if n.kind == "un" and n.op == R.NEG:
        a, c = lin(n.args[0])
        return {k: -v for k, v in a.items()}, -c
    if n.kind == "bin" and n.op == R.MUL:
        for x, y in (n.args, n.args[::-1]):
            if x.kind == "const" and x.type == "int":
                a, c = lin(y)
                return {k: v * x.value for k, v in a.items() if v * x.value}, c * x.value
    return {n.key: 1}, 0


_NEG_OP = {R.LT: R.GE, R.LE: R.GT, R.GT: R.LE, R.GE: R.LT, R.EQ: R.NE, R.NE: R.EQ}


class Atom:
    """sum(coef * term) + const  op  0, over int terms; nodes: term key -> node."""

    def __init__(self, coefs, c, op, nodes):
        self.coefs, self.c, self.op, self.nodes = coefs, c, op, nodes

    def neg(self):
        return Atom(self.coefs, self.c, _NEG_OP[self.op], self.nodes)

    def flip(self):  # multiply by -1
        return Atom({k: -v for k, v in self.coefs.items()}, -self.c, R._SWAP_CMP[self.op],
                    self.nodes)

    def bounds(self):
        """(lo, hi) integer bounds on the single-term sum (coef +1), or None."""
        c, op = self.c, self.op
        return {R.LT: (None, -c - 1), R.LE: (None, -c), R.GT: (-c + 1, None),
                R.GE: (-c, None), R.EQ: (-c, -c)}.get(op)


def _terms(n, out):
    out[n.key] = n
    for a in n.args:
        _terms(a, out)
    return out


def atom(n):
    """An Atom of a bool node (a comparison of ints, or ~ of one), or None."""
    if n.kind == "un" and n.op == R.NOT:
        a = atom(n.args[0])
        return a.neg() if a is not None else None
    if n.kind != "bin" or n.op not in R._CMP or n.args[0].type != "int":
        return None
    a, ca = lin(n.args[0])
    b, cb = lin(n.args[1])
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) - v
    out = {k: v for k, v in out.items() if v}
    return Atom(out, ca - cb, n.op, _terms(n, {}))


def flat(n, op):
    if n.kind == "bin" and n.op == op:
        return flat(n.args[0], op) + flat(n.args[1], op)
    return [n]


def recognize(rec, q_len, kv_len):
    root = rec.root
    if root.kind == "const":
        return Builtin("none") if root.value else None
    for f in (_window, _document, _drafter):
        b = f(rec, root, q_len, kv_len)
        if b is not None:
            return b
    return None


def _diff_bounds(atoms):
    """Bounds (lo, hi) on kv_idx - q_idx from atoms over (kv - q) only, or None."""
    lo = hi = None
    for a in atoms:
        if set(a.coefs) != {Q, KV} or a.coefs[Q] != -a.coefs[KV] or abs(a.coefs[Q]) != 1:
            return None
        if a.coefs[KV] == -1:
            a = a.flip()
        bd = a.bounds()
        if bd is None:
            return None
        if bd[0] is not None:
            lo = bd[0] if lo is None else max(lo, bd[0])
        if bd[1] is not None:
            hi = bd[1] if hi is None else min(hi, bd[1])
    return lo, hi


def _split_abs(a):
    """|kv - q| + c <= 0 (or <) as the two atoms on kv - q; other atoms as they are."""
    if len(a.coefs) != 1 or a.op not in (R.LE, R.LT):
        return [a]
    (k, co), = a.coefs.items()
    n = a.nodes.get(k)
    if co != 1 or n is None or n.kind != "un" or n.op != R.ABS:
        return [a]
    inner, c0 = lin(n.args[0])
    if c0 != 0 or set(inner) != {Q, KV} or inner[Q] != -inner[KV] or abs(inner[Q]) != 1:
        return [a]
    nodes = dict(a.nodes)
    up = Atom({KV: 1, Q: -1}, a.c, a.op, nodes)
    return [up, Atom({KV: -1, Q: 1}, a.c, a.op, nodes)]


def _window(rec, root, q_len, kv_len):
    atoms = [atom(c) for c in flat(root, R.AND)]
    if any(a is None for a in atoms):
        return None
    atoms = [x for a in atoms for x in _split_abs(a)]
    bd = _diff_bounds(atoms)
    if bd is None:
        return None
    lo, hi = bd
    if lo is None and hi == 0:
        return Builtin("causal")
    if (lo is None or lo <= 0) and (hi is None or hi >= 0) and (lo, hi) != (None, None):
        return Builtin("sliding_window", dict(left=-1 if lo is None else -lo,
                                              right=-1 if hi is None else hi))
    return None


def _read_at(node, want_idx):
    """(slot, rank) when node reads a captured tensor (no repeat) at indices matching
    want_idx: a list of accepted index-key lists."""
    if node.kind != "read":
        return None
    (_, slot, scalar), rank = node.value
    if scalar or any(i.has_div() for i in node.args):
        return None
    keys = [i.key for i in node.args]
    return (slot, rank) if keys in want_idx else None


def _document(rec, root, q_len, kv_len):
    conj = flat(root, R.AND)
    eq, rest = None, []
    for c in conj:
        a = atom(c)
        if a is None:
            return None
        if a.op == R.EQ and len(a.coefs) == 2 and a.c == 0 and Q not in a.coefs:
            if eq is not None:
                return None
            eq = a
        else:
            rest.append(a)
    if eq is None:
        return None
    (k1, v1), (k2, v2) = sorted(eq.coefs.items(), key=lambda kv: -kv[1])
    if (v1, v2) != (1, -1):
        return None
    n1, n2 = eq.nodes[k1], eq.nodes[k2]
    if n1.type != "int" or n2.type != "int":
        return None
    out = None
    for qa, ka in ((n1, n2), (n2, n1)):
        rq = _read_at(qa, [[Q], [B, Q]])
        rk = _read_at(ka, [[KV], [B, KV]])
        if rq is not None and rk is not None and rq[1] == rk[1]:
            out = rq, rk
    if out is None:
        return None
    causal = False
    if rest:
        bd = _diff_bounds(rest)
        if bd != (None, 0):
            return None
        causal = True
    for (slot, rank), n in zip(out, (q_len, kv_len)):
        t = rec.tensors[slot]
        if t.shape[-1] < n:  # reads past the end are 0 for kcache, an error for flex
            return None
    return Builtin("document", dict(causal=causal),
                   dict(q_seq_id=(out[0][0], "int", out[0][1]),
                        kv_seq_id=(out[1][0], "int", out[1][1])))


def _is_block_of_q(n, bs, q_len):
    """n == q_idx // bs on q_idx < q_len (a clamp to the last block allowed)."""
    if n.kind != "fdiv" or n.value != bs:
        return False
    a = n.args[0]
    if a.key == Q:
        return True
    if a.kind == "bin" and a.op == R.MIN:
        for x, y in (a.args, a.args[::-1]):
            if x.key == Q and y.kind == "const" and y.value >= q_len - 1:
                return True
    return False


def _drafter(rec, root, q_len, kv_len):
    conj = flat(root, R.AND)
    ors = [c for c in conj if c.kind == "bin" and c.op == R.OR]
    if len(ors) != 1:
        return None
    # the block size: the divisor of q_idx // bs somewhere in the mask
    divs = root.divisors(set()) | {i.value for i in _all(root) if i.kind == "read"
                                   for i in i.args if i.kind == "fdiv"}
    for bs in sorted(divs):
        b = _drafter_bs(rec, conj, ors[0], bs, q_len, kv_len)
        if b is not None:
            return b
    return None


def _all(n):
    yield n
    for a in n.args:
        yield from _all(a)


def _drafter_bs(rec, conj, or_node, bs, q_len, kv_len):
    S = kv_len - q_len
    if bs <= 0 or q_len % bs or S < 0:
        return None
    nblocks = q_len // bs

    def per_block_read(n, elem):
        # captured [B, N] (or [N]) tensor read at [b, q_idx // bs] (or [q_idx // bs])
        if n.kind != "read" or n.type != elem:
            return None
        (_, slot, scalar), rank = n.value
        if scalar:
            return None
        idx = n.args
        if rank == 2 and idx[0].key == B and _is_block_of_q(idx[1], bs, q_len):
            pass
        elif rank == 1 and _is_block_of_q(idx[0], bs, q_len):
            pass
        else:
            return None
        if rec.tensors[slot].shape[-1] < nblocks:
            return None
        return slot, rank

    keep = None
    for c in conj:
        if c is or_node:
            continue
        k = per_block_read(c, "bool")
        if k is None and c.kind == "bin" and c.op == R.NE and c.args[1].key == ("const", 0, 0, ()):
            k = per_block_read(c.args[0], "int")  # keep[b, j] != 0
        if k is not None and keep is None:
            keep = k
            continue
        a = atom(c)  # q_idx // bs < N: always true here
        if (a is not None and len(a.coefs) == 1 and a.coefs.get(next(iter(a.coefs))) == 1
                and _is_block_of_q(a.nodes[next(iter(a.coefs))], bs, q_len)
                and a.bounds() is not None and a.bounds()[0] is None
                and a.bounds()[1] >= nblocks - 1):
            continue
        return None
    parts = flat(or_node, R.OR)
    if len(parts) != 2:
        return None
    for ctx, draft in (parts, parts[::-1]):
        got = _drafter_ctx(rec, ctx, S, per_block_read)
        if got is None:
            continue
        causal = _drafter_draft(draft, S, bs, q_len)
        if causal is None:
            continue
        anchors, window = got
        inputs = dict(anchors=(anchors[0], "int", anchors[1]))
        if keep is not None:
            inputs["keep"] = (keep[0], "bool", keep[1])
        return Builtin("drafter", dict(block_size=bs, causal_within_block=causal,
                                       context_window=window), inputs)
    return None


def _norm_kv(a):
    """The atom with kv_idx's coefficient +1, or None when kv_idx is absent."""
    if a is None or a.coefs.get(KV) not in (1, -1):
        return None
    return a if a.coefs[KV] == 1 else a.flip()


def _drafter_ctx(rec, node, S, per_block_read):
    """context part: kv < S & kv < A[b, j] (& kv >= A[b, j] - W). Returns ((slot, rank), W)."""
    below_s = False
    anchor = None
    window = 0
    pending = []
    for c in flat(node, R.AND):
        a = _norm_kv(atom(c))
        if a is None:
            return None
        others = {k: v for k, v in a.coefs.items() if k != KV}
        if not others:
            bd = a.bounds()
            if bd is None or bd[0] is not None or bd[1] != S - 1:
                return None
            below_s = True
        elif len(others) == 1 and list(others.values())[0] == -1:
            k = list(others)[0]
            pending.append((a, k))
        else:
            return None
    for a, k in pending:
        r = per_block_read(a.nodes[k], "int")
        if r is None or (anchor is not None and anchor != r):
            return None
        anchor = r
        bd = a.bounds()  # on kv - A
        if bd == (None, -1):
            continue
        if bd is not None and bd[1] is None and bd[0] < 0 and not window:
            window = -bd[0]
            continue
        return None
    if not below_s or anchor is None:
        return None
    return anchor, window


def _drafter_draft(node, S, bs, q_len):
    """draft part: kv >= S & q // bs == (kv - S) // bs (& kv - S <= q). Returns causal or
    None."""
    from_s = same_block = causal = False
    for c in flat(node, R.AND):
        a = atom(c)
        if a is None:
            return None
        ak = _norm_kv(a)
        if ak is not None and set(ak.coefs) == {KV} and ak.bounds() == (S, None):
            from_s = True
            continue
        if ak is not None and set(ak.coefs) == {KV, Q} and ak.coefs[Q] == -1 \
                and ak.bounds() == (None, S):
            causal = True
            continue
        if a.op == R.EQ and a.c == 0 and len(a.coefs) == 2 and sorted(a.coefs.values()) == [-1, 1]:
            n1, n2 = (a.nodes[k] for k in a.coefs)
            for x, y in ((n1, n2), (n2, n1)):
                if _is_block_of_q(x, bs, q_len) and y.kind == "fdiv" and y.value == bs:
                    co, cc = lin(y.args[0])
                    if co == {KV: 1} and cc == -S:
                        same_block = True
            if same_block:
                continue
        return None
    return causal if from_s and same_block else None
