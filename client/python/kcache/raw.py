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


# --- Triton ---------------------------------------------------------------------------

# Triton signature types of scalar parameters -> how its launcher passes them.
_TRITON_INTS = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16,
                "i32": ctypes.c_int32, "i64": ctypes.c_int64, "u1": ctypes.c_uint8,
                "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
                "u64": ctypes.c_uint64}


def _triton_arch(capability):
    # Triton compiles capability 90 and later for the arch-specific target (sm_90a).
    return "sm_%d%s" % (capability, "a" if capability >= 90 else "")


def _pack_triton(name, i, ty, value):
    """One argument as Triton's launcher passes a parameter of signature type `ty`."""
    import struct
    if isinstance(value, (ctypes._SimpleCData, ctypes.Structure)):
        return value
    if ty.startswith("*"):
        if value is None:
            return ctypes.c_uint64(0)
        if hasattr(value, "data_ptr"):
            return ctypes.c_uint64(value.data_ptr())
        if isinstance(value, int) and not isinstance(value, bool):
            return ctypes.c_uint64(value)
        raise ValueError("%s argument %d (%s): a tensor, a device pointer or None, got %s"
                         % (name, i, ty, type(value).__name__))
    if ty in _TRITON_INTS:
        return _TRITON_INTS[ty](int(value))
    if ty in ("fp32", "f32"):
        return ctypes.c_float(float(value))
    if ty == "fp64":
        return ctypes.c_double(float(value))
    if ty == "fp16":
        return ctypes.c_uint16(struct.unpack("<H", struct.pack("<e", float(value)))[0])
    if ty == "bf16":  # as Triton's pack_bf16: the high half of the fp32 bits
        return ctypes.c_uint16(struct.unpack("<I", struct.pack("<f", float(value)))[0] >> 16)
    raise ValueError("%s argument %d: Triton parameter type %r is not supported by "
                     "kcache.raw.from_triton (tensor descriptors and tuples are not)"
                     % (name, i, ty))


