"""kcache: finished attention kernels for PyTorch trainers, from the node daemon.

The package never compiles. `Client.get_kernel` asks kcached (gRPC over its
Unix socket) for a kernel by spec and returns the record and cubin;
`attention_forward` loads that cubin with the CUDA driver (ctypes, once per
kernel and CUDA context) and launches it on torch's current stream;
`attention` is the same with autograd (the backward spec's cubin, its
backward entry points launched in backward()). `raw_kernel` / `fetch_raw_kernel`
(kcache.raw) send LLVM IR or PTX with the daemon's admin token and return the
loaded functions / the cubin.

Imports neither torch nor the CUDA driver until they are needed. The wire
contract's Python modules are part of the package (kcache/v1, generated from
proto/ and committed; client/python/gen_protos.py refreshes them). Every error
kcache raises derives from KcacheError (kcache.errors has the tree).
"""

from kcache._version import __version__
from kcache.errors import (
    CompileError, CudaError, DeadlineExceeded, InvalidArgument, InvalidSpec, InvalidType,
    KcacheError, PermissionDenied, RawKernelsDisabled, Unavailable)
from kcache.specs import (  # noqa: E402
    Expr, alibi, buffer, causal, document, drafter, expr_mask, maximum, minimum, no_mask,
    score_expr, sliding_window, softcap, spec, where, to_spec)
from kcache.client import Client, KernelResult, default_client, arch_for_capability  # noqa: E402
from kcache.params import ABI_VERSION, AttentionParams, KcBuffer  # noqa: E402
from kcache.attention import attention_forward, validate_inputs  # noqa: E402
from kcache.autograd import attention, attention_backward  # noqa: E402
from kcache.raw import RawModule, fetch_raw_kernel, raw_kernel  # noqa: E402
from kcache.flex import (  # noqa: E402
    BlockMask, RecordedScoreMod, create_block_mask, flex_attention, record_score_mod)
from kcache.prefetch import prefetch  # noqa: E402
from kcache import _warm  # noqa: E402

_warm.start()


def __getattr__(name):
    # The index variables are Expr messages, built on first use so that the
    # package imports before the generated modules are on the path.
    if name in ("b", "h", "q_idx", "kv_idx", "score"):
        from kcache import specs
        return getattr(specs, name)
    raise AttributeError("module 'kcache' has no attribute %r" % name)


__all__ = [
    "ABI_VERSION", "AttentionParams", "BlockMask", "Client", "CompileError", "CudaError",
    "DeadlineExceeded", "Expr", "InvalidArgument", "InvalidSpec", "InvalidType", "KcBuffer",
    "KcacheError", "KernelResult", "PermissionDenied", "RecordedScoreMod", "create_block_mask",
    "flex_attention", "prefetch", "record_score_mod",
    "RawKernelsDisabled", "RawModule", "Unavailable", "alibi",
    "arch_for_capability", "attention", "attention_backward", "attention_forward", "b", "buffer", "causal", "default_client",
    "document", "drafter", "expr_mask", "fetch_raw_kernel", "h", "kv_idx", "maximum", "minimum",
    "no_mask", "q_idx", "raw_kernel",
    "score", "score_expr", "sliding_window", "softcap", "spec", "to_spec", "validate_inputs",
    "where", "__version__",
]
