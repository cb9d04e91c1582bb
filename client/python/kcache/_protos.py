"""Finds the generated kcache/v1 Python modules and imports them.

protoc writes them as package `kcache.v1` (from the proto path), the same
top-level name as this package. The build tree's copy has kcache/v1/ but no
kcache/__init__.py, so this package stays the one Python imports, and its
__path__ is extended with every `<dir>/kcache` that holds v1/spec_pb2.py, for
<dir> in $KCACHE_PROTO_PATH (os.pathsep-separated) and then sys.path.
"""

import os
import sys


def _candidates():
    env = os.environ.get("KCACHE_PROTO_PATH", "")
    dirs = [d for d in env.split(os.pathsep) if d] + list(sys.path)
    for d in dirs:
        d = os.path.abspath(d or ".")
        # Accept the folder above kcache/v1, or kcache/ itself.
        for pkg in (os.path.join(d, "kcache"), d):
            if os.path.isfile(os.path.join(pkg, "v1", "spec_pb2.py")):
                yield pkg


def extend_package_path(path):
    """Appends the generated modules' kcache/ folders to the package path."""
    for pkg in _candidates():
        if pkg not in path:
            path.append(pkg)


def add_path(directory):
    """Makes the generated modules under `directory` importable (at run time)."""
    import kcache
    before = list(kcache.__path__)
    os.environ["KCACHE_PROTO_PATH"] = os.pathsep.join(
        [directory] + [p for p in os.environ.get("KCACHE_PROTO_PATH", "").split(os.pathsep) if p])
    extend_package_path(kcache.__path__)
    return kcache.__path__ != before


def modules():
    """(spec_pb2, record_pb2, service_pb2, service_pb2_grpc); ImportError says where to look."""
    try:
        from kcache.v1 import record_pb2, service_pb2, service_pb2_grpc, spec_pb2
    except ImportError as e:
        raise ImportError(
            "kcache: the generated protobuf modules (kcache/v1/spec_pb2.py ...) were not found "
            "(%s). Build the target kcache_python_proto and put <build>/client/python/gen on "
            "PYTHONPATH or in $KCACHE_PROTO_PATH." % e) from e
    return spec_pb2, record_pb2, service_pb2, service_pb2_grpc


__all__ = ["add_path", "extend_package_path", "modules"]
