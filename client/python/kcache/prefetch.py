"""kcache.prefetch: ask the daemon to build kernels ahead of the first step (Prefetch RPC),
without waiting for them or launching anything."""

from kcache import flex as _flex
from kcache.errors import InvalidSpec, InvalidType


class Shape:
    """What a kernel is built for, besides the mask: heads, head dims, dtype and (for
    recognizing recorded masks) the lengths."""

    def __init__(self, q_heads, kv_heads=None, head_dim=128, head_dim_v=None, q_len=None,
                 kv_len=None, dtype="bf16", scale=None):
        self.q_heads, self.kv_heads = int(q_heads), int(kv_heads or q_heads)
        self.head_dim, self.head_dim_v = int(head_dim), int(head_dim_v or head_dim)
        self.q_len, self.kv_len = q_len, kv_len if kv_len is not None else q_len
        self.dtype, self.scale = dtype, scale


def _shape(s):
    if isinstance(s, Shape):
        return s
    if isinstance(s, dict):
        return Shape(**s)
    raise InvalidType("kcache.prefetch: a shape is a dict of kcache.prefetch.Shape arguments "
                    "(q_heads, kv_heads, head_dim, head_dim_v, q_len, kv_len, dtype, scale)")


def _specs_for(item, shape):
    """Serialized specs (base64) that flex_attention would ask for: its own launch_args on
    meta tensors of the shape, so that the keys are the same."""
    import torch
    from kcache import specs
    if isinstance(item, dict) and ("mask_mod" in item or "score_mod" in item):
        mm, sm = item.get("mask_mod"), item.get("score_mod")
    elif isinstance(item, _flex.BlockMask) or callable(item):
        mm, sm = item, None
    else:  # an AttentionSpec, JSON or dict: as given, with backward on (flex's kernels)
        from kcache.autograd import backward_spec
        return [_flex._b64(backward_spec(specs.to_spec(item)))]
    if shape.q_len is None:
        raise InvalidSpec("kcache.prefetch: a mask or function needs q_len (and kv_len) in "
                          "the shape", field="shapes")
    lq, lkv = int(shape.q_len), int(shape.kv_len)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[shape.dtype]
    q = torch.empty(1, shape.q_heads, lq, shape.head_dim, dtype=dt, device="meta")
    k = torch.empty(1, shape.kv_heads, lkv, shape.head_dim, dtype=dt, device="meta")
    v = torch.empty(1, shape.kv_heads, lkv, shape.head_dim_v, dtype=dt, device="meta")
    bm = mm
    if mm is not None and not isinstance(mm, _flex.BlockMask):
        bm = _flex.create_block_mask(mm, None, None, lq, lkv, device=None)
    text, _, _ = _flex.launch_args(q, k, v, sm, bm, shape.scale, True)
    return [text]


def prefetch(specs_or_functions, shapes=(), *, arch=None, client=None, timeout=30.0):
    """Schedules the daemon's compile of each kernel flex_attention / kcache.attention would
    ask for: `specs_or_functions` are AttentionSpecs (or JSON / dicts), kcache BlockMasks,
    mask_mod functions, or dicts {"mask_mod": ..., "score_mod": ...}; each function or mask
    is combined with every shape in `shapes` (dicts of kcache.prefetch.Shape arguments).
    arch: e.g. "sm_90a" (default: this machine's GPU). Returns the daemon's PrefetchResults
    (state CACHED / QUEUED / REJECTED with its error), in order. Does not wait for compiles."""
    from kcache import _protos, cuda
    from kcache.client import default_client
    from kcache.flex import parse
    pb, _, service_pb2, _ = _protos.modules()
    client = client or default_client()
    if not isinstance(specs_or_functions, (list, tuple)):
        specs_or_functions = [specs_or_functions]
    shapes = [_shape(s) for s in (shapes if isinstance(shapes, (list, tuple)) else [shapes])]
    texts = []
    for item in specs_or_functions:
        is_fn = (isinstance(item, (_flex.BlockMask, dict)) and not _is_spec_dict(item)) or \
            (callable(item) and not isinstance(item, pb.AttentionSpec))
        if is_fn:
            if not shapes:
                raise InvalidSpec("kcache.prefetch: functions and masks need shapes",
                                  field="shapes")
            for s in shapes:
                texts.extend(_specs_for(item, s))
        else:
            texts.extend(_specs_for(item, None))
    req = service_pb2.PrefetchRequest()
    target = client._target(arch if arch is not None else cuda.local_arch(), None, 0)
    for t in texts:
        r = req.requests.add()
        r.spec.CopyFrom(parse(pb.AttentionSpec, t))
        r.target.CopyFrom(target)
    try:
        resp = client._stub.Prefetch(req, timeout=timeout)
    except client._grpc.RpcError as e:
        raise client._error(e) from None
    return list(resp.results)


def _is_spec_dict(d):
    return isinstance(d, dict) and not ("mask_mod" in d or "score_mod" in d)
