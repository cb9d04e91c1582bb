"""torch.library custom operators kcache::flex_fwd and kcache::flex_bwd.

    out, lse = torch.ops.kcache.flex_fwd(q, k, v, spec, names, buffers)
    grads = torch.ops.kcache.flex_bwd(q, k, v, out, lse, dout, spec, names, buffers)

spec: a serialized AttentionSpec (base64 text, backward on; kcache.flex.spec_text);
names (comma-separated) / buffers: the launch buffers by spec name, and the built-in masks'
inputs as "@q_seq_id", "@kv_seq_id", "@anchors", "@keep". grads: [dq, dk, dv] and one gradient per
buffer the spec declares trainable, in the spec's order. Each has a fake (meta)
implementation, and flex_fwd is differentiable through flex_bwd (register_autograd), so
torch.compile(fullgraph=True) keeps them in the graph. CUDA tensors run kcache's kernels
(kcache.attention_forward / attention_backward: after the first call for a kernel, no RPC
and no host sync, so CUDA graphs capture them); CPU tensors run the dense reference
(kcache._reference), for tests.
"""

import concurrent.futures
import functools
from typing import List, Tuple

import torch

from kcache import _reference
from kcache.errors import InvalidArgument
from kcache.flex import parse


@functools.lru_cache(maxsize=256)
def _spec(text):
    from kcache import _protos
    return parse(_protos.modules()[0].AttentionSpec, text)


def _split(names, bufs):
    names = names.split(",") if names else []
    buffers, inputs = {}, {}
    if len(names) != len(bufs):
        raise InvalidArgument("kcache::flex: %d names for %d buffers" % (len(names), len(bufs)),
                              "names")
    for n, t in zip(names, bufs):
        if n.startswith("@"):
            inputs[n[1:]] = t
        else:
            buffers[n] = t
    return buffers, inputs


def _trainable(spec):
    return [d.name for d in spec.buffers if d.trainable]


def _forward(q, k, v, spec, names, bufs):
    """flex_fwd's implementation: the same for the operator and the eager path.
    Returns ((out, lse), tile classes for the backward or None)."""
    s = _spec(spec)
    buffers, inputs = _split(names, bufs)
    if q.device.type != "cuda":
        with torch.no_grad():
            out, lse = _reference.attention(s, q, k, v, buffers, inputs)
        return (out, lse), None
    from kcache.attention import _attention_forward
    return _attention_forward(q, k, v, s, lse=True, buffers=buffers or None, **inputs)


@torch.library.custom_op("kcache::flex_fwd", mutates_args=())
def flex_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: str, names: str,
             bufs: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    # An operator's outputs are tensors only: the backward operator classifies again.
    return _forward(q, k, v, spec, names, bufs)[0]


@flex_fwd.register_fake
def _(q, k, v, spec, names, bufs):
    B, H, L, _ = q.shape
    out = q.new_empty(B, H, L, v.shape[3])
    return out, q.new_empty(B, H, L, dtype=torch.float32)


def _backward_impl(q, k, v, out, lse, dout, spec, names, bufs, tile_classes=None):
    """flex_bwd's implementation: the same for the operator and the eager path
    (tile_classes: the eager forward's, see kcache.attention.TileClasses)."""
    s = _spec(spec)
    buffers, inputs = _split(names, bufs)
    train = _trainable(s)
    if q.device.type != "cuda":
        return _reference_backward(s, q, k, v, dout, buffers, inputs, train)
    from kcache.attention import normalize_drafter_inputs
    from kcache.autograd import attention_backward
    if "anchors" in inputs:  # keep as int8, one batch stride for both (as the forward)
        inputs["anchors"], inputs["keep"] = normalize_drafter_inputs(
            torch, inputs["anchors"], inputs.get("keep"))
    dq, dk, dv, bg = attention_backward(s, q, k, v, out, lse, dout, buffers=buffers or None,
                                        tile_classes=tile_classes, **inputs)
    return [dq, dk, dv] + [bg[n] for n in train]


@torch.library.custom_op("kcache::flex_bwd", mutates_args=())
def flex_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, dout: torch.Tensor, spec: str, names: str,
             bufs: List[torch.Tensor]) -> List[torch.Tensor]:
    return _backward_impl(q, k, v, out, lse, dout, spec, names, bufs)


def _reference_backward(s, q, k, v, dout, buffers, inputs, train):
    """The reference differentiated by autograd, on a thread of its own: an operator's
    implementation runs with the autograd dispatch keys excluded (thread-local state), and a
    new thread starts without that exclusion."""
    def run():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        tb = {n: buffers[n].detach().requires_grad_() for n in train}
        o, _ = _reference.attention(s, *leaves, dict(buffers, **tb), inputs)
        xs = leaves + [tb[n] for n in train]
        gs = torch.autograd.grad(o, xs, dout, allow_unused=True)
        return [g if g is not None else torch.zeros_like(x) for g, x in zip(gs, xs)]

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(run).result()


@flex_bwd.register_fake
def _(q, k, v, out, lse, dout, spec, names, bufs):
    buffers, _ = _split(names, bufs)
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)] + [
        torch.empty_like(buffers[n]) for n in _trainable(_spec(spec))]


def _setup_context(ctx, inputs, output):
    q, k, v, spec, names, bufs = inputs
    out, lse = output
    ctx.spec, ctx.names, ctx.nbufs = spec, names, len(bufs)
    ctx.save_for_backward(q, k, v, out, lse, *bufs)


def _buffer_grads(spec, names, rest):
    """The trainable buffers' gradients in the order of `names` (None for the others)."""
    by_name = dict(zip(_trainable(_spec(spec)), rest))
    return [by_name.get(n) for n in (names.split(",") if names else [])]


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, *bufs = ctx.saved_tensors
    # dlse: flex's lse is returned for inspection; its gradient is not propagated.
    grads = flex_bwd(q, k, v, out, lse, dout.contiguous(), ctx.spec, ctx.names, bufs)
    return grads[0], grads[1], grads[2], None, None, _buffer_grads(ctx.spec, ctx.names,
                                                                  grads[3:])


flex_fwd.register_autograd(_backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """The same forward and backward outside torch.compile. Calling a torch.library
    operator imports torch._dynamo on its first call (torch wraps the implementation in
    a dynamo guard), about 3 s of a new process's first attention; eager callers skip it."""

    @staticmethod
    def forward(ctx, q, k, v, spec, names, *bufs):
        (out, lse), classes = _forward(q, k, v, spec, names, list(bufs))
        ctx.spec, ctx.names, ctx.classes = spec, names, classes
        ctx.save_for_backward(q, k, v, out, lse, *bufs)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *bufs = ctx.saved_tensors
        grads = _backward_impl(q, k, v, out, lse, dout.contiguous(), ctx.spec, ctx.names, bufs,
                               ctx.classes)
        return (grads[0], grads[1], grads[2], None, None,
                *_buffer_grads(ctx.spec, ctx.names, grads[3:]))


def flex(q, k, v, spec, names, bufs):
    """(out, lse): the custom operator while torch.compile traces, the eager Function
    otherwise (same implementation, same results)."""
    if torch.compiler.is_compiling():
        return flex_fwd(q, k, v, spec, names, bufs)
    return _Eager.apply(q, k, v, spec, names, *bufs)
