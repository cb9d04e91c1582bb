"""kcache.attention: differentiable attention with daemon-built kernels (torch.autograd).

The spec is fetched with backward on (LSE forced on): one cubin holds the forward and
the backward entry points. forward() runs kcache.attention_forward and keeps Q, K, V,
O and LSE; backward() launches the record's backward sequence on torch's current
stream (docs/kernel-contract.md, "Backward"):

  (BACKWARD_MASK_BUILD, expression masks) -> BACKWARD_PREPROCESS -> BACKWARD (dK, dV)
  -> BACKWARD_DQ (deterministic records) or BACKWARD_POSTPROCESS (dq_accum -> dQ)

An expression mask's forward keeps its tile classes when the record classifies with the
backward's tiles (MASK_BUILD and BACKWARD_MASK_BUILD of equal tiles): the backward then
reads them instead of classifying again (issue 28: one classification per call).

with threads, dynamic shared memory and tile sizes from the record's entry points.
Buffers declared trainable get gradients (fp32 atomics; the daemon refuses them with
deterministic). backward_launches() is the pure part (no torch, no GPU), for tests.
"""

from kcache import cuda
from kcache.attention import (
    _attention_forward, _fill_mask_inputs, _fill_qkvo, _launch_context, _mask_kind,
    _set_tile_classes, _tile_classes, normalize_drafter_inputs, resolve_spec, validate_inputs)
from kcache.errors import InvalidArgument, KcacheError
from kcache.params import AttentionParams

_AUX_ROWS = 64  # rows per CTA of preprocess / postprocess when the record gives no block_m
_ROLE_NAMES = {
    cuda.ENTRY_ROLE_BACKWARD: "BACKWARD",
    cuda.ENTRY_ROLE_BACKWARD_PREPROCESS: "BACKWARD_PREPROCESS",
    cuda.ENTRY_ROLE_BACKWARD_POSTPROCESS: "BACKWARD_POSTPROCESS",
    cuda.ENTRY_ROLE_BACKWARD_DQ: "BACKWARD_DQ",
    cuda.ENTRY_ROLE_BACKWARD_MASK_BUILD: "BACKWARD_MASK_BUILD",
}


