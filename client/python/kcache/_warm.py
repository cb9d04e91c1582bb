"""Loads the wire modules (grpc, protobuf and kcache/v1) on a background thread when
kcache is imported, so that a trainer's first attention call does not pay for them.

`import kcache` itself stays light (the modules are not needed to build specs, and a
machine without grpc can still import the package); the first call needs them all, and
they take 40-100 ms of CPU to import. A trainer imports kcache seconds before its first
attention call (model construction, data loading), so the imports finish in that gap.
Set KCACHE_WARM_IMPORTS=0 to turn it off: the first call then imports them itself.

Safe by construction: importlib's per-module locks make the main thread wait for (not
repeat or race) a module the thread is loading; a failed import is ignored here and
raised, with its message, where the module is really needed. The thread starts no gRPC
channel or other threads, so a later fork() inherits no gRPC state. A process that exits
while the thread is still importing waits for it at exit (atexit): a daemon thread inside
a C extension's import (grpc, protobuf) when the interpreter finalizes can crash it — the
likeliest cause of the rare SIGSEGV of `python -c "import kcache._version"` in
tests/python/test_package.py (seen twice in fresh-clone runs, not reproduced on demand).
importlib itself is imported whole before the thread starts (start() says why).
"""

import atexit
import os
import threading

# At most this long at exit for imports still running (they take 40-100 ms of CPU).
_EXIT_WAIT_S = 10.0


def _load() -> None:
    try:
        import grpc  # noqa: F401
        from kcache import _protos
        _protos.modules()
    except Exception:  # noqa: BLE001 - reported by the caller that needs the modules
        pass


_thread = None


def start() -> None:
    global _thread
    if os.environ.get("KCACHE_WARM_IMPORTS", "1") == "0":
        return
    # importlib must be whole before a second thread imports: CPython 3.11 lets a thread
    # import a submodule of importlib while the main thread is still inside importlib's
    # __init__, which puts a second, uninitialised importlib._bootstrap in sys.modules; the
    # main thread's importlib.import_module then fails with "NameError: name 'sys' is not
    # defined" (protobuf's api_implementation; ~1 % of fresh `import kcache.v1.record_pb2`).
    import importlib.machinery  # noqa: F401
    import importlib.util  # noqa: F401
    _thread = threading.Thread(target=_load, name="kcache-warm-imports", daemon=True)
    _thread.start()
    atexit.register(wait, _EXIT_WAIT_S)


def wait(timeout=None) -> None:
    """Called before the first use of the modules: a caller that arrives while the thread
    is still importing waits for it rather than contending for the same module locks
    (two threads importing at once are slower than one, under the GIL). Also at exit,
    with a timeout."""
    t = _thread
    if t is not None and t.is_alive() and t is not threading.current_thread():
        t.join(timeout)
