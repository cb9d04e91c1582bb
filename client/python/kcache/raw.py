"""Raw kernels through kcache: LLVM IR (text or bitcode) or PTX that another compiler
wrote (Triton, a hand-written kernel), compiled to a cubin by the daemon (LLVM's NVPTX
backend, nvJitLink) and cached like any kernel.

`fetch_raw_kernel` asks the daemon and returns the KernelResult (record + cubin bytes);
it needs no GPU. `raw_kernel` also loads the cubin with the CUDA driver and returns a
RawModule: the CUfunction handles by kernel name and `launch`.

The daemon takes raw kernels only when an operator enabled them (--enable_raw_kernels)
and only from callers with its admin token: `token=`, else the client's admin token
(Client(admin_token= / admin_token_path=); default_client and the clients made for
`target=` read the file $KCACHE_ADMIN_TOKEN_PATH).
Errors: kcache.errors.PermissionDenied, RawKernelsDisabled, InvalidSpec (a ValueError;
malformed IR carries the LLVM verifier's message, `.field` "raw.source"; an unknown
kernel name "raw.kernel_names[i]"), CompileError, Unavailable, DeadlineExceeded.
"""

import ctypes
import os
import sys
import threading

from kcache import _protos

FORMATS = {"ptx": "FORMAT_PTX", "llvm_ir": "FORMAT_LLVM_IR", "llvm_bitcode": "FORMAT_LLVM_BITCODE"}


def raw_message(source, names, format="ptx"):
    """A kcache.v1.RawKernel: `source` (str or bytes), `names` (one kernel name or a list;
    their order is kept in the record's entry points and is part of the key) and `format`
    ("ptx", "llvm_ir" or "llvm_bitcode")."""
    pb = _protos.modules()[0]
    if format not in FORMATS:
        raise ValueError("format: %r is not one of %s" % (format, ", ".join(sorted(FORMATS))))
    if isinstance(source, str):
        source = source.encode()
    if not isinstance(source, (bytes, bytearray, memoryview)):
        raise ValueError("source: str or bytes, got %s" % type(source).__name__)
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError("names: one or more non-empty kernel names, got %r" % (names,))
    return pb.RawKernel(format=getattr(pb.RawKernel, FORMATS[format]), source=bytes(source),
                        kernel_names=names)


def _client(client, target):
    from kcache.client import Client, default_client
    if client is not None and target is not None:
        raise ValueError("give client or target, not both")
    if client is not None:
        return client
    if target is not None:
        # One client per daemon address, so that the memo works across calls; its admin
        # token as default_client's.
        return _clients_for(target, lambda t: Client(
            t, admin_token_path=os.environ.get("KCACHE_ADMIN_TOKEN_PATH") or None))
    return default_client()


_lock = threading.Lock()
_by_target = {}  # daemon address -> Client (guarded by _lock)


def _clients_for(target, make):
    with _lock:
        c = _by_target.get(target)
        if c is None:
            c = _by_target[target] = make(target)
        return c


def fetch_raw_kernel(source, names, *, format="ptx", arch, token=None, target=None,
                     client=None, timeout=None):
    """The daemon's cubin for a raw kernel, without a GPU: a kcache.KernelResult (.record,
    .cubin bytes, .cache_hit); the record has one entry point per name. `arch` is the
    target ("sm_80", "sm_90a"); `target` the daemon's address (default: $KCACHE_TARGET
    through kcache.default_client) or `client` a kcache.Client."""
    c = _client(client, target)
    return c.get_raw_kernel(raw_message(source, names, format), arch=arch, timeout=timeout,
                            token=token)


class RawModule:
    """A raw kernel's cubin loaded into one CUDA context: `functions` (kernel name ->
    CUfunction as an int; also `module[name]`), `result` (the KernelResult) and `launch`.
    Owned by the client that loaded it (unloaded by its close())."""

    def __init__(self, loaded, device):
        self._loaded = loaded
        self.result = loaded.result
        self.record = loaded.record
        self.context = loaded.context
        self.device = device
        self.functions = dict(loaded.functions)

    def __getitem__(self, name):
        try:
            return self.functions[name]
        except KeyError:
            raise KeyError("%r is not a kernel of this module (kernels: %s)"
                           % (name, ", ".join(self.functions))) from None

    def launch(self, name, grid, block, args, shared=0, stream=None, cluster=None):
        """Launches kernel `name` with `grid` (in blocks) and `block` (an int or up to three
        ints), `shared` bytes of dynamic shared memory, on `stream` (a CUstream as an int, a
        torch.cuda.Stream, or None: torch's current stream when torch has initialized
        CUDA, else the default stream). `args` is one value per kernel parameter:
        ctypes values as they are, else by the parameter's size as the driver reports it
        (tensors and None as pointers, ints, floats); see kcache.cuda.pack_args.

        Over 48 KiB of `shared`, the function's dynamic shared memory limit is raised to the
        device's maximum (once per kernel and context); more than the device allows is
        kcache.InvalidArgument (a ValueError) saying the maximum. Kernels that require a thread-block cluster (PTX
        .reqnctapercluster, Triton's num_ctas > 1) launch through cuLaunchKernelEx with the
        cluster shape the driver reports for them; `cluster` (an int or up to three ints)
        gives it for .explicitcluster kernels, which do not say it, or asks for clusters
        for any kernel. The grid must be a whole number of clusters."""
        from kcache import cuda
        fn = self[name]
        grid = cuda._dim3(name, "grid", grid)
        block = cuda._dim3(name, "block", block)
        if stream is None:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                stream = torch.cuda.current_stream(self.device).cuda_stream
            else:
                stream = 0
        stream = getattr(stream, "cuda_stream", stream)
        cu = cuda.lib()
        cuda.check(cu.cuCtxPushCurrent_v2(self.context), "cuCtxPushCurrent")
        try:
            values = cuda.pack_args(name, list(args), cuda.param_sizes(fn))
            cuda.launch_raw(self._loaded, name, grid, block, shared, stream, values, cluster)
        finally:
            cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def __repr__(self):
        return "RawModule(%s, %s, kernels=%s)" % (self.record.key.hex()[:16], self.record.arch,
                                                   list(self.functions))


def raw_kernel(source, names, *, format="ptx", arch=None, token=None, target=None, client=None,
               device=None, timeout=None):
    """Fetches a raw kernel's cubin (as fetch_raw_kernel) and loads it into `device`'s
    context (default: torch's current device when torch has initialized CUDA, else 0; the
    context current on this thread when it belongs to that device, else the device's
    primary context), once per (kernel, context). `arch` defaults to that device's
    ("sm_90a" on an H100/H200). Returns a RawModule. Needs the CUDA driver
    (kcache.cuda.CudaError without one)."""
    from kcache import cuda
    from kcache.client import arch_for_capability
    c = _client(client, target)
    raw = raw_message(source, names, format)
    if device is None:
        torch = sys.modules.get("torch")
        device = (torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized()
                  else 0)
    device = int(getattr(device, "index", device) or 0)
    with cuda.device_context(device) as ctx:
        if arch is None:
            arch = arch_for_capability(*cuda.device_capability(device))
        loaded = c.load_raw(raw, arch, ctx, timeout=timeout, token=token)
    return RawModule(loaded, device)
