"""A Triton kernel's own PTX and LLVM IR through kcache's raw front door (issue #8), on a GPU.

Triton compiles a row softmax on this machine (fresh cache); its PTX and its LLVM IR (llir)
are each sent to a kcached started with raw kernels enabled (admin token). Each cubin kcache
returns (PTX -> nvJitLink; LLVM IR -> LLVM 19 NVPTX -> PTX -> nvJitLink) is loaded with the
CUDA driver and launched with the arguments Triton's own launch used; its output must equal
Triton's bit for bit. Prints Triton's compile time (first call, empty cache, minus a warm
launch) beside kcache's for each input (cold request, worker compile time, warm hit).

Triton's llir is printed by Triton's own, newer LLVM (21+ for Triton 3.6), and LLVM IR text
is only backward compatible: LLVM 19 may not parse it (e.g. `captures(none)`, `icmp
samesign`) or may lack an intrinsic it names (e.g. llvm.nvvm.barrier.cta.sync.aligned.all).
The llir is sent as is first; if kcache answers INVALID_ARGUMENT, the same IR with the
spellings of LLVM19_REWRITES (each one the older spelling of the same operation, or an
attribute dropped) is sent once more, and the rewrites applied are printed. A daemon whose
worker lacks LLVM answers UNIMPLEMENTED, which is reported, not failed. Both IR texts and
the PTX are written to --out so that they can be compiled elsewhere.

  python3 tests/python/triton_raw_gpu.py --kcached dist/kcached --out DIR
"""

import argparse
import ctypes
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# LLVM 20+ spellings in textual IR -> what LLVM 19 reads, each meaning the same or less.
# (name, pattern, replacement). Dropping an attribute only withholds a fact from LLVM.
LLVM19_REWRITES = [
    ("captures(none) -> nocapture (LLVM 21)", r"\bcaptures\(none\)", "nocapture"),
    ("other captures(...) dropped (LLVM 21)", r" captures\([^)]*\)", ""),
    ("icmp samesign -> icmp (LLVM 20)", r"\bicmp samesign ", "icmp "),
    ("nocreateundeforpoison dropped (LLVM 22)", r" nocreateundeforpoison\b", ""),
    ("initializes(...) dropped (LLVM 20)", r" initializes\((?:\([^()]*\)(?:, )?)+\)", ""),
    # LLVM 21 folded the CTA barriers into llvm.nvvm.barrier.cta.*; LLVM 19's names for the
    # same PTX (bar.sync = barrier.sync.aligned).
    ("barrier.cta.sync.aligned.all -> bar.sync (LLVM 21)",
     r"@llvm\.nvvm\.barrier\.cta\.sync\.aligned\.all\b", "@llvm.nvvm.bar.sync"),
    ("barrier.cta.sync.aligned.count -> barrier (LLVM 21)",
     r"@llvm\.nvvm\.barrier\.cta\.sync\.aligned\.count\b", "@llvm.nvvm.barrier"),
    ("barrier.cta.sync.all -> barrier.sync (LLVM 21)",
     r"@llvm\.nvvm\.barrier\.cta\.sync\.all\b", "@llvm.nvvm.barrier.sync"),
    ("barrier.cta.sync.count -> barrier.sync.cnt (LLVM 21)",
     r"@llvm\.nvvm\.barrier\.cta\.sync\.count\b", "@llvm.nvvm.barrier.sync.cnt"),
    # LLVM 21/22 made ex2.approx and fabs overloaded (.f32/.f64 suffixes).
    ("ex2.approx[.ftz].f32 -> ex2.approx[.ftz].f (LLVM 22)",
     r"@llvm\.nvvm\.ex2\.approx\.(ftz\.)?f32\b", r"@llvm.nvvm.ex2.approx.\1f"),
    ("ex2.approx.f64 -> ex2.approx.d (LLVM 22)", r"@llvm\.nvvm\.ex2\.approx\.f64\b",
     "@llvm.nvvm.ex2.approx.d"),
    ("fabs[.ftz].f32 -> fabs[.ftz].f (LLVM 21)", r"@llvm\.nvvm\.fabs\.(ftz\.)?f32\b",
     r"@llvm.nvvm.fabs.\1f"),
    ("fabs.f64 -> fabs.d (LLVM 21)", r"@llvm\.nvvm\.fabs\.f64\b", "@llvm.nvvm.fabs.d"),
    # LLVM 21's div.full intrinsic is PTX div.full.f32, which LLVM 19 can only emit as inline
    # asm (the same instruction); its declaration goes.
    ("div.full -> inline asm div.full.f32 (LLVM 21)",
     r"call float @llvm\.nvvm\.div\.full\(",
     'call float asm "div.full.f32 $0, $1, $2;", "=f,f,f"('),
    ("div.full declaration dropped (LLVM 21)",
     r"(?m)^declare [^\n]*@llvm\.nvvm\.div\.full\([^\n]*\n", ""),
]


