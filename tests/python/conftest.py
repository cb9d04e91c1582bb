"""Fixtures for the kcache Python package tests: a real kcached in compile-only mode on a
temporary store and socket (like tests/common/daemon_process.h), and the import paths.

Run by CTest (python_client_test_debian and _pypi), which sets PYTHONPATH, KCACHE_TEST_KCACHED and
KCACHE_TEST_LAYOUT_PROBE. By hand, from the repository root:

  PYTHONPATH=client/python KCACHE_TEST_KCACHED=build-X/bin/kcached \
    /usr/bin/python3 -m pytest -q tests/python
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "client", "python"))


def kcached_path():
    p = os.environ.get("KCACHE_TEST_KCACHED") or os.path.join(REPO, "build", "bin", "kcached")
    if not os.access(p, os.X_OK):
        pytest.fail("kcached not found at %s (set KCACHE_TEST_KCACHED)" % p)
    return p


class Daemon:
    """A kcached child process: store, socket and log under `dir`."""

    def __init__(self, directory, extra_args=(), compile_only=True):
        self.dir = directory
        self.extra = list(extra_args)
        self.compile_only = compile_only
        self.proc = None

    @property
    def socket(self):
        return os.path.join(self.dir, "kcached.sock")

    @property
    def target(self):
        return "unix:" + self.socket

    @property
    def log_path(self):
        return os.path.join(self.dir, "kcached.log")

    def log(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def start(self, timeout=60.0):
        import grpc
        args = [kcached_path(), "--store_path=" + os.path.join(self.dir, "store"),
                "--socket_path=" + self.socket, "--compile_threads=2",
                "--compile_only=%s" % ("true" if self.compile_only else "false")] + self.extra
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("kcached exited at start (%d):\n%s" % (self.proc.returncode,
                                                                     self.log()))
            if os.path.exists(self.socket):
                with grpc.insecure_channel(self.target) as ch:
                    try:
                        grpc.channel_ready_future(ch).result(timeout=0.5)
                        return self
                    except grpc.FutureTimeoutError:
                        pass
            else:
                time.sleep(0.02)  # the daemon is starting; nothing to wait on yet
        pytest.fail("kcached did not start within %.0f s:\n%s" % (timeout, self.log()))

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None:
            return 0
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc


@pytest.fixture
def tmpdir_short():
    # Unix socket paths must stay under ~100 bytes: a short /tmp path, not pytest's tmp_path.
    d = tempfile.mkdtemp(prefix="kcpy")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon(tmpdir_short):
    d = Daemon(tmpdir_short).start()
    yield d
    d.stop(signal.SIGKILL)


@pytest.fixture
def make_daemon(tmpdir_short):
    """Daemons that the test starts itself (e.g. after the client)."""
    made = []

    def make(**kw):
        d = Daemon(tmpdir_short, **kw)
        made.append(d)
        return d
    yield make
    for d in made:
        d.stop(signal.SIGKILL)
