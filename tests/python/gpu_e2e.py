#!/usr/bin/env python3
"""GPU end-to-end run of the kcache Python package against a real kcached WITH the GPU.

Starts kcached (not compile-only) on a temporary store, its stderr in a log,
waits for its socket, and for each case runs kcache.attention_forward on fresh
random torch tensors, then checks:
  - O is written everywhere (the output is pre-filled with NaN) and finite;
    rows that see no key have O = 0 and LSE = -inf;
  - O (and LSE) against a float32 torch reference with an explicit boolean
    mask: relative L2 <= 1e-2 (bf16) / 3e-3 (fp16);
  - the record is verified, on this GPU (verified_on names it);
  - a second call makes no RPC (the client's memo), and a fresh Client gets
    a cache hit from the daemon;
and finally stops the daemon with SIGTERM and expects exit status 0.
The backward case runs kcache.attention (autograd) and checks O, dQ, dK, dV against
float32 torch autograd, and that the record carries the backward entry points.
Prints one line per case and "N passed, M failed" last; exits 1 on any failure.

  python3 tests/python/gpu_e2e.py --kcached PATH/kcached
  python3 tests/python/gpu_e2e.py --dry-run [--kcached PATH]

The package, with its protobuf modules, is imported from client/python
(--pythonpath-gen is accepted and ignored: older recipes pass it). kcached
needs kcache-compile-worker beside it (or --daemon-arg=--worker_path=PATH) and
NVRTC (/usr/local/cuda/lib64 is added to its LD_LIBRARY_PATH). On the GPU machine use the static daemon
(scripts/build-static.sh writes dist/kcached and dist/kcache-compile-worker). --dry-run needs
no GPU or torch: it parses the arguments, imports the package and the generated
modules, builds every case's spec and, given --kcached, asks a compile-only
daemon for each case's sm_90a kernel (so a spec the daemon refuses shows up
before any GPU time is spent).
"""

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kcached", help="path to the kcached binary")
    ap.add_argument("--pythonpath-gen", dest="gen", default=None,
                    help="ignored (the package holds its protobuf modules since 0.1)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU only: arguments, imports, specs (and compile-only fetches)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per GetKernel")
    ap.add_argument("--select", default=None, help="regex on case names")
    ap.add_argument("--keep", action="store_true", help="keep the temporary store and log")
    ap.add_argument("--daemon-arg", dest="daemon_args", action="append", default=[],
                    help="extra kcached flag, e.g. --daemon-arg=--worker_path=PATH (repeatable)")
    args = ap.parse_args(argv)
    if not args.dry_run and not args.kcached:
        ap.error("--kcached is required (except with --dry-run)")
    if args.kcached and not os.access(args.kcached, os.X_OK):
        ap.error("--kcached: %s is not an executable file" % args.kcached)
    return args


def setup_imports(gen=None):
    """Puts the package (client/python) on sys.path and imports it. `gen` (the old
    --pythonpath-gen folder) is ignored: the package holds its protobuf modules."""
    del gen
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    import kcache
    from kcache import _protos
    _protos.modules()  # raises ImportError naming the missing runtime
    import grpc  # noqa: F401
    return kcache


