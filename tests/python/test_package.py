"""The kcache package as users get it: `pip install` of client/python into a fresh virtual
environment, then an exchange with a real compile-only kcached from that environment; the
version, the exception hierarchy and the module graph (no import cycles).

The environment is made from the interpreter running the tests (python -m venv --without-pip)
and sees that interpreter's site-packages through a .pth file, so grpcio, protobuf, pip and
setuptools come from there (with --system-site-packages a venv made from a venv would see the
base interpreter's instead). The install is offline: --no-deps --no-build-isolation --no-index.
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from conftest import REPO

PKG_SRC = os.path.join(REPO, "client", "python")
KCACHE_DIR = os.path.join(PKG_SRC, "kcache")


def _clean_env(**extra):
    """The environment for child interpreters: nothing that points back into the repo."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE")
           and not k.startswith("PIP_")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def _run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=kw.pop("timeout", 300),
                       **kw)
    if p.returncode:
        pytest.fail("%s exited %d:\n%s\n%s" % (" ".join(args)[:300], p.returncode, p.stdout,
                                                p.stderr), pytrace=False)
    return p.stdout


def _source_version():
    ns = {}
    with open(os.path.join(KCACHE_DIR, "_version.py")) as f:
        exec(f.read(), ns)  # noqa: S102 (our own one-line file)
    return ns["__version__"]


