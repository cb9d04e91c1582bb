"""The ctypes mirror of kcache::AttentionParams matches kernels/attention_params.h: as the
host C++ compiler lays it out (params_layout_probe), and as NVRTC does
(tests/kernels/kc_attn.check_params_layout, which now uses the same mirror)."""

import ctypes
import os
import subprocess
import sys

import pytest

from kcache import params

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def probe_layout():
    exe = os.environ.get("KCACHE_TEST_LAYOUT_PROBE")
    if not exe:
        pytest.skip("KCACHE_TEST_LAYOUT_PROBE not set (CTest sets it)")
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


def test_mirror_matches_the_host_compiler():
    want = probe_layout()
    got = params.layout()
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
    assert not diff, "C++ vs ctypes: %s" % diff
    assert want["kAttentionAbiVersion"] == params.ABI_VERSION


def test_record_of_another_abi_is_refused():
    class Rec:
        abi_version = params.ABI_VERSION + 1
        key = b"\x01" * 32
    with pytest.raises(RuntimeError, match="ABI"):
        params.check_record_abi(Rec())


def _have_nvrtc():
    for name in ("libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.13", "libnvrtc.so",
                 "/usr/local/cuda/lib64/libnvrtc.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


@pytest.mark.skipif(not _have_nvrtc(), reason="no NVRTC on this machine")
def test_kc_attn_harness_uses_the_package_mirror_and_nvrtc_agrees():
    sys.path.insert(0, os.path.join(REPO, "tests", "kernels"))
    try:
        import kc_attn
    finally:
        sys.path.pop(0)
    assert kc_attn.AttentionParams is params.AttentionParams
    assert kc_attn.check_params_layout() == ctypes.sizeof(params.AttentionParams)
