"""Triton kernels through kcache without a GPU (CI):

- the committed fixtures under tests/fixtures/raw/triton (PTX and LLVM IR that Triton 3.6
  writes for kernels.py) are what that Triton writes today (generate.py --check);
- kcache.raw.from_triton takes a Triton CompiledKernel, and the daemon compiles and caches
  its PTX and its LLVM IR for the target Triton compiled for;
- from_triton's launch facts (grid, block, clusters, shared memory, scratch parameters,
  argument packing) from a stand-in CompiledKernel, which needs no Triton.

The tests that need Triton skip, saying so, where it is not importable (CTest's "debian"
environment); they run in the "pypi" one (scripts/python-env.sh: triton 3.6.0), as
python_client_test_pypi. Launching on a GPU: tests/python/gpu_triton.py.
"""

import ctypes
import json
import os
import sys
import types

import pytest

import kcache
from kcache import raw

HERE = os.path.dirname(os.path.abspath(__file__))
TRITON_DIR = os.path.join(os.path.dirname(HERE), "fixtures", "raw", "triton")
TOKEN = "py-triton-token"

try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except Exception as e:  # ImportError, or a Triton that fails to import here
    HAVE_TRITON = False
    WHY = "triton is not importable under %s (%s: %s); the pypi environment " \
          "(scripts/python-env.sh, triton 3.6.0) runs these" % (sys.executable,
                                                                 type(e).__name__, e)

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason=WHY if not HAVE_TRITON else "")


def manifest():
    with open(os.path.join(TRITON_DIR, "manifest.json")) as f:
        return json.load(f)


def generate_module():
    sys.path.insert(0, TRITON_DIR)
    import generate
    import kernels
    return generate, kernels


@needs_triton
def test_committed_fixtures_are_what_triton_writes_today(monkeypatch, tmp_path):
    import triton
    m = manifest()
    assert triton.__version__ == m["triton_version"], (
        "Triton %s here, the fixtures are from Triton %s: run tests/fixtures/raw/triton/"
        "generate.py with that release, or regenerate and commit them" %
        (triton.__version__, m["triton_version"]))
    generate, _ = generate_module()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compile, do not replay
    now = generate.outputs()
    differ = []
    for name, text in sorted(now.items()):
        with open(os.path.join(TRITON_DIR, name)) as f:
            if f.read() != text:
                differ.append(name)
    assert not differ, ("differ from what Triton %s writes for kernels.py now (regenerate "
                        "with generate.py and commit): %s" % (triton.__version__, differ))


@pytest.fixture
def raw_daemon(make_daemon, tmpdir_short):
    path = os.path.join(tmpdir_short, "admin.token")
    with open(path, "w") as f:
        f.write(TOKEN + "\n")
    d = make_daemon(extra_args=["--enable_raw_kernels=true", "--admin_token_path=" + path])
    d.start()
    return d


@needs_triton
def test_from_triton_compiles_ptx_and_llvm_ir_through_kcache(raw_daemon, monkeypatch, tmp_path):
    _, kernels = generate_module()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    c = kcache.Client(raw_daemon.target, admin_token=TOKEN)
    for base, fx in sorted(manifest()["fixtures"].items()):
        name, cap = base.rsplit(".", 1)
        compiled = kernels.compile(name, 90 if cap == "sm90a" else 80)
        for fmt in ("ptx", "llvm_ir"):
            k = raw.from_triton(compiled, format=fmt, client=c, timeout=300)
            assert (k.name, k.arch, k.shared, k.num_ctas) == (
                fx["kernel"], fx["arch"], fx["shared"], fx["num_ctas"]), base
            r = k.fetch()
            assert r.cubin[:4] == b"\x7fELF", (base, fmt)
            assert r.record.arch == fx["arch"] and not r.cache_hit, (base, fmt)
            assert [e.name for e in r.record.entry_points] == [fx["kernel"]], (base, fmt)
    # The same kernel again, from another TritonKernel: the daemon's stored entry.
    compiled = kernels.compile("add_kernel", 90)
    again = raw.from_triton(compiled, format="llvm_ir",
                            client=kcache.Client(raw_daemon.target, admin_token=TOKEN)).fetch()
    assert again.cache_hit


def fake_compiled(**md):
    """A stand-in for a Triton 3.6 CompiledKernel: name, asm, metadata, src.signature."""
    base = dict(name="k", num_warps=8, num_ctas=1, shared=98304, warp_size=32,
                global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                profile_scratch_align=1, target=types.SimpleNamespace(arch=90))
    base.update(md)
    sig = {"a": "*bf16", "n": "i32", "x": "fp32", "h": "fp16", "b": "bf16", "BLOCK": "constexpr",
           "u": "u64"}
    return types.SimpleNamespace(name="k", asm={"ptx": ".entry k", "llir": "define"},
                                 metadata=types.SimpleNamespace(**base),
                                 src=types.SimpleNamespace(signature=sig))


class FakeTensor:
    def data_ptr(self):
        return 0x7f0000002000


def test_from_triton_launch_facts_without_triton():
    k = raw.from_triton(fake_compiled(), client=object())
    assert (k.name, k.arch, k.format, k.shared, k.cluster) == ("k", "sm_90a", "ptx", 98304, None)
    assert k.launch_grid((4, 2)) == ((4, 2, 1), (256, 1, 1))
    assert [s[0] for s in k.scratch] == ["global_scratch", "profile_scratch"]
    v = k.pack([FakeTensor(), 7, 1.5, 1.5, 1.5, 1024, 1 << 63])
    assert [type(x) for x in v] == [ctypes.c_uint64, ctypes.c_int32, ctypes.c_float,
                                    ctypes.c_uint16, ctypes.c_uint16, ctypes.c_uint64]
    assert v[0].value == 0x7f0000002000 and v[1].value == 7
    assert v[3].value == 0x3e00 and v[4].value == 0x3fc0  # 1.5 in fp16 and bf16
    with pytest.raises(ValueError, match="takes 7 arguments"):
        k.pack([1, 2])
    # num_ctas=2: clusters of two blocks along x, and the grid counts programs (clusters).
    c = raw.from_triton(fake_compiled(num_ctas=2), format="llvm_ir", client=object())
    assert c.cluster == (2, 1, 1) and c.format == "llvm_ir"
    assert c.launch_grid(3) == ((6, 1, 1), (256, 1, 1))
    # Before Triton 3.5 the cluster shape was metadata.cluster_dims.
    old = raw.from_triton(fake_compiled(cluster_dims=(1, 2, 1)), client=object())
    assert old.cluster == (1, 2, 1) and old.launch_grid((4, 4)) == ((4, 8, 1), (256, 1, 1))
    sm80 = raw.from_triton(fake_compiled(target=types.SimpleNamespace(arch=80)), client=object())
    assert sm80.arch == "sm_80"
    with pytest.raises(ValueError, match="not a Triton CompiledKernel"):
        raw.from_triton(object())
    with pytest.raises(ValueError, match="format"):
        raw.from_triton(fake_compiled(), format="cubin")