def _cdiv(a, b):
    return -(-a // b)


def backward_spec(spec, deterministic=None):
    """A copy of an AttentionSpec with backward (and return_lse) on; `deterministic`
    overrides the spec's when not None."""
    s = type(spec)()
    s.CopyFrom(spec)
    s.backward = True
    s.return_lse = True
    if deterministic is not None:
        s.deterministic = bool(deterministic)
    return s


def backward_launches(record, plan, have_classes=False):
    """The backward sequence for a KernelRecord and a Plan (validate_inputs): a list of
    (role, EntryPoint, grid) in launch order. Raises KcacheError naming a missing role.
    have_classes: the forward's tile classes serve the backward (no BACKWARD_MASK_BUILD)."""
    entries = {}
    for e in record.entry_points:
        entries.setdefault(e.role, e)

    def need(role):
        e = entries.get(role)
        if e is None:
            raise KcacheError(
                "kcache: record %s has no %s entry point (entry points: %s); was the kernel "
                "built with backward: true?" % (
                    record.key.hex()[:16], _ROLE_NAMES[role],
                    ", ".join(x.name for x in record.entry_points) or "none"))
        if e.threads == 0:
            raise KcacheError("kcache: record %s: entry point %s has threads = 0"
                              % (record.key.hex()[:16], e.name))
        return e

    B, Hq, Hkv, Lq, Lkv = plan.batch, plan.num_q_heads, plan.num_kv_heads, plan.q_len, \
        plan.kv_len
    out = []
    if _mask_kind(record.spec) == "expr" and not have_classes:
        e = need(cuda.ENTRY_ROLE_BACKWARD_MASK_BUILD)
        out.append((e.role, e, (_cdiv(Lq, e.block_m), Hq, B)))
    e = need(cuda.ENTRY_ROLE_BACKWARD_PREPROCESS)
    out.append((e.role, e, (_cdiv(Lq, e.block_m or _AUX_ROWS), Hq, B)))
    e = need(cuda.ENTRY_ROLE_BACKWARD)
    out.append((e.role, e, (_cdiv(Lkv, e.block_n), Hkv, B)))
    if record.deterministic_backward:
        e = need(cuda.ENTRY_ROLE_BACKWARD_DQ)
        out.append((e.role, e, (_cdiv(Lq, e.block_m), Hq, B)))
    else:
        e = need(cuda.ENTRY_ROLE_BACKWARD_POSTPROCESS)
        out.append((e.role, e, (_cdiv(Lq, e.block_m or _AUX_ROWS), Hq, B)))
    for role, e, grid in out:
        if role in (cuda.ENTRY_ROLE_BACKWARD, cuda.ENTRY_ROLE_BACKWARD_DQ,
                    cuda.ENTRY_ROLE_BACKWARD_MASK_BUILD) and 0 in (e.block_m, e.block_n):
            raise KcacheError("kcache: record %s: entry point %s has no tile sizes"
                              % (record.key.hex()[:16], e.name))
    return out


def _shared_classes(record, plan, tile_classes):
    """The forward's class tensor when it serves this backward: the same record, and the
    shape the backward's tiles give (else None: the backward classifies itself)."""
    if tile_classes is None or tile_classes.key != record.key:
        return None
    e = next((x for x in record.entry_points
              if x.role == cuda.ENTRY_ROLE_BACKWARD_MASK_BUILD), None)
    if e is None or 0 in (e.block_m, e.block_n):
        return None
    t = tile_classes.tensor
    want = (plan.batch, plan.num_q_heads, _cdiv(plan.q_len, e.block_m), _cdiv(plan.kv_len,
                                                                              e.block_n))
    return t if tuple(t.shape) == want else None


def trainable_buffers(spec):
    """Names of the spec's buffers declared trainable, in the spec's order."""
    return [d.name for d in spec.buffers if d.trainable]


def _launchable(t, elem_multiple):
    """Whether a [B, H, L, D] view meets the launcher's rules (contiguous head dim, 16-byte
    aligned, b/h/s strides multiples of `elem_multiple`)."""
    st = t.stride()
    if t.shape[3] > 1 and st[3] != 1:
        return False
    if t.data_ptr() % 16:
        return False
    return all(t.shape[i] <= 1 or st[i] % elem_multiple == 0 for i in range(3))


def _grad_like(torch, t):
    """An empty gradient for `t` with t's layout when that layout is launchable."""
    g = torch.empty_like(t)
    return g if _launchable(g, 8) else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _unimplemented_hint(e):
    if isinstance(e, KcacheError) and e.code == "UNIMPLEMENTED":
        return KcacheError("kcache.attention: the daemon does not build backward kernels yet "
                           "(UNIMPLEMENTED): %s" % e, "UNIMPLEMENTED")
    return None


def attention_backward(spec, q, k, v, o, lse, dout, *, q_seq_id=None, kv_seq_id=None,
                       anchors=None, keep=None, alibi_slopes=None, buffers=None, client=None,
                       timeout=None, tile_classes=None):
    """dQ, dK, dV (and {name: gradient} of trainable buffers) for [B, H, L, D] views, with
    the forward's O and LSE of the same spec (backward on). Launches on torch's current
    stream; returns (dq, dk, dv, buffer_grads). tile_classes: the forward's
    (kcache.attention.TileClasses), used when they are this record's and of the backward's
    shape; otherwise the backward classifies itself."""
    import torch
    from kcache.client import default_client
    plan = validate_inputs(spec, q, k, v, out=o, q_seq_id=q_seq_id, kv_seq_id=kv_seq_id,
                           anchors=anchors, keep=keep, alibi_slopes=alibi_slopes,
                           buffers=buffers)
    if tuple(dout.shape) != tuple(o.shape) or dout.dtype != o.dtype:
        raise InvalidArgument("kcache.attention backward: dO has shape %s %s, O %s %s"
                              % (list(dout.shape), dout.dtype, list(o.shape), o.dtype))
    if dout.device != o.device:
        raise InvalidArgument("kcache.attention backward: dO is on %s, O on %s"
                              % (dout.device, o.device))
    if not _launchable(dout, 2):
        dout = dout.contiguous()  # e.g. an expanded gradient (stride 0) from a sum()
    dq, dk, dv = _grad_like(torch, q), _grad_like(torch, k), _grad_like(torch, v)
    names = trainable_buffers(spec)
    bgrads = {n: torch.zeros_like(buffers[n]) for n in names}
    B, Hq, Lq, Lkv = plan.batch, plan.num_q_heads, plan.q_len, plan.kv_len
    if B == 0 or Lq == 0 or Lkv == 0:  # nothing to launch: no key, no gradient
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv, bgrads
    dev = q.device
    client = client or default_client()
    with _launch_context(torch, dev) as (arch, stream, ctx):
        try:
            kern = client.load(spec, arch, ctx, timeout=timeout)
        except Exception as e:
            hint = _unimplemented_hint(e)
            if hint is not None:
                raise hint from e
            raise
        rec = kern.record
        shared = _shared_classes(rec, plan, tile_classes)
        launches = backward_launches(rec, plan, have_classes=shared is not None)
        spec_n = rec.spec
        p = AttentionParams()
        _fill_qkvo(p, q, k, v, o, lse)
        hold = _fill_mask_inputs(torch, p, spec_n, plan, q_seq_id, kv_seq_id, anchors, keep,
                                 alibi_slopes, buffers)
        p.dout, p.dq, p.dk, p.dv = (dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                    dv.data_ptr())
        p.do_stride_b, p.do_stride_h, p.do_stride_s = dout.stride()[:3]
        p.dq_stride_b, p.dq_stride_h, p.dq_stride_s = dq.stride()[:3]
        p.dk_stride_b, p.dk_stride_h, p.dk_stride_s = dk.stride()[:3]
        p.dv_stride_b, p.dv_stride_h, p.dv_stride_s = dv.stride()[:3]
        delta = torch.empty(B, Hq, Lq, dtype=torch.float32, device=dev)
        hold.append(delta)
        p.delta = delta.data_ptr()
        if not rec.deterministic_backward:
            acc = torch.empty(B, Hq, Lq, plan.head_dim_qk, dtype=torch.float32, device=dev)
            hold.append(acc)
            p.dq_accum = acc.data_ptr()
        for i, d in enumerate(spec_n.buffers):  # launch order: the normalized spec's
            if d.trainable and d.name in bgrads:
                p.buffer_grads[i] = bgrads[d.name].data_ptr()
        if shared is not None:
            _set_tile_classes(p, shared)
        for role, e, grid in launches:
            if role == cuda.ENTRY_ROLE_BACKWARD_MASK_BUILD:
                _tile_classes(torch, p, hold, (B, Hq, grid[0], _cdiv(Lkv, e.block_n)), dev)
            fn = kern.functions.get(e.name)
            if fn is None:
                raise KcacheError("kcache: entry point %s not loaded" % e.name)
            cuda.launch(fn, grid, e.threads, e.dynamic_smem_bytes, stream, p)
    del hold  # allocated on this stream: reused only by work ordered after these launches
    return dq, dk, dv, bgrads


_Function = None


def _function():
    """The torch.autograd.Function, defined on first use (torch is imported lazily)."""
    global _Function
    if _Function is not None:
        return _Function
    import torch

    class KcacheAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, meta, q, k, v, *trainable):
            bufs = dict(meta["buffers"])
            for name, t in zip(meta["trainable"], trainable):
                bufs[name] = t
            try:
                (o, lse), classes = _attention_forward(
                    q, k, v, meta["spec"], lse=True, buffers=bufs or None,
                    client=meta["client"], timeout=meta["timeout"], **meta["mask_inputs"])
            except Exception as e:
                hint = _unimplemented_hint(e)
                if hint is not None:
                    raise hint from e
                raise
            ctx.meta = meta
            ctx.buffers = bufs
            ctx.classes = classes  # not an autograd input: no version check needed
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, dout):
            q, k, v, o, lse = ctx.saved_tensors
            meta = ctx.meta
            dq, dk, dv, bgrads = attention_backward(
                meta["spec"], q, k, v, o, lse, dout, buffers=ctx.buffers or None,
                client=meta["client"], timeout=meta["timeout"], tile_classes=ctx.classes,
                **meta["mask_inputs"])
            return (None, dq, dk, dv) + tuple(bgrads[n] for n in meta["trainable"])

    _Function = KcacheAttention
    return _Function


