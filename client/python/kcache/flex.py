"""kcache.flex_attention and kcache.create_block_mask: torch.nn.attention.flex_attention's
API over kcache's kernels.

    from kcache import flex_attention, create_block_mask   # instead of torch's
    bm = create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda")
    out = flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)

mask_mod and score_mod are recorded once on symbolic values (kcache._record) into the
spec's expression tree; a mask equal to a built-in (causal, sliding window, document,
drafter) becomes that built-in (kcache._recognize). Captured tensors are launch buffers:
their current values are read at every call, so new values reuse the kernel.
create_block_mask does no work proportional to Q_LEN x KV_LEN: the kernel classifies
tiles itself. The attention runs through the torch.library custom operators
kcache::flex_fwd / kcache::flex_bwd (kcache.ops), so torch.compile keeps it in the graph.
"""

import base64

from kcache import _record, _recognize
from kcache.errors import InvalidArgument, InvalidSpec

_HEAD_DIMS = (64, 128, 256)
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16"}


class _Part:
    """A recorded mask or score modification, lowered: `text` (its MaskSpec / ScoreMod
    message, serialized, for the spec), `uses` (BufferUse: launch buffers from the captured
    tensors) and `inputs` (built-in masks' launch inputs: name -> (slot, elem, rank))."""

    __slots__ = ("text", "uses", "inputs", "decls", "builtin", "tensors", "rec")

    def __init__(self, text, uses, inputs, decls, builtin, tensors, rec=None):
        self.text, self.uses, self.inputs, self.decls = text, uses, inputs, decls
        self.builtin, self.tensors, self.rec = builtin, tensors, rec


def _lower_mask(rec, q_len, kv_len):
    b = _recognize.recognize(rec, q_len, kv_len)
    if b is not None:
        m = b.mask_spec()
        return _Part(_b64(m), (), b.inputs, (), b, list(rec.tensors), rec)
    low = _record.Lowering("mask")
    e = low.lower(rec.root)
    from kcache import _protos
    pb = _protos.modules()[0]
    m = pb.MaskSpec()
    m.expr.predicate.CopyFrom(e)
    return _Part(_b64(m), tuple(low.uses), {}, _decls(low.uses), None, list(rec.tensors), rec)


def _lower_score(rec):
    low = _record.Lowering("score")
    e = low.lower(rec.root)
    from kcache import _protos
    pb = _protos.modules()[0]
    s = pb.ScoreMod()
    s.expr.value.CopyFrom(e)
    return _Part(_b64(s), tuple(low.uses), {}, _decls(low.uses), None, list(rec.tensors), rec)


def _b64(msg):
    # messages travel as text: custom operators take str, not bytes
    return base64.b64encode(msg.SerializeToString()).decode("ascii")


def parse(cls, text):
    m = cls()
    m.ParseFromString(base64.b64decode(text))
    return m


def _decls(uses):
    return tuple((u.name, {"int": "int32", "float": "float32", "bool": "bool"}[u.elem], u.rank)
                 for u in uses)


class RecordedScoreMod:
    """A score_mod recorded once (kcache.record_score_mod), to pass as flex_attention's
    score_mod. Needed under torch.compile when the score_mod captures tensors (the compiled
    graph reads them from this object); a plain function is recorded per call otherwise."""

    def __init__(self, score_mod):
        self.score_mod = score_mod
        self._part = _lower_score(_record.record_score(score_mod))
        self.tensors = self._part.tensors

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.score_mod(score, b, h, q_idx, kv_idx)

    def __repr__(self):
        return "RecordedScoreMod(%s, %d captured tensors)" % (
            getattr(self.score_mod, "__name__", repr(self.score_mod)), len(self.tensors))


def record_score_mod(score_mod):
    """score_mod recorded now: a RecordedScoreMod for flex_attention(score_mod=...)."""
    return RecordedScoreMod(score_mod)


