"""kcache.Client: gets finished kernels from the node daemon (kcached) over gRPC.

Thread-safety: a Client is safe for concurrent use from any number of
threads; it holds one gRPC channel. Concurrent identical requests share one
RPC and the answer is memoized per request (spec + target): a second call
makes no RPC. Failures are not memoized. A kernel is loaded into a CUDA
context once per (key, context) (Client.load). The client never compiles.

A missing, wrong or forbidden unix: socket fails at once (kcache.Unavailable
naming the path); while the daemon refuses (restarting) a call retries with
exponential backoff for at most connect_timeout (10 s), within its deadline. Errors are kcache.errors:
InvalidSpec (a ValueError naming the field), CompileError (with the log),
Unavailable ("no kcache daemon at ..."), DeadlineExceeded; bad arguments to
the client itself are InvalidArgument (a ValueError).

Raw kernels (get_raw_kernel, load_raw; kcache.raw has the friendlier functions) are
fetched the same way, with the daemon's admin token (admin_token or admin_token_path
here, or per call) sent as "authorization: Bearer <token>" on raw requests only; the
daemon's refusals are PermissionDenied and RawKernelsDisabled.

Progress: a kernel the daemon has to compile is asked for over GetKernelStream, and
one that is not ready after `progress_after` seconds (2 by default) is reported on the
"kcache" logger at INFO: what is compiled, for which architecture, the phase (queued
with its position, compiling, verifying), every `progress_every` seconds (10) and at
each phase change, then once more when it is ready or fails. Faster answers (a hit, a
quick compile) log nothing. Show them with logging.basicConfig(level=logging.INFO).

Ownership: loaded modules live until close() (unloaded then, in their own
contexts; close the client before destroying those contexts).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from kcache import _protos, errors
from kcache.specs import SpecLike, to_spec

if TYPE_CHECKING:  # annotations only; the modules load on first use
    from kcache.cuda import LoadedKernel
    from kcache.v1 import record_pb2, service_pb2, spec_pb2

SYSTEM_SOCKET = "/run/kcache/kcached.sock"
LOCAL_SOCKET = ".kcache/kcached.sock"
DEFAULT_TARGET = "unix:" + LOCAL_SOCKET
_START_HINT = ("start the daemon (scripts/run.sh, or systemctl start kcached) or point "
               "KCACHE_TARGET at its socket")


def discover_target(target: Optional[str] = None) -> str:
    """The daemon's gRPC target, found as every kcache client finds it (client/discovery.h):
    `target` if given; else $KCACHE_TARGET; else unix:/run/kcache/kcached.sock if that path
    exists; else unix:.kcache/kcached.sock."""
    if target:
        return target
    env = os.environ.get("KCACHE_TARGET")
    if env:
        return env
    if os.path.exists(SYSTEM_SOCKET):
        return "unix:" + SYSTEM_SOCKET
    return DEFAULT_TARGET


def _unix_path(target: str) -> Optional[str]:
    for prefix in ("unix://", "unix:"):
        if target.startswith(prefix):
            return target[len(prefix):]
    return None


def probe_target(target: str, budget: float = 10.0, reached_before: bool = False) -> None:
    """For a unix: target, a plain connect(2) to its socket before any RPC, retried while the
    daemon refuses (restarting) for at most `budget` seconds. Raises kcache.Unavailable naming
    the path and the reason (missing, not a socket, permission denied, still refusing).
    `reached_before`: the caller has talked to this daemon, so a missing socket is a restart
    (the daemon removes its socket on exit) and is waited for too, within `budget`."""
    import socket
    import stat
    import errno
    path = _unix_path(target)
    if path is None:
        return
    until = time.monotonic() + budget
    backoff = 0.02
    while True:
        try:
            st = os.stat(path)
        except PermissionError:
            raise errors.Unavailable(
                "kcache daemon socket %s: permission denied (a directory on the path may not be "
                "searched; is this user in the kcache group?)" % path) from None
        except OSError:
            if reached_before and time.monotonic() < until:  # restarting
                time.sleep(max(0.0, min(backoff, until - time.monotonic())))
                backoff = min(backoff * 2, 1.0)
                continue
            raise errors.Unavailable("no kcache daemon at %s: %s does not exist; %s"
                                     % (target, path, _START_HINT)) from None
        if not stat.S_ISSOCK(st.st_mode):
            raise errors.Unavailable("no kcache daemon at %s: %s exists but is not a socket; %s"
                                     % (target, path, _START_HINT))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(max(0.1, min(1.0, until - time.monotonic())))
            s.connect(path)
            return
        except OSError as e:
            err = e.errno
            if err in (errno.EACCES, errno.EPERM):
                raise errors.Unavailable(
                    "kcache daemon socket %s: permission denied (add this user to the kcache "
                    "group: usermod -aG kcache $USER, then log in again)" % path) from None
            transient = err in (errno.ECONNREFUSED, errno.EAGAIN, errno.ENOENT) or \
                isinstance(e, socket.timeout)
            if not transient or time.monotonic() >= until:
                raise errors.Unavailable("no kcache daemon answers at %s (%s%s): %s" % (
                    target, os.strerror(err) if err else str(e),
                    " for %gs" % budget if transient else "", _START_HINT)) from None
        finally:
            s.close()
        time.sleep(max(0.0, min(backoff, until - time.monotonic())))
        backoff = min(backoff * 2, 1.0)


def arch_for_capability(major: int, minor: int) -> str:
    """The target a device of this compute capability gets (as client/client.cc picks it):
    the arch-specific variant from 9.0 on ("sm_90a"), since the cubin runs only here."""
    return "sm_%d%d%s" % (major, minor, "a" if major >= 9 else "")


class KernelResult:
    """What get_kernel returns: the daemon's record (kcache.v1.KernelRecord), the cubin
    bytes and whether the daemon served it from its store. Shared by every caller of the
    same request: treat it as read-only."""

    __slots__ = ("record", "cubin", "cache_hit")

    def __init__(self, record: record_pb2.KernelRecord, cubin: bytes, cache_hit: bool) -> None:
        self.record, self.cubin, self.cache_hit = record, cubin, cache_hit

    @property
    def key(self) -> bytes:
        return self.record.key

    def entry(self, role: int) -> Optional[record_pb2.EntryPoint]:
        """The first EntryPoint with this role (kcache.v1.EntryRole value), or None."""
        for e in self.record.entry_points:
            if e.role == role:
                return e
        return None

    def __repr__(self) -> str:
        return "KernelResult(key=%s, arch=%s, %d bytes, cache_hit=%s, verified=%s)" % (
            self.record.key.hex()[:16], self.record.arch, len(self.cubin), self.cache_hit,
            self.record.verified)


_log = logging.getLogger("kcache")

_PHASES = {1: "queued", 2: "compiling", 3: "verifying", 4: "done", 5: "failed"}


def _describe(req) -> str:
    """What a request asks for, for progress lines: "attention bf16 d128 causal" or "raw ptx"."""
    if req.HasField("raw"):
        pb = _protos.modules()[0]
        return "raw %s kernel" % pb.RawKernel.Format.Name(req.raw.format).replace(
            "FORMAT_", "").lower()
    spec = req.spec
    pb = _protos.modules()[0]
    dtype = pb.DType.Name(spec.dtype).replace("DTYPE_", "").lower()
    mask = spec.mask.WhichOneof("kind") if spec.HasField("mask") else None
    return "attention %s d%d%s%s" % (dtype, spec.head_dim_qk, " " + mask if mask else "",
                                     " backward" if spec.backward else "")


class _Progress:
    """Logs a compile that takes longer than `after` seconds (see the module's docstring).

    Events come from the thread reading the stream; the timer runs on its own thread.
    """

    def __init__(self, req, target: str, after: float, every: float) -> None:
        self._what = "%s for %s" % (_describe(req), req.target.arch or
                                    "device %d" % req.target.device)
        self._target = target
        self._every = every
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._phase = "waiting"   # guarded by _lock
        self._logged = False      # guarded by _lock
        self._stopped = False     # guarded by _lock
        self._timer: Optional[threading.Timer] = None
        self._arm(after)

    def _arm(self, delay: float) -> None:
        t = threading.Timer(delay, self._tick)
        t.daemon = True
        with self._lock:
            if self._stopped:
                return
            self._timer = t
        t.start()

    def _line(self) -> str:
        return "%s: %s (%.0f s)" % (self._what, self._phase,
                                             time.monotonic() - self._start)

    def _tick(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._logged = True
            line = self._line()
        _log.info("%s; daemon %s", line, self._target)
        self._arm(self._every)

    def update(self, progress) -> None:
        phase = _PHASES.get(progress.phase, "waiting")
        if progress.phase == 1:
            phase = "queued, %d ahead on %s" % (progress.queue_position, progress.queue)
        elif progress.queue:
            phase = "%s on %s" % (phase, progress.queue)
        with self._lock:
            changed = phase != self._phase
            self._phase = phase
            log = changed and self._logged and not self._stopped
            line = self._line()
        if log:
            _log.info("%s", line)

    def stop(self, outcome: Optional[str]) -> None:
        """Ends the reports; `outcome` ("ready", "failed: ...") is logged if anything was."""
        with self._lock:
            self._stopped = True
            timer, logged = self._timer, self._logged
        if timer is not None:
            timer.cancel()
        if logged and outcome:
            _log.info("%s: %s after %.1f s", self._what, outcome,
                      time.monotonic() - self._start)


class _Flight:
    """One in-progress fetch or load; its waiters share the outcome."""

    __slots__ = ("done", "value", "error")

    def __init__(self):
        self.done = threading.Event()
        self.value = None
        self.error = None


_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*)\s*:")


class Client:
    def __init__(self, target: Optional[str] = None, *, default_timeout: float = 600.0,
                 initial_backoff: float = 0.02, max_backoff: float = 1.0,
                 connect_timeout: float = 10.0,
                 max_message_bytes: int = 64 << 20, admin_token: Optional[str] = None,
                 admin_token_path: Optional[str] = None, progress_after: float = 2.0,
                 progress_every: float = 10.0) -> None:
        """`admin_token` (or a file holding it, `admin_token_path`, read here with surrounding
        whitespace stripped as kcached reads its own) is sent with raw-kernel requests only.
        Without `target` the daemon is found by discover_target(). Before any RPC a unix:
        socket is checked (probe_target); `connect_timeout` bounds the wait for a daemon that
        refuses (restarting), separately from the compile deadline. A compile not done after
        `progress_after` seconds is reported on the "kcache" logger every `progress_every`
        seconds (module docstring)."""
        from kcache import _warm
        _warm.wait()
        import grpc
        if target is None:
            target = discover_target()
        if not target:
            raise errors.InvalidArgument("target: empty", "target")
        if admin_token and admin_token_path:
            raise errors.InvalidArgument(
                "admin_token_path: give admin_token or admin_token_path, not both",
                "admin_token_path")
        if admin_token_path:
            try:
                with open(admin_token_path, "rb") as f:
                    admin_token = f.read().decode().strip()
            except OSError as e:
                raise errors.InvalidArgument("admin_token_path: cannot read %s: %s"
                                             % (admin_token_path, e), "admin_token_path") from e
            if not admin_token:
                raise errors.InvalidArgument("admin_token_path: %s is empty" % admin_token_path,
                                             "admin_token_path")
        self.admin_token = admin_token or None
        self._grpc = grpc
        _, _, self._service_pb2, self._service_grpc = _protos.modules()
        self.target = target
        self.default_timeout = float(default_timeout)
        self.initial_backoff = float(initial_backoff)
        self.max_backoff = float(max_backoff)
        self.connect_timeout = float(connect_timeout)
        self.progress_after = float(progress_after)
        self.progress_every = float(progress_every)
        self._reached = False  # the daemon answered once: a missing socket later is a restart
        self._channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # Reconnect quickly after a daemon restart; our own loop backs off.
            ("grpc.initial_reconnect_backoff_ms", 20),
            ("grpc.min_reconnect_backoff_ms", 20),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ])
        self._stub = self._service_grpc.KernelServiceStub(self._channel)
        self._admin = self._service_grpc.AdminServiceStub(self._channel)
        self._lock = threading.Lock()
        # deterministic request bytes -> _Flight                        (guarded by _lock)
        self._fetches: Dict[bytes, _Flight] = {}
        # (record key, CUcontext) -> _Flight                            (guarded by _lock)
        self._loads: Dict[Tuple[bytes, int], _Flight] = {}
        self._rpcs = 0      # GetKernel attempts                        (guarded by _lock)
        self._closed = False

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Unloads every module this client loaded and closes the channel."""
        with self._lock:
            loads, self._loads = list(self._loads.values()), {}
            self._closed = True
        if loads:
            from kcache import cuda
            for f in loads:
                if f.done.is_set() and f.value is not None:
                    cuda.unload(f.value)
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def rpc_count(self) -> int:
        """GetKernel RPCs (attempts) this client has made; for tests and metrics."""
        with self._lock:
            return self._rpcs

    # -- fetching ---------------------------------------------------------
    def _target(self, arch: Optional[str], device: Optional[int],
                driver_version: int) -> spec_pb2.Target:
        pb = _protos.modules()[0]
        t = pb.Target()
        if arch is not None and device is not None:
            raise errors.InvalidArgument("get_kernel: give arch or device, not both", "arch")
        if arch is not None:
            t.arch = arch
        elif device is not None:
            t.device = int(device)  # the daemon's ordinal on this node
        else:
            from kcache import cuda
            t.arch = cuda.local_arch()
        if driver_version:
            t.driver_version = int(driver_version)
        return t

    def get_kernel(self, spec: SpecLike, arch: Optional[str] = None,
                   device: Optional[int] = None, timeout: Optional[float] = None,
                   driver_version: int = 0) -> KernelResult:
        """The finished kernel for `spec` (AttentionSpec, JSON text or dict) and a target:
        `arch` ("sm_80", "sm_90a"...), `device` (an ordinal of the daemon's node), or neither
        (this machine's current GPU). Waits up to `timeout` seconds (default_timeout when
        None) for a hit or the daemon's compile. Returns a KernelResult, memoized."""
        req = self._service_pb2.GetKernelRequest()
        req.spec.CopyFrom(to_spec(spec))
        req.target.CopyFrom(self._target(arch, device, driver_version))
        return self._fetch(req, timeout)

    def get_raw_kernel(self, raw: spec_pb2.RawKernel, arch: Optional[str] = None,
                       device: Optional[int] = None, timeout: Optional[float] = None,
                       driver_version: int = 0, token: Optional[str] = None) -> KernelResult:
        """The cubin for a raw kernel (a kcache.v1.RawKernel: LLVM IR text or bitcode or PTX,
        and the kernel names to export; kcache.raw.raw_message builds one) and a target as
        for get_kernel. `token` (default: this client's admin token) is sent as
        "authorization: Bearer <token>". Returns a KernelResult, memoized per request (the
        memo keeps the source while the client lives); its record has one entry point per
        kernel name and no launch facts. Errors: PermissionDenied (no token / refused),
        RawKernelsDisabled, InvalidSpec (e.g. field "raw.source" with the LLVM verifier's
        message), CompileError, Unavailable, DeadlineExceeded."""
        req = self._service_pb2.GetKernelRequest()
        req.raw.CopyFrom(raw)
        req.target.CopyFrom(self._target(arch, device, driver_version))
        return self._fetch(req, timeout, token=token or self.admin_token)

    def _fetch(self, req, timeout, token=None):
        memo = req.SerializeToString(deterministic=True)
        deadline = time.monotonic() + (self.default_timeout if timeout is None else float(timeout))
        with self._lock:
            flight = self._fetches.get(memo)
            leader = flight is None
            if leader:
                flight = self._fetches[memo] = _Flight()
        if leader:
            try:
                resp = self._call(req, deadline, token)
                flight.value = KernelResult(resp.record, resp.cubin, resp.cache_hit)
            except BaseException as e:
                flight.error = e
                with self._lock:
                    self._fetches.pop(memo, None)  # the next call asks again
            finally:
                flight.done.set()
        elif not flight.done.wait(max(0.0, deadline - time.monotonic())):
            raise errors.DeadlineExceeded(
                "kcache: waiting for another thread's request for this kernel passed the deadline")
        if flight.error is not None:
            raise flight.error
        return flight.value

    def _call(self, req, deadline, token=None):
        grpc = self._grpc
        raw = req.HasField("raw")
        # The admin token goes only with raw requests.
        metadata = (("authorization", "Bearer " + token),) if raw and token else None
        backoff = self.initial_backoff
        last = None
        unavailable_since = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # Fails at once for a missing, wrong or forbidden socket; waits at most
            # connect_timeout for one that refuses. Then the RPC has the compile deadline.
            probe_target(self.target, min(self.connect_timeout, remaining), self._reached)
            self._reached = True
            with self._lock:
                self._rpcs += 1
            try:
                return self._get_kernel(req, remaining, metadata)
            except grpc.RpcError as e:
                code = e.code()
                # CANCELLED too: this client never cancels a call, so it is the daemon
                # cutting calls off while it shuts down (GetKernel is idempotent).
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                grpc.StatusCode.CANCELLED):
                    raise self._error(e, raw=raw, token_sent=bool(metadata)) from None
                last = e
                if code == grpc.StatusCode.UNAVAILABLE:
                    # A daemon that stays unavailable is bounded by connect_timeout, not by
                    # the compile deadline.
                    now = time.monotonic()
                    unavailable_since = unavailable_since or now
                    if now - unavailable_since >= self.connect_timeout:
                        break
                else:
                    unavailable_since = None
                wait = backoff
                for k, v in (e.trailing_metadata() or ()):
                    if k == "retry-after-ms":  # a server hint wins over our own backoff
                        try:
                            wait = min(max(int(v), 1), 10000) / 1000.0
                        except ValueError:
                            pass
                if time.monotonic() + wait >= deadline:
                    break
                time.sleep(wait)
                backoff = min(backoff * 2, self.max_backoff)
        if last is not None and last.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise errors.KcacheError("kcache daemon at %s is overloaded: %s" % (
                self.target, last.details()), "RESOURCE_EXHAUSTED")
        raise errors.Unavailable("no kcache daemon at %s answered before the deadline%s" % (
            self.target, ": " + last.details() if last is not None else ""))

    def _get_kernel(self, req, timeout, metadata):
        """One GetKernelStream call: its result (a GetKernelResponse), reporting the progress
        of a compile that outlasts progress_after; a failed call raises its grpc.RpcError."""
        stream = self._stub.GetKernelStream(req, timeout=timeout, metadata=metadata)
        progress = None
        outcome = None
        try:
            for event in stream:
                if event.HasField("result"):
                    outcome = "ready"
                    return event.result
                if progress is None:  # a miss: the daemon compiles, or waits for a compile
                    progress = _Progress(req, self.target, self.progress_after,
                                         self.progress_every)
                progress.update(event.progress)
        except self._grpc.RpcError as e:
            outcome = "failed: %s" % (e.details() or e.code().name)
            raise
        finally:
            if progress is not None:
                progress.stop(outcome)
        raise errors.KcacheError("kcache: the daemon at %s ended GetKernelStream without a "
                                 "result" % self.target, "INTERNAL")

    def _error(self, e, raw=False, token_sent=False):
        """The one adapter from grpc.RpcError to kcache.errors."""
        grpc = self._grpc
        code, msg = e.code(), e.details() or ""
        if code == grpc.StatusCode.PERMISSION_DENIED:
            hint = ""
            if raw:
                hint = (" (the daemon refused this admin token)" if token_sent else
                        " (no admin token was sent: pass token=, or give the Client "
                        "admin_token / admin_token_path)")
            return errors.PermissionDenied("kcache: permission denied by the daemon at %s: %s%s"
                                           % (self.target, msg, hint))
        # The daemon answers FAILED_PRECONDITION both for a failed compile and for raw
        # kernels switched off; only the latter names the flag.
        if raw and code == grpc.StatusCode.FAILED_PRECONDITION and "--enable_raw_kernels" in msg:
            return errors.RawKernelsDisabled("kcache: the daemon at %s does not take raw kernels: "
                                             "%s" % (self.target, msg))
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            m = _FIELD.match(msg)
            return errors.InvalidSpec("kcache: invalid request: " + msg, m.group(1) if m else None)
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return errors.CompileError("kcache: the kernel failed to build: " + msg, log=msg)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.DeadlineExceeded("kcache: the kernel was not ready before the deadline "
                                           "(daemon at %s): %s" % (self.target, msg))
        if code == grpc.StatusCode.UNAVAILABLE:
            return errors.Unavailable("no kcache daemon at %s: %s" % (self.target, msg))
        return errors.KcacheError("kcache: %s: %s" % (code.name, msg), code.name)

    # -- loading ----------------------------------------------------------
    def load(self, spec: SpecLike, arch: Optional[str], context: int,
             timeout: Optional[float] = None) -> LoadedKernel:
        """get_kernel, then load the cubin into `context` (a CUcontext, current on this
        thread), once per (key, context). Returns a kcache.cuda.LoadedKernel."""
        from kcache import cuda
        return self._load(self.get_kernel(spec, arch=arch, timeout=timeout), context, cuda.load)

    def load_raw(self, raw: spec_pb2.RawKernel, arch: Optional[str], context: int,
                 timeout: Optional[float] = None, token: Optional[str] = None) -> LoadedKernel:
        """get_raw_kernel, then load the cubin into `context` (current on this thread), once
        per (key, context). Returns a kcache.cuda.LoadedKernel whose functions are by kernel
        name."""
        from kcache import cuda
        result = self.get_raw_kernel(raw, arch=arch, timeout=timeout, token=token)
        return self._load(result, context, cuda.load_raw)

    def _load(self, result, context, loader):
        memo = (result.record.key, int(context))
        with self._lock:
            if self._closed:
                raise errors.KcacheError("kcache.Client: closed", "FAILED_PRECONDITION")
            flight = self._loads.get(memo)
            leader = flight is None
            if leader:
                flight = self._loads[memo] = _Flight()
        if leader:
            try:
                flight.value = loader(result, context)
            except BaseException as e:
                flight.error = e
                with self._lock:
                    self._loads.pop(memo, None)
            finally:
                flight.done.set()
        else:
            flight.done.wait()  # a module load is short and bounded
        if flight.error is not None:
            raise flight.error
        return flight.value

    # -- admin ------------------------------------------------------------
    def stats(self, timeout: float = 30.0) -> service_pb2.StatsResponse:
        """The daemon's AdminService.Stats (kcache.v1.StatsResponse)."""
        try:
            return self._admin.Stats(self._service_pb2.StatsRequest(), timeout=timeout)
        except self._grpc.RpcError as e:
            raise self._error(e) from None


_default: Optional[Client] = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """A process-wide Client for the daemon discover_target() finds ($KCACHE_TARGET, else
    /run/kcache/kcached.sock if it exists, else .kcache/kcached.sock), with the admin token
    (raw kernels only) from the file $KCACHE_ADMIN_TOKEN_PATH when set."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client(discover_target(),
                              admin_token_path=os.environ.get("KCACHE_ADMIN_TOKEN_PATH") or None)
        return _default
