"""The CUDA driver through ctypes (libcuda.so.1, loaded on first use): contexts,
module loading and launches. Only GPU paths import this module.

Thread-safety: the driver calls are thread-safe; this module keeps no
mutable state besides the loaded library and a cache of primary contexts.

Errors: a failed driver call, a missing driver or a kernel of another launch ABI is
kcache.CudaError (check() is the one adapter from CUresult); arguments that do not fit
a kernel are kcache.InvalidArgument (a ValueError).
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
from typing import (TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple,
                    Union, cast)

from kcache.errors import CudaError, InvalidArgument
from kcache.params import AttentionParams, check_record_abi

if TYPE_CHECKING:  # for the annotations only: kcache.client imports this module lazily
    from kcache.client import KernelResult

CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET = 10
CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH = 11   # HEIGHT 12, DEPTH 13
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CUDA_ERROR_NOT_FOUND = 500
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5
CU_CLUSTER_SCHEDULING_POLICY_SPREAD = 1
# Dynamic shared memory a launch may use without raising the function's limit.
DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024
# Blocks per cluster that need no opt-in (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED).
PORTABLE_CLUSTER_SIZE = 8
# kcache.v1.EntryRole values (proto/kcache/v1/record.proto).
ENTRY_ROLE_FORWARD = 1
ENTRY_ROLE_BACKWARD = 2               # dK, dV (and dQ into the fp32 accumulator)
ENTRY_ROLE_BACKWARD_PREPROCESS = 3    # delta = rowsum(dO * O); zeroes dq_accum
ENTRY_ROLE_BACKWARD_POSTPROCESS = 4   # dq_accum -> dQ in the dtype
ENTRY_ROLE_MASK_BUILD = 5
ENTRY_ROLE_BACKWARD_DQ = 6            # dQ without atomics (deterministic)
ENTRY_ROLE_BACKWARD_MASK_BUILD = 7    # tile classes with the backward's tiles

_lib = None
_lib_lock = threading.Lock()
_primary: Dict[int, int] = {}  # device ordinal -> retained primary CUcontext (never released)

_vp = ctypes.c_void_p
_PROTOS = {
    "cuInit": [ctypes.c_uint],
    "cuDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
    "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_vp), ctypes.c_int],
    "cuCtxGetCurrent": [ctypes.POINTER(_vp)],
    "cuCtxGetDevice": [ctypes.POINTER(ctypes.c_int)],
    "cuCtxPushCurrent_v2": [_vp],
    "cuCtxPopCurrent_v2": [ctypes.POINTER(_vp)],
    "cuModuleLoadData": [ctypes.POINTER(_vp), ctypes.c_char_p],
    "cuModuleUnload": [_vp],
    "cuModuleGetFunction": [ctypes.POINTER(_vp), _vp, ctypes.c_char_p],
    "cuFuncSetAttribute": [_vp, ctypes.c_int, ctypes.c_int],
    "cuFuncGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, _vp],
    "cuFuncGetParamInfo": [_vp, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                           ctypes.POINTER(ctypes.c_size_t)],
    "cuLaunchKernel": [_vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, _vp, ctypes.POINTER(_vp),
                       ctypes.POINTER(_vp)],
}


class _ClusterDim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttributeValue(ctypes.Union):
    # CUlaunchAttributeValue: 64 bytes, pointer-aligned (it holds pointers in other members).
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_void_p),
                ("clusterDim", _ClusterDim), ("i", ctypes.c_int)]


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


assert ctypes.sizeof(_LaunchAttribute) == 72 and ctypes.sizeof(_LaunchConfig) == 56

_PROTOS["cuLaunchKernelEx"] = [ctypes.POINTER(_LaunchConfig), _vp, ctypes.POINTER(_vp),
                               ctypes.POINTER(_vp)]


def lib() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            try:
                l_ = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise CudaError("kcache: the CUDA driver (libcuda.so.1) is not available: %s"
                                % e) from e
            for name, args in _PROTOS.items():
                f = getattr(l_, name, None)
                if f is not None:
                    f.argtypes = args
                    f.restype = ctypes.c_int
            _lib = l_
            check(_lib.cuInit(0), "cuInit")
        return _lib


def check(r: int, what: str) -> None:
    """Raises CudaError (with the CUresult and the driver's name for it) unless r is 0."""
    if r != 0:
        s = ctypes.c_char_p()
        assert _lib is not None  # r came from a call through it
        _lib.cuGetErrorString(r, ctypes.byref(s))
        raise CudaError("%s failed: CUDA error %d (%s)" % (
            what, r, s.value.decode() if s.value else "?"), r)


def device_capability(ordinal: int) -> Tuple[int, int]:
    cu = lib()
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    check(cu.cuDeviceGetAttribute(ctypes.byref(major),
                                  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev.value),
          "cuDeviceGetAttribute")
    check(cu.cuDeviceGetAttribute(ctypes.byref(minor),
                                  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev.value),
          "cuDeviceGetAttribute")
    return major.value, minor.value


def local_arch() -> str:
    """The target arch of the current context's device (else device 0)."""
    from kcache.client import arch_for_capability
    cu = lib()
    ordinal = 0
    ctx = _vp()
    if cu.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value:
        d = ctypes.c_int()
        if cu.cuCtxGetDevice(ctypes.byref(d)) == 0:
            ordinal = d.value
    return arch_for_capability(*device_capability(ordinal))


@contextlib.contextmanager
def device_context(ordinal: int) -> Iterator[int]:
    """Yields a CUcontext (int) for device `ordinal`, current on this thread: the one already
    current when it belongs to that device (torch makes the primary context current),
    else the device's primary context, pushed for the duration and popped after."""
    cu = lib()
    ctx = _vp()
    check(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value:
        d = ctypes.c_int()
        check(cu.cuCtxGetDevice(ctypes.byref(d)), "cuCtxGetDevice")
        if d.value == ordinal:
            yield int(ctx.value)
            return
    with _lib_lock:
        prim = _primary.get(ordinal)
    if prim is None:
        dev, p = ctypes.c_int(), _vp()
        check(cu.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(p), dev.value), "cuDevicePrimaryCtxRetain")
        with _lib_lock:
            prim = _primary.setdefault(ordinal, cast(int, p.value))
    check(cu.cuCtxPushCurrent_v2(prim), "cuCtxPushCurrent")
    try:
        yield prim
    finally:
        cu.cuCtxPopCurrent_v2(ctypes.byref(_vp()))


def cubin_images(blob: bytes) -> List[bytes]:
    """The ELF images of a record's cubin, in order (compiler/cuda/cubin_images.h: a module
    with backward has two, every other kernel one). Each image ends where the furthest of
    its section header table, program header table and section contents ends; the same rule
    as the C++ reader, which this must match. Raises CudaError when the bytes are not whole
    64-bit little-endian ELF images."""
    images = []
    at = 0
    while at < len(blob) or not images:
        b = blob[at:]
        if len(b) < 64 or b[:4] != b"\x7fELF" or b[4] != 2 or b[5] != 1:
            raise CudaError("cubin: image %d is not a 64-bit little-endian ELF" % len(images))
        phoff, shoff = struct.unpack_from("<QQ", b, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", b, 0x36)
        end = 64
        for off, n, entsize in ((shoff, shnum, shentsize), (phoff, phnum, phentsize)):
            if n == 0:  # an empty table's offset means nothing
                continue
            if entsize == 0 or off > len(b) or n > (len(b) - off) // entsize:
                raise CudaError("cubin: image %d's ELF tables run past its bytes" % len(images))
            end = max(end, off + n * entsize)
        if shnum and shentsize < 64:
            raise CudaError("cubin: image %d's ELF section headers are too small" % len(images))
        for i in range(shnum):
            h = shoff + i * shentsize
            if struct.unpack_from("<I", b, h + 4)[0] == 8:  # SHT_NOBITS: no bytes in the file
                continue
            off, size = struct.unpack_from("<QQ", b, h + 0x18)
            end = max(end, off + size)
        if end > len(b):
            raise CudaError("cubin: image %d's sections run past its bytes" % len(images))
        images.append(b[:end])
        at += end
    return images


class LoadedKernel:
    """A kernel's modules (one per image of its cubin) in one CUDA context: its functions
    by entry-point name, each with its dynamic shared memory limit raised to what the
    record says."""

    def __init__(self, result: KernelResult, context: int, modules: List[int],
                 functions: Dict[str, int]) -> None:
        self.result = result
        self.record = result.record
        self.context = context
        self.modules = modules
        self.functions = functions  # name -> CUfunction (int)
        # Raw launches (launch_raw): per function, its FunctionLimits, and whether its
        # dynamic shared memory limit has been raised; once per function in this context.
        self._launch_lock = threading.Lock()
        self._limits: Dict[str, FunctionLimits] = {}
        self._raised: Set[str] = set()

    def entry(self, role: int) -> Tuple[Any, Optional[int]]:
        """(EntryPoint, CUfunction) of the first entry with this role, or (None, None)."""
        for e in self.record.entry_points:
            if e.role == role:
                return e, self.functions.get(e.name)
        return None, None


def load(result: KernelResult, context: int) -> LoadedKernel:
    """Loads an attention KernelResult's cubin into `context` (current on this thread)."""
    check_record_abi(result.record)
    return _load(result, context, attention=True)


def load_raw(result: KernelResult, context: int) -> LoadedKernel:
    """Loads a raw kernel's KernelResult (no launch ABI of ours) into `context`."""
    return _load(result, context, attention=False)


def load_images(cubin: bytes) -> List[int]:
    """One module per image of `cubin` (cubin_images), loaded in order into the context current
    on this thread; the caller unloads them. On a failure those loaded so far are unloaded and
    the driver's error is raised (CudaError)."""
    cu = lib()
    modules: List[int] = []
    try:
        for blob in cubin_images(cubin):
            # The image must stay valid only for the call; the driver copies it.
            image = ctypes.create_string_buffer(blob, len(blob))
            mod = _vp()
            check(cu.cuModuleLoadData(ctypes.byref(mod), image),
                  "cuModuleLoadData (image %d)" % len(modules))
            modules.append(cast(int, mod.value))
    except BaseException:
        for m in modules:
            cu.cuModuleUnload(_vp(m))
        raise
    return modules


def find_function(modules: List[int], name: str) -> int:
    """`name` from the first of `modules` (load_images) that defines it. Any driver answer but
    CUDA_ERROR_NOT_FOUND stops the search and is raised as the driver gave it (CudaError)."""
    cu = lib()
    fn = _vp()
    r = CUDA_ERROR_NOT_FOUND
    for m in modules:
        r = cu.cuModuleGetFunction(ctypes.byref(fn), _vp(m), name.encode())
        if r != CUDA_ERROR_NOT_FOUND:
            break
    check(r, "cuModuleGetFunction(%s) in the cubin's %d image(s)" % (name, len(modules)))
    return cast(int, fn.value)


def _load(result: KernelResult, context: int, attention: bool) -> LoadedKernel:
    cu = lib()
    modules = load_images(result.cubin)
    try:
        functions: Dict[str, int] = {}
        for e in result.record.entry_points:
            fn = find_function(modules, e.name)
            if e.dynamic_smem_bytes > 48 * 1024:
                check(cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            e.dynamic_smem_bytes),
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d)"
                      % e.dynamic_smem_bytes)
            if attention:
                _check_param_size(cu, fn, e.name)
            functions[e.name] = fn
    except BaseException:
        for m in modules:
            cu.cuModuleUnload(_vp(m))
        raise
    return LoadedKernel(result, context, modules, functions)


