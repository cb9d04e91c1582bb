"""A Triton kernel's own PTX and LLVM IR through kcache's raw front door (issue #8), on a GPU.

Triton compiles a row softmax on this machine (fresh cache); its PTX and its LLVM IR (llir)
are each sent to a kcached started with raw kernels enabled (admin token). Each cubin kcache
returns (PTX -> nvJitLink; LLVM IR -> LLVM 22 NVPTX -> PTX -> nvJitLink) is loaded with the
CUDA driver and launched with the arguments Triton's own launch used; its output must equal
Triton's bit for bit. Prints Triton's compile time (first call, empty cache, minus a warm
launch) beside kcache's for each input (cold request, worker compile time, warm hit).

Triton's llir is printed by Triton's own LLVM, and LLVM reads IR of its own release or
older only. With LLVM 19 this script had to respell Triton 3.6's IR (`captures(none)`,
`icmp samesign`, llvm.nvvm.barrier.cta.*, llvm.nvvm.div.full); kcache's LLVM 22 reads it as
Triton writes it, so the llir is sent as is, and INVALID_ARGUMENT fails the run (for IR
from an LLVM newer than kcache's the message names both releases). A daemon whose worker
lacks LLVM answers UNIMPLEMENTED, which is reported, not failed. The IR and the PTX are
written to --out so that they can be compiled elsewhere.

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

            # LLVM IR half: Triton's llir, as Triton wrote it -> LLVM 22 NVPTX -> PTX ->
            # nvJitLink.
            fmt = spec_pb2.RawKernel.FORMAT_LLVM_IR
            source, what = llir, "Triton's llir"
            try:
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