@pytest.fixture
def venv(tmp_path):
    """A fresh virtual environment with client/python pip-installed; yields its python."""
    src = tmp_path / "src"
    # A copy: pip builds in the source tree (build/, *.egg-info), and the repo stays clean.
    shutil.copytree(PKG_SRC, src, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "*.pyc"))
    env_dir = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], env=_clean_env())
    py = str(env_dir / "bin" / "python")
    purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   env=_clean_env()).strip()
    outer = [p for p in sys.path if os.path.isdir(p) and os.path.basename(p) in
             ("site-packages", "dist-packages") and not p.startswith(REPO)]
    outer += [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    with open(os.path.join(purelib, "_kcache_test_outer.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys(outer)) + "\n")
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "--no-cache-dir", str(src)], env=_clean_env(), cwd=str(tmp_path))
    yield py


PROBE = textwrap.dedent("""
    import hashlib, json, sys
    import google.protobuf, grpc
    import kcache
    from kcache.v1 import record_pb2, spec_pb2  # the generated modules ship in the package
    import os
    out = {"file": kcache.__file__, "prefix": sys.prefix, "version": kcache.__version__,
           "runtimes": [google.protobuf.__version__, grpc.__version__],
           "typed": [os.path.isfile(os.path.join(os.path.dirname(m.__file__), f)) for m, f in
                     ((kcache, "py.typed"), (spec_pb2, "spec_pb2.pyi"))]}
    spec = kcache.spec(dtype="bf16", head_dim=128, q_heads=8, kv_heads=2, mask=kcache.causal())
    with kcache.Client(sys.argv[1]) as c:
        r = c.get_kernel(spec, arch="sm_90a", timeout=300)
        rec = r.record
        out.update(arch=rec.arch, elf=r.cubin[:4] == b"\\x7fELF",
                   sha_ok=rec.cubin_sha256 == hashlib.sha256(r.cubin).digest(),
                   size_ok=rec.cubin_size == len(r.cubin), abi=rec.abi_version,
                   package_abi=kcache.ABI_VERSION, cache_hit=r.cache_hit,
                   entries=sorted(e.name for e in rec.entry_points),
                   kv_heads=rec.spec.num_kv_heads, record_type=type(rec).__module__)
        # Outside the envelope (head dim 96): the daemon's INVALID_ARGUMENT, as InvalidSpec.
        try:
            c.get_kernel(kcache.spec(dtype="bf16", head_dim=96, q_heads=8), arch="sm_90a",
                         timeout=60)
            out["refused"] = None
        except kcache.KcacheError as e:
            out["refused"] = [type(e).__name__, e.field, e.code, isinstance(e, ValueError)]
    print(json.dumps(out))
""")


def test_pip_install_into_a_fresh_venv_then_get_kernel(venv, daemon, tmp_path):
    # From a folder outside the repo, with no PYTHONPATH: only the installed copy is found.
    out = json.loads(_run([venv, "-c", PROBE, daemon.target], env=_clean_env(),
                          cwd=str(tmp_path)).strip().splitlines()[-1])
    assert out["file"].startswith(out["prefix"]) and "site-packages" in out["file"], out
    assert out["version"] == _source_version()
    import google.protobuf
    import grpc
    # The runtimes of the interpreter running the tests (Debian's 4.21 / 1.51, or newer).
    assert out["runtimes"] == [google.protobuf.__version__, grpc.__version__]
    assert out["typed"] == [True, True]  # py.typed and the protobuf stubs are installed
    assert out["arch"] == "sm_90a"
    assert out["elf"] and out["sha_ok"] and out["size_ok"], out
    assert out["abi"] == out["package_abi"]
    assert not out["cache_hit"]  # a cold store: the daemon compiled it
    assert "kcache_attn_fwd" in out["entries"], out
    assert out["kv_heads"] == 2
    assert out["record_type"] == "kcache.v1.record_pb2"
    assert out["refused"] == ["InvalidSpec", "spec.head_dim_qk", "INVALID_ARGUMENT", True]


def test_version_is_written_once():
    import kcache
    assert kcache.__version__ == _source_version()
    with open(os.path.join(PKG_SRC, "pyproject.toml")) as f:
        toml = f.read()
    assert 'dynamic = ["version"]' in toml
    assert 'version = {attr = "kcache._version.__version__"}' in toml
    # The C++ build reads the repository's VERSION file: one version for both.
    with open(os.path.join(REPO, "VERSION")) as f:
        assert f.read().strip() == kcache.__version__


def _modules():
    names = ["kcache"]
    for root, _, files in os.walk(KCACHE_DIR):
        for f in sorted(files):
            if f.endswith(".py") and f != "__init__.py":
                rel = os.path.relpath(os.path.join(root, f), PKG_SRC)[:-3]
                names.append(rel.replace(os.sep, "."))
    return sorted(names)


# Modules that are torch itself (the torch.library operators): without torch
# they may only fail for its absence.
NEEDS_TORCH = {"kcache.ops"}


def _have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def test_each_module_imports_alone_in_a_fresh_interpreter():
    failed = []
    have_torch = _have_torch()
    for m in _modules():
        p = subprocess.run([sys.executable, "-c", "import %s" % m], capture_output=True,
                           text=True, env=_clean_env(PYTHONPATH=PKG_SRC), timeout=120)
        if (p.returncode and m in NEEDS_TORCH and not have_torch
                and "No module named 'torch'" in p.stderr):
            continue
        if p.returncode:  # a negative status is a signal (e.g. the OOM killer)
            failed.append("%s: exit status %d\n%s" % (m, p.returncode, p.stderr[-2000:]))
    assert not failed, "\n".join(failed)


def _top_level_kcache_imports(path):
    """Submodules of kcache a module imports when it is imported: module-level imports,
    outside functions and `if TYPE_CHECKING:` blocks."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If):
                test = node.test
                if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                    visit(node.orelse)
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "kcache":
                    out.update("kcache." + a.name for a in node.names)
                elif node.module.startswith("kcache."):
                    out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("kcache."))
    visit(tree.body)
    return out


def test_no_import_cycles_between_submodules():
    mods = [m for m in _modules() if m != "kcache" and not m.startswith("kcache.v1.")]
    path = {m: os.path.join(PKG_SRC, *m.split(".")) + ".py" for m in mods}
    graph = {m: sorted(d for d in _top_level_kcache_imports(path[m]) if d in path) for m in mods}
    state = {}

    def dfs(m, stack):
        state[m] = "open"
        for d in graph[m]:
            if state.get(d) == "open":
                pytest.fail("import cycle: %s" % " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                dfs(d, stack + [d])
        state[m] = "done"

    for m in mods:
        if m not in state:
            dfs(m, [m])


def test_every_error_derives_from_kcache_error():
    import kcache
    from kcache import cuda, errors
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), kcache.KcacheError), name
        assert getattr(kcache, name) is getattr(errors, name), name
    assert cuda.CudaError is kcache.CudaError
    assert issubclass(kcache.InvalidArgument, ValueError)
    assert issubclass(kcache.InvalidSpec, kcache.InvalidArgument)
    assert issubclass(kcache.InvalidType, TypeError)
    e = kcache.CudaError("cuInit failed", 100)
    assert e.result == 100 and isinstance(e, kcache.KcacheError)
    # Input errors raised on the client side, before any RPC or GPU.
    for bad in (lambda: kcache.spec(dtype="fp8", q_heads=1),
                lambda: kcache.spec(),
                lambda: kcache.buffer("x", "int64"),
                lambda: kcache.to_spec("{not json"),
                lambda: kcache.Client(""),
                lambda: cuda.pack_args("k", [1, 2], [4]),
                lambda: bool(kcache.q_idx < 1)):
        with pytest.raises(kcache.KcacheError):
            bad()
    with pytest.raises(kcache.InvalidType):
        kcache.to_spec(3)
    with pytest.raises(kcache.InvalidArgument) as ei:
        kcache.spec(dtype="fp8", q_heads=1)
    assert ei.value.field == "dtype"


# Builtin exceptions kcache must not raise for its own errors (AttributeError and KeyError stay:
# the attribute and mapping protocols expect them; AssertionError marks our own invariants).
_BUILTIN = {"ValueError", "TypeError", "RuntimeError", "Exception", "OSError", "IOError",
            "ConnectionError", "TimeoutError", "PermissionError"}
# Modules whose owners have not yet moved to kcache.errors (remove when they have).
_PENDING = {"raw.py"}


def test_no_module_raises_a_bare_builtin_error():
    found = []
    for root, _, files in os.walk(KCACHE_DIR):
        if os.path.basename(root) == "v1":
            continue  # generated
        for f in sorted(files):
            if not f.endswith(".py") or f in _PENDING:
                continue
            p = os.path.join(root, f)
            with open(p) as fh:
                tree = ast.parse(fh.read(), p)
            for node in ast.walk(tree):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                    if isinstance(exc, ast.Name) and exc.id in _BUILTIN:
                        found.append("%s:%d raise %s" % (os.path.relpath(p, REPO), node.lineno,
                                                         exc.id))
    assert not found, "raise a kcache.errors class instead:\n" + "\n".join(found)


_WARM_PROBE = """
import sys, kcache
from kcache import _warm
before = "grpc" in sys.modules
_warm.wait()
print(before, "grpc" in sys.modules, "kcache.v1.service_pb2_grpc" in sys.modules)
"""


def test_import_loads_the_wire_modules_in_the_background_unless_turned_off():
    # The first attention call needs grpc and kcache/v1; `import kcache` starts loading
    # them on a thread (kcache._warm), and KCACHE_WARM_IMPORTS=0 leaves them to that call.
    on = subprocess.run([sys.executable, "-c", _WARM_PROBE], capture_output=True, text=True,
                        env=_clean_env(PYTHONPATH=PKG_SRC), timeout=120)
    assert on.returncode == 0, on.stderr
    assert on.stdout.split()[1:] == ["True", "True"], on.stdout
    off = subprocess.run([sys.executable, "-c", _WARM_PROBE], capture_output=True, text=True,
                         env=_clean_env(PYTHONPATH=PKG_SRC, KCACHE_WARM_IMPORTS="0"),
                         timeout=120)
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["False", "False", "False"], off.stdout


def _run_with_stand_in_grpc(tmp_path, grpc_init, code="import kcache"):
    """Runs `code` in a fresh interpreter where a package `grpc` whose __init__.py is
    `grpc_init` stands in for the real one (ahead of it on the path)."""
    fake = tmp_path / "grpc"
    fake.mkdir()
    (fake / "__init__.py").write_text(grpc_init)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_clean_env(PYTHONPATH=os.pathsep.join([str(tmp_path), PKG_SRC])),
                          timeout=120)


def test_exit_right_after_import_waits_for_the_background_imports(tmp_path):
    # A daemon thread still inside a C extension's import when the interpreter finalizes
    # can crash it (test_each_module_imports_alone_in_a_fresh_interpreter saw SIGSEGV now
    # and then). A slow `grpc` stands in for the real one: the process exits at once, and
    # the import must have finished (its marker written) before the interpreter went away.
    marker = tmp_path / "grpc-imported"
    p = _run_with_stand_in_grpc(
        tmp_path, "import time\ntime.sleep(1.0)\nopen(%r, 'w').write('done')\n" % str(marker))
    assert p.returncode == 0, p.stderr
    assert marker.exists(), "the process exited while kcache's background import ran"


def test_background_imports_start_after_importlib_is_whole(tmp_path):
    # A thread importing a submodule of importlib while the main thread is still inside
    # importlib's __init__ leaves a second, uninitialised importlib._bootstrap in
    # sys.modules (CPython 3.11), and the main thread's next importlib.import_module fails
    # with "NameError: name 'sys' is not defined": ~1 % of the fresh interpreters above, in
    # CI. A stand-in grpc, imported first on the thread, records what it found.
    seen = tmp_path / "seen"
    p = _run_with_stand_in_grpc(
        tmp_path,
        "import sys\n"
        "ok = ('importlib' in sys.modules and 'importlib.util' in sys.modules\n"
        "      and sys.modules.get('importlib._bootstrap') is sys.modules['_frozen_importlib'])\n"
        "open(%r, 'w').write(str(ok))\n" % str(seen))
    assert p.returncode == 0, p.stderr
    assert seen.read_text() == "True", "the thread started before importlib was whole"


def test_import_without_grpc_still_works_and_the_call_names_what_is_missing(tmp_path):
    # A machine without grpcio imports kcache (specs need no wire); the warm-up thread's
    # failure is silent and the first client says what to install.
    probe = ("import kcache\nfrom kcache import _warm\n_warm.wait()\n"
             "try:\n    kcache.Client('unix:/nonexistent.sock')\n"
             "except ImportError as e:\n    print('ImportError', e)\n")
    p = _run_with_stand_in_grpc(
        tmp_path, "raise ImportError('No module named grpc (test)')\n", probe)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ImportError"), p.stdout + p.stderr
    assert "grpc" in p.stdout