def _check_param_size(cu, fn, name):
    """The kernel's one parameter must be exactly our AttentionParams (driver >= 12.4)."""
    f = getattr(cu, "cuFuncGetParamInfo", None)
    if f is None:
        return
    off, size = ctypes.c_size_t(), ctypes.c_size_t()
    if f(fn, 0, ctypes.byref(off), ctypes.byref(size)) != 0:
        return  # not supported by this driver: the ABI version check stands alone
    if size.value != ctypes.sizeof(AttentionParams):
        raise CudaError("%s takes a %d-byte parameter; kcache.AttentionParams is %d bytes "
                        "(launch ABI mismatch)" % (name, size.value,
                                                   ctypes.sizeof(AttentionParams)))


def unload(loaded: LoadedKernel) -> None:
    """Unloads a LoadedKernel's modules in its own context (best effort)."""
    cu = lib()
    if cu.cuCtxPushCurrent_v2(loaded.context) == 0:
        for m in loaded.modules:
            cu.cuModuleUnload(_vp(m))
        cu.cuCtxPopCurrent_v2(ctypes.byref(_vp()))


def launch(function: int, grid: Sequence[int], threads: int, smem: int, stream: int,
           params: AttentionParams) -> None:
    """cuLaunchKernel(function) with one argument, `params` (an AttentionParams) by value."""
    arg = (_vp * 1)(ctypes.cast(ctypes.pointer(params), _vp))
    check(lib().cuLaunchKernel(function, grid[0], grid[1], grid[2], threads, 1, 1, smem, stream,
                               arg, None), "cuLaunchKernel")