class TritonKernel:
    """A Triton kernel compiled and cached by kcache (kcache.raw.from_triton). Launch it as
    Triton's CompiledKernel: `kernel[grid](*args, stream=None)`, with one argument per
    parameter of the Triton function (constexpr ones included and ignored, as Triton's
    launcher does). Attributes: `name`, `format` ("ptx" or "llvm_ir"), `source`, `arch`,
    `num_warps`, `num_ctas`, `cluster` (None or a 3-tuple), `shared` (bytes of dynamic
    shared memory), `signature` (Triton's, or None), the scratch sizes. `fetch()` returns
    the daemon's KernelResult without a GPU; `module(device)` the loaded RawModule.
    Thread-safe."""

    def __init__(self, compiled, format, arch, token, target, client, timeout):
        if format not in ("ptx", "llvm_ir"):
            raise ValueError("format: 'ptx' or 'llvm_ir', got %r" % (format,))
        asm = getattr(compiled, "asm", None)
        md = getattr(compiled, "metadata", None)
        if asm is None or md is None:
            raise ValueError("from_triton: %s is not a Triton CompiledKernel (no asm / "
                             "metadata)" % type(compiled).__name__)
        key = "ptx" if format == "ptx" else "llir"
        if key not in asm:
            raise ValueError("from_triton: the CompiledKernel has no asm[%r] (it has %s)"
                             % (key, ", ".join(sorted(asm))))
        self.format = format
        self.source = asm[key]
        self.name = getattr(compiled, "name", None) or md.name
        target_md = getattr(md, "target", None)
        self.arch = arch or _triton_arch(int(getattr(target_md, "arch", 0) or 0) or 90)
        self.num_warps = int(md.num_warps)
        self.warp_size = int(getattr(md, "warp_size", 32) or 32)
        self.num_ctas = int(getattr(md, "num_ctas", 1) or 1)
        dims = tuple(getattr(md, "cluster_dims", None) or ())  # Triton before 3.5
        if dims and dims[0] * dims[1] * dims[2] > 1:
            self.cluster = tuple(int(d) for d in dims)
        elif self.num_ctas > 1:
            self.cluster = (self.num_ctas, 1, 1)
        else:
            self.cluster = None
        self.shared = int(md.shared)
        # Trailing parameters Triton adds after the function's own: global_scratch (3.3+),
        # then profile_scratch (3.5+); each a buffer of size * programs * ctas, or null.
        self.scratch = [(n, int(getattr(md, n + "_size")), int(getattr(md, n + "_align", 1)))
                        for n in ("global_scratch", "profile_scratch")
                        if hasattr(md, n + "_size")]
        src = getattr(compiled, "src", None)
        sig = getattr(src, "signature", None)
        self.signature = dict(sig) if isinstance(sig, dict) else None
        self._token, self._target, self._client, self._timeout = token, target, client, timeout
        self._lock = threading.Lock()
        self._modules = {}  # device ordinal -> RawModule (guarded by _lock)

    def fetch(self):
        """The daemon's KernelResult (record + cubin) for this kernel; no GPU needed."""
        return fetch_raw_kernel(self.source, [self.name], format=self.format, arch=self.arch,
                                token=self._token, target=self._target, client=self._client,
                                timeout=self._timeout)

    def module(self, device=None):
        """The RawModule of this kernel loaded on `device` (default as raw_kernel's)."""
        if device is None:
            torch = sys.modules.get("torch")
            device = (torch.cuda.current_device()
                      if torch is not None and torch.cuda.is_initialized() else 0)
        device = int(getattr(device, "index", device) or 0)
        with self._lock:
            m = self._modules.get(device)
        if m is None:
            m = raw_kernel(self.source, [self.name], format=self.format, arch=self.arch,
                           token=self._token, target=self._target, client=self._client,
                           device=device, timeout=self._timeout)
            with self._lock:
                m = self._modules.setdefault(device, m)
        return m

    def pack(self, args):
        """ctypes values for the kernel's own parameters (constexpr ones dropped)."""
        if self.signature is None:
            return list(args)  # packed by the driver's parameter sizes
        types = list(self.signature.values())
        if len(args) != len(types):
            raise ValueError("%s takes %d arguments (its Triton signature: %s), got %d"
                             % (self.name, len(types), ", ".join(self.signature), len(args)))
        out = []
        for i, (ty, a) in enumerate(zip(types, args)):
            if not isinstance(ty, str):
                raise ValueError("%s argument %d: Triton parameter type %r is not supported "
                                 "by kcache.raw.from_triton" % (self.name, i, ty))
            if ty != "constexpr":
                out.append(_pack_triton(self.name, i, ty, a))
        return out

    def launch_grid(self, grid):
        """(grid in blocks, block) of a launch of `grid` programs, as Triton's launcher
        computes them: each program is a cluster of `cluster` blocks."""
        g = (grid,) if isinstance(grid, int) else tuple(grid)
        g = g + (1,) * (3 - len(g))
        c = self.cluster or (1, 1, 1)
        return (g[0] * c[0], g[1] * c[1], g[2] * c[2]), (self.warp_size * self.num_warps, 1, 1)

    def _scratch(self, grid, device, stream):
        """The scratch arguments, allocated as Triton's launcher does (its allocators:
        triton.set_allocator / set_profile_allocator) or None when of size 0."""
        g = (grid,) if isinstance(grid, int) else tuple(grid)
        programs = 1
        for x in g:
            programs *= x
        out, keep = [], []
        for what, size, align in self.scratch:
            if size == 0:
                out.append(None)
                continue
            from triton.runtime import _allocation
            alloc = (_allocation._allocator if what == "global_scratch"
                     else _allocation._profile_allocator).get()
            buf = alloc(programs * self.num_ctas * size, align, stream)
            keep.append(buf)
            out.append(buf)
        return out, keep

    def run(self, grid, *args, stream=None, device=None):
        """Launches `grid` programs (an int or up to three ints) with `args`."""
        m = self.module(device)
        if stream is None:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                stream = torch.cuda.current_stream(m.device).cuda_stream
            else:
                stream = 0
        stream = getattr(stream, "cuda_stream", stream)
        values = self.pack(args)
        scratch, keep = self._scratch(grid, m.device, stream)
        blocks, block = self.launch_grid(grid)
        m.launch(self.name, blocks, block, values + scratch, shared=self.shared, stream=stream,
                 cluster=self.cluster)
        del keep  # Triton's allocators are stream-ordered (torch's caching allocator)

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            return self.run(grid, *args, stream=stream)
        return runner

    def __repr__(self):
        return "TritonKernel(%s, %s, %s, num_warps=%d, shared=%d, cluster=%r)" % (
            self.name, self.format, self.arch, self.num_warps, self.shared, self.cluster)


def from_triton(compiled, *, format="ptx", arch=None, token=None, target=None, client=None,
                timeout=None):
    """A Triton kernel through kcache in one call: `compiled` is a Triton CompiledKernel
    (what triton.compile returns, or what `kernel[grid](...)` returned); its PTX
    (format="ptx", asm["ptx"]) or LLVM IR (format="llvm_ir", asm["llir"]) is compiled and
    cached by the daemon for `arch` (default: the target Triton compiled for, e.g.
    "sm_90a"), with Triton's launch facts (name, num_warps, shared memory, cluster shape,
    scratch parameters). Returns a TritonKernel: `k[grid](*args)` as with Triton. Needs
    no Triton import of its own; the daemon is found as by raw_kernel (`target`, `client`,
    `token`)."""
    return TritonKernel(compiled, format, arch, token, target, client, timeout)
