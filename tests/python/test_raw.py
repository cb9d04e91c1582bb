"""Raw kernels from Python (kcache.fetch_raw_kernel, Client.get_raw_kernel) against a real
compile-only kcached with raw kernels on: the committed fixtures (tests/fixtures/raw) come
back as cubins, memoized; the daemon's refusals are PermissionDenied (no token / wrong
token), RawKernelsDisabled and InvalidSpec with the LLVM verifier's message. Also the
launch-argument packing, which needs no GPU. Loading and launching: gpu_raw.py."""

import ctypes
import os

import pytest

import kcache
from kcache import cuda

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                        "raw")
TOKEN = "py-raw-token"


def fixture(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


@pytest.fixture
def raw_daemon(make_daemon, tmpdir_short):
    path = os.path.join(tmpdir_short, "admin.token")
    with open(path, "w") as f:
        f.write(TOKEN + "\n")
    d = make_daemon(extra_args=["--enable_raw_kernels=true", "--admin_token_path=" + path])
    d.start()
    d.token_path = path
    return d


def test_fetch_raw_kernel_returns_cubins_with_one_entry_per_name(raw_daemon):
    c = kcache.Client(raw_daemon.target, admin_token_path=raw_daemon.token_path)
    cases = [("ptx", "vadd.ptx", ["kc_vadd_ptx"]), ("llvm_ir", "vadd.ll", ["kc_vadd"]),
             ("llvm_bitcode", "vadd.bc", ["kc_vadd"]),
             ("llvm_ir", "block_sum.ll", ["kc_block_sum", "kc_scale"])]
    keys = set()
    for fmt, name, names in cases:
        r = kcache.fetch_raw_kernel(fixture(name), names, format=fmt, arch="sm_80", client=c,
                                    timeout=300)
        assert r.cubin[:4] == b"\x7fELF", name
        assert not r.cache_hit and r.record.arch == "sm_80", name
        assert [e.name for e in r.record.entry_points] == names, name
        assert list(r.record.raw.kernel_names) == names, name
        assert r.record.raw.source_size == len(fixture(name)), name
        keys.add(r.key)
    assert len(keys) == len(cases)
    # str sources work too, and the same request again is memoized (no RPC).
    before = c.rpc_count
    again = kcache.fetch_raw_kernel(fixture("vadd.ptx").decode(), "kc_vadd_ptx", arch="sm_80",
                                    client=c)
    assert c.rpc_count == before and again.record.entry_points[0].name == "kc_vadd_ptx"
    # A token given per call, through the daemon's address: the daemon's stored entry.
    hit = kcache.fetch_raw_kernel(fixture("vadd.ptx"), ["kc_vadd_ptx"], arch="sm_80",
                                  target=raw_daemon.target, token=TOKEN)
    assert hit.cache_hit and hit.key == again.key
    assert c.stats().compiles == len(cases)
    c.close()


def test_no_token_or_a_wrong_token_is_permission_denied(raw_daemon):
    c = kcache.Client(raw_daemon.target)
    with pytest.raises(kcache.PermissionDenied) as e:
        kcache.fetch_raw_kernel(fixture("vadd.ptx"), "kc_vadd_ptx", arch="sm_80", client=c)
    assert "admin token" in str(e.value) and "no admin token was sent" in str(e.value)
    assert e.value.code == "PERMISSION_DENIED" and isinstance(e.value, PermissionError)
    with pytest.raises(kcache.PermissionDenied) as e:
        kcache.fetch_raw_kernel(fixture("vadd.ptx"), "kc_vadd_ptx", arch="sm_80", client=c,
                                token="not-the-token")
    assert "refused this admin token" in str(e.value)
    # Refusals are not memoized: with the token, the same request succeeds.
    r = kcache.fetch_raw_kernel(fixture("vadd.ptx"), "kc_vadd_ptx", arch="sm_80", client=c,
                                token=TOKEN)
    assert r.cubin[:4] == b"\x7fELF"
    c.close()


def test_raw_kernels_disabled_says_so(daemon):
    c = kcache.Client(daemon.target, admin_token="whatever")
    with pytest.raises(kcache.RawKernelsDisabled) as e:
        kcache.fetch_raw_kernel(fixture("vadd.ptx"), "kc_vadd_ptx", arch="sm_80", client=c)
    assert "--enable_raw_kernels" in str(e.value) and "disabled" in str(e.value)
    assert not isinstance(e.value, kcache.CompileError)
    c.close()


def test_malformed_ir_is_invalid_with_the_verifier_message(raw_daemon):
    c = kcache.Client(raw_daemon.target, admin_token=TOKEN)
    with pytest.raises(kcache.InvalidSpec) as e:
        kcache.fetch_raw_kernel(fixture("malformed_verifier.ll"), "kc_bad", format="llvm_ir",
                                arch="sm_90a", client=c)
    assert "verifier" in str(e.value) and "does not dominate all uses" in str(e.value)
    assert e.value.code == "INVALID_ARGUMENT" and e.value.field.startswith("raw")
    with pytest.raises(kcache.InvalidSpec) as e:
        kcache.fetch_raw_kernel(fixture("vadd.ll"), "kc_nope", format="llvm_ir", arch="sm_80",
                                client=c)
    assert e.value.field == "raw.kernel_names[0]"
    c.close()


def test_arguments_are_checked_before_any_rpc(raw_daemon):
    c = kcache.Client(raw_daemon.target, admin_token=TOKEN)
    with pytest.raises(ValueError, match="format"):
        kcache.fetch_raw_kernel(b"x", "k", format="cuda", arch="sm_80", client=c)
    with pytest.raises(ValueError, match="names"):
        kcache.fetch_raw_kernel(b"x", [], arch="sm_80", client=c)
    with pytest.raises(ValueError, match="admin_token_path"):
        kcache.Client(raw_daemon.target, admin_token="a", admin_token_path=raw_daemon.token_path)
    with pytest.raises(ValueError, match="admin_token_path"):
        kcache.Client(raw_daemon.target, admin_token_path="/nonexistent/token")
    assert c.rpc_count == 0
    c.close()


class FakeTensor:
    def data_ptr(self):
        return 0x7f0000001000


def test_pack_args_by_parameter_size():
    # kc_vadd_ptx(u64 a, u64 b, u64 c, u32 n)
    v = cuda.pack_args("kc_vadd_ptx", [FakeTensor(), None, 1 << 63, 1024], [8, 8, 8, 4])
    assert [type(x) for x in v] == [ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64,
                                    ctypes.c_int32]
    assert [x.value for x in v] == [0x7f0000001000, 0, 1 << 63, 1024]
    f = cuda.pack_args("k", [1.5, 2.5, ctypes.c_uint16(7)], [4, 8, 2])
    assert [type(x) for x in f] == [ctypes.c_float, ctypes.c_double, ctypes.c_uint16]
    with pytest.raises(ValueError, match="takes 4 arguments, got 3"):
        cuda.pack_args("kc_vadd_ptx", [0, 0, 0], [8, 8, 8, 4])
    with pytest.raises(ValueError, match="argument 0: 4294967296 does not fit a 4-byte"):
        cuda.pack_args("k", [1 << 32], [4])
    with pytest.raises(ValueError, match="argument 0: a 8-byte c_double for a 4-byte"):
        cuda.pack_args("k", [ctypes.c_double(1)], [4])
    with pytest.raises(ValueError, match="give a ctypes value"):
        cuda.pack_args("k", [3], None)
    assert cuda._dim3("k", "grid", 4) == (4, 1, 1)
    assert cuda._dim3("k", "block", (32, 4)) == (32, 4, 1)
    with pytest.raises(ValueError, match="block"):
        cuda._dim3("k", "block", (0,))


# Launch planning (kcache.cuda.plan_launch): shared memory against the device's maximum,
# thread-block clusters; no driver needed.
H200 = dict(max_shared_optin=232448)


def test_plan_launch_shared_memory():
    lim = cuda.FunctionLimits(static_shared=1024, **H200)
    g, b = (4, 1, 1), (128, 1, 1)
    assert cuda.plan_launch("k", g, b, 98304, lim) is None
    assert cuda.plan_launch("k", g, b, 232448 - 1024, lim) is None
    with pytest.raises(ValueError, match=r"k: shared=231425 bytes of dynamic shared memory plus "
                       r"1024 static is over this device's maximum of 232448 bytes per block"
                       r".*at most 231424 dynamic"):
        cuda.plan_launch("k", g, b, 232448 - 1023, lim)
    with pytest.raises(ValueError, match="byte count"):
        cuda.plan_launch("k", g, b, -1, lim)
    with pytest.raises(ValueError, match="byte count"):
        cuda.plan_launch("k", g, b, 1.5, lim)


def test_plan_launch_clusters():
    g, b = (8, 2, 1), (128, 1, 1)
    req = cuda.FunctionLimits(required_cluster=(2, 1, 1), **H200)
    assert cuda.plan_launch("k", g, b, 0, req) == (2, 1, 1)       # the driver's shape
    assert cuda.plan_launch("k", g, b, 0, req, cluster=2) == (2, 1, 1)
    with pytest.raises(ValueError, match=r"compiled for clusters of \(2, 1, 1\)"):
        cuda.plan_launch("k", g, b, 0, req, cluster=(4, 1, 1))
    with pytest.raises(ValueError, match="grid x=7 is not a multiple of the cluster's x=2"):
        cuda.plan_launch("k", (7, 1, 1), b, 0, req)
    explicit = cuda.FunctionLimits(cluster_must_be_set=True, **H200)
    with pytest.raises(ValueError, match=r"\.explicitcluster.*pass cluster="):
        cuda.plan_launch("k", g, b, 0, explicit)
    assert cuda.plan_launch("k", g, b, 0, explicit, cluster=(1, 2)) == (1, 2, 1)
    plain = cuda.FunctionLimits(**H200)
    assert cuda.plan_launch("k", g, b, 0, plain) is None
    assert cuda.plan_launch("k", g, b, 0, plain, cluster=1) is None  # no cluster asked
    assert cuda.plan_launch("k", g, b, 0, plain, cluster=(4, 2, 1)) == (4, 2, 1)


class FakeDriver:
    """The few driver entry points launch_raw calls, recording them."""

    def __init__(self, static_shared=0, cluster=(0, 0, 0), must=0):
        self.calls = []
        self.attrs = {1: static_shared, 10: must, 11: cluster[0], 12: cluster[1],
                      13: cluster[2]}

    def cuCtxGetDevice(self, dev):
        dev._obj.value = 0
        return 0

    def cuDeviceGetAttribute(self, out, attr, dev):
        out._obj.value = 232448 if attr == 97 else 0
        return 0

    def cuFuncGetAttribute(self, out, attr, fn):
        out._obj.value = self.attrs.get(attr, 0)
        return 0

    def cuFuncSetAttribute(self, fn, attr, value):
        self.calls.append(("set", attr, value))
        return 0

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, argv, extra):
        self.calls.append(("launch", (gx, gy, gz), (bx, by, bz), shared))
        return 0

    def cuLaunchKernelEx(self, config, fn, argv, extra):
        c = config._obj
        attrs = [(c.attrs[i].id, tuple(c.attrs[i].value.clusterDim.__getattribute__(a)
                                       for a in "xyz")) for i in range(c.numAttrs)]
        self.calls.append(("launch_ex", (c.gridDimX, c.gridDimY, c.gridDimZ),
                           (c.blockDimX, c.blockDimY, c.blockDimZ), c.sharedMemBytes,
                           attrs[0]))
        return 0