def param_sizes(function: int) -> Optional[List[int]]:
    """The byte size of each of a CUfunction's parameters (cuFuncGetParamInfo, driver >=
    12.4), or None where the driver cannot say."""
    cu = lib()
    f = getattr(cu, "cuFuncGetParamInfo", None)
    if f is None:
        return None
    sizes: List[int] = []
    off, size = ctypes.c_size_t(), ctypes.c_size_t()
    while f(function, len(sizes), ctypes.byref(off), ctypes.byref(size)) == 0:
        sizes.append(size.value)
    if not sizes and f(function, 0, ctypes.byref(off), ctypes.byref(size)) == 801:
        return None  # CUDA_ERROR_NOT_SUPPORTED
    return sizes


def pack_args(name: str, args: Sequence[Any], sizes: Optional[Sequence[int]]) -> List[Any]:
    """ctypes values for a kernel's arguments. ctypes instances pass as they are; without
    them the parameter sizes (param_sizes) decide: torch tensors (anything with data_ptr())
    and None are 8-byte pointers, ints are 4- or 8-byte integers, floats are float or
    double. InvalidArgument (a ValueError) naming the argument when they do not fit."""
    if sizes is not None and len(args) != len(sizes):
        raise InvalidArgument("%s takes %d arguments, got %d" % (name, len(sizes), len(args)))
    out = []
    for i, a in enumerate(args):
        size = None if sizes is None else sizes[i]
        if isinstance(a, ctypes._SimpleCData) or isinstance(a, ctypes.Structure):
            if size is not None and ctypes.sizeof(a) != size:
                raise InvalidArgument("%s argument %d: a %d-byte %s for a %d-byte parameter"
                                      % (name, i, ctypes.sizeof(a), type(a).__name__, size))
            out.append(a)
            continue
        if a is None:
            a = 0
        elif hasattr(a, "data_ptr"):
            a = a.data_ptr()
        if size is None:
            raise InvalidArgument("%s argument %d: give a ctypes value (this driver cannot report "
                                  "parameter sizes)" % (name, i))
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            raise InvalidArgument("%s argument %d: %s is not a pointer, number or ctypes value"
                                  % (name, i, type(a).__name__))
        if isinstance(a, float):
            if size not in (4, 8):
                raise InvalidArgument("%s argument %d: a float for a %d-byte parameter"
                                      % (name, i, size))
            out.append(ctypes.c_float(a) if size == 4 else ctypes.c_double(a))
            continue
        types = {4: (ctypes.c_int32, ctypes.c_uint32), 8: (ctypes.c_int64, ctypes.c_uint64),
                 2: (ctypes.c_int16, ctypes.c_uint16), 1: (ctypes.c_int8, ctypes.c_uint8)}
        if size not in types or not -(1 << (8 * size - 1)) <= a < (1 << (8 * size)):
            raise InvalidArgument("%s argument %d: %d does not fit a %d-byte parameter"
                                  % (name, i, a, size))
        out.append(types[size][0](a) if a < (1 << (8 * size - 1)) else types[size][1](a))
    return out