def llvm19_ir(llir):
    """`llir` with LLVM19_REWRITES applied, and [(name, count)] of those that matched."""
    applied = []
    for name, pattern, repl in LLVM19_REWRITES:
        llir, n = re.subn(pattern, repl, llir)
        if n:
            applied.append((name, n))
    return llir, applied


def entry_params(ptx, name):
    """PTX parameter types of .entry `name`, in order (e.g. ['u64', 'u64', 'u32'])."""
    m = re.search(r"\.entry\s+%s\s*\((.*?)\)" % re.escape(name), ptx, re.S)
    if not m:
        raise RuntimeError("no .entry %s in Triton's PTX" % name)
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--kcached", required=True)
    ap.add_argument("--pythonpath-gen", help="ignored (the package holds its protobuf modules)")
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="triton-raw-"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(REPO, "tests", "kernels"))
    import grpc
    import torch
    import triton
    import triton.language as tl
    from kcache.v1 import service_pb2, service_pb2_grpc, spec_pb2
    import gpu_e2e
    import kc_attn

    @triton.jit
    def softmax_rows(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(in_ptr + row * n_cols + offs, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * n_cols + offs, num / tl.sum(num, axis=0), mask=mask)

    rows, cols = 8192, 1000
    x = torch.randn(rows, cols, device="cuda")
    y_triton = torch.empty_like(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ck = softmax_rows[(rows,)](y_triton, x, cols, BLOCK=1024, num_warps=4)
    torch.cuda.synchronize()
    triton_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    softmax_rows[(rows,)](y_triton, x, cols, BLOCK=1024, num_warps=4)
    torch.cuda.synchronize()
    triton_warm = time.perf_counter() - t0
    ptx, llir = ck.asm["ptx"], ck.asm["llir"]
    name = ck.metadata.name
    shared = int(getattr(ck.metadata, "shared", 0))
    num_warps = int(getattr(ck.metadata, "num_warps", 4))
    arch = re.search(r"\.target\s+(sm_\w+)", ptx).group(1)
    params = entry_params(ptx, name)
    with open(os.path.join(args.out, name + ".ptx"), "w") as f:
        f.write(ptx)
    with open(os.path.join(args.out, name + ".ll"), "w") as f:
        f.write(llir)
    print("triton %s: kernel %s, %s, %d warps, %d B shared, params %s; compile + first launch "
          "%.3f s (warm launch %.4f s)" % (triton.__version__, name, arch, num_warps, shared,
                                           params, triton_first, triton_warm), flush=True)

    token = "triton-raw-test-token"
    tok_path = os.path.join(args.out, "admin.token")
    with open(tok_path, "w") as f:
        f.write(token + "\n")
    os.chmod(tok_path, 0o600)
    d = gpu_e2e.Daemon(args.kcached, tempfile.mkdtemp(prefix="kcache-raw-"), False,
                       ["--enable_raw_kernels=true", "--admin_token_path=" + tok_path])
    d.start()
    failed = False
    try:
        with grpc.insecure_channel(d.target) as ch:
            stub = service_pb2_grpc.KernelServiceStub(ch)
            md = (("authorization", "Bearer " + token),)

            def ask(fmt, source):
                req = service_pb2.GetKernelRequest(
                    raw=spec_pb2.RawKernel(format=fmt, source=source, kernel_names=[name]),
                    target=spec_pb2.Target(arch=arch))
                t = time.perf_counter()
                resp = stub.GetKernel(req, metadata=md, timeout=300)
                return resp, time.perf_counter() - t

            def report_times(what, fmt, source, resp, cold):
                _, warm = ask(fmt, source)
                print("kcache %s: cold request %.3f s (worker compile %.3f s, cache_hit=%s), warm "
                      "%.4f s; cubin %d B, key %s"
                      % (what, cold, resp.record.compile_time_us / 1e6, resp.cache_hit, warm,
                         len(resp.cubin), resp.record.key.hex()[:24] if resp.record.key else "?"),
                      flush=True)

            cu = kc_attn._lib_cuda()

            def run_and_compare(what, cubin):
                """Launches `name` from `cubin` as Triton launched it; True if bit-identical."""
                buf = ctypes.create_string_buffer(cubin, len(cubin))
                mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
                kc_attn._check(cu.cuModuleLoadData(ctypes.byref(mod), buf), "cuModuleLoadData")
                try:
                    kc_attn._check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()),
                                   "cuModuleGetFunction")
                    y_kc = torch.full_like(x, float("nan"))
                    values = [y_kc.data_ptr(), x.data_ptr(), cols]
                    cargs = []
                    for i, ty in enumerate(params):  # Triton's trailing scratch pointers get null
                        v = values[i] if i < len(values) else 0
                        if ty in ("u64", "b64", "s64"):
                            cargs.append(ctypes.c_uint64(v))
                        elif ty in ("u32", "b32", "s32"):
                            cargs.append(ctypes.c_int32(v))
                        else:
                            raise RuntimeError("unexpected PTX parameter type .%s" % ty)
                    argv_ = (ctypes.c_void_p * len(cargs))(
                        *[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in cargs])
                    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
                    kc_attn._check(cu.cuLaunchKernel(fn, rows, 1, 1, num_warps * 32, 1, 1, shared,
                                                     stream, argv_, None), "cuLaunchKernel")
                    torch.cuda.synchronize()
                finally:
                    cu.cuModuleUnload(mod)
                same = torch.equal(y_kc, y_triton)
                ref_err = (y_kc.double() - torch.softmax(x.double(), dim=1)).abs().max().item()
                print("%s kcache's cubin from %s vs Triton's binary: %s; max |err| vs float64 "
                      "softmax %.2e" % ("PASS" if same else "FAIL", what,
                                        "bit-identical" if same else "DIFFERENT", ref_err),
                      flush=True)
                return same

            # PTX half: Triton's PTX -> nvJitLink.
            fmt = spec_pb2.RawKernel.FORMAT_PTX
            resp, cold = ask(fmt, ptx.encode())
            report_times("PTX -> cubin", fmt, ptx.encode(), resp, cold)
            failed = not run_and_compare("PTX", resp.cubin) or failed

            # LLVM IR half: Triton's llir -> LLVM 19 NVPTX -> PTX -> nvJitLink.
            fmt = spec_pb2.RawKernel.FORMAT_LLVM_IR
            source, what = llir, "Triton's llir"
            try:
                try:
                    resp, cold = ask(fmt, source.encode())
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                        raise
                    source, applied = llvm19_ir(llir)
                    print("kcache LLVM IR: LLVM 19 rejects Triton's llir as is:\n  %s"
                          % e.details().replace("\n", "\n  "), flush=True)
                    if not applied:
                        raise
                    path = os.path.join(args.out, name + ".llvm19.ll")
                    with open(path, "w") as f:
                        f.write(source)
                    what = "Triton's llir in LLVM 19 spelling"
                    print("kcache LLVM IR: sending it again with %s (written to %s)"
                          % ("; ".join("%s x%d" % a for a in applied), path), flush=True)
                    resp, cold = ask(fmt, source.encode())
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    print("kcache LLVM IR: UNIMPLEMENTED (this kcached's compile worker has no "
                          "LLVM), reported, not failed: %s" % e.details(), flush=True)
                else:
                    print("FAIL kcache LLVM IR (%s): %s: %s" % (what, e.code().name, e.details()),
                          flush=True)
                    failed = True
            else:
                report_times("LLVM IR -> PTX -> cubin (%s)" % what, fmt, source.encode(), resp,
                             cold)
                failed = not run_and_compare("LLVM IR", resp.cubin) or failed
    finally:
        print("daemon exit:", d.stop(), flush=True)
    print("IR and PTX written to", args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
