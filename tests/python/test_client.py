"""kcache.Client against a real compile-only kcached: records and cubins, the memo and
single flight, error mapping, retries while no daemon answers."""

import hashlib
import json
import threading
import time

import pytest

import kcache


def specs():
    return {
        "causal_bf16_d128_gqa": kcache.spec(dtype="bf16", head_dim=128, q_heads=32, kv_heads=8,
                                            mask=kcache.causal()),
        "none_fp16_d64": kcache.spec(dtype="fp16", head_dim=64, q_heads=8),
        "drafter_bf16_d128": kcache.spec(dtype="bf16", head_dim=128, q_heads=16, kv_heads=4,
                                         mask=kcache.drafter(block_size=16)),
    }


def expr_spec():
    prefix = kcache.buffer("prefix", "int32")
    return kcache.spec(dtype="fp16", head_dim=64, q_heads=4,
                       mask=kcache.expr_mask((kcache.kv_idx < prefix[kcache.b]) |
                                             (kcache.kv_idx <= kcache.q_idx)))


def test_get_kernel_returns_record_and_cubin(daemon):
    c = kcache.Client(daemon.target)
    keys = set()
    for name, s in list(specs().items()) + [("expr", expr_spec())]:
        r = c.get_kernel(s, arch="sm_80", timeout=300)
        rec = r.record
        assert rec.arch == "sm_80", name
        # cache/key.h: [format version 1][8-byte toolchain id][32-byte SHA-256].
        assert len(rec.key) == 41 and rec.key[0] == 1, name
        assert rec.key[1:9].hex() == rec.toolchain.id, name
        keys.add(rec.key)
        assert rec.abi_version == kcache.ABI_VERSION, name
        assert r.cubin[:4] == b"\x7fELF", name
        assert rec.cubin_size == len(r.cubin), name
        assert rec.cubin_sha256 == hashlib.sha256(r.cubin).digest(), name
        assert not rec.verified and not r.cache_hit, name  # compile-only, cold store
        assert rec.spec.num_kv_heads == (s.num_kv_heads or s.num_q_heads), name  # normalized
        names = {e.name: e for e in rec.entry_points}
        fwd = names["kcache_attn_fwd"]
        assert fwd.role == 1 and fwd.threads % 32 == 0 and fwd.threads >= 128, name
        assert fwd.block_m > 0 and fwd.block_n > 0 and fwd.dynamic_smem_bytes > 0, name
        if name == "expr":
            mb = names["kcache_attn_mask_build"]
            assert mb.role == 5 and mb.threads == 128
            assert (mb.block_m, mb.block_n) == (fwd.block_m, fwd.block_n)
        else:
            assert set(names) == {"kcache_attn_fwd"}, name
    assert len(keys) == 4
    # JSON text and dicts in protobuf's JSON mapping name the same kernels.
    from google.protobuf import json_format
    s = specs()["causal_bf16_d128_gqa"]
    j = json_format.MessageToJson(s)
    before = c.rpc_count
    assert c.get_kernel(j, arch="sm_80").key == c.get_kernel(s, arch="sm_80").key
    assert c.get_kernel(json.loads(j), arch="sm_80").key == c.get_kernel(s, arch="sm_80").key
    assert c.rpc_count == before  # same request bytes: memoized
    c.close()


def test_concurrent_identical_requests_make_one_rpc_and_one_compile(daemon):
    c = kcache.Client(daemon.target)
    s = specs()["causal_bf16_d128_gqa"]
    n = 16
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def run(i):
        barrier.wait()
        try:
            results[i] = c.get_kernel(s, arch="sm_80", timeout=300)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert c.rpc_count == 1
    assert all(r is results[0] for r in results)
    stats = c.stats()
    assert stats.compiles == 1 and stats.compile_failures == 0 and stats.compile_only
    # The memo answers again without an RPC; a fresh client gets the daemon's hit.
    assert c.get_kernel(s, arch="sm_80") is results[0] and c.rpc_count == 1
    with kcache.Client(daemon.target) as c2:
        r2 = c2.get_kernel(s, arch="sm_80", timeout=60)
        assert r2.cache_hit and r2.record.key == results[0].record.key
        assert r2.cubin == results[0].cubin
    assert c.stats().compiles == 1
    c.close()


@pytest.mark.parametrize("mutate,field", [
    (lambda s: setattr(s, "head_dim_qk", 96), "spec.head_dim_qk"),
    (lambda s: setattr(s, "num_kv_heads", 3), "spec.num_kv_heads"),
    (lambda s: s.score_mod.softcap.__setattr__("cap", -2.0), "spec.score_mod.softcap.cap"),
    (lambda s: s.mask.sliding_window.__setattr__("left", -7), "spec.mask.sliding_window.left"),
])
def test_invalid_spec_names_the_field(daemon, mutate, field):
    c = kcache.Client(daemon.target)
    s = kcache.spec(dtype="bf16", head_dim=128, q_heads=8, kv_heads=2)
    mutate(s)
    with pytest.raises(kcache.InvalidSpec) as ei:
        c.get_kernel(s, arch="sm_80", timeout=60)
    assert ei.value.field == field, str(ei.value)
    assert field in str(ei.value)
    assert isinstance(ei.value, ValueError)
    # Failures are not memoized: asking again asks the daemon again.
    with pytest.raises(kcache.InvalidSpec):
        c.get_kernel(s, arch="sm_80", timeout=60)
    assert c.rpc_count == 2
    assert c.stats().compiles == 0
    c.close()