def attention(q, k, v, spec=None, *, layout="bhsd", deterministic=None, q_seq_id=None,
              kv_seq_id=None, anchors=None, keep=None, alibi_slopes=None, buffers=None,
              client=None, timeout=None):
    """Differentiable attention: O = softmax(score_mod(Q K^T * scale) masked) V, with
    gradients for q, k, v and for the spec's trainable buffers.

    Arguments as kcache.attention_forward (q: [B, Hq, Lq, D] or, with layout="bshd",
    [B, Lq, Hq, D]; spec: AttentionSpec / JSON / dict of kcache.spec() arguments; mask
    inputs; buffers={name: tensor}). The spec is fetched with backward on; `deterministic`
    (when not None) overrides the spec's choice of a dQ without atomics. Returns O."""
    import torch
    if layout not in ("bhsd", "bshd"):
        raise InvalidArgument("kcache.attention: layout: %r is not 'bhsd' or 'bshd'" % (layout,),
                              "layout")
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) if t.dim() == 4 else t for t in (q, k, v))
    s = backward_spec(resolve_spec(spec, q, k, v, True), deterministic)
    anchors, keep = normalize_drafter_inputs(torch, anchors, keep)
    names = trainable_buffers(s)
    buffers = dict(buffers or {})
    for n in names:
        if n not in buffers:
            raise InvalidArgument("kcache.attention: buffers[%r]: declared trainable by the "
                                  "spec, not given" % n, "buffers")
        t = buffers[n]
        if t.dtype != torch.float32:
            raise InvalidArgument("kcache.attention: buffers[%r]: a trainable buffer is "
                                  "float32, got %s" % (n, t.dtype), "buffers")
    # Trainable buffers go through the Function (contiguous: their gradients share the
    # buffer's strides); the others ride along in meta.
    trainable = [buffers.pop(n).contiguous() for n in names]
    meta = dict(spec=s, client=client, timeout=timeout, trainable=names, buffers=buffers,
                mask_inputs=dict(q_seq_id=q_seq_id, kv_seq_id=kv_seq_id, anchors=anchors,
                                 keep=keep, alibi_slopes=alibi_slopes))
    o = _function().apply(meta, q, k, v, *trainable)
    return o.transpose(1, 2) if layout == "bshd" else o


__all__ = ["attention", "attention_backward", "backward_launches", "backward_spec",
           "trainable_buffers"]
