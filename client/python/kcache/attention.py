"""kcache.attention_forward: attention with a daemon-built kernel on PyTorch tensors.

validate_inputs() holds every check docs/kernel-contract.md leaves to the
launcher (dtypes, shapes against the spec, GQA, contiguous head dimension,
16-byte alignment and stride multiples, lengths, mask inputs). It needs no
torch or GPU: it reads .shape, .stride(), .dtype, .device and .data_ptr(),
so tests can call it with stand-in objects. attention_forward() then gets
the kernel (Client.load: memo per key and CUDA context), fills the ctypes
AttentionParams and launches on torch.cuda.current_stream().
"""

import contextlib
import math

from kcache.errors import InvalidArgument, KcacheError
from kcache.params import MAX_EXPR_BUFFERS, AttentionParams

INT32_MAX = 2**31 - 1
_SPEC_DTYPE = {1: "bfloat16", 2: "float16"}
_ELEM_DTYPES = {1: ("int32",), 2: ("float32",), 3: ("bool", "int8", "uint8")}
_ELEM_NAME = {1: "int32", 2: "float32", 3: "bool"}
_MASK_INPUTS = {"document": ("q_seq_id", "kv_seq_id"), "drafter": ("anchors", "keep")}


class Plan:
    """What validate_inputs found: sizes, and for the drafter S and N."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return "Plan(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self.__dict__.items()))


def _dt(t):
    return str(t.dtype).replace("torch.", "")


def _dev(t):
    d = t.device
    return (getattr(d, "type", str(d)), getattr(d, "index", None))


def _shape(t):
    return tuple(int(x) for x in t.shape)


def _fail(name, why):
    raise InvalidArgument("attention_forward: %s: %s" % (name, why), name)


def _check_tensor(name, t, dims, dtypes, device=None):
    if t is None:
        _fail(name, "required by the spec, not given")
    if len(_shape(t)) != dims:
        _fail(name, "expected %d dimensions, got shape %s" % (dims, list(_shape(t))))
    if _dt(t) not in dtypes:
        _fail(name, "dtype %s, expected %s" % (_dt(t), " or ".join(dtypes)))
    if device is not None and _dev(t) != device:
        _fail(name, "on %s:%s, expected %s:%s (the device of q)" % (_dev(t) + device))


def _check_qkvo(name, t, expect_shape, dtype, device, stride_multiple):
    _check_tensor(name, t, 4, (dtype,), device)
    shp = _shape(t)
    for i, (got, want, what) in enumerate(zip(shp, expect_shape, ("batch", "heads", "seq len",
                                                                   "head dim"))):
        if want is not None and got != want:
            _fail(name, "%s (dim %d) is %d, expected %d; shape %s" % (what, i, got, want,
                                                                       list(shp)))
    st = tuple(t.stride())
    if shp[3] > 1 and st[3] != 1:
        _fail(name, "the head dimension (last) must be contiguous (stride 1), strides %s"
              % (list(st),))
    for i, what in ((0, "batch"), (1, "head"), (2, "sequence")):
        if shp[i] > 1 and st[i] % stride_multiple:
            _fail(name, "the %s stride %d is not a multiple of %d elements (strides %s); "
                  "use .contiguous()" % (what, st[i], stride_multiple, list(st)))
    if t.data_ptr() % 16:
        _fail(name, "data pointer 0x%x is not 16-byte aligned" % t.data_ptr())


def _mask_kind(spec):
    return spec.mask.WhichOneof("kind") or "none"


def _score_kind(spec):
    return spec.score_mod.WhichOneof("kind") or "none"


def validate_inputs(spec, q, k, v, *, out=None, q_seq_id=None, kv_seq_id=None, anchors=None,
                    keep=None, alibi_slopes=None, buffers=None):
    """Checks [batch, heads, seq, head_dim] views q, k, v (and out, mask inputs) against an
    AttentionSpec. Raises kcache.InvalidArgument (a ValueError) naming the input and the
    reason; returns a Plan."""
    dtype = _SPEC_DTYPE.get(spec.dtype)
    if dtype is None:
        raise InvalidArgument("attention_forward: spec.dtype: unset")
    dqk = spec.head_dim_qk
    dv = spec.head_dim_v or dqk
    hq = spec.num_q_heads
    hkv = spec.num_kv_heads or hq
    if hq == 0 or hq % hkv:
        raise InvalidArgument("attention_forward: spec: num_q_heads %d is not a multiple of "
                              "num_kv_heads %d" % (hq, hkv))
    _check_tensor("q", q, 4, (dtype,))
    device = _dev(q)
    if device[0] != "cuda":
        _fail("q", "on %s, expected a CUDA tensor" % device[0])
    B, _, Lq, _ = _shape(q)
    _check_qkvo("q", q, (None, hq, None, dqk), dtype, device, 8)
    _check_tensor("k", k, 4, (dtype,), device)
    Lkv = _shape(k)[2]
    _check_qkvo("k", k, (B, hkv, None, dqk), dtype, device, 8)
    _check_qkvo("v", v, (B, hkv, Lkv, dv), dtype, device, 8)
    if out is not None:
        _check_qkvo("out", out, (B, hq, Lq, dv), dtype, device, 2)
    for name, n in (("batch", B), ("q_len", Lq), ("kv_len", Lkv)):
        if n > INT32_MAX:
            _fail(name, "%d does not fit in int32" % n)
    plan = Plan(batch=B, num_q_heads=hq, num_kv_heads=hkv, q_len=Lq, kv_len=Lkv,
                head_dim_qk=dqk, head_dim_v=dv, dtype=dtype, device=device,
                context_len=0, num_blocks=0)

    mask, score = _mask_kind(spec), _score_kind(spec)
    given = dict(q_seq_id=q_seq_id, kv_seq_id=kv_seq_id, anchors=anchors, keep=keep,
                 alibi_slopes=alibi_slopes)
    allowed = set(_MASK_INPUTS.get(mask, ()))
    if score == "alibi":
        allowed.add("alibi_slopes")
    for name, t in given.items():
        if t is not None and name not in allowed:
            _fail(name, "given, but the spec's mask is %s and its score modification %s"
                  % (mask, score))
    if buffers and mask != "expr" and score != "expr":
        _fail("buffers", "given, but the spec has no expression mask or score modification")

    def rows(name, t, cols, dtypes, min_cols=False):
        _check_tensor(name, t, 2, dtypes, device)
        shp = _shape(t)
        if shp[0] != B or (shp[1] < cols if min_cols else shp[1] != cols):
            _fail(name, "shape %s, expected [%d, %s%d]" % (list(shp), B, ">=" if min_cols else "",
                                                          cols))
        if shp[1] > 1 and t.stride()[1] != 1:
            _fail(name, "the last dimension must be contiguous (strides %s)" % list(t.stride()))

    if mask == "document":
        rows("q_seq_id", q_seq_id, Lq, ("int32",))
        rows("kv_seq_id", kv_seq_id, Lkv, ("int32",))
    elif mask == "drafter":
        bs = spec.mask.drafter.block_size
        if bs == 0:
            raise InvalidArgument("attention_forward: spec.mask.drafter.block_size: unset")
        if Lq % bs:
            _fail("q", "q_len %d is not a multiple of the drafter block_size %d" % (Lq, bs))
        if Lkv < Lq:
            _fail("k", "kv_len %d is shorter than q_len %d; the drafter's keys are "
                  "[context | the %d query tokens]" % (Lkv, Lq, Lq))
        plan.num_blocks, plan.context_len = Lq // bs, Lkv - Lq
        rows("anchors", anchors, plan.num_blocks, ("int32",), min_cols=True)
        if keep is not None:
            rows("keep", keep, plan.num_blocks, ("bool", "int8", "uint8"), min_cols=True)
            if B > 1 and keep.stride()[0] != anchors.stride()[0]:
                _fail("keep", "batch stride %d differs from anchors' %d (the kernel takes one "
                      "stride for both)" % (keep.stride()[0], anchors.stride()[0]))
    if score == "alibi":
        _check_tensor("alibi_slopes", alibi_slopes, 1, ("float32",), device)
        if _shape(alibi_slopes) != (hq,) or (hq > 1 and alibi_slopes.stride()[0] != 1):
            _fail("alibi_slopes", "expected a contiguous float32 [%d] (one per query head), got "
                  "shape %s" % (hq, list(_shape(alibi_slopes))))

    decls = list(spec.buffers)
    if decls:
        if len(decls) > MAX_EXPR_BUFFERS:
            raise InvalidArgument("attention_forward: spec.buffers: %d declared, at most %d"
                                  % (len(decls), MAX_EXPR_BUFFERS))
        buffers = dict(buffers or {})
        names = {d.name for d in decls}
        for extra in sorted(set(buffers) - names):
            _fail("buffers[%r]" % extra, "not declared by the spec (declared: %s)"
                  % ", ".join(sorted(names)))
        for d in decls:
            t = buffers.get(d.name)
            label = "buffers[%r]" % d.name
            if t is None:
                _fail(label, "declared by the spec (%s, rank %d), not given"
                      % (_ELEM_NAME.get(d.type, "?"), d.rank))
            _check_tensor(label, t, d.rank, _ELEM_DTYPES.get(d.type, ()), device)
    elif buffers:
        _fail("buffers", "given, but the spec declares none")
    return plan


# ---------------------------------------------------------------------------
# The torch side
# ---------------------------------------------------------------------------
_SPEC_KEYS = {"dtype", "head_dim", "q_heads", "kv_heads", "head_dim_v"}


def resolve_spec(spec, q, k, v, lse):
    """An AttentionSpec from a message / JSON text / dict of kcache.spec() keyword arguments
    (missing dtype, head dims and heads are taken from q, k, v), with return_lse on when
    `lse` is asked for."""
    from kcache import specs
    if spec is None or isinstance(spec, dict):
        kw = dict(spec or {})
        dt = _dt(q)
        kw.setdefault("dtype", {"bfloat16": "bf16", "float16": "fp16"}.get(dt, dt))
        kw.setdefault("head_dim", _shape(q)[3])
        kw.setdefault("q_heads", _shape(q)[1])
        kw.setdefault("kv_heads", _shape(k)[1])
        if _shape(v)[3] != _shape(q)[3]:
            kw.setdefault("head_dim_v", _shape(v)[3])
        s = specs.spec(**kw)
    else:
        s = specs.to_spec(spec)
    if lse and not s.return_lse:
        s2 = type(s)()
        s2.CopyFrom(s)
        s2.return_lse = True
        s = s2
    return s


def attention_forward(q, k, v, spec=None, *, lse=False, layout="bhsd", out=None, q_seq_id=None,
                      kv_seq_id=None, anchors=None, keep=None, alibi_slopes=None, buffers=None,
                      client=None, timeout=None):
    """Attention forward with the kernel the daemon built for `spec`.

    q: [B, Hq, Lq, Dqk], k: [B, Hkv, Lkv, Dqk], v: [B, Hkv, Lkv, Dv] (layout="bhsd", any
    strides with a contiguous head dim), or [B, L, H, D] with layout="bshd". spec: an
    AttentionSpec, JSON text, or a dict of kcache.spec() arguments (dtype, head dims and
    heads default to the tensors'). Mask inputs: q_seq_id/kv_seq_id (document, int32
    [B, L]), anchors (int32 [B, >=N]) and keep (bool/int8 [B, >=N]) for the drafter,
    alibi_slopes (float32 [Hq]), buffers={name: tensor} for expressions.
    Returns O (like q's layout, v's head dim), or (O, LSE) with lse=True (float32
    [B, Hq, Lq], natural log; -inf on rows that see no key)."""
    return _attention_forward(q, k, v, spec, lse=lse, layout=layout, out=out,
                              q_seq_id=q_seq_id, kv_seq_id=kv_seq_id, anchors=anchors,
                              keep=keep, alibi_slopes=alibi_slopes, buffers=buffers,
                              client=client, timeout=timeout)[0]


def _attention_forward(q, k, v, spec=None, *, lse=False, layout="bhsd", out=None, q_seq_id=None,
                       kv_seq_id=None, anchors=None, keep=None, alibi_slopes=None, buffers=None,
                       client=None, timeout=None):
    """attention_forward's (result, tile classes): the expression mask's tile classes
    (TileClasses) when the record's classification serves its backward too, else None."""
    import torch
    from kcache import cuda
    from kcache.client import default_client
    if layout not in ("bhsd", "bshd"):
        raise InvalidArgument("attention_forward: layout: %r is not 'bhsd' or 'bshd'"
                              % (layout,), "layout")
    if layout == "bshd":
        q, k, v = (t.permute(0, 2, 1, 3) if t.dim() == 4 else t for t in (q, k, v))
        if out is not None and out.dim() == 4:
            out = out.permute(0, 2, 1, 3)
    s = resolve_spec(spec, q, k, v, lse)
    anchors, keep = normalize_drafter_inputs(torch, anchors, keep)
    plan = validate_inputs(s, q, k, v, out=out, q_seq_id=q_seq_id, kv_seq_id=kv_seq_id,
                           anchors=anchors, keep=keep, alibi_slopes=alibi_slopes,
                           buffers=buffers)
    B, Hq, Lq, Lkv, Dv = plan.batch, plan.num_q_heads, plan.q_len, plan.kv_len, plan.head_dim_v
    dev = q.device
    if out is None:
        if layout == "bshd":
            out = torch.empty(B, Lq, Hq, Dv, dtype=q.dtype, device=dev).permute(0, 2, 1, 3)
        else:
            out = torch.empty(B, Hq, Lq, Dv, dtype=q.dtype, device=dev)
    lse_t = torch.empty(B, Hq, Lq, dtype=torch.float32, device=dev) if lse else None

    def result():
        o = out.permute(0, 2, 1, 3) if layout == "bshd" else out
        return (o, lse_t) if lse else o

    if B == 0 or Lq == 0:
        return result(), None  # nothing to launch (the contract leaves 0 lengths to us)
    if Lkv == 0:  # no key at all: every row is empty
        out.zero_()
        if lse_t is not None:
            lse_t.fill_(-math.inf)
        return result(), None

    client = client or default_client()
    with _launch_context(torch, dev) as (arch, stream, ctx):
        kern = client.load(s, arch, ctx, timeout=timeout)
        fwd_entry, fwd = kern.entry(cuda.ENTRY_ROLE_FORWARD)
        if fwd is None:
            raise KcacheError("kcache: record %s has no forward entry point"
                              % kern.record.key.hex()[:16])
        spec_n = kern.record.spec  # normalized: buffers in launch order (by name)
        p = AttentionParams()
        _fill_qkvo(p, q, k, v, out, lse_t)
        hold = _fill_mask_inputs(torch, p, spec_n, plan, q_seq_id, kv_seq_id, anchors, keep,
                                 alibi_slopes, buffers)
        grid = (-(-Lq // fwd_entry.block_m), Hq, B)
        classes = None
        if _mask_kind(spec_n) == "expr":
            mb_entry, mb = kern.entry(cuda.ENTRY_ROLE_MASK_BUILD)
            if mb is None:
                raise KcacheError("kcache: record %s has an expression mask but no mask-build "
                                  "entry point" % kern.record.key.hex()[:16])
            mt, nt = -(-Lq // mb_entry.block_m), -(-Lkv // mb_entry.block_n)
            tc = _tile_classes(torch, p, hold, (B, Hq, mt, nt), dev)
            cuda.launch(mb, (mt, Hq, B), mb_entry.threads, mb_entry.dynamic_smem_bytes,
                        stream, p)
            bmb_entry, _ = kern.entry(cuda.ENTRY_ROLE_BACKWARD_MASK_BUILD)
            if bmb_entry is not None and (bmb_entry.block_m, bmb_entry.block_n) == (
                    mb_entry.block_m, mb_entry.block_n):
                classes = TileClasses(kern.record.key, tc)
        cuda.launch(fwd, grid, fwd_entry.threads, fwd_entry.dynamic_smem_bytes, stream, p)
    # Temporaries in `hold` were allocated on this stream: the caching allocator reuses
    # them only for work ordered after these launches.
    del hold
    return result(), classes


class TileClasses:
    """An expression mask's tile classes from a forward whose classification serves the
    backward of the same record (docs/kernel-contract.md): the backward then skips its own
    mask build. `key`: the record's key; `tensor`: int8 [B, Hq, M tiles, N tiles]."""

    __slots__ = ("key", "tensor")

    def __init__(self, key, tensor):
        self.key, self.tensor = key, tensor


def normalize_drafter_inputs(torch, anchors, keep):
    """keep as int8 (a bool tensor is viewed, same bytes), and anchors and keep repacked
    when their batch strides differ (the kernel takes one stride for both). Idempotent."""
    if keep is not None and keep.dtype == torch.bool:
        try:
            keep = keep.view(torch.int8)  # same bytes (0/1), no copy
        except RuntimeError:
            keep = keep.to(torch.int8)
    if (keep is not None and anchors is not None and anchors.dim() == 2 and keep.dim() == 2
            and anchors.shape[0] > 1 and keep.stride(0) != anchors.stride(0)):
        n = min(anchors.shape[1], keep.shape[1])  # one batch stride for both: repack
        anchors, keep = anchors[:, :n].contiguous(), keep[:, :n].contiguous()
    return anchors, keep


@contextlib.contextmanager
def _launch_context(torch, dev):
    """torch's device `dev` made current and its CUDA context entered, to load and launch
    kernels there; yields (arch, stream, ctx): the device's arch, torch's current stream on
    it and the context."""
    from kcache import cuda
    from kcache.client import arch_for_capability
    with torch.cuda.device(dev):
        arch = arch_for_capability(*torch.cuda.get_device_capability(dev))
        stream = torch.cuda.current_stream(dev).cuda_stream
        with cuda.device_context(dev.index if dev.index is not None
                                 else torch.cuda.current_device()) as ctx:
            yield arch, stream, ctx


def _tile_classes(torch, p, hold, shape, dev):
    """The mask-build kernel's tile classes: an int8 tensor of `shape` [B, H, M tiles,
    N tiles] on `dev`, kept alive in `hold` and set in the params `p`."""
    tc = torch.empty(*shape, dtype=torch.int8, device=dev)
    hold.append(tc)
    _set_tile_classes(p, tc)
    return tc


def _set_tile_classes(p, tc):
    p.tile_class = tc.data_ptr()
    p.tile_class_stride_b, p.tile_class_stride_h, p.tile_class_stride_m = tc.stride()[:3]


def _fill_qkvo(p, q, k, v, o, lse):
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    p.q_stride_b, p.q_stride_h, p.q_stride_s = q.stride()[:3]
    p.k_stride_b, p.k_stride_h, p.k_stride_s = k.stride()[:3]
    p.v_stride_b, p.v_stride_h, p.v_stride_s = v.stride()[:3]
    p.o_stride_b, p.o_stride_h, p.o_stride_s = o.stride()[:3]
    if lse is not None:
        p.lse = lse.data_ptr()
        p.lse_stride_b, p.lse_stride_h = lse.stride()[:2]
    p.batch, p.num_q_heads, p.q_len = q.shape[0], q.shape[1], q.shape[2]
    p.num_kv_heads, p.kv_len = k.shape[1], k.shape[2]


def _fill_mask_inputs(torch, p, spec, plan, q_seq_id, kv_seq_id, anchors, keep, slopes, buffers):
    hold = []
    if q_seq_id is not None:
        p.q_seq_id, p.q_seq_id_stride_b = q_seq_id.data_ptr(), q_seq_id.stride(0)
        p.kv_seq_id, p.kv_seq_id_stride_b = kv_seq_id.data_ptr(), kv_seq_id.stride(0)
    if anchors is not None:
        p.drafter_anchor = anchors.data_ptr()
        p.drafter_keep = keep.data_ptr() if keep is not None else None
        p.drafter_stride_b = anchors.stride(0)
        p.drafter_context_len, p.drafter_num_blocks = plan.context_len, plan.num_blocks
    if slopes is not None:
        p.alibi_slopes = slopes.data_ptr()
    for i, d in enumerate(spec.buffers):
        t = buffers[d.name]  # bool tensors are one byte per element, 0 or 1, as the spec says
        p.buffers[i].ptr = t.data_ptr()
        p.buffers[i].rank = t.dim()
        for j in range(t.dim()):
            p.buffers[i].extent[j] = t.shape[j]
            p.buffers[i].stride[j] = t.stride(j)
    return hold