class BlockMask:
    """What kcache.create_block_mask returns: the mask_mod, the shape it was made for and its
    recording. flex-compatible surface: shape, seq_lengths, BLOCK_SIZE, mask_mod, to(),
    __repr__. Holds no per-block data: kcache's kernels classify tiles themselves.

    Immutable after construction; share it between threads freely."""

    def __init__(self, mask_mod, B, H, Q_LEN, KV_LEN, device, BLOCK_SIZE, part):
        self.mask_mod = mask_mod
        self.shape = (B, H, Q_LEN, KV_LEN)
        self.seq_lengths = (Q_LEN, KV_LEN)
        self.BLOCK_SIZE = BLOCK_SIZE
        self.device = device
        self._part = part
        self.tensors = part.tensors  # the captured tensors, read at every launch

    @property
    def builtin(self):
        """The built-in mask it was lowered to ("causal", "drafter", ...) or None (an
        expression mask)."""
        return self._part.builtin.kind if self._part.builtin is not None else None

    def spec_mask(self):
        """The kcache.v1.MaskSpec it lowers to."""
        from kcache import _protos
        return parse(_protos.modules()[0].MaskSpec, self._part.text)

    def to(self, device):
        """The same mask for `device` (captured tensors moved there)."""
        import torch
        dev = torch.device(device)
        moved = [t.to(dev) if isinstance(t, torch.Tensor) else t for t in self.tensors]
        p = self._part
        part = _Part(p.text, p.uses, p.inputs, p.decls, p.builtin, moved, p.rec)
        return BlockMask(self.mask_mod, *self.shape, device=dev, BLOCK_SIZE=self.BLOCK_SIZE,
                         part=part)

    def numel(self):
        B, H, Q, KV = self.shape
        return (B or 1) * (H or 1) * Q * KV

    def __repr__(self):
        return "kcache.BlockMask(shape=%s, mask=%s, captured=%d)" % (
            self.shape, self.builtin or "expr", len(self.tensors))


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda", BLOCK_SIZE=128,
                      _compile=False):
    """flex's create_block_mask: records mask_mod (no GPU work, no dense mask) for
    queries of length Q_LEN and keys of length KV_LEN. B and H may be None (broadcast).
    Raises kcache.InvalidSpec when mask_mod cannot be recorded."""
    del _compile  # recording costs microseconds; nothing to compile
    if not callable(mask_mod):
        raise InvalidSpec("kcache.create_block_mask: mask_mod is not callable", field="mask_mod")
    Q_LEN, KV_LEN = int(Q_LEN), int(KV_LEN)
    if isinstance(BLOCK_SIZE, int):
        BLOCK_SIZE = (BLOCK_SIZE, BLOCK_SIZE)
    rec = _record.record_mask(mask_mod)
    return BlockMask(mask_mod, B, H, Q_LEN, KV_LEN, device, tuple(BLOCK_SIZE),
                     _lower_mask(rec, Q_LEN, KV_LEN))


def _torch_block_mask(bm):
    """A kcache BlockMask from torch's BlockMask (its mask_mod and lengths)."""
    mm = getattr(bm, "mask_mod", None)
    if mm is None:
        raise InvalidSpec("kcache.flex_attention: block_mask has no mask_mod", field="block_mask")
    if getattr(mm, "__name__", "") == "noop_mask" and getattr(bm, "full_kv_num_blocks",
                                                               0) is None:
        # BlockMask.from_kv_blocks without a mask_mod: the sparsity is in block tables,
        # which kcache does not read (it would attend everywhere)
        raise InvalidSpec("kcache.flex_attention: this torch BlockMask was made from block "
                          "tables without a mask_mod; kcache needs the mask_mod (use "
                          "kcache.create_block_mask(mask_mod, ...))", field="block_mask")
    q_len, kv_len = bm.seq_lengths
    return create_block_mask(mm, None, None, q_len, kv_len, device=None)


def _check(q, k, v, enable_gqa):
    import torch
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _raise_invalid("kcache.flex_attention: %s must be a 4-D [B, H, L, D] tensor"
                           % name, name)
    if q.dtype not in (torch.bfloat16, torch.float16):
        _raise_invalid("kcache.flex_attention: dtype %s is not supported (bfloat16 or "
                       "float16); flex's float32 has no kcache kernel" % q.dtype, "spec.dtype")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        _raise_invalid("kcache.flex_attention: query, key and value dtypes differ (%s, %s, "
                       "%s)" % (q.dtype, k.dtype, v.dtype), "key")
    for name, d in (("query/key", q.shape[3]), ("value", v.shape[3])):
        if d not in _HEAD_DIMS:
            _raise_invalid("kcache.flex_attention: %s head dim %d is not supported (%s)"
                           % (name, d, ", ".join(map(str, _HEAD_DIMS))), "spec.head_dim_qk")
    if k.shape[3] != q.shape[3]:
        _raise_invalid("kcache.flex_attention: key head dim %d != query head dim %d"
                       % (k.shape[3], q.shape[3]), "key")
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        if not enable_gqa:
            _raise_invalid("kcache.flex_attention: query has %d heads and key %d: pass "
                           "enable_gqa=True for grouped-query attention" % (hq, hkv), "key")
        if hq % hkv:
            _raise_invalid("kcache.flex_attention: %d query heads are not a multiple of %d "
                           "key heads" % (hq, hkv), "key")