# ---------------------------------------------------------------------------
# Cases: a spec, shapes and launch inputs, and the reference's boolean mask.
# ---------------------------------------------------------------------------
def cases(kcache):
    prefix = kcache.buffer("prefix", "int32")
    out = [
        dict(name="causal_bf16_d128_gqa32_8", dtype="bf16", D=128, Hq=32, Hkv=8, B=2, Lq=1000,
             Lkv=1000, lse=True, mask=kcache.causal(), ref="causal"),
        dict(name="nomask_fp16_d64", dtype="fp16", D=64, Hq=8, Hkv=8, B=2, Lq=300, Lkv=517,
             lse=False, mask=None, ref="none"),
        dict(name="drafter_bf16_d128_block16", dtype="bf16", D=128, Hq=32, Hkv=8, B=2, N=24,
             S=700, block=16, lse=True, mask=kcache.drafter(block_size=16), ref="drafter"),
        dict(name="window128_bf16_d128_gqa16_4", dtype="bf16", D=128, Hq=16, Hkv=4, B=1, Lq=777,
             Lkv=777, lse=True, mask=kcache.sliding_window(128, 0), ref="window",
             window=(128, 0)),
        dict(name="expr_prefixlm_int32buf_fp16_d64", dtype="fp16", D=64, Hq=8, Hkv=2, B=3,
             Lq=450, Lkv=450, lse=True,
             mask=kcache.expr_mask((kcache.kv_idx < prefix[kcache.b]) |
                                   (kcache.kv_idx <= kcache.q_idx)), ref="prefix"),
        dict(name="causal_softcap20_bf16_d128", dtype="bf16", D=128, Hq=16, Hkv=16, B=2,
             Lq=513, Lkv=513, lse=True, mask=kcache.causal(), score=kcache.softcap(20.0),
             ref="causal", softcap=20.0),
        dict(name="document_causal_fp16_d128_bshd", dtype="fp16", D=128, Hq=8, Hkv=4, B=2,
             Lq=640, Lkv=640, lse=True, mask=kcache.document(causal=True), ref="document",
             layout="bshd"),
        dict(name="alibi_fp16_d64", dtype="fp16", D=64, Hq=8, Hkv=8, B=1, Lq=256, Lkv=384,
             lse=False, mask=None, score=kcache.alibi(), ref="none", alibi=True),
        # kcache.attention with autograd: the backward spec's cubin, gradients checked.
        dict(name="backward_causal_bf16_d128_gqa16_4", dtype="bf16", D=128, Hq=16, Hkv=4, B=2,
             Lq=777, Lkv=777, lse=True, mask=kcache.causal(), ref="causal", backward=True),
    ]
    for c in out:
        if c["ref"] == "drafter":
            c["Lq"] = c["N"] * c["block"]
            c["Lkv"] = c["S"] + c["Lq"]
        c["spec"] = kcache.spec(dtype=c["dtype"], head_dim=c["D"], q_heads=c["Hq"],
                                kv_heads=c["Hkv"], mask=c["mask"], score_mod=c.get("score"),
                                return_lse=c["lse"], backward=c.get("backward", False))
    return out


def make_inputs(torch, c, dev):
    """Fresh random q, k, v ([B, H, L, D] views; BSHD memory with layout='bshd') and the
    launch inputs of the case's mask."""
    dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
    B, Hq, Hkv, Lq, Lkv, D = c["B"], c["Hq"], c["Hkv"], c["Lq"], c["Lkv"], c["D"]

    def rnd(h, length):
        if c.get("layout") == "bshd":
            return torch.randn(B, length, h, D, device=dev).to(dt)
        return torch.randn(B, h, length, D, device=dev).to(dt)

    q, k, v = rnd(Hq, Lq), rnd(Hkv, Lkv), rnd(Hkv, Lkv)
    kw = {}
    if c["ref"] == "drafter":
        # Anchors with a row stride wider than N (the kernel takes the stride).
        anchors = torch.randint(0, c["S"] + 1, (B, c["N"] + 3), device=dev, dtype=torch.int32)
        keep = torch.rand(B, c["N"] + 3, device=dev) < 0.85
        kw.update(anchors=anchors, keep=keep)
    if c["ref"] == "prefix":
        kw["buffers"] = {"prefix": torch.randint(0, Lkv + 1, (B,), device=dev,
                                                 dtype=torch.int32)}
    if c["ref"] == "document":
        cuts = torch.sort(torch.randint(0, Lq, (B, 4), device=dev), dim=1).values
        pos = torch.arange(Lq, device=dev).expand(B, Lq)
        ids = (pos[..., None] >= cuts[:, None, :]).sum(-1).to(torch.int32)
        kw.update(q_seq_id=ids, kv_seq_id=ids.clone())
    if c.get("alibi"):
        kw["alibi_slopes"] = torch.rand(Hq, device=dev, dtype=torch.float32) * 0.1
    return q, k, v, kw


