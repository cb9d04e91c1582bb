"""Exceptions of the kcache package: one per gRPC outcome a trainer acts on.

Client._raise_for is the one adapter from grpc.RpcError to these.
"""


class KcacheError(RuntimeError):
    """Base of kcache's errors. `code` is the gRPC status code name when one applies."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class InvalidSpec(KcacheError, ValueError):
    """The daemon refused the spec or target; `field` names it (e.g. "spec.head_dim_qk")."""

    def __init__(self, message, field=None, code="INVALID_ARGUMENT"):
        super().__init__(message, code)
        self.field = field


class CompileError(KcacheError):
    """The compile (or verification) failed; `log` holds the daemon's message and log."""

    def __init__(self, message, log="", code="FAILED_PRECONDITION"):
        super().__init__(message, code)
        self.log = log


class Unavailable(KcacheError, ConnectionError):
    """No daemon answered (before the deadline) at the client's target."""

    def __init__(self, message, code="UNAVAILABLE"):
        super().__init__(message, code)


class DeadlineExceeded(KcacheError, TimeoutError):
    """The daemon answered but the kernel was not ready before the deadline."""

    def __init__(self, message, code="DEADLINE_EXCEEDED"):
        super().__init__(message, code)


class PermissionDenied(KcacheError, PermissionError):
    """The daemon refused the call: raw kernels need its admin token, which this caller
    did not send or sent wrong (the message says which)."""

    def __init__(self, message, code="PERMISSION_DENIED"):
        super().__init__(message, code)


class RawKernelsDisabled(KcacheError):
    """The daemon does not take raw kernels (an operator enables them with
    --enable_raw_kernels)."""

    def __init__(self, message, code="FAILED_PRECONDITION"):
        super().__init__(message, code)