def _dim3(name: str, what: str, v: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    v = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(v) <= 3 or any(not isinstance(x, int) or x < 1 for x in v):
        raise InvalidArgument("%s %s: one to three positive ints, got %r" % (name, what, v))
    return v + (1,) * (3 - len(v))


def launch_packed(function: int, grid: Sequence[int], block: Sequence[int], shared: int,
                  stream: int, values: Sequence[Any]) -> None:
    """cuLaunchKernel(function) with `values` (ctypes instances, one per parameter)."""
    argv = (_vp * max(1, len(values)))(
        *[ctypes.cast(ctypes.pointer(v), _vp) for v in values])
    check(lib().cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                               shared, stream, argv, None), "cuLaunchKernel")


class FunctionLimits:
    """What the driver says about launching one CUfunction in one context: its static
    shared memory, the device's opt-in maximum of shared memory per block, and the
    thread-block cluster it requires (PTX .reqnctapercluster: `required_cluster`, a
    3-tuple or None; .explicitcluster: `cluster_must_be_set`)."""

    def __init__(self, static_shared: int = 0,
                 max_shared_optin: int = DEFAULT_DYNAMIC_SHARED_LIMIT,
                 required_cluster: Optional[Tuple[int, ...]] = None,
                 cluster_must_be_set: bool = False) -> None:
        self.static_shared = static_shared
        self.max_shared_optin = max_shared_optin
        self.required_cluster = required_cluster
        self.cluster_must_be_set = cluster_must_be_set

    def __repr__(self) -> str:
        return ("FunctionLimits(static_shared=%d, max_shared_optin=%d, required_cluster=%r, "
                "cluster_must_be_set=%r)" % (self.static_shared, self.max_shared_optin,
                                             self.required_cluster, self.cluster_must_be_set))