def ref_mask(torch, c, kw, dev):
    """Boolean [B or 1, 1, Lq, Lkv]: True where query q_idx sees key kv_idx."""
    Lq, Lkv = c["Lq"], c["Lkv"]
    q = torch.arange(Lq, device=dev)[:, None]
    kv = torch.arange(Lkv, device=dev)[None, :]
    r = c["ref"]
    if r == "none":
        return torch.ones(1, 1, Lq, Lkv, dtype=torch.bool, device=dev)
    if r == "causal":
        return (kv <= q)[None, None]
    if r == "window":
        left, right = c["window"]
        rel = kv - q
        return ((rel >= -left) & (rel <= right))[None, None]
    if r == "document":
        vis = kw["q_seq_id"][:, :, None] == kw["kv_seq_id"][:, None, :]
        return (vis & (kv <= q)[None])[:, None]
    if r == "prefix":
        p = kw["buffers"]["prefix"].long()
        return ((kv[None] < p[:, None, None]) | (kv <= q)[None])[:, None]
    if r == "drafter":
        S, N, Bk = c["S"], c["N"], c["block"]
        j = torch.arange(Lq, device=dev) // Bk
        a = kw["anchors"][:, :N].long()[:, j]  # [B, Lq]
        kvb = kv[None]
        ctx = (kvb < S) & (kvb < a[:, :, None])
        own = (kvb >= (S + j * Bk)[None, :, None]) & (kvb < (S + (j + 1) * Bk)[None, :, None])
        vis = (ctx | own) & kw["keep"][:, :N][:, j][:, :, None]
        return vis[:, None]
    raise ValueError(r)


def reference(torch, c, q, k, v, kw, vis):
    """float32 O and LSE for [B, H, L, D] views."""
    rep = c["Hq"] // c["Hkv"]
    qf = q.float()
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    scale = float(torch.tensor(1.0 / math.sqrt(c["D"]), dtype=torch.float32))
    s = (qf @ kf.transpose(-1, -2)) * scale
    if c.get("softcap"):
        s = c["softcap"] * torch.tanh(s / c["softcap"])
    if c.get("alibi"):
        qi = torch.arange(c["Lq"], device=q.device, dtype=torch.float32)[:, None]
        ki = torch.arange(c["Lkv"], device=q.device, dtype=torch.float32)[None, :]
        s = s + kw["alibi_slopes"][None, :, None, None] * (ki - qi)[None, None]
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return p @ vf, lse


# ---------------------------------------------------------------------------
# The daemon
# ---------------------------------------------------------------------------
class Daemon:
    def __init__(self, kcached, directory, compile_only, extra_args=()):
        self.kcached, self.dir, self.compile_only = kcached, directory, compile_only
        self.extra = list(extra_args)
        self.socket = os.path.join(directory, "kcached.sock")
        self.target = "unix:" + self.socket
        self.log_path = os.path.join(directory, "kcached.log")
        self.proc = None

    def start(self, timeout=120.0):
        import grpc
        env = dict(os.environ)
        if os.path.isdir("/usr/local/cuda/lib64"):
            env["LD_LIBRARY_PATH"] = "/usr/local/cuda/lib64" + (
                ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        args = [self.kcached, "--store_path=" + os.path.join(self.dir, "store"),
                "--socket_path=" + self.socket, "--compile_threads=4",
                "--compile_only=" + ("true" if self.compile_only else "false")] + self.extra
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     env=env, preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kcached exited at start with %d; log:\n%s"
                                   % (self.proc.returncode, self.log_tail()))
            if os.path.exists(self.socket):
                with grpc.insecure_channel(self.target) as ch:
                    try:
                        grpc.channel_ready_future(ch).result(timeout=0.5)
                        return
                    except grpc.FutureTimeoutError:
                        pass
            else:
                time.sleep(0.05)
        raise RuntimeError("kcached did not serve within %.0f s; log:\n%s"
                           % (timeout, self.log_tail()))

    def stop(self, sig=signal.SIGTERM, timeout=90.0):
        if self.proc is None:
            return None
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "timeout (killed)"
        self.proc = None
        return rc

    def log_tail(self, n=40):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"


def _die_with_parent():
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 (best effort)
        pass


