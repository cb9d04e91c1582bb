"""How the Python client finds the daemon and what it says when the socket is missing,
not a socket, or not permitted (kcache.client.discover_target / probe_target; the C++
twin is client/discovery.h). No daemon and no GPU needed."""
import os
import socket
import time

import pytest

import kcache
from kcache import client as kclient

SPEC = {"headDimQk": 64}  # never sent: these calls fail before any RPC


def _bound(path, listen=True):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    if listen:
        s.listen(4)
    return s


def test_discovery_order(tmpdir_short, monkeypatch):
    system = os.path.join(tmpdir_short, "run-kcached.sock")
    monkeypatch.setattr(kclient, "SYSTEM_SOCKET", system)
    monkeypatch.delenv("KCACHE_TARGET", raising=False)
    assert kclient.discover_target() == "unix:.kcache/kcached.sock"
    s = _bound(system)
    try:
        assert kclient.discover_target() == "unix:" + system          # /run beats .kcache
        monkeypatch.setenv("KCACHE_TARGET", "unix:/from/env.sock")
        assert kclient.discover_target() == "unix:/from/env.sock"     # env beats /run
        assert kclient.discover_target("host:1") == "host:1"          # explicit beats env
        monkeypatch.setenv("KCACHE_TARGET", "")
        assert kclient.discover_target() == "unix:" + system          # empty env = unset
    finally:
        s.close()


def test_client_and_default_client_discover(tmpdir_short, monkeypatch):
    target = "unix:" + os.path.join(tmpdir_short, "env.sock")
    monkeypatch.setenv("KCACHE_TARGET", target)
    c = kcache.Client()
    assert c.target == target
    c.close()
    monkeypatch.setattr(kclient, "_default", None)
    d = kclient.default_client()
    assert d.target == target
    d.close()
    monkeypatch.setattr(kclient, "_default", None)


def test_missing_socket_fails_at_once_naming_the_path(tmpdir_short):
    path = os.path.join(tmpdir_short, "none.sock")
    c = kcache.Client("unix:" + path)  # the default 600 s deadline
    t0 = time.monotonic()
    with pytest.raises(kcache.Unavailable) as ei:
        c.get_kernel(SPEC, arch="sm_80")
    assert time.monotonic() - t0 < 1.0
    msg = str(ei.value)
    assert path + " does not exist" in msg, msg
    assert "scripts/run.sh" in msg and "systemctl start kcached" in msg, msg
    assert c.rpc_count == 0
    c.close()


def test_regular_file_is_not_a_socket(tmpdir_short):
    path = os.path.join(tmpdir_short, "kcached.sock")
    with open(path, "w") as f:
        f.write("x")
    c = kcache.Client("unix:" + path)
    t0 = time.monotonic()
    with pytest.raises(kcache.Unavailable) as ei:
        c.get_kernel(SPEC, arch="sm_80")
    assert time.monotonic() - t0 < 1.0
    assert path + " exists but is not a socket" in str(ei.value)
    c.close()


def test_refusing_socket_is_retried_for_the_connect_timeout_only(tmpdir_short):
    path = os.path.join(tmpdir_short, "kcached.sock")
    s = _bound(path, listen=False)  # a daemon gone: connect is refused
    try:
        c = kcache.Client("unix:" + path, connect_timeout=0.3)
        t0 = time.monotonic()
        with pytest.raises(kcache.Unavailable) as ei:
            c.get_kernel(SPEC, arch="sm_80")
        took = time.monotonic() - t0
        assert 0.25 <= took < 2.0, took
        assert "no kcache daemon answers at unix:" + path in str(ei.value)
        c.close()
    finally:
        s.close()


def _probe_as(uid, target):
    """probe_target's message, asked as `uid` (a forked child drops to it); "" if none."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            try:
                kclient.probe_target(target, 5.0)
            except kcache.Unavailable as e:
                os.write(w, str(e).encode())
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "child could not drop to %d" % uid
    return msg


def test_socket_without_permission_says_permission_denied(tmpdir_short):
    os.chmod(tmpdir_short, 0o755)
    path = os.path.join(tmpdir_short, "kcached.sock")
    s = _bound(path)
    try:
        os.chmod(path, 0o600)
        if os.geteuid() != 0:
            os.chmod(path, 0)
            with pytest.raises(kcache.Unavailable) as ei:
                kclient.probe_target("unix:" + path, 5.0)
            msg = str(ei.value)
        else:
            # Root bypasses file permissions (and CI runs as root): ask as nobody.
            msg = _probe_as(65534, "unix:" + path)
        assert "permission denied" in msg, msg
        assert "add this user to the kcache group" in msg, msg
        assert path in msg
    finally:
        s.close()