def spec_text(mask_text, score_text, decls, trainable, dtype, dqk, dv, hq, hkv, scale):
    """The serialized AttentionSpec (backward on) for flex_attention's parts."""
    from kcache import _protos, specs
    pb = _protos.modules()[0]
    mask = score = None
    if mask_text is not None:
        mask = parse(pb.MaskSpec, mask_text)
    if score_text is not None:
        score = parse(pb.ScoreMod, score_text)
    s = specs.spec(dtype=dtype, head_dim=dqk, q_heads=hq, kv_heads=hkv,
                   head_dim_v=dv if dv != dqk else None, mask=mask, score_mod=score,
                   softmax_scale=scale, buffers={n: (t, r) for n, t, r in decls},
                   return_lse=True, backward=True)
    for d in s.buffers:
        if d.name in trainable:
            d.trainable = True
    return _b64(s)


def _record_score_text(score_mod):
    """The serialized ScoreMod of a score_mod that captures no tensor (under
    torch.compile, where the recording is a constant of the trace)."""
    part = _lower_score(_record.record_score(score_mod))
    if part.tensors:
        raise InvalidSpec(
            "kcache.flex_attention: under torch.compile, a score_mod that captures tensors "
            "(%d here) must be recorded outside the compiled region: pass "
            "kcache.record_score_mod(score_mod)" % len(part.tensors), field="score_mod")
    if part.rec.mask_pred is not None:
        raise InvalidSpec(_NO_INF_UNDER_COMPILE, field="score_mod")
    return part.text


_NO_INF_UNDER_COMPILE = (
    "kcache.flex_attention: under torch.compile, a score_mod cannot mask with "
    "torch.where(cond, score, -inf): put cond in the mask_mod (kcache.create_block_mask)")


def _raise_invalid(message, field):
    """InvalidSpec for what the spec cannot express (fields named spec.* / mask_mod /
    score_mod / block_mask), InvalidArgument for the inputs. Marked constant below: under
    torch.compile it raises while tracing, as itself (dynamo cannot build our exceptions)."""
    if field.startswith("spec.") or field in ("mask_mod", "score_mod", "block_mask"):
        raise InvalidSpec(message, field=field)
    raise InvalidArgument(message, field)


# Under torch.compile these run at trace time and their results are constants of the graph
# (torch.compiler.assume_constant_result only sets this attribute; it is set here so that
# kcache imports without torch). Dynamo guards on their arguments, so a new mask or
# score_mod retraces.
spec_text._dynamo_marked_constant = True
_raise_invalid._dynamo_marked_constant = True
_record_score_text._dynamo_marked_constant = True


