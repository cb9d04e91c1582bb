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
import threading
from typing import (TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union,
                    cast)

from kcache.errors import CudaError, InvalidArgument
from kcache.params import AttentionParams, check_record_abi

if TYPE_CHECKING:  # for the annotations only: kcache.client imports this module lazily
    from kcache.client import KernelResult

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
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
    "cuFuncGetParamInfo": [_vp, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                           ctypes.POINTER(ctypes.c_size_t)],
    "cuLaunchKernel": [_vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, _vp, ctypes.POINTER(_vp),
                       ctypes.POINTER(_vp)],
}


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


class LoadedKernel:
    """A kernel's module in one CUDA context: its functions by entry-point name, each with
    its dynamic shared memory limit raised to what the record says."""

    def __init__(self, result: KernelResult, context: int, module: int,
                 functions: Dict[str, int]) -> None:
        self.result = result
        self.record = result.record
        self.context = context
        self.module = module
        self.functions = functions  # name -> CUfunction (int)

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


def _load(result: KernelResult, context: int, attention: bool) -> LoadedKernel:
    cu = lib()
    # The cubin must stay valid only for the call; the driver copies it.
    image = ctypes.create_string_buffer(result.cubin, len(result.cubin))
    mod = _vp()
    check(cu.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
    try:
        functions: Dict[str, int] = {}
        for e in result.record.entry_points:
            fn = _vp()
            check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, e.name.encode()),
                  "cuModuleGetFunction(%s)" % e.name)
            if e.dynamic_smem_bytes > 48 * 1024:
                check(cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            e.dynamic_smem_bytes),
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d)"
                      % e.dynamic_smem_bytes)
            if attention:
                _check_param_size(cu, fn, e.name)
            functions[e.name] = cast(int, fn.value)
    except BaseException:
        cu.cuModuleUnload(mod)
        raise
    return LoadedKernel(result, context, cast(int, mod.value), functions)


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
    """Unloads a LoadedKernel's module in its own context (best effort)."""
    cu = lib()
    if cu.cuCtxPushCurrent_v2(loaded.context) == 0:
        cu.cuModuleUnload(loaded.module)
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
