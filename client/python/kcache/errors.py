"""Exceptions of the kcache package: every error kcache raises derives from KcacheError.

    KcacheError (RuntimeError)           .code: the gRPC status name where one applies
    ├── InvalidArgument (ValueError)     an input kcache refuses before any RPC; .field
    │   └── InvalidSpec                  the daemon refused the spec or target (INVALID_ARGUMENT)
    ├── InvalidType (TypeError)          a value of a type kcache cannot use (e.g. in an Expr)
    ├── CompileError                     the daemon's compile failed; .log
    ├── Unavailable (ConnectionError)    no daemon answered before the deadline
    ├── DeadlineExceeded (TimeoutError)  the kernel was not ready before the deadline
    ├── PermissionDenied (PermissionError)  raw kernels: no or wrong admin token
    ├── RawKernelsDisabled               raw kernels: the daemon does not take them
    └── CudaError                        a CUDA driver call failed, or no driver; .result

The second bases let callers keep catching the builtin kinds (ValueError for bad
input, TimeoutError, ...). Client._error is the one adapter from grpc.RpcError to
these; kcache.cuda.check the one from CUresult. This module imports nothing, so
every other module can import it.
"""

from typing import Optional


class KcacheError(RuntimeError):
    """Base of kcache's errors. `code` is the gRPC status code name when one applies."""

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.code = code


class InvalidArgument(KcacheError, ValueError):
    """An argument kcache refuses on the client side (a spec helper's value, a tensor's
    shape, dtype or alignment...); `field` names it where there is one (e.g. "q")."""

    def __init__(self, message: str, field: Optional[str] = None,
                 code: Optional[str] = "INVALID_ARGUMENT") -> None:
        super().__init__(message, code)
        self.field = field


class InvalidSpec(InvalidArgument):
    """The daemon refused the spec or target; `field` names it (e.g. "spec.head_dim_qk")."""


class InvalidType(KcacheError, TypeError):
    """A value of a type kcache cannot use: a Python object in an expression, a truth value
    asked of an Expr, a spec that is not a message, JSON text or dict."""

    def __init__(self, message: str, code: Optional[str] = "INVALID_ARGUMENT") -> None:
        super().__init__(message, code)


class CompileError(KcacheError):
    """The compile (or verification) failed; `log` holds the daemon's message and log."""

    def __init__(self, message: str, log: str = "", code: Optional[str] = "FAILED_PRECONDITION"
                 ) -> None:
        super().__init__(message, code)
        self.log = log


class Unavailable(KcacheError, ConnectionError):
    """No daemon answered (before the deadline) at the client's target."""

    def __init__(self, message: str, code: Optional[str] = "UNAVAILABLE") -> None:
        super().__init__(message, code)


class DeadlineExceeded(KcacheError, TimeoutError):
    """The daemon answered but the kernel was not ready before the deadline."""

    def __init__(self, message: str, code: Optional[str] = "DEADLINE_EXCEEDED") -> None:
        super().__init__(message, code)


class PermissionDenied(KcacheError, PermissionError):
    """The daemon refused the call: raw kernels need its admin token, which this caller
    did not send or sent wrong (the message says which)."""

    def __init__(self, message: str, code: Optional[str] = "PERMISSION_DENIED") -> None:
        super().__init__(message, code)


class RawKernelsDisabled(KcacheError):
    """The daemon does not take raw kernels (an operator enables them with
    --enable_raw_kernels)."""

    def __init__(self, message: str, code: Optional[str] = "FAILED_PRECONDITION") -> None:
        super().__init__(message, code)


class CudaError(KcacheError):
    """A CUDA driver call failed (`result` is its CUresult), the driver could not be loaded
    (`result` None), or a kernel does not match the launch ABI."""

    def __init__(self, message: str, result: Optional[int] = None) -> None:
        super().__init__(message, None)
        self.result = result


__all__ = ["CompileError", "CudaError", "DeadlineExceeded", "InvalidArgument", "InvalidSpec",
           "InvalidType", "KcacheError", "PermissionDenied", "RawKernelsDisabled",
           "Unavailable"]