def function_limits(function: int) -> FunctionLimits:
    """FunctionLimits of `function` (its context current on this thread). Attributes an
    older driver does not know read as 0 (no cluster)."""
    cu = lib()

    def attr(a: int) -> int:
        v = ctypes.c_int()
        return v.value if cu.cuFuncGetAttribute(ctypes.byref(v), a, function) == 0 else 0

    dev, optin = ctypes.c_int(), ctypes.c_int()
    check(cu.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
    check(cu.cuDeviceGetAttribute(ctypes.byref(optin),
                                  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev.value),
          "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
    required = tuple(attr(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH + i) for i in range(3))
    return FunctionLimits(static_shared=attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                          max_shared_optin=max(optin.value, DEFAULT_DYNAMIC_SHARED_LIMIT),
                          required_cluster=required if all(required) else None,
                          cluster_must_be_set=bool(
                              attr(CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET)))


def plan_launch(name: str, grid: Sequence[int], block: Sequence[int], shared: int,
                limits: FunctionLimits,
                cluster: Union[None, int, Sequence[int]] = None) -> Optional[Tuple[int, ...]]:
    """Checks one launch of kernel `name` against its FunctionLimits, without the driver.
    `grid` and `block` are 3-tuples (grid in blocks, as cuLaunchKernel takes it); `cluster`
    the caller's cluster shape (an int or up to three ints) or None. Returns the cluster
    shape to launch with (the caller's, else the kernel's required one; None: no cluster).
    InvalidArgument (a ValueError) naming the kernel when `shared` is over the device's
    maximum, when a cluster is required but not known or differs from the compiled one, or
    when the grid is not a whole number of clusters."""
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise InvalidArgument("%s shared: a byte count >= 0, got %r" % (name, shared))
    if shared + limits.static_shared > limits.max_shared_optin:
        raise InvalidArgument(
            "%s: shared=%d bytes of dynamic shared memory%s is over this device's maximum of "
            "%d bytes per block (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)%s"
            % (name, shared, " plus %d static" % limits.static_shared
               if limits.static_shared else "", limits.max_shared_optin,
               "; at most %d dynamic" % (limits.max_shared_optin - limits.static_shared)
               if limits.max_shared_optin > limits.static_shared else ""))
    shape: Optional[Tuple[int, ...]] = None
    if cluster is not None:
        shape = _dim3(name, "cluster", cluster)
        if limits.required_cluster is not None and shape != tuple(limits.required_cluster):
            raise InvalidArgument("%s: cluster=%r, but the kernel was compiled for clusters "
                                  "of %r (.reqnctapercluster)"
                                  % (name, shape, tuple(limits.required_cluster)))
    elif limits.required_cluster is not None:
        shape = tuple(limits.required_cluster)
    elif limits.cluster_must_be_set:
        raise InvalidArgument("%s: the kernel requires a thread-block cluster "
                              "(.explicitcluster) and does not say its shape: pass "
                              "cluster=(x, y, z)" % name)
    if shape is not None:
        for axis, g, c in zip("xyz", grid, shape):
            if g % c:
                raise InvalidArgument("%s: grid %s=%d is not a multiple of the cluster's %s=%d "
                                      "(the grid counts blocks, a whole number of clusters)"
                                      % (name, axis, g, axis, c))
        if shape == (1, 1, 1) and not limits.cluster_must_be_set \
                and limits.required_cluster is None:
            shape = None
    return shape


def launch_raw(loaded: LoadedKernel, name: str, grid: Sequence[int], block: Sequence[int],
               shared: int, stream: int, values: Sequence[Any],
               cluster: Union[None, int, Sequence[int]] = None) -> None:
    """Launches function `name` of a LoadedKernel (its context current on this thread) with
    `values` (ctypes instances, one per parameter): checks the launch (plan_launch), raises
    the function's dynamic shared memory limit to the device's maximum when `shared` is
    over 48 KiB (once per function in this context, as Triton's launcher does), and
    launches through cuLaunchKernelEx with the cluster shape when there is one, else
    cuLaunchKernel."""
    fn = loaded.functions[name]
    with loaded._launch_lock:
        limits = loaded._limits.get(name)
        if limits is None:
            limits = loaded._limits[name] = function_limits(fn)
    cluster = plan_launch(name, grid, block, shared, limits, cluster)
    cu = lib()
    if shared > DEFAULT_DYNAMIC_SHARED_LIMIT:
        with loaded._launch_lock:
            if name not in loaded._raised:
                most = limits.max_shared_optin - limits.static_shared
                check(cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            most),
                      "%s: cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d)" % (name, most))
                loaded._raised.add(name)
    if cluster is None:
        launch_packed(fn, grid, block, shared, stream, values)
        return
    if getattr(cu, "cuLaunchKernelEx", None) is None:
        raise CudaError("%s needs a thread-block cluster launch (cuLaunchKernelEx, CUDA 12+); "
                        "this driver lacks it" % name)
    if cluster[0] * cluster[1] * cluster[2] > PORTABLE_CLUSTER_SIZE:
        check(cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
              "%s: cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)" % name)
    attrs = (_LaunchAttribute * 2)()
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attrs[0].value.clusterDim = _ClusterDim(*cluster)
    # Triton's launcher spreads a cluster's blocks over SMs; so do we, for equal timing.
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
    attrs[1].value.i = CU_CLUSTER_SCHEDULING_POLICY_SPREAD
    config = _LaunchConfig(grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                           stream, attrs, 2)
    argv = (_vp * max(1, len(values)))(
        *[ctypes.cast(ctypes.pointer(v), _vp) for v in values])
    check(cu.cuLaunchKernelEx(ctypes.byref(config), fn, argv, None),
          "%s: cuLaunchKernelEx(cluster %r)" % (name, cluster))