def mask_launch(part, captured, B, lq, lkv):
    """(names, tensors) a recorded mask gives a launch from the captured tensors' current
    values: expression buffers by spec name, built-in inputs as "@q_seq_id" etc."""
    import torch
    names, tensors = [], []
    for u in part.uses:
        names.append(u.name)
        tensors.append(u.make(captured, torch))
    for name, (slot, elem, rank) in sorted(part.inputs.items()):
        t = captured[slot]
        want = torch.int32 if elem == "int" else torch.bool
        if t.dtype != want:
            t = t.to(want)
        if rank == 1:
            t = t.unsqueeze(0).expand(B, t.shape[0])
        elif t.shape[0] == 1 and B != 1:
            t = t.expand(B, t.shape[1])
        if name == "q_seq_id":
            t = t[:, :lq]
        elif name == "kv_seq_id":
            t = t[:, :lkv]
        names.append("@" + name)
        tensors.append(t)
    return names, tensors


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None):
    """torch.nn.attention.flex_attention with kcache's kernels: [B, H, L, D] bf16/fp16
    tensors (head dims 64, 128, 256), differentiable in query, key, value and in float
    tensors captured by score_mod with requires_grad. Returns out, or (out, lse) with
    return_lse (float32 [B, Hq, Lq], natural log, as flex; no gradient flows through lse).
    block_mask: kcache's or torch's BlockMask (its mask_mod is recorded; one made from
    block tables alone has no mask_mod to record). A score_mod's torch.where(cond, score,
    -inf) joins the mask. kernel_options is accepted and ignored.

    The kernel is always fetched with its backward entry points (one kernel for both
    directions). CUDA tensors run kcache's kernels; CPU tensors a dense reference
    (kcache._reference), for tests. A plain score_mod is recorded at every call (~0.1 ms);
    kcache.record_score_mod records it once."""
    from kcache import ops
    del kernel_options
    spec, names, tensors = launch_args(query, key, value, score_mod, block_mask, scale,
                                       enable_gqa)
    out, lse = ops.flex(query, key, value, spec, ",".join(names), tensors)
    return (out, lse) if return_lse else out


def launch_args(query, key, value, score_mod=None, block_mask=None, scale=None,
                enable_gqa=False):
    """(spec, names, tensors) flex_attention passes to kcache::flex_fwd: the serialized
    AttentionSpec (backward on) and the launch buffers / built-in mask inputs by name."""
    import torch
    _check(query, key, value, enable_gqa)
    B, hq, lq, dqk = query.shape
    hkv, lkv, dv = key.shape[1], key.shape[2], value.shape[3]
    compiling = torch.compiler.is_compiling()

    # the mask
    mask_part = None
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            if compiling:
                _raise_invalid("kcache.flex_attention: under torch.compile, pass a "
                               "kcache.create_block_mask mask (made outside the compiled "
                               "region), not torch's BlockMask", "block_mask")
            block_mask = _torch_block_mask(block_mask)
        if tuple(block_mask.seq_lengths) != (lq, lkv):
            _raise_invalid("kcache.flex_attention: block_mask is for lengths %s, the inputs "
                           "have Q_LEN %d and KV_LEN %d" % (block_mask.seq_lengths, lq, lkv),
                           "block_mask")
        mask_part = block_mask._part

    # the score modification
    score_part = score_text = None
    if score_mod is not None:
        if isinstance(score_mod, RecordedScoreMod):
            score_part = score_mod._part
            score_tensors = score_mod.tensors
        elif compiling:
            score_text = _record_score_text(score_mod)
        else:
            score_part = _lower_score(_record.record_score(score_mod))
            score_tensors = score_part.tensors
        if score_part is not None:
            score_text = score_part.text

    mask_tensors = block_mask.tensors if block_mask is not None else []
    if score_part is not None and score_part.rec.mask_pred is not None:
        # torch.where(cond, score, -inf) in the score_mod: cond joins the mask
        if compiling:
            _raise_invalid(_NO_INF_UNDER_COMPILE, "score_mod")
        joined = _record.join_masks(mask_part.rec if mask_part is not None else None,
                                    score_part.rec)
        mask_tensors = list(mask_tensors) + list(score_tensors)
        joined.tensors = mask_tensors
        mask_part = _lower_mask(joined, lq, lkv)

    names, tensors, decls, trainable = [], [], [], []
    if mask_part is not None:
        decls.extend(mask_part.decls)
        names, tensors = mask_launch(mask_part, mask_tensors, B, lq, lkv)
    if score_part is not None:
        decls.extend(score_part.decls)
        for u in score_part.uses:
            t = u.make(score_tensors, torch)
            if t.requires_grad:
                if u.elem != "float":
                    _raise_invalid("kcache.flex_attention: a captured %s tensor requires "
                                   "grad; only float tensors are trainable" % u.elem,
                                   "score_mod")
                trainable.append(u.name)
                t = t.contiguous()  # its gradient is written with the buffer's strides
            names.append(u.name)
            tensors.append(t)

    dtype = _DTYPE_NAMES[str(query.dtype).replace("torch.", "")]
    args = (mask_part.text if mask_part is not None else None, score_text, tuple(decls),
            tuple(trainable), dtype, int(dqk), int(dv), int(hq), int(hkv),
            float(scale) if scale else None)
    return spec_text(*args), names, tensors
