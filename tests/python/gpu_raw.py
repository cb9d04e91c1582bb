"""Raw kernels loaded and launched from Python on a GPU (CTest python_raw_gpu_test, label
gpu): kcache.raw_kernel fetches the committed fixtures' cubins from a compile-only kcached
with raw kernels on, loads them into torch's context and launches them with
RawModule.launch (arguments packed by the driver's parameter sizes); c = a + b must hold
exactly. LLVM IR is tried too: a daemon built without LLVM (the static build carried to
GPU machines) answers UNIMPLEMENTED, and that case skips. Skips, saying so, without torch
or a CUDA device. Not named test_*.py so that python_client_test (no GPU) leaves it out.

  PYTHONPATH=client/python KCACHE_TEST_KCACHED=BUILD/bin/kcached \\
    python3 -m pytest -q tests/python/gpu_raw.py
"""

import os

import pytest

import kcache

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                        "raw")
TOKEN = "gpu-raw-token"


def fixture(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


@pytest.fixture
def torch_cuda():
    try:
        import torch
    except ImportError:
        pytest.skip("no torch: raw kernel launches need torch and a GPU")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: raw kernel launches need a GPU")
    torch.cuda.init()
    return torch


@pytest.fixture
def raw_daemon(make_daemon, tmpdir_short):
    path = os.path.join(tmpdir_short, "admin.token")
    with open(path, "w") as f:
        f.write(TOKEN + "\n")
    return make_daemon(extra_args=["--enable_raw_kernels=true",
                                   "--admin_token_path=" + path]).start()


@pytest.mark.parametrize("fmt,name,kernel", [("ptx", "vadd.ptx", "kc_vadd_ptx"),
                                             ("llvm_ir", "vadd.ll", "kc_vadd")])
def test_raw_kernel_launches_vadd(torch_cuda, raw_daemon, fmt, name, kernel):
    torch = torch_cuda
    c = kcache.Client(raw_daemon.target, admin_token=TOKEN)
    try:
        try:
            m = kcache.raw_kernel(fixture(name), kernel, format=fmt, client=c, timeout=300)
        except kcache.KcacheError as e:
            if e.code == "UNIMPLEMENTED":
                pytest.skip("this kcached has no LLVM: %s" % e)
            raise
        assert list(m.functions) == [kernel] and m[kernel] != 0
        n = 1000
        a = torch.randn(n, device="cuda")
        b = torch.randn(n, device="cuda")
        out = torch.full_like(a, float("nan"))
        m.launch(kernel, (n + 255) // 256, 256, [a, b, out, n])
        torch.cuda.synchronize()
        assert torch.equal(out, a + b)
        # Loaded once per (kernel, context): a second call makes no RPC and no new module.
        rpcs = c.rpc_count
        again = kcache.raw_kernel(fixture(name), kernel, format=fmt, client=c)
        assert c.rpc_count == rpcs and again.functions == m.functions
        with pytest.raises(ValueError, match="takes 4 arguments"):
            m.launch(kernel, 1, 256, [a, b, out])
    finally:
        c.close()
