"""Triton kernels through kcache on a GPU (issue 22; run by hand on the H200, not by CTest).

The kernels of tests/fixtures/raw/triton/kernels.py, compiled by this machine's Triton
(3.6 expected) and launched by Triton itself, then through kcache, each as PTX and as LLVM
IR, each two ways:

- kcache.raw.from_triton(compiled, format=...)[grid](*args): Triton's launch facts taken
  from the CompiledKernel (num_warps, 96 KiB of shared memory for the tl.dot kernel,
  clusters for num_ctas=2, scratch parameters);
- kcache.raw_kernel(source, [name], format=...).launch(name, blocks, threads, args,
  shared=...): the caller gives them; the cluster shape comes from the driver.

Every output must equal Triton's own bit for bit. Kernels: add_kernel (elementwise fp32),
matmul_kernel (128x128x64 bf16 tl.dot, wgmma, 98304 B of dynamic shared memory: the
shared-memory limit is raised by kcache), cluster_add_kernel (num_ctas=2: cuLaunchKernelEx
with clusters of 2). Also: a launch asking for more shared memory than the device has is
refused with the device's maximum. Prints per kernel and format: Triton's own compile
(triton.compile, empty cache, cubin included), kcache's cold compile (request time and
the worker's compile time) and a cached fetch (a new client: one RPC, a store hit).

  python3 tests/python/gpu_triton.py --kcached build/bin/kcached \\
      --pythonpath-gen build/client/python/gen

Exit status 1 if any output differs or a step fails.
"""

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TRITON_FIXTURES = os.path.join(REPO, "tests", "fixtures", "raw", "triton")
TOKEN = "gpu-triton-token"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--kcached", required=True)
    ap.add_argument("--pythonpath-gen", required=True)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.pythonpath_gen))
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    sys.path.insert(0, HERE)
    sys.path.insert(0, TRITON_FIXTURES)
    import torch
    import triton
    import kcache
    from kcache import raw
    import gpu_e2e
    import kernels

    torch.cuda.init()
    dev = torch.cuda.current_device()
    cap = torch.cuda.get_device_capability(dev)
    print("triton %s, torch %s, %s (sm_%d%d)" % (triton.__version__, torch.__version__,
                                                 torch.cuda.get_device_name(dev), *cap),
          flush=True)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")

    n = 1 << 22
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    M = N = K = 2048
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)

    # name -> (grid in programs, output, args for the kernel's own parameters (constexprs
    # last, as Triton's JIT takes them), Triton launch options).
    def add_case(name, num_ctas):
        out = torch.empty_like(x)
        grid = (triton.cdiv(n, 1024),)
        return name, grid, out, [x, y, out, n], {"BLOCK": 1024}, {"num_warps": 4,
                                                                    "num_ctas": num_ctas}

    def matmul_case():
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        return ("matmul_kernel", (M // 128, N // 128), c,
                [a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0)],
                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64},
                {"num_warps": 8, "num_stages": 3})

    cases = [add_case("add_kernel", 1), matmul_case()]
    if cap[0] >= 9:
        cases.append(add_case("cluster_add_kernel", 2))

    tok_path = os.path.join(tempfile.mkdtemp(prefix="kcache-triton-"), "admin.token")
    with open(tok_path, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(tok_path, 0o600)
    d = gpu_e2e.Daemon(args.kcached, tempfile.mkdtemp(prefix="kcache-triton-"), False,
                       ["--enable_raw_kernels=true", "--admin_token_path=" + tok_path])
    d.start()
    failed = []

    def check(what, got, want):
        torch.cuda.synchronize()
        same = torch.equal(got, want)
        print("%s %s" % ("PASS" if same else "FAIL", what), flush=True)
        if not same:
            failed.append(what)

    try:
        client = kcache.Client(d.target, admin_token=TOKEN)
        for name, grid, out, kargs, constexprs, opts in cases:
            jit = kernels.KERNELS[name][0]
            # Triton's own compile, empty cache (PTX, LLVM IR and cubin with its ptxas).
            t0 = time.perf_counter()
            kernels.compile(name, cap[0] * 10 + cap[1] if cap[0] < 9 else 90)
            triton_compile = time.perf_counter() - t0
            # Triton's own launch (its JIT: the same specialization for aligned tensors).
            ck = jit[grid](*kargs, **constexprs, **opts)
            torch.cuda.synchronize()
            want = out.clone()
            md = ck.metadata
            print("%s: %s, num_warps %d, num_ctas %d, %d B shared, Triton compile %.3f s"
                  % (name, ck.name, md.num_warps, md.num_ctas, md.shared, triton_compile),
                  flush=True)
            all_args = kargs + [constexprs[k] for k in constexprs]  # as CompiledKernel takes
            for fmt in ("ptx", "llvm_ir"):
                k = raw.from_triton(ck, format=fmt, client=client, timeout=600)
                t0 = time.perf_counter()
                cold = k.fetch()
                cold_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                hit = raw.from_triton(ck, format=fmt, timeout=600, client=kcache.Client(
                    d.target, admin_token=TOKEN)).fetch()
                hit_s = time.perf_counter() - t0
                print("  %s %s: kcache cold %.3f s (worker compile %.3f s, cache_hit=%s), "
                      "cached fetch %.4f s (cache_hit=%s); Triton compile %.3f s"
                      % (name, fmt, cold_s, cold.record.compile_time_us / 1e6, cold.cache_hit,
                         hit_s, hit.cache_hit, triton_compile), flush=True)
                # from_triton: Triton's call shape.
                out.fill_(float("nan"))
                k[grid](*all_args)
                check("%s %s from_triton vs Triton's launch: bit-identical" % (name, fmt),
                      out, want)
                # raw_kernel: the caller gives blocks, threads, shared memory; the cluster
                # shape of the num_ctas=2 kernel comes from the driver.
                m = kcache.raw_kernel(k.source, [k.name], format=fmt, arch=k.arch,
                                      client=client, timeout=600)
                blocks, threads = k.launch_grid(grid)
                out.fill_(float("nan"))
                scratch = [None] * len(k.scratch)  # these kernels need none
                assert all(s[1] == 0 for s in k.scratch), k.scratch
                m.launch(k.name, blocks, threads, k.pack(all_args) + scratch, shared=k.shared)
                check("%s %s raw_kernel().launch vs Triton's launch: bit-identical"
                      % (name, fmt), out, want)
                if name == "matmul_kernel" and fmt == "ptx":
                    try:
                        m.launch(k.name, blocks, threads, k.pack(all_args) + scratch,
                                 shared=1 << 20)
                        print("FAIL 1 MiB of shared memory was not refused", flush=True)
                        failed.append("shared refusal")
                    except ValueError as e:
                        print("PASS over the device's shared memory refused: %s" % e,
                              flush=True)
    except Exception as e:  # report, then fail
        import traceback
        traceback.print_exc()
        failed.append("%s: %s" % (type(e).__name__, e))
    finally:
        print("daemon exit:", d.stop(), flush=True)
    print("%d failure(s)%s" % (len(failed), (": " + "; ".join(failed)) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