# ---------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------
def dry_run(kcache, args, selected):
    print("dry run: %d cases: %s" % (len(selected), ", ".join(c["name"] for c in selected)))
    if not args.kcached:
        print("dry run ok (imports, arguments, specs; no --kcached, so no fetches)")
        return 0
    d = tempfile.mkdtemp(prefix="kce2e")
    daemon = Daemon(args.kcached, d, compile_only=True, extra_args=args.daemon_args)
    failed = 0
    try:
        daemon.start()
        with kcache.Client(daemon.target) as client:
            for c in selected:
                try:
                    r = client.get_kernel(c["spec"], arch="sm_90a", timeout=args.timeout)
                    ok = r.cubin[:4] == b"\x7fELF" and r.record.arch == "sm_90a"
                    print("%s %-36s sm_90a key=%s entries=%s" % (
                        "PASS" if ok else "FAIL", c["name"], r.record.key[9:].hex()[:12],
                        ",".join("%s(%d thr, %d B smem)" % (e.name, e.threads,
                                                           e.dynamic_smem_bytes)
                                 for e in r.record.entry_points)))
                    failed += not ok
                except Exception as e:  # noqa: BLE001
                    print("FAIL %-36s %s" % (c["name"], e))
                    failed += 1
        rc = daemon.stop()
        if rc != 0:
            print("FAIL kcached exit status %s" % rc)
            failed += 1
    finally:
        daemon.stop(signal.SIGKILL)
        shutil.rmtree(d, ignore_errors=True)
    print("%d passed, %d failed" % (len(selected) - failed + (rc == 0), failed))
    return 1 if failed else 0


def check_case(torch, kcache, client, target, c, args, dev, gpu_name):
    """Runs one case; returns (list of failure messages, summary text)."""
    from kcache.attention import resolve_spec
    msgs = []
    layout = c.get("layout", "bhsd")
    q, k, v, kw = make_inputs(torch, c, dev)
    dt = q.dtype
    shape_o = ((c["B"], c["Lq"], c["Hq"], c["D"]) if layout == "bshd"
               else (c["B"], c["Hq"], c["Lq"], c["D"]))
    out = torch.full(shape_o, float("nan"), dtype=dt, device=dev)  # poisoned
    rpc0 = client.rpc_count
    t0 = time.monotonic()
    res = kcache.attention_forward(q, k, v, c["spec"], lse=c["lse"], layout=layout, out=out,
                                   client=client, timeout=args.timeout, **kw)
    torch.cuda.synchronize()
    first_s = time.monotonic() - t0
    o, lse = res if c["lse"] else (res, None)
    if o.data_ptr() != out.data_ptr():
        msgs.append("O is not the given out tensor")
    if client.rpc_count == rpc0:
        msgs.append("first call made no RPC")

    # To [B, H, L, D] for the reference.
    qb, kb, vb, ob = ((t.permute(0, 2, 1, 3) for t in (q, k, v, o)) if layout == "bshd"
                      else (q, k, v, o))
    vis = ref_mask(torch, c, kw, dev)
    o_ref, lse_ref = reference(torch, c, qb, kb, vb, kw, vis)
    of = ob.float()
    dead = torch.isinf(lse_ref) & (lse_ref < 0)
    if torch.isnan(of).any():
        msgs.append("NaN in O (%d elements; unwritten or computed)" % int(torch.isnan(of).sum()))
    elif not torch.isfinite(of).all():
        msgs.append("inf in O")
    if dead.any() and not torch.equal(of[dead], torch.zeros_like(of[dead])):
        msgs.append("rows with no visible key: O != 0")
    tol = 1e-2 if c["dtype"] == "bf16" else 3e-3
    err = (torch.nan_to_num(of - o_ref, nan=1e30).norm() / o_ref.norm().clamp_min(1e-30)).item()
    if not err <= tol:
        msgs.append("rel L2 %.3e > %.0e" % (err, tol))
    lse_err = 0.0
    if lse is not None:
        live = ~dead
        if dead.any() and not (torch.isinf(lse[dead]) & (lse[dead] < 0)).all():
            msgs.append("rows with no visible key: LSE != -inf")
        if live.any():
            le = torch.nan_to_num((lse[live] - lse_ref[live]).abs(), nan=1e30)
            lse_err = le.max().item()
            if not lse_err <= 2e-3 + 1e-3 * lse_ref[live].abs().max().item():
                msgs.append("LSE max abs err %.3e" % lse_err)

    # The record: verified on this GPU; the memo answers without an RPC.
    s = resolve_spec(c["spec"], qb, kb, vb, c["lse"])
    rpc1 = client.rpc_count
    arch = kcache.arch_for_capability(*torch.cuda.get_device_capability(dev))
    r = client.get_kernel(s, arch=arch, timeout=args.timeout)
    rec = r.record
    if not rec.verified:
        msgs.append("record.verified is False")
    if not rec.verified_on or not (rec.verified_on in gpu_name or gpu_name in rec.verified_on):
        msgs.append("verified_on %r does not name this GPU (%r)" % (rec.verified_on, gpu_name))
    if rec.arch != arch:
        msgs.append("record.arch %s, asked for %s" % (rec.arch, arch))
    out2 = torch.full_like(out, float("nan"))
    kcache.attention_forward(q, k, v, c["spec"], lse=c["lse"], layout=layout, out=out2,
                             client=client, timeout=args.timeout, **kw)
    torch.cuda.synchronize()
    if client.rpc_count != rpc1:
        msgs.append("second call made %d RPC(s); expected the memo" % (client.rpc_count - rpc1))
    if not torch.equal(out2, out):
        msgs.append("second call's O differs from the first (same inputs)")
    with kcache.Client(target) as fresh:
        r2 = fresh.get_kernel(s, arch=arch, timeout=args.timeout)
        if not r2.cache_hit:
            msgs.append("a fresh Client did not get a cache hit")
        if r2.record.key != rec.key or r2.cubin != r.cubin:
            msgs.append("a fresh Client got another record or cubin")
    summary = ("err=%.2e lse_err=%.2e dead_rows=%d first=%.2fs compile=%.2fs key=%s on=%s" % (
        err, lse_err, int(dead.sum()), first_s, rec.compile_time_us / 1e6, rec.key[9:].hex()[:12],
        rec.verified_on))
    return msgs, summary