def fake_loaded(monkeypatch, driver):
    monkeypatch.setattr(cuda, "_lib", driver)
    return cuda.LoadedKernel(type("R", (), {"record": None})(), 1, [2], {"k": 0x1234})


def test_launch_raw_raises_the_shared_limit_once_per_function(monkeypatch):
    drv = FakeDriver(static_shared=1024)
    loaded = fake_loaded(monkeypatch, drv)
    vals = [ctypes.c_int32(1)]
    cuda.launch_raw(loaded, "k", (1, 1, 1), (128, 1, 1), 1024, 0, vals)
    assert drv.calls == [("launch", (1, 1, 1), (128, 1, 1), 1024)]  # under 48 KiB: nothing
    for _ in range(3):
        cuda.launch_raw(loaded, "k", (1, 1, 1), (128, 1, 1), 98304, 0, vals)
    assert [c for c in drv.calls if c[0] == "set"] == [("set", 8, 232448 - 1024)]
    with pytest.raises(ValueError, match="over this device's maximum"):
        cuda.launch_raw(loaded, "k", (1, 1, 1), (128, 1, 1), 232448, 0, vals)
    assert len(drv.calls) == 5  # the refused launch reached no driver call


def test_launch_raw_launches_required_clusters_through_launch_kernel_ex(monkeypatch):
    drv = FakeDriver(cluster=(2, 1, 1))
    loaded = fake_loaded(monkeypatch, drv)
    cuda.launch_raw(loaded, "k", (8, 1, 1), (128, 1, 1), 0, 0, [])
    assert drv.calls == [("launch_ex", (8, 1, 1), (128, 1, 1), 0,
                          (cuda.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, (2, 1, 1)))]
    drv = FakeDriver()  # no cluster compiled in; 16 blocks a cluster needs the opt-in
    loaded = fake_loaded(monkeypatch, drv)
    cuda.launch_raw(loaded, "k", (16, 1, 1), (128, 1, 1), 0, 0, [], cluster=16)
    assert drv.calls[0] == ("set", cuda.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    assert drv.calls[1][0] == "launch_ex" and drv.calls[1][4][1] == (16, 1, 1)