def test_invalid_target_arch(daemon):
    c = kcache.Client(daemon.target)
    with pytest.raises(kcache.InvalidSpec) as ei:
        c.get_kernel(specs()["none_fp16_d64"], arch="sm_70", timeout=60)
    assert ei.value.field == "target.arch"
    c.close()


def test_no_daemon_is_unavailable_at_once(tmpdir_short):
    c = kcache.Client("unix:%s/none.sock" % tmpdir_short)
    t0 = time.monotonic()
    with pytest.raises(kcache.Unavailable) as ei:
        c.get_kernel(specs()["none_fp16_d64"], arch="sm_80")  # the 600 s default deadline
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0, elapsed
    assert "no kcache daemon at unix:%s/none.sock" % tmpdir_short in str(ei.value)
    assert c.rpc_count == 0  # a missing socket is not retried (tests/python/test_discovery.py)
    assert isinstance(ei.value, ConnectionError)
    c.close()


def test_waits_for_a_daemon_that_restarts(make_daemon):
    # Once the client has reached the daemon, a socket that goes away (the daemon removes it
    # on exit) is a restart: waited for, within connect_timeout.
    d = make_daemon().start()
    c = kcache.Client(d.target, initial_backoff=0.01, max_backoff=0.2)
    c.get_kernel(specs()["none_fp16_d64"], arch="sm_80", timeout=120)
    assert d.stop() == 0
    n = c.rpc_count
    out = {}

    def run():
        try:
            out["r"] = c.get_kernel(specs()["causal_bf16_d128_gqa"], arch="sm_80", timeout=120)
        except Exception as e:  # noqa: BLE001
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)  # the client is waiting for the socket to come back
    assert t.is_alive() and "e" not in out, out.get("e")
    d.start()
    t.join()
    assert "e" not in out, out.get("e")
    assert out["r"].cubin[:4] == b"\x7fELF"
    assert c.rpc_count > n
    c.close()


def test_daemon_restart_between_requests(make_daemon):
    d = make_daemon().start()
    c = kcache.Client(d.target)
    r1 = c.get_kernel(specs()["none_fp16_d64"], arch="sm_80", timeout=120)
    assert d.stop() == 0
    d.start()
    r2 = c.get_kernel(specs()["causal_bf16_d128_gqa"], arch="sm_80", timeout=120)
    assert r2.cubin[:4] == b"\x7fELF" and r1.key != r2.key
    c.close()


def test_backward_module_is_two_images_each_with_its_kernels(daemon):
    """A module with backward compiles as two units (issue 27's compile budget): the cubin
    is their images one after another, the forward's kernels in the first, the backward's
    in the second; kcache.cuda loads each image as a module of its own."""
    from kcache.cuda import cubin_images
    c = kcache.Client(daemon.target)
    r = c.get_kernel(kcache.spec(dtype="bf16", head_dim=64, q_heads=4, mask=kcache.causal(),
                                 backward=True), arch="sm_80", timeout=300)
    images = cubin_images(r.cubin)
    assert len(images) == 2 and b"".join(images) == r.cubin
    assert all(i[:4] == b"\x7fELF" for i in images)
    names = [e.name for e in r.record.entry_points]
    assert names[0] == "kcache_attn_fwd" and "kcache_attn_bwd_dkdv" in names
    assert b"kcache_attn_fwd\0" in images[0] and b"kcache_attn_bwd_dkdv" not in images[0]
    assert b"kcache_attn_bwd_dkdv\0" in images[1] and b"kcache_attn_fwd\0" not in images[1]
    # A forward-only module is one image.
    f = c.get_kernel(kcache.spec(dtype="bf16", head_dim=64, q_heads=4, mask=kcache.causal()),
                     arch="sm_80", timeout=300)
    assert cubin_images(f.cubin) == [f.cubin]
    c.close()


@pytest.mark.parametrize("blob, what", [(b"", "image 0"), (b"garbage", "image 0"),
                                        (None, "image 1")])
def test_cubin_images_refuses_what_is_not_whole_images(daemon, blob, what):
    from kcache.cuda import cubin_images
    if blob is None:  # a whole image, then a truncated one
        c = kcache.Client(daemon.target)
        one = c.get_kernel(kcache.spec(dtype="bf16", head_dim=64, q_heads=4, mask=kcache.causal()),
                           arch="sm_80", timeout=300).cubin
        c.close()
        blob = one + one[:-8]
    with pytest.raises(kcache.CudaError, match=what):
        cubin_images(blob)


def test_cubin_images_reads_tables_as_the_cpp_reader_does(daemon):
    """compiler/cuda/cubin_images.h's rules: an empty table's offset means nothing (with no
    program headers, which ptxas writes last, image 0 ends before them and what follows is
    not an image); a table of entries of size 0 is refused."""
    import struct
    from kcache.cuda import cubin_images
    c = kcache.Client(daemon.target)
    one = c.get_kernel(kcache.spec(dtype="bf16", head_dim=64, q_heads=4, mask=kcache.causal()),
                       arch="sm_80", timeout=300).cubin
    c.close()
    b = bytearray(one)
    struct.pack_into("<Q", b, 0x20, len(b) + 4096)  # program headers far past the end...
    struct.pack_into("<H", b, 0x38, 0)  # ...but none of them
    with pytest.raises(kcache.CudaError, match="image 1 is not"):
        cubin_images(bytes(b))
    b = bytearray(one)
    struct.pack_into("<H", b, 0x3A, 0)  # section header entries of size 0
    with pytest.raises(kcache.CudaError, match="image 0"):
        cubin_images(bytes(b))