def rel_l2(torch, got, ref):
    return (torch.nan_to_num(got.float() - ref, nan=1e30).norm() /
            ref.norm().clamp_min(1e-30)).item()


def check_backward_case(torch, kcache, client, target, c, args, dev, gpu_name):
    """kcache.attention forward + backward through autograd against float32 torch autograd
    (explicit mask, GQA expanded); the record must carry the backward entry points."""
    msgs = []
    q, k, v, kw = make_inputs(torch, c, dev)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn(c["B"], c["Hq"], c["Lq"], c["D"], device=dev).to(q.dtype)
    t0 = time.monotonic()
    try:
        o = kcache.attention(q, k, v, c["spec"], client=client, timeout=args.timeout, **kw)
        o.backward(dout)
        torch.cuda.synchronize()
    except kcache.KcacheError as e:
        if e.code == "UNIMPLEMENTED":
            return ["the daemon answered UNIMPLEMENTED for a backward spec (codegen has no "
                    "backward yet?): %s" % e], ""
        raise
    first_s = time.monotonic() - t0

    vis = ref_mask(torch, c, kw, dev)
    rep = c["Hq"] // c["Hkv"]
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    scale = float(torch.tensor(1.0 / math.sqrt(c["D"]), dtype=torch.float32))
    s = (qf @ kf.repeat_interleave(rep, 1).transpose(-1, -2)) * scale
    s = s.masked_fill(~vis, float("-inf"))
    o_ref = torch.softmax(s, dim=-1) @ vf.repeat_interleave(rep, 1)  # causal: no empty row
    o_ref.backward(dout.float())
    tol = 1e-2 if c["dtype"] == "bf16" else 3e-3
    errs = {}
    for name, got, ref in (("O", o.detach(), o_ref.detach()), ("dQ", q.grad, qf.grad),
                           ("dK", k.grad, kf.grad), ("dV", v.grad, vf.grad)):
        if got is None:
            msgs.append("%s: no gradient" % name)
            continue
        if torch.isnan(got).any():
            msgs.append("NaN in %s" % name)
        errs[name] = rel_l2(torch, got, ref)
        if not errs[name] <= tol:
            msgs.append("%s rel L2 %.3e > %.0e" % (name, errs[name], tol))

    from kcache.attention import resolve_spec
    from kcache.autograd import backward_spec
    arch = kcache.arch_for_capability(*torch.cuda.get_device_capability(dev))
    rec = client.get_kernel(backward_spec(resolve_spec(c["spec"], q, k, v, True)), arch=arch,
                            timeout=args.timeout).record
    roles = sorted(e.role for e in rec.entry_points)
    if rec.deterministic_backward or roles != [1, 2, 3, 4]:
        msgs.append("record: deterministic_backward=%s, entry roles %s (expected "
                    "FORWARD, BACKWARD, PREPROCESS, POSTPROCESS)" % (rec.deterministic_backward,
                                                                     roles))
    if not rec.verified:
        msgs.append("record.verified is False")
    summary = "%s first=%.2fs key=%s entries=%s" % (
        " ".join("%s=%.2e" % kv for kv in errs.items()), first_s, rec.key[9:].hex()[:12],
        ",".join("%s(%d thr, %d B)" % (e.name, e.threads, e.dynamic_smem_bytes)
                 for e in rec.entry_points))
    return msgs, summary


