"""The wire contract's generated modules, shipped inside the package (kcache/v1/).

They import google.protobuf and grpc; this indirection turns a missing runtime
into an ImportError that says what to install, and keeps the imports out of
`import kcache` until a spec or a client is built.
"""

from types import ModuleType
from typing import Tuple


def modules() -> Tuple[ModuleType, ModuleType, ModuleType, ModuleType]:
    """(spec_pb2, record_pb2, service_pb2, service_pb2_grpc)."""
    from kcache import _warm
    _warm.wait()
    try:
        from kcache.v1 import record_pb2, service_pb2, service_pb2_grpc, spec_pb2
    except ImportError as e:
        raise ImportError(
            "kcache: the protobuf modules in kcache/v1 need the protobuf (>= 4.21) and grpcio "
            "(>= 1.51) packages: %s" % e) from e
    return spec_pb2, record_pb2, service_pb2, service_pb2_grpc


__all__ = ["modules"]