def gpu_run(kcache, args, selected):
    try:
        import torch
    except ImportError as e:
        print("FAIL torch is not importable here (%s); use --dry-run on CPU machines" % e)
        print("0 passed, 1 failed")
        return 1
    if not torch.cuda.is_available():
        print("FAIL no CUDA device visible to torch")
        print("0 passed, 1 failed")
        return 1
    torch.manual_seed(args.seed)
    dev = torch.device("cuda", torch.cuda.current_device())
    gpu_name = torch.cuda.get_device_name(dev)
    d = tempfile.mkdtemp(prefix="kce2e")
    daemon = Daemon(args.kcached, d, compile_only=False, extra_args=args.daemon_args)
    npass = nfail = 0
    try:
        try:
            daemon.start()
        except Exception as e:  # noqa: BLE001
            print("FAIL start kcached: %s" % e)
            print("0 passed, 1 failed")
            return 1
        print("kcached serving at %s (log %s); GPU %s, arch %s" % (
            daemon.target, daemon.log_path, gpu_name,
            kcache.arch_for_capability(*torch.cuda.get_device_capability(dev))), flush=True)
        client = kcache.Client(daemon.target)
        for c in selected:
            try:
                check = check_backward_case if c.get("backward") else check_case
                msgs, summary = check(torch, kcache, client, daemon.target, c, args, dev,
                                      gpu_name)
            except Exception as e:  # noqa: BLE001 (a failing case must not stop the others)
                msgs, summary = ["exception: %s: %s" % (type(e).__name__, e)], ""
                traceback.print_exc()
            if msgs:
                nfail += 1
                print("FAIL %-36s %s :: %s" % (c["name"], summary, "; ".join(msgs)), flush=True)
            else:
                npass += 1
                print("PASS %-36s %s" % (c["name"], summary), flush=True)
        try:
            st = client.stats()
            print("daemon: requests=%d hits=%d misses=%d compiles=%d failures=%d devices=%s" % (
                st.requests, st.hits, st.misses, st.compiles, st.compile_failures,
                list(st.devices)))
        except Exception as e:  # noqa: BLE001
            print("(stats failed: %s)" % e)
        client.close()
        rc = daemon.stop(signal.SIGTERM)
        if rc == 0:
            npass += 1
            print("PASS %-36s exit status 0" % "sigterm_shutdown")
        else:
            nfail += 1
            print("FAIL %-36s exit status %s; log:\n%s" % ("sigterm_shutdown", rc,
                                                           daemon.log_tail()))
    finally:
        daemon.stop(signal.SIGKILL)
        if nfail:
            print("kcached log (tail):\n" + daemon.log_tail())
        if args.keep:
            print("kept %s" % d)
        else:
            shutil.rmtree(d, ignore_errors=True)
    print("%d passed, %d failed" % (npass, nfail))
    return 1 if nfail else 0


def main(argv=None):
    args = parse_args(argv)
    kcache = setup_imports(args.gen)
    selected = cases(kcache)
    if args.select:
        import re
        selected = [c for c in selected if re.search(args.select, c["name"])]
    if args.dry_run:
        return dry_run(kcache, args, selected)
    return gpu_run(kcache, args, selected)


if __name__ == "__main__":
    sys.exit(main())
